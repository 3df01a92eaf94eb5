/**
 * percolator-conformance dump TABLE --backend B [--url URL] [--namespace NS] [--row KEY] [--limit N] [--json]
 * percolator-conformance inspect TABLE ROW --backend B [--url URL] [--namespace NS] [--json]
 *
 * The read-only way to see what a store holds, with the library's own decoder:
 *
 * - `dump` prints the latest committed value of every column of every row of TABLE (or of
 *   one row), read through a Percolator snapshot transaction (`tx.scan` / `tx.get`), so a
 *   lock is resolved exactly as any reader resolves it and an uncommitted value is never
 *   shown. The transaction is rolled back, never committed: it writes no data. Like every
 *   reader it draws a start timestamp from the store's counter, and a lock whose owner is
 *   gone is rolled back or forward as the protocol says (docs/protocol.md section 5).
 * - `inspect` prints the decoded head row of one row (`inspectHeadRow` from core): locks
 *   with their primary and age, write records with commit and start timestamps and where
 *   each value lives, inline bytes, garbage, notifications. It only reads that one row.
 *
 * Neither command can write a value: there is no code path here that builds a write.
 * Stores are opened without creating anything (SQL `createSchema: false`, DynamoDB
 * `createTable` off), and a table or row that holds nothing is reported before any
 * timestamp is drawn.
 *
 * Exit codes: 0 done; 1 the table, row or namespace holds nothing; 2 bad usage or the
 * store could not be reached (or failed).
 */
import { parseArgs } from 'node:util';
import {
  compareKeys,
  type HeadRowView,
  inspectHeadRow,
  isReservedColumn,
  LockNotResolvedError,
  Percolator,
  type RowStore,
  UnsupportedOperationError,
  validateRowKey,
  validateUserTable,
  versionRowRef,
} from '@percolator/core';
import { BACKENDS, type BackendName, connect } from './backends.js';
import { NAMESPACE_NAME, openNamespaceAdmin } from './namespaces.js';

export const DUMP_COMMANDS = ['dump', 'inspect'] as const;
export type DumpCommand = (typeof DUMP_COMMANDS)[number];

const BACKEND_LIST = BACKENDS.filter((b) => b !== 'memory').join('|');
export const DUMP_USAGE = `usage: percolator-conformance dump TABLE --backend <${BACKEND_LIST}> [--url URL]
                [--namespace NS] [--row KEY] [--limit N] [--json]
       percolator-conformance inspect TABLE ROW --backend <${BACKEND_LIST}> [--url URL]
                [--namespace NS] [--json]
Read-only views of a namespace's data (they never write a value):
  dump      the latest committed value of every column of every row of TABLE (or of one
            row with --row), read through a Percolator snapshot transaction that is never
            committed. Values print as UTF-8 text when they are valid UTF-8, else as hex.
            An uncommitted lock's value is never shown: a lock is resolved exactly as any
            reader resolves it (an abandoned one is rolled back or forward by the protocol,
            never overwritten), and the start timestamp is drawn from the store's counter.
  inspect   the decoded head row of TABLE/ROW as stored: locks (primary, age), write records
            (commit and start timestamps, where each value lives), inline bytes, garbage,
            notifications. Reads that one row and nothing else.
  --url URL        connection URL as for a conformance run (dynamodb: the endpoint, required
                   unless PERCOLATOR_DYNAMODB_ENDPOINT is set)
  --namespace NS   the namespace to read (default percolator, the adapters' default)
  --row KEY        dump only this row (needed on a store that cannot scan in key order)
  --limit N        dump at most N rows
  --region R       DynamoDB region      --table T   DynamoDB table name (default percolator_test)
  --json           dump: one JSON object per line, {row, column, value, encoding}
                   (encoding "utf8" or "hex"); inspect: the decoded row as one JSON document
Exit codes: 0 done, 1 no such table, row or namespace (nothing there), 2 bad usage or store
unreachable.`;

class UsageError extends Error {}

export interface DumpArgs {
  readonly command: DumpCommand;
  readonly table: string;
  readonly row?: string;
  readonly backend: Exclude<BackendName, 'memory'>;
  readonly url?: string;
  readonly namespace?: string;
  readonly region?: string;
  readonly dynamoTable?: string;
  readonly limit?: number;
  readonly json: boolean;
}

/** Whether argv asks for `dump` or `inspect` (its first word). */
export function isDumpCommand(argv: readonly string[]): boolean {
  const first = argv.find((a) => a !== '--');
  return first !== undefined && (DUMP_COMMANDS as readonly string[]).includes(first);
}

function checked<T>(check: () => T): T {
  try {
    return check();
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
}

export function parseDumpArgs(argv: readonly string[]): DumpArgs | 'help' {
  let values: Record<string, string | boolean | undefined>;
  let positionals: string[];
  try {
    ({ values, positionals } = parseArgs({
      args: argv.filter((a) => a !== '--'),
      allowPositionals: true,
      options: {
        backend: { type: 'string' },
        url: { type: 'string' },
        namespace: { type: 'string' },
        row: { type: 'string' },
        limit: { type: 'string' },
        region: { type: 'string' },
        table: { type: 'string' },
        json: { type: 'boolean' },
        help: { type: 'boolean', short: 'h' },
      },
    }));
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
  if (values.help === true) return 'help';
  const [command, ...rest] = positionals as [DumpCommand, ...string[]];
  let table: string;
  let row: string | undefined;
  if (command === 'dump') {
    if (rest.length !== 1) throw new UsageError('dump takes exactly one TABLE');
    table = rest[0]!;
    row = values.row as string | undefined;
  } else {
    if (rest.length !== 2) throw new UsageError('inspect takes exactly TABLE and ROW');
    if (values.row !== undefined) throw new UsageError('inspect takes the row as its second word, not --row');
    if (values.limit !== undefined) throw new UsageError('--limit is for dump');
    [table, row] = rest as [string, string];
  }
  checked(() => validateUserTable(table));
  if (row !== undefined) checked(() => validateRowKey(row));
  const namespace = values.namespace as string | undefined;
  if (namespace !== undefined && !NAMESPACE_NAME.test(namespace))
    throw new UsageError(
      `not a namespace name: ${JSON.stringify(namespace)} (a lowercase letter, then up to 31 of [a-z0-9_])`,
    );
  let limit: number | undefined;
  if (values.limit !== undefined) {
    limit = Number(values.limit);
    if (!Number.isInteger(limit) || limit < 1) throw new UsageError('--limit must be a positive integer');
  }
  const backend = String(values.backend ?? '');
  if (backend === 'memory')
    throw new UsageError(
      'the memory store lives inside one process: there is nothing to read from outside it ' +
        '(in code, use dumpTable / inspectRow from @percolator/conformance)',
    );
  if (!BACKENDS.includes(backend as BackendName))
    throw new UsageError(`--backend must be one of ${BACKEND_LIST.split('|').join(', ')}`);
  return {
    command,
    table,
    row,
    backend: backend as DumpArgs['backend'],
    url: values.url as string | undefined,
    namespace,
    region: values.region as string | undefined,
    dynamoTable: values.table as string | undefined,
    limit,
    json: values.json === true,
  };
}

// ---------------------------------------------------------------------------------------
// Reading (exported: these work on any RowStore, the in-process memory store included)

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

/** No committed value to show: the table, row (or namespace) holds nothing. */
export class NothingThereError extends Error {
  override readonly name = 'NothingThereError';
}

/**
 * The latest committed value of every column of the rows of `table` (or of one row), in
 * key order, read through one Percolator snapshot transaction that is rolled back, never
 * committed. Reserved (observer) columns are left out, as `tx.scan` leaves them out.
 *
 * Before drawing any timestamp it checks, with one plain store read, that the table (or
 * row) holds a stored row at all, and throws NothingThereError if not: so asking for a
 * table or namespace that is not there adds nothing to the store, not even a counter.
 * Throws UnsupportedOperationError (from core) without `row` on a store that cannot scan
 * in key order.
 */
export async function* readCommitted(
  store: RowStore,
  table: string,
  options: ReadCommittedOptions = {},
): AsyncGenerator<{ row: string; column: string; value: Uint8Array }> {
  validateUserTable(table);
  const { row, limit } = options;
  if (row !== undefined) validateRowKey(row);
  if (row === undefined && (!store.capabilities.orderedScan || !store.scan)) {
    // Said before anything is read (tx.scan would say it after drawing a timestamp).
    throw new UnsupportedOperationError(
      `store "${store.name}" cannot scan rows in key order: pass --row KEY to read one row`,
    );
  }
  // Plain reads: nothing is written if there is nothing to show.
  const exists =
    row === undefined
      ? (await store.scan!(table, { limit: 1 })).length > 0
      : (await store.read(table, row)) !== null;
  if (!exists)
    throw new NothingThereError(
      row === undefined
        ? `table ${table} holds no rows`
        : `row ${JSON.stringify(row)} of ${table} is not stored`,
    );
  const db = new Percolator({ store });
  // begin() draws the start timestamp now: every commit below it has its locks or records
  // in the head rows read after this point.
  const tx = await db.begin();
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
    const columns = inspectHeadRow(stored.state)
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

/**
 * Every committed value `readCommitted` finds, shown as text or hex. Throws
 * NothingThereError when there is none (no such table or row, or only deleted values).
 */
export async function dumpTable(
  store: RowStore,
  table: string,
  options: ReadCommittedOptions = {},
): Promise<DumpedCell[]> {
  const cells: DumpedCell[] = [];
  for await (const c of readCommitted(store, table, options))
    cells.push({ row: c.row, column: c.column, ...showValue(c.value) });
  if (cells.length === 0)
    throw new NothingThereError(
      options.row === undefined
        ? `table ${table} has no committed values`
        : `row ${JSON.stringify(options.row)} of ${table} has no committed values`,
    );
  return cells;
}

/** One head row as stored, decoded: the `inspect` command's data. */
export interface InspectedRow {
  readonly table: string;
  readonly row: string;
  /** The store's version token of the head row. */
  readonly version: string;
  /** Size of the encoded head row. */
  readonly stateBytes: number;
  /** Wall clock (ms) the lock ages are measured against. */
  readonly nowMs: number;
  readonly cells: readonly InspectedCell[];
}

type CellView = HeadRowView['cells'][number];

export interface InspectedCell extends Omit<CellView, 'lock' | 'writes'> {
  readonly lock?: NonNullable<CellView['lock']> & {
    /** nowMs minus the lock's wall time (prewrite or last heartbeat). */
    readonly ageMs: number;
    /** Whether ageMs is past the lock's ttlMs: a reader would resolve it now. */
    readonly expired: boolean;
  };
  readonly writes: readonly (CellView['writes'][number] & {
    /** For a value in a version row (`moving`, `moved`): that row's table and key. */
    readonly versionRow?: { readonly table: string; readonly key: string };
  })[];
}

/** The decoded head row of table/row (one plain read), or undefined when it is not stored. */
export async function inspectRow(
  store: RowStore,
  table: string,
  row: string,
  now: () => number = Date.now,
): Promise<InspectedRow | undefined> {
  validateUserTable(table);
  validateRowKey(row);
  const stored = await store.read(table, row);
  if (stored === null) return undefined;
  const view = inspectHeadRow(stored.state);
  const nowMs = now();
  return {
    table,
    row,
    version: stored.version,
    stateBytes: stored.state.length,
    nowMs,
    cells: view.cells.map((cell) => {
      const { lock, writes, ...rest } = cell;
      return {
        ...rest,
        ...(lock
          ? {
              lock: {
                ...lock,
                ageMs: nowMs - lock.wallTimeMs,
                expired: nowMs - lock.wallTimeMs > lock.ttlMs,
              },
            }
          : {}),
        writes: writes.map((w) =>
          w.kind === 'put' && w.value !== 'inline'
            ? { ...w, versionRow: versionRowRef(table, row, cell.column, w.startTs) }
            : w,
        ),
      };
    }),
  };
}

// ---------------------------------------------------------------------------------------
// Text output

/** A name as typed: bare when plain, else a JSON string (NUL, spaces, quotes visible). */
function shown(text: string): string {
  return /^[\w.:@/+-]+$/u.test(text) ? text : JSON.stringify(text);
}

function cellText(c: DumpedCell): string {
  return c.encoding === 'utf8' ? JSON.stringify(c.value) : `0x${c.value}`;
}

function ago(ms: number): string {
  if (ms < 0) return `${-ms} ms in the future`;
  if (ms < 10_000) return `${ms} ms ago`;
  return `${(ms / 1000).toFixed(1)} s ago`;
}

function rowRef(r: { table: string; row: string }): string {
  return `${r.table}/${shown(r.row)}`;
}

export function formatInspected(r: InspectedRow): string {
  const lines = [
    `${rowRef(r)}: head row version ${r.version}, ${r.stateBytes} bytes, ${r.cells.length} cell${r.cells.length === 1 ? '' : 's'}`,
  ];
  for (const c of r.cells) {
    lines.push(
      `  column ${shown(c.column)}${isReservedColumn(c.column) ? '  (reserved: observer ack)' : ''}`,
    );
    if (c.lock) {
      const l = c.lock;
      const primary = `${l.primary.table}/${shown(l.primary.row)}/${shown(l.primary.column)}`;
      lines.push(
        `    lock      startTs ${l.startTs}, ${l.kind}, primary ${primary}${
          l.primary.table === r.table && l.primary.row === r.row && l.primary.column === c.column
            ? ' (this cell)'
            : ''
        }, ttl ${l.ttlMs} ms, written ${ago(l.ageMs)}${l.expired ? ' (expired)' : ''}`,
      );
      if (l.secondaries?.length)
        lines.push(`              secondaries: ${l.secondaries.map((s) => rowRef(s)).join(', ')}`);
    }
    if (c.writes.length === 0) lines.push('    writes    none');
    for (const w of c.writes) {
      let where = '';
      if (w.kind === 'put') {
        where = `, value ${w.value}`;
        if (w.inlineBytes !== undefined) where += ` (${w.inlineBytes} bytes in the head row)`;
        if (w.versionRow) where += ` -> version row ${w.versionRow.table} ${shown(w.versionRow.key)}`;
      }
      lines.push(
        `    write     commitTs ${w.commitTs}, startTs ${w.startTs}, ${w.kind}${where}, at ${new Date(w.wallTimeMs).toISOString()}`,
      );
      if (w.secondaries?.length)
        lines.push(`              secondaries: ${w.secondaries.map((s) => rowRef(s)).join(', ')}`);
    }
    const extra = [`inline ${c.inlineBytes} bytes`];
    if (c.prunedThrough > 0) extra.push(`pruned through ${c.prunedThrough}`);
    if (c.notifyTs > 0) extra.push(`notification at ${c.notifyTs}`);
    if (c.garbage.length > 0) extra.push(`garbage (version rows to delete) ${c.garbage.join(', ')}`);
    const acks = Object.entries(c.acks);
    if (acks.length > 0) extra.push(`acks ${acks.map(([o, ts]) => `${o}=${ts}`).join(', ')}`);
    lines.push(`    ${extra.join('; ')}`);
  }
  return lines.join('\n');
}

// ---------------------------------------------------------------------------------------
// Opening a store to read (never creating anything)

/** A store opened for reading, and how to let go of it. */
export interface OpenedStore {
  readonly store: RowStore;
  /** Where it connects, with any password hidden. */
  readonly target: string;
  readonly namespace: string;
  close(): Promise<void>;
}

const DEFAULT_NAMESPACE = 'percolator';

export async function openStoreForReading(args: DumpArgs): Promise<OpenedStore> {
  const namespace = args.namespace ?? DEFAULT_NAMESPACE;
  if (args.backend === 'dynamodb' && connect.configuredUrl('dynamodb', { url: args.url }) === undefined) {
    // A DynamoDB Local started for this command would be empty.
    throw new UsageError('dynamodb: pass --url (the endpoint) or set PERCOLATOR_DYNAMODB_ENDPOINT');
  }
  // create: false: a missing namespace or table is an error, never created here.
  const opened = await connect.openStore(args.backend, {
    ...(args.url === undefined ? {} : { url: args.url }),
    ...(args.region === undefined ? {} : { region: args.region }),
    ...(args.dynamoTable === undefined ? {} : { table: args.dynamoTable }),
    namespace,
    create: false,
    maxConnections: 2,
  });
  return {
    store: opened.store,
    target: opened.target,
    namespace,
    close: () => opened.close(),
  };
}

/**
 * After a failed open: whether the server answers and simply has no such namespace (a SQL
 * store opened without creating its schema fails on a namespace that is not there).
 */
async function namespaceMissing(args: DumpArgs, namespace: string): Promise<boolean> {
  try {
    const admin = await openNamespaceAdmin({
      command: 'namespaces',
      backend: args.backend,
      url: args.url,
      region: args.region,
      table: args.dynamoTable,
      yes: false,
      json: false,
    });
    try {
      return !(await admin.list()).some((l) => l.namespace === namespace);
    } finally {
      await admin.close().catch(() => undefined);
    }
  } catch {
    return false;
  }
}

// ---------------------------------------------------------------------------------------
// The commands

export interface DumpIo {
  readonly out: (text: string) => void;
  readonly err: (text: string) => void;
  /** Replaces openStoreForReading (tests). */
  readonly openStore?: (args: DumpArgs) => Promise<OpenedStore>;
}

/** Runs `dump` or `inspect`; resolves to the exit code (0 done, 1 nothing there, 2 usage / store). */
export async function runDumpCli(argv: readonly string[], io: DumpIo): Promise<number> {
  let args: DumpArgs | 'help';
  try {
    args = parseDumpArgs(argv);
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    io.err(`${error.message}\n\n${DUMP_USAGE}\n`);
    return 2;
  }
  if (args === 'help') {
    io.out(`${DUMP_USAGE}\n`);
    return 0;
  }
  let opened: OpenedStore;
  try {
    opened = await (io.openStore ?? openStoreForReading)(args);
  } catch (error) {
    if (error instanceof UsageError) {
      io.err(`${error.message}\n\n${DUMP_USAGE}\n`);
      return 2;
    }
    const namespace = args.namespace ?? DEFAULT_NAMESPACE;
    if (
      (args.backend === 'postgres' || args.backend === 'mysql') &&
      (await namespaceMissing(args, namespace))
    ) {
      io.err(`namespace ${namespace} not found on ${args.backend}; nothing to read\n`);
      return 1;
    }
    io.err(`cannot open backend ${args.backend}: ${(error as Error).message}\n`);
    return 2;
  }
  const where = `namespace ${opened.namespace} on ${args.backend} at ${opened.target}`;
  try {
    return args.command === 'dump'
      ? await dump(args, opened, where, io)
      : await inspect(args, opened, where, io);
  } catch (error) {
    if (error instanceof NothingThereError) {
      io.err(`${error.message} (${where})\n`);
      return 1;
    }
    if (error instanceof UsageError) {
      io.err(`${error.message}\n`);
      return 2;
    }
    const hint =
      error instanceof LockNotResolvedError
        ? '\n  (a live transaction holds a lock: `percolator-conformance inspect TABLE ROW` shows it as stored)'
        : '';
    io.err(`${args.command} failed on ${where}: ${(error as Error).message}${hint}\n`);
    return 2;
  } finally {
    await opened.close().catch(() => undefined);
  }
}

async function dump(args: DumpArgs, opened: OpenedStore, where: string, io: DumpIo): Promise<number> {
  let count = 0;
  let lastRow: string | undefined;
  let rows = 0;
  for await (const c of readCommitted(opened.store, args.table, { row: args.row, limit: args.limit })) {
    const cell: DumpedCell = { row: c.row, column: c.column, ...showValue(c.value) };
    if (count === 0 && !args.json) io.out(`${args.table} in ${where} (latest committed values)\n`);
    count++;
    if (cell.row !== lastRow) {
      rows++;
      lastRow = cell.row;
      if (!args.json) io.out(`${shown(cell.row)}\n`);
    }
    io.out(args.json ? `${JSON.stringify(cell)}\n` : `  ${shown(cell.column)}  ${cellText(cell)}\n`);
  }
  if (count === 0)
    throw new NothingThereError(
      args.row === undefined
        ? `table ${args.table} has no committed values`
        : `row ${JSON.stringify(args.row)} of ${args.table} has no committed values`,
    );
  if (!args.json) io.out(`${rows} row${rows === 1 ? '' : 's'}, ${count} value${count === 1 ? '' : 's'}\n`);
  return 0;
}

async function inspect(args: DumpArgs, opened: OpenedStore, where: string, io: DumpIo): Promise<number> {
  const row = args.row!;
  const inspected = await inspectRow(opened.store, args.table, row);
  if (inspected === undefined)
    throw new NothingThereError(`row ${JSON.stringify(row)} of ${args.table} is not stored`);
  if (args.json) io.out(`${JSON.stringify({ namespace: opened.namespace, ...inspected }, null, 2)}\n`);
  else io.out(`${formatInspected(inspected)}\n  (${where})\n`);
  return 0;
}
