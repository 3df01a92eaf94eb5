import {
  CounterOracle,
  compareKeys,
  InvalidArgumentError,
  LocalOracle,
  MemoryStore,
  Percolator,
  SnapshotTooOldError,
} from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { decodeRow, encodeRow } from '../src/codec.js';
import { cellFrom, plainRow } from './row-support.js';
import { InstrumentedStore } from './support.js';

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
    let now = 1_000_000;
    const store = new MemoryStore();
    const db = new Percolator({
      store,
      clock: () => now,
      gc: { retentionMs: 1000, maxVersionsPerCell: 1000 },
    });
    for (let i = 0; i < 20; i++) await db.transact(async (tx) => tx.set('t', 'r', 'v', `v${i}`));
    expect(decodeRow((await store.read('t', 'r'))!.state).cells.get('v')!.writes).toHaveLength(20);
    now += 5000;
    await db.transact(async (tx) => tx.set('t', 'r', 'v', 'latest'));
    const cell = decodeRow((await store.read('t', 'r'))!.state).cells.get('v')!;
    expect(cell.writes).toHaveLength(2); // the new write and the newest version at the safe point
    expect(cell.data.size).toBe(2);
    expect(await db.transact((tx) => tx.getString('t', 'r', 'v'))).toBe('latest');
  });

  it('a snapshot exactly retentionMs old still reads; one a millisecond older gets SnapshotTooOldError', async () => {
    let now = 1_000_000;
    const store = new MemoryStore();
    const db = new Percolator({
      store,
      clock: () => now,
      gc: { retentionMs: 1000, maxVersionsPerCell: 1000 },
    });
    await db.transact(async (tx) => tx.set('t', 'r', 'v', 'old'));
    // Two snapshots taken at `now`, each read once only (a transaction keeps what it read).
    const atBoundary = await db.begin();
    const pastBoundary = await db.begin();
    await db.transact(async (tx) => tx.set('t', 'r', 'v', 'new')); // supersedes 'old' at `now`
    now += 1000; // both snapshots, and the supersession, are exactly retentionMs old
    await db.gc('t'); // prunes exactly, as far as the policy allows
    expect(await atBoundary.getString('t', 'r', 'v')).toBe('old');
    now += 1;
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
            data: new Map([[2 ** 52, new Uint8Array([0, 255])]]),
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
                commitTs: 2 ** 52 + 5,
                startTs: 2 ** 52,
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
