/**
 * Part 5, continued: observer workers over the store under test (docs/protocol.md section 8).
 * Weak notifications, leases kept as rows in the store (a stopped worker's rows are taken
 * over once its lease expires), failing handlers that lose nothing, a write that commits
 * while a run is under way, and finding work through the notification index alone.
 */
import { type Observer, ObserversNotIdleError, type Percolator } from '@percolator/core';
import type { StoreOperation } from '../faulty-store.js';
import type { CaseContext, ConformanceCase } from '../types.js';
import { check, checkEqual, gate, rejection, within } from '../util.js';
import { client, FakeClock } from './harness.js';

const T = 'ow_docs';
const OBSERVED = [{ table: T, column: 'body' }];
const RETRY = { baseMs: 5, maxMs: 50 };

/** docs/<row>/body -> docs/<row>/copy (or another handler on the same cell). */
function copier(handler?: Observer['handler']): Observer {
  return {
    name: 'ow-copy',
    table: T,
    column: 'body',
    handler:
      handler ??
      (async (tx, { row }) => {
        tx.set(T, row, 'copy', (await tx.getString(T, row, 'body')) ?? '');
      }),
  };
}

const counting = (runs: Map<string, number>) => (e: { row: string }) => {
  runs.set(e.row, (runs.get(e.row) ?? 0) + 1);
};

async function copyOf(db: Percolator, row: string): Promise<string | undefined> {
  return db.transact((tx) => tx.getString(T, row, 'copy'));
}

async function weakNotifications(ctx: CaseContext): Promise<void> {
  const store = await ctx.createStore();
  const db = client(ctx, store).db;
  const members = Array.from({ length: 6 }, (_, i) => `m${i}`);
  let runs = 0;
  const worker = db.worker({
    observers: [
      {
        name: 'ow-recount',
        table: 'ow_groups',
        column: 'dirty',
        weak: true,
        handler: async (tx, { row }) => {
          let n = 0;
          for (const m of members)
            if ((await tx.getString('ow_members', `${row}/${m}`, 'in')) !== undefined) n++;
          tx.set('ow_groups', row, 'size', String(n));
        },
      },
    ],
    onRun: () => {
      runs++;
    },
    retry: RETRY,
  });
  // Concurrent transactions all notify one cell: weak notifications take no lock, so
  // none of them conflicts.
  const txs = await Promise.all(members.map(() => db.begin()));
  txs.forEach((tx, i) => {
    tx.set('ow_members', `g/${members[i]}`, 'in', '1');
    tx.notify('ow_groups', 'g', 'dirty');
  });
  await Promise.all(txs.map((tx) => tx.commit()));
  const listed = await store.scanNotified!('ow_groups', { limit: 100 });
  check(
    listed.includes('g'),
    `a weakly notified row is missing from scanNotified (got ${JSON.stringify(listed)})`,
  );
  checkEqual(
    await db.transact((tx) => tx.getString('ow_groups', 'g', 'dirty')),
    undefined,
    'a weak notification must not write the cell',
  );
  await worker.runUntilIdle({ timeoutMs: 20_000 });
  checkEqual(await db.transact((tx) => tx.getString('ow_groups', 'g', 'size')), '6', 'the weak observer saw');
  check(runs >= 1, 'the weak observer never ran');
  // Cleared: another pass runs nothing (the index may still list the row: false positives are allowed).
  const before = runs;
  await worker.runUntilIdle({ timeoutMs: 20_000 });
  checkEqual(runs, before, 'weak observer runs after the notification was handled');
}

async function expiredLeaseTakeover(ctx: CaseContext): Promise<void> {
  const store = await ctx.createStore();
  const clock = new FakeClock();
  const writer = client(ctx, store, { observed: OBSERVED }).db;
  const runs = new Map<string, number>();
  const entered = gate();
  const mayFinish = gate();
  // The first worker stops inside its handler (as if its process hung or died) holding the
  // row's lease; long leases, so only the fake clock expires them.
  const stuck = client(ctx, store, { clock }).db.worker({
    observers: [
      copier(async (tx, { row }) => {
        entered.open();
        await mayFinish.promise;
        tx.set(T, row, 'copy', 'from the stuck worker');
      }),
    ],
    leaseMs: 60_000,
    onError: () => {},
    retry: RETRY,
  });
  ctx.defer(() => mayFinish.open());
  const other = client(ctx, store, { clock }).db.worker({
    observers: [copier()],
    leaseMs: 60_000,
    onRun: counting(runs),
    retry: RETRY,
  });
  await writer.transact(async (tx) => tx.set(T, 'a', 'body', 'x'));
  const stuckDone = stuck.runUntilIdle({ timeoutMs: 30_000 });
  await within(entered.promise, 10_000, 'the first worker to start its run');
  const error = await rejection(
    () => other.runUntilIdle({ timeoutMs: 300 }),
    'runUntilIdle while another worker holds the only row',
  );
  check(error instanceof ObserversNotIdleError, `expected ObserversNotIdleError, got ${String(error)}`);
  check(other.stats.leaseBusy > 0, 'the second worker never met the first worker’s lease');
  checkEqual(runs.get('a'), undefined, 'runs while the lease was held');
  clock.advance(60_001);
  await other.runUntilIdle({ timeoutMs: 20_000 });
  checkEqual(await copyOf(writer, 'a'), 'x', 'the copy made by the worker that took the row over');
  // The stuck run finishes late: it loses on the ack and changes nothing.
  mayFinish.open();
  await stuckDone;
  checkEqual(await copyOf(writer, 'a'), 'x', 'the copy after the stuck worker finished');
  checkEqual(runs.get('a'), 1, 'committed runs of the taken-over change');
}

async function failingHandler(ctx: CaseContext): Promise<void> {
  const store = await ctx.createStore();
  const writer = client(ctx, store, { observed: OBSERVED }).db;
  const runs = new Map<string, number>();
  const errors: unknown[] = [];
  let failuresLeft = 2;
  const worker = client(ctx, store).db.worker({
    observers: [
      copier(async (tx, { row }) => {
        tx.set(T, row, 'copy', 'written by a failing run');
        if (failuresLeft-- > 0) throw new Error('handler failure');
        tx.set(T, row, 'copy', (await tx.getString(T, row, 'body')) ?? '');
      }),
    ],
    onRun: counting(runs),
    onError: (e) => errors.push(e),
    retry: RETRY,
  });
  await writer.transact(async (tx) => tx.set(T, 'a', 'body', 'x'));
  await worker.runUntilIdle({ timeoutMs: 20_000 });
  checkEqual(errors.length, 2, 'failed runs reported');
  checkEqual(await copyOf(writer, 'a'), 'x', 'the copy after two failed runs and a good one');
  checkEqual(runs.get('a'), 1, 'committed runs');
}

async function writeDuringRun(ctx: CaseContext): Promise<void> {
  const store = await ctx.createStore();
  let hold: Promise<void> | undefined;
  const prewritten = gate();
  const writer = client(ctx, store, {
    observed: OBSERVED,
    hooks: {
      // Held after its prewrite, before it takes a commit timestamp: it commits above the
      // snapshot of the run that is waiting on its lock.
      onCommitStep: async (e) => {
        if (e.step === 'afterPrewrite' && e.row === 'a' && hold) {
          prewritten.open();
          await hold;
        }
      },
    },
  }).db;
  const seen: (string | undefined)[] = [];
  const runner = client(ctx, store, { lockWaitMs: 20_000, wrap: true });
  const worker = runner.db.worker({
    observers: [
      copier(async (tx, { row }) => {
        const body = await tx.getString(T, row, 'body');
        seen.push(body);
        tx.set(T, row, 'copy', body ?? '');
      }),
    ],
    onError: () => {},
    retry: RETRY,
  });
  await writer.transact(async (tx) => tx.set(T, 'a', 'body', 'v1'));
  const released = gate();
  hold = released.promise;
  const v2 = writer.transact(async (tx) => {
    tx.set(T, 'a', 'body', 'v2');
    tx.set('ow_other', 'b', 'x', 'y');
  });
  await within(prewritten.promise, 10_000, 'the second write to prewrite');
  hold = undefined;
  // The worker reads the row (1), begins its run and reads the cell (2), meeting the lock:
  // only then may the write commit, so its commit timestamp is above the run's snapshot.
  let reads = 0;
  const stopListening = runner.faulty!.onCall((call) => {
    if (call.operation === 'read' && call.table === T && call.key === 'a' && ++reads >= 2) released.open();
  });
  try {
    await worker.runUntilIdle({ timeoutMs: 30_000 });
    await v2;
    await worker.runUntilIdle({ timeoutMs: 30_000 });
  } finally {
    stopListening();
    released.open();
  }
  checkEqual(seen, ['v1', 'v2'], 'the values the runs saw (the first run read below the second write)');
  checkEqual(await copyOf(writer, 'a'), 'v2', 'the copy after a write committed during a run');
}

async function indexOnly(ctx: CaseContext): Promise<void> {
  const store = await ctx.createStore();
  const writer = client(ctx, store, { observed: OBSERVED }).db;
  const quiet = ctx.scaled(200, 40);
  const busy = ['n0', 'n1', 'n2', 'n3'];
  for (let i = 0; i < quiet; i += 50) {
    await writer.transact(async (tx) => {
      for (let j = i; j < Math.min(quiet, i + 50); j++) tx.set(T, `quiet/${j}`, 'title', 't');
    });
  }
  await writer.transact(async (tx) => {
    for (const row of busy) tx.set(T, row, 'body', row);
  });
  const { db, faulty } = client(ctx, store, { wrap: true });
  const calls = new Map<StoreOperation, number>();
  const readRows = new Set<string>();
  faulty!.onCall((call) => {
    calls.set(call.operation, (calls.get(call.operation) ?? 0) + 1);
    if (call.operation === 'read' && call.table === T) readRows.add(call.key!);
  });
  const worker = db.worker({ observers: [copier()], retry: RETRY });
  await worker.runUntilIdle({ timeoutMs: 30_000 });
  for (const row of busy) checkEqual(await copyOf(writer, row), row, `the copy of ${row}`);
  checkEqual(calls.get('scan') ?? 0, 0, 'full scans by the worker');
  check((calls.get('scanNotified') ?? 0) > 0, 'the worker never asked the notification index');
  const strays = [...readRows].filter((k) => !busy.includes(k));
  checkEqual(strays, [], 'rows the worker read that were never notified');
  ctx.note(
    `${quiet + busy.length} rows, ${busy.length} notified; worker calls: ${JSON.stringify(Object.fromEntries(calls))}`,
  );
}

export const observerWorkerCases: ConformanceCase[] = [
  {
    part: 'observers',
    name: 'weak notifications: concurrent tx.notify on one cell never conflict, list the row, run the weak observer',
    requires: 'notificationIndex',
    run: weakNotifications,
  },
  {
    part: 'observers',
    name: 'leases are rows in the store: a stuck worker’s row is taken over once its lease expires',
    requires: 'notificationIndex',
    run: expiredLeaseTakeover,
  },
  {
    part: 'observers',
    name: 'a handler that throws is retried; nothing of the failed runs commits and the change is not lost',
    requires: 'notificationIndex',
    run: failingHandler,
  },
  {
    part: 'observers',
    name: 'a write that commits while a run waits on its lock keeps its notification',
    requires: 'notificationIndex',
    timeoutMs: 60_000,
    run: writeDuringRun,
  },
  {
    part: 'observers',
    name: 'workers find work through the notification index alone: no full scans, no reads of quiet rows',
    requires: 'notificationIndex',
    run: indexOnly,
  },
];
