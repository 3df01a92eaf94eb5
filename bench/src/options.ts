import { parseArgs } from 'node:util';
import { InvalidArgumentError } from '@percolator/core';
import type { DatasetShape } from './dataset.js';
import { BACKENDS, type BackendName, MODES, type Mode } from './types.js';
import { ALL_WORKLOADS, DEFAULT_WORKLOADS, WORKLOAD_GROUPS, workloadByName } from './workloads.js';

/** How the traced engines record commit steps (`@percolator/opentelemetry`'s `commitSteps`). */
export const TRACING_KINDS = [
  'otel',
  'otel-events',
  'otel-attributes',
  'otel-lean',
  'otel-sampled',
  'events',
] as const;
export type TracingKind = (typeof TRACING_KINDS)[number];

export interface BenchOptions {
  readonly backends: readonly BackendName[];
  /** False when the backends were not named: unreachable ones are skipped, not fatal. */
  readonly explicitBackends: boolean;
  readonly workloads: readonly string[];
  /** False when the workloads were not named: backends with a shorter default use theirs. */
  readonly explicitWorkloads: boolean;
  readonly modes: readonly Mode[];
  readonly concurrency: readonly number[];
  readonly durationMs: number;
  readonly warmupMs: number;
  readonly shape: DatasetShape;
  readonly opsPerTxn: number;
  /** history: cells of each kind (undefined: the backend's default, 8 on most). */
  readonly historyCells?: number;
  /** history: updates of each long-history cell. */
  readonly historyVersions: number;
  readonly maxAttempts: number;
  /**
   * `--inline-history-bytes`: the Percolator engines' `gc.inlineHistoryBytes` (absent: the
   * client's default, 512), to measure what moving superseded values out of head rows
   * costs (docs/protocol.md 7.2, "What moving costs").
   */
  readonly inlineHistoryBytes?: number;
  /**
   * `--version-block-bytes`: the Percolator engines' `gc.versionBlockBytes` (absent: the
   * client's default), to measure what blocks of moved values save (0: a version row per
   * value, as before blocks; docs/protocol.md 2.2).
   */
  readonly versionBlockBytes?: number;
  readonly seed: number;
  readonly outDir: string;
  readonly markdown: boolean;
  readonly startServices: boolean;
  /** Milliseconds added to every round trip to a backend (0: none). */
  readonly rttMs: number;
  /**
   * `--tracing otel[,otel-events,otel-attributes,otel-lean,otel-sampled,events]`: also run
   * the Percolator engine with OpenTelemetry on (bench/src/tracing.ts), once per kind:
   * commit steps as child spans (`otel`), as span events (`otel-events`), as attributes of
   * the transaction's span (`otel-attributes`), that without the per-step histogram
   * (`otel-lean`), or that with one transaction in 100 traced (`otel-sampled`); `events`
   * is the control, a listener that does nothing (no OpenTelemetry).
   */
  readonly tracing?: readonly TracingKind[];
  /**
   * `--rounds`: each group of cells (one workload and concurrency, every engine) measured in
   * this many interleaved slices (runner.ts runInterleaved). 1: one window per cell.
   */
  readonly rounds: number;
  readonly help: boolean;
}

/** The largest --inline-history-bytes: past it a head row of small values is mostly history. */
export const MAX_INLINE_HISTORY_BYTES = 1024 * 1024;

/** Enough waiters to find the timestamp oracle's ceiling (the oracle workload at 4,096). */
export const MAX_CONCURRENCY = 8192;

export const DEFAULTS = {
  durationMs: 300,
  warmupMs: 100,
  concurrency: [4],
  records: 1024,
  accounts: 256,
  valueBytes: 100,
  opsPerTxn: 4,
  historyVersions: 1000,
  maxAttempts: 20,
  seed: 42,
  outDir: '.bench-out',
  tracingRounds: 6,
  /**
   * Interleaved by default: one window per cell, one after the other, measured the memory
   * store's transfer ratio anywhere from 0.16 to 0.31 within minutes; four rounds, 0.25-0.27
   * (bench/README.md, "Interleaved rounds").
   */
  rounds: 4,
} as const;

export const USAGE = `usage: pnpm bench -- [options]

  --backends LIST     ${BACKENDS.join(',')}
                      (default: memory plus every backend that answers; the rest are skipped
                      with the reason. Named backends that cannot be reached are an error)
  --workloads LIST    workload names or groups (default: ${DEFAULT_WORKLOADS.join(',')};
                      mixed: read,write,transfer)
                      names: ${ALL_WORKLOADS.join(', ')}, rows-<n>, contention-<n>
                      groups: ${Object.keys(WORKLOAD_GROUPS).join(', ')}, default, all
  --modes LIST        ${MODES.join(',')} (default: all)
  --duration TIME     measured time per cell, e.g. 400ms, 2s (default ${DEFAULTS.durationMs}ms)
  --warmup TIME       unmeasured warm-up per cell (default ${DEFAULTS.warmupMs}ms)
  --concurrency LIST  concurrent clients, e.g. 1,8,32, up to ${MAX_CONCURRENCY} (default ${DEFAULTS.concurrency.join(',')})
  --records N         rows in the kv table (default ${DEFAULTS.records})
  --accounts N        rows in the acct table (default ${DEFAULTS.accounts})
  --value-bytes N     bytes per value (default ${DEFAULTS.valueBytes})
  --ops N             keys per YCSB transaction (default ${DEFAULTS.opsPerTxn})
  --history-cells N   history: fresh and long-history cells of each kind (default 8;
                      dynamodb and mixed: 4)
  --history-versions N
                      history: updates of each long-history cell (default ${DEFAULTS.historyVersions})
  --max-attempts N    attempts per transaction before giving up (default ${DEFAULTS.maxAttempts})
  --inline-history-bytes N
                      the Percolator engines' gc.inlineHistoryBytes: superseded values a
                      head row keeps before they move to version rows (default: the
                      client's, 512; 0 to ${MAX_INLINE_HISTORY_BYTES})
  --version-block-bytes N
                      the Percolator engines' gc.versionBlockBytes: most bytes of values
                      one version row holds (default: the client's, 64 KiB or half the
                      store's largest row; 0, a version row per value, to ${MAX_INLINE_HISTORY_BYTES})
  --seed N            seed for key choices (default ${DEFAULTS.seed})
  --out DIR           where results.json, results.md, summary.md and report.html go
                      (default ${DEFAULTS.outDir})
  --markdown          also print the markdown table on stdout
  --no-start          never start the local Redis Cluster or DynamoDB Local
  --rtt TIME          add a fixed network round trip to every backend call, whole ms, e.g. 1 or 1ms:
                      a loopback TCP proxy delays both directions (memory: an in-process
                      wait per call); not on redis-cluster (default 0)
  --tracing LIST      any of otel, otel-events, otel-attributes, otel-lean, otel-sampled, events:
                      also run Percolator with @percolator/opentelemetry on a real SDK,
                      commit steps as child spans (otel), as span events on the
                      transaction's span (otel-events), as its attributes
                      (otel-attributes), that without step histograms (otel-lean), or that
                      with 1 transaction in 100 traced (otel-sampled, traceRatio 0.01);
                      a batch span processor, spans and metrics dropped; or a listener
                      that does nothing (events: the library's events alone). Rows
                      "percolator+otel", ..., each with its ratio to "percolator" in the
                      same run
  --rounds N          cut each cell's window into N slices and let the cells of one workload
                      and concurrency take turns (A B, B A, ...), so a drift during the run
                      (machine load, growing row history) falls on all alike
                      (default ${DEFAULTS.rounds}; ${DEFAULTS.tracingRounds} with --tracing; 1: one window
                      per cell, one after the other)
  -h, --help`;

function list(value: string): string[] {
  return value
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s.length > 0);
}

/** An integer option in [min, max], or the fallback when absent. */
export function integer(
  name: string,
  value: string | undefined,
  fallback: number,
  min: number,
  max: number,
): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isInteger(n) || n < min || n > max) {
    throw new InvalidArgumentError(
      `--${name} must be an integer from ${min} to ${max}, got ${JSON.stringify(value)}`,
    );
  }
  return n;
}

/** "400ms", "2s", "1.5s" or a bare number of milliseconds. */
export function parseDuration(name: string, value: string | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  const match = /^(\d+(?:\.\d+)?)(ms|s)?$/.exec(value.trim());
  const ms = match ? Number(match[1]) * (match[2] === 's' ? 1000 : 1) : Number.NaN;
  if (!(ms >= 0 && ms <= 3_600_000)) {
    throw new InvalidArgumentError(`--${name} must be a time like 500ms or 2s, got ${JSON.stringify(value)}`);
  }
  return Math.round(ms);
}

function expandWorkloads(value: string | undefined): string[] {
  if (value === undefined) return [...DEFAULT_WORKLOADS];
  const out: string[] = [];
  for (const item of list(value)) {
    const names =
      item === 'default'
        ? DEFAULT_WORKLOADS
        : item === 'all'
          ? ALL_WORKLOADS
          : (WORKLOAD_GROUPS[item] ?? [item]);
    for (const name of names) {
      if (!workloadByName(name)) throw new InvalidArgumentError(`unknown workload "${name}" (see --help)`);
      if (!out.includes(name)) out.push(name);
    }
  }
  if (out.length === 0) throw new InvalidArgumentError('--workloads is empty');
  return out;
}

function parseTracing(value: string | undefined): { tracing?: readonly TracingKind[] } {
  if (value === undefined) return {};
  const kinds = list(value);
  for (const kind of kinds) {
    if (!TRACING_KINDS.includes(kind as TracingKind))
      throw new InvalidArgumentError(
        `--tracing takes ${TRACING_KINDS.join(' and/or ')}, got ${JSON.stringify(value)}`,
      );
  }
  if (kinds.length === 0) throw new InvalidArgumentError('--tracing is empty');
  return { tracing: [...new Set(kinds)] as TracingKind[] };
}

/**
 * `--rtt`: "1", "1ms", "0.5s"; a whole number of milliseconds up to 1 s. Whole, because
 * the delay is held by timers, which fire on whole milliseconds: 0.2 ms was held as 1 ms
 * and reported as 0.2 (found in review).
 */
function parseRtt(value: string | undefined): number {
  if (value === undefined) return 0;
  const match = /^(\d+(?:\.\d+)?)(ms|s)?$/.exec(value.trim());
  const ms = match ? Number(match[1]) * (match[2] === 's' ? 1000 : 1) : Number.NaN;
  if (!(Number.isInteger(ms) && ms >= 0 && ms <= 1000)) {
    throw new InvalidArgumentError(
      `--rtt must be a whole number of milliseconds from 0 to 1000, like 1 or 1ms (the delay is held by timers, which fire on whole milliseconds), got ${JSON.stringify(value)}`,
    );
  }
  return ms;
}

function atLeast(name: string, value: number, min: number): number {
  if (value < min) throw new InvalidArgumentError(`--${name} must be at least ${min} ms`);
  return value;
}

export function parseOptions(argv: readonly string[]): BenchOptions {
  let values: Record<string, string | boolean | undefined>;
  try {
    ({ values } = parseArgs({
      // `pnpm bench -- --x` may pass the "--" through.
      args: argv.filter((a) => a !== '--'),
      options: {
        backends: { type: 'string' },
        workloads: { type: 'string' },
        modes: { type: 'string' },
        duration: { type: 'string' },
        warmup: { type: 'string' },
        concurrency: { type: 'string' },
        records: { type: 'string' },
        accounts: { type: 'string' },
        'value-bytes': { type: 'string' },
        ops: { type: 'string' },
        'history-cells': { type: 'string' },
        'history-versions': { type: 'string' },
        'max-attempts': { type: 'string' },
        'inline-history-bytes': { type: 'string' },
        'version-block-bytes': { type: 'string' },
        seed: { type: 'string' },
        out: { type: 'string' },
        markdown: { type: 'boolean' },
        'no-start': { type: 'boolean' },
        rtt: { type: 'string' },
        tracing: { type: 'string' },
        rounds: { type: 'string' },
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (error) {
    throw new InvalidArgumentError((error as Error).message);
  }
  const str = (name: string) => values[name] as string | undefined;

  const backendList = str('backends');
  const backends = backendList === undefined ? [...BACKENDS] : list(backendList);
  for (const b of backends) {
    if (!BACKENDS.includes(b as BackendName)) {
      throw new InvalidArgumentError(`unknown backend "${b}"; choose from ${BACKENDS.join(', ')}`);
    }
  }
  if (backends.length === 0) throw new InvalidArgumentError('--backends is empty');

  const modes = str('modes') === undefined ? [...MODES] : list(str('modes')!);
  for (const m of modes) {
    if (!MODES.includes(m as Mode))
      throw new InvalidArgumentError(`unknown mode "${m}"; choose from ${MODES.join(', ')}`);
  }
  if (modes.length === 0) throw new InvalidArgumentError('--modes is empty');

  const concurrency =
    str('concurrency') === undefined
      ? [...DEFAULTS.concurrency]
      : list(str('concurrency')!).map((c) => integer('concurrency', c, 1, 1, MAX_CONCURRENCY));
  if (concurrency.length === 0) throw new InvalidArgumentError('--concurrency is empty');

  const records = integer('records', str('records'), DEFAULTS.records, 2, 1_000_000);
  const accounts = integer('accounts', str('accounts'), DEFAULTS.accounts, 2, 1_000_000);
  const valueBytes = integer('value-bytes', str('value-bytes'), DEFAULTS.valueBytes, 16, 4096);
  // The default too is at most --records (a transaction's keys are distinct).
  const opsPerTxn = integer(
    'ops',
    str('ops'),
    Math.min(DEFAULTS.opsPerTxn, records),
    1,
    Math.min(1000, records),
  );
  const out = str('out') ?? DEFAULTS.outDir;
  if (out.trim() === '') throw new InvalidArgumentError('--out is empty');
  const workloads = expandWorkloads(str('workloads'));
  const history = workloads.filter((w) => WORKLOAD_GROUPS.history!.includes(w));
  if (str('tracing') !== undefined && history.length > 0) {
    // The history cells are written to the unprefixed tables; --tracing gives every
    // Percolator engine a table prefix of its own (backends.ts), so they would read nothing.
    throw new InvalidArgumentError(
      `--tracing cannot run with the history workloads (${history.join(', ')}): run them apart`,
    );
  }

  return {
    backends: [...new Set(backends)] as BackendName[],
    explicitBackends: backendList !== undefined,
    workloads,
    explicitWorkloads: str('workloads') !== undefined,
    modes: [...new Set(modes)] as Mode[],
    concurrency: [...new Set(concurrency)],
    durationMs: atLeast('duration', parseDuration('duration', str('duration'), DEFAULTS.durationMs), 10),
    warmupMs: parseDuration('warmup', str('warmup'), DEFAULTS.warmupMs),
    shape: { records, accounts, valueBytes },
    opsPerTxn,
    ...(str('history-cells') === undefined
      ? {}
      : { historyCells: integer('history-cells', str('history-cells'), 8, 1, 1000) }),
    historyVersions: integer(
      'history-versions',
      str('history-versions'),
      DEFAULTS.historyVersions,
      1,
      100_000,
    ),
    maxAttempts: integer('max-attempts', str('max-attempts'), DEFAULTS.maxAttempts, 1, 1000),
    ...(str('inline-history-bytes') === undefined
      ? {}
      : {
          inlineHistoryBytes: integer(
            'inline-history-bytes',
            str('inline-history-bytes'),
            0,
            0,
            MAX_INLINE_HISTORY_BYTES,
          ),
        }),
    ...(str('version-block-bytes') === undefined
      ? {}
      : {
          versionBlockBytes: integer(
            'version-block-bytes',
            str('version-block-bytes'),
            0,
            0,
            MAX_INLINE_HISTORY_BYTES,
          ),
        }),
    seed: integer('seed', str('seed'), DEFAULTS.seed, 0, 2 ** 31 - 1),
    outDir: out,
    markdown: values.markdown === true,
    startServices: values['no-start'] !== true,
    rttMs: parseRtt(str('rtt')),
    ...parseTracing(str('tracing')),
    rounds: integer(
      'rounds',
      str('rounds'),
      str('tracing') === undefined ? DEFAULTS.rounds : DEFAULTS.tracingRounds,
      1,
      100,
    ),
    help: values.help === true,
  };
}
