import { Cell, type Lock, type RowState, type WriteRecord } from '../src/row-state.js';

/** A cell's fields as plain data: what tests write and compare. */
export interface PlainCell {
  data: Map<number, Uint8Array>;
  lock: Lock | undefined;
  writes: WriteRecord[];
  prunedThrough: number;
  notifyTs: number;
  acks: Map<string, number>;
  garbage: number[];
}

export function cellFrom(plain: PlainCell): Cell {
  const cell = new Cell(plain.writes, plain.data);
  cell.lock = plain.lock;
  cell.prunedThrough = plain.prunedThrough;
  cell.notifyTs = plain.notifyTs;
  cell.acks = plain.acks;
  cell.garbage = plain.garbage;
  return cell;
}

export function rowFrom(cells: Iterable<[string, PlainCell]>): RowState {
  return { cells: new Map([...cells].map(([name, plain]) => [name, cellFrom(plain)])) };
}

/** Every field of every cell, the encoded history decoded: for toEqual. */
export function plainRow(row: RowState): Map<string, PlainCell> {
  return new Map(
    [...row.cells].map(([name, cell]) => [
      name,
      {
        data: cell.data,
        lock: cell.lock,
        writes: cell.writes,
        prunedThrough: cell.prunedThrough,
        notifyTs: cell.notifyTs,
        acks: cell.acks,
        garbage: cell.garbage,
      },
    ]),
  );
}
