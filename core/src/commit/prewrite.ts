import { waitAtMost } from '../backoff.js';
import { findRecord, hasWriteAtOrAfter, inlineHistoryBytes } from '../cells.js';
import { decodeRow } from '../codec.js';
import { observedKey } from '../env.js';
import { ConflictError, RowTooLargeError, SnapshotTooOldError } from '../errors.js';
import { resolveLock } from '../lock-resolver.js';
import { shownName } from '../names.js';
import { cellOf, emptyRow, type Lock, type RowState } from '../row-state.js';
import {
  type Decide,
  type Known,
  knownOrGuess,
  type RowUpdateResult,
  startRowUpdates,
  updateRow,
} from '../row-update.js';
import type { StoredRow } from '../store.js';
import {
  alive,
  BlockedByLock,
  type CommitContext,
  isPrimaryRow,
  notAborted,
  type RowMutations,
  reserveFor,
  rowId,
  secondaryRows,
  step,
} from './context.js';
import type { Heartbeat } from './heartbeat.js';

/**
 * Prewrite (docs/protocol.md section 4): in one CAS per row, check for conflicts, then
 * store each written value and a lock. The first attempt for every row goes out as one
 * batch; each row the batch did not settle goes on its own.
 */

/**
 * The prewrite rule for one row, applied to `state` in place: fail on a newer write or a
 * foreign lock, else store data and (with `lockAs: 'lock'`) a lock for each written cell.
 * Returns false if every lock is ours already (an earlier ambiguous attempt landed).
 */
export function applyPrewrite(
  ctx: CommitContext,
  m: RowMutations,
  state: RowState,
  lockAs: 'lock' | 'none',
): boolean {
  const { env, startTs } = ctx;
  // What it read was seen at `snapshot`: a write there or later is a conflict, and history
  // pruned through it refuses it. An identity drawn at commit is above the snapshot, so
  // that also refuses a late prewrite of a pruned identity (its rollback record may be
  // gone); one drawn ahead (docs/protocol.md 4.10) may be below, so the primary, where
  // rollback records are written, is checked at the identity too. Only the primary: a
  // commit between the two on another row is no reason to abort, and a late secondary
  // lock is settled through the primary anyway.
  const snapshot = ctx.snapshotTs ?? startTs;
  const identityBelow = startTs < snapshot;
  let changed = false;
  const now = env.clock();
  const primaryRow = isPrimaryRow(ctx, m);
  for (const [column, value] of m.cells) {
    const cell = cellOf(state, column);
    if (cell.lock?.startTs === startTs) continue;
    if (cell.lock) throw new BlockedByLock(cell.lock);
    const oldest = identityBelow && primaryRow && column === ctx.primary.column ? startTs : snapshot;
    if (oldest <= cell.prunedThrough) {
      throw new SnapshotTooOldError(`history of ${m.table}/${column} was pruned past start ${oldest}`);
    }
    if (hasWriteAtOrAfter(cell, snapshot)) {
      throw new ConflictError(`write conflict on ${m.table}/${shownName(m.row)}/${shownName(column)}`);
    }
    // An identity at or above the snapshot meets its own rollback record (a reader rolled
    // it back, and this prewrite came late) in the check above; one drawn ahead, below the
    // snapshot, must look for it.
    if (identityBelow && findRecord(cell, startTs)) {
      throw new ConflictError(`transaction ${startTs} was rolled back by another client`);
    }
    if (value) cell.setValue(startTs, value);
    if (lockAs === 'lock') {
      cell.lock = {
        startTs,
        primary: ctx.primary,
        kind: value ? 'put' : 'delete',
        ttlMs: env.lockTtlMs,
        wallTimeMs: now,
        // The primary lock names the other rows: its commit record keeps the list until GC
        // has made sure none of them is still locked (section 7).
        secondaries: primaryRow && column === ctx.primary.column ? secondaryRows(ctx) : undefined,
      };
    }
    // Section 8: the notification is written before the commit point.
    if (env.observed.has(observedKey(m.table, column))) cell.notifyTs = startTs;
    changed = true;
  }
  // Weak notifications ride along in the same CAS, outside the conflict check.
  if (changed) {
    for (const column of m.notify ?? []) {
      const cell = cellOf(state, column);
      cell.notifyTs = Math.max(cell.notifyTs, startTs);
    }
  }
  return changed;
}

/**
 * Runs `attemptOnce` (one prewrite-style CAS loop); when a foreign lock blocks it, a live
 * owner wins (the paper aborts the newcomer); a lock whose transaction is decided (committed,
 * rolled back) or abandoned is resolved first.
 */
export async function withLockResolution<T>(
  ctx: CommitContext,
  m: RowMutations,
  attemptOnce: (attempt: number) => Promise<T>,
): Promise<T> {
  for (let attempt = 0; ; attempt++) {
    alive(ctx);
    try {
      return await attemptOnce(attempt);
    } catch (error) {
      if (!(error instanceof BlockedByLock)) throw error;
      await settleBlockingLock(ctx, m, error.lock, attempt);
    }
  }
}

/**
 * A foreign `lock` on row `m` blocked attempt number `attempt` of a write: returns once
 * trying again makes sense, or throws ConflictError where the paper aborts the newcomer.
 */
export async function settleBlockingLock(
  ctx: CommitContext,
  m: RowMutations,
  lock: Lock,
  attempt: number,
): Promise<void> {
  const { env } = ctx;
  ctx.knownRows.delete(rowId(m.table, m.row));
  // A lock of a commit of this client that is past its commit point (committing its
  // secondaries in the background) or rolling back: that commit clears it within a
  // round trip or two, so wait for it and try again, instead of reading its primary
  // and racing it to settle the row. The common case is back-to-back transactions on
  // the same rows. Waiting decides nothing; past lockWaitMs, the usual way.
  const local = attempt < 3 ? env.localCommits.finishedSettling(lock.startTs) : undefined;
  if (local) {
    await waitAtMost(local, env.lockWaitMs, ctx.signal);
    return;
  }
  // The lock's fate is decided by its primary: a transaction that already committed
  // (its secondaries still being committed in the background) or was rolled back is
  // settled now; a live one wins, as in the paper.
  const fate = await resolveLock(env, m.table, m.row, lock, ctx.trace, 'prewrite');
  if (fate === 'alive' || attempt >= 3) {
    throw new ConflictError(`${m.table}/${shownName(m.row)} is locked by transaction ${lock.startTs}`);
  }
}

/**
 * A head row close to the store's limit with old values still inline: move them out
 * first (a burst of big values can outrun the background tidy step). Cheap to test: only
 * rows over half the limit are decoded.
 */
export function underPressure(ctx: CommitContext, known: StoredRow | null | undefined): boolean {
  const limit = ctx.env.store.capabilities.maxStateBytes;
  if (!known || known.state.length <= limit / 2) return false;
  let bytes = 0;
  for (const cell of decodeRow(known.state).cells.values()) bytes += inlineHistoryBytes(cell);
  return bytes > limit / 4;
}

export async function relievePressure(ctx: CommitContext, m: RowMutations): Promise<void> {
  alive(ctx);
  ctx.knownRows.delete(rowId(m.table, m.row));
  await ctx.env.tidier.tidyRow(m.table, m.row, undefined, { force: true }, 'pressure');
}

/** The decision of a prewrite CAS on one row: our locks and values, or nothing if they are there already. */
function prewriteDecision(ctx: CommitContext, m: RowMutations): Decide<undefined> {
  return (state) => {
    const next = state ?? emptyRow();
    return applyPrewrite(ctx, m, next, 'lock')
      ? { write: next, result: undefined, reserve: reserveFor(m) }
      : { done: undefined };
  };
}

/** Prewrite one row on its own: re-reads as needed, resolves abandoned locks, makes room. */
function prewriteRow(
  ctx: CommitContext,
  m: RowMutations,
  first: Known,
  ambiguous: boolean,
): Promise<RowUpdateResult<undefined>> {
  const decide = prewriteDecision(ctx, m);
  ctx.prewriteSent = true; // (or about to be: a rollback writes its record either way)
  return withLockResolution(ctx, m, async (attempt) => {
    // After a wait on another transaction's lock, a signal that fired meanwhile ends the
    // commit here (it is before the commit point): it was ignored until the lock was
    // settled or the commit failed with ConflictError (found in review).
    if (attempt > 0) notAborted(ctx);
    const known = attempt === 0 ? first : ctx.knownRows.get(rowId(m.table, m.row));
    try {
      return await updateRow(ctx.env, m.table, m.row, known, decide, ambiguous);
    } catch (error) {
      if (!(error instanceof RowTooLargeError)) throw error;
      await relievePressure(ctx, m);
      return await updateRow(ctx.env, m.table, m.row, undefined, decide, ambiguous);
    }
  });
}

/** Prewrites every row: the first attempts in one batch where the store allows it. */
export async function prewriteAll(ctx: CommitContext, heartbeat: Heartbeat): Promise<void> {
  for (const m of ctx.rows) {
    if (underPressure(ctx, ctx.knownRows.get(rowId(m.table, m.row)))) await relievePressure(ctx, m);
  }
  // A commit of this client still settling these rows (its secondaries, a rollback) holds
  // locks there for another round trip: wait for it rather than meet its locks, so the
  // batch below goes out once, against the rows as that commit leaves them (the row cache
  // has them; what this transaction read before is older). Back-to-back transactions on
  // the same rows are the case. Waiting decides nothing, and such a commit waits for no one.
  const settling = ctx.env.localCommits.settlingOn(ctx.rows.map((m) => rowId(m.table, m.row)));
  if (settling) {
    await waitAtMost(settling, ctx.env.lockWaitMs, ctx.signal);
    for (const m of ctx.rows) ctx.knownRows.delete(rowId(m.table, m.row));
    notAborted(ctx); // the wait ends early for a signal: nothing is sent after it
  }
  alive(ctx);
  // From now on our primary lock may exist: keep it fresh (a beat finds nothing to do before it lands).
  heartbeat.start();
  const rows = await startRowUpdates(
    ctx.env,
    ctx.rows.map((m) => ({
      table: m.table,
      key: m.row,
      // A row this transaction never read: the client's last sight of it, as a guess.
      known: knownOrGuess(ctx.env, m.table, m.row, ctx.knownRows.get(rowId(m.table, m.row))),
      decide: prewriteDecision(ctx, m),
      single: (known: Known, ambiguous: boolean) => prewriteRow(ctx, m, known, ambiguous),
    })),
    // A conflict fails the transaction: nothing is sent. A lock is resolved, and a row
    // too large is made room for, row by row.
    {
      abortIf: (error) => !(error instanceof BlockedByLock || error instanceof RowTooLargeError),
      beforeSend: () => {
        ctx.prewriteSent = true;
      },
    },
  );
  // Each row's step fires as soon as that row is prewritten, so a client that stops
  // "after the primary prewrite" may still have other prewrites in flight.
  const settled = await Promise.allSettled(
    rows.map(async (done, i) => {
      const m = ctx.rows[i]!;
      const { stored } = await done;
      if (stored !== undefined) ctx.knownRows.set(rowId(m.table, m.row), stored);
      await step(ctx, { step: 'afterPrewrite', table: m.table, row: m.row, isPrimary: isPrimaryRow(ctx, m) });
    }),
  );
  alive(ctx);
  const failed = settled.find((s): s is PromiseRejectedResult => s.status === 'rejected');
  if (failed) throw failed.reason;
}
