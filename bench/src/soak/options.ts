import { InvalidArgumentError } from '@percolator/core';
import { integer } from '../options.js';
import { BACKENDS, type BackendName } from '../types.js';

/** What one soak run does. Every rate is per workload, over all of its workers. */
export interface SoakOptions {
  readonly backend: BackendName;
  /** Wall ms the workloads run (the final checks come after). */
  readonly durationMs: number;
  /** Ms between metric samples. */
  readonly intervalMs: number;
  /** Samples taken before this many ms are warm-up: reported, not judged by the growth rule. */
  readonly warmupMs: number;
  /** Workers per workload (transfers, list-append, observer writers) and observer worker loops. */
  readonly concurrency: number;
  /** Transactions started per second per workload, at most (0: no limit). */
  readonly rate: number;
  readonly accounts: number;
  /** List-append lists (few, so transactions contend). */
  readonly lists: number;
  /** List-append transactions per checked window. */
  readonly windowTxns: number;
  readonly observedRows: number;
  /** gc.retentionMs of every client. */
  readonly retentionMs: number;
  /** Ms between gc passes (db.gc over every row the soak writes). */
  readonly gcIntervalMs: number;
  readonly seed: number;
  readonly json: boolean;
  /** Also write the JSON report to this file. */
  readonly out?: string;
  readonly help: boolean;
}

export const SOAK_DEFAULTS = {
  durationMs: 60 * 60_000,
  intervalMs: 10_000,
  concurrency: 2,
  rate: 20,
  accounts: 32,
  lists: 8,
  windowTxns: 300,
  observedRows: 32,
  retentionMs: 10_000,
  gcIntervalMs: 30_000,
} as const;

export const SOAK_USAGE = `pnpm soak -- --backend NAME [options]
pnpm soak -- summarize RUN.json...   (a table of finished runs, from their --out files)

Runs transfers (money conserved), list-append transactions (checked for snapshot-isolation
anomalies window by window), an observer with a worker (counting, checked) and gc against
one backend for --duration, samples metrics every --interval, and exits 1 if a check fails
or a metric grows without bound (see docs/reliability.md, "Soak runs").

  --backend NAME       one of ${BACKENDS.join(', ')} (composite: an alias of mixed)
  --duration TIME      how long the workloads run (default 1h); e.g. 90s, 2m, 1h
  --interval TIME      between metric samples (default 10s)
  --warmup TIME        samples before this are not judged (default: a quarter of --duration)
  --concurrency N      workers per workload (default ${SOAK_DEFAULTS.concurrency})
  --rate N             transactions started per second per workload, 0 = no limit (default ${SOAK_DEFAULTS.rate})
  --accounts N         transfer accounts (default ${SOAK_DEFAULTS.accounts})
  --lists N            list-append lists (default ${SOAK_DEFAULTS.lists})
  --window N           list-append transactions per checked window (default ${SOAK_DEFAULTS.windowTxns})
  --observed-rows N    rows the observer counts (default ${SOAK_DEFAULTS.observedRows})
  --retention TIME     gc.retentionMs of every client (default 10s)
  --gc-interval TIME   between gc passes over every row (default 30s)
  --seed N             random seed (default: random, printed)
  --json               print the JSON report instead of the table
  --out FILE           also write the JSON report to FILE
  --help`;

/** "500ms", "90s", "2m", "1h", "1.5h" or a bare number of milliseconds. */
export function parseTime(name: string, value: string | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  const match = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(value.trim());
  const unit = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[match?.[2] ?? 'ms']!;
  const ms = match ? Math.round(Number(match[1]) * unit) : Number.NaN;
  if (!(ms >= 0 && ms <= 7 * 24 * 3_600_000)) {
    throw new InvalidArgumentError(
      `--${name} must be a time like 500ms, 90s, 2m or 1h, got ${JSON.stringify(value)}`,
    );
  }
  return ms;
}

const FLAGS = new Set(['json', 'help']);
const VALUED = new Set([
  'backend',
  'duration',
  'interval',
  'warmup',
  'concurrency',
  'rate',
  'accounts',
  'lists',
  'window',
  'observed-rows',
  'retention',
  'gc-interval',
  'seed',
  'out',
]);

export function parseSoakOptions(argv: readonly string[]): SoakOptions {
  const values = new Map<string, string>();
  const flags = new Set<string>();
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === '--') continue;
    const match = /^--([a-z-]+)(?:=(.*))?$/.exec(arg);
    if (!match) throw new InvalidArgumentError(`unexpected argument ${JSON.stringify(arg)}`);
    const [, name, inline] = match as unknown as [string, string, string | undefined];
    if (FLAGS.has(name)) {
      flags.add(name);
      continue;
    }
    if (!VALUED.has(name)) throw new InvalidArgumentError(`unknown option --${name}`);
    const value = inline ?? argv[++i];
    if (value === undefined) throw new InvalidArgumentError(`--${name} needs a value`);
    values.set(name, value);
  }
  const help = flags.has('help');
  const backendArg = values.get('backend');
  const backend = (backendArg === 'composite' ? 'mixed' : backendArg) as BackendName | undefined;
  if (!help && (backend === undefined || !BACKENDS.includes(backend))) {
    throw new InvalidArgumentError(
      `--backend must be one of ${BACKENDS.join(', ')} or composite, got ${JSON.stringify(backendArg)}`,
    );
  }
  const durationMs = parseTime('duration', values.get('duration'), SOAK_DEFAULTS.durationMs);
  const intervalMs = parseTime('interval', values.get('interval'), SOAK_DEFAULTS.intervalMs);
  if (intervalMs < 100) throw new InvalidArgumentError('--interval must be at least 100ms');
  if (durationMs < intervalMs) throw new InvalidArgumentError('--duration must be at least one --interval');
  const seedArg = values.get('seed');
  return {
    backend: backend ?? 'memory',
    durationMs,
    intervalMs,
    warmupMs: parseTime('warmup', values.get('warmup'), Math.round(durationMs / 4)),
    concurrency: integer('concurrency', values.get('concurrency'), SOAK_DEFAULTS.concurrency, 1, 64),
    rate: integer('rate', values.get('rate'), SOAK_DEFAULTS.rate, 0, 100_000),
    accounts: integer('accounts', values.get('accounts'), SOAK_DEFAULTS.accounts, 2, 10_000),
    lists: integer('lists', values.get('lists'), SOAK_DEFAULTS.lists, 1, 1000),
    windowTxns: integer('window', values.get('window'), SOAK_DEFAULTS.windowTxns, 10, 100_000),
    observedRows: integer(
      'observed-rows',
      values.get('observed-rows'),
      SOAK_DEFAULTS.observedRows,
      1,
      10_000,
    ),
    retentionMs: parseTime('retention', values.get('retention'), SOAK_DEFAULTS.retentionMs),
    gcIntervalMs: Math.max(
      100,
      parseTime('gc-interval', values.get('gc-interval'), SOAK_DEFAULTS.gcIntervalMs),
    ),
    seed:
      seedArg === undefined
        ? Math.floor(Math.random() * 2 ** 31)
        : integer('seed', seedArg, 0, 0, 2 ** 31 - 1),
    json: flags.has('json'),
    ...(values.has('out') ? { out: values.get('out')! } : {}),
    help,
  };
}
