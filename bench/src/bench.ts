import { randomBytes } from 'node:crypto';
import { cpus } from 'node:os';
import { MemoryStore } from '@percolator/core';
import {
  type BackendSettings,
  BackendUnavailable,
  loadData,
  type OpenBackend,
  openBackend,
  RTT_CLUSTER_REASON,
} from './backends.js';
import { CountingStore } from './counting-store.js';
import { initialRows } from './dataset.js';
import { measureRtt } from './delay-proxy.js';
import { type Engine, label } from './engines/engine.js';
import { PercolatorEngine } from './engines/percolator.js';
import { RawEngine } from './engines/raw.js';
import { withRatios } from './metrics.js';
import type { BenchOptions, TracingKind } from './options.js';
import { type Progress, silentProgress } from './progress.js';
import { shellArgs } from './report/format.js';
import { runCell, runInterleaved } from './runner.js';
import { SharedServices } from './services.js';
import { startOtelTracing } from './tracing.js';
import type { BenchReport, BenchResult, HistoryRows, SkippedCell } from './types.js';
import { type Prepared, type Workload, workloadByName } from './workloads.js';

/** Why `engine` does not run `workload`, or undefined if it does. */
function cellSkipReason(engine: Engine, workload: Workload, options: BenchOptions, concurrency: number) {
  if (!workload.modes.includes(engine.mode)) return 'not-applicable';
  const rows = workload.rowsPerTxn(options.opsPerTxn);
  if (rows > engine.maxRowsPerTxn && !(workload.singleRowLegs && engine.singleRowOnly))
    return `${rows} rows per transaction exceed its limit of ${engine.maxRowsPerTxn}`;
  return workload.unsupported?.(engine, options.shape, concurrency);
}

/**
 * The first cells of a process run on cold, unoptimised code. A short untimed run of the
 * common paths on a throwaway memory store first, so the first backend is not penalised.
 */
async function warmUpProcess(options: BenchOptions): Promise<void> {
  const store = new MemoryStore();
  const engines = [
    new PercolatorEngine(new CountingStore(store), 10),
    new RawEngine(new CountingStore(store), 10),
  ];
  const shape = { records: 64, accounts: 16, valueBytes: options.shape.valueBytes };
  for (const engine of engines) {
    await engine.load('kv', initialRows('kv', shape));
    await engine.load('acct', initialRows('acct', shape));
  }
  for (const name of ['read', 'write', 'transfer', 'ycsb-a-uniform']) {
    const workload = workloadByName(name)!;
    for (const engine of engines) {
      if (!workload.modes.includes(engine.mode)) continue;
      const spec = { backend: 'warm-up', engine, workload, concurrency: 4, durationMs: 100, warmupMs: 0 };
      await runCell({ ...spec, shape, seed: options.seed, opsPerTxn: options.opsPerTxn });
    }
  }
  for (const engine of engines) await engine.close();
}

export interface BenchDeps {
  /** Opens a backend (tests substitute stores here). */
  readonly open?: typeof openBackend;
  /** The command line, for the report. */
  readonly command?: string;
  /**
   * Aborting it stops the run: the cell running ends early, no further cell starts, and
   * every backend opened is closed (its namespaces, schemas, tables and keys dropped).
   */
  readonly signal?: AbortSignal;
}

/** What a run collects as it goes. */
interface Collected {
  readonly results: BenchResult[];
  readonly skipped: SkippedCell[];
  readonly notes: string[];
  readonly failures: string[];
  readonly versions: Record<string, string>;
  readonly history: HistoryRows[];
}

const seconds = (since: number) => ((performance.now() - since) / 1000).toFixed(1);

/**
 * The cells of one backend, grouped by workload and concurrency so each Percolator figure
 * and its baselines are measured back to back, at the same moment.
 */
function planCells(
  backend: OpenBackend,
  options: BenchOptions,
  collected: Collected,
  progress: Progress,
): [Workload, number, Engine][] {
  const engines = backend.engines.filter((e) => options.modes.includes(e.mode));
  const cells: [Workload, number, Engine][] = [];
  let names = options.workloads;
  if (!options.explicitWorkloads && backend.defaultWorkloads) {
    names = names.filter((name) => backend.defaultWorkloads!.includes(name));
    collected.notes.push(
      `${backend.name}: the default run measures ${names.join(', ')} only (name others with --workloads)`,
    );
  }
  for (const workload of names.map((name) => workloadByName(name)!)) {
    for (const concurrency of options.concurrency) {
      for (const engine of engines) {
        const reason = cellSkipReason(engine, workload, options, concurrency);
        if (reason === 'not-applicable') continue;
        if (reason) {
          collected.skipped.push({
            backend: backend.name,
            workload: workload.name,
            mode: engine.mode,
            variant: engine.variant,
            reason,
          });
          progress.cellSkipped(`${backend.name} ${workload.name} ${label(engine)}`, reason);
        } else cells.push([workload, concurrency, engine]);
      }
    }
  }
  return cells;
}

/** Loads the data, runs the backend's cells and records failed checks and errors. */
async function runBackend(
  backend: OpenBackend,
  options: BenchOptions,
  collected: Collected,
  progress: Progress,
  signal: AbortSignal | undefined,
): Promise<void> {
  const { name } = backend;
  collected.notes.push(...backend.notes);
  if (backend.version) collected.versions[name] = backend.version;
  if (backend.nativeMissing && options.modes.includes('native')) {
    collected.skipped.push({ backend: name, mode: 'native', reason: backend.nativeMissing });
    progress.cellSkipped(`${name} native`, backend.nativeMissing);
  }
  const cells = planCells(backend, options, collected, progress);
  // Only the tables the planned cells use (a transfer-only run needs no `kv`).
  const tables = [...new Set(cells.flatMap(([workload]) => (workload.table ? [workload.table] : [])))];
  const { records, accounts } = options.shape;
  const sizes = tables.map((t) => (t === 'kv' ? `${records} records` : `${accounts} accounts`));
  progress.info(`== ${name} (${backend.target}): loading ${sizes.join(' + ') || 'nothing'}`);
  const loadStart = performance.now();
  await loadData(backend, options.shape, tables);
  progress.info(`== ${name}: loaded in ${seconds(loadStart)} s`);
  const prepared = new Map<string, Prepared>();
  for (const [workload] of cells) {
    const prepare = workload.prepare;
    if (!prepare || prepared.has(prepare.key) || signal?.aborted) continue;
    const data = await prepare.run({ backend, options, signal, info: (line) => progress.info(line) });
    prepared.set(prepare.key, data);
    if (data.history) collected.history.push(data.history);
  }
  let done = 0;
  for (const group of interleavedGroups(cells, options.rounds)) {
    if (signal?.aborted) return;
    const specs = group.map(([workload, concurrency, engine]) => {
      progress.cellStart(++done, cells.length, `${name} ${workload.name} ${label(engine)} c=${concurrency}`);
      return {
        backend: name,
        engine,
        workload,
        concurrency,
        durationMs: options.durationMs,
        warmupMs: options.warmupMs,
        shape: options.shape,
        seed: options.seed,
        opsPerTxn: options.opsPerTxn,
        prepared: workload.prepare ? prepared.get(workload.prepare.key) : undefined,
        signal,
      };
    });
    const results = await runInterleaved(specs, group.length > 1 ? options.rounds : 1);
    if (signal?.aborted) return;
    for (const [j, result] of results.entries()) {
      const [workload, concurrency, engine] = group[j]!;
      const where = `${name} ${workload.name} ${label(engine)} c=${concurrency}`;
      collected.results.push(result);
      progress.cellDone(result);
      if (!result.check.ok)
        collected.failures.push(`${where}: correctness check failed: ${result.check.detail}`);
      if (result.errors > 0) {
        collected.failures.push(
          `${where}: ${result.errors} errors (${result.errorSamples?.[0] ?? 'no message'})`,
        );
      }
    }
  }
}

/** What each `--tracing` kind asked for ran with, in the report's notes. */
const TRACING_KINDS: Record<TracingKind, string> = {
  otel: 'commit steps as child spans',
  'otel-events': 'commit steps as span events',
  'otel-attributes': "commit steps as attributes of the transaction's span",
  'otel-lean': 'commit steps as attributes, no step histograms',
  'otel-sampled': 'that with 1 transaction in 100 traced',
  events: "the library's events alone, to a listener that does nothing (no OpenTelemetry)",
};

export function tracingNote(kinds: readonly TracingKind[], spans: number, rounds: number): string {
  const otel = kinds.some((k) => k !== 'events');
  return (
    `--tracing ${kinds.join(',')}: ` +
    kinds.map((k) => `"percolator+${k}": ${TRACING_KINDS[k]}`).join('; ') +
    (otel
      ? `. The OpenTelemetry rows ran @percolator/opentelemetry on the SDK (batch span processor, spans and ` +
        `metrics dropped by the exporter; ${spans} spans exported)`
      : '') +
    `. Each ratio is to "percolator" in the same run, measured in ${rounds} interleaved rounds`
  );
}

/**
 * With `--rounds` above 1, the cells of one workload and concurrency are measured
 * interleaved (runner.ts runInterleaved), as long as no two of them share data: the native
 * engines' isolation levels share one schema, so a second one starts a new group. With 1,
 * each cell alone, one after the other.
 */
export function interleavedGroups<C extends readonly [Workload, number, Pick<Engine, 'dataKey'>]>(
  cells: readonly C[],
  rounds: number,
): C[][] {
  const groups: C[][] = [];
  for (const cell of cells) {
    const last = groups.at(-1);
    const [workload, concurrency, engine] = cell;
    const fits =
      rounds > 1 &&
      last !== undefined &&
      last[0]![0] === workload &&
      last[0]![1] === concurrency &&
      !last.some(([, , other]) => other.dataKey === engine.dataKey);
    if (fits) last.push(cell);
    else groups.push([cell]);
  }
  return groups;
}

/**
 * Runs every (backend, workload, concurrency, engine) cell. A backend that cannot be
 * reached is skipped with its reason, or is a failure if it was named explicitly.
 */
export async function runBench(
  options: BenchOptions,
  progress: Progress = silentProgress,
  deps: BenchDeps = {},
): Promise<BenchReport> {
  const open = deps.open ?? openBackend;
  const startedAt = new Date().toISOString();
  const runId = randomBytes(4).toString('hex');
  const collected: Collected = {
    results: [],
    skipped: [],
    notes: [],
    failures: [],
    versions: {},
    history: [],
  };
  const { signal } = deps;
  const services = new SharedServices();
  const tracing = options.tracing ? await startOtelTracing(options.tracing) : undefined;
  const settings = {
    runId,
    maxConcurrency: Math.max(...options.concurrency),
    maxAttempts: options.maxAttempts,
    startServices: options.startServices,
    services,
    rttMs: options.rttMs,
    ...(options.inlineHistoryBytes === undefined ? {} : { inlineHistoryBytes: options.inlineHistoryBytes }),
    ...(options.versionBlockBytes === undefined ? {} : { versionBlockBytes: options.versionBlockBytes }),
    ...(tracing ? { traced: tracing.listeners } : {}),
  };
  let network: BenchReport['network'];
  try {
    progress.info(`== run ${runId}: everything it creates is named bench_${runId}*`);
    if (options.rttMs > 0) {
      const measured = await measureRtt(options.rttMs);
      network = { rttMs: options.rttMs, measuredRttMs: Math.round(measured * 1000) / 1000 };
      collected.notes.push(
        `--rtt ${options.rttMs} ms: a loopback proxy delays both directions of every backend connection ` +
          `(memory: an in-process wait per call); a round trip through it measured ${measured.toFixed(2)} ms (median of 20)`,
      );
      progress.info(
        `== --rtt ${options.rttMs} ms: a round trip through the proxy takes ${measured.toFixed(2)} ms`,
      );
    }
    if (options.warmupMs > 0 && !signal?.aborted) await warmUpProcess(options);
    await runBackends(options, settings, open, collected, progress, signal);
  } finally {
    try {
      await services.stop();
    } catch (error) {
      collected.failures.push(`stopping DynamoDB Local: ${String(error)}`);
    }
    if (tracing) {
      await tracing.shutdown();
      collected.notes.push(tracingNote(options.tracing!, tracing.exported(), options.rounds));
    }
  }

  return {
    schema: 'percolator-bench/1',
    runId,
    startedAt,
    finishedAt: new Date().toISOString(),
    command: deps.command ?? shellArgs(process.argv.slice(2)),
    host: {
      cpus: cpus().length,
      cpuModel: cpus()[0]?.model.trim() ?? 'unknown',
      node: process.version,
      platform: `${process.platform}-${process.arch}`,
    },
    versions: collected.versions,
    options: { ...options },
    results: withRatios(collected.results),
    skipped: collected.skipped,
    notes: collected.notes,
    failures: collected.failures,
    ...(collected.history.length > 0 ? { history: collected.history } : {}),
    ...(network ? { network } : {}),
    ...(signal?.aborted ? { interrupted: String(signal.reason ?? 'interrupted') } : {}),
  };
}

async function runBackends(
  options: BenchOptions,
  settings: BackendSettings,
  open: typeof openBackend,
  collected: Collected,
  progress: Progress,
  signal: AbortSignal | undefined,
): Promise<void> {
  for (const name of options.backends) {
    if (signal?.aborted) return;
    if (options.rttMs > 0 && name === 'redis-cluster') {
      // Left out on purpose: not a failure, even when named.
      collected.skipped.push({ backend: name, reason: RTT_CLUSTER_REASON });
      progress.cellSkipped(name, RTT_CLUSTER_REASON);
      continue;
    }
    const backendStart = performance.now();
    progress.info(`== ${name}: connecting`);
    let backend: OpenBackend;
    try {
      backend = await open(name, settings);
    } catch (error) {
      const reason = error instanceof BackendUnavailable ? error.reason : String(error);
      collected.skipped.push({ backend: name, reason });
      progress.cellSkipped(name, reason);
      if (options.explicitBackends || !(error instanceof BackendUnavailable)) {
        collected.failures.push(`${name}: ${reason}`);
      }
      continue;
    }
    try {
      await runBackend(backend, options, collected, progress, signal);
    } catch (error) {
      // Stopped by the signal mid-way (loading, preparing): not a failure of the backend.
      if (!signal?.aborted) {
        collected.failures.push(`${name}: ${error instanceof Error ? error.message : String(error)}`);
        progress.info(`!! ${name} failed: ${String(error)}`);
      }
    } finally {
      try {
        await backend.close();
      } catch (error) {
        collected.failures.push(`${name}: ${String(error)}`);
      }
      progress.info(`== ${name}: done in ${seconds(backendStart)} s`);
    }
  }
}
