import { addRecord, tidyCell } from './cells.js';
import { decodeRow, encodeRow, MAX_TIMESTAMP } from './codec.js';
import type { ProtocolEnv } from './env.js';
import { RowTooLargeError } from './errors.js';
import { shownName } from './names.js';
import type { Cell, RowState } from './row-state.js';
import { writeStampInPlace } from './store.js';

/**
 * Settling a lock in a row's state: rolled forward to a write record, or back
 * (docs/protocol.md sections 4 and 5). The lock resolver, the commit's secondaries, a
 * rollback and the tidy step all settle with these; `checkRoomToSettle` asks them how
 * large a row would grow.
 */

/** The record that makes a late prewrite of transaction `startTs` fail (docs/protocol.md section 5). */
export function addRollbackRecord(cell: Cell, startTs: number, nowMs: number): void {
  addRecord(cell, { commitTs: startTs, startTs, kind: 'rollback', wallTimeMs: nowMs, value: 'inline' });
}

export function rollBackCells(state: RowState, startTs: number): boolean {
  let changed = false;
  for (const cell of state.cells.values()) {
    if (cell.lock?.startTs !== startTs) continue;
    cell.lock = undefined;
    cell.dropValue(startTs);
    changed = true;
  }
  return changed;
}

/**
 * Replaces every lock of `startTs` in the row with its write record. `keepSecondaries`: the
 * commit point's own, on the primary row, where the commit record keeps the lock's list of
 * secondaries until they are known committed (docs/protocol.md 7.4); a reader's
 * roll-forward of a secondary has no list to keep.
 */
export function rollForwardCells(
  env: ProtocolEnv,
  state: RowState,
  startTs: number,
  commitTs: number,
  keepSecondaries = false,
): boolean {
  let changed = false;
  const now = env.clock();
  for (const cell of state.cells.values()) {
    const lock = cell.lock;
    if (lock?.startTs !== startTs) continue;
    cell.lock = undefined;
    addRecord(cell, {
      commitTs,
      startTs,
      kind: lock.kind,
      wallTimeMs: now,
      value: 'inline',
      secondaries: keepSecondaries ? lock.secondaries : undefined,
    });
    tidyCell(cell, env.prune, now);
    changed = true;
  }
  return changed;
}

/**
 * Room a write that adds to a row (a prewrite, a one-step commit) leaves beyond what its
 * locks need once settled: a rollback record a reader may add to a primary row that holds
 * no lock of that transaction (its prewrite never landed), about 20 bytes each.
 */
export const SETTLE_SLACK_BYTES = 256;

/**
 * Refuses (RowTooLargeError, nothing sent) a write that adds to a row, when the row, with
 * every lock in it settled, would not fit the store. Settling never shrinks a row's live
 * data: a roll-forward swaps a lock for a write record and keeps the value, and may add a
 * history section, anchors and names of version rows to delete (about 17 to over 100
 * bytes). A prewrite that filled a row to the limit let the commit point land, then every
 * roll-forward of the secondary (the commit's own, each reader's) failed as too large:
 * the committed value could never be read, nor the row written again (found in review).
 * Refused here, before the commit point, the transaction fails with nothing committed, or
 * first makes room (the pressure tidy).
 *
 * Only rows past half the store's limit are checked (a decode and an encode of the row):
 * below it, settling would have to more than double the row. The commit timestamps are
 * taken as the largest there is, so each record is encoded at its largest, and a primary
 * lock settles as the commit point writes it, its list of secondaries kept (without it, a
 * long list was missed and the secondary of another transaction became unreadable, found
 * in review). `slack` (SETTLE_SLACK_BYTES more) for a write that puts values; one that only
 * deletes needs the settled row to fit, no more, so a full row can still be emptied.
 */
export function checkRoomToSettle(
  env: ProtocolEnv,
  table: string,
  key: string,
  bytes: Uint8Array,
  slack: boolean,
): void {
  const limit = env.store.capabilities.maxStateBytes;
  if (bytes.length <= limit / 2) return;
  // The stamp slot of a stamped write is filled by the store: a copy with the largest
  // timestamp in it decodes, and its stamped values encode at their largest.
  const settled = decodeRow(writeStampInPlace(bytes.slice(), MAX_TIMESTAMP));
  const locks = new Set<number>();
  for (const cell of settled.cells.values()) if (cell.lock) locks.add(cell.lock.startTs);
  // As the commit point writes a primary: its commit record keeps the secondaries list.
  for (const startTs of locks) rollForwardCells(env, settled, startTs, MAX_TIMESTAMP, true);
  const settledBytes = locks.size > 0 ? encodeRow(settled).length : bytes.length;
  const size = settledBytes + (slack ? SETTLE_SLACK_BYTES : 0);
  if (size > limit) {
    throw new RowTooLargeError(
      `row ${table}/${shownName(key)} would be ${size} bytes once its locks are settled` +
        `${slack ? ` (with ${SETTLE_SLACK_BYTES} bytes kept for rollback records)` : ''}; ${env.store.name} allows ${limit}`,
    );
  }
}
