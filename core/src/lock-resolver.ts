import { findRecord } from './cells.js';
import type { ProtocolEnv } from './env.js';
import { StoreError } from './errors.js';
import type { TransactionRef } from './events.js';
import { type Cell, cellOf, type Lock } from './row-state.js';
import { AmbiguousOutcome, updateRow } from './row-update.js';
import { addRollbackRecord, rollBackCells, rollForwardCells } from './settle-cells.js';

/**
 * Resolving a lock another transaction left (docs/protocol.md section 5). The primary cell
 * decides the fate of every lock of its transaction.
 */
export type LockFate = { committed: true; commitTs: number } | { committed: false };

export function isLockExpired(lock: Lock, nowMs: number): boolean {
  return lock.wallTimeMs + lock.ttlMs < nowMs;
}

/**
 * Returns 'alive' if the owner may still be committing (caller backs off), otherwise
 * rolls the lock found at (table, row) forward or back and returns the fate it applied.
 */
export async function resolveLock(
  env: ProtocolEnv,
  table: string,
  row: string,
  lock: Lock,
  /** Who met the lock, for the `lock.resolve` event. */
  by?: TransactionRef,
  as: 'read' | 'prewrite' | 'operator' = 'read',
): Promise<LockFate | 'alive'> {
  const time = env.events ? performance.now() : 0;
  let fate: LockFate | 'alive';
  try {
    fate = await decideFate(env, lock);
    if (fate === 'alive') return 'alive';
    const p = lock.primary;
    // The primary row was settled by decideFate itself; other rows need their own CAS.
    if (!(p.table === table && p.row === row)) await settleRow(env, table, row, lock.startTs, fate);
  } catch (error) {
    // A rollback or roll-forward CAS whose outcome could not be verified (the store failed
    // before the loop could re-read). It belongs to the other transaction, whose fate the
    // primary records either way; the transaction that met the lock has written nothing,
    // so for it this is a store failure it may retry, never an internal error.
    if (error instanceof AmbiguousOutcome) {
      throw new StoreError(
        `resolving the lock of transaction ${lock.startTs} on ${table}/${row}: the store failed before the outcome could be verified (that transaction's primary records its fate either way)`,
        'no',
        { cause: error },
      );
    }
    throw error;
  }
  env.events?.emit({
    type: 'lock.resolve',
    transaction: by,
    by: as,
    table,
    row,
    lockStartTs: lock.startTs,
    outcome: fate.committed ? 'rolledForward' : 'rolledBack',
    ...(fate.committed ? { commitTs: fate.commitTs } : {}),
    time,
    durationMs: performance.now() - time,
  });
  return fate;
}

/**
 * What the primary cell says about the transaction that left `lock` (docs/protocol.md
 * section 5), without changing anything: its fate if decided, 'alive' while the owner may
 * still be committing, or 'abandoned' when a reader would now roll it back (expired, or
 * its primary prewrite never landed). `cell` is the primary cell as read (undefined if
 * absent). decideFate applies this verdict; operators' tools only report it.
 */
export function primaryVerdict(
  cell: Cell | undefined,
  lock: Lock,
  nowMs: number,
): LockFate | 'alive' | 'abandoned' {
  const startTs = lock.startTs;
  const record = cell && findRecord(cell, startTs);
  if (record)
    return record.kind === 'rollback' ? { committed: false } : { committed: true, commitTs: record.commitTs };
  if (cell?.lock?.startTs === startTs) return isLockExpired(cell.lock, nowMs) ? 'abandoned' : 'alive';
  // The primary prewrite may still be in flight (prewrites run in parallel): give the
  // owner until the lock we met expires before killing it.
  if (!isLockExpired(lock, nowMs)) return 'alive';
  // No record, and history at that point was pruned. A commit record that still lists
  // its secondaries is never pruned, so this transaction did not commit; its rollback
  // record (if any) was pruned, and prunedThrough still stops a late prewrite.
  if (cell && startTs <= cell.prunedThrough) return { committed: false };
  return 'abandoned';
}

/**
 * Reads the primary and settles it: committed, rolled back, or still alive. Rolling back
 * an expired primary is one CAS that races the owner's commit CAS: exactly one wins.
 */
export async function decideFate(env: ProtocolEnv, lock: Lock): Promise<LockFate | 'alive'> {
  const { table, row, column } = lock.primary;
  const startTs = lock.startTs;
  const { result } = await updateRow<LockFate | 'alive'>(env, table, row, undefined, (state) => {
    const next = state ?? { cells: new Map() };
    const cell = cellOf(next, column);
    const verdict = primaryVerdict(cell, lock, env.clock());
    if (verdict !== 'abandoned') return { done: verdict };
    // Expired, or the primary prewrite never landed (or is still in flight): leave a
    // rollback record first, so a late prewrite of this transaction fails.
    rollBackCells(next, startTs);
    addRollbackRecord(cell, startTs, env.clock());
    return { write: next, result: { committed: false } };
  });
  return result;
}

/** Rolls every lock of `startTs` in one row forward (committed) or back. */
export async function settleRow(
  env: ProtocolEnv,
  table: string,
  row: string,
  startTs: number,
  fate: LockFate,
): Promise<void> {
  await updateRow(env, table, row, undefined, (state) => {
    if (!state) return { done: undefined };
    const changed = fate.committed
      ? rollForwardCells(env, state, startTs, fate.commitTs)
      : rollBackCells(state, startTs);
    return changed ? { write: state, result: undefined } : { done: undefined };
  });
}
