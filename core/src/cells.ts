import { STAMP } from './codec.js';
import type { Cell, RowState, WriteRecord } from './row-state.js';

/** Pure rules on one cell, shared by reads, prewrite, commit, pruning and the tidy step. */

/*
 * Each rule looks at `cell.recent` first and decodes the cell's history (row-state.ts,
 * Cell) only when the answer may lie there: the history's records are all older than the
 * recent ones, and its stats say what it holds.
 */

/** The newest put/delete committed before `startTs` (rollback records are skipped). */
export function visibleWrite(cell: Cell, startTs: number): WriteRecord | undefined {
  for (const rec of cell.recent) {
    if (rec.commitTs < startTs && rec.kind !== 'rollback') return rec;
  }
  if (!cell.history) return undefined;
  for (const rec of cell.writes) {
    if (rec.commitTs < startTs && rec.kind !== 'rollback') return rec;
  }
  return undefined;
}

/** Any record (commit or rollback) at or after `startTs`: a write-write conflict for that startTs. */
export function hasWriteAtOrAfter(cell: Cell, startTs: number): boolean {
  const newest = cell.recent[0];
  return newest !== undefined && newest.commitTs >= startTs;
}

export function findRecord(cell: Cell, startTs: number): WriteRecord | undefined {
  for (const rec of cell.recent) if (rec.startTs === startTs) return rec;
  // A record's commitTs is at least its startTs: none in the history can start after its newest commit.
  if (!cell.history || startTs > cell.history.newestCommitTs) return undefined;
  return cell.writes.find((rec) => rec.startTs === startTs);
}

/** Insert keeping newest-first order. */
export function addRecord(cell: Cell, rec: WriteRecord): void {
  const writes = cell.history && rec.commitTs > cell.history.newestCommitTs ? cell.recent : cell.writes;
  let i = 0;
  while (i < writes.length && writes[i]!.commitTs > rec.commitTs) i++;
  writes.splice(i, 0, rec);
}

export interface PrunePolicy {
  /** Versions superseded longer ago than this (wall time) may go. */
  readonly retentionMs: number;
  /**
   * At most this many records are kept per cell, whatever their age: `pruneCell` and GC
   * keep this many, and commits prune once a cell holds a quarter more (pruneDue).
   */
  readonly maxVersionsPerCell: number;
  /**
   * Bytes of superseded values a cell may keep in its head row (default 512). Past it, a
   * commit marks them all `moving`, and the tidy step moves them to version rows in one
   * batch. Values a current snapshot needs never move, so small values (counters, flags)
   * usually never do either. 0 moves every superseded value.
   */
  readonly inlineHistoryBytes: number;
}

/**
 * Primary commit records still holding their secondaries list that are past the prune
 * point. Once this many have piled up in a cell, the tidy step settles their secondaries
 * in one batch and clears the lists, so GC costs a few round trips per batch, not a write
 * per transaction.
 */
export const HELD_RECORDS_BATCH = 8;
/** Or once held records list this many rows in all (a wide transaction's list is worth settling early). */
export const HELD_ROWS_BATCH = 64;

/** Whether a cell's held records are worth a settling pass now. */
export function heldWorthSettling(held: readonly WriteRecord[]): boolean {
  if (held.length >= HELD_RECORDS_BATCH) return true;
  let rows = 0;
  for (const rec of held) rows += rec.secondaries?.length ?? 0;
  return rows >= HELD_ROWS_BATCH;
}

/** The index of the newest record no snapshot after the safe point needs; -1 if none. */
function safeIndexOf(writes: readonly WriteRecord[], policy: PrunePolicy, nowMs: number): number {
  let safeIndex = -1;
  if (writes.length > policy.maxVersionsPerCell) safeIndex = policy.maxVersionsPerCell - 1;
  const cutoff = nowMs - policy.retentionMs;
  for (let i = 0; i < writes.length; i++) {
    if (writes[i]!.wallTimeMs <= cutoff) {
      if (safeIndex < 0 || i < safeIndex) safeIndex = i;
      break;
    }
  }
  // A record still waiting for its stamp has no commitTs to be a safe point yet.
  while (safeIndex >= 0 && writes[safeIndex]?.commitTs === STAMP) safeIndex++;
  return safeIndex < writes.length ? safeIndex : -1;
}

/**
 * Drops versions no snapshot after the safe point can see (docs/protocol.md section 7).
 * The safe point is the newest record that is either older than the retention window or
 * beyond the per-cell version cap. Kept: every record above it, the newest put or delete at
 * or below it, and every commit record that still lists secondaries (held). Snapshots at or
 * below the safe point then fail with SnapshotTooOld, and so does a late prewrite, which is
 * how a pruned rollback record keeps protecting its transaction. A dropped record whose
 * value may be in a version row leaves its startTs in `garbage`, for the tidy step.
 */
export function pruneCell(cell: Cell, policy: PrunePolicy, nowMs: number): void {
  const writes = cell.writes;
  if (writes.length <= 1) return;
  const safeIndex = safeIndexOf(writes, policy, nowMs);
  if (safeIndex < 0) return;
  const safePoint = writes[safeIndex]!.commitTs;
  const kept: WriteRecord[] = writes.slice(0, safeIndex);
  let keptVisible = false;
  let dropped = false;
  for (let i = safeIndex; i < writes.length; i++) {
    const rec = writes[i]!;
    if (!keptVisible && rec.kind !== 'rollback') {
      keptVisible = true;
      kept.push(rec);
    } else if (rec.secondaries) {
      kept.push(rec);
    } else {
      dropped = true;
      if (rec.value !== 'inline') cell.garbage.push(rec.startTs);
      cell.data.delete(rec.startTs);
    }
  }
  if (!dropped) return;
  cell.writes = kept;
  cell.prunedThrough = Math.max(cell.prunedThrough, safePoint);
}

/**
 * The records that may be `moving`: `cell.recent` when the history's header says it holds
 * none (so it stays encoded), else every record.
 */
export function recordsThatMayBeMoving(cell: Cell): readonly WriteRecord[] {
  return !cell.history || cell.history.moving === 0 ? cell.recent : cell.writes;
}

/**
 * The `moving` records of a cell whose values are still in the head row, with those values:
 * what a move writes to version rows (the tidy step's creates, a one-step commit's carried
 * ones).
 */
export function movingValues(cell: Cell): { rec: WriteRecord; value: Uint8Array }[] {
  const out: { rec: WriteRecord; value: Uint8Array }[] = [];
  for (const rec of recordsThatMayBeMoving(cell)) {
    if (rec.value !== 'moving') continue;
    const value = cell.valueAt(rec.startTs);
    if (value) out.push({ rec, value });
  }
  return out;
}

/** Held records: commit records past the prune point kept only for their secondaries list. */
export function heldRecords(cell: Cell, policy: PrunePolicy, nowMs: number): WriteRecord[] {
  if (cell.history?.held === 0 && !cell.recent.some((rec) => rec.secondaries)) return [];
  const safeIndex = safeIndexOf(cell.writes, policy, nowMs);
  if (safeIndex < 0) return [];
  const held: WriteRecord[] = [];
  let passedVisible = false;
  for (let i = safeIndex; i < cell.writes.length; i++) {
    const rec = cell.writes[i]!;
    if (!passedVisible && rec.kind !== 'rollback') {
      passedVisible = true;
      continue;
    }
    if (rec.secondaries) held.push(rec);
  }
  return held;
}

/**
 * Of `records` (newest first), the index of the first put a current snapshot no longer
 * needs: every put after the newest write (put or delete; rollbacks are no writes) is
 * superseded. `records.length` if there is none.
 */
function firstSuperseded(records: readonly WriteRecord[]): number {
  let i = 0;
  while (i < records.length && records[i]!.kind === 'rollback') i++;
  return i + 1;
}

/** Bytes of superseded values in `cell.recent` (`inline`, or also `moving`): the history's are in its header. */
function recentSupersededBytes(cell: Cell, places: 'inline' | 'kept'): number {
  const recent = cell.recent;
  let bytes = 0;
  for (let i = firstSuperseded(recent); i < recent.length; i++) {
    const rec = recent[i]!;
    if (rec.kind !== 'put' || rec.value === 'moved' || (places === 'inline' && rec.value !== 'inline'))
      continue;
    bytes += cell.recentData.get(rec.startTs)?.length ?? 0;
  }
  return bytes;
}

/** Bytes of superseded values still in the head row (`inline` or `moving`). */
export function inlineHistoryBytes(cell: Cell): number {
  const history = cell.history;
  return recentSupersededBytes(cell, 'kept') + (history ? history.inlineBytes + history.movingBytes : 0);
}

/**
 * Marks superseded inline values `moving` once they pass `limitBytes` (or all of them with
 * 'force'). Only the mark: the tidy step creates the version rows afterwards.
 */
export function markMoving(cell: Cell, limitBytes: number | 'force'): boolean {
  const history = cell.history;
  if (
    history &&
    limitBytes !== 'force' &&
    recentSupersededBytes(cell, 'inline') + history.inlineBytes <= limitBytes
  )
    return false;
  // With no inline value in the history (a value that moves on each commit, say), every
  // candidate is recent: the history stays encoded.
  const recentOnly = history !== undefined && history.inline === 0;
  const data = recentOnly ? cell.recentData : cell.data;
  const records = recentOnly ? cell.recent : cell.writes;
  const first = firstSuperseded(records);
  let count = 0;
  let bytes = 0;
  for (let i = first; i < records.length; i++) {
    const rec = records[i]!;
    if (rec.kind !== 'put' || rec.value !== 'inline') continue;
    const value = data.get(rec.startTs);
    if (value === undefined) continue;
    count++;
    bytes += value.length;
  }
  if (count === 0 || (limitBytes !== 'force' && bytes <= limitBytes)) return false;
  for (let i = first; i < records.length; i++) {
    const rec = records[i]!;
    if (rec.kind === 'put' && rec.value === 'inline' && data.has(rec.startTs)) rec.value = 'moving';
  }
  return true;
}

/**
 * Whether a commit prunes the cell now. Commits prune in batches, so that between two
 * prunes a cell's older records stay encoded (row-state.ts, Cell) and a commit costs the
 * same on a long history as on a short one: once the cell holds a quarter of
 * `maxVersionsPerCell` records more than it (8 by default), or once two records that list
 * no secondaries are an eighth of `retentionMs` past the retention window (the newer of
 * the two may stay, as the version at the safe point). Pruning then drops all it may, as
 * `pruneCell` always does. Only ever later than an exact prune, never earlier: a snapshot
 * reads as much history as before, or more. `db.gc()` prunes exactly.
 */
export function pruneDue(cell: Cell, policy: PrunePolicy, nowMs: number): boolean {
  const count = cell.recordCount;
  if (count <= 1) return false;
  if (count > policy.maxVersionsPerCell + Math.floor(policy.maxVersionsPerCell / 4)) return true;
  const cutoff = nowMs - policy.retentionMs - Math.floor(policy.retentionMs / 8);
  let aged = 0;
  const walls = cell.history?.prunableWalls;
  if (walls && walls[0] <= cutoff) aged += walls[1] <= cutoff ? 2 : 1;
  if (aged >= 2) return true;
  for (const rec of cell.recent) {
    if (!rec.secondaries && rec.wallTimeMs <= cutoff && ++aged >= 2) return true;
  }
  return false;
}

/** What every CAS that adds a commit record does to the cell: prune (in batches), then mark values to move. */
export function tidyCell(cell: Cell, policy: PrunePolicy, nowMs: number): void {
  if (pruneDue(cell, policy, nowMs)) pruneCell(cell, policy, nowMs);
  markMoving(cell, policy.inlineHistoryBytes);
}

/**
 * Version rows a cell's `garbage` names before a commit asks for the tidy step to delete
 * them. Once a cell is past its retention cap every commit prunes a record, and a moved
 * value's record leaves a name in `garbage`; deleting each on its own cost a tidy pass per
 * commit (a read and a delete of the version row, a CAS of the head row that raced the next
 * commit). Batched, they go with the next pass that moves values, or once this many wait.
 * A name costs the head row a few bytes; `gc` and `db.tidy` delete whatever is named.
 */
export const GARBAGE_BATCH = 16;

/**
 * Whether the tidy step has work in this row: values to move, version rows to delete (at
 * least `garbageBatch` in one cell), held records to settle.
 */
export function rowNeedsTidy(state: RowState, policy: PrunePolicy, nowMs: number, garbageBatch = 1): boolean {
  for (const cell of state.cells.values()) {
    if (cell.garbage.length >= garbageBatch) return true;
    if (cell.recent.some((rec) => rec.value === 'moving') || (cell.history?.moving ?? 0) > 0) return true;
    // Held records are settled when the commits' pruning would drop them (pruneDue).
    if (pruneDue(cell, policy, nowMs) && heldWorthSettling(heldRecords(cell, policy, nowMs))) return true;
  }
  return false;
}
