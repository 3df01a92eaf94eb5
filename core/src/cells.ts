import { STAMP } from './codec.js';
import { blockOf, type Cell, type EncodedHistory, type RowState, type WriteRecord } from './row-state.js';

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
  /**
   * Most bytes of values one version row (a block) holds (default: 64 KiB, or half the
   * store's largest row if that is less). Values marked `moving` together share one version
   * row up to this size, so a hot cell creates and deletes one version row per move, not
   * one per value. 0: every value gets its own version row.
   */
  readonly versionBlockBytes?: number;
}

/** What a value costs a block besides its bytes (its startTs and length; codec.ts, format 18). */
export const BLOCK_ENTRY_BYTES = 16;

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
  // Strictly older than the window: a snapshot exactly retentionMs old still reads (docs say "more than").
  const cutoff = nowMs - policy.retentionMs;
  for (let i = 0; i < writes.length; i++) {
    if (writes[i]!.wallTimeMs < cutoff) {
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
 * value may be in a version row leaves its block's name (its anchor) in `garbage`, for the
 * tidy step, once no record it keeps names that block.
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
  // Blocks some dropped record named: garbage once no kept record names them.
  let blocks: number[] | undefined;
  for (let i = safeIndex; i < writes.length; i++) {
    const rec = writes[i]!;
    if (!keptVisible && rec.kind !== 'rollback') {
      keptVisible = true;
      kept.push(rec);
    } else if (rec.secondaries) {
      kept.push(rec);
    } else {
      dropped = true;
      if (rec.value !== 'inline') (blocks ??= []).push(blockOf(rec));
      cell.data.delete(rec.startTs);
    }
  }
  if (!dropped) return;
  if (blocks) {
    // A block holds the values of several records: it goes only with the last of them.
    const named = new Set<number>();
    for (const rec of kept) if (rec.value !== 'inline') named.add(blockOf(rec));
    for (const block of new Set(blocks)) if (!named.has(block)) cell.garbage.push(block);
  }
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

/** A group of `moving` values still in the head row: what one version row (a block) holds. */
export interface MovingBlock {
  /** The startTs naming the version row. */
  readonly block: number;
  /** Its records, newest first, each with its value. */
  readonly entries: { rec: WriteRecord; value: Uint8Array }[];
  /** Bytes of the values. */
  bytes: number;
}

/**
 * The `moving` records of a cell whose values are still in the head row, with those values,
 * by block: what a move writes to version rows (the tidy step's creates, a one-step
 * commit's carried ones).
 */
export function movingBlocks(cell: Cell): MovingBlock[] {
  // Made only when a value is moving: this runs on every cell a commit writes.
  let out: Map<number, MovingBlock> | undefined;
  for (const rec of recordsThatMayBeMoving(cell)) {
    if (rec.value !== 'moving') continue;
    const value = cell.valueAt(rec.startTs);
    if (!value) continue;
    const block = blockOf(rec);
    out ??= new Map();
    let group = out.get(block);
    if (!group) out.set(block, (group = { block, entries: [], bytes: 0 }));
    group.entries.push({ rec, value });
    group.bytes += value.length;
  }
  return out ? [...out.values()] : [];
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
 *
 * The values marked together are grouped into blocks of at most `blockBytes` (a value
 * larger than that is a block of its own), and every record of a group gets the group's
 * anchor, the largest startTs among them, as its `block`: the name of the one version row
 * that will hold their values. Anchors never repeat: each is the startTs of one record, and
 * a record is marked once. A group never gains a record later, and only loses records to
 * pruning, so a version row created for it at any time holds every value its records name
 * then and later (a superset): "already there" is as good as written.
 */
export function markMoving(cell: Cell, limitBytes: number | 'force', blockBytes = 0): boolean {
  const history = cell.history;
  if (history && limitBytes !== 'force' && !inlineOverLimit(cell, history, limitBytes)) return false;
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
  let group: WriteRecord[] = [];
  let groupBytes = 0;
  for (let i = first; i < records.length; i++) {
    const rec = records[i]!;
    if (rec.kind !== 'put' || rec.value !== 'inline') continue;
    const value = data.get(rec.startTs);
    if (value === undefined) continue;
    const size = value.length + BLOCK_ENTRY_BYTES;
    if (group.length > 0 && groupBytes + size > blockBytes) {
      anchorGroup(group);
      group = [];
      groupBytes = 0;
    }
    rec.value = 'moving';
    group.push(rec);
    groupBytes += size;
  }
  anchorGroup(group);
  return true;
}

/** Gives every record of a group the group's anchor (undefined for a group of one: its own startTs). */
function anchorGroup(group: readonly WriteRecord[]): void {
  if (group.length < 2) return;
  let anchor = 0;
  for (const rec of group) if (rec.startTs > anchor) anchor = rec.startTs;
  for (const rec of group) rec.block = anchor;
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
  if (walls && walls[0] < cutoff) aged += walls[1] < cutoff ? 2 : 1;
  if (aged >= 2) return true;
  for (const rec of cell.recent) {
    if (!rec.secondaries && rec.wallTimeMs < cutoff && ++aged >= 2) return true;
  }
  return false;
}

/**
 * What every CAS that adds a commit record does to the cell: prune (in batches), then mark
 * values to move. A move that has to decode the history (inline values past the limit are
 * in it) prunes too, batch or not: the decode is what a prune costs, and done once it
 * serves both. On a hot cell past its version cap a prune then rides on every move, and
 * the batch trigger alone never fires. The prune is exact (pruneCell), as `db.gc()` is.
 */
export function tidyCell(cell: Cell, policy: PrunePolicy, nowMs: number): void {
  if (pruneDue(cell, policy, nowMs) || moveDecodesHistory(cell, policy.inlineHistoryBytes)) {
    pruneCell(cell, policy, nowMs);
  }
  markMoving(cell, policy.inlineHistoryBytes, policy.versionBlockBytes ?? 0);
}

/** Whether `markMoving` would move values and decode the cell's history to find them. */
function moveDecodesHistory(cell: Cell, limitBytes: number): boolean {
  const history = cell.history;
  return history !== undefined && history.inline > 0 && inlineOverLimit(cell, history, limitBytes);
}

/** Whether a cell's superseded inline values, recent and in its encoded history, pass the limit. */
function inlineOverLimit(cell: Cell, history: EncodedHistory, limitBytes: number): boolean {
  return recentSupersededBytes(cell, 'inline') + history.inlineBytes > limitBytes;
}

/**
 * Version rows a cell's `garbage` names before a commit asks for the tidy step to delete
 * them. Once a cell is past its retention cap every commit prunes a record, and the last
 * moved record of a block leaves the block's name in `garbage`; deleting each on its own
 * cost a tidy pass per commit (a read and a delete of the version row, a CAS of the head
 * row that raced the next commit). Batched, they go with the next pass that moves values,
 * or once this many wait (with blocks of five values, some 80 pruned values' worth). A name
 * costs the head row a few bytes; `gc` and `db.tidy` delete whatever is named.
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
