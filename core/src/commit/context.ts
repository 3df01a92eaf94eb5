import { decodeRow, STAMP } from '../codec.js';
import type { CommitStepEvent, ProtocolEnv } from '../env.js';
import { AbortedError } from '../errors.js';
import type { CommitStepEndEvent, CommitStepName, TransactionRef } from '../events.js';
import type { CellRef, Lock, RowKey, RowState } from '../row-state.js';
import type { Reserve } from '../row-update.js';
import type { StoredRow } from '../store.js';

/** What every commit step shares (docs/protocol.md section 4). */

/** The buffered writes of one row: column -> value, or null for a delete. */
export interface RowMutations {
  readonly table: string;
  readonly row: string;
  readonly cells: ReadonlyMap<string, Uint8Array | null>;
  /** Weak notifications (`tx.notify`) on this row: marked in the prewrite CAS, lock-free. */
  readonly notify?: ReadonlySet<string> | undefined;
}

export interface CommitContext {
  readonly env: ProtocolEnv;
  /**
   * The transaction's identity in rows: its locks, its records and its values carry it.
   * Unique to it (drawn from the oracle), or STAMP: the value the store draws in the
   * one-step commit itself (a blind write, or a peeked snapshot's one-step commit).
   */
  readonly startTs: number;
  /**
   * The snapshot its reads were taken at, where that is not `startTs`: a peeked snapshot
   * (docs/protocol.md 4.10), which other transactions may share and so identifies nothing.
   * The prewrite's conflict check is against it: a write committed at or after it was not
   * seen. Always at or below `startTs`.
   */
  readonly snapshotTs?: number | undefined;
  readonly rows: readonly RowMutations[];
  readonly primary: CellRef;
  /** Rows as this transaction last saw them: the expected version for the first CAS. */
  readonly knownRows: Map<string, StoredRow | null>;
  /**
   * Some of those rows as its reads decoded them (`decodeKnown`): the commit's first
   * decision on such a row starts from them instead of decoding it again.
   */
  readonly decodedRows?: Map<string, { readonly stored: StoredRow; readonly state: RowState }> | undefined;
  /** The transaction committing, for the commit-step hooks (`CommitStepEvent.transaction`). */
  readonly transaction: object;
  /** Set once a hook simulated a crash: the client makes no further store call. */
  crashed: unknown;
  /**
   * Set before the first prewrite goes to the store. Until then nothing of this
   * transaction is in any row nor on its way there, so a rollback has nothing to remove
   * and no late prewrite to stop: it writes nothing (no rollback record).
   */
  prewriteSent?: boolean;
  /** The caller's signal: honoured up to the commit point, never after it. */
  readonly signal?: AbortSignal | undefined;
  /** The transaction in events; set only with an `onEvent` listener. */
  readonly trace?: TransactionRef | undefined;
}

/**
 * Runs one commit step and, with an `onEvent` listener, emits its `commit.step` event with
 * its duration (and the commit timestamp, if `run` resolves to one). Without a listener it
 * is just `run()`.
 */
export function timed<T>(
  ctx: CommitContext,
  name: CommitStepName,
  rows: number,
  run: () => Promise<T>,
  commitTsOf?: (result: T) => number | undefined,
): Promise<T> {
  const events = ctx.env.events;
  const transaction = ctx.trace;
  if (!events || !transaction) return run();
  // No extra async frame, no spreads: this runs for every step with a listener.
  const time = performance.now();
  const event = (commitTs: number | undefined, error: unknown): CommitStepEndEvent => ({
    type: 'commit.step',
    transaction,
    step: name,
    // A one-phase blind write's start timestamp is its commit timestamp (commitOnePhase).
    startTs: ctx.startTs === STAMP ? commitTs : ctx.startTs,
    commitTs,
    rows,
    time,
    durationMs: performance.now() - time,
    error,
  });
  return run().then(
    (result) => {
      events.emit(event(commitTsOf?.(result), undefined));
      return result;
    },
    (error: unknown) => {
      events.emit(event(undefined, error));
      throw error;
    },
  );
}

/** Before the commit point: stop if the caller aborted (the caller rolls back). */
export function notAborted(ctx: CommitContext): void {
  if (ctx.signal?.aborted) throw abortedError(ctx.signal);
}

export function abortedError(signal: AbortSignal): AbortedError {
  const reason: unknown = signal.reason;
  const why = reason instanceof Error ? reason.message : reason === undefined ? 'aborted' : String(reason);
  return new AbortedError(`the transaction was aborted before its commit point: ${why}`, { cause: reason });
}

export function rowId(table: string, row: string): string {
  return `${table}\u0000${row}`;
}

export function isPrimaryRow(ctx: CommitContext, m: RowMutations): boolean {
  return m.table === ctx.primary.table && m.row === ctx.primary.row;
}

/** The rows other than the primary's: listed in the primary lock and its commit record. */
export function secondaryRows(ctx: CommitContext): RowKey[] | undefined {
  if (ctx.rows.length <= 1) return undefined;
  return ctx.rows.filter((m) => !isPrimaryRow(ctx, m)).map((m) => ({ table: m.table, row: m.row }));
}

/** A lock held by another transaction blocked our prewrite. */
export class BlockedByLock extends Error {
  constructor(readonly lock: Lock) {
    super('row is locked by another transaction');
  }
}

/** A named commit step: runs the test hook, which may simulate a crash there. */
export async function step(
  ctx: CommitContext,
  event: Omit<CommitStepEvent, 'startTs' | 'snapshotTs' | 'transaction'>,
): Promise<void> {
  if (ctx.crashed !== undefined) throw ctx.crashed;
  const hook = ctx.env.hooks.onCommitStep;
  if (!hook) return;
  try {
    await hook({
      ...event,
      startTs: ctx.startTs,
      snapshotTs: ctx.snapshotTs ?? ctx.startTs,
      transaction: ctx.transaction,
    });
  } catch (error) {
    ctx.crashed = error;
    throw error;
  }
}

/** Throws if a hook simulated a crash: a crashed client makes no further store call. */
export function alive(ctx: CommitContext): void {
  if (ctx.crashed !== undefined) throw ctx.crashed;
}

/**
 * A known row's state, decoded: the one a read of this transaction decoded, if it is that
 * very row (taken, so no two decisions share one state: a decision changes the state it is
 * given), else decoded now.
 */
export function decodeKnown(ctx: CommitContext, id: string, stored: StoredRow): RowState {
  const kept = ctx.decodedRows?.get(id);
  if (kept?.stored !== stored) return decodeRow(stored.state);
  ctx.decodedRows!.delete(id);
  return kept.state;
}

/** How much room a write of `m` must leave in its row (row-update.ts, `Reserve`). */
export function reserveFor(m: RowMutations): Reserve {
  for (const value of m.cells.values()) if (value !== null) return 'puts';
  return 'deletes';
}
