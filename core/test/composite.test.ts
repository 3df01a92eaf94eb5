import {
  type CasRequest,
  type CasResult,
  ClientCrash,
  CommitUnknownError,
  CompositeStore,
  compareKeys,
  InvalidArgumentError,
  LockNotResolvedError,
  MemoryStore,
  Percolator,
  type RowStore,
  RowTooLargeError,
  type StoreCapabilities,
  type StoredRow,
  StoreError,
  shardOf,
  type Transaction,
  UnsupportedOperationError,
} from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { fakeClock, text } from './support.js';

const bytes = (s: string) => new TextEncoder().encode(s);

/**
 * A MemoryStore that can be made unreachable on command: while `down`, every call fails
 * before it reaches the store (StoreError 'no'). `dropReplyOnce` applies the next CAS and
 * then goes down before the reply arrives (the caller sees StoreError 'unknown').
 */
class OutageStore implements RowStore {
  readonly inner = new MemoryStore();
  readonly capabilities: StoreCapabilities;
  down = false;
  private dropReply = false;

  constructor(
    readonly name: string,
    capabilities: Partial<StoreCapabilities> = {},
  ) {
    this.capabilities = { ...this.inner.capabilities, ...capabilities };
  }
  dropReplyOnce(): void {
    this.dropReply = true;
  }
  private check(): void {
    if (this.down) throw new StoreError(`${this.name} is unreachable`, 'no');
  }
  async read(table: string, key: string): Promise<StoredRow | null> {
    this.check();
    return this.inner.read(table, key);
  }
  async checkAndSet(request: CasRequest): Promise<CasResult> {
    this.check();
    const result = await this.inner.checkAndSet(request);
    if (this.dropReply) {
      this.dropReply = false;
      this.down = true;
      throw new StoreError(`${this.name}: connection lost after sending`, 'unknown');
    }
    return result;
  }
  async readMany(refs: Parameters<MemoryStore['readMany']>[0]) {
    this.check();
    return this.inner.readMany(refs);
  }
  async checkAndSetMany(requests: readonly CasRequest[]) {
    this.check();
    return this.inner.checkAndSetMany(requests);
  }
  async scan(...args: Parameters<MemoryStore['scan']>) {
    this.check();
    return this.inner.scan(...args);
  }
  async scanNotified(...args: Parameters<MemoryStore['scanNotified']>) {
    this.check();
    return this.inner.scanNotified(...args);
  }
  async incrementCounter(name: string, delta: number) {
    this.check();
    return this.inner.incrementCounter(name, delta);
  }
  async close(): Promise<void> {}
}

function threeShards() {
  const a = new MemoryStore();
  const b = new MemoryStore();
  const c = new MemoryStore();
  const store = new CompositeStore({ default: { shards: [a, b, c] }, counterStore: a });
  return { a, b, c, store, shards: [a, b, c] };
}

describe('CompositeStore configuration', () => {
  const m = new MemoryStore();
  const n = new MemoryStore();
  const bad: Array<[string, unknown]> = [
    ['no options', undefined],
    ['no counterStore field', { default: m }],
    ['unknown option', { default: m, counterStore: m, shards: { table: 't', stores: [m, n] } }],
    ['no placement at all', { counterStore: m }],
    ['routes not an array', { routes: { table: 't', store: m }, counterStore: m }],
    ['bad table name', { routes: [{ table: 'has space', store: m }], counterStore: m }],
    [
      'table routed twice',
      {
        routes: [
          { table: 't', store: m },
          { table: 't', store: n },
        ],
        counterStore: m,
      },
    ],
    ['store and shards', { routes: [{ table: 't', store: m, shards: [n] }], counterStore: m }],
    ['neither store nor shards', { routes: [{ table: 't' }], counterStore: m }],
    ['typo in a route', { routes: [{ table: 't', stores: [m, n] }], counterStore: m }],
    ['empty shards', { routes: [{ table: 't', shards: [] }], counterStore: m }],
    ['a shard repeated', { default: { shards: [m, n, m] }, counterStore: m }],
    ['not a store', { routes: [{ table: 't', store: { name: 'x' } }], counterStore: m }],
    ['default not a store', { default: 42, counterStore: m }],
    ['counter store without a counter', { default: m, counterStore: noCounter() }],
    ['name not a string', { default: m, counterStore: m, name: 7 }],
    ['closeStores not a boolean', { default: m, counterStore: m, closeStores: 'yes' }],
  ];
  for (const [what, options] of bad) {
    it(`rejects ${what} with InvalidArgumentError`, () => {
      expect(() => new CompositeStore(options as never)).toThrow(InvalidArgumentError);
    });
  }

  it('a table with no route and no default is an InvalidArgumentError; a transaction using it commits nothing', async () => {
    const routed = new MemoryStore();
    const store = new CompositeStore({
      routes: [{ table: 'accounts', store: routed }],
      counterStore: routed,
    });
    await expect(store.read('wallets', 'w')).rejects.toBeInstanceOf(InvalidArgumentError);
    await expect(
      store.checkAndSet({ table: 'wallets', key: 'w', expected: null, state: bytes('x') }),
    ).rejects.toBeInstanceOf(InvalidArgumentError);
    const db = new Percolator({ store });
    const tx = await db.begin();
    tx.set('accounts', 'a', 'c', '1');
    tx.set('wallets', 'w', 'c', '1');
    await expect(tx.commit()).rejects.toBeInstanceOf(InvalidArgumentError);
    // The routed row's prewrite was rolled back: nothing visible changed.
    expect(await db.transact((t) => t.get('accounts', 'a', 'c'))).toBeUndefined();
    await db.close();
  });

  it('declares what every routed store can do; the counter comes from counterStore', () => {
    const full = new MemoryStore({ maxStateBytes: 1000 });
    const limited = new OutageStore('limited', {
      orderedScan: false,
      batchCheckAndSet: false,
      maxStateBytes: 500,
    });
    const store = new CompositeStore({
      routes: [{ table: 'a', store: full }],
      default: { shards: [full, limited] },
      counterStore: full,
    });
    expect(store.capabilities).toEqual({
      batchRead: true,
      batchCheckAndSet: false,
      orderedScan: false,
      notificationIndex: true,
      atomicCounter: true,
      stampedCheckAndSet: false,
      maxStateBytes: 500,
    });
    expect(store.stores).toEqual([full, limited]);
    expect(store.name).toBe('composite(memory+limited)');
    const noOracle = new CompositeStore({ default: full, counterStore: null, name: 'custom' });
    expect(noOracle.capabilities.atomicCounter).toBe(false);
    expect(noOracle.name).toBe('custom');
  });
});

describe('routing', () => {
  it('shardOf is FNV-1a 64 + jump consistent hash: fixed values, so every client agrees forever', () => {
    // Golden values: if these change, every sharded deployment's rows are in the wrong place.
    expect(GOLDEN_KEYS.map((k) => shardOf(k, 2))).toEqual(GOLDEN_TWO_SHARDS);
    expect(GOLDEN_KEYS.map((k) => shardOf(k, 5))).toEqual(GOLDEN_FIVE_SHARDS);
    expect(shardOf('anything', 1)).toBe(0);
    expect(() => shardOf('k', 0)).toThrow(RangeError);
    // Spread: 3 shards each get about a third.
    const counts = [0, 0, 0];
    for (let i = 0; i < 3000; i++) counts[shardOf(`user/${i}`, 3)]!++;
    for (const c of counts) expect(c).toBeGreaterThan(850);
    // Appending a shard only moves keys onto the new shard (about a quarter of them).
    let moved = 0;
    for (let i = 0; i < 3000; i++) {
      const before = shardOf(`user/${i}`, 3);
      const after = shardOf(`user/${i}`, 4);
      if (before !== after) {
        expect(after).toBe(3);
        moved++;
      }
    }
    expect(moved).toBeGreaterThan(600);
    expect(moved).toBeLessThan(900);
  });

  it('observer leases, with no default, go to one store however the routes are listed (the route of the table that sorts first)', () => {
    const x = new MemoryStore();
    const y = new MemoryStore();
    const one = new CompositeStore({
      routes: [
        { table: 'xs', store: x },
        { table: 'ys', store: y },
      ],
      counterStore: x,
    });
    const other = new CompositeStore({
      routes: [
        { table: 'ys', store: y },
        { table: 'xs', store: x },
      ],
      counterStore: x,
    });
    // They went to the first route listed: x for one, y for the other.
    expect(one.storeFor('__lease', 'k')).toBe(x);
    expect(other.storeFor('__lease', 'k')).toBe(x);
  });

  it('puts each row in exactly one store: table routes first, then the sharded default', async () => {
    const accounts = new MemoryStore();
    const { a, b, c, shards } = threeShards();
    const store = new CompositeStore({
      routes: [{ table: 'accounts', store: accounts }],
      default: { shards },
      counterStore: accounts,
    });
    const keys = ['alice', 'bob', '🦄', 'a\u0000', 'ключ', 'x'.repeat(1024)];
    for (const key of keys) {
      expect(
        (await store.checkAndSet({ table: 'accounts', key, expected: null, state: bytes(key) })).ok,
      ).toBe(true);
      expect((await store.checkAndSet({ table: 'users', key, expected: null, state: bytes(key) })).ok).toBe(
        true,
      );
    }
    for (const key of keys) {
      expect(store.storeFor('accounts', key)).toBe(accounts);
      expect(text((await accounts.read('accounts', key))?.state)).toBe(key);
      const owner = shards[shardOf(key, 3)]!;
      expect(store.storeFor('users', key)).toBe(owner);
      for (const s of [a, b, c]) {
        expect((await s.read('users', key)) !== null).toBe(s === owner);
        expect(await s.read('accounts', key)).toBeNull();
      }
      const row = await store.read('users', key);
      expect(row?.version).toBe((await owner.read('users', key))?.version);
    }
    expect(new Set(keys.map((k) => shardOf(k, 3))).size).toBeGreaterThan(1);
  });

  it('readMany and checkAndSetMany group by store and answer in request order', async () => {
    const { store, shards } = threeShards();
    const keys = Array.from({ length: 30 }, (_, i) => `k${i}`);
    const created = await store.checkAndSetMany(
      keys.map((key) => ({ table: 't', key, expected: null, state: bytes(key) })),
    );
    expect(created.every((r) => r.ok)).toBe(true);
    for (const [i, key] of keys.entries()) {
      const owner = shards[shardOf(key, 3)]!;
      expect((await owner.read('t', key))?.version).toBe((created[i] as { version: string }).version);
    }
    const refs = [...keys, 'absent', keys[3]!].map((key) => ({ table: 't', key }));
    const rows = await store.readMany(refs);
    expect(rows.map((r) => (r ? text(r.state) : null))).toEqual([...keys, null, keys[3]]);
    const mixed = await store.checkAndSetMany([
      { table: 't', key: 'k1', expected: 'stale', state: bytes('no') },
      { table: 't', key: 'k2', expected: (created[2] as { version: string }).version, state: null },
      { table: 't', key: 'new', expected: null, state: bytes('n') },
    ]);
    expect(mixed.map((r) => r.ok)).toEqual([false, true, true]);
    expect(await store.read('t', 'k2')).toBeNull();
  });

  it('checkAndSetMany fails as "unknown" when one store failed and another applied, "no" when nothing applied', async () => {
    const up = new OutageStore('up');
    const down = new OutageStore('down');
    const store = new CompositeStore({ default: { shards: [up, down] }, counterStore: up });
    const onUp = Array.from({ length: 50 }, (_, i) => `r${i}`).find((k) => store.storeFor('t', k) === up)!;
    const onDown = Array.from({ length: 50 }, (_, i) => `r${i}`).find(
      (k) => store.storeFor('t', k) === down,
    )!;
    down.down = true;
    const both = store.checkAndSetMany([
      { table: 't', key: onUp, expected: null, state: bytes('1') },
      { table: 't', key: onDown, expected: null, state: bytes('1') },
    ]);
    await expect(both).rejects.toMatchObject({ applied: 'unknown' });
    expect(await up.inner.read('t', onUp)).not.toBeNull();
    const onlyDown = store.checkAndSetMany([{ table: 't', key: onDown, expected: null, state: bytes('1') }]);
    await expect(onlyDown).rejects.toMatchObject({ applied: 'no' });
    // The up store's request failed its condition: nothing applied anywhere, so 'no' holds.
    const failedCondition = store.checkAndSetMany([
      { table: 't', key: onUp, expected: null, state: bytes('2') },
      { table: 't', key: onDown, expected: null, state: bytes('2') },
    ]);
    await expect(failedCondition).rejects.toMatchObject({ applied: 'no' });
  });

  it('refuses a state past the smallest store limit before sending it anywhere', async () => {
    const big = new MemoryStore({ maxStateBytes: 10_000 });
    const small = new MemoryStore({ maxStateBytes: 100 });
    const store = new CompositeStore({
      routes: [{ table: 'big', store: big }],
      default: small,
      counterStore: big,
    });
    await expect(
      store.checkAndSet({ table: 'big', key: 'k', expected: null, state: new Uint8Array(101) }),
    ).rejects.toBeInstanceOf(RowTooLargeError);
    expect(await big.read('big', 'k')).toBeNull();
    expect(
      (await store.checkAndSet({ table: 'big', key: 'k', expected: null, state: new Uint8Array(100) })).ok,
    ).toBe(true);
  });

  it('incrementCounter forwards to counterStore; without one it is unsupported', async () => {
    const counter = new MemoryStore();
    const rows = new MemoryStore();
    const store = new CompositeStore({ default: rows, counterStore: counter });
    expect(await store.incrementCounter('c', 5)).toBe(5);
    expect(await counter.incrementCounter('c', 1)).toBe(6);
    expect(await rows.incrementCounter('c', 1)).toBe(1);
    const none = new CompositeStore({ default: rows, counterStore: null });
    await expect(none.incrementCounter('c', 1)).rejects.toBeInstanceOf(UnsupportedOperationError);
    expect(() => new Percolator({ store: none })).toThrow(InvalidArgumentError);
  });

  it('close() closes each store once, and not at all with closeStores: false', async () => {
    const closed: string[] = [];
    const tracked = (name: string) => {
      const s = new MemoryStore();
      s.close = async () => {
        closed.push(name);
      };
      return s;
    };
    const [x, y] = [tracked('x'), tracked('y')];
    const store = new CompositeStore({
      routes: [{ table: 'a', store: x }],
      default: { shards: [x, y] },
      counterStore: tracked('counter'),
    });
    await store.close();
    await store.close();
    expect(closed.sort()).toEqual(['counter', 'x', 'y']);
    await expect(store.read('a', 'k')).rejects.toThrow(/closed/);
    closed.length = 0;
    await new CompositeStore({ default: x, counterStore: x, closeStores: false }).close();
    expect(closed).toEqual([]);
  });

  it('a second close() made while the first runs resolves only once the stores are closed', async () => {
    let release!: () => void;
    const slow = new MemoryStore();
    let done = false;
    slow.close = () =>
      new Promise<void>((resolve) => {
        release = () => {
          done = true;
          resolve();
        };
      });
    const store = new CompositeStore({ default: slow, counterStore: slow });
    const first = store.close();
    let secondDone = false;
    const second = store.close().then(() => {
      secondDone = done;
    });
    await new Promise((resolve) => setTimeout(resolve, 10));
    release();
    await Promise.all([first, second]);
    expect(secondDone).toBe(true);
  });
});

describe('scans over shards', () => {
  const KEYS = ['a', 'a\u0000', 'a\u0000b', 'b', 'é', '\ue000', '\ufffd', '𐀀', '😀', '中文', 'z', 'zz'];
  const many = Array.from({ length: 120 }, (_, i) => `row/${String(i).padStart(3, '0')}`);

  async function fill(store: RowStore, keys: readonly string[], notified = (_: string) => false) {
    for (const key of keys) {
      const r = await store.checkAndSet({
        table: 't',
        key,
        expected: null,
        state: bytes(key),
        notified: notified(key),
      });
      expect(r.ok).toBe(true);
    }
  }

  it('merges shards in compareKeys order with start, end, after and limit', async () => {
    const { store } = threeShards();
    await fill(store, [...KEYS, ...many]);
    const sorted = [...KEYS, ...many].sort(compareKeys);
    const keysOf = (rows: readonly { key: string }[]) => rows.map((r) => r.key);
    expect(keysOf(await store.scan('t', { limit: 1000 }))).toEqual(sorted);
    expect(keysOf(await store.scan('t', { limit: 7 }))).toEqual(sorted.slice(0, 7));
    expect(keysOf(await store.scan('t', { start: sorted[10], end: sorted[40], limit: 1000 }))).toEqual(
      sorted.slice(10, 40),
    );
    expect(keysOf(await store.scan('t', { start: sorted[10], after: sorted[20], limit: 5 }))).toEqual(
      sorted.slice(21, 26),
    );
    const paged: string[] = [];
    let after: string | undefined;
    for (;;) {
      const page = await store.scan('t', { after, limit: 9 });
      paged.push(...keysOf(page));
      if (page.length < 9) break;
      after = page[page.length - 1]!.key;
    }
    expect(paged).toEqual(sorted);
  });

  it('skips rows left on a shard that does not own them, and still pages completely', async () => {
    const { store, shards } = threeShards();
    await fill(store, many);
    // Strays: copies of rows on a wrong shard (as a half-done migration leaves them), and
    // a whole run of stray keys on one shard, which makes that shard's pages short of owned rows.
    const strays: string[] = [];
    for (const key of many.slice(0, 40)) {
      const wrong = shards[(shardOf(key, 3) + 1) % 3]!;
      await wrong.checkAndSet({ table: 't', key, expected: null, state: bytes('stale copy') });
    }
    for (let i = 0; i < 50; i++) {
      const key = `row/050-stray-${String(i).padStart(2, '0')}`;
      if (shardOf(key, 3) === 0) continue;
      strays.push(key);
      await shards[0]!.checkAndSet({ table: 't', key, expected: null, state: bytes('stray') });
    }
    expect(strays.length).toBeGreaterThan(20);
    const seen: string[] = [];
    let after: string | undefined;
    for (;;) {
      const page = await store.scan('t', { after, limit: 5 });
      for (const r of page) expect(text(r.row.state)).toBe(r.key);
      seen.push(...page.map((r) => r.key));
      if (page.length < 5) break;
      after = page[page.length - 1]!.key;
    }
    expect(seen).toEqual(many);
    for (const key of strays) expect(await store.read('t', key)).toBeNull();
  });

  it('scanNotified merges the notification indexes of every shard', async () => {
    const { store } = threeShards();
    const all = [...KEYS, ...many];
    await fill(store, all, (k) => k.length % 2 === 0);
    const expected = all.filter((k) => k.length % 2 === 0).sort(compareKeys);
    expect(await store.scanNotified('t', { limit: 1000 })).toEqual(expected);
    const paged: string[] = [];
    let after: string | undefined;
    for (;;) {
      const page = await store.scanNotified('t', { after, limit: 4 });
      paged.push(...page);
      if (page.length < 4) break;
      after = page[page.length - 1];
    }
    expect(paged).toEqual(expected);
  });

  it('a scan of a table whose store cannot scan is a typed error', async () => {
    const noScan = new OutageStore('noscan', { orderedScan: false });
    const store = new CompositeStore({ default: noScan, counterStore: null });
    await expect(store.scan('t', { limit: 1 })).rejects.toBeInstanceOf(UnsupportedOperationError);
  });
});

describe('transactions across stores', () => {
  const balance = async (tx: Transaction, table: string, row: string) =>
    Number(await tx.getString(table, row, 'balance'));

  it('keeps the total of concurrent cross-store transfers constant in every snapshot', async () => {
    const pgLike = new MemoryStore();
    const { shards } = threeShards();
    const store = new CompositeStore({
      routes: [{ table: 'accounts', store: pgLike }],
      default: { shards },
      counterStore: pgLike,
    });
    const places = [
      ...['alice', 'bob'].map((row) => ['accounts', row] as const),
      ...['w1', 'w2', 'w3', 'w4', 'w5', 'w6'].map((row) => ['wallets', row] as const),
    ];
    const clients = [0, 1, 2].map(() => new Percolator({ store }));
    await clients[0]!.transact(async (tx) => {
      for (const [table, row] of places) tx.set(table, row, 'balance', '100');
    });
    let stop = false;
    const snapshots: number[] = [];
    const reader = (async () => {
      while (!stop) {
        // Memory stores answer without I/O: yield, or this loop starves the writers' backoff timers.
        await new Promise((resolve) => setImmediate(resolve));
        snapshots.push(
          await clients[0]!.transact(async (tx) => {
            let total = 0;
            for (const [table, row] of places) total += await balance(tx, table, row);
            return total;
          }),
        );
      }
    })();
    await Promise.all(
      clients.map(async (db, c) => {
        for (let i = 0; i < 25; i++) {
          const [ft, fr] = places[(i + c) % places.length]!;
          const [tt, tr] = places[(i * 5 + c + 1) % places.length]!;
          if (fr === tr) continue;
          await db.transact(async (tx) => {
            tx.set(ft, fr, 'balance', String((await balance(tx, ft, fr)) - 3));
            tx.set(tt, tr, 'balance', String((await balance(tx, tt, tr)) + 3));
          });
        }
      }),
    );
    stop = true;
    await reader;
    expect(snapshots.length).toBeGreaterThan(0);
    for (const total of snapshots) expect(total).toBe(places.length * 100);
    // Rows really are in several stores.
    const holding = await Promise.all(
      [pgLike, ...shards].map(
        async (s) =>
          (await s.scan('wallets', { limit: 100 })).length +
          (await s.scan('accounts', { limit: 100 })).length,
      ),
    );
    expect(holding.filter((n) => n > 0).length).toBeGreaterThanOrEqual(3);
    await Promise.all(clients.map((db) => db.close()));
  });
});

describe('one store unreachable in the middle of a commit', () => {
  // accounts/alice on `pg` is the primary (first in table order); wallets/w on `dyn` a secondary.
  function setup() {
    const pg = new OutageStore('pg');
    const dyn = new OutageStore('dyn');
    const redis = new OutageStore('redis');
    // The oracle lives elsewhere: a lost oracle store stops every transaction from starting.
    const oracle = new MemoryStore();
    const store = new CompositeStore({
      routes: [
        { table: 'accounts', store: pg },
        { table: 'wallets', store: dyn },
        { table: 'carts', store: redis },
      ],
      counterStore: oracle,
    });
    const clock = fakeClock();
    function client(onCommitStep?: (step: string) => void | Promise<void>) {
      return new Percolator({
        store,
        clock,
        // No heartbeat CAS runs during a test; lock expiry comes from advancing the fake clock.
        lockTtlMs: 30_000,
        lockWaitMs: 200,
        ...(onCommitStep ? { hooks: { onCommitStep: (e) => onCommitStep(e.step) } } : {}),
      });
    }
    return { pg, dyn, redis, store, clock, client };
  }
  const ROWS = [
    ['accounts', 'alice'],
    ['wallets', 'w'],
    ['carts', 'c'],
  ] as const;

  async function seed(db: Percolator) {
    await db.transact(async (tx) => {
      for (const [t, r] of ROWS) tx.set(t, r, 'v', 'old');
    });
  }
  /** What a new snapshot sees of each row: its value, or 'error' if the read failed. */
  async function look(db: Percolator): Promise<string[]> {
    const tx = await db.begin();
    const seen: string[] = [];
    for (const [t, r] of ROWS) {
      try {
        seen.push((await tx.getString(t, r, 'v')) ?? 'absent');
      } catch (error) {
        if (!(error instanceof StoreError || error instanceof LockNotResolvedError)) throw error;
        seen.push('error');
      }
    }
    await tx.rollback();
    return seen;
  }
  /** All or nothing: readable rows agree (all old or all new). */
  function allOrNothing(seen: readonly string[]) {
    const values = new Set(seen.filter((v) => v !== 'error'));
    expect(values.size, `a reader saw ${seen.join(', ')}`).toBeLessThanOrEqual(1);
  }

  it('a secondary store lost after the commit point: its lock stays until it returns, then readers roll it forward', async () => {
    const { pg, dyn, client } = setup();
    await seed(client());
    const writer = client((step) => {
      if (step === 'afterCommitPrimary') dyn.down = true;
    });
    const reader = client();
    let locked: StoredRow | null = null;
    const tx = await writer.begin();
    for (const [t, r] of ROWS) tx.set(t, r, 'v', 'new');
    await tx.commit(); // committed: the secondary failure is left to readers
    locked = await dyn.inner.read('wallets', 'w');
    for (let i = 0; i < 3; i++) {
      const seen = await look(reader);
      allOrNothing(seen);
      expect(seen).toEqual(['new', 'error', 'new']);
    }
    // Nothing could touch the lock while the store was away.
    expect((await dyn.inner.read('wallets', 'w'))?.version).toBe(locked?.version);
    dyn.down = false;
    expect(await look(reader)).toEqual(['new', 'new', 'new']);
    expect((await dyn.inner.read('wallets', 'w'))?.version).not.toBe(locked?.version); // rolled forward
    expect(pg.down).toBe(false);
  });

  it('the primary store lost before the commit point: the transaction fails, readers never see it', async () => {
    const { pg, client, clock } = setup();
    await seed(client());
    const writer = client((step) => {
      if (step === 'beforeCommitPrimary') pg.down = true;
    });
    const reader = client();
    const tx = await writer.begin();
    for (const [t, r] of ROWS) tx.set(t, r, 'v', 'new');
    const error = await tx.commit().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    const seen = await look(reader);
    allOrNothing(seen);
    expect(seen).toEqual(['error', 'old', 'old']);
    // Back, with the abandoned primary lock still there: readers wait, then roll it back after the TTL.
    pg.down = false;
    clock.advance(60_000);
    expect(await look(reader)).toEqual(['old', 'old', 'old']);
  });

  it('the primary store drops the reply of the commit CAS: unknown to the writer, all or nothing to readers', async () => {
    const { pg, client } = setup();
    await seed(client());
    const writer = client((step) => {
      if (step === 'beforeCommitPrimary') pg.dropReplyOnce();
    });
    const reader = client();
    const tx = await writer.begin();
    for (const [t, r] of ROWS) tx.set(t, r, 'v', 'new');
    await expect(tx.commit()).rejects.toBeInstanceOf(CommitUnknownError);
    // The commit record landed; the secondaries are still locked and their primary is unreachable.
    for (let i = 0; i < 3; i++) {
      const seen = await look(reader);
      allOrNothing(seen);
      expect(seen).toEqual(['error', 'error', 'error']);
    }
    pg.down = false;
    expect(await look(reader)).toEqual(['new', 'new', 'new']);
  });

  it('a store lost between prewrites: locks elsewhere are rolled back by readers, nothing half-visible', async () => {
    const { redis, client, clock } = setup();
    await seed(client());
    let crashed = false;
    const writer = client((step) => {
      // The client dies once everything is prewritten, and the cart's store goes away with it.
      if (step === 'beforeCommitPrimary') {
        redis.down = true;
        crashed = true;
        throw new ClientCrash();
      }
    });
    const reader = client();
    const tx = await writer.begin();
    for (const [t, r] of ROWS) tx.set(t, r, 'v', 'new');
    await expect(tx.commit()).rejects.toBeInstanceOf(ClientCrash);
    expect(crashed).toBe(true);
    clock.advance(60_000); // the locks expire
    const seen = await look(reader);
    allOrNothing(seen);
    expect(seen).toEqual(['old', 'old', 'error']);
    const lockedCart = await redis.inner.read('carts', 'c');
    redis.down = false;
    expect(await look(reader)).toEqual(['old', 'old', 'old']);
    expect((await redis.inner.read('carts', 'c'))?.version).not.toBe(lockedCart?.version); // rolled back
  });
});

function noCounter(): RowStore {
  const s = new MemoryStore();
  Object.defineProperty(s, 'capabilities', { value: { ...s.capabilities, atomicCounter: false } });
  return s;
}

// Computed independently (a Python FNV-1a 64 + the paper's jump hash) when the layout was fixed.
const GOLDEN_KEYS = ['alice', 'bob', 'carol', 'dave', 'erin', '🦄', 'a\u0000b', ''];
const GOLDEN_TWO_SHARDS = [0, 0, 0, 0, 1, 0, 0, 1];
const GOLDEN_FIVE_SHARDS = [4, 2, 3, 0, 3, 0, 0, 1];
