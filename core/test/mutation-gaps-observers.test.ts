import {
  MemoryStore,
  type Observer,
  ObserversNotIdleError,
  Percolator,
  type RowStore,
  StoreError,
} from '@percolator/core';
import { afterEach, describe, expect, test, vi } from 'vitest';
import { LEASE_TABLE, leaseKey } from '../src/observers/lease.js';
import { fakeClock, InstrumentedStore } from './support.js';

/**
 * Cases found by mutation testing of the observer framework (core/src/observers): each one
 * fails with a small, plausible bug in the worker, the notification clear or the leases
 * that the rest of the suite let through.
 */

const open: Percolator[] = [];
afterEach(async () => {
  vi.useRealTimers();
  await Promise.all(open.splice(0).map((db) => db.close()));
});

function client(store: RowStore, options: Partial<ConstructorParameters<typeof Percolator>[0]> = {}) {
  const db = new Percolator({ store, ...options });
  open.push(db);
  return db;
}

const quiet = { onError: () => undefined };
const OBSERVED = [{ table: 'docs', column: 'body' }];

/** An observer of docs/body that records the value each of its runs saw. */
function recorder(name: string, seen: (string | undefined)[], before?: () => Promise<void>): Observer {
  return {
    name,
    table: 'docs',
    column: 'body',
    handler: async (tx, { table, row, column }) => {
      seen.push(await tx.getString(table, row, column));
      await before?.();
    },
  };
}

/** A promise and the function that resolves it. */
function gate() {
  let open!: () => void;
  const promise = new Promise<void>((r) => {
    open = r;
  });
  return { promise, open };
}

describe('mutation-testing gaps: the notification clear', () => {
  test('a write that commits while the first of two observers of a cell waits on its lock reaches that observer too', async () => {
    // worker.ts: the clear covers only writes committed below the smallest start timestamp
    // among the cell's runs. v2 is prewritten (its notification set) before the worker reads
    // the row, and commits while the first observer's run waits on its lock: above that
    // run's snapshot, below the second's. The notification is unchanged, so only that bound
    // keeps it for the first observer, which saw v1.
    const store = new MemoryStore();
    let hold: Promise<void> | undefined;
    const prewritten = gate();
    const writer = client(store, {
      observedColumns: OBSERVED,
      onePhaseMaxRows: 1,
      hooks: {
        onCommitStep: async (e) => {
          // Held before it takes its commit timestamp, so that lands above the first run's snapshot.
          if (e.step === 'afterPrewrite' && e.row === 'a' && hold) {
            prewritten.open();
            await hold;
          }
        },
      },
    });
    // The worker reads through its own wrapper, so the test sees when the first run is under way.
    const workerStore = new InstrumentedStore(store);
    let readsOfA = 0;
    let onRead = () => {};
    workerStore.readFault = (table, key) => {
      if (table === 'docs' && key === 'a') {
        readsOfA++;
        onRead();
      }
      return false;
    };
    const first: (string | undefined)[] = [];
    const second: (string | undefined)[] = [];
    const worker = client(workerStore, { lockWaitMs: 10_000 }).worker({
      observers: [recorder('first', first), recorder('second', second)],
      ...quiet,
    });
    await writer.transact(async (tx) => tx.set('docs', 'a', 'body', 'v1'));
    const release = gate();
    hold = release.promise;
    const v2 = writer.transact(async (tx) => {
      tx.set('docs', 'a', 'body', 'v2');
      tx.set('other', 'b', 'x', 'y'); // two rows: two phases, with the hook between them
    });
    await prewritten.promise;
    hold = undefined;
    // The worker reads the row (1), then the first run reads the cell (2) and meets v2's
    // lock: only then may v2 commit.
    onRead = () => {
      if (readsOfA >= 2) setTimeout(release.open, 1);
    };
    await worker.runUntilIdle({ timeoutMs: 20_000 });
    await v2;
    await worker.runUntilIdle({ timeoutMs: 20_000 });
    expect(second).toEqual(['v2']);
    // The first observer's run read below v2: it must run again and see it.
    expect(first).toEqual(['v1', 'v2']);
  });

  test('a weak notification that arrives while its observer runs makes it run again', async () => {
    // notifications.ts: the clear must refuse once notifyTs changed since the worker read
    // it. A weak notification writes no value, so nothing else tells the clear about it.
    const store = new MemoryStore();
    const db = client(store);
    const notifier = client(store);
    let runs = 0;
    const worker = db.worker({
      observers: [
        {
          name: 'recount',
          table: 'groups',
          column: 'dirty',
          weak: true,
          handler: async () => {
            if (++runs === 1) await notifier.transact(async (tx) => tx.notify('groups', 'g', 'dirty'));
          },
        },
      ],
    });
    await db.transact(async (tx) => tx.notify('groups', 'g', 'dirty'));
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    expect(runs).toBeGreaterThanOrEqual(2);
    expect(await store.scanNotified('groups', { limit: 10 })).toEqual([]);
  });
});

describe('mutation-testing gaps: the worker', () => {
  test('an observer runs only for notified cells: a notification of one column does not run the observer of another', async () => {
    // worker.ts: a row listed by the index may hold other observed cells whose notification
    // was cleared; their observers must not run.
    const store = new MemoryStore();
    const db = client(store);
    const runs = { x: 0, y: 0 };
    const weak = (column: 'x' | 'y'): Observer => ({
      name: `weak-${column}`,
      table: 'docs',
      column,
      weak: true,
      handler: async () => {
        runs[column]++;
      },
    });
    const worker = db.worker({ observers: [weak('x'), weak('y')] });
    await db.transact(async (tx) => tx.set('docs', 'a', 'y', '1'));
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    expect(runs).toEqual({ x: 0, y: 1 });
    await db.transact(async (tx) => tx.notify('docs', 'a', 'x'));
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    expect(runs).toEqual({ x: 1, y: 1 });
  });

  test('a failed run waits out its backoff: it is not run again at once on the next pass', async () => {
    // worker.ts: while an observer of a cell backs off, the cell is left alone.
    const store = new MemoryStore();
    const db = client(store);
    let calls = 0;
    const worker = db.worker({
      observers: [
        {
          name: 'broken',
          table: 'docs',
          column: 'body',
          handler: async () => {
            calls++;
            throw new Error('injected: the handler fails');
          },
        },
      ],
      retry: { baseMs: 60_000, maxMs: 60_000 },
      ...quiet,
    });
    await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'x'));
    await expect(worker.runUntilIdle({ timeoutMs: 300 })).rejects.toBeInstanceOf(ObserversNotIdleError);
    expect(calls).toBe(1);
    expect(worker.stats.failures).toBe(1);
  });

  test('runUntilIdle pages through the whole index: rows listed for columns it does not observe do not end the pass', async () => {
    // worker.ts, ring(): only a page shorter than batchSize is the last one. Rows notified
    // for another worker's column fill the first page here and need nothing from this worker.
    const store = new MemoryStore();
    const writer = client(store, {
      observedColumns: [
        { table: 'docs', column: 'body' },
        { table: 'docs', column: 'title' },
      ],
    });
    await writer.transact(async (tx) => {
      tx.set('docs', 'a', 'title', 'for another worker');
      tx.set('docs', 'b', 'title', 'for another worker');
      tx.set('docs', 'c', 'body', 'ours');
    });
    const seen: (string | undefined)[] = [];
    const worker = client(store).worker({ observers: [recorder('body', seen)], batchSize: 2 });
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    expect(seen).toEqual(['ours']);
  });

  test('a pass that starts just after a sampled key comes round to that key: its row is processed too', async () => {
    // worker.ts, ring(): after wrapping, the pass goes up to and including its start key.
    // The start is a random sampled key (or the beginning): the random is pinned here so
    // that the second pass starts at the only key there is, every time.
    vi.spyOn(Math, 'random').mockReturnValue(0);
    try {
      const store = new MemoryStore();
      const db = client(store);
      const seen: (string | undefined)[] = [];
      const worker = db.worker({ observers: [recorder('copy', seen)] });
      await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'v1'));
      await worker.runUntilIdle({ timeoutMs: 10_000 }); // from the beginning: 'a' is sampled
      await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'v2'));
      await worker.runUntilIdle({ timeoutMs: 10_000 }); // just after 'a', round to 'a'
      expect(seen).toEqual(['v1', 'v2']);
      expect(await store.scanNotified('docs', { limit: 10 })).toEqual([]);
    } finally {
      vi.restoreAllMocks();
    }
  });

  test('a background loop goes on after a failed sweep: a scan error does not stop the worker', async () => {
    // worker.ts, loop(): an error is reported and the loop sleeps and sweeps again.
    const store = new InstrumentedStore();
    const db = client(store);
    const seen: (string | undefined)[] = [];
    const errors: unknown[] = [];
    const worker = db.worker({
      observers: [recorder('copy', seen)],
      concurrency: 1,
      idlePollMs: 10,
      onError: (e) => errors.push(e),
    });
    const dropped = new StoreError('injected: connection dropped', 'no');
    let failures = 3;
    store.scanNotifiedFault = () => (failures-- > 0 ? dropped : undefined);
    await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'x'));
    worker.start();
    await vi.waitFor(() => expect(seen).toEqual(['x']), { timeout: 10_000, interval: 5 });
    await worker.stop();
    expect(errors).toEqual([dropped, dropped, dropped]);
  });

  test('stop() resolves only once the row its loop is processing is done', async () => {
    // worker.ts, stop(): it waits for the loops of every start() up to its own.
    const store = new MemoryStore();
    const db = client(store);
    const mayFinish = gate();
    const reached = gate();
    let committed = false;
    const worker = db.worker({
      observers: [
        recorder('slow', [], async () => {
          reached.open();
          await mayFinish.promise;
        }),
      ],
      onRun: () => {
        committed = true;
      },
      idlePollMs: 10,
      ...quiet,
    });
    await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'x'));
    worker.start();
    await reached.promise;
    let committedAtStop: boolean | undefined;
    const stopping = worker.stop().then(() => {
      committedAtStop = committed;
    });
    mayFinish.open();
    await stopping;
    expect(committedAtStop).toBe(true);
  });

  test('runUntilIdle rejects on a row that fails without taking further rows of its batch', async () => {
    // worker.ts, mapLimit(): after a call fails no lane takes another item.
    const store = new InstrumentedStore(new MemoryStore());
    const db = client(store, { observedColumns: OBSERVED });
    const seen: (string | undefined)[] = [];
    const worker = db.worker({ observers: [recorder('copy', seen)], concurrency: 1, ...quiet });
    await db.transact(async (tx) => tx.set('docs', 'b', 'body', 'later'));
    // A notified row this version cannot decode, before b in key order: its run throws.
    const garbage = new Uint8Array([0xff, 0xfe, 0xfd, 0x01]);
    expect(
      (
        await store.inner.checkAndSet({
          table: 'docs',
          key: 'a',
          expected: null,
          state: garbage,
          notified: true,
        })
      ).ok,
    ).toBe(true);
    await expect(worker.runUntilIdle({ timeoutMs: 10_000 })).rejects.toBeInstanceOf(Error);
    expect(seen).toEqual([]);
  });
});

describe('mutation-testing gaps: leases', () => {
  test('a row whose run outlasts the lease keeps it: the worker renews it, and another worker keeps off', async () => {
    // worker.ts renews the lease every leaseMs / 3 while the row is processed; lease.ts
    // pushes its expiry forward on each renewal. Intervals are faked, the lease clock too.
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
    const store = new MemoryStore();
    const clock = fakeClock();
    const leaseMs = 3_000;
    const writer = client(store, { observedColumns: OBSERVED });
    await writer.transact(async (tx) => tx.set('docs', 'a', 'body', 'x'));
    const reached = gate();
    const mayFinish = gate();
    const slowRuns: (string | undefined)[] = [];
    const slow = client(store).worker({
      observers: [
        recorder('copy', slowRuns, async () => {
          reached.open();
          await mayFinish.promise;
        }),
      ],
      leaseMs,
      clock,
    });
    const slowDone = slow.runUntilIdle({ timeoutMs: 20_000 });
    try {
      await reached.promise;
      const expiry = async () => {
        const row = await store.read(LEASE_TABLE, leaseKey('docs', 'a'));
        return row ? (JSON.parse(new TextDecoder().decode(row.state)) as { expiresAt: number }).expiresAt : 0;
      };
      // Five lease durations pass while the handler runs, a renewal in each third of one.
      for (let i = 0; i < 15; i++) {
        clock.advance(leaseMs / 3);
        await vi.advanceTimersByTimeAsync(leaseMs / 3);
        // The renewal's CAS lands on its own: wait for it (a renewal that does not move the expiry never does).
        for (let tries = 0; tries < 100 && (await expiry()) !== clock() + leaseMs; tries++)
          await new Promise((r) => setTimeout(r, 1));
        expect(await expiry()).toBe(clock() + leaseMs);
      }
      const otherRuns: (string | undefined)[] = [];
      const other = client(store).worker({ observers: [recorder('copy', otherRuns)], leaseMs, clock });
      await expect(other.runUntilIdle({ timeoutMs: 100 })).rejects.toBeInstanceOf(ObserversNotIdleError);
      expect(other.stats.leaseBusy).toBeGreaterThan(0);
      expect(otherRuns).toEqual([]);
    } finally {
      mayFinish.open();
    }
    await slowDone;
    expect(slowRuns).toEqual(['x']);
  });
});
