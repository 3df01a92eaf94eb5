import { decodeRow, decodeVersionRow } from './codec.js';
import type { RecordKind, RowKey, ValuePlace, WriteKind } from './row-state.js';
import type { RowRef } from './store.js';
import { versionKey, versionTable } from './versions.js';

/**
 * A read-only, plain-data view of a stored head row (docs/protocol.md section 2), for
 * operators, tests and tools: what it holds, never a way to change it. Throws
 * CorruptRowError for a row in a format this version does not know.
 */
export interface HeadRowView {
  readonly cells: readonly CellView[];
}

export interface CellView {
  readonly column: string;
  readonly lock?: {
    readonly startTs: number;
    readonly primary: { readonly table: string; readonly row: string; readonly column: string };
    readonly kind: WriteKind;
    readonly ttlMs: number;
    readonly wallTimeMs: number;
    readonly secondaries?: readonly RowKey[];
  };
  /** Newest first. */
  readonly writes: readonly {
    readonly commitTs: number;
    readonly startTs: number;
    readonly kind: RecordKind;
    readonly wallTimeMs: number;
    /** Where a put's value lives. */
    readonly value: ValuePlace;
    /** Bytes of the value when it is in the head row. */
    readonly inlineBytes?: number;
    readonly secondaries?: readonly RowKey[];
  }[];
  /** Bytes of every value kept in the head row (the lock's pending value included). */
  readonly inlineBytes: number;
  readonly prunedThrough: number;
  readonly notifyTs: number;
  readonly acks: Readonly<Record<string, number>>;
  /** startTs of version rows waiting to be deleted. */
  readonly garbage: readonly number[];
}

export function inspectHeadRow(state: Uint8Array): HeadRowView {
  const row = decodeRow(state);
  const cells: CellView[] = [];
  for (const [column, cell] of row.cells) {
    let inlineBytes = 0;
    for (const value of cell.data.values()) inlineBytes += value.length;
    cells.push({
      column,
      ...(cell.lock ? { lock: { ...cell.lock, primary: { ...cell.lock.primary } } } : {}),
      writes: cell.writes.map((w) => ({
        commitTs: w.commitTs,
        startTs: w.startTs,
        kind: w.kind,
        wallTimeMs: w.wallTimeMs,
        value: w.value,
        ...(cell.data.has(w.startTs) ? { inlineBytes: cell.data.get(w.startTs)!.length } : {}),
        ...(w.secondaries ? { secondaries: w.secondaries } : {}),
      })),
      inlineBytes,
      prunedThrough: cell.prunedThrough,
      notifyTs: cell.notifyTs,
      acks: Object.fromEntries(cell.acks),
      garbage: [...cell.garbage],
    });
  }
  return { cells };
}

/** Where the version row of (table, row, column) written at `startTs` lives. */
export function versionRowRef(table: string, row: string, column: string, startTs: number): RowRef {
  return { table: versionTable(table), key: versionKey(row, column, startTs) };
}

/**
 * Every version row a head row names (`moving`, `moved` and `garbage`): the only version
 * rows of that row that may exist. `moved` ones must exist.
 */
export function namedVersionRows(
  table: string,
  row: string,
  view: HeadRowView,
): { named: RowRef[]; mustExist: RowRef[] } {
  const named: RowRef[] = [];
  const mustExist: RowRef[] = [];
  for (const cell of view.cells) {
    for (const w of cell.writes) {
      if (w.value === 'inline') continue;
      const ref = versionRowRef(table, row, cell.column, w.startTs);
      named.push(ref);
      if (w.value === 'moved') mustExist.push(ref);
    }
    for (const ts of cell.garbage) named.push(versionRowRef(table, row, cell.column, ts));
  }
  return { named, mustExist };
}

/** The value a version row holds (CorruptRowError for an unknown format). */
export function versionRowValue(state: Uint8Array): Uint8Array {
  return decodeVersionRow(state);
}
