/**
 * The logical row layout (PROTOCOL.md section 2). A store sees only the encoded bytes;
 * the core reads and replaces the whole row in one CAS, so every step on one row is atomic.
 */
export type WriteKind = 'put' | 'delete';
export type RecordKind = WriteKind | 'rollback';

export interface CellRef {
  readonly table: string;
  readonly row: string;
  readonly column: string;
}

export interface Lock {
  startTs: number;
  primary: CellRef;
  kind: WriteKind;
  ttlMs: number;
  /** Wall time (ms) of the prewrite or the last heartbeat. Readers add ttlMs to judge expiry. */
  wallTimeMs: number;
}

export interface WriteRecord {
  /** For a rollback record this equals startTs. */
  commitTs: number;
  startTs: number;
  kind: RecordKind;
  /** Wall time of the commit, used only to decide when old versions may be pruned. */
  wallTimeMs: number;
  /**
   * Set on a primary's commit record while the transaction's secondaries may still be
   * locked. Such a record is never pruned: it is the only proof that those locks must be
   * rolled forward. The committer clears it once every secondary is committed.
   */
  secondariesPending: boolean;
}

export interface Cell {
  /** startTs -> value, written at prewrite. */
  data: Map<number, Uint8Array>;
  lock: Lock | undefined;
  /** Newest first (descending commitTs). */
  writes: WriteRecord[];
  /** Versions at or below this timestamp were pruned: snapshots at or below it fail. */
  prunedThrough: number;
  /** Timestamp of a pending notification, 0 if none (section 8). */
  notifyTs: number;
  /** Observer name -> startTs of its last successful run. */
  acks: Map<string, number>;
}

export interface RowState {
  cells: Map<string, Cell>;
}

export function emptyCell(): Cell {
  return { data: new Map(), lock: undefined, writes: [], prunedThrough: 0, notifyTs: 0, acks: new Map() };
}

export function emptyRow(): RowState {
  return { cells: new Map() };
}

export function cellOf(row: RowState, column: string): Cell {
  let cell = row.cells.get(column);
  if (!cell) {
    cell = emptyCell();
    row.cells.set(column, cell);
  }
  return cell;
}

export function isCellEmpty(cell: Cell): boolean {
  return (
    cell.lock === undefined &&
    cell.writes.length === 0 &&
    cell.data.size === 0 &&
    cell.notifyTs === 0 &&
    cell.acks.size === 0 &&
    cell.prunedThrough === 0
  );
}

export function rowHasNotification(row: RowState): boolean {
  for (const cell of row.cells.values()) if (cell.notifyTs > 0) return true;
  return false;
}

export function sameCell(a: CellRef, b: CellRef): boolean {
  return a.table === b.table && a.row === b.row && a.column === b.column;
}
