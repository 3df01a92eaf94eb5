import {
  checkListAppend,
  describeCheck,
  type ListAppendOp,
  Random,
  readAllLists,
  runListAppend,
} from '@percolator/conformance';
import { ClientCrash, CommitUnknownError, MemoryStore, Percolator } from '@percolator/core';
import { describe, expect, it } from 'vitest';

// How runListAppend records attempts whose outcome is unknown.

const KEYS = 4;

/** The run's history closed by a final read, checked as the history case checks it. */
async function check(db: Percolator, history: readonly ListAppendOp[]) {
  const invoke = performance.now();
  const txn = await db.transact((tx) => readAllLists(tx, KEYS));
  return checkListAppend([...history, { type: 'ok', txn, invoke, complete: performance.now() }], {
    finalRead: true,
  });
}

describe('runListAppend', () => {
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
});
