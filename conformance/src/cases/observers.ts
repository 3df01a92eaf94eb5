/**
 * Part 5: observers (docs/protocol.md section 8) over the store under test. A transaction that
 * writes an observed column marks the row notified in the same CAS as its prewrite (before
 * the commit point); the store's notification index must then list the row, so observer
 * workers find it; workers then run each change at most once (acks), collapse changes
 * that arrive before a run, and chain. These cases need the `notificationIndex` capability.
 */
import { ClientCrash, compareKeys, type Observer, type Percolator, type RowStore } from '@percolator/core';
import { stopAt } from '../crash.js';
import type { CaseContext, ConformanceCase } from '../types.js';
import { check, checkEqual, format, rejection } from '../util.js';
import { client, faultsFor, outcomeOf } from './harness.js';

const T = 'o_docs';
const OBSERVED = [{ table: T, column: 'body' }];

/** Every key scanNotified lists for `table`, paging with a small limit. */
async function allNotified(store: RowStore, table: string): Promise<string[]> {
  const keys: string[] = [];
  let after: string | undefined;
  for (let page = 0; page < 10_000; page++) {
    const batch = await store.scanNotified!(table, { after, limit: 7 });
    if (batch.length === 0) break;
    for (const key of batch) {
      check(
        after === undefined || compareKeys(key, after) > 0,
        `scanNotified after ${format(after)} returned ${format(key)}`,
      );
    }
    keys.push(...batch);
    after = batch[batch.length - 1]!;
  }
  return keys;
}

function missing(expected: Iterable<string>, found: readonly string[]): string[] {
  const set = new Set(found);
  return [...expected].filter((k) => !set.has(k));
}

async function observedWrites(ctx: CaseContext): Promise<void> {
  const store = await ctx.createStore();
  const db = client(ctx, store).db;
  const observer = client(ctx, store, { observed: OBSERVED }).db;
  // Most rows exist before the observed write (a notification is set on an update, not
  // only on creation).
  await db.transact(async (tx) => {
    for (const row of ['single', 'multi/a']) tx.set(T, row, 'body', 'before');
  });
  // Rows written by a client that knows about the observer, in one- and multi-row transactions.
  await observer.transact(async (tx) => tx.set(T, 'single', 'body', 'one row'));
  await observer.transact(async (tx) => {
    tx.set(T, 'multi/a', 'body', 'a');
    tx.set(T, 'multi/b 🦄', 'body', 'b');
    tx.set('o_other', 'elsewhere', 'body', 'not observed: another table');
    tx.set(T, 'multi/c', 'title', 'not observed: another column');
  });
  await observer.transact(async (tx) => tx.delete(T, 'single', 'body'));
  const found = await allNotified(store, T);
  checkEqual(
    missing(['single', 'multi/a', 'multi/b 🦄'], found),
    [],
    'observed rows missing from scanNotified',
  );
  checkEqual([...found].sort(compareKeys), found, 'scanNotified order');
  // A client without the observer registered still reads the data normally.
  checkEqual(
    await db.transact((tx) => tx.getString(T, 'multi/a', 'body')),
    'a',
    'observed data through the core',
  );
}

async function notifiedBeforeCommitPoint(ctx: CaseContext): Promise<void> {
  const store = await ctx.createStore();
  const rows = ['r0', 'r1', 'r2'];
  await client(ctx, store).db.transact(async (tx) => {
    for (const row of rows) tx.set(T, row, 'body', 'before');
  });
  const crasher = client(ctx, store, {
    observed: OBSERVED,
    hooks: { onCommitStep: stopAt({ step: 'afterCommitPrimary' }) },
  }).db;
  const tx = await crasher.begin();
  for (const row of rows) tx.set(T, row, 'body', `v-${row}`);
  const error = await rejection(() => tx.commit(), 'a commit that stops after the primary commit');
  check(error instanceof ClientCrash, 'the commit must reject with the ClientCrash');
  // The notification was written with the prewrite, before the commit point, so no row of a
  // committed transaction can be left without one.
  checkEqual(
    missing(rows, await allNotified(store, T)),
    [],
    'rows of a committed, stopped transaction missing from scanNotified',
  );
}

async function concurrentObservedWrites(ctx: CaseContext): Promise<void> {
  const store = await ctx.createStore();
  const clients = [0, 1, 2].map(() => client(ctx, store, { observed: OBSERVED }).db);
  // Half the documents exist before the observed writes start.
  await client(ctx, store).db.transact(async (tx) => {
    for (let d = 0; d < 40; d += 2) tx.set(T, `doc/${d}`, 'body', 'before');
  });
  const written = new Set<string>();
  const workers = ctx.scaled(6, 2);
  const perWorker = ctx.scaled(20, 3);
  await Promise.all(
    Array.from({ length: workers }, async (_, w) => {
      const random = ctx.random.fork(`observed writer ${w}`);
      const db = clients[w % clients.length]!;
      for (let i = 0; i < perWorker; i++) {
        const rows = Array.from({ length: random.between(1, 3) }, () => `doc/${random.int(40)}`);
        try {
          await db.transact(
            async (tx) => {
              for (const row of rows) tx.set(T, row, 'body', `w${w}-${i}`);
            },
            { maxAttempts: 20 },
          );
          for (const row of rows) written.add(row);
        } catch {
          // A conflict that outlasted the retries: those rows may or may not be notified.
        }
      }
    }),
  );
  check(written.size > 0, 'no observed write committed');
  const found = await allNotified(store, T);
  checkEqual(missing(written, found), [], 'rows written by committed transactions missing from scanNotified');
  checkEqual(new Set(found).size, found.length, 'scanNotified returned a key twice');
  ctx.note(`${written.size} observed rows written, ${found.length} listed`);
}

/**
 * A strong observer that derives `derived = "len:" + body` and records, per committed run,
 * which body it saw: two committed runs that saw the same body handled one change twice.
 */
function deriver(name = 'deriver') {
  const seen = new Map<number, { row: string; body: string | undefined }>();
  const committed: { row: string; body: string | undefined }[] = [];
  const observer: Observer = {
    name,
    table: T,
    column: 'body',
    handler: async (tx, cell) => {
      const body = await tx.getString(T, cell.row, 'body');
      seen.set(tx.startTs, { row: cell.row, body });
      tx.set(T, cell.row, 'derived', `len:${body ?? ''}`);
    },
  };
  const onRun = (e: { observer: string; startTs: number }) => {
    if (e.observer !== name) return;
    const run = seen.get(e.startTs);
    if (run !== undefined) committed.push(run);
  };
  const runsOf = (row: string) => committed.filter((r) => r.row === row);
  const doubles = () => {
    const keys = committed.map((r) => `${r.row}\u0000${r.body}`);
    return committed.filter((_, i) => keys.indexOf(keys[i]!) !== i);
  };
  return { observer, onRun, committed, runsOf, doubles };
}

async function expectDerived(db: Percolator, rows: Iterable<string>): Promise<void> {
  for (const row of rows) {
    const [body, derived] = await db.transact(async (tx) => [
      await tx.getString(T, row, 'body'),
      await tx.getString(T, row, 'derived'),
    ]);
    // A row whose only writes had unknown outcomes and never landed has no body, so no
    // observer ran for it: no output is right then, as is the output for an empty body.
    if (body === undefined && derived === undefined) continue;
    checkEqual(derived, `len:${body ?? ''}`, `the observer's output for ${row} after the workers went idle`);
  }
}

async function collapsingRuns(ctx: CaseContext): Promise<void> {
  const store = await ctx.createStore();
  const writer = client(ctx, store, { observed: OBSERVED }).db;
  const d = deriver();
  const db = client(ctx, store).db;
  const worker = db.worker({ observers: [d.observer], onRun: d.onRun, retry: { baseMs: 5, maxMs: 100 } });
  // Three changes before any run collapse into one run.
  for (let i = 0; i < 3; i++) await writer.transact(async (tx) => tx.set(T, 'a', 'body', `a#${i}`));
  await writer.transact(async (tx) => tx.set(T, 'b', 'body', 'b#0'));
  await worker.runUntilIdle({ timeoutMs: 20_000 });
  checkEqual(
    d.runsOf('a').map((r) => r.body),
    ['a#2'],
    'runs for three changes made before the worker ran',
  );
  checkEqual(
    d.runsOf('b').map((r) => r.body),
    ['b#0'],
    'runs for one change',
  );
  // Nothing new: no run. A new change: one more run.
  await worker.runUntilIdle({ timeoutMs: 20_000 });
  checkEqual(d.committed.length, 2, 'runs after a second pass with no new change');
  await writer.transact(async (tx) => tx.set(T, 'a', 'body', 'a#3'));
  await worker.runUntilIdle({ timeoutMs: 20_000 });
  checkEqual(
    d.runsOf('a').map((r) => r.body),
    ['a#2', 'a#3'],
    'runs after one more change',
  );
  await expectDerived(db, ['a', 'b']);
}

async function concurrentWorkers(ctx: CaseContext, faulty: boolean): Promise<void> {
  const store = await ctx.createStore();
  const faults = faultsFor(faulty ? 'faulty' : 'clean');
  const writerClients = [0, 1].map(() => client(ctx, store, { observed: OBSERVED, faults, lockTtlMs: 500 }));
  const writers = writerClients.map((c) => c.db);
  const workerClients = [0, 1, 2].map(() => client(ctx, store, { faults, lockTtlMs: 500 }));
  const d = deriver();
  const workers = workerClients.map((c) =>
    c.db.worker({
      observers: [d.observer],
      onRun: d.onRun,
      onError: () => {},
      concurrency: 2,
      idlePollMs: 10,
      leaseMs: 600,
      retry: { baseMs: 5, maxMs: 100 },
    }),
  );
  for (const w of workers) w.start();
  const rows = Array.from({ length: 12 }, (_, i) => `doc/${i}`);
  const written = new Set<string>();
  const perWriter = ctx.scaled(30, 4);
  await Promise.all(
    writers.map(async (db, w) => {
      const random = ctx.random.fork(`observed writer ${w}`);
      for (let i = 0; i < perWriter; i++) {
        const row = random.pick(rows);
        try {
          await db.transact(async (tx) => tx.set(T, row, 'body', `${row}#w${w}-${i}`), { maxAttempts: 10 });
          written.add(row);
        } catch (error) {
          if (outcomeOf(error) === 'info') written.add(row);
        }
        await new Promise((resolve) => setTimeout(resolve, random.int(3)));
      }
    }),
  );
  // Calm after the storm: the last pass runs without faults, so it must finish.
  for (const c of [...writerClients, ...workerClients]) c.faulty?.setRandom(undefined);
  await workers[0]!.runUntilIdle({ timeoutMs: 30_000 });
  await Promise.all(workers.map((w) => w.stop()));
  check(written.size > 0, 'no observed write committed');
  await expectDerived(client(ctx, store).db, written);
  const doubles = d.doubles();
  check(
    doubles.length === 0,
    () => `a change was handled by two committed runs: ${format(doubles.slice(0, 3))}`,
  );
  const stats = workers.map((w) => w.stats);
  ctx.note(
    `${d.committed.length} committed runs for ${written.size} rows; ` +
      `skipped ${stats.reduce((n, s) => n + s.skipped, 0)}, conflicts ${stats.reduce((n, s) => n + s.conflicts, 0)}, ` +
      `busy leases ${stats.reduce((n, s) => n + s.leaseBusy, 0)}`,
  );
}

async function chainedObservers(ctx: CaseContext): Promise<void> {
  const store = await ctx.createStore();
  const writer = client(ctx, store, { observed: OBSERVED }).db;
  const d = deriver();
  // The second observer watches the first one's output and writes a summary row.
  const summariser: Observer = {
    name: 'summariser',
    table: T,
    column: 'derived',
    handler: async (tx, cell) => {
      const derived = await tx.getString(T, cell.row, 'derived');
      tx.set('o_summary', cell.row, 'of', `summary(${derived ?? ''})`);
    },
  };
  const db = client(ctx, store).db;
  const worker = db.worker({
    observers: [d.observer, summariser],
    onRun: d.onRun,
    retry: { baseMs: 5, maxMs: 100 },
  });
  const rows = ['x', 'y', 'z'];
  await writer.transact(async (tx) => {
    for (const row of rows) tx.set(T, row, 'body', `${row}!`);
  });
  await worker.runUntilIdle({ timeoutMs: 20_000 });
  for (const row of rows) {
    checkEqual(
      await db.transact((tx) => tx.getString('o_summary', row, 'of')),
      `summary(len:${row}!)`,
      `the second observer's output for ${row}`,
    );
  }
}

export const observerCases: ConformanceCase[] = [
  {
    part: 'observers',
    name: 'a committed write to an observed column leaves its row in the notification index',
    requires: 'notificationIndex',
    run: observedWrites,
  },
  {
    part: 'observers',
    name: 'the notification is written before the commit point (a client stopping after it loses none)',
    requires: 'notificationIndex',
    run: notifiedBeforeCommitPoint,
  },
  {
    part: 'observers',
    name: 'concurrent observed writes: every notified row is listed by scanNotified',
    requires: 'notificationIndex',
    timeoutMs: 60_000,
    run: concurrentObservedWrites,
  },
  {
    part: 'observers',
    name: 'a strong observer runs once per change; changes made before a run collapse into one',
    requires: 'notificationIndex',
    run: collapsingRuns,
  },
  {
    part: 'observers',
    name: 'three workers on one store: no change is handled twice, every row ends up processed',
    requires: 'notificationIndex',
    timeoutMs: 90_000,
    run: (ctx) => concurrentWorkers(ctx, false),
  },
  {
    part: 'observers',
    name: 'observers chain: a handler that writes an observed column triggers its observer',
    requires: 'notificationIndex',
    run: chainedObservers,
  },
  {
    part: 'observers',
    name: 'three workers with random store faults: no change is handled twice',
    requires: 'notificationIndex',
    timeoutMs: 90_000,
    run: (ctx) => concurrentWorkers(ctx, true),
  },
];
