/**
 * The logical layout of a head row (docs/protocol.md section 2). A store sees only the
 * encoded bytes; the core reads and replaces the whole head row in one CAS, so every step
 * on one row is atomic. Old values a current snapshot does not need leave the head row for
 * immutable version rows (versions.ts), so a head row's size does not grow with history.
 */
export type WriteKind = 'put' | 'delete';
export type RecordKind = WriteKind | 'rollback';

/**
 * Where a put record's value lives:
 * - `inline`: in the head row's `data` only.
 * - `moving`: still in `data`, and a version row may exist too: a move was started. The
 *   head row names the version row before anyone creates it, so no version row is ever
 *   left behind unnamed (section 7).
 * - `moved`: only in its version row.
 */
export type ValuePlace = 'inline' | 'moving' | 'moved';

export interface CellRef {
  readonly table: string;
  readonly row: string;
  readonly column: string;
}

/** A row another row's fate depends on: the secondary rows of a multi-row transaction. */
export interface RowKey {
  readonly table: string;
  readonly row: string;
}

export interface Lock {
  startTs: number;
  primary: CellRef;
  kind: WriteKind;
  ttlMs: number;
  /** Wall time (ms) of the prewrite or the last heartbeat. Readers add ttlMs to judge expiry. */
  wallTimeMs: number;
  /**
   * On the primary cell of a multi-row transaction: its other rows. Copied into the
   * primary's commit record, so GC can settle them before it drops that record.
   */
  secondaries?: RowKey[] | undefined;
}

export interface WriteRecord {
  /** For a rollback record this equals startTs. */
  commitTs: number;
  startTs: number;
  kind: RecordKind;
  /** Wall time of the commit, used only to decide when old versions may be pruned. */
  wallTimeMs: number;
  /** Where a put's value lives; always `inline` for deletes and rollbacks. */
  value: ValuePlace;
  /**
   * On a primary's commit record: the transaction's secondary rows, which may still hold
   * its locks. Such a record is never pruned while the list is set: it is the only proof
   * that those locks must be rolled forward. GC settles the rows, then clears the list.
   */
  secondaries?: RowKey[] | undefined;
}

export interface Cell {
  /** startTs -> value: the lock's pending value and the `inline`/`moving` committed values. */
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
  /** startTs of version rows whose records were pruned: deleted by the tidy step, then forgotten. */
  garbage: number[];
}

export interface RowState {
  cells: Map<string, Cell>;
}

export function emptyCell(): Cell {
  return {
    data: new Map(),
    lock: undefined,
    writes: [],
    prunedThrough: 0,
    notifyTs: 0,
    acks: new Map(),
    garbage: [],
  };
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
    cell.prunedThrough === 0 &&
    cell.garbage.length === 0
  );
}

export function rowHasNotification(row: RowState): boolean {
  for (const cell of row.cells.values()) if (cell.notifyTs > 0) return true;
  return false;
}

export function sameCell(a: CellRef, b: CellRef): boolean {
  return a.table === b.table && a.row === b.row && a.column === b.column;
}
