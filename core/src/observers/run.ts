import { backoffMs, sleep } from '../backoff.js';
import { InvalidArgumentError, isRetryable } from '../errors.js';
import type { ObserverRunRef } from '../events.js';
import type { Transaction } from '../transaction.js';
import { ackColumn } from './reserved.js';
import type { NotifiedCell, Observer, WorkerStats } from './types.js';

/**
 * What a run needs from the client: a way to start transactions with a drawn start
 * timestamp (never a peeked one: the ack below is the run's start timestamp).
 */
export interface TransactionSource {
  /** `run`: the observer run the transaction is an attempt of, named in its begin event. */
  beginDrawn(run?: ObserverRunRef): Promise<Transaction>;
}

export type RunResult =
  | { readonly ran: true; readonly startTs: number; readonly commitTs: number }
  | { readonly ran: false; readonly startTs: number };

const decoder = new TextDecoder('utf-8', { ignoreBOM: true });

function parseAck(bytes: Uint8Array | undefined): number {
  if (bytes === undefined) return 0;
  const ts = Number(decoder.decode(bytes));
  return Number.isSafeInteger(ts) && ts > 0 ? ts : 0;
}

/**
 * One observer run (docs/protocol.md section 8). In a new transaction: read the ack; if the
 * newest write of the observed cell is newer than it (and was not written by the run
 * that set the ack), run the handler and write ack = startTs in the same transaction, so
 * two concurrent runs conflict and at most one commits per change. A weak observer reads
 * the cell too (settling a lock there as a reader would), then skips the ack and always runs. Retryable errors (an ack conflict, a lock that would not
 * clear) run the whole thing again with a new snapshot, up to `maxAttempts`.
 *
 * Resolves with the startTs of the deciding transaction: every write committed below it
 * has been handled (or acknowledged) by this observer.
 */
export async function runObserver(
  db: TransactionSource,
  observer: Observer,
  cell: NotifiedCell,
  maxAttempts: number,
  stats: WorkerStats,
  /** For events: the run every attempt's transaction belongs to. */
  run?: ObserverRunRef,
): Promise<RunResult> {
  const { table, row, column } = cell;
  const ack = ackColumn(observer.name, column);
  for (let attempt = 1; ; attempt++) {
    const tx = await db.beginDrawn(run);
    try {
      // Both kinds read the observed cell first, as any reader: a lock there (a write in
      // flight, or a dead client's) is waited for, or settled by its primary once expired.
      // The worker clears no notification of a locked cell, so a weak run that read nothing
      // left a dead client's lock in place and was run again at once, pass after pass
      // (found in review).
      const state = await tx.observedState(table, row, column, ack);
      if (!observer.weak) {
        const ackTs = parseAck(state.ack);
        const write = state.write;
        if (!write || write.commitTs <= ackTs || write.startTs === ackTs) {
          await tx.rollback();
          return { ran: false, startTs: tx.startTs };
        }
      }
      await observer.handler(tx, { table, row, column });
      // The worker commits the run, with its ack: a handler that committed (or rolled
      // back) its transaction itself left the ack unwritten, so the run would fail on a
      // closed transaction and be run again after a backoff, for ever, unexplained.
      if (!tx.isActive)
        throw new InvalidArgumentError(
          `observer "${observer.name}": its handler committed or rolled back the run's transaction; the worker commits it (with the observer's ack), so a handler must not`,
        );
      if (!observer.weak) tx.setReserved(table, row, ack, String(tx.startTs));
      const { commitTs } = await tx.commit();
      return { ran: true, startTs: tx.startTs, commitTs };
    } catch (error) {
      // Its events say why (a conflict, a lock left unresolved, ...), as db.transact's do.
      await tx.rollbackAfter(error);
      // Every attempt that ended in a retryable error counts, the last one too (it was not
      // counted when it used up maxAttempts: with maxRunAttempts 1, never).
      if (isRetryable(error)) stats.conflicts++;
      if (!isRetryable(error) || attempt >= maxAttempts) throw error;
      await sleep(backoffMs(attempt, 2, 100));
    }
  }
}
