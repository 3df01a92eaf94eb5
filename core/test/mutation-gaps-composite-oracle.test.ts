import {
  CompositeStore,
  CounterOracle,
  InvalidArgumentError,
  MemoryStore,
  Percolator,
  type RowStore,
  StoreError,
  shardOf,
  UnsupportedOperationError,
  versionTable,
} from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { InstrumentedStore } from './support.js';

/**
 * Cases found by mutation testing of the composite store (core/src/composite-store.ts,
 * core/src/composite/*) and the timestamp oracle (core/src/oracle.ts): each one fails with
 * a small, plausible bug there that the rest of the suite let through.
 */

const bytes = (s: string) => new TextEncoder().encode(s);
const many = Array.from({ length: 120 }, (_, i) => `row/${String(i).padStart(3, '0')}`);

function threeShards() {
  const shards = [new MemoryStore(), new MemoryStore(), new MemoryStore()];
  const store = new CompositeStore({ default: { shards }, counterStore: shards[0]! });
  return { store, shards };
}

/** Rows of `keys` in table t through `store`, notified or not. */
async function fill(store: RowStore, keys: readonly string[], notified: boolean) {
  for (const key of keys) {
    expect(
      (await store.checkAndSet({ table: 't', key, expected: null, state: bytes(key), notified })).ok,
    ).toBe(true);
  }
}

/**
 * Stray rows (as a half-done migration leaves them) on `shard`, none of which it owns: a
 * run of keys in the middle of the key space, so that shard's pages fall short of rows it owns.
 */
async function strays(shards: readonly MemoryStore[], shard: number, notified: boolean): Promise<string[]> {
  const keys: string[] = [];
  for (let i = 0; i < 60; i++) {
    const key = `row/050-stray-${String(i).padStart(2, '0')}`;
    if (shardOf(key, shards.length) === shard) continue;
    keys.push(key);
    await shards[shard]!.checkAndSet({ table: 't', key, expected: null, state: bytes('stray'), notified });
  }
  expect(keys.length).toBeGreaterThan(20);
  return keys;
}

/** Every page of `page` (limit 5), after the last key of the one before, until a short one. */
async function pageAll(page: (after: string | undefined) => Promise<string[]>): Promise<string[]> {
  const seen: string[] = [];
  let after: string | undefined;
  for (;;) {
    const keys = await page(after);
    seen.push(...keys);
    if (keys.length < 5) return seen;
    after = keys[keys.length - 1];
  }
}

describe('mutation-testing gaps: composite scans over shards', () => {
  it('scan skips strays on any shard, not only the first: rows stay in order and none is missed', async () => {
    // merge.ts: the merge must wait for a shard whose buffer ran dry (its page was all
    // strays) before it takes the next row from the others, whichever shard that is.
    const { store, shards } = threeShards();
    await fill(store, many, false);
    await strays(shards, 2, false);
    const seen = await pageAll(async (after) =>
      (await store.scan('t', { after, limit: 5 })).map((r) => r.key),
    );
    expect(seen).toEqual(many);
  });

  it('scanNotified skips notified strays and still pages completely', async () => {
    // composite-store.ts: a shard asked again (its page was all strays) continues after
    // its own last key, not from the caller's position.
    const { store, shards } = threeShards();
    await fill(store, many, true);
    const left = await strays(shards, 0, true);
    const seen = await pageAll((after) => store.scanNotified('t', { after, limit: 5 }));
    expect(seen).toEqual(many);
    for (const key of left) expect(seen).not.toContain(key);
  });
});

describe('mutation-testing gaps: composite capabilities and failures', () => {
  it('claims a notification index only if every store has one: a worker is refused, and so is a scan of a table without one', async () => {
    const indexed = new MemoryStore();
    const unindexed = new InstrumentedStore(new MemoryStore(), { notificationIndex: false });
    const store = new CompositeStore({
      routes: [{ table: 'plain', store: unindexed }],
      default: indexed,
      counterStore: indexed,
    });
    expect(store.capabilities.notificationIndex).toBe(false);
    const db = new Percolator({ store });
    expect(() =>
      db.worker({ observers: [{ name: 'o', table: 'docs', column: 'c', handler: async () => {} }] }),
    ).toThrow(UnsupportedOperationError);
    await db.close();
    await expect(store.scanNotified('plain', { limit: 10 })).rejects.toBeInstanceOf(
      UnsupportedOperationError,
    );
    expect(await store.scanNotified('docs', { limit: 10 })).toEqual([]);
  });

  it('checkAndSetMany on a store without batch CAS: one request applied and another refused is "unknown", never "no"', async () => {
    const one = new InstrumentedStore(new MemoryStore(), { batchCheckAndSet: false });
    one.casFault = (request) => (request.key === 'refused' ? 'refuse' : undefined);
    const store = new CompositeStore({ default: one, counterStore: one });
    const outcome = store.checkAndSetMany([
      { table: 't', key: 'applied', expected: null, state: bytes('1') },
      { table: 't', key: 'refused', expected: null, state: bytes('1') },
    ]);
    await expect(outcome).rejects.toMatchObject({ applied: 'unknown' });
    expect(await one.inner.read('t', 'applied')).not.toBeNull();
  });

  it('checkAndSetMany over stores that failed, one certainly and one maybe: "unknown", whichever failed first', async () => {
    const refusing = new InstrumentedStore(new MemoryStore());
    refusing.casFault = () => 'refuse';
    const losing = new InstrumentedStore(new MemoryStore());
    losing.casFault = () => 'fail-after'; // applied, its reply lost
    const store = new CompositeStore({ default: { shards: [refusing, losing] }, counterStore: refusing });
    const keys = Array.from({ length: 50 }, (_, i) => `k${i}`);
    const onRefusing = keys.find((k) => store.storeFor('t', k) === refusing)!;
    const onLosing = keys.find((k) => store.storeFor('t', k) === losing)!;
    const outcome = store.checkAndSetMany([
      { table: 't', key: onRefusing, expected: null, state: bytes('1') },
      { table: 't', key: onLosing, expected: null, state: bytes('1') },
    ]);
    await expect(outcome).rejects.toBeInstanceOf(StoreError);
    await expect(outcome).rejects.toMatchObject({ applied: 'unknown' });
    expect(await losing.inner.read('t', onLosing)).not.toBeNull();
  });
});

describe('mutation-testing gaps: composite routing of version rows', () => {
  it("a routed table's version rows live in the table's own store, not in the default placement", async () => {
    // composite-store.ts: `__v.<table>` goes where <table> goes (docs/multi-store.md).
    const docs = new MemoryStore();
    const other = new MemoryStore();
    const store = new CompositeStore({
      routes: [{ table: 'docs', store: docs }],
      default: other,
      counterStore: docs,
    });
    const db = new Percolator({ store, gc: { inlineHistoryBytes: 0 } });
    for (const body of ['one', 'two', 'three', 'four'])
      await db.transact(async (tx) => tx.set('docs', 'a', 'body', body));
    await db.flush();
    const table = versionTable('docs');
    expect((await docs.scan(table, { limit: 100 })).length).toBeGreaterThan(0);
    expect(await other.scan(table, { limit: 100 })).toEqual([]);
    expect(await db.transact((tx) => tx.getString('docs', 'a', 'body'))).toBe('four');
    await db.close();
  });
});

describe('mutation-testing gaps: composite configuration', () => {
  const m = new MemoryStore();
  const n = new MemoryStore();
  const bad: Array<[string, unknown]> = [
    [
      'a default { shards } with an unknown field',
      { default: { shards: [m, n], sharding: 'hash' }, counterStore: m },
    ],
    [
      'a route with an unknown field besides its store',
      { routes: [{ table: 't', store: m, shard: 2 }], counterStore: m },
    ],
    ['an empty name', { default: m, counterStore: m, name: '' }],
  ];
  for (const [what, options] of bad) {
    it(`rejects ${what} with InvalidArgumentError`, () => {
      expect(() => new CompositeStore(options as never)).toThrow(InvalidArgumentError);
    });
  }
});

describe('mutation-testing gaps: timestamp oracles', () => {
  it("an oracle of one's own that gives the same value twice in a row is refused the second time", async () => {
    // oracle.ts, CheckedOracle: a value must be above every value handed out before the call.
    const store = new MemoryStore();
    const answers = [100, 100];
    const db = new Percolator({ store, oracle: { next: async () => answers.shift()! } });
    expect((await db.begin()).startTs).toBe(100);
    await expect(db.begin()).rejects.toSatisfy((e) => e instanceof StoreError && !e.retryable);
    await db.close();
  });

  it('a CounterOracle over a store whose counter answers below the range it reserved refuses the draw', async () => {
    // oracle.ts, BatchingOracle: a range starting below 1 is no timestamps at all. The
    // library's own oracles are used unchecked (checkedOracle), so this is the only check.
    const broken = Object.create(new MemoryStore()) as MemoryStore;
    broken.incrementCounter = async (_name: string, delta: number) => delta - 1;
    const oracle = new CounterOracle(broken);
    await expect(oracle.next()).rejects.toSatisfy((e) => e instanceof StoreError && !e.retryable);
    // A client given it fails its transactions, and writes nothing.
    const store = new MemoryStore();
    const db = new Percolator({ store, oracle });
    await expect(db.transact(async (tx) => tx.set('t', 'r', 'c', 'v'))).rejects.toBeInstanceOf(StoreError);
    await db.close();
    expect(await store.read('t', 'r')).toBeNull();
  });
});
