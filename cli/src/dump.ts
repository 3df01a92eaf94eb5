/**
 * `percolator dump TABLE [--row KEY] [--limit N]`: the latest committed values, read with
 * the library's own decoder through a Percolator snapshot transaction that is rolled back,
 * never committed. (Moved here from the conformance CLI.)
 *
 * A lock is handled exactly as any reader handles it: an uncommitted value is never shown,
 * and a lock whose owner has gone is rolled back or forward through its primary
 * (docs/protocol.md section 5), the protocol's own cleanup, not a write of data. Its
 * snapshot is a read-only one: peeked from the store's counter where the store peeks
 * (writing nothing), else drawn from it; before that, one plain read checks that the
 * table (or row) is stored at all, so asking for something that is not there changes
 * nothing.
 */
import {
  compareKeys,
  inspectHeadRow,
  isReservedColumn,
  Percolator,
  type RowStore,
  SnapshotTooOldError,
  UnsupportedOperationError,
  validateRowKey,
  validateUserTable,
} from '@percolator/core';
import { type CommandResult, emptyHeadRow, KEEP_EVERY_VERSION } from './commands.js';
import { EXIT, type ExitCode, NotFoundError } from './errors.js';
import { plural, shown } from './format.js';

export interface DumpedCell {
  readonly row: string;
  readonly column: string;
  /** UTF-8 text when the bytes are valid UTF-8, else lowercase hex. */
  readonly value: string;
  readonly encoding: 'utf8' | 'hex';
}

const strictUtf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/** Bytes as UTF-8 text when they are valid UTF-8, else as hex. */
export function showValue(bytes: Uint8Array): { value: string; encoding: 'utf8' | 'hex' } {
  try {
    return { value: strictUtf8.decode(bytes), encoding: 'utf8' };
  } catch {
    return {
      value: Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('hex'),
      encoding: 'hex',
    };
  }
}

export interface ReadCommittedOptions {
  /** Only this row. */
  readonly row?: string;
  /** At most this many rows. */
  readonly limit?: number;
}

/**
 * The latest committed value of every column of the rows of `table` (or of one row), in
 * key order, through one snapshot transaction that is rolled back. Reserved (observer)
 * columns are left out, as `tx.scan` leaves them out. NotFoundError, before any timestamp
 * is drawn, when the table (or row) holds no stored row; UnsupportedOperationError without
 * `row` on a store that cannot scan in key order.
 */
export async function* readCommitted(
  store: RowStore,
  table: string,
  options: ReadCommittedOptions = {},
): AsyncGenerator<{ row: string; column: string; value: Uint8Array }> {
  validateUserTable(table);
  const { row, limit } = options;
  if (row !== undefined) validateRowKey(row);
  // The snapshot is a timestamp of the deployment's own: without its counter (a composite
  // with counterStore: null) the Percolator client would say "pass an oracle shared by all
  // clients", which a CLI user cannot (found by a new user).
  if (!store.capabilities.atomicCounter || !store.incrementCounter)
    throw new UnsupportedOperationError(
      `dump reads through a snapshot, a timestamp from the deployment's counter, and store "${store.name}" has none (a composite deployment with counterStore: null): inspect shows a row's committed versions without one`,
    );
  if (row === undefined && (!store.capabilities.orderedScan || !store.scan)) {
    throw new UnsupportedOperationError(
      `store "${store.name}" cannot scan rows in key order: pass --row KEY to read one row`,
    );
  }
  if (row === undefined) {
    if ((await store.scan!(table, { limit: 1 })).length === 0)
      throw new NotFoundError(`table ${shown(table)} holds no rows`);
  } else {
    const stored = await store.read(table, row);
    if (stored === null) throw new NotFoundError(`row ${shown(row)} of ${shown(table)} is not stored`);
    // It reads as absent, so exit 4 as for a row that is not stored (and no timestamp drawn),
    // but saying why something is stored there.
    const empty = emptyHeadRow(stored.state);
    if (empty)
      throw new NotFoundError(`row ${shown(row)} of ${shown(table)} has no committed values\n  ${empty}`);
  }
  // Reads settle the locks they meet; like resolve, the CLI prunes nothing as it does.
  const db = new Percolator({ store, gc: KEEP_EVERY_VERSION });
  // The snapshot is taken now: every commit below it has its locks or records in the head
  // rows read after this. Read-only: peeked where the store peeks (docs/protocol.md 4.1),
  // which writes nothing, not even the counter; drawn elsewhere. No identity is drawn.
  const tx = await db.begin({ readOnly: true });
  try {
    if (row === undefined) {
      for await (const scanned of tx.scan(table, { limit })) {
        const columns = [...scanned.columns.keys()].sort(compareKeys);
        for (const column of columns) yield { row: scanned.row, column, value: scanned.columns.get(column)! };
      }
      return;
    }
    // One row: its columns are named by its head row (read after the snapshot was drawn);
    // each value is then read through the transaction, which resolves any lock first.
    const stored = await store.read(table, row);
    if (stored === null) return;
    const columns = inspectHeadRow(stored.state, { table, key: row })
      .cells.map((c) => c.column)
      .filter((c) => !isReservedColumn(c))
      .sort(compareKeys);
    for (const column of columns) {
      const value = await tx.get(table, row, column);
      if (value !== undefined) yield { row, column, value };
    }
  } finally {
    await tx.rollback();
    await db.close();
  }
}

/** Every committed value readCommitted finds, shown as text or hex; NotFoundError when there is none. */
export async function dumpTable(
  store: RowStore,
  table: string,
  options: ReadCommittedOptions = {},
): Promise<DumpedCell[]> {
  const cells: DumpedCell[] = [];
  for await (const c of readCommitted(store, table, options))
    cells.push({ row: c.row, column: c.column, ...showValue(c.value) });
  if (cells.length === 0) throw noValues({ table, ...options });
  return cells;
}

/**
 * How many bytes of a value the text shows unless told `full` (a 1 MiB value of zero bytes
 * printed 6 MB of "\u0000", found in review). --json always has whole values.
 */
export const DUMP_TEXT_BYTES = 256;

/** A value as the text shows it: whole, or its first `maxBytes` bytes and a marker with its size. */
export function cellText(c: DumpedCell, maxBytes: number = Number.POSITIVE_INFINITY): string {
  if (c.encoding === 'hex') {
    const size = c.value.length / 2;
    if (size <= maxBytes) return `0x${c.value}`;
    return `0x${c.value.slice(0, maxBytes * 2)}${cutMarker(maxBytes, size)}`;
  }
  const size = Buffer.byteLength(c.value, 'utf8');
  if (size <= maxBytes) return JSON.stringify(c.value);
  // Whole characters only: a cut inside one would show a broken one.
  let kept = 0;
  let end = 0;
  for (const ch of c.value) {
    const n = Buffer.byteLength(ch, 'utf8');
    if (kept + n > maxBytes) break;
    kept += n;
    end += ch.length;
  }
  return `${JSON.stringify(c.value.slice(0, end))}${cutMarker(kept, size)}`;
}

function cutMarker(shown: number, size: number): string {
  return ` ... (cut: first ${shown} of ${size} bytes; --full prints it whole)`;
}

export interface DumpArgs {
  readonly table: string;
  readonly row?: string;
  readonly limit?: number;
  readonly full?: boolean;
}

function readOptions(args: DumpArgs): ReadCommittedOptions {
  return {
    ...(args.row === undefined ? {} : { row: args.row }),
    ...(args.limit === undefined ? {} : { limit: args.limit }),
  };
}

/** The text's lines, as `dump` prints them. */
const header = (table: string) => `${shown(table)} (latest committed values)`;
const cellLine = (cell: DumpedCell, full: boolean | undefined) =>
  `  ${shown(cell.column)}  ${cellText(cell, full === true ? undefined : DUMP_TEXT_BYTES)}`;
const summary = (rows: number, values: number) => `${plural(rows, 'row')}, ${plural(values, 'value')}`;

/** Every value dumped, collected: the `--json` data, and the text without the target line. */
export async function dumpCommand(store: RowStore, args: DumpArgs): Promise<CommandResult<DumpedCell[]>> {
  const cells = await dumpTable(store, args.table, readOptions(args));
  const lines = [header(args.table)];
  let lastRow: string | undefined;
  let rows = 0;
  for (const cell of cells) {
    if (cell.row !== lastRow) {
      rows++;
      lastRow = cell.row;
      lines.push(shown(cell.row));
    }
    lines.push(cellLine(cell, args.full));
  }
  lines.push(summary(rows, cells.length));
  return { code: EXIT.ok, data: cells, text: lines.join('\n') };
}

/** Where a streamed dump goes: the CLI's stdout, with its backpressure. */
export interface DumpSink {
  /** Writes text; false: wait for `drained()` before writing more. */
  write(text: string): boolean;
  /** Resolves when the output takes more again, or has closed. */
  drained(): Promise<void>;
  /** The reader went away (a closed pipe, as after `| head`): nothing more is wanted. */
  closed(): boolean;
}

/** Text handed to the sink at once, at most about this much (one write per value is too many). */
const CHUNK_CHARS = 64 * 1024;

/**
 * `dump` as the CLI runs it: each value is written as the scan reads it, so a table of any
 * size takes the memory of one page of its scan and one chunk of output, not of the whole
 * table (the collected form, `dumpCommand`, held every value, and `--json` the whole
 * array's text on top). The output is byte for byte what `dumpCommand` gives and the CLI
 * prints: the text, then `target` on its own line (`  (target)`); or with `json` the same
 * array as `JSON.stringify(cells, null, 2)`. It waits whenever the sink is full, and stops
 * reading when the sink has closed (exit code as if it had finished: the reader chose to
 * stop). Nothing is written before the first value is found, so "no committed values"
 * stays a NotFoundError with empty output. A failure after some output leaves that output
 * cut short (the JSON array unterminated, so no script takes it for a whole one).
 */
export async function dumpTo(
  store: RowStore,
  args: DumpArgs,
  sink: DumpSink,
  options: { readonly json: boolean; readonly target: string },
): Promise<ExitCode> {
  let chunk = '';
  /** Whether the output ever made the dump wait (a reader slower than the scan). */
  let waited = false;
  const flush = async () => {
    if (chunk.length === 0) return;
    const ok = sink.write(chunk);
    chunk = '';
    if (!ok) {
      waited = true;
      await sink.drained();
    }
  };
  let values = 0;
  let rows = 0;
  let lastRow: string | undefined;
  try {
    for await (const c of readCommitted(store, args.table, readOptions(args))) {
      const cell: DumpedCell = { row: c.row, column: c.column, ...showValue(c.value) };
      if (options.json) {
        // An element of JSON.stringify(cells, null, 2): its own text, indented one level.
        chunk += `${values === 0 ? '[\n' : ',\n'}  ${JSON.stringify(cell, null, 2).replaceAll('\n', '\n  ')}`;
      } else {
        if (values === 0) chunk += `${header(args.table)}\n`;
        if (cell.row !== lastRow) {
          rows++;
          lastRow = cell.row;
          chunk += `${shown(cell.row)}\n`;
        }
        chunk += `${cellLine(cell, args.full)}\n`;
      }
      values++;
      if (chunk.length >= CHUNK_CHARS) {
        await flush();
        if (sink.closed()) return EXIT.ok;
      }
    }
  } catch (error) {
    // Its one snapshot lasts as long as the output: a reader that stopped reading (a paused
    // pager) for longer than the writers keep history lets it be pruned (found in review).
    // Only a dump whose output made it wait gets the pager's hint; its history can also go
    // to a cell's version cap (gc.maxVersionsPerCell newer commits), whatever the time (review).
    if (error instanceof SnapshotTooOldError && values > 0)
      throw new SnapshotTooOldError(
        waited
          ? `${error.message} (the dump reads one snapshot while it writes, and its output waited: the writers pruned history it still needed, after gc.retentionMs or gc.maxVersionsPerCell newer commits of a cell; dump to a file, then read that)`
          : `${error.message} (the dump reads one snapshot while it writes, and the writers pruned history it still needed, after gc.retentionMs or gc.maxVersionsPerCell newer commits of a cell: run it again)`,
      );
    throw error;
  }
  if (values === 0) throw noValues(args);
  chunk += options.json ? '\n]\n' : `${summary(rows, values)}\n  (${options.target})\n`;
  await flush();
  return EXIT.ok;
}

function noValues(args: DumpArgs): NotFoundError {
  return new NotFoundError(
    args.row === undefined
      ? `table ${shown(args.table)} has no committed values`
      : `row ${shown(args.row)} of ${shown(args.table)} has no committed values`,
  );
}
