import { addIo } from './counting-store.js';
import { type CallTrace, stopTracing, traced } from './critical-path.js';
import type { DatasetShape } from './dataset.js';
import { type Counters, type Engine, type LogicalTable, TxFailure } from './engines/engine.js';
import { Ledger, verify } from './ledger.js';
import { abortRate, CellStats, perSecond, perUnit, retryRate, round } from './metrics.js';
import { seededRandom } from './random.js';
import type { BenchResult, CheckOutcome, CriticalPathFigures, IoFigures, ObserverFigures } from './types.js';
import type { Step, Workload, WorkloadSession } from './workloads.js';

export interface CellSpec {
  readonly backend: string;
  readonly engine: Engine;
  readonly workload: Workload;
  readonly concurrency: number;
  readonly durationMs: number;
  readonly warmupMs: number;
  readonly shape: DatasetShape;
  readonly seed: number;
  readonly opsPerTxn: number;
  /** What the workload's `prepare` made on this backend, if it has one. */
  readonly prepared?: unknown;
  /** Stops the cell early (the run was interrupted); the cell's figures are then partial. */
  readonly signal?: AbortSignal;
  /** Transactions run alone after the window to count sequential round trips (default PROBES). */
  readonly probes?: number;
}

/** Transactions traced one at a time after each cell (critical-path.ts). */
export const PROBES = 10;

/** A cell stops early after this many errors: the store is probably down. */
const MAX_ERRORS = 200;

/** Drives every worker until `until` (each finishes the transaction it is in). */
async function drive(
  steps: readonly Step[],
  until: number,
  stats: CellStats,
  signal: AbortSignal | undefined,
): Promise<void> {
  let stop = false;
  await Promise.all(
    steps.map(async (step) => {
      while (!stop && !signal?.aborted && performance.now() < until) {
        const start = performance.now();
        try {
          const outcome = await step();
          if (typeof outcome === 'number') stats.commit(outcome, performance.now() - start);
          else stats.commit(outcome.attempts, outcome.latencyMs);
        } catch (error) {
          stats.fail(error instanceof TxFailure ? error : new TxFailure('error', 1, error));
          if (stats.errors + stats.unknown >= MAX_ERRORS) stop = true;
        }
      }
    }),
  );
}

function hash(text: string): number {
  let h = 2166136261;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 16777619);
  return h >>> 0;
}

/**
 * Runs one cell: snapshot the table the workload writes, warm up, measure for
 * `durationMs`, wait for background work, snapshot again and check the data against
 * what the clients know they committed.
 */
export async function runCell(spec: CellSpec): Promise<BenchResult> {
  const [result] = await runInterleaved([spec], 1);
  return result!;
}

/**
 * Runs cells side by side: each is warmed up, then the measured window of each is cut into
 * `rounds` slices, and the slices take turns (A B, B A, A B, ...), each cell's slice alone on
 * the machine. A drift during the run (a slower machine, rows whose history grows, a heap
 * that grows) then falls on every cell alike, and the ratios between them hold; one window
 * after the other would credit the drift to whichever cell ran first. The cells must not
 * share data (each engine its own tables): each checks its own after its last slice.
 * `rounds` 1 is one window per cell, one after the other.
 */
export async function runInterleaved(specs: readonly CellSpec[], rounds: number): Promise<BenchResult[]> {
  const runs: CellRun[] = [];
  try {
    for (const spec of specs) {
      const session = await spec.workload.session?.(spec.engine, {
        concurrency: spec.concurrency,
        shape: spec.shape,
        prepared: spec.prepared,
      });
      const run = await openRun(spec, session);
      runs.push(run);
      // One cell at a time when not interleaved: warm each just before its window.
      if (rounds > 1) await warm(run);
    }
    if (rounds <= 1) {
      for (const run of runs) {
        await warm(run);
        await slice(run, run.spec.durationMs);
      }
    } else {
      for (let r = 0; r < rounds; r++) {
        const order = r % 2 === 0 ? runs : [...runs].reverse();
        for (const run of order) await slice(run, run.spec.durationMs / rounds);
      }
    }
    const results: BenchResult[] = [];
    for (const run of runs) results.push(await finish(run));
    return results;
  } finally {
    for (const run of runs) await run.session?.close();
  }
}

/** One cell's state across its slices. */
interface CellRun {
  readonly spec: CellSpec;
  readonly session: WorkloadSession | undefined;
  readonly ledger: Ledger;
  readonly table: LogicalTable | undefined;
  readonly before: Map<string, string> | undefined;
  readonly steps: Step[];
  readonly warmup: CellStats;
  readonly stats: CellStats;
  start?: Counters;
  end?: Counters;
  runsBefore?: number;
  runsAfter?: number;
  elapsedMs: number;
  cpuMs: number;
}

async function openRun(spec: CellSpec, session: WorkloadSession | undefined): Promise<CellRun> {
  const { engine, workload, concurrency, shape } = spec;
  const ledger = new Ledger(concurrency);
  const table =
    workload.check === 'deltas' ||
    workload.check === 'transfer' ||
    workload.check === 'blind' ||
    workload.check === 'reads'
      ? workload.table
      : undefined;
  const before = table ? await engine.snapshot(table) : undefined;
  const seed = (spec.seed ^ hash(`${spec.backend}/${workload.name}/${engine.mode}/${engine.variant}`)) >>> 0;
  const steps = Array.from({ length: concurrency }, (_, index) =>
    session
      ? session.step(index)
      : workload.worker({
          engine,
          shape,
          concurrency,
          index,
          random: seededRandom(seed + index * 7919),
          ledger,
          seed: spec.seed,
          opsPerTxn: spec.opsPerTxn,
        }),
  );
  return {
    spec,
    session,
    ledger,
    table,
    before,
    steps,
    warmup: new CellStats(),
    stats: new CellStats(),
    elapsedMs: 0,
    cpuMs: 0,
  };
}

async function warm(run: CellRun): Promise<void> {
  const { spec } = run;
  if (spec.warmupMs > 0) await drive(run.steps, performance.now() + spec.warmupMs, run.warmup, spec.signal);
  await spec.engine.settle?.();
}

/**
 * CPU of this thread (Node 23.9 and later): the `--rtt` delay proxy runs in a worker
 * thread of this process, and its CPU, more for cells with more round trips, is not the
 * client's. Before Node 23.9, the process's (the proxy's included: the figure says which).
 */
const threadCpuUsage: (previous?: NodeJS.CpuUsage) => NodeJS.CpuUsage =
  (process as { threadCpuUsage?: (previous?: NodeJS.CpuUsage) => NodeJS.CpuUsage }).threadCpuUsage?.bind(
    process,
  ) ?? process.cpuUsage.bind(process);

/** One slice of the measured window, then the background work of its commits. */
async function slice(run: CellRun, durationMs: number): Promise<void> {
  const { spec, session } = run;
  run.start ??= spec.engine.counters();
  run.runsBefore ??= session?.observerRuns?.();
  const cpu0 = threadCpuUsage();
  const t0 = performance.now();
  await drive(run.steps, t0 + durationMs, run.stats, spec.signal);
  run.runsAfter = session?.observerRuns?.();
  await spec.engine.settle?.();
  // The background work of the slice's commits (Percolator's secondaries and tidy steps) is
  // in the window: it is theirs, and the next slice, another engine's, starts with none of
  // it. Out of the window it was time Percolator's transactions took and no figure showed.
  run.elapsedMs += performance.now() - t0;
  // After the background work of the slice's commits, which is theirs too.
  const cpu = threadCpuUsage(cpu0);
  run.cpuMs += (cpu.user + cpu.system) / 1000;
  run.end = spec.engine.counters();
}

async function finish(run: CellRun): Promise<BenchResult> {
  const { spec, session, stats, warmup, elapsedMs } = run;
  const { engine, workload } = spec;
  const start = run.start ?? engine.counters();
  const end = run.end ?? start;
  const observer =
    run.runsBefore === undefined || run.runsAfter === undefined
      ? undefined
      : {
          runsPerSecond: round(perSecond(run.runsAfter - run.runsBefore, elapsedMs), 1),
          runs: run.runsAfter - run.runsBefore,
          samples: stats.committed,
        };

  const probed = session ? undefined : await probe(run.steps[0]!, engine, spec.probes ?? PROBES, spec.signal);

  const after = run.table ? await engine.snapshot(run.table) : undefined;
  // Warm-up and probe transactions count for the check (they changed the data) but not the figures.
  const committed = stats.committed + warmup.committed + (probed?.committed ?? 0);
  const check: CheckOutcome =
    workload.check === 'session'
      ? committed === 0
        ? { ok: false, detail: 'no transaction committed' }
        : await session!.verify()
      : verify(workload.check, run.ledger, committed, run.before, after);
  return toResult(spec, stats, warmup, elapsedMs, start, end, check, observer, probed?.figures, run.cpuMs);
}

/**
 * Runs `count` transactions of the workload one at a time, nothing else running, each
 * traced: its store calls in its own async context, split into the critical path (calls
 * it waited for) and background work (what it left running, waited for before the next).
 * Alone, no other transaction shares its timestamp fetch or read batch, so the counts
 * are the transaction's own. Failed probes are left out.
 */
async function probe(
  step: Step,
  engine: Engine,
  count: number,
  signal: AbortSignal | undefined,
): Promise<{ figures: CriticalPathFigures | undefined; committed: number }> {
  const traces: CallTrace[] = [];
  for (let i = 0; i < count && !signal?.aborted; i++) {
    try {
      const { trace } = await traced(step);
      traces.push(trace);
    } catch {
      // Not a figure: the measured window reports errors.
    }
    await engine.settle?.();
  }
  stopTracing();
  if (traces.length === 0) return { figures: undefined, committed: 0 };
  const all = traces.map((t) => t.figures());
  const mean = (pick: (f: (typeof all)[number]) => number) =>
    round(all.reduce((sum, f) => sum + pick(f), 0) / all.length, 2);
  return {
    committed: traces.length,
    figures: {
      roundTrips: mean((f) => f.sequential),
      maxRoundTrips: Math.max(...all.map((f) => f.sequential)),
      criticalCalls: mean((f) => f.criticalCalls),
      backgroundCalls: mean((f) => f.backgroundCalls),
      transactions: traces.length,
    },
  };
}

/** Store traffic between two readings of an engine's counters, per committed transaction. */
function ioPerTransaction(start: Counters, end: Counters, committed: number): IoFigures | undefined {
  if (!start.io || !end.io) return undefined;
  const d = addIo(end.io, start.io, -1);
  const per = (n: number, digits = 2) => round(perUnit(n, committed), digits);
  return {
    reads: per(d.reads),
    writes: per(d.writes),
    rowsRead: per(d.rowsRead),
    rowsWritten: per(d.rowsWritten),
    bytesRead: per(d.bytesRead, 0),
    bytesWritten: per(d.bytesWritten, 0),
  };
}

/** The figures of one measured window (warm-up errors count as errors too). */
function toResult(
  spec: CellSpec,
  stats: CellStats,
  warmup: CellStats,
  elapsedMs: number,
  start: Counters,
  end: Counters,
  check: CheckOutcome,
  observer: ObserverFigures | undefined,
  criticalPath: CriticalPathFigures | undefined,
  cpuMs: number,
): BenchResult {
  const samples = [...warmup.errorSamples, ...stats.errorSamples].slice(0, 5);
  const roundTrips = end.roundTrips - start.roundTrips;
  const commands = end.commands - start.commands;
  const io = ioPerTransaction(start, end, stats.committed);
  const deadlocks = end.deadlocks === undefined ? undefined : end.deadlocks - (start.deadlocks ?? 0);
  return {
    backend: spec.backend,
    workload: spec.workload.name,
    mode: spec.engine.mode,
    variant: spec.engine.variant,
    concurrency: spec.concurrency,
    throughput: round(perSecond(stats.committed, elapsedMs), 1),
    ...(stats.committed > 0 ? { clientCpuMsPerTx: round(cpuMs / stats.committed, 4) } : {}),
    p50Ms: round(stats.latency.percentileMs(50)),
    p95Ms: round(stats.latency.percentileMs(95)),
    p99Ms: round(stats.latency.percentileMs(99)),
    meanMs: round(stats.latency.meanMs),
    maxMs: round(stats.latency.maxMs),
    abortRate: round(abortRate(stats.attempts, stats.committed), 4),
    retryRate: round(retryRate(stats.attempts, stats.transactions), 4),
    roundTrips: round(perUnit(roundTrips, stats.committed), 2),
    storeCalls: roundTrips,
    commands: round(perUnit(commands, stats.committed), 2),
    transactions: stats.committed,
    attempts: stats.attempts,
    gaveUp: stats.gaveUp,
    errors: stats.errors + stats.unknown + warmup.errors + warmup.unknown,
    durationMs: Math.round(elapsedMs),
    ratios: [],
    check,
    ...(samples.length > 0 ? { errorSamples: samples } : {}),
    ...(observer ? { observer } : {}),
    ...(io ? { io } : {}),
    ...(criticalPath ? { criticalPath } : {}),
    ...(deadlocks === undefined ? {} : { deadlocks }),
  };
}
