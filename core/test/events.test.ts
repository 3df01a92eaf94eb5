import {
  AbortedError,
  ClientCrash,
  ClosedError,
  LockNotResolvedError,
  MemoryStore,
  Percolator,
  type PercolatorEvent,
  type TransactionEndEvent,
} from '@percolator/core';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { fakeClock, InstrumentedStore } from './support.js';

const TTL = 1000;

function recorder() {
  const events: PercolatorEvent[] = [];
  const of = <T extends PercolatorEvent['type']>(type: T) =>
    events.filter((e): e is Extract<PercolatorEvent, { type: T }> => e.type === type);
  return { events, of, onEvent: (e: PercolatorEvent) => void events.push(e) };
}

/** A client that stops at `beforeCommitPrimary` (every prewrite landed) until released, or crashes at `crashAt`. */
function pausingWriter(store: InstrumentedStore, clock: ReturnType<typeof fakeClock>, crashAt?: string) {
  let release!: () => void;
  const released = new Promise<void>((r) => {
    release = r;
  });
  let pause!: () => void;
  const paused = new Promise<void>((r) => {
    pause = r;
  });
  const db = new Percolator({
    store,
    clock,
    lockTtlMs: TTL,
    // The two-phase steps these hooks stop at (a one-step commit has none).
    onePhaseMaxRows: 1,
    // Its locks carry its start timestamp (tx.startTs), as the tests compare: no identity
    // apart from a peeked snapshot (docs/protocol.md 4.10).
    peekedWrites: false,
    hooks: {
      onCommitStep: async (e) => {
        if (e.step === crashAt) throw new ClientCrash();
        if (crashAt === undefined && e.step === 'beforeCommitPrimary') {
          pause();
          await released;
        }
      },
    },
  });
  return { db, release, paused };
}

async function until(condition: () => boolean) {
  while (!condition()) await new Promise((r) => setTimeout(r, 2));
}

afterEach(() => {
  vi.restoreAllMocks();
});

describe('onEvent', () => {
  it('reports a committed two-row transaction: begin, prewrite, commit point, end, then the secondaries', async () => {
    const store = new MemoryStore();
    const rec = recorder();
    // The two-phase path: a one-step commit has one step (the test below).
    const db = new Percolator({ store, onEvent: rec.onEvent, onePhaseMaxRows: 1 });
    await db.transact(async (tx) => {
      tx.set('accounts', 'alice', 'balance', '90');
      tx.set('ledger', 'bob', 'balance', '110');
    });
    await db.flush();
    expect(rec.events.map((e) => (e.type === 'commit.step' ? `step:${e.step}` : e.type))).toEqual([
      'transaction.begin',
      'step:prewrite',
      'step:commitPrimary',
      'transaction.end',
      'step:secondaries',
    ]);
    const [begin] = rec.of('transaction.begin');
    const [end] = rec.of('transaction.end');
    expect(begin!.store).toBe(store.name);
    expect(begin!.transaction.attempt).toBe(1);
    expect(end!.transaction).toBe(begin!.transaction);
    expect(end!).toMatchObject({ outcome: 'committed', rows: 2, tables: 2 });
    expect(end!.error).toBeUndefined();
    expect(end!.startTs).toBe(begin!.transaction.startTs);
    expect(end!.commitTs).toBeGreaterThan(end!.startTs!);
    const steps = rec.of('commit.step');
    expect(steps.map((s) => s.rows)).toEqual([2, 1, 1]);
    expect(steps[1]!.commitTs).toBe(end!.commitTs);
    for (const e of [...steps, end!]) {
      expect(e.durationMs).toBeGreaterThanOrEqual(0);
      expect(e.time).toBeGreaterThanOrEqual(begin!.time);
    }
    await db.close();
  });

  it('counts the distinct tables a transaction wrote, few or many', async () => {
    const rec = recorder();
    const db = new Percolator({ store: new MemoryStore(), onEvent: rec.onEvent });
    // 3 rows in 2 tables; then 25 rows in 12 tables (past the short list, into a Set).
    await db.transact(async (tx) => {
      tx.set('a', 'r1', 'c', '1');
      tx.set('b', 'r1', 'c', '1');
      tx.set('a', 'r2', 'c', '1');
    });
    await db.transact(async (tx) => {
      for (let i = 0; i < 25; i++) tx.set(`t${i % 12}`, `r${i}`, 'c', '1');
    });
    expect(rec.of('transaction.end').map((e) => [e.rows, e.tables])).toEqual([
      [3, 2],
      [25, 12],
    ]);
    await db.close();
  });

  it('no retry event when a signal ends transact at the backoff (no next attempt runs)', async () => {
    // Found in review: the retry was reported before the backoff, for an attempt that a
    // signal (or close()) then never ran. The signal fires during the backoff: a timer
    // set as the failed attempt ends, due before the backoff's (its longest, ~4 ms).
    vi.spyOn(Math, 'random').mockReturnValue(0.99);
    const store = new InstrumentedStore(new MemoryStore(), { stampedCheckAndSet: false });
    const rec = recorder();
    const controller = new AbortController();
    const db = new Percolator({
      store,
      onEvent: (e) => {
        rec.onEvent(e);
        if (e.type === 'transaction.end' && e.outcome === 'conflict') setTimeout(() => controller.abort(), 0);
      },
    });
    const other = new Percolator({ store });
    let attempts = 0;
    const run = db.transact(
      async (tx) => {
        attempts++;
        await tx.getString('accounts', 'alice', 'balance');
        await other.transact(async (o) => o.set('accounts', 'alice', 'balance', String(attempts)));
        tx.set('accounts', 'alice', 'balance', 'mine');
      },
      { signal: controller.signal },
    );
    await expect(run).rejects.toBeInstanceOf(AbortedError);
    expect(attempts).toBe(1);
    expect(rec.of('transaction.end').map((e) => e.outcome)).toEqual(['conflict']);
    expect(rec.of('transaction.retry')).toEqual([]);
    await other.close();
    await db.close();
  });

  it('a transaction open when the client closes ends, failed, when its commit is refused (its span is ended)', async () => {
    // Found in review: commit() after close() threw before any end event, so a listener's
    // span for the transaction stayed open.
    const rec = recorder();
    const db = new Percolator({ store: new MemoryStore(), onEvent: rec.onEvent });
    const tx = await db.begin();
    tx.set('t', 'r', 'c', 'x');
    await db.close();
    await expect(tx.commit()).rejects.toBeInstanceOf(ClosedError);
    expect(rec.of('transaction.end').map((e) => [e.outcome, (e.error as Error).name])).toEqual([
      ['failed', 'ClosedError'],
    ]);
  });

  it('reports a conflict, the retry and the committed second attempt', async () => {
    // Two-phase commits (no stamped one-phase commit), so the failed prewrite shows.
    const store = new InstrumentedStore(new MemoryStore(), { stampedCheckAndSet: false });
    const rec = recorder();
    const db = new Percolator({ store, onEvent: rec.onEvent });
    const other = new Percolator({ store });
    let attempts = 0;
    await db.transact(async (tx) => {
      const balance = Number((await tx.getString('accounts', 'alice', 'balance')) ?? '100');
      if (++attempts === 1) {
        // Another client writes the row after our snapshot: our prewrite must conflict.
        await other.transact(async (o) => o.set('accounts', 'alice', 'balance', '50'));
      }
      tx.set('accounts', 'alice', 'balance', String(balance - 10));
    });
    const ends = rec.of('transaction.end');
    expect(ends.map((e) => e.outcome)).toEqual(['conflict', 'committed']);
    expect(ends[0]!.error).toBeInstanceOf(Error);
    const [retry] = rec.of('transaction.retry');
    expect(retry).toMatchObject({ nextAttempt: 2, transaction: ends[0]!.transaction });
    expect(retry!.backoffMs).toBeGreaterThanOrEqual(0);
    expect(rec.of('transaction.begin').map((b) => b.transaction.attempt)).toEqual([1, 2]);
    expect(rec.of('transaction.begin')[1]!.retryOf).toBe(ends[0]!.transaction);
    // The failed prewrite is reported with its error; nothing reached the commit point.
    const failed = rec.of('commit.step').filter((s) => s.transaction === ends[0]!.transaction);
    expect(failed.map((s) => [s.step, s.error !== undefined])).toEqual([
      ['prewrite', true],
      ['rollback', false],
    ]);
    await db.close();
    await other.close();
  });

  it('reports a read that waits on a live lock until its owner commits', async () => {
    const store = new InstrumentedStore(new MemoryStore(), { stampedCheckAndSet: false });
    const clock = fakeClock();
    const writer = pausingWriter(store, clock);
    const tx = await writer.db.begin();
    tx.set('t', 'a', 'v', 'new');
    tx.set('t', 'b', 'v', 'new');
    const committing = tx.commit();
    await writer.paused; // every prewrite has landed: both rows are locked
    const rec = recorder();
    const reader = new Percolator({ store, clock, lockTtlMs: TTL, onEvent: rec.onEvent });
    const readsBefore = store.calls.read + store.calls.readStamped;
    const read = reader.transact((r) => r.getString('t', 'b', 'v'));
    // The reader has met the lock and is backing off: let the owner commit.
    await until(() => store.calls.read + store.calls.readStamped >= readsBefore + 2);
    writer.release();
    await committing;
    expect(await read).toBe('new');
    const [wait] = rec.of('lock.wait');
    expect(wait).toMatchObject({ table: 't', row: 'b', lockStartTs: tx.startTs, outcome: 'resolved' });
    expect(wait!.durationMs).toBeGreaterThan(0);
    expect(rec.of('transaction.end').map((e) => e.outcome)).toEqual(['committed']);
    await writer.db.close();
    await reader.close();
  });

  it('reports lock resolutions: rolled forward after a crash past the commit point, rolled back after one before it', async () => {
    for (const [crashAt, outcome] of [
      ['afterCommitPrimary', 'rolledForward'],
      ['beforeCommitPrimary', 'rolledBack'],
    ] as const) {
      const store = new InstrumentedStore(new MemoryStore(), { stampedCheckAndSet: false });
      const clock = fakeClock();
      const writer = pausingWriter(store, clock, crashAt);
      const tx = await writer.db.begin();
      tx.set('t', 'a', 'v', 'new');
      tx.set('t', 'b', 'v', 'new');
      // The crash makes commit() reject, also after the commit point.
      await expect(tx.commit()).rejects.toBeInstanceOf(ClientCrash);
      await writer.db.close();
      clock.advance(TTL + 1);
      const rec = recorder();
      const reader = new Percolator({ store, clock, lockTtlMs: TTL, onEvent: rec.onEvent });
      expect(await reader.transact((r) => r.getString('t', 'b', 'v'))).toBe(
        outcome === 'rolledForward' ? 'new' : undefined,
      );
      const [resolve] = rec.of('lock.resolve');
      expect(resolve).toMatchObject({ by: 'read', table: 't', row: 'b', lockStartTs: tx.startTs, outcome });
      expect(resolve!.transaction).toBe(rec.of('transaction.begin')[0]!.transaction);
      if (outcome === 'rolledForward') expect(resolve!.commitTs).toBeGreaterThan(tx.startTs);
      else expect(resolve!.commitTs).toBeUndefined();
      await reader.close();
    }
  });

  it('reports a lock wait that times out, with the transaction outcome', async () => {
    const store = new InstrumentedStore(new MemoryStore(), { stampedCheckAndSet: false });
    const clock = fakeClock();
    const writer = pausingWriter(store, clock, 'beforeCommitPrimary');
    const tx = await writer.db.begin();
    tx.set('t', 'a', 'v', 'new');
    await tx.commit().catch(() => undefined);
    const rec = recorder();
    const reader = new Percolator({ store, clock, lockTtlMs: TTL, lockWaitMs: 20, onEvent: rec.onEvent });
    await expect(
      reader.transact((r) => r.getString('t', 'a', 'v'), { maxAttempts: 1 }),
    ).rejects.toBeInstanceOf(LockNotResolvedError);
    expect(rec.of('lock.wait').map((w) => w.outcome)).toEqual(['timedOut']);
    const ends: TransactionEndEvent[] = rec.of('transaction.end');
    expect(ends.map((e) => e.outcome)).toEqual(['lockNotResolved']);
    expect(ends[0]!.error).toBeInstanceOf(LockNotResolvedError);
    await writer.db.close();
    await reader.close();
  });

  it('reports rollbacks, the caller’s own errors, tidy passes and gc runs', async () => {
    const store = new MemoryStore();
    const rec = recorder();
    const db = new Percolator({ store, onEvent: rec.onEvent });
    const tx = await db.begin();
    tx.set('t', 'a', 'v', 'x');
    await tx.rollback();
    const mine = new Error('mine');
    await expect(
      db.transact(async () => {
        throw mine;
      }),
    ).rejects.toBe(mine);
    expect(rec.of('transaction.end').map((e) => [e.outcome, e.rows, e.error])).toEqual([
      ['rolledBack', 1, undefined],
      ['rolledBack', 0, mine],
    ]);
    await db.transact(async (t) => t.set('t', 'a', 'v', 'y'));
    const report = await db.tidy('t', 'a', { force: true });
    const tidy = rec.of('tidy').filter((e) => e.trigger === 'gc');
    expect(tidy).toHaveLength(1);
    expect(tidy[0]).toMatchObject({ table: 't', row: 'a', report, store: store.name });
    const gc = await db.gc('t', { row: 'a', dryRun: true });
    const [gcEvent] = rec.of('gc');
    expect(gcEvent).toMatchObject({ table: 't', row: 'a', dryRun: true, report: gc, store: store.name });
    expect(gcEvent!.durationMs).toBeGreaterThanOrEqual(0);
    await db.close();
  });

  it('reports observer runs', async () => {
    const store = new MemoryStore();
    const rec = recorder();
    const db = new Percolator({ store, onEvent: rec.onEvent });
    const worker = db.worker({
      observers: [
        {
          name: 'copy',
          table: 'docs',
          column: 'body',
          handler: async (tx, { row }) => {
            tx.set('copies', row, 'body', (await tx.getString('docs', row, 'body')) ?? '');
          },
        },
      ],
    });
    await db.transact(async (tx) => tx.set('docs', 'd1', 'body', 'hello'));
    await worker.runUntilIdle();
    const runs = rec.of('observer.run');
    expect(runs.map((r) => [r.observer, r.table, r.row, r.column, r.outcome])).toEqual([
      ['copy', 'docs', 'd1', 'body', 'ran'],
    ]);
    expect(runs[0]!.commitTs).toBeGreaterThan(runs[0]!.startTs!);
    await db.close();
  });

  it("an observer run's failed attempt ends with the error's outcome, not as rolled back", async () => {
    const store = new MemoryStore();
    const rec = recorder();
    const db = new Percolator({ store, onEvent: rec.onEvent });
    let attempts = 0;
    const worker = db.worker({
      observers: [
        {
          name: 'flaky',
          table: 'docs',
          column: 'body',
          handler: async () => {
            // Retryable: the run is attempted again, and the second attempt commits.
            if (++attempts === 1) throw new LockNotResolvedError('a lock stayed');
          },
        },
      ],
    });
    await db.transact(async (tx) => tx.set('docs', 'd1', 'body', 'hello'));
    await worker.runUntilIdle();
    const outcomes = rec.of('transaction.end').map((e: TransactionEndEvent) => e.outcome);
    // The write, the failed attempt, the attempt that committed.
    expect(outcomes).toEqual(['committed', 'lockNotResolved', 'committed']);
    // Both attempts belong to the one run: its begin came first, its end last, one ref.
    const [begin] = rec.of('observer.begin');
    const [run] = rec.of('observer.run');
    expect(begin).toMatchObject({
      observer: 'flaky',
      table: 'docs',
      row: 'd1',
      column: 'body',
      store: store.name,
    });
    expect(run!.run).toBe(begin!.run);
    expect(run!.time).toBe(begin!.time);
    const order = rec.events.filter(
      (e) => e.type === 'observer.begin' || e.type === 'observer.run' || e.type === 'transaction.begin',
    );
    expect(order.map((e) => [e.type, e.type === 'transaction.begin' ? e.observerRun : undefined])).toEqual([
      ['transaction.begin', undefined],
      ['observer.begin', undefined],
      ['transaction.begin', begin!.run],
      ['transaction.begin', begin!.run],
      ['observer.run', undefined],
    ]);
    await db.close();
  });

  it('a listener that throws changes nothing and is reported once', async () => {
    const warn = vi.spyOn(console, 'warn').mockImplementation(() => undefined);
    const store = new MemoryStore();
    const db = new Percolator({
      store,
      onEvent: () => {
        throw new Error('listener bug');
      },
    });
    for (let i = 0; i < 3; i++) {
      await db.transact(async (tx) => {
        tx.set('t', 'a', 'v', String(i));
        tx.set('t', 'b', 'v', String(i));
      });
    }
    expect(await db.transact((tx) => tx.getString('t', 'b', 'v'))).toBe('2');
    await db.close();
    expect(warn).toHaveBeenCalledTimes(1);
    expect(String(warn.mock.calls[0]![0])).toMatch(/onEvent/);
  });

  it('rejects an onEvent that is not a function', () => {
    expect(() => new Percolator({ store: new MemoryStore(), onEvent: 'x' as never })).toThrow(/onEvent/);
  });
});
