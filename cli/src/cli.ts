/**
 * percolator <command> [arguments] [connection options]
 *
 * The operator CLI (docs/operations.md). In this repository: `pnpm percolator -- <command>`
 * (builds first). Commands: inspect, locks, resolve, notifications, gc. Every command
 * takes --help. Exit codes: see errors.ts.
 */
import { realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import type { NamespaceAdmin } from '@percolator/connect';
import {
  CorruptRowError,
  InvalidArgumentError,
  LockNotResolvedError,
  type RowStore,
  UnsupportedOperationError,
  validateRowKey,
  validateUserTable,
} from '@percolator/core';
import {
  type CommandResult,
  gcCommand,
  inspectCommand,
  locksCommand,
  notificationsCommand,
  resolveCommand,
} from './commands.js';
import { type DumpSink, dumpTo } from './dump.js';
import { EXIT, type ExitCode, IncompleteError, NotFoundError, UsageError } from './errors.js';
import { parseDuration } from './format.js';
import { dropNamespaceCommand, namespacesCommand } from './namespaces.js';
import {
  BACKENDS,
  type BackendName,
  dynamoTableNotFound,
  loadCompositeConfig,
  NamespaceNotFoundError,
  type OpenedStore,
  openBackend,
  openComposite,
  openNamespaceAdmin,
  UnreachableError,
} from './open.js';

const CONNECTION = `Connection (every command):
  --backend B        ${BACKENDS.join(', ')}
  --url URL          postgres://, mysql://, redis://; redis-cluster: host:port,host:port;
                     dynamodb: the endpoint. Default: PERCOLATOR_POSTGRES_URL, PERCOLATOR_MYSQL_URL,
                     PERCOLATOR_REDIS_URL, PERCOLATOR_REDIS_CLUSTER_NODES, PERCOLATOR_DYNAMODB_ENDPOINT,
                     else the adapter's local default (DynamoDB: AWS itself)
  --namespace NS     the deployment's namespace (default percolator, the adapters' default)
  --config FILE      a composite deployment (JSON: stores, routes, default, counterStore), instead
                     of --backend/--url; see docs/operations.md
  --region R, --dynamodb-table T   DynamoDB region and table (default percolator_test)
  --json             print the result as JSON
  -h, --help         this text, or a command's own with \`percolator <command> --help\``;

const NAMES = `Names: a table, row or column name that is not plain (NUL, spaces, quotes, emoji, ...)
prints as a JSON string, e.g. "a\\u0000😀". To pass one back exactly as printed, add
  --json-names   every TABLE, ROW, --row and --column is then a JSON string literal, plain
                 names too: percolator inspect --json-names '"accounts"' '"a\\u0000😀"'
Without it every name is taken as typed, quotes and backslashes included.`;

const EXITS = `Exit codes: 0 done, nothing wrong; 1 a problem found or left (locks listed, a live lock
not settled or waited out, commit records gc could not settle, a row that cannot be decoded);
2 bad usage; 3 store unreachable or failing; 4 not there (no such row, a table with no rows,
no such namespace).`;

interface CommandSpec {
  readonly usage: string;
  readonly about: string;
  readonly positionals: { min: number; max: number };
  readonly options: Record<string, { type: 'string' | 'boolean' }>;
  /**
   * The command takes table and row names (its positionals, and --row / --column): it
   * accepts --json-names, which reads every one of them as a JSON string literal.
   */
  readonly takesNames?: boolean;
  /** Checks the arguments before anything is opened (UsageError). */
  check?(positionals: string[], values: Values): void;
  /** A command on one namespace's data. */
  run?(store: RowStore, positionals: string[], values: Values): Promise<CommandResult>;
  /**
   * The same, for a command that writes its output as it goes (dump): it prints everything,
   * `--json` or text with the target line, and returns the exit code.
   */
  stream?(
    store: RowStore,
    positionals: string[],
    values: Values,
    output: { sink: DumpSink; json: boolean; target: string },
  ): Promise<ExitCode>;
  /** A command on a backend's catalog of namespaces (no --namespace, no --config). */
  runAdmin?(admin: NamespaceAdmin, positionals: string[], values: Values): Promise<CommandResult>;
}

type Values = Record<string, string | boolean | undefined>;

/**
 * What the value of each option that takes a number is: a duration, or an integer with its
 * least value. One table for the commands' own checks and for the message of a value
 * parseArgs refused (parseErrorMessage), which kept a second list of them.
 */
const NUMBER_OPTIONS: Readonly<Record<string, 'duration' | { readonly min: number }>> = {
  'older-than': 'duration',
  wait: 'duration',
  retention: 'duration',
  limit: { min: 1 },
  'max-versions': { min: 1 },
  'inline-history-bytes': { min: 0 },
};

/** The option's value as its kind in NUMBER_OPTIONS says; UsageError if it is not one. */
function numberOption(values: Values, name: string): number | undefined {
  const kind = NUMBER_OPTIONS[name];
  if (kind === undefined) throw new Error(`internal: --${name} is not in NUMBER_OPTIONS`);
  return kind === 'duration' ? durationOption(values, name) : integerOption(values, name, kind.min);
}

function durationOption(values: Values, name: string): number | undefined {
  const v = values[name];
  if (v === undefined) return undefined;
  try {
    return parseDuration(String(v));
  } catch (error) {
    throw new UsageError(`--${name}: ${(error as Error).message}`);
  }
}

function integerOption(values: Values, name: string, min: number): number | undefined {
  const v = values[name];
  if (v === undefined) return undefined;
  // Digits only: Number() would take '' as 0, '0x10' as 16 and '1e1' as 10.
  const text = String(v).trim();
  const n = /^\d+$/.test(text) ? Number(text) : Number.NaN;
  if (!Number.isSafeInteger(n) || n < min) {
    throw new UsageError(
      `--${name} must be an integer >= ${min} (digits only), got ${JSON.stringify(String(v))}`,
    );
  }
  return n;
}

/** Table and row names as the library accepts them (never reaching a query as text). */
function names(table: string, row?: string): void {
  try {
    validateUserTable(table);
    if (row !== undefined) validateRowKey(row);
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
}

export const COMMANDS: Record<string, CommandSpec> = {
  inspect: {
    usage: 'percolator inspect TABLE ROW [--json-names] [connection options]',
    about: `One row as stored, decoded: each cell's versions (commit and start timestamps, wall
times, sizes, where each value lives), its lock (owner start timestamp, primary, age
against its TTL, and the owner transaction's fate as the primary says), pending
notification and observer acks. Reads that row (and the primaries of its locks) only.
A primary's commit record lists its secondaries until the cell's next write, settled or
not: \`locks TABLE\` shows whether any is still locked.
Exit 4 if the row is not stored.`,
    positionals: { min: 2, max: 2 },
    options: { 'json-names': { type: 'boolean' } },
    takesNames: true,
    check: ([table, row]) => names(table!, row),
    run: (store, [table, row]) => inspectCommand(store, { table: table!, row: row! }),
  },
  locks: {
    usage: 'percolator locks TABLE [--older-than DURATION] [--json-names] [connection options]',
    about: `Every lock in TABLE (a walk over its rows), each with its transaction's fate as its
primary says: committed at ts, rolled back, or pending (owner live, or presumed dead:
its primary's lock past its TTL, and the next reader rolls it back). A secondary lock
is as live as its primary's, which the owner's heartbeat refreshes. Reads only.
  --older-than D   only locks at least this old (30s, 5m, 500ms)
Exit 0 if none, 1 if any lock is listed (for monitoring), 4 if TABLE holds no rows.`,
    positionals: { min: 1, max: 1 },
    options: { 'json-names': { type: 'boolean' }, 'older-than': { type: 'string' } },
    takesNames: true,
    check: ([table], values) => {
      names(table!);
      numberOption(values, 'older-than');
    },
    run: (store, [table], values) =>
      locksCommand(store, { table: table!, olderThanMs: numberOption(values, 'older-than') }),
  },
  resolve: {
    usage: 'percolator resolve TABLE ROW [--wait DURATION] [--json-names] [connection options]',
    about: `Settles the locks in one row exactly as a reader that met them would: the primary
decides; a committed transaction's lock is rolled forward, one that did not commit (or
whose owner is presumed dead: its lock past its TTL) is rolled back. It never decides a
fate itself and never breaks a live lock: a committing client refreshes its lock, so only
a dead client's lock expires. Prints what it did, per lock.
  --wait D   wait up to D for live locks to be released or to expire, as a reader waits
             (default: report them and stop)
A lock still live after --wait is reported with how long it waited: run again with a
longer --wait, or after its TTL. Other rows the same transaction locked are settled when
read, or with resolve on them (inspect lists them as the primary's secondaries, kept until
its next write, settled or not; locks TABLE shows those still locked).
Exit 0 if every lock is settled (or there was none), 1 if a live lock was left, 4 if the
row is not stored.`,
    positionals: { min: 2, max: 2 },
    options: { 'json-names': { type: 'boolean' }, wait: { type: 'string' } },
    takesNames: true,
    check: ([table, row], values) => {
      names(table!, row);
      numberOption(values, 'wait');
    },
    run: (store, [table, row], values) =>
      resolveCommand(store, { table: table!, row: row!, waitMs: numberOption(values, 'wait') }),
  },
  notifications: {
    usage:
      'percolator notifications TABLE... [--observer NAME] [--column C] [--json-names] [connection options]',
    about: `Pending notifications per observed column of each TABLE, with the oldest change not yet
handled (its row, its age, its notification timestamp): what observer workers still have to
do. Found through the store's notification index. Stores keep no table list: name the
observed tables.
--json: oldest.sinceMs is the oldest change's wall time (epoch ms), oldest.ageMs its age.
  --observer NAME   only what observer NAME has not handled yet (its ack is older than the
                    cell's newest write: the test a run makes before calling its handler).
                    The store does not know which columns it watches: every notified
                    column counts unless --column names its own
  --column C        only column C
Exit 0 (with or without a backlog), 4 if a TABLE holds no rows (the others are still shown).`,
    positionals: { min: 1, max: Number.POSITIVE_INFINITY },
    options: { 'json-names': { type: 'boolean' }, observer: { type: 'string' }, column: { type: 'string' } },
    takesNames: true,
    check: (tables) => {
      for (const t of tables) names(t);
    },
    run: (store, tables, values) =>
      notificationsCommand(store, {
        tables,
        ...(values.observer === undefined ? {} : { observer: String(values.observer) }),
        ...(values.column === undefined ? {} : { column: String(values.column) }),
      }),
  },
  dump: {
    usage: 'percolator dump TABLE [--row KEY] [--limit N] [--full] [--json-names] [connection options]',
    about: `The latest committed value of every column of every row of TABLE (or of one row),
read through a Percolator snapshot transaction that is rolled back, never committed. Values
print as JSON strings when they are valid UTF-8, else as 0x and hex. An uncommitted value is
never shown: a lock is handled exactly as any reader handles it (one whose owner is gone is
rolled back or forward through its primary), and the snapshot comes from the store's
counter as a read-only transaction's does (peeked where the store can, writing nothing;
else drawn).
  --row KEY   only this row
  --limit N   at most N rows
  --full      print long values whole: the text shows a value's first 256 bytes, then
              "... (cut: first 256 of N bytes; --full prints it whole)". --json always
              has whole values (it is for scripts)
Exit 0 done, 4 if the table or row holds no committed value.`,
    positionals: { min: 1, max: 1 },
    options: {
      'json-names': { type: 'boolean' },
      row: { type: 'string' },
      limit: { type: 'string' },
      full: { type: 'boolean' },
    },
    takesNames: true,
    check: ([table], values) => {
      names(table!, values.row === undefined ? undefined : String(values.row));
      numberOption(values, 'limit');
    },
    stream: (store, [table], values, { sink, json, target }) =>
      dumpTo(
        store,
        {
          table: table!,
          ...(values.row === undefined ? {} : { row: String(values.row) }),
          ...(values.limit === undefined ? {} : { limit: numberOption(values, 'limit')! }),
          full: values.full === true,
        },
        sink,
        { json, target },
      ),
  },
  namespaces: {
    usage: 'percolator namespaces --backend B [--url URL] [--json]',
    about: `The namespaces a store holds, from its own catalog (SQL tables by the adapters' naming
rule, Redis keys by SCAN, DynamoDB partition keys by Scan), each with what it holds.
Exit 0 done.`,
    positionals: { min: 0, max: 0 },
    options: {},
    runAdmin: (admin) => namespacesCommand(admin),
  },
  'drop-namespace': {
    usage: 'percolator drop-namespace NAME --backend B [--url URL] --yes',
    about: `Drops every row of one namespace, for every client using it. Without --yes it only says
what it would drop (exit 1).
  --yes   really drop
Exit 0 dropped, 1 refused without --yes, 4 no such namespace.`,
    positionals: { min: 1, max: 1 },
    options: { yes: { type: 'boolean' } },
    runAdmin: (admin, [name], values) =>
      dropNamespaceCommand(admin, { name: name!, yes: values.yes === true }),
  },
  gc: {
    usage:
      'percolator gc TABLE [--dry-run] [--row KEY] [retention options] [--json-names] [connection options]',
    about: `Prunes old versions now, as far as the retention policy allows (the pruning a commit
does, docs/protocol.md section 7), and deletes the version rows that frees. A commit record
it prunes that still lists secondaries is settled first (their locks rolled forward); a
record that is still its cell's newest write is not pruned, so its secondaries are left to
readers or \`resolve\` (\`locks TABLE\` lists any still locked). Reports versions and bytes freed. Snapshots older than
the policy's safe point then fail with SnapshotTooOldError, as they would after any commit.
  --dry-run                 report what would be freed; write nothing
  --row KEY                 only this row
  --retention D             keep versions younger than D (the library's default: 60s)
  --max-versions N          keep at most N versions per cell (the library's default: 32)
  --inline-history-bytes N  (default 512)
A run that writes needs --retention and --max-versions: pass your clients' values (their
\`gc\` option). The CLI cannot know them, and a shorter policy makes their older snapshots
fail sooner. A dry run defaults to the library's. Exit 0 done, 1 if a real run left
records it would prune still held for their secondaries (one could not be settled: run
again), 4 if TABLE holds no rows (or ROW is not stored).`,
    positionals: { min: 1, max: 1 },
    options: {
      'json-names': { type: 'boolean' },
      'dry-run': { type: 'boolean' },
      row: { type: 'string' },
      retention: { type: 'string' },
      'max-versions': { type: 'string' },
      'inline-history-bytes': { type: 'string' },
    },
    takesNames: true,
    check: ([table], values) => {
      names(table!, values.row === undefined ? undefined : String(values.row));
      numberOption(values, 'retention');
      numberOption(values, 'max-versions');
      numberOption(values, 'inline-history-bytes');
      // Pruning is for good: the policy it prunes by is the deployment's, so it is stated.
      const missing = ['retention', 'max-versions'].filter((name) => values[name] === undefined);
      if (values['dry-run'] !== true && missing.length > 0) {
        throw new UsageError(
          `gc without --dry-run needs ${missing.map((n) => `--${n}`).join(' and ')}: pass your clients' gc policy (the library's defaults are --retention 60s --max-versions 32); a shorter one deletes history their snapshots still read`,
        );
      }
    },
    run: (store, [table], values) => {
      const retentionMs = numberOption(values, 'retention');
      const maxVersionsPerCell = numberOption(values, 'max-versions');
      const inlineHistoryBytes = numberOption(values, 'inline-history-bytes');
      return gcCommand(store, {
        table: table!,
        dryRun: values['dry-run'] === true,
        ...(values.row === undefined ? {} : { row: String(values.row) }),
        policy: {
          ...(retentionMs === undefined ? {} : { retentionMs }),
          ...(maxVersionsPerCell === undefined ? {} : { maxVersionsPerCell }),
          ...(inlineHistoryBytes === undefined ? {} : { inlineHistoryBytes }),
        },
      });
    },
  },
};

export const USAGE = `usage: percolator <command> [arguments] [connection options]
       (in this repository: pnpm percolator -- <command> ...)
Commands:
  inspect TABLE ROW                one row as stored: versions, locks and their fate, notifications
  locks TABLE [--older-than D]     every lock in a table, with its transaction's fate
  resolve TABLE ROW [--wait D]     settle a row's stuck locks exactly as a reader would
  notifications TABLE... [--observer NAME] [--column C]   pending notifications, oldest change per column
  gc TABLE [--dry-run]             prune what the retention policy allows; versions and bytes freed
  dump TABLE [--row KEY]           the latest committed values (a snapshot read; a lock whose owner is
                                   gone is settled as any reader would, so run inspect first)
  namespaces                       the namespaces a store holds
  drop-namespace NAME --yes        drop one namespace's data
${NAMES}
${CONNECTION}
${EXITS}`;

const CONNECTION_OPTIONS = {
  backend: { type: 'string' },
  url: { type: 'string' },
  namespace: { type: 'string' },
  config: { type: 'string' },
  region: { type: 'string' },
  'dynamodb-table': { type: 'string' },
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
} as const;

export interface CliIo {
  /** Writes to stdout; false (as a stream's write): wait for `drained` before writing more. */
  // biome-ignore lint/suspicious/noConfusingVoidType: a writer that returns nothing (never full) fits too
  readonly out: (text: string) => boolean | void;
  readonly err: (text: string) => void;
  /** Resolves when stdout takes more again, or has closed. Absent: it is never full. */
  readonly drained?: () => Promise<void>;
  /** Whether stdout's reader went away (a closed pipe). Absent: never. */
  readonly outClosed?: () => boolean;
  /** Replaces opening the store from the connection options (tests: an in-process store). */
  readonly openStore?: () => Promise<OpenedStore>;
  /** Replaces opening a backend's namespace catalog. */
  readonly openAdmin?: typeof openNamespaceAdmin;
}

const processIo: CliIo = {
  out: (text) => process.stdout.write(text),
  err: (text) => process.stderr.write(text),
  drained: () => drainedOrClosed(process.stdout),
  outClosed: () => process.stdout.destroyed || !process.stdout.writable,
};

/** Resolves on the stream's next 'drain', or when it closes or fails (a 'drain' then never comes). */
function drainedOrClosed(stream: NodeJS.WriteStream): Promise<void> {
  return new Promise((resolve) => {
    if (stream.destroyed || !stream.writable) return resolve();
    const done = () => {
      stream.off('drain', done).off('close', done).off('error', done);
      resolve();
    };
    stream.on('drain', done).on('close', done).on('error', done);
  });
}

function commandHelp(spec: CommandSpec): string {
  return `usage: ${spec.usage}\n${spec.about}\n${spec.takesNames ? `${NAMES}\n` : ''}${CONNECTION}\n${EXITS}`;
}

/**
 * A usage error as printed: the one line that says what is wrong, the command's usage line
 * and where the rest is (the whole help buried the error under 25 lines; found in review).
 */
function usageError(message: string, name: string, spec: CommandSpec): string {
  return `${message}\nusage: ${spec.usage}\nrun \`percolator ${name} --help\` for more\n`;
}

/** The arguments a command takes, as its usage line names them ("TABLE ROW"). */
function argumentsOf(spec: CommandSpec): string {
  const words = spec.usage.split(' ').slice(2);
  const end = words.findIndex((w) => w.startsWith('[') || w.startsWith('--'));
  return (end < 0 ? words : words.slice(0, end)).join(' ');
}

/**
 * What parseArgs refused, said in the CLI's words (its own messages name its internals:
 * "argument is ambiguous. Did you forget to specify the option argument..."). A value
 * that starts with "-" after an option is checked as that option's value would be, so
 * `--older-than -5s` says "not a duration" as `--older-than=-5s` does.
 */
function parseErrorMessage(error: unknown, name: string, spec: CommandSpec, args: readonly string[]): string {
  const options: Record<string, { type: string; short?: string }> = {
    ...CONNECTION_OPTIONS,
    ...spec.options,
  };
  for (const [i, arg] of args.entries()) {
    if (arg === '--') break;
    if (!arg.startsWith('--') || arg.includes('=')) continue;
    const option = arg.slice(2);
    const next = args[i + 1];
    if (options[option]?.type !== 'string' || next === undefined || !next.startsWith('-')) continue;
    if (next === '--' || next === '-h' || /^--[a-z]/.test(next))
      return `--${option} needs a value (the next argument, ${next}, is an option)`;
    const values = { [option]: next };
    try {
      if (option in NUMBER_OPTIONS) numberOption(values, option);
    } catch (e) {
      return (e as Error).message;
    }
    return `--${option} ${next}: a value that starts with "-" is written joined to its option, --${option}=${next}`;
  }
  const e = error as { code?: string; message?: string };
  const message = String(e?.message ?? error);
  const quoted = /'([^']*)'/.exec(message)?.[1] ?? '';
  if (e?.code === 'ERR_PARSE_ARGS_UNKNOWN_OPTION') {
    // parseArgs names the first letter of a word like "-dash" ("-d"): the hint names the word.
    const word = /^-[^-]$/.test(quoted)
      ? (args.find((a) => a.startsWith(quoted) && a !== '--') ?? quoted)
      : quoted;
    const dash = /^-[^-]|^--?\d/.test(quoted)
      ? ` (an argument that starts with "-" goes after "--", at the end: percolator ${name} ... -- ${word})`
      : '';
    return `unknown option ${word === quoted ? quoted : `${quoted} (in ${word})`} for ${name}${dash}`;
  }
  if (e?.code === 'ERR_PARSE_ARGS_INVALID_OPTION_VALUE') {
    const option = quoted.split(' ')[0]!;
    if (/argument missing/.test(message)) return `${option} needs a value`;
    if (/does not take an argument/.test(message)) return `${option} takes no value`;
  }
  return message;
}

/** The names given, as the command reads them: with --json-names, each parsed as a JSON string literal. */
function decodeNames(positionals: string[], values: Values, spec: CommandSpec): string[] {
  if (values['json-names'] !== true) return positionals;
  const what = argumentsOf(spec).split(' ');
  const decoded = positionals.map((p, i) =>
    jsonName(p, (what[Math.min(i, what.length - 1)] ?? 'TABLE').replace('...', '')),
  );
  for (const option of ['row', 'column']) {
    const v = values[option];
    if (typeof v === 'string') values[option] = jsonName(v, `--${option}`);
  }
  return decoded;
}

function jsonName(text: string, what: string): string {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    // reported below
  }
  if (typeof parsed !== 'string')
    throw new UsageError(
      `--json-names: ${what} must be a JSON string literal, in double quotes as the CLI prints names (e.g. '"accounts"', '"a\\u0000b"'), got ${JSON.stringify(text)}`,
    );
  return parsed;
}

/**
 * For a name not found: when one given without --json-names is itself a JSON string literal,
 * it was most likely copied from the CLI's output, and was taken with its quotes.
 */
function quotedNameHint(positionals: readonly string[], values: Values, spec: CommandSpec): string {
  if (!spec.takesNames || values['json-names'] === true) return '';
  const given = [...positionals, values.row, values.column].filter((v): v is string => typeof v === 'string');
  const quoted = given.find((v) => {
    try {
      return v.length >= 2 && typeof JSON.parse(v) === 'string';
    } catch {
      return false;
    }
  });
  return quoted === undefined
    ? ''
    : `\n  (${JSON.stringify(quoted)} was taken as typed, quotes included: to pass names as the CLI prints them, in JSON, add --json-names and quote every name)`;
}

function checkedBackend(values: Values): BackendName {
  const backend = values.backend;
  if (backend === undefined) throw new UsageError('--backend (or --config) is required');
  if (backend === 'memory')
    throw new UsageError(
      'the memory store lives inside one process: nothing outside it can reach it (in code, call the command functions of @percolator/cli on it)',
    );
  if (!(BACKENDS as readonly string[]).includes(String(backend)))
    throw new UsageError(`--backend must be one of ${BACKENDS.join(', ')}`);
  return backend as BackendName;
}

async function openFromValues(values: Values): Promise<OpenedStore> {
  if (values.config !== undefined) {
    // The file alone says where each store is, as it does for the application
    // (@percolator/connect's openComposite): an option here that filled in what a store
    // entry leaves out (its namespace, say) would have the CLI read another place than
    // the application writes.
    const extra = ['backend', 'url', 'namespace', 'region', 'dynamodb-table'].filter(
      (name) => values[name] !== undefined,
    );
    if (extra.length > 0) {
      throw new UsageError(
        `--config names every store itself: leave out ${extra.map((n) => `--${n}`).join(', ')} (set a store's namespace, region or dynamoTable in the file)`,
      );
    }
    const config = await loadCompositeConfig(String(values.config));
    return openComposite(config);
  }
  return openBackend({
    backend: checkedBackend(values),
    ...(values.url === undefined ? {} : { url: String(values.url) }),
    ...(values.namespace === undefined ? {} : { namespace: String(values.namespace) }),
    ...(values.region === undefined ? {} : { region: String(values.region) }),
    ...(values['dynamodb-table'] === undefined ? {} : { dynamoTable: String(values['dynamodb-table']) }),
  });
}

/** Runs the CLI; resolves to the exit code. */
export async function runCli(argv: readonly string[], io: CliIo = processIo): Promise<ExitCode> {
  // `pnpm percolator -- inspect ...` passes the "--" through.
  const args = argv.filter((a, i) => !(a === '--' && i === 0));
  const name = args[0];
  if (name === undefined || name === '--help' || name === '-h' || name === 'help') {
    if (name === undefined) {
      io.err(`${USAGE}\n`);
      return EXIT.usage;
    }
    io.out(`${USAGE}\n`);
    return EXIT.ok;
  }
  const spec = Object.hasOwn(COMMANDS, name) ? COMMANDS[name] : undefined;
  if (spec === undefined) {
    io.err(
      `unknown command ${JSON.stringify(name)}: one of ${Object.keys(COMMANDS).join(', ')}\nrun \`percolator --help\` for more\n`,
    );
    return EXIT.usage;
  }
  let values: Values;
  let positionals: string[];
  try {
    ({ values, positionals } = parseArgs({
      args: args.slice(1),
      allowPositionals: true,
      strict: true,
      options: { ...CONNECTION_OPTIONS, ...spec.options },
    }));
  } catch (error) {
    io.err(usageError(parseErrorMessage(error, name, spec, args.slice(1)), name, spec));
    return EXIT.usage;
  }
  if (values.help === true) {
    io.out(`${commandHelp(spec)}\n`);
    return EXIT.ok;
  }
  // An option given twice: parseArgs keeps the last, so `--retention 1h --retention 0s`
  // would prune at 0 s and `--row a --row b` work on b alone (found in review).
  const repeated = repeatedOption(args.slice(1));
  if (repeated) {
    io.err(usageError(`--${repeated} is given more than once`, name, spec));
    return EXIT.usage;
  }
  if (positionals.length < spec.positionals.min || positionals.length > spec.positionals.max) {
    const n = positionals.length;
    const afterDashes = args.slice(1).includes('--')
      ? ' (everything after "--" is an argument, options too: put options before it)'
      : '';
    io.err(
      usageError(
        `wrong number of arguments for ${name}: it takes ${argumentsOf(spec) || 'none'}, got ${n}${n > 0 ? ` (${positionals.map((p) => JSON.stringify(p)).join(', ')})` : ''}${afterDashes}`,
        name,
        spec,
      ),
    );
    return EXIT.usage;
  }
  const hint = quotedNameHint(positionals, values, spec);
  try {
    positionals = decodeNames(positionals, values, spec);
    spec.check?.(positionals, values);
  } catch (error) {
    return report(error, name, spec, io);
  }
  if (spec.runAdmin) return runAdminCommand(name, spec, positionals, values, io);
  let opened: OpenedStore;
  try {
    opened = await (io.openStore ?? (() => openFromValues(values)))();
  } catch (error) {
    return report(error, name, spec, io);
  }
  try {
    if (spec.stream) {
      const sink: DumpSink = {
        write: (text) => io.out(text) !== false,
        drained: io.drained ?? (async () => {}),
        closed: io.outClosed ?? (() => false),
      };
      return await spec.stream(opened.store, positionals, values, {
        sink,
        json: values.json === true,
        target: opened.target,
      });
    }
    const result = await spec.run!(opened.store, positionals, values);
    print(result, values, opened.target, io);
    return result.code;
  } catch (error) {
    return report(error, name, spec, io, opened.target, hint);
  } finally {
    await opened.close().catch(() => undefined);
  }
}

function print(result: CommandResult, values: Values, target: string, io: CliIo): void {
  if (values.json === true) io.out(`${JSON.stringify(result.data, null, 2)}\n`);
  else if (result.refused) io.err(`${result.text}\n  (${target})\n`);
  else io.out(`${result.text}\n  (${target})\n`);
  if (result.notes !== undefined) io.err(`${result.notes}\n`);
}

/** namespaces / drop-namespace: on a backend's catalog, not on one namespace's data. */
async function runAdminCommand(
  name: string,
  spec: CommandSpec,
  positionals: string[],
  values: Values,
  io: CliIo,
): Promise<ExitCode> {
  let admin: NamespaceAdmin;
  try {
    if (values.config !== undefined || values.namespace !== undefined)
      throw new UsageError(`${name} works on a whole backend: leave out --config and --namespace`);
    const backend = checkedBackend(values);
    admin = await (io.openAdmin ?? openNamespaceAdmin)({
      backend,
      ...(values.url === undefined ? {} : { url: String(values.url) }),
      ...(values.region === undefined ? {} : { region: String(values.region) }),
      ...(values['dynamodb-table'] === undefined ? {} : { dynamoTable: String(values['dynamodb-table']) }),
    });
  } catch (error) {
    return report(error, name, spec, io);
  }
  const target = `${values.backend} ${admin.target}`;
  try {
    const result = await spec.runAdmin!(admin, positionals, values);
    print(result, values, target, io);
    return result.code;
  } catch (error) {
    return report(error, name, spec, io, target);
  } finally {
    await admin.close().catch(() => undefined);
  }
}

function report(
  error: unknown,
  name: string,
  spec: CommandSpec,
  io: CliIo,
  where?: string,
  hint = '',
): ExitCode {
  if (error instanceof IncompleteError) {
    io.err(`${error.done}\n`);
    return report(error.cause, name, spec, io, where, hint);
  }
  const at = where ? ` (${where})` : '';
  // A DynamoDB table that is not there, met after opening (namespaces, drop-namespace).
  error = dynamoTableNotFound(error) ?? error;
  if (error instanceof UsageError) {
    io.err(usageError(error.message, name, spec));
    return EXIT.usage;
  }
  if (error instanceof NotFoundError || error instanceof NamespaceNotFoundError) {
    io.err(`${error.message}${at}${error instanceof NotFoundError ? hint : ''}\n`);
    return EXIT.notFound;
  }
  const e = error as Error;
  if (error instanceof LockNotResolvedError || error instanceof CorruptRowError) {
    // Found, not a failing store: a live lock the command's lock wait did not see go (its
    // owner is committing: retry later, or inspect the row), or a row no reader can decode
    // (the message names it). A retry of the same command would not fix the second.
    io.err(`${name}: ${e.message}${at}\n`);
    return EXIT.found;
  }
  if (error instanceof UnsupportedOperationError) {
    // The store cannot do what the command needs (a scan): not something a retry fixes.
    io.err(`${e.message}${at}\n`);
    return EXIT.usage;
  }
  if (error instanceof InvalidArgumentError) {
    io.err(`${e.message}${at}\n`);
    // A table no composite route covers: the deployment has no such table.
    return /has no route/.test(e.message) ? EXIT.notFound : EXIT.usage;
  }
  const prefix = error instanceof UnreachableError ? '' : `${name} failed: `;
  io.err(`${prefix}${e?.message ?? String(error)}${at}\n`);
  return EXIT.unreachable;
}

/** Runs the CLI on this process's arguments and exits with its code. `bin.js` calls it. */
export async function main(argv: readonly string[] = process.argv.slice(2)): Promise<never> {
  // A reader that stops early (`| head`) closes the pipe: EPIPE is not the command failing,
  // and its verdict stays the exit code (without a listener the error would crash the process).
  for (const stream of [process.stdout, process.stderr]) stream.on('error', () => undefined);
  let code: number;
  try {
    code = await runCli(argv);
  } catch (error) {
    process.stderr.write(`percolator: ${(error as Error).stack ?? String(error)}\n`);
    code = EXIT.unreachable;
  }
  // Output to a pipe is written asynchronously, and process.exit drops what is still
  // queued: a long `locks --json | jq` was cut at 64 KiB. Exit once both streams are flushed.
  await Promise.all([flushed(process.stdout), flushed(process.stderr)]);
  // Adapters may hold sockets (pools, clients) open; the verdict is in the exit code.
  process.exit(code);
}

/** Resolves once everything written to `stream` so far has been handed to the OS (or it failed). */
function flushed(stream: NodeJS.WriteStream): Promise<void> {
  return new Promise((resolve) => {
    if (stream.destroyed || !stream.writable) resolve();
    // Writes are ordered: the callback of this empty one runs after every earlier one's.
    else stream.write('', () => resolve());
  });
}

/** Whether `file` (process.argv[1]) is this module (both as real paths: bins are symlinks). */
export function isMainModule(file: string | undefined, moduleUrl: string = import.meta.url): boolean {
  if (file === undefined) return false;
  try {
    return realpathSync(file) === realpathSync(fileURLToPath(moduleUrl));
  } catch {
    return false;
  }
}

if (isMainModule(process.argv[1])) await main();

/** The first option named twice in `args` (`--name` or `--name=value`), if any; after `--`, none. */
export function repeatedOption(args: readonly string[]): string | undefined {
  const seen = new Set<string>();
  for (const arg of args) {
    if (arg === '--') return undefined;
    if (!arg.startsWith('--')) continue;
    const name = arg.slice(2).split('=', 1)[0]!;
    if (seen.has(name)) return name;
    seen.add(name);
  }
  return undefined;
}
