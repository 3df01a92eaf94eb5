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
 *
 * Values marked `moving` together form a group that moves to one version row (a block),
 * named by the group's anchor (`WriteRecord.block`): docs/protocol.md 2.2.
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
   * For a `moving` or `moved` put: the anchor of its group, the startTs that names the
   * version row holding its value (the largest startTs among the values marked with it).
   * Undefined: its own startTs (a group of one, or a record written before blocks).
   */
  block?: number | undefined;
  /**
   * On a primary's commit record: the transaction's secondary rows, which may still hold
   * its locks. Such a record is never pruned while the list is set: it is the only proof
   * that those locks must be rolled forward. GC settles the rows, then clears the list.
   */
  secondaries?: RowKey[] | undefined;
}

/** The startTs naming the version row of a `moving` or `moved` record: its group's anchor. */
export function blockOf(rec: WriteRecord): number {
  return rec.block ?? rec.startTs;
}

/** Whether a record's version row is named by another record's startTs (a block of several values). */
export function isAnchored(rec: Pick<WriteRecord, 'block' | 'startTs'>): boolean {
  return rec.block !== undefined && rec.block !== rec.startTs;
}

/**
 * A cell's older write records, still encoded as they were read (codec.ts, format 3): a
 * step on the current snapshot never decodes them, and a write that does not touch them
 * copies their bytes as they are. They are decoded the first time anything needs them
 * (`Cell.writes` or `Cell.data`). Every one of them is older than every record in
 * `Cell.recent`, and every put among them is superseded.
 */
export interface EncodedHistory {
  readonly count: number;
  /** The newest commitTs among them (every record of `Cell.recent` commits after it). */
  readonly newestCommitTs: number;
  /** Of the newest of them: what a record appended after them is encoded against. */
  readonly newestWallTimeMs: number;
  /**
   * The two smallest wallTimeMs among them that list no secondaries (Infinity: fewer such
   * records): whether pruning by age may drop one, without decoding (cells.ts, pruneDue).
   */
  readonly prunableWalls: readonly [number, number];
  /** Bytes of their values still in the head row: `inline`, `moving`. */
  readonly inlineBytes: number;
  readonly movingBytes: number;
  /** How many of them are `moving`, and how many `inline` with their value here. */
  readonly moving: number;
  readonly inline: number;
  /** How many of them still list secondaries (held records, section 7.4). */
  readonly held: number;
  /** The encoded records (oldest first) with their values: the codec's business. */
  readonly body: Uint8Array;
  /** Decodes them: records newest first, and the values they hold. */
  decode(): { writes: WriteRecord[]; data: Map<number, Uint8Array> };
}

/**
 * One cell of a head row. `writes` and `data` are the whole cell; reading either decodes
 * the older records still encoded (`history`), so code that uses them is always right.
 * The steps on a current snapshot use `recent`, `valueAt`, `setValue` and `dropValue`
 * (and the rules in cells.ts), which leave the history encoded: that is what keeps a
 * read or a commit on a cell with a long history as cheap as on a fresh one.
 */
export class Cell {
  lock: Lock | undefined = undefined;
  /** Versions at or below this timestamp were pruned: snapshots at or below it fail. */
  prunedThrough = 0;
  /** Timestamp of a pending notification, 0 if none (section 8). */
  notifyTs = 0;
  /** Observer name -> startTs of its last successful run. */
  acks = new Map<string, number>();
  /** startTs of version rows whose records were pruned: deleted by the tidy step, then forgotten. */
  garbage: number[] = [];
  #writes: WriteRecord[];
  #data: Map<number, Uint8Array>;
  #history: EncodedHistory | undefined;

  constructor(
    writes: WriteRecord[] = [],
    data: Map<number, Uint8Array> = new Map(),
    history?: EncodedHistory,
  ) {
    this.#writes = writes;
    this.#data = data;
    this.#history = history;
  }

  /** Newest first (descending commitTs): every record, decoding the history if needed. */
  get writes(): WriteRecord[] {
    if (this.#history) this.materialize();
    return this.#writes;
  }

  set writes(writes: WriteRecord[]) {
    if (this.#history) this.materialize();
    this.#writes = writes;
  }

  /** startTs -> value: the lock's pending value and the `inline`/`moving` committed values. */
  get data(): Map<number, Uint8Array> {
    if (this.#history) this.materialize();
    return this.#data;
  }

  /**
   * The records not in `history`, newest first: all of them once decoded. Whenever the
   * cell has records, the newest put or delete (what a current snapshot reads) is here.
   * Mutable only through cells.ts (addRecord).
   */
  get recent(): WriteRecord[] {
    return this.#writes;
  }

  /** The values of `recent` records and the lock's pending value, without decoding the history. */
  get recentData(): ReadonlyMap<number, Uint8Array> {
    return this.#data;
  }

  get history(): EncodedHistory | undefined {
    return this.#history;
  }

  /** Records in all, without decoding. */
  get recordCount(): number {
    return this.#writes.length + (this.#history?.count ?? 0);
  }

  /** The value held for `startTs` (a record's or the lock's), decoding the history only for an older record. */
  valueAt(startTs: number): Uint8Array | undefined {
    const value = this.#data.get(startTs);
    if (value !== undefined || !this.#history || startTs > this.#history.newestCommitTs) return value;
    return this.data.get(startTs);
  }

  /** Sets a value newer than the history (a lock's pending value). */
  setValue(startTs: number, value: Uint8Array): void {
    if (this.#history && startTs <= this.#history.newestCommitTs) this.materialize();
    this.#data.set(startTs, value);
  }

  /** Drops the value held for `startTs`. */
  dropValue(startTs: number): void {
    if (this.#data.delete(startTs) || !this.#history || startTs > this.#history.newestCommitTs) return;
    this.materialize();
    this.#data.delete(startTs);
  }

  private materialize(): void {
    const history = this.#history!;
    this.#history = undefined;
    // decodeRow checked that the history is older than the recent records.
    const older = history.decode();
    this.#writes = this.#writes.concat(older.writes);
    for (const [ts, value] of older.data) this.#data.set(ts, value);
  }
}

export interface RowState {
  cells: Map<string, Cell>;
}

export function emptyCell(): Cell {
  return new Cell();
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
    cell.recent.length === 0 &&
    cell.history === undefined &&
    cell.recentData.size === 0 &&
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
