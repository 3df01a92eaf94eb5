import {
  CommitUnknownError,
  ConflictError,
  InvalidArgumentError,
  inspectHeadRow,
  MemoryStore,
  Percolator,
  RowTooLargeError,
  StoreError,
  type Transaction,
} from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { SharedSteps, type StampedRequest } from '../src/commit/shared-steps.js';
import type { CasRequest, RowStore, StoreCapabilities } from '../src/store.js';
import { type Fault, InstrumentedStore } from './support.js';

/**
 * Group commit (docs/protocol.md 4.5, "Shared stamped steps"): the stamped steps of one
 * client's transactions sent in the same turn go to the store as one atomic step.
 */

const ONE_STEP = { stampedCheckAndSetMany: true } as const;

/** An InstrumentedStore that also records the rows of every checkAndSetStampedMany. */
class RecordingStore extends InstrumentedStore {
  readonly steps: string[][] = [];
  /** An error to refuse a step with before anything is applied (undefined: none). */
  refuse: (requests: readonly CasRequest[]) => Error | undefined = () => undefined;

  override async checkAndSetStampedMany(
    requests: readonly (CasRequest & { readonly state: Uint8Array })[],
    counter: string,
  ) {
    this.steps.push(requests.map((r) => `${r.table}/${r.key}`));
    const refusal = this.refuse(requests);
    if (refusal) throw refusal;
    return super.checkAndSetStampedMany(requests, counter);
  }
}

/** A fault for the first call only. */
function once(fault: Fault): () => Fault {
  let left = true;
  return () => {
    const now = left ? fault : undefined;
    left = false;
    return now;
  };
}

/** Each key's row written once, so every later transaction knows it (and the client caches it). */
async function seed(db: Percolator, keys: readonly string[]): Promise<void> {
  for (const k of keys) await db.transact(async (tx) => tx.set('t', k, 'v', 'seed'));
}

/** A transaction that read row `key` and writes it with `value`, ready to commit. */
async function readAndWrite(db: Percolator, key: string, value: string): Promise<Transaction> {
  const tx = await db.begin();
  await tx.getString('t', key, 'v');
  tx.set('t', key, 'v', value);
  return tx;
}

/** The records of `startTs` on (t, key), column v. */
async function recordsOf(store: MemoryStore, key: string, startTs: number): Promise<number> {
  const row = await store.read('t', key);
  const cell = row ? inspectHeadRow(row.state).cells.find((c) => c.column === 'v') : undefined;
  return cell?.writes.filter((w) => w.startTs === startTs).length ?? 0;
}

async function valuesOf(db: Percolator, keys: readonly string[]): Promise<(string | undefined)[]> {
  return db.transact(async (tx) => Promise.all(keys.map((k) => tx.getString('t', k, 'v'))), {
    readOnly: true,
  });
}

const KEYS = ['a', 'b', 'c', 'd'];

/**
 * A client over a RecordingStore with KEYS seeded, and per key a transaction that read it
 * and writes `new <key>`, ready to commit; the store's counts start afresh.
 */
async function fourReady(options: ClientChoices = {}, capabilities: Partial<StoreCapabilities> = ONE_STEP) {
  const { store, db } = await seeded(options, capabilities);
  const txs = await Promise.all(KEYS.map((k) => readAndWrite(db, k, `new ${k}`)));
  store.steps.length = 0;
  store.calls.checkAndSetStamped = 0;
  return { store, db, txs };
}

/** The client options these tests vary. */
type ClientChoices = { readonly groupCommit?: boolean; readonly sharedCallsInFlight?: number };

/** A client over a RecordingStore with KEYS seeded; the store's step list starts afresh. */
async function seeded(options: ClientChoices = {}, capabilities: Partial<StoreCapabilities> = ONE_STEP) {
  const store = new RecordingStore(new MemoryStore(), capabilities);
  const db = new Percolator({ store, peekedWrites: false, ...options });
  await seed(db, KEYS);
  store.steps.length = 0;
  return { store, db };
}

/**
 * Commits `txs` (one per key of KEYS, each writing `new <key>`) with the replies of the
 * store's shared steps held, and checks that a reader starting once one is applied sees
 * every transaction's write; then lets the replies go. The commits' results.
 */
async function commitWithReaderBetween(store: RecordingStore, txs: readonly Transaction[]) {
  const reader = new Percolator({ store: store.inner });
  let release!: () => void;
  store.manyReplyHold = new Promise<void>((r) => {
    release = r;
  });
  const committing = Promise.all(txs.map((tx) => tx.commit()));
  while (store.steps.length === 0) await new Promise((r) => setImmediate(r));
  await new Promise((r) => setImmediate(r));
  expect(await valuesOf(reader, KEYS)).toEqual(KEYS.map((k) => `new ${k}`));
  release();
  store.manyReplyHold = undefined;
  await reader.close();
  return committing;
}

/** Each transaction of `txs` (one per key of KEYS) has `expected` records on its row. */
async function expectRecords(store: RecordingStore, txs: readonly Transaction[], expected = [1, 1, 1, 1]) {
  for (const [i, k] of KEYS.entries())
    expect(await recordsOf(store.inner, k, txs[i]!.startTs)).toBe(expected[i]);
}

describe('shared stamped steps (group commit)', () => {
  it('commits of one turn go as one step: one commit timestamp, every row written once', async () => {
    const { store, db, txs } = await fourReady();
    const results = await Promise.all(txs.map((tx) => tx.commit()));
    expect(store.steps).toHaveLength(1);
    expect([...store.steps[0]!].sort()).toEqual(KEYS.map((k) => `t/${k}`));
    expect(store.calls.checkAndSetStamped).toBe(0);
    const stamps = new Set(results.map((r) => r.commitTs));
    expect(stamps.size).toBe(1);
    // Each transaction keeps its own start timestamp, below the shared commit timestamp.
    expect(new Set(txs.map((tx) => tx.startTs)).size).toBe(KEYS.length);
    for (const tx of txs) expect(tx.startTs).toBeLessThan(results[0]!.commitTs);
    await expectRecords(store, txs);
    expect(await valuesOf(db, KEYS)).toEqual(KEYS.map((k) => `new ${k}`));
    // A snapshot drawn afterwards is above the commit; one at the commit sees all of them.
    const after = await db.begin();
    expect(after.startTs).toBeGreaterThan(results[0]!.commitTs);
    await db.close();
  });

  it('blind one-row writes of one turn share one step; each reads back, stamped alike', async () => {
    const { store, db } = await seeded();
    const txs: Transaction[] = [];
    await Promise.all(
      KEYS.map((k) =>
        db.transact(async (tx) => {
          txs.push(tx);
          tx.set('t', k, 'v', `blind ${k}`);
        }),
      ),
    );
    expect(store.steps).toHaveLength(1);
    expect(new Set(txs.map((tx) => tx.startTs)).size).toBe(1);
    expect(await valuesOf(db, KEYS)).toEqual(KEYS.map((k) => `blind ${k}`));
    await db.close();
  });

  it('transactions that write a common row never share a step: the second loses the race on its own', async () => {
    const store = new RecordingStore(new MemoryStore(), ONE_STEP);
    const db = new Percolator({ store, peekedWrites: false });
    await seed(db, ['a', 'b', 'c']);
    const first = await readAndWrite(db, 'a', 'first');
    first.set('t', 'b', 'v', 'first');
    const second = await readAndWrite(db, 'a', 'second');
    second.set('t', 'c', 'v', 'second');
    store.steps.length = 0;
    const [one, two] = await Promise.allSettled([first.commit(), second.commit()]);
    for (const step of store.steps) expect(new Set(step).size).toBe(step.length);
    expect(store.steps.filter((s) => s.includes('t/a')).length).toBe(2);
    expect(one.status).toBe('fulfilled');
    expect(two.status === 'rejected' && two.reason).toBeInstanceOf(ConflictError);
    expect(await valuesOf(db, ['a', 'b', 'c'])).toEqual(['first', 'first', 'seed']);
    await db.close();
  });

  it("one transaction's lost race refuses the shared step: the others go again together and commit once", async () => {
    const { store, db, txs } = await fourReady();
    const other = new Percolator({ store: store.inner });
    // Another client writes a's row after the first transaction read it.
    await other.transact(async (tx) => tx.set('t', 'a', 'v', 'other'));
    const outcomes = await Promise.allSettled(txs.map((tx) => tx.commit()));
    expect(outcomes[0]!.status === 'rejected' && outcomes[0]!.reason).toBeInstanceOf(ConflictError);
    for (const o of outcomes.slice(1)) expect(o.status).toBe('fulfilled');
    // The refused step of four, then the three that did not lose, together.
    expect(store.steps.map((s) => s.length)).toEqual([4, 3]);
    await expectRecords(store, txs, [0, 1, 1, 1]);
    expect(await valuesOf(db, KEYS)).toEqual(['other', 'new b', 'new c', 'new d']);
    await db.close();
    await other.close();
  });

  it('a lost reply of a shared step: each transaction finds its records by a re-read, nothing is sent twice', async () => {
    const { store, db, txs } = await fourReady();
    store.manyFault = once('fail-after');
    const results = await Promise.all(txs.map((tx) => tx.commit()));
    expect(store.steps).toHaveLength(1);
    expect(new Set(results.map((r) => r.commitTs)).size).toBe(1);
    await expectRecords(store, txs);
    expect(await valuesOf(db, KEYS)).toEqual(KEYS.map((k) => `new ${k}`));
    await db.close();
  });

  it('a lost reply of a shared step of blind writes: each is CommitUnknownError, and landed once', async () => {
    const { store, db } = await seeded();
    store.manyFault = once('fail-after');
    const outcomes = await Promise.allSettled(
      KEYS.map((k) => db.transact(async (tx) => tx.set('t', k, 'v', `blind ${k}`))),
    );
    for (const o of outcomes) expect(o.status === 'rejected' && o.reason).toBeInstanceOf(CommitUnknownError);
    expect(store.steps).toHaveLength(1);
    expect(await valuesOf(db, KEYS)).toEqual(KEYS.map((k) => `blind ${k}`));
    await db.close();
  });

  it('a shared step lost before the store: each transaction sends its own again and commits once', async () => {
    const { store, db, txs } = await fourReady();
    store.manyFault = once('fail-before');
    store.calls.checkAndSetStamped = 0;
    await Promise.all(txs.map((tx) => tx.commit()));
    // The lost shared step, then each again (alone or shared, as their backoffs fall).
    expect(store.steps[0]).toHaveLength(KEYS.length);
    expect(store.steps.length + store.calls.checkAndSetStamped).toBeGreaterThanOrEqual(2);
    await expectRecords(store, txs);
    expect(await valuesOf(db, KEYS)).toEqual(KEYS.map((k) => `new ${k}`));
    await db.close();
  });

  for (const [what, error] of [
    ['too large for the store', () => new RowTooLargeError('more than 1 row')],
    ["refused by the store's checks", () => new InvalidArgumentError('one request is wrong')],
  ] as const) {
    it(`a shared step ${what}: each transaction goes alone, nothing written twice`, async () => {
      const { store, db, txs } = await fourReady();
      store.refuse = (requests) => (requests.length > 1 ? error() : undefined);
      const results = await Promise.all(txs.map((tx) => tx.commit()));
      // The shared step was refused before anything was applied; then one step each.
      expect(store.steps[0]).toHaveLength(4);
      expect(store.steps.length + store.calls.checkAndSetStamped).toBe(1 + KEYS.length);
      expect(new Set(results.map((r) => r.commitTs)).size).toBe(KEYS.length);
      await expectRecords(store, txs);
      await db.close();
    });
  }

  it('a reader whose start lands between a shared step and its reply sees every transaction of it', async () => {
    const { store, db, txs } = await fourReady();
    const results = await commitWithReaderBetween(store, txs);
    expect(new Set(results.map((r) => r.commitTs)).size).toBe(1);
    await db.close();
  });

  it('two-phase primary commits share the step too; their secondaries get the shared timestamp', async () => {
    const store = new RecordingStore(new MemoryStore(), ONE_STEP);
    const db = new Percolator({ store, peekedWrites: false, onePhaseMaxRows: 1 });
    await seed(db, ['a1', 'a2', 'b1', 'b2']);
    const pair = async (p: string) => {
      const tx = await readAndWrite(db, `${p}1`, `new ${p}`);
      tx.set('t', `${p}2`, 'v', `new ${p}`);
      return tx;
    };
    const txs = [await pair('a'), await pair('b')];
    store.steps.length = 0;
    const results = await Promise.all(txs.map((tx) => tx.commit()));
    await db.flush();
    expect(store.steps).toEqual([['t/a1', 't/b1']]);
    expect(results[0]!.commitTs).toBe(results[1]!.commitTs);
    expect(await valuesOf(db, ['a1', 'a2', 'b1', 'b2'])).toEqual(['new a', 'new a', 'new b', 'new b']);
    await db.close();
  });

  it("the client's sharedCallsInFlight overrides the store's: 1 over a store declaring 3 shares one step, 3 over one declaring nothing splits", async () => {
    for (const [declared, chosen, steps, alone] of [
      [3, 1, [['t/a', 't/b', 't/c', 't/d']], 0],
      [undefined, 3, [['t/c', 't/d']], 2],
    ] as const) {
      const { store, db, txs } = await fourReady(
        { sharedCallsInFlight: chosen },
        { ...ONE_STEP, ...(declared !== undefined ? { sharedCallsInFlight: declared } : {}) },
      );
      await Promise.all(txs.map((tx) => tx.commit()));
      expect(store.steps.map((s) => [...s].sort())).toEqual(steps);
      expect(store.calls.checkAndSetStamped).toBe(alone);
      await expectRecords(store, txs);
      await db.close();
    }
  });

  it('groupCommit: false sends each step on its own; a bad value is a typed error', async () => {
    const { store, db, txs } = await fourReady({ groupCommit: false });
    const results = await Promise.all(txs.map((tx) => tx.commit()));
    expect(store.steps.length + store.calls.checkAndSetStamped).toBe(KEYS.length);
    expect(new Set(results.map((r) => r.commitTs)).size).toBe(KEYS.length);
    await db.close();
    expect(() => new Percolator({ store, peekedWrites: false, groupCommit: 'yes' as never })).toThrow(
      InvalidArgumentError,
    );
  });
});

/**
 * A store that declares `sharedCallsInFlight` (Redis): the steps a turn asks for go in
 * several calls, sized by what is outstanding (sharing.ts), the first ones before the turn
 * ends. Each call is a step like any other: alone (the single-row stamped CAS) or shared.
 */
describe('shared stamped steps, three calls in flight', () => {
  const fourReadyInFlight = () => fourReady({}, { ...ONE_STEP, sharedCallsInFlight: 3 });

  it('the commits of one turn: a and b each alone, c and d shared; every row written once', async () => {
    const { store, db, txs } = await fourReadyInFlight();
    const results = await Promise.all(txs.map((tx) => tx.commit()));
    // 1 of 2 outstanding rows, 1 of 3, then c and d (2 of 4) when the turn ends.
    expect(store.calls.checkAndSetStamped).toBe(2);
    expect(store.steps).toEqual([['t/c', 't/d']]);
    const [a, b, c, d] = results.map((r) => r.commitTs);
    expect(new Set([a, b, c]).size).toBe(3);
    expect(d).toBe(c);
    await expectRecords(store, txs);
    expect(await valuesOf(db, KEYS)).toEqual(KEYS.map((k) => `new ${k}`));
    await db.close();
  });

  it('every reply lost: each transaction finds its records by a re-read, nothing is sent twice', async () => {
    const { store, db, txs } = await fourReadyInFlight();
    store.casFault = () => 'fail-after';
    store.manyFault = () => 'fail-after';
    const results = await Promise.all(txs.map((tx) => tx.commit()));
    expect(store.calls.checkAndSetStamped + store.steps.length).toBe(3);
    expect(results.every((r) => r.commitTs > 0)).toBe(true);
    store.casFault = () => undefined;
    store.manyFault = () => undefined;
    await expectRecords(store, txs);
    expect(await valuesOf(db, KEYS)).toEqual(KEYS.map((k) => `new ${k}`));
    await db.close();
  });

  it('every call lost before the store: each transaction sends its own again and commits once', async () => {
    const { store, db, txs } = await fourReadyInFlight();
    let left = 3;
    store.casFault = () => (left-- > 0 ? 'fail-before' : undefined);
    store.manyFault = () => (left-- > 0 ? 'fail-before' : undefined);
    await Promise.all(txs.map((tx) => tx.commit()));
    expect(left).toBeLessThan(0);
    await expectRecords(store, txs);
    expect(await valuesOf(db, KEYS)).toEqual(KEYS.map((k) => `new ${k}`));
    await db.close();
  });

  it('a reader whose start lands between the shared step and its reply sees every transaction of the turn', async () => {
    const { store, db, txs } = await fourReadyInFlight();
    await commitWithReaderBetween(store, txs);
    await db.close();
  });

  it('concurrent transfers and snapshot readers under lost replies: every snapshot sums to the total', async () => {
    const store = new RecordingStore(new MemoryStore(), { ...ONE_STEP, sharedCallsInFlight: 3 });
    // Peeked snapshots (the default here): the peeks of each turn are split too.
    const db = new Percolator({ store });
    const accounts = Array.from({ length: 8 }, (_, i) => `acct${i}`);
    await db.transact(async (tx) => {
      for (const a of accounts) tx.set('t', a, 'v', '100');
    });
    let seed = 7;
    const random = () => {
      seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0;
      return seed / 2 ** 32;
    };
    const fault = (): Fault => {
      const r = random();
      return r < 0.1 ? 'fail-after' : r < 0.2 ? 'fail-before' : undefined;
    };
    store.casFault = fault;
    store.manyFault = fault;
    const sums: number[] = [];
    for (let round = 0; round < 6; round++) {
      const work: Promise<unknown>[] = [];
      for (let i = 0; i < 12; i++) {
        const from = accounts[Math.floor(random() * accounts.length)]!;
        const to = accounts[Math.floor(random() * accounts.length)]!;
        if (from === to) continue;
        work.push(
          db.transact(async (tx) => {
            const [f, t] = await Promise.all([tx.getString('t', from, 'v'), tx.getString('t', to, 'v')]);
            tx.set('t', from, 'v', String(Number(f) - 1));
            tx.set('t', to, 'v', String(Number(t) + 1));
          }),
        );
        work.push(
          db
            .transact(async (tx) => Promise.all(accounts.map((a) => tx.getString('t', a, 'v'))), {
              readOnly: true,
            })
            .then((values) => sums.push(values.reduce((s, v) => s + Number(v), 0))),
        );
      }
      // A transfer whose reply was lost may fail with CommitUnknownError: whole or not at all.
      const outcomes = await Promise.allSettled(work);
      for (const o of outcomes)
        if (o.status === 'rejected') expect(o.reason).toBeInstanceOf(CommitUnknownError);
    }
    store.casFault = () => undefined;
    store.manyFault = () => undefined;
    expect(store.steps.length).toBeGreaterThan(0);
    expect(sums.length).toBeGreaterThan(30);
    for (const s of sums) expect(s).toBe(800);
    const final = await valuesOf(db, accounts);
    expect(final.reduce((s, v) => s + Number(v), 0)).toBe(800);
    await db.close();
  });
});

/**
 * SharedSteps on its own, over a store no checked store guards (the client always puts one
 * under it, which turns a throw into a rejection first).
 */
describe('SharedSteps over a store that throws', () => {
  it('a shared step the store throws for instead of rejecting: each transaction of it gets the error, and the next step goes out', async () => {
    const memory = new MemoryStore();
    const error = new StoreError('injected: thrown, not rejected', 'no');
    let throwing = true;
    const store: RowStore = {
      name: memory.name,
      capabilities: memory.capabilities,
      read: memory.read.bind(memory),
      checkAndSet: memory.checkAndSet.bind(memory),
      close: memory.close.bind(memory),
      checkAndSetStamped: memory.checkAndSetStamped.bind(memory),
      checkAndSetStampedMany: (requests, counter) => {
        if (throwing) throw error;
        return memory.checkAndSetStampedMany(requests, counter);
      },
    };
    const steps = new SharedSteps(store, 'c', { one: true, share: true });
    const create = (key: string): StampedRequest[] => [
      { table: 't', key, expected: null, state: new Uint8Array(16) },
    ];
    const outcomes = await Promise.allSettled([steps.send(create('a')), steps.send(create('b'))]);
    expect(outcomes).toEqual([
      { status: 'rejected', reason: error },
      { status: 'rejected', reason: error },
    ]);
    expect(await memory.read('t', 'a')).toBeNull();
    throwing = false;
    const [a, b] = await Promise.all([steps.send(create('a')), steps.send(create('b'))]);
    expect(a.ok && b.ok && a.timestamp === b.timestamp).toBe(true);
    expect(await memory.read('t', 'b')).not.toBeNull();
  });
});
