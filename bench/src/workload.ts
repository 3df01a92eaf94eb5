/**
 * What a workload is: the types every workload module (workloads.ts, history.ts,
 * observers.ts) shares. Kept apart from the workload list so that those modules and the
 * list do not import each other.
 */
import type { OpenBackend } from './backends.js';
import type { DatasetShape } from './dataset.js';
import type { Engine, LogicalTable } from './engines/engine.js';
import type { CheckKind, Ledger } from './ledger.js';
import type { Random } from './random.js';
import type { CheckOutcome, HistoryRows, Mode } from './types.js';

/** What a worker gets: its engine, the data set's shape, its own random source and the ledger. */
export interface WorkerContext {
  readonly engine: Engine;
  readonly shape: DatasetShape;
  readonly concurrency: number;
  readonly index: number;
  readonly random: Random;
  readonly ledger: Ledger;
  readonly seed: number;
  readonly opsPerTxn: number;
}

/**
 * One transaction (or timestamp); resolves to the number of attempts it took, or to that
 * and its own latency where the wall time of the step is not the figure to report.
 */
export type Step = () => Promise<number | StepOutcome>;

export interface StepOutcome {
  readonly attempts: number;
  readonly latencyMs: number;
}

/** A workload with state of its own for one cell (the observer pipeline's workers). */
export interface WorkloadSession {
  step(index: number): Step;
  /** Committed observer runs so far (the observer pipeline), for runs per second. */
  observerRuns?(): number;
  /** After the measured window: checks the outcome (not measured). */
  verify(): Promise<CheckOutcome>;
  close(): Promise<void>;
}

/** What a workload's `prepare` gets: the backend, once per run, before its cells. */
export interface PrepareContext {
  readonly backend: OpenBackend;
  readonly options: WorkloadSettings;
  /** Set when the run is interrupted: stop and throw. */
  readonly signal?: AbortSignal;
  /** A progress line. */
  info(line: string): void;
}

/** The run's settings a workload reads (a part of BenchOptions). */
export interface WorkloadSettings {
  /** History workload: cells of each kind (default per backend). */
  readonly historyCells?: number;
  /** History workload: updates of each long-history cell. */
  readonly historyVersions: number;
}

/** What a `prepare` made; figures in it go into the report. */
export interface Prepared {
  readonly history?: HistoryRows;
}

/** Data some workloads share on one backend, made once (not measured) before their cells. */
export interface WorkloadPrepare {
  /** Workloads with the same key share one preparation. */
  readonly key: string;
  run(ctx: PrepareContext): Promise<Prepared>;
}

export interface Workload {
  readonly name: string;
  readonly description: string;
  readonly modes: readonly Mode[];
  /** The table the workload uses: loaded before it runs, and snapshotted for the checks that write. */
  readonly table?: LogicalTable;
  readonly check: CheckKind | 'session';
  /** Rows one transaction touches, to skip engines with a smaller limit. */
  rowsPerTxn(opsPerTxn: number): number;
  /** Runs on single-row engines (raw) as one-row legs, whatever `rowsPerTxn` says. */
  readonly singleRowLegs?: boolean;
  /** Why this workload cannot run on `engine` with this shape, if it cannot. */
  unsupported?(engine: Engine, shape: DatasetShape, concurrency: number): string | undefined;
  worker(ctx: WorkerContext): Step;
  /** Set for workloads that need data of their own, made once per backend before their cells. */
  readonly prepare?: WorkloadPrepare;
  /** Set for workloads that run through a session instead of `worker`. */
  session?(
    engine: Engine,
    cell: {
      readonly concurrency: number;
      readonly shape: DatasetShape;
      /** What `prepare` made on this backend. */
      readonly prepared?: unknown;
    },
  ): Promise<WorkloadSession>;
}
