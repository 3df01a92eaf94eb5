import type { Cell, WriteRecord } from './row-state.js';

/** Pure rules on one cell, shared by reads, prewrite, commit and pruning. */

/** The newest put/delete committed before `startTs` (rollback records are skipped). */
export function visibleWrite(cell: Cell, startTs: number): WriteRecord | undefined {
  for (const rec of cell.writes) {
    if (rec.commitTs < startTs && rec.kind !== 'rollback') return rec;
  }
  return undefined;
}

/** Any record (commit or rollback) at or after `startTs`: a write-write conflict for that startTs. */
export function hasWriteAtOrAfter(cell: Cell, startTs: number): boolean {
  const newest = cell.writes[0];
  return newest !== undefined && newest.commitTs >= startTs;
}

export function findRecord(cell: Cell, startTs: number): WriteRecord | undefined {
  return cell.writes.find((rec) => rec.startTs === startTs);
}

/** Insert keeping newest-first order. */
export function addRecord(cell: Cell, rec: WriteRecord): void {
  let i = 0;
  while (i < cell.writes.length && cell.writes[i]!.commitTs > rec.commitTs) i++;
  cell.writes.splice(i, 0, rec);
}

export interface PrunePolicy {
  /** Versions superseded longer ago than this (wall time) may go. */
  readonly retentionMs: number;
  /** At most this many records are kept per cell, whatever their age. */
  readonly maxVersionsPerCell: number;
}

/**
 * Drops versions no snapshot after the safe point can see (PROTOCOL.md section 7).
 * The safe point is the newest record that is either older than the retention window or
 * beyond the per-cell version cap. Kept: every record above it, and the newest put or
 * delete at or below it. Never dropped: a commit record with `secondariesPending`.
 * Snapshots at or below the safe point then fail with SnapshotTooOld, and so does a late
 * prewrite, which is how a pruned rollback record keeps protecting its transaction.
 */
export function pruneCell(cell: Cell, policy: PrunePolicy, nowMs: number): void {
  const writes = cell.writes;
  if (writes.length <= 1) return;
  let safeIndex = -1;
  if (writes.length > policy.maxVersionsPerCell) safeIndex = policy.maxVersionsPerCell - 1;
  const cutoff = nowMs - policy.retentionMs;
  for (let i = 0; i < writes.length; i++) {
    if (writes[i]!.wallTimeMs <= cutoff) {
      if (safeIndex < 0 || i < safeIndex) safeIndex = i;
      break;
    }
  }
  if (safeIndex < 0) return;
  const safePoint = writes[safeIndex]!.commitTs;
  const kept: WriteRecord[] = writes.slice(0, safeIndex);
  let keptVisible = false;
  let dropped = false;
  for (let i = safeIndex; i < writes.length; i++) {
    const rec = writes[i]!;
    if (rec.secondariesPending || (!keptVisible && rec.kind !== 'rollback')) {
      if (rec.kind !== 'rollback') keptVisible = true;
      kept.push(rec);
    } else {
      dropped = true;
    }
  }
  if (!dropped) return;
  cell.writes = kept;
  cell.prunedThrough = Math.max(cell.prunedThrough, safePoint);
  const live = new Set<number>();
  for (const rec of kept) if (rec.kind === 'put') live.add(rec.startTs);
  if (cell.lock) live.add(cell.lock.startTs);
  for (const ts of cell.data.keys()) if (!live.has(ts)) cell.data.delete(ts);
}
