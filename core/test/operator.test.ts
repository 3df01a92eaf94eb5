import {
  AbortedError,
  ClientCrash,
  type CommitStep,
  InvalidArgumentError,
  type LockedCell,
  MemoryStore,
  Percolator,
  primaryFate,
  scanLocks,
  scanNotifications,
} from '@percolator/core';
import { describe, expect, it, vi } from 'vitest';
import { fakeClock, InstrumentedStore, text } from './support.js';

/**
 * The operator APIs (docs/operations.md) on the in-memory store with a fake clock:
 * primaryFate / scanLocks only read, resolveLocks settles exactly as a reader would,
 * gc prunes what the policy allows, scanNotifications counts what observers have left.
 */

const TTL = 1000;
const ROWS = ['a', 'b', 'c'];

async function stuck(step: CommitStep, isPrimary?: boolean) {
  const store = new MemoryStore();
  const clock = fakeClock();
  const db = new Percolator({ store, clock, lockTtlMs: TTL });
  await db.transact(async (tx) => {
    for (const r of ROWS) tx.set('t', r, 'v', 'old');
  });
  let crashed = false;
  const crasher = new Percolator({
    store,
    clock,
    lockTtlMs: TTL,
    // The two-phase steps these hooks stop at (a one-step commit has none).
    onePhaseMaxRows: 1,
    hooks: {
      onCommitStep: (e) => {
        if (crashed || e.step !== step || (isPrimary !== undefined && e.isPrimary !== isPrimary)) return;
        crashed = true;
        throw new ClientCrash();
      },
    },
  });
  await crasher
    .transact(
      async (tx) => {
        for (const r of ROWS) tx.set('t', r, 'v', 'new');
      },
      { maxAttempts: 1 },
    )
    .catch(() => undefined);
  await crasher.close();
  expect(crashed).toBe(true);
  return { store, clock, db };
}

async function locksOf(store: MemoryStore, clock: () => number): Promise<LockedCell[]> {
  const out: LockedCell[] = [];
  for await (const l of scanLocks(store, 't', { clock })) out.push(l);
  return out;
}

/**
 * A client committing ROWS (`v` = 'new') two-phase, paused just before its commit point:
 * resolves once it is there. `go()` lets it on; `abort()` fires its commit's signal (then
 * it rolls back when let on). `commit` is its commit's result, or the error it failed with.
 */
async function pausedOwner(store: MemoryStore, options: { lockTtlMs?: number } = {}) {
  let go!: () => void;
  const gate = new Promise<void>((resolve) => (go = resolve));
  let paused!: () => void;
  const atPause = new Promise<void>((resolve) => (paused = resolve));
  const owner = new Percolator({
    store,
    ...options,
    onePhaseMaxRows: 1,
    hooks: {
      onCommitStep: async (e) => {
        if (e.step !== 'beforeCommitPrimary') return;
        paused();
        await gate;
      },
    },
  });
  const tx = await owner.begin();
  for (const r of ROWS) tx.set('t', r, 'v', 'new');
  const abort = new AbortController();
  const commit = tx.commit({ signal: abort.signal }).then(
    (r) => r,
    (e: unknown) => e,
  );
  await atPause;
  return { owner, commit, go, abort: () => abort.abort() };
}

/**
 * A view of `store` for a resolver that counts its reads of the primary row `a` (once it has
 * read it twice, the verdict then how long the lock has, it has found the lock live), and
 * holds its reads of row `b` while `hold.b` is set.
 */
function countingView(store: MemoryStore) {
  const seen = { primaryReads: 0 };
  const hold: { b?: Promise<void> } = {};
  const view = new Proxy(store, {
    get(target, property, receiver) {
      const value = Reflect.get(target, property, receiver);
      if (property === 'read')
        return async (table: string, key: string) => {
          if (key === 'a') seen.primaryReads++;
          if (key === 'b' && hold.b) await hold.b;
          return target.read(table, key);
        };
      if (property === 'readMany')
        return async (refs: readonly { table: string; key: string }[]) => {
          seen.primaryReads += refs.filter((r) => r.key === 'a').length;
          if (hold.b && refs.some((r) => r.key === 'b')) await hold.b;
          return target.readMany(refs);
        };
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
  return { view, seen, hold };
}

describe('operator APIs', () => {
  const cases: [CommitStep, boolean | undefined, 'new' | 'old'][] = [
    ['afterPrewrite', true, 'old'],
    ['afterPrewrite', false, 'old'],
    ['beforeCommitPrimary', undefined, 'old'],
    ['afterCommitPrimary', undefined, 'new'],
  ];
  for (const [step, isPrimary, expected] of cases) {
    it(`a client stopped at ${step}${isPrimary === undefined ? '' : ` (primary ${isPrimary})`}: locks listed, resolved to "${expected}" as a reader reads`, async () => {
      const { store, clock, db } = await stuck(step, isPrimary);
      const locks = await locksOf(store, clock);
      expect(locks.length).toBeGreaterThan(0);
      const live = locks[0]!;
      expect(live.expired).toBe(false);
      expect(live.fate.state === 'pending' ? live.fate.expired : live.fate.state).toBe(
        expected === 'new' ? 'committed' : false,
      );
      if (expected === 'old') {
        // Resolving a live lock changes nothing.
        const early = await db.resolveLocks('t', locks[0]!.row);
        expect(early.map((r) => r.outcome.action)).toEqual(['alive']);
      }
      clock.advance(TTL + 1);
      // Past the TTL the verdict is read, not applied: the lock is still there.
      const fate = await primaryFate(store, locks[0]!.lock, clock());
      expect(fate.state).toBe(expected === 'new' ? 'committed' : 'pending');
      expect((await locksOf(store, clock)).length).toBe(locks.length);
      const results = [];
      for (const r of new Set(locks.map((l) => l.row))) results.push(...(await db.resolveLocks('t', r)));
      expect(results.length).toBe(locks.length);
      for (const r of results)
        expect(r.outcome.action).toBe(expected === 'new' ? 'rolled-forward' : 'rolled-back');
      expect(await locksOf(store, clock)).toEqual([]);
      const read = await db.transact(async (tx) => Promise.all(ROWS.map((r) => tx.getString('t', r, 'v'))));
      expect(read).toEqual(ROWS.map(() => expected));
    });
  }

  it('gc reports values it moved out of the head row as moved, not freed, and the dry run estimates them', async () => {
    // Found in review: values left `moving` by failed version-row writes were moved by gc's
    // tidy step, and the head row's shrinking was reported as freed (the CLI's total),
    // while the store grew by the version rows made; the dry run said nothing of them.
    const store = new InstrumentedStore(new MemoryStore(), { stampedCheckAndSet: false });
    let failVersions = true;
    store.casFault = (r) => (failVersions && r.table.startsWith('__v.') ? 'fail-before' : undefined);
    const clock = fakeClock();
    const writer = new Percolator({ store, clock, gc: { inlineHistoryBytes: 0 } });
    for (let i = 0; i < 6; i++)
      await writer.transact(async (tx) => tx.set('t', 'r', 'c', String(i).repeat(1000)));
    await writer.flush();
    await writer.close();
    failVersions = false;
    const db = new Percolator({ store, clock });
    const dry = await db.gc('t', { row: 'r', dryRun: true });
    expect(dry.versionRowsCreated).toBeGreaterThan(0);
    expect(dry.versionRowBytesCreated).toBeGreaterThan(4000);
    const done = await db.gc('t', { row: 'r' });
    expect(done.versionRowsCreated).toBe(dry.versionRowsCreated);
    // The head row's figure as the run leaves it: its moved values out (found by an operator).
    expect(dry.headBytes).toBe(done.headBytes);
    expect(done.versionRowBytesCreated).toBeGreaterThan(4000);
    // What left the head row went to the version rows made: freed in all, about nothing.
    expect(done.headBytes + done.versionRowBytes - done.versionRowBytesCreated).toBeLessThan(1000);
    const versionRows = await store.inner.scan('__v.t', { limit: 100 });
    const made = versionRows.reduce((n, r) => n + r.row.state.length, 0);
    expect(done.versionRowBytesCreated).toBe(made);
    expect(await db.transact((tx) => tx.get('t', 'r', 'c')).then(text)).toBe('5'.repeat(1000));
    await db.close();
  });

  it('gc drops what the retention policy allows and reports it; --dry-run only counts', async () => {
    const store = new MemoryStore();
    const clock = fakeClock();
    const db = new Percolator({ store, clock, gc: { retentionMs: 1000, maxVersionsPerCell: 100 } });
    for (let i = 0; i < 5; i++) {
      await db.transact(async (tx) => tx.set('t', 'r', 'v', `value ${i}`.repeat(20)));
    }
    await db.flush();
    clock.advance(5000);
    const dry = await db.gc('t', { dryRun: true });
    expect(dry.rows).toBe(1);
    expect(dry.versions).toBe(4);
    expect(dry.headBytes + dry.versionRowBytes).toBeGreaterThan(0);
    const again = await db.gc('t', { dryRun: true });
    expect(again).toEqual(dry);
    const done = await db.gc('t');
    expect(done.versions).toBe(4);
    expect(done.versionRows).toBe(dry.versionRows);
    // With nothing to settle, the dry run's figures are the run's: its head row's size
    // included (the garbage names the run deletes with their version rows were counted in).
    expect(done.headBytes).toBe(dry.headBytes);
    expect(done.versionRowBytes).toBe(dry.versionRowBytes);
    expect(done.headBytes + done.versionRowBytes).toBeGreaterThan(0);
    expect(await db.gc('t')).toMatchObject({ versions: 0, versionRows: 0, headBytes: 0 });
    expect(await db.transact((tx) => tx.get('t', 'r', 'v')).then(text)).toBe('value 4'.repeat(20));
  });

  it('gc reports its progress row by row (running totals), and resolveLocks each lock as it is settled', async () => {
    const store = new MemoryStore();
    const clock = fakeClock();
    const db = new Percolator({ store, clock, gc: { retentionMs: 1000, maxVersionsPerCell: 100 } });
    for (let i = 0; i < 3; i++)
      await db.transact(async (tx) => {
        for (const r of ['r1', 'r2', 'r3']) tx.set('t', r, 'v', `value ${i}`);
      });
    await db.flush();
    clock.advance(5000);
    const seen: [string, number, number][] = [];
    const total = await db.gc('t', { onProgress: (done, row) => seen.push([row, done.rows, done.versions]) });
    expect(seen).toEqual([
      ['r1', 1, 2],
      ['r2', 2, 4],
      ['r3', 3, 6],
    ]);
    expect(total.versions).toBe(6);
    // One row: called once; an absent row: not at all.
    const one: string[] = [];
    await db.gc('t', { row: 'r2', dryRun: true, onProgress: (_, row) => one.push(row) });
    await db.gc('t', { row: 'absent', onProgress: (_, row) => one.push(row) });
    expect(one).toEqual(['r2']);
    await expect(db.gc('t', { onProgress: 'yes' as never })).rejects.toThrow(
      /gc onProgress must be a function/,
    );
    await expect(db.resolveLocks('t', 'r1', { onSettled: 1 as never })).rejects.toThrow(
      /resolveLocks onSettled must be a function/,
    );
    await db.close();

    const stuckRow = await stuck('beforeCommitPrimary');
    const resolver = new Percolator({ store: stuckRow.store, clock: stuckRow.clock, lockTtlMs: TTL });
    stuckRow.clock.advance(TTL + 1);
    const settled: string[] = [];
    const results = await resolver.resolveLocks('t', 'b', {
      onSettled: (lock) => settled.push(`${lock.column}:${lock.outcome.action}`),
    });
    expect(settled).toEqual(results.map((r) => `${r.column}:${r.outcome.action}`));
    expect(settled).toEqual(['v:rolled-back']);
    await resolver.close();
  });

  it('resolveLocks with waitMs reports a live lock its owner settled meanwhile as released, committed or not', async () => {
    // Found by an operator: a lock whose owner finished during `resolve --wait` was left out of
    // the result, and the operator who had waited on it read "no locks".
    for (const outcome of ['committed', 'rolled back'] as const) {
      const store = new MemoryStore();
      const { owner, commit, go, abort } = await pausedOwner(store);
      const { view, seen } = countingView(store);
      const resolver = new Percolator({ store: view });
      const settled: string[] = [];
      const waiting = resolver.resolveLocks('t', 'b', {
        waitMs: 30_000,
        onSettled: (lock) => settled.push(lock.outcome.action),
      });
      // Its first look finds the lock live (the owner refreshes it); then the owner goes on.
      await vi.waitFor(() => expect(seen.primaryReads).toBeGreaterThanOrEqual(2), { timeout: 10_000 });
      if (outcome === 'rolled back') abort();
      go();
      const [result] = await waiting;
      const committed = await commit;
      if (outcome === 'committed') {
        expect(result!.outcome).toEqual({
          action: 'released',
          fate: 'committed',
          commitTs: (committed as { commitTs: number }).commitTs,
        });
      } else {
        expect(committed).toBeInstanceOf(AbortedError);
        expect(result!.outcome).toEqual({ action: 'released', fate: 'rolled-back' });
      }
      expect(result).toMatchObject({ column: 'v', isPrimary: false, primary: { row: 'a' } });
      expect(settled).toEqual(['released']);
      await owner.close();
      await resolver.close();
    }
  });

  it("a released lock whose primary's record was pruned meanwhile is still reported committed (its own row holds the record)", async () => {
    // Found in review: the fate came from the primary alone, and a committed transaction whose
    // primary record was pruned once its locks were settled was reported as not committed.
    const store = new MemoryStore();
    const { owner, commit, go } = await pausedOwner(store);
    const { view, seen, hold } = countingView(store);
    const resolver = new Percolator({ store: view });
    const waiting = resolver.resolveLocks('t', 'b', { waitMs: 30_000 });
    await vi.waitFor(() => expect(seen.primaryReads).toBeGreaterThanOrEqual(2), { timeout: 10_000 });
    let releaseB!: () => void;
    hold.b = new Promise<void>((resolve) => (releaseB = resolve));
    go();
    await commit;
    await owner.flush(); // the secondaries committed: b's lock is gone, its commit record in its row
    // Meanwhile writers that keep one version prune the primary's record of it.
    const writer = new Percolator({ store, gc: { retentionMs: 0, maxVersionsPerCell: 1 } });
    for (let i = 0; i < 3; i++) await writer.transact(async (tx) => tx.set('t', 'a', 'v', `later ${i}`));
    await writer.gc('t', { row: 'a' });
    await writer.close();
    releaseB();
    const [result] = await waiting;
    expect(result!.outcome).toMatchObject({ action: 'released', fate: 'committed' });
    expect((result!.outcome as { commitTs?: number }).commitTs).toBeGreaterThan(0);
    expect(await resolver.transact((tx) => tx.getString('t', 'b', 'v'))).toBe('new');
    await owner.close();
    await resolver.close();
  });

  it("resolveLocks with waitMs says when a live lock's owner refreshed it meanwhile (alive, still committing)", async () => {
    // Found by an operator: "run again with a longer --wait" cannot settle the lock of an
    // owner that is alive and refreshing it.
    for (const [lockTtlMs, waitMs, refreshed] of [
      [1500, 2000, true],
      [30_000, 300, false],
    ] as const) {
      const store = new MemoryStore();
      const { owner, commit, go } = await pausedOwner(store, { lockTtlMs });
      const resolver = new Percolator({ store, lockTtlMs });
      const [result] = await resolver.resolveLocks('t', 'b', { waitMs });
      expect(result!.outcome.action).toBe('alive');
      expect((result!.outcome as { refreshed?: true }).refreshed === true).toBe(refreshed);
      go();
      await commit;
      await owner.close();
      await resolver.close();
    }
  });

  it('gc prunes the records its settling releases: a second gc finds nothing left', async () => {
    // Row a's commit record of a transaction stopped after its commit point lists b and c,
    // still locked: the record is held until they are settled. A newer write to a leaves
    // it an old version. Past the retention (but not so far that the tidy step's own
    // batch of prunes is due) gc rolls b and c forward and must then drop the record.
    const { store, clock } = await stuck('afterCommitPrimary');
    const gc = { retentionMs: 60_000, maxVersionsPerCell: 32 };
    const db = new Percolator({ store, clock, lockTtlMs: TTL, gc });
    await db.transact(async (tx) => tx.set('t', 'a', 'v', 'newer'));
    clock.advance(61_000);
    const first = await db.gc('t', { row: 'a' });
    expect(first.versions).toBeGreaterThanOrEqual(2); // 'old' and the held record of 'new'
    expect(first.held).toBe(0);
    expect(await db.gc('t', { row: 'a' })).toMatchObject({ versions: 0, held: 0 });
    const read = await db.transact(async (tx) => Promise.all(ROWS.map((r) => tx.getString('t', r, 'v'))));
    expect(read).toEqual(['newer', 'new', 'new']);
  });

  it('scanNotifications counts pending cells per column and per observer', async () => {
    const store = new MemoryStore();
    const clock = fakeClock();
    const db = new Percolator({ store, clock, observedColumns: [{ table: 't', column: 'doc' }] });
    for (const r of ['x', 'y', 'z']) await db.transact(async (tx) => tx.set('t', r, 'doc', r));
    const all = await scanNotifications(store, 't');
    expect(all).toMatchObject([{ table: 't', column: 'doc', pending: 3, oldest: { row: 'x' } }]);
    expect(all[0]!.oldest.sinceMs).toBe(clock());
    const worker = db.worker({
      observers: [{ name: 'indexer', table: 't', column: 'doc', handler: async () => {} }],
    });
    await worker.runUntilIdle();
    expect(await scanNotifications(store, 't')).toEqual([]);
    await db.transact(async (tx) => tx.set('t', 'y', 'doc', 'y2'));
    expect(await scanNotifications(store, 't', { observer: 'indexer' })).toMatchObject([
      { column: 'doc', pending: 1, oldest: { row: 'y' } },
    ]);
    expect(await scanNotifications(store, 't', { observer: 'other' })).toMatchObject([
      { column: 'doc', pending: 1 },
    ]);
    await worker.runUntilIdle();
    expect(await scanNotifications(store, 't', { observer: 'indexer' })).toEqual([]);
  });

  it("scanLocks reads a pending transaction's primary once, not once per lock, and judges expiry again as time passes", async () => {
    // Found in review: a transaction that crashed over 10,000 rows left 10,000 locks, and
    // its primary row, listing them all, was read and decoded once per lock (56 s).
    const store = new InstrumentedStore(new MemoryStore(), { stampedCheckAndSet: false });
    const clock = fakeClock();
    const crasher = new Percolator({
      store,
      clock,
      lockTtlMs: 1000,
      onePhaseMaxRows: 1,
      hooks: {
        onCommitStep: (e) => {
          if (e.step === 'beforeCommitPrimary') throw new ClientCrash();
        },
      },
    });
    const rows = Array.from({ length: 200 }, (_, i) => `r${String(i).padStart(3, '0')}`);
    await crasher
      .transact(
        async (tx) => {
          for (const r of rows) tx.set('t', r, 'v', 'x');
        },
        { maxAttempts: 1 },
      )
      .catch(() => undefined);
    await crasher.close();
    const reads = store.calls.read;
    const live: LockedCell[] = [];
    for await (const l of scanLocks(store, 't', { clock, pageSize: 16 })) live.push(l);
    expect(live).toHaveLength(200);
    expect(live.every((l) => l.fate.state === 'pending' && !l.expired)).toBe(true);
    expect(store.calls.read - reads).toBe(1);
    // Past the TTL while listing: the verdict is read again, and says expired from there on.
    const expiredFrom = 100;
    const listed: LockedCell[] = [];
    let n = 0;
    for await (const l of scanLocks(store, 't', { clock, pageSize: 16 })) {
      listed.push(l);
      if (++n === expiredFrom) clock.advance(1001);
    }
    expect(listed.slice(0, expiredFrom).every((l) => !l.expired)).toBe(true);
    expect(listed.slice(expiredFrom).every((l) => l.expired)).toBe(true);
  });

  it('scanLocks: bad options are typed errors before anything is read', async () => {
    const store = new MemoryStore();
    for (const bad of [
      { pageSize: 0 },
      { olderThanMs: Number.NaN },
      { olderThan: 5 },
      { clock: 3 },
      { olderThanMs: -1 },
    ]) {
      const error = await (async () => {
        for await (const _ of scanLocks(store, 't', bad as never)) break;
      })().catch((e: unknown) => e);
      expect(error, JSON.stringify(bad)).toBeInstanceOf(InvalidArgumentError);
    }
  });

  it('scanNotifications: one column with `column`; bad options are typed errors (pageSize 0 looped for ever)', async () => {
    const store = new MemoryStore();
    const db = new Percolator({
      store,
      observedColumns: [
        { table: 't', column: 'doc' },
        { table: 't', column: 'title' },
      ],
    });
    await db.transact(async (tx) => {
      tx.set('t', 'x', 'doc', 'd');
      tx.set('t', 'x', 'title', 'T');
    });
    // The store does not know which columns an observer watches: both count for it ...
    expect(
      (await scanNotifications(store, 't', { observer: 'indexer' })).map((p) => p.column).sort(),
    ).toEqual(['doc', 'title']);
    // ... unless its column is named.
    expect(await scanNotifications(store, 't', { observer: 'indexer', column: 'doc' })).toMatchObject([
      { column: 'doc', pending: 1, oldest: { row: 'x' } },
    ]);
    expect(await scanNotifications(store, 't', { column: 'other' })).toEqual([]);
    for (const bad of [{ pageSize: 0 }, { pageSize: 1.5 }, { column: '' }, { observer: 3 }, { colum: 'doc' }])
      await expect(scanNotifications(store, 't', bad as never), JSON.stringify(bad)).rejects.toBeInstanceOf(
        InvalidArgumentError,
      );
    // One key a page still finds them all.
    expect(await scanNotifications(store, 't', { pageSize: 1 })).toHaveLength(2);
    await db.close();
  });
});
