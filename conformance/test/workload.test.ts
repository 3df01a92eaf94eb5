import {
  CrashPlans,
  checkListAppend,
  describeCheck,
  type ListAppendOp,
  Random,
  readAllLists,
  runListAppend,
  type StopPoint,
} from '@percolator/conformance';
import { ClientCrash, CommitUnknownError, MemoryStore, Percolator, StoreError } from '@percolator/core';
import { describe, expect, it } from 'vitest';

// How runListAppend records attempts whose outcome the workload knows, or does not.

const KEYS = 4;
const stopLabel = (p: StopPoint) =>
  p.isPrimary === undefined ? p.step : `${p.step} (isPrimary ${p.isPrimary})`;

/** The run's history closed by a final read, checked as the history case checks it. */
async function check(db: Percolator, history: readonly ListAppendOp[]) {
  const invoke = performance.now();
  const txn = await db.transact((tx) => readAllLists(tx, KEYS));
  return checkListAppend([...history, { type: 'ok', txn, invoke, complete: performance.now() }], {
    finalRead: true,
  });
}

describe('runListAppend', () => {
  it('records a planned stop with the outcome its step makes certain: fail before the commit point, ok after', async () => {
    const steps: StopPoint[] = [
      { step: 'afterPrewrite', isPrimary: true },
      { step: 'afterPrewrite', isPrimary: false },
      { step: 'beforeCommitPrimary' },
      { step: 'afterCommitPrimary' },
    ];
    let now = 1_700_000_000_000;
    // A stopped client's locks expire for everyone at once.
    const plans = new CrashPlans(() => {
      now += 300;
    });
    const db = new Percolator({
      store: new MemoryStore(),
      clock: () => now,
      lockTtlMs: 250,
      onePhaseMaxRows: 1,
      hooks: { onCommitStep: plans.hook },
    });
    let next = 0;
    let planned: StopPoint | undefined;
    const recorded = new Map<string, Set<string>>();
    const { history, crashes } = await runListAppend(
      {
        clients: [db],
        workers: 1,
        transactions: 60,
        keys: KEYS,
        maxOps: 4,
        random: new Random(3),
        crashAt: (_random, rows) => (planned = rows >= 2 ? steps[next++ % steps.length] : undefined),
        outcomeOf: (error) => {
          throw error;
        },
        onRecord: (op) => {
          if (planned === undefined) return;
          const label = stopLabel(planned);
          recorded.set(label, (recorded.get(label) ?? new Set()).add(op.type));
          planned = undefined;
        },
      },
      () => plans,
    );
    expect(crashes).toBeGreaterThan(4);
    expect(Object.fromEntries([...recorded].map(([label, types]) => [label, [...types]]))).toEqual({
      'afterPrewrite (isPrimary true)': ['fail'],
      'afterPrewrite (isPrimary false)': ['fail'],
      beforeCommitPrimary: ['fail'],
      afterCommitPrimary: ['ok'],
    });
    // Stopped after the commit point: committed, its reads kept.
    expect(
      history.filter((op) => op.type === 'ok').every((op) => op.txn.every((m) => m.value !== null)),
    ).toBe(true);
    const result = await check(db, history);
    expect(result.anomalies, describeCheck(result)).toEqual([]);
    await db.close();
  });

  it('keeps the reads of a transaction whose commit ended unknown (the checker uses them once it is seen)', async () => {
    let commits = 0;
    const db = new Percolator({
      store: new MemoryStore(),
      // Two-phase commits: a one-step commit has no afterCommitPrimary step.
      onePhaseMaxRows: 1,
      hooks: {
        // Every third commit is reported unknown, though its commit point was passed.
        onCommitStep: (e) => {
          if (e.step === 'afterCommitPrimary' && ++commits % 3 === 0)
            throw new CommitUnknownError('reply lost (test)', e.startTs);
        },
      },
    });
    const { history } = await runListAppend({
      clients: [db],
      workers: 4,
      transactions: 60,
      keys: KEYS,
      maxOps: 4,
      random: new Random(5),
      outcomeOf: (error) => {
        if (error instanceof CommitUnknownError || error instanceof ClientCrash) return 'info';
        if (error instanceof Error && 'retryable' in error && error.retryable) return 'fail';
        throw error;
      },
    });
    const unknown = history.filter((op) => op.type === 'info');
    expect(unknown.length).toBeGreaterThan(0);
    expect(unknown.every((op) => op.txn.every((m) => m.f !== 'r' || Array.isArray(m.value)))).toBe(true);
    const result = await check(db, history);
    expect(result.anomalies, describeCheck(result)).toEqual([]);
    await db.close();
  });

  it('a transaction that fails before its commit with an unknown-outcome error is recorded failed: nothing of it was written', async () => {
    const inner = new MemoryStore();
    // Three bursts of lost replies on reads of list k1 (an unknown outcome, as some stores
    // report any lost reply), each long enough to outlast the client's read retries.
    let bursts = 3;
    let burst = 0;
    const store = Object.assign(Object.create(inner) as MemoryStore, {
      read: (table: string, key: string) => {
        if (key === 'k1' && (burst > 0 || bursts > 0)) {
          if (burst === 0) {
            bursts--;
            burst = 12;
          }
          burst--;
          return Promise.reject(new StoreError('read reply lost (test)', 'unknown'));
        }
        return inner.read(table, key);
      },
      readMany: undefined,
    });
    const db = new Percolator({ store, peekedWrites: false });
    const { history, unknownBeforeCommit } = await runListAppend({
      clients: [db],
      workers: 2,
      transactions: 40,
      keys: KEYS,
      maxOps: 4,
      random: new Random(7),
      outcomeOf: (error) => {
        if (error instanceof StoreError) return error.applied === 'no' ? 'fail' : 'info';
        if (error instanceof Error && 'retryable' in error && error.retryable) return 'fail';
        throw error;
      },
    });
    expect(unknownBeforeCommit).toBeGreaterThan(0);
    // None of them is left unknown: commits here never are.
    expect(history.filter((op) => op.type === 'info')).toEqual([]);
    const failed = history.filter((op) => op.type === 'fail');
    expect(failed.length).toBeGreaterThanOrEqual(unknownBeforeCommit);
    // A failed transaction's reads carry nothing.
    expect(failed.every((op) => op.txn.every((m) => m.f !== 'r' || m.value === null))).toBe(true);
    const result = await check(db, history);
    expect(result.anomalies, describeCheck(result)).toEqual([]);
    await db.close();
  });
});
