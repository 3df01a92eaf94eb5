import {
  CommitUnknownError,
  CorruptRowError,
  CounterOracle,
  compareKeys,
  InvalidArgumentError,
  LocalOracle,
  MAX_TIMESTAMP,
  MemoryStore,
  ORACLE_COUNTER,
  Percolator,
  SnapshotTooOldError,
  StoreError,
} from '@percolator/core';
import { describe, expect, it, vi } from 'vitest';
import { decodeRow, encodeRow } from '../src/codec.js';
import { checkedOracle } from '../src/oracle.js';
import { cellFrom, plainRow, rowFrom } from './row-support.js';
import { InstrumentedStore } from './support.js';

/** A client on a fresh memory store whose clock moves by hand, keeping versions 1000 ms (by age only). */
function agedClient() {
  const clock = { now: 1_000_000 };
  const store = new MemoryStore();
  const db = new Percolator({
    store,
    clock: () => clock.now,
    gc: { retentionMs: 1000, maxVersionsPerCell: 1000 },
  });
  return { clock, store, db };
}

describe('old versions (docs/protocol.md section 7)', () => {
  it('a cell updated 10,000 times keeps a small row', async () => {
    const store = new MemoryStore();
    const db = new Percolator({ store });
    for (let i = 0; i < 10_000; i++) await db.transact(async (tx) => tx.set('t', 'hot', 'v', `value-${i}`));
    const row = await store.read('t', 'hot');
    expect(row!.state.length).toBeLessThan(2_000);
    // At most maxVersionsPerCell (32) and a quarter more: commits prune in batches (cells.ts, pruneDue).
    expect(decodeRow(row!.state).cells.get('v')!.writes.length).toBeLessThanOrEqual(40);
    expect(await db.transact((tx) => tx.getString('t', 'hot', 'v'))).toBe('value-9999');
  });

  it('a snapshot older than the kept history fails with SnapshotTooOldError, never a wrong value', async () => {
    const store = new MemoryStore();
    const db = new Percolator({ store, gc: { maxVersionsPerCell: 4 } });
    await db.transact(async (tx) => tx.set('t', 'r', 'v', 'first'));
    const old = await db.begin();
    for (let i = 0; i < 3; i++) await db.transact(async (tx) => tx.set('t', 'r', 'v', `v${i}`));
    expect(await old.getString('t', 'r', 'v')).toBe('first'); // still within the kept versions
    for (let i = 3; i < 10; i++) await db.transact(async (tx) => tx.set('t', 'r', 'v', `v${i}`));
    await expect(old.getString('t', 'r', 'v')).rejects.toBeInstanceOf(SnapshotTooOldError);
  });

  it('prunes by age: versions superseded before the retention window go', async () => {
    const { clock, store, db } = agedClient();
    for (let i = 0; i < 20; i++) await db.transact(async (tx) => tx.set('t', 'r', 'v', `v${i}`));
    expect(decodeRow((await store.read('t', 'r'))!.state).cells.get('v')!.writes).toHaveLength(20);
    clock.now += 5000;
    await db.transact(async (tx) => tx.set('t', 'r', 'v', 'latest'));
    const cell = decodeRow((await store.read('t', 'r'))!.state).cells.get('v')!;
    expect(cell.writes).toHaveLength(2); // the new write and the newest version at the safe point
    expect(cell.data.size).toBe(2);
    expect(await db.transact((tx) => tx.getString('t', 'r', 'v'))).toBe('latest');
  });

  it('a snapshot exactly retentionMs old still reads; one a millisecond older gets SnapshotTooOldError', async () => {
    const { clock, db } = agedClient();
    await db.transact(async (tx) => tx.set('t', 'r', 'v', 'old'));
    // Two snapshots taken at `now`, each read once only (a transaction keeps what it read).
    const atBoundary = await db.begin();
    const pastBoundary = await db.begin();
    await db.transact(async (tx) => tx.set('t', 'r', 'v', 'new')); // supersedes 'old' at `now`
    clock.now += 1000; // both snapshots, and the supersession, are exactly retentionMs old
    await db.gc('t'); // prunes exactly, as far as the policy allows
    expect(await atBoundary.getString('t', 'r', 'v')).toBe('old');
    clock.now += 1;
    await db.gc('t');
    await expect(pastBoundary.getString('t', 'r', 'v')).rejects.toBeInstanceOf(SnapshotTooOldError);
  });
});

describe('timestamp oracles (docs/protocol.md section 3)', () => {
  it('the counter oracle batches concurrent requests and never repeats', async () => {
    const store = new InstrumentedStore();
    const oracle = new CounterOracle(store);
    const stamps = await Promise.all(Array.from({ length: 1000 }, () => oracle.next()));
    expect(new Set(stamps).size).toBe(1000);
    expect(store.calls.incrementCounter).toBeLessThan(10);
  });

  it('never hands a timestamp fetched earlier to a request made later', async () => {
    const store = new MemoryStore();
    let release!: () => void;
    const held = new Promise<void>((r) => {
      release = r;
    });
    let first = true;
    const slowStore = Object.create(store) as MemoryStore;
    slowStore.incrementCounter = async (name: string, delta: number) => {
      const top = await store.incrementCounter(name, delta); // reserved now...
      if (first) {
        first = false;
        await held; // ...but answered late
      }
      return top;
    };
    const oracle = new CounterOracle(slowStore);
    const early = oracle.next(); // its fetch is in flight
    await new Promise((r) => setTimeout(r, 1));
    const committedMeanwhile = await new CounterOracle(store).next(); // another client commits
    const late = oracle.next(); // asked after that commit: must be above it
    release();
    expect(await early).toBeLessThan(committedMeanwhile);
    expect(await late).toBeGreaterThan(committedMeanwhile);
  });

  it('two clients of one store share one order by default', async () => {
    const store = new MemoryStore();
    const a = new Percolator({ store });
    const b = new Percolator({ store });
    const { commitTs } = await (async () => {
      const tx = await a.begin();
      tx.set('t', 'r', 'v', 'x');
      return tx.commit();
    })();
    const reader = await b.begin();
    expect(reader.startTs).toBeGreaterThan(commitTs);
    expect(await reader.getString('t', 'r', 'v')).toBe('x');
  });

  it('the local oracle is strictly increasing, and refuses a store without a counter', async () => {
    const oracle = new LocalOracle(() => 5);
    const stamps = await Promise.all(Array.from({ length: 100 }, () => oracle.next()));
    for (let i = 1; i < stamps.length; i++) expect(stamps[i]!).toBeGreaterThan(stamps[i - 1]!);
    const noCounter = new InstrumentedStore(new MemoryStore(), { atomicCounter: false });
    expect(() => new Percolator({ store: noCounter })).toThrow(InvalidArgumentError);
  });
});

/** Sets the oracle's counter of `store` to `value` (the next draw gets `value + 1`). */
async function counterAt(store: MemoryStore, value: number): Promise<void> {
  const now = await store.incrementCounter(ORACLE_COUNTER, 1);
  if (value > now) await store.incrementCounter(ORACLE_COUNTER, value - now);
}

/** The raw rows (version and state) of `keys` in table t: what a refused transaction must leave. */
async function rawRows(store: MemoryStore, keys: string[]) {
  return Promise.all(keys.map((k) => store.read('t', k)));
}

const notRetryableStoreError = (e: unknown) => e instanceof StoreError && !e.retryable;

/** A row of one cell `c` with two put records (values in version rows) committed at `newer` and 1. */
function twoRecords(newer: number) {
  return rowFrom([
    [
      'c',
      {
        data: new Map(),
        lock: undefined,
        writes: [
          { commitTs: newer, startTs: newer - 1, kind: 'put', value: 'moved', wallTimeMs: 2 },
          { commitTs: 1, startTs: 1, kind: 'put', value: 'moved', wallTimeMs: 1 },
        ],
        prunedThrough: 0,
        notifyTs: 0,
        acks: new Map(),
        garbage: [],
      },
    ],
  ]);
}

describe('LocalOracle clocks', () => {
  it('a clock with fractional milliseconds gives whole microseconds', async () => {
    // performance.timeOrigin + performance.now() style: every draw was refused.
    let now = 1_700_000_000_000.125;
    const oracle = new LocalOracle(() => now);
    const a = await oracle.next();
    now += 0.0015;
    const b = await oracle.next();
    expect(a).toBe(1_700_000_000_000_126); // the whole microseconds, plus the one drawn
    expect(Number.isSafeInteger(b) && b > a).toBe(true);
    const db = new Percolator({
      store: new MemoryStore(),
      oracle: new LocalOracle(() => performance.timeOrigin + performance.now()),
    });
    await db.transact(async (tx) => tx.set('t', 'r', 'c', 'v'));
    expect(await db.transact((tx) => tx.getString('t', 'r', 'c'))).toBe('v');
  });

  it('a clock that is not a function is refused; a bad reading fails that draw only', async () => {
    expect(() => new LocalOracle(5 as never)).toThrow(InvalidArgumentError);
    let now = Number.NaN;
    const oracle = new LocalOracle(() => now);
    await expect(oracle.next()).rejects.toSatisfy(notRetryableStoreError);
    now = 1000;
    expect(await oracle.next()).toBe(1_000_001);
    // One reading far in the future (microseconds given as milliseconds, say): that draw
    // fails, and the oracle is not left past MAX_TIMESTAMP for every later draw.
    now = 1e15;
    await expect(oracle.next()).rejects.toSatisfy(notRetryableStoreError);
    now = 2000;
    expect(await oracle.next()).toBe(2_000_001);
  });

  it('CounterOracle checks its store and counter name when made', () => {
    expect(() => new CounterOracle(null as never)).toThrow(InvalidArgumentError);
    expect(() => new CounterOracle(new MemoryStore(), '')).toThrow(InvalidArgumentError);
    expect(() => new CounterOracle(new MemoryStore(), 'x'.repeat(1025))).toThrow(InvalidArgumentError);
    expect(new CounterOracle(new MemoryStore(), 'orders.ts').counterName).toBe('orders.ts');
  });
});

describe('the timestamp limit, MAX_TIMESTAMP (docs/protocol.md section 3)', () => {
  it('is 2^52 - 1: a row holds records that far apart exactly', () => {
    expect(MAX_TIMESTAMP).toBe(2 ** 52 - 1);
    const row = twoRecords(MAX_TIMESTAMP);
    expect(plainRow(decodeRow(encodeRow(row)))).toEqual(plainRow(row));
  });

  it('a row with a record past it is never encoded (it would read back wrong): CorruptRowError', () => {
    for (const past of [MAX_TIMESTAMP + 1, 2 ** 52 + 1001]) {
      const row = twoRecords(past);
      expect(() => encodeRow(row)).toThrow(CorruptRowError);
    }
  });

  it('the oracles hand out MAX_TIMESTAMP and refuse past it: a StoreError, not retryable', async () => {
    const store = new MemoryStore();
    await counterAt(store, MAX_TIMESTAMP - 1);
    const oracle = new CounterOracle(store);
    expect(await oracle.next()).toBe(MAX_TIMESTAMP);
    await expect(oracle.next()).rejects.toSatisfy(notRetryableStoreError);
    await expect(Promise.all([oracle.next(), oracle.next()])).rejects.toSatisfy(notRetryableStoreError);
    // LocalOracle counts microseconds: past the limit in 2112.
    const late = new LocalOracle(() => (MAX_TIMESTAMP + 1) / 1000);
    await expect(late.next()).rejects.toSatisfy(notRetryableStoreError);
  });

  // Each way a transaction takes a start timestamp: a stamped first read, a peek, the oracle.
  const stores: Array<[string, () => MemoryStore]> = [
    ['stamped first reads and peeks', () => new MemoryStore()],
    [
      'the oracle',
      () =>
        new InstrumentedStore(new MemoryStore(), {
          stampedRead: false,
          peekedRead: false,
        }) as unknown as MemoryStore,
    ],
  ];
  for (const [way, make] of stores) {
    it(`a start timestamp past it (${way}) fails the transaction, not retried, nothing written`, async () => {
      const store = make();
      const db = new Percolator({ store });
      await db.transact(async (tx) => {
        tx.set('t', 'r', 'c', 'old');
        tx.set('t', 's', 'c', 'old');
      });
      await db.flush();
      const before = await rawRows(store, ['r', 's']);
      await counterAt(store, MAX_TIMESTAMP);
      let runs = 0;
      const readWrite = db.transact(async (tx) => {
        runs++;
        const v = await tx.getString('t', 'r', 'c');
        tx.set('t', 'r', 'c', `${v}!`);
        tx.set('t', 's', 'c', `${v}!`);
      });
      await expect(readWrite).rejects.toSatisfy(notRetryableStoreError);
      await expect(readWrite).rejects.toThrow(/MAX_TIMESTAMP/);
      expect(runs).toBe(1);
      const readOnly = db.transact((tx) => tx.getString('t', 'r', 'c'), { readOnly: true });
      await expect(readOnly).rejects.toSatisfy(notRetryableStoreError);
      await expect(db.begin()).rejects.toSatisfy(notRetryableStoreError);
      await db.flush();
      expect(await rawRows(store, ['r', 's'])).toEqual(before);
    });
  }

  it('a stamped commit past it is never reported failed, and its rows are never rewritten inexactly', async () => {
    // The store draws the stamp inside its write: past the limit the row is written before
    // the client sees the value. The reviewer's case: the counter moved on by 2^52 + 1000.
    const store = new MemoryStore();
    const db = new Percolator({ store });
    await db.transact(async (tx) => tx.set('t', 'r', 'c', 'old'));
    await counterAt(store, 2 ** 52 + 1000);
    const outcomes: unknown[] = [];
    const versions: (string | undefined)[] = [];
    for (const v of ['new1', 'new2', 'new3']) {
      outcomes.push(
        await db
          .transact(async (tx) => tx.set('t', 'r', 'c', v))
          .then(
            () => 'committed',
            (e) => e,
          ),
      );
      versions.push((await store.read('t', 'r'))?.version);
    }
    // The first landed, stamped past the limit: it is not a failure (its outcome is unknown
    // to the client, which cannot name a blind write's stamp); the later ones are refused
    // before they are sent, as their rows would hold that stamp inexactly.
    expect(outcomes[0]).toBeInstanceOf(CommitUnknownError);
    expect(outcomes[1]).toBeInstanceOf(CorruptRowError);
    expect(outcomes[2]).toBeInstanceOf(CorruptRowError);
    expect(versions[1]).toBe(versions[0]);
    expect(versions[2]).toBe(versions[0]);
    // The row still reads as written.
    const cell = decodeRow((await store.read('t', 'r'))!.state).cells.get('c')!;
    expect(cell.writes.map((w) => w.commitTs)).toEqual([2 ** 52 + 1001, expect.any(Number)]);
  });

  it("a primary's stamped commit past it: the transaction is committed, and reported so", async () => {
    const store = new MemoryStore();
    const db = new Percolator({ store, onePhaseMaxRows: 1, peekedWrites: false });
    await db.transact(async (tx) => {
      tx.set('t', 'r', 'c', 'old');
      tx.set('t', 's', 'c', 'old');
    });
    const tx = await db.begin();
    tx.set('t', 'r', 'c', 'new');
    tx.set('t', 's', 'c', 'new');
    await counterAt(store, MAX_TIMESTAMP);
    // The commit point is the primary's CAS, which landed with the stamp past the limit.
    expect(await tx.commit()).toEqual({ commitTs: MAX_TIMESTAMP + 1 });
    await db.flush();
    const primary = decodeRow((await store.read('t', 'r'))!.state).cells.get('c')!;
    expect(primary.writes[0]!.commitTs).toBe(MAX_TIMESTAMP + 1);
    // Its secondary keeps its lock: rolling it forward would write the stamp inexactly.
    const secondary = decodeRow((await store.read('t', 's'))!.state).cells.get('c')!;
    expect(secondary.lock?.startTs).toBe(tx.startTs);
  });
});

describe('an oracle of your own (docs/protocol.md section 3)', () => {
  it('the oracle option must be an object with next(): InvalidArgumentError', () => {
    const store = new MemoryStore();
    for (const oracle of [null, {}, { next: 1 }, 5, 'x']) {
      expect(() => new Percolator({ store, oracle: oracle as never })).toThrow(InvalidArgumentError);
    }
  });

  it("the library's own oracles are used as they are (they check their values), a subclass or any other is checked", () => {
    const local = new LocalOracle();
    const counter = new CounterOracle(new MemoryStore());
    expect(checkedOracle(local)).toBe(local);
    expect(checkedOracle(counter)).toBe(counter);
    class Skewed extends LocalOracle {
      override next() {
        return Promise.resolve(0.5);
      }
    }
    const skewed = new Skewed();
    expect(checkedOracle(skewed)).not.toBe(skewed);
    const own = { next: async () => 1 };
    expect(checkedOracle(own)).not.toBe(own);
    // Nor one whose next() was replaced, or an object that only claims the constructor.
    const patched = new LocalOracle();
    patched.next = () => Promise.resolve(0.5);
    expect(checkedOracle(patched)).not.toBe(patched);
    const claims = { constructor: LocalOracle, next: async () => 0.5 };
    expect(checkedOracle(claims)).not.toBe(claims);
  });

  /** Rows r and s of table t hold 'before', written by a client with a good oracle. */
  async function twoRows() {
    const store = new MemoryStore();
    const local = new LocalOracle();
    const good = new Percolator({ store, oracle: local });
    await good.transact(async (tx) => {
      tx.set('t', 'r', 'c', 'before');
      tx.set('t', 's', 'c', 'before');
    });
    return { store, local, good, before: await rawRows(store, ['r', 's']) };
  }
  const readBoth = (db: Percolator) =>
    db.transact((tx) => Promise.all([tx.getString('t', 'r', 'c'), tx.getString('t', 's', 'c')]));

  const bad: unknown[] = [1.5, Number.NaN, -7, '9', 0, undefined, 2 ** 53 + 2, MAX_TIMESTAMP + 1];
  for (const value of bad) {
    const shown = typeof value === 'string' ? JSON.stringify(value) : String(value);
    it(`a start timestamp ${shown} fails the transaction once, not retried, nothing written`, async () => {
      const { store, local, good, before } = await twoRows();
      let calls = 0;
      const db = new Percolator({
        store,
        oracle: { next: async () => (calls++ === 0 ? (value as number) : local.next()) },
      });
      let runs = 0;
      const write = db.transact(async (tx) => {
        runs++;
        await tx.get('t', 'r', 'c');
        tx.set('t', 'r', 'c', 'after');
        tx.set('t', 's', 'c', 'after');
      });
      await expect(write).rejects.toSatisfy(notRetryableStoreError);
      expect(runs).toBe(1);
      expect(await rawRows(store, ['r', 's'])).toEqual(before);
      expect(await readBoth(good)).toEqual(['before', 'before']);
    });

    it(`a commit timestamp ${shown} rolls the transaction back, reported as failed, no lock left`, async () => {
      const { store, local, good } = await twoRows();
      let calls = 0;
      const db = new Percolator({
        store,
        oracle: { next: async () => (calls++ === 1 ? (value as number) : local.next()) },
      });
      const write = db.transact(
        async (tx) => {
          await tx.get('t', 'r', 'c');
          tx.set('t', 'r', 'c', 'after');
          tx.set('t', 's', 'c', 'after');
        },
        { maxAttempts: 5 },
      );
      await expect(write).rejects.toSatisfy(notRetryableStoreError);
      expect(calls).toBe(2); // drawn before the commit point, never retried
      await db.flush();
      for (const key of ['r', 's']) {
        const cell = decodeRow((await store.read('t', key))!.state).cells.get('c')!;
        expect(cell.lock).toBeUndefined();
      }
      expect(await readBoth(good)).toEqual(['before', 'before']);
    });
  }

  it('values must increase: one not above a value it gave before the call is refused; calls in flight together answer in any order', async () => {
    const store = new MemoryStore();
    const answers = [100, 50];
    const sequential = new Percolator({ store, oracle: { next: async () => answers.shift()! } });
    expect((await sequential.begin()).startTs).toBe(100);
    await expect(sequential.begin()).rejects.toSatisfy(notRetryableStoreError);

    const pending: Array<(ts: number) => void> = [];
    const manual = new Percolator({
      store,
      oracle: { next: () => new Promise<number>((resolve) => pending.push(resolve)) },
    });
    const first = manual.begin();
    const second = manual.begin();
    await vi.waitFor(() => expect(pending.length).toBe(2));
    pending[1]!(200); // the later call answers first, with more
    pending[0]!(150);
    expect((await second).startTs).toBe(200);
    expect((await first).startTs).toBe(150);
    const third = manual.begin(); // asked after 200 was handed out
    await vi.waitFor(() => expect(pending.length).toBe(3));
    pending[2]!(180);
    await expect(third).rejects.toSatisfy(notRetryableStoreError);
  });

  it('calls in flight together never get the same value (a wall-clock oracle under load)', async () => {
    // `{ next: async () => Date.now() }` gives two transactions begun in one millisecond
    // the same start timestamp; the second would take the first's locks for its own.
    const store = new MemoryStore();
    const pending: Array<(ts: number) => void> = [];
    const db = new Percolator({
      store,
      oracle: { next: () => new Promise<number>((resolve) => pending.push(resolve)) },
    });
    const [a, b, c] = [db.begin(), db.begin(), db.begin()];
    await vi.waitFor(() => expect(pending.length).toBe(3));
    pending[0]!(300);
    pending[1]!(300);
    pending[2]!(301);
    expect((await a).startTs).toBe(300);
    await expect(b).rejects.toSatisfy(notRetryableStoreError);
    await expect(b).rejects.toThrow(/two calls in flight together/);
    expect((await c).startTs).toBe(301);
    // None in flight: nothing kept, and a later call is judged by its floor alone.
    const d = db.begin();
    await vi.waitFor(() => expect(pending.length).toBe(4));
    pending[3]!(302);
    expect((await d).startTs).toBe(302);
  });
});

describe('input validation: a typed error and nothing changed', () => {
  const bad: Array<[string, (tx: Awaited<ReturnType<Percolator['begin']>>) => unknown]> = [
    ['empty table', (tx) => tx.set('', 'r', 'c', 'v')],
    ['table with a space', (tx) => tx.set('my table', 'r', 'c', 'v')],
    ['oversized table name', (tx) => tx.set('t'.repeat(65), 'r', 'c', 'v')],
    ['empty row key', (tx) => tx.set('t', '', 'c', 'v')],
    ['non-string row key', (tx) => tx.set('t', 42 as unknown as string, 'c', 'v')],
    ['oversized row key', (tx) => tx.set('t', 'k'.repeat(1025), 'c', 'v')],
    ['lone surrogate in key', (tx) => tx.set('t', '\uD800', 'c', 'v')],
    ['empty column', (tx) => tx.set('t', 'r', '', 'v')],
    ['oversized column', (tx) => tx.set('t', 'r', 'c'.repeat(257), 'v')],
    ['number value', (tx) => tx.set('t', 'r', 'c', 5 as unknown as string)],
    ['oversized value', (tx) => tx.set('t', 'r', 'c', new Uint8Array(1024 * 1024 + 1))],
    ['delete with bad table', (tx) => tx.delete('bad/table', 'r', 'c')],
  ];
  for (const [name, act] of bad) {
    it(name, async () => {
      const store = new MemoryStore();
      const db = new Percolator({ store });
      const tx = await db.begin();
      tx.set('t', 'ok', 'c', 'fine');
      expect(() => act(tx)).toThrow(InvalidArgumentError);
      await tx.commit(); // the good write still commits; the bad one left nothing
      const rows = await store.scan('t', { limit: 10 });
      expect(rows.map((r) => r.key)).toEqual(['ok']);
    });
  }

  it('rejects reads with bad names', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    const tx = await db.begin();
    await expect(tx.get('t', null as unknown as string, 'c')).rejects.toBeInstanceOf(InvalidArgumentError);
    await expect(tx.get('t;drop', 'r', 'c')).rejects.toBeInstanceOf(InvalidArgumentError);
  });

  it('rejects bad options', () => {
    const store = new MemoryStore();
    expect(() => new Percolator({ store, lockTtlMs: 0 })).toThrow(InvalidArgumentError);
    expect(() => new Percolator({ store, gc: { maxVersionsPerCell: 0 } })).toThrow(InvalidArgumentError);
    expect(() => new Percolator(undefined as never)).toThrow(InvalidArgumentError);
  });
});

describe('encoding', () => {
  it('round-trips a row with every field', () => {
    const row = {
      cells: new Map([
        [
          'c\u0000\u{1F600}',
          cellFrom({
            data: new Map([[MAX_TIMESTAMP - 5, new Uint8Array([0, 255])]]),
            lock: {
              startTs: 9,
              primary: { table: 't', row: 'r\u0000', column: 'c' },
              kind: 'delete' as const,
              ttlMs: 5,
              wallTimeMs: 1.7e12,
              secondaries: [{ table: 'u', row: '\u{1F600}' }],
            },
            writes: [
              {
                commitTs: MAX_TIMESTAMP,
                startTs: MAX_TIMESTAMP - 5,
                kind: 'put' as const,
                value: 'moving' as const,
                wallTimeMs: 1.7e12,
                secondaries: [{ table: 't', row: '' }],
              },
              {
                commitTs: 8,
                startTs: 7,
                kind: 'rollback' as const,
                value: 'inline' as const,
                wallTimeMs: 1.8e12,
              },
              { commitTs: 6, startTs: 2, kind: 'put' as const, value: 'moved' as const, wallTimeMs: 1 },
            ],
            prunedThrough: 3,
            notifyTs: 4,
            acks: new Map([['obs', 6]]),
            garbage: [1, 2 ** 40],
          }),
        ],
      ]),
    };
    expect(plainRow(decodeRow(encodeRow(row)))).toEqual(plainRow(row));
    // The older records in the history section, copied as read when not decoded.
    const copied = decodeRow(encodeRow(row));
    expect(copied.cells.get('c\u0000\u{1F600}')!.history?.count).toBe(1);
    expect(plainRow(decodeRow(encodeRow(copied)))).toEqual(plainRow(row));
  });

  it('orders keys by UTF-8 bytes', () => {
    const keys = ['b', 'a', '', '\u{1F600}', '\uFFFD', '\uE000', 'a\u0000', '\u00e9', 'Z'];
    const byBytes = [...keys].sort((x, y) => Buffer.compare(Buffer.from(x), Buffer.from(y)));
    expect([...keys].sort(compareKeys)).toEqual(byBytes);
  });
});
