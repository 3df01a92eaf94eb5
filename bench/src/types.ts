import { BACKENDS as STORE_BACKENDS } from '@percolator/connect';

/** What the bench measures and reports. The JSON file is a `BenchReport`. */

/** `percolator`: through the library; `raw`: single-row calls on the adapter; `native`: the store's own transactions. */
export type Mode = 'percolator' | 'raw' | 'native';
export const MODES: readonly Mode[] = ['percolator', 'raw', 'native'];

/** `mixed`: one CompositeStore over PostgreSQL, Redis and DynamoDB, rows sharded by key hash. */
export const BACKENDS = [...STORE_BACKENDS, 'mixed'] as const;
export type BackendName = (typeof BACKENDS)[number];

/** Percolator's figure against one baseline measured in the same run (this / baseline). */
export interface Ratio {
  /** `raw` or `native:<variant>`. */
  readonly baseline: string;
  /** Throughput ratio: the paper's figure (reads 0.94, one-cell writes 0.23 of raw Bigtable). */
  readonly throughput: number;
  /** Median latency ratio (> 1: Percolator is slower). */
  readonly p50: number;
}

export interface CheckOutcome {
  readonly ok: boolean;
  /** What was checked, or what went wrong. */
  readonly detail: string;
}

export interface BenchResult {
  readonly backend: string;
  readonly workload: string;
  readonly mode: Mode;
  /** Which flavour of the mode: `si` (Percolator), `cas` (raw), or the native isolation/mechanism. */
  readonly variant: string;
  readonly concurrency: number;
  /** Committed transactions per second over the measured window. */
  readonly throughput: number;
  readonly p50Ms: number;
  readonly p95Ms: number;
  readonly p99Ms: number;
  readonly meanMs: number;
  readonly maxMs: number;
  /** Aborted attempts / all attempts. */
  readonly abortRate: number;
  /** Extra attempts per committed transaction. */
  readonly retryRate: number;
  /**
   * Store round trips per committed transaction, counted (not estimated): RowStore calls
   * through a counting proxy for `percolator`/`raw`, statements or commands for `native`.
   * Calls made by aborted attempts are included.
   */
  readonly roundTrips: number;
  /**
   * CPU time of this process (user + system) over the measured window, per committed
   * transaction, in ms: the client's own cost (and the in-process store's, on memory), which
   * a busy machine changes far less than throughput. Background work of other engines is
   * not running then; the warm-up and probes are outside the window.
   */
  readonly clientCpuMsPerTx?: number;
  /** Store round trips in the measured window, in all (`roundTrips` × transactions, unrounded). */
  readonly storeCalls?: number;
  /** Commands per committed transaction where that differs from round trips (Redis MULTI blocks). */
  readonly commands: number;
  /** Committed transactions in the measured window. */
  readonly transactions: number;
  readonly attempts: number;
  /** Transactions that gave up after the maximum attempts (conflicts, locks that stayed). */
  readonly gaveUp: number;
  /** Failures that are not conflicts (store errors, unknown commit outcomes). */
  readonly errors: number;
  readonly durationMs: number;
  readonly ratios: readonly Ratio[];
  readonly check: CheckOutcome;
  /** First error messages, if any. */
  readonly errorSamples?: readonly string[];
  /**
   * Observer pipeline only. Its p50/p95/p99 are notification latency: from the moment the
   * writer's commit resolved to the moment the observer's transaction committed.
   */
  readonly observer?: ObserverFigures;
  /**
   * Per committed transaction, what went through the counted RowStore (percolator and raw
   * modes; aborted attempts and background work included, like `roundTrips`).
   */
  readonly io?: IoFigures;
  /**
   * Sequential round trips: transactions of this cell run one at a time after the measured
   * window, each traced (the store calls made in its async context). Absent for workloads
   * run through a session (observers, history).
   */
  readonly criticalPath?: CriticalPathFigures;
  /**
   * Attempts the store aborted as deadlocks (native SQL modes), which are run again. A
   * deadlock costs the wait until the server detects it (PostgreSQL: `deadlock_timeout`).
   */
  readonly deadlocks?: number;
}

/**
 * A transaction's waits on its store, counted alone (critical-path.ts): calls that overlap
 * are one wait. `roundTrips` is what a network round trip multiplies; `BenchResult.roundTrips`
 * counts every call, background and overlapping ones included, under load.
 */
export interface CriticalPathFigures {
  /** Mean sequential round trips per transaction: stretches with a call in flight that it waited for. */
  readonly roundTrips: number;
  /** The most any traced transaction made. */
  readonly maxRoundTrips: number;
  /** Mean store calls per transaction on its critical path (overlapping ones each counted). */
  readonly criticalCalls: number;
  /** Mean store calls per transaction left to the background (secondary commits, the tidy step). */
  readonly backgroundCalls: number;
  /** Transactions traced. */
  readonly transactions: number;
}

/** Store traffic per committed transaction (see IoCounts in counting-store.ts). */
export interface IoFigures {
  /** Read calls (read, readMany, scan, scanNotified). */
  readonly reads: number;
  /** Write calls (check-and-sets, batched or stamped, and counter increments). */
  readonly writes: number;
  readonly rowsRead: number;
  readonly rowsWritten: number;
  /** Row state bytes the store returned. */
  readonly bytesRead: number;
  /** Row state bytes sent in check-and-sets. */
  readonly bytesWritten: number;
}

/**
 * The history workload's row figures on one backend: the size of the row every protocol
 * step reads and check-and-sets (the head row, `store.read(table, row)`) for a cell
 * written once, and for a cell updated `versions` times, with values of `valueBytes`.
 */
export interface HistoryRows {
  readonly backend: string;
  readonly valueBytes: number;
  /** Updates of each long-history cell. */
  readonly versions: number;
  /** Cells of each kind (fresh, long history). */
  readonly cells: number;
  /** Largest head row of a cell written once. */
  readonly freshRowBytes: number;
  /** Largest head row of a cell updated `versions` times. */
  readonly longRowBytes: number;
  /** Mean head row of the fresh cells, and of the long-history cells. */
  readonly freshRowMeanBytes: number;
  readonly longRowMeanBytes: number;
  /** longRowBytes / freshRowBytes. */
  readonly ratio: number;
  /** The target: 1.5 × freshRowBytes + 512. */
  readonly limitBytes: number;
  readonly withinLimit: boolean;
  /**
   * Read transactions at a current snapshot, measured in pairs by one client (a fresh
   * cell, then a long one, the order swapped every pair) so the ratio does not depend on
   * load that comes and goes; the target is long ≤ 1.5 × fresh. Absent without Percolator.
   */
  readonly reads?: {
    readonly pairs: number;
    readonly freshP50Ms: number;
    readonly longP50Ms: number;
    /** longP50Ms / freshP50Ms. */
    readonly ratio: number;
    readonly withinLimit: boolean;
  };
  /** Time taken to write the cells (not measured in any cell). */
  readonly setupMs: number;
  /** Committed single-row transactions per second while writing the long histories. */
  readonly setupTxPerSecond: number;
}

export interface ObserverFigures {
  /** Committed observer runs per second over the measured window. */
  readonly runsPerSecond: number;
  readonly runs: number;
  /** Latency samples (one per processed change). */
  readonly samples: number;
}

/** A cell (or a whole backend, or one mode of it) that did not run, and why. */
export interface SkippedCell {
  readonly backend: string;
  readonly workload?: string;
  readonly mode?: Mode;
  readonly variant?: string;
  readonly reason: string;
}

export interface BenchReport {
  readonly schema: 'percolator-bench/1';
  /** Part of every name the run created (namespaces, schemas, tables), e.g. bench_<runId>. */
  readonly runId: string;
  readonly startedAt: string;
  readonly finishedAt: string;
  readonly command: string;
  readonly host: {
    readonly cpus: number;
    readonly cpuModel: string;
    readonly node: string;
    readonly platform: string;
  };
  /** Server versions per backend, where cheap to ask. */
  readonly versions: Record<string, string>;
  readonly options: Record<string, unknown>;
  readonly results: BenchResult[];
  readonly skipped: SkippedCell[];
  readonly notes: string[];
  /** Correctness failures and errors; non-empty means the run exits non-zero. */
  readonly failures: string[];
  /** Head-row sizes per backend, where the history workload ran. */
  readonly history?: HistoryRows[];
  /**
   * `--rtt`: the round trip added to every backend call, and a round trip through a proxy
   * to an echo server as measured at the start of the run (median, ms).
   */
  readonly network?: { readonly rttMs: number; readonly measuredRttMs: number };
  /** Set when the run was stopped by a signal before it finished (it then writes no report). */
  readonly interrupted?: string;
}
