/**
 * Part 3: a randomised list-append workload through several Percolator clients on the
 * store under test, checked for snapshot-isolation anomalies with the Elle-style checker.
 * Also runs in the 'faults' part with random store faults and with clients that stop at
 * random commit steps.
 */
import type { Percolator } from '@percolator/core';
import { CrashPlans, type StopPoint } from '../crash.js';
import { checkListAppend, describeCheck, type ListAppendOp } from '../history/checker.js';
import { readAllLists, runListAppend } from '../history/workload.js';
import type { CaseContext, ConformanceCase } from '../types.js';
import { check } from '../util.js';
import { client, FakeClock, faultsFor, outcomeOf, settled } from './harness.js';

interface HistoryCaseOptions {
  readonly faults: boolean;
  readonly crashes: boolean;
}

const CRASH_STEPS: readonly StopPoint[] = [
  { step: 'afterPrewrite', isPrimary: true },
  { step: 'afterPrewrite', isPrimary: false },
  { step: 'beforeCommitPrimary' },
  { step: 'afterCommitPrimary' },
  { step: 'afterCommitSecondary' },
];

async function listAppend(ctx: CaseContext, options: HistoryCaseOptions): Promise<void> {
  const store = await ctx.createStore();
  const clock = new FakeClock();
  const lockTtlMs = options.crashes || options.faults ? 250 : 2000;
  const faults = faultsFor(options.faults ? 'faulty' : 'clean');
  const plans = new Map<Percolator, CrashPlans>();
  const clients = Array.from({ length: 3 }, () => {
    const crashPlans = new CrashPlans();
    const { db } = client(ctx, store, {
      lockTtlMs,
      faults,
      ...(options.crashes ? { clock, hooks: { onCommitStep: crashPlans.hook } } : {}),
    });
    plans.set(db, crashPlans);
    return db;
  });
  const keys = 4;
  const run = await runListAppend(
    {
      clients,
      workers: 8,
      transactions: ctx.scaled(400, 40),
      keys,
      maxOps: 4,
      random: ctx.random,
      outcomeOf,
      ...(options.crashes
        ? {
            crashAt: (random) => (random.chance(0.08) ? random.pick(CRASH_STEPS) : undefined),
            // Locks of a stopped client expire for everyone at once.
            onCrash: () => clock.advance(lockTtlMs + 1),
          }
        : {}),
    },
    (db) => plans.get(db),
  );
  clock.advance(lockTtlMs + 1);
  const finalReader = client(ctx, store, { lockTtlMs, ...(options.crashes ? { clock } : {}) }).db;
  const finalRead = await settled(finalReader, (tx) => readAllLists(tx, keys), 'the final read');
  const history: ListAppendOp[] = [...run.history, { id: run.history.length, type: 'ok', txn: finalRead }];
  const result = checkListAppend(history);
  ctx.note(describeCheck(result).split('\n')[0]!);
  if (result.allowed.length > 0) {
    ctx.note(`write skew (G2-item) found ${result.allowed.length}x: allowed under snapshot isolation`);
  }
  if (run.crashes > 0) ctx.note(`${run.crashes} clients stopped at a commit step`);
  check(result.valid, () => `snapshot-isolation anomalies found:\n${describeCheck(result)}`);

  // Every committed append is in the final lists; nothing from a failed transaction is.
  const finalLists = new Map(finalRead.map((m) => [m.key, new Set(m.f === 'r' ? m.value : [])]));
  const lost: string[] = [];
  for (const op of run.history) {
    if (op.type !== 'ok') continue;
    for (const m of op.txn) {
      if (m.f === 'append' && !finalLists.get(m.key)?.has(m.value))
        lost.push(`${m.value} in ${m.key} (T${op.id})`);
    }
  }
  check(
    lost.length === 0,
    () => `committed appends missing from the final lists: ${lost.slice(0, 5).join(', ')}`,
  );
  const committed = result.counts.ok - 1;
  check(
    committed >= Math.max(5, run.history.length * 0.1),
    `only ${committed} of ${run.history.length} transactions committed: the workload made too little progress`,
  );
}

export function historyCases(): ConformanceCase[] {
  return [
    {
      part: 'history',
      name: 'a concurrent list-append workload has no snapshot-isolation anomaly (Elle)',
      timeoutMs: 60_000,
      run: (ctx) => listAppend(ctx, { faults: false, crashes: false }),
    },
    {
      part: 'faults',
      name: 'list-append workload with random store faults has no anomaly',
      timeoutMs: 90_000,
      run: (ctx) => listAppend(ctx, { faults: true, crashes: false }),
    },
    {
      part: 'faults',
      name: 'list-append workload with clients stopping at random commit steps has no anomaly',
      timeoutMs: 90_000,
      run: (ctx) => listAppend(ctx, { faults: false, crashes: true }),
    },
  ];
}
