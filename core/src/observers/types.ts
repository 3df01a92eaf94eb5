import type { Transaction } from '../transaction.js';

/** What an observer's handler is told: the notified cell. */
export interface NotifiedCell {
  readonly table: string;
  readonly row: string;
  readonly column: string;
}

export interface Observer {
  /** Unique per deployment: the ack is kept under this name. [A-Za-z0-9_.-], 1-64 characters. */
  readonly name: string;
  /** The observed (table, column). */
  readonly table: string;
  readonly column: string;
  /**
   * Runs in a transaction of its own, which the worker commits (with the observer's ack):
   * the handler must not commit or roll it back itself (the run fails with an
   * InvalidArgumentError). Throw to fail the run: it is retried with backoff and the
   * notification stays until a run succeeds.
   */
  readonly handler: (tx: Transaction, cell: NotifiedCell) => Promise<void>;
  /**
   * A weak observer runs on every notification of its cell, with no ack: it never
   * conflicts on an ack, and may run more than once per change. Default false (strong:
   * at most one committed run per change, several changes collapse into one run).
   */
  readonly weak?: boolean;
}

/** Reported after every committed run (for metrics and tests). */
export interface RunEvent extends NotifiedCell {
  readonly observer: string;
  /** The run's transaction. */
  readonly startTs: number;
  readonly commitTs: number;
}

/** Reported when a run fails; the notification stays and the run is retried later. */
export interface RunFailure extends NotifiedCell {
  readonly observer: string;
  /** Consecutive failures of this observer on this cell in this worker. */
  readonly attempt: number;
  /** Wall ms until the next attempt. */
  readonly retryInMs: number;
}

export interface WorkerOptions {
  readonly observers: readonly Observer[];
  /**
   * Background scanning loops (start()), and rows processed at once by runUntilIdle().
   * Default 4, at most 65,536.
   */
  readonly concurrency?: number;
  /**
   * How long a row lease lasts; renewed every third of it while the row is processed.
   * Default 10 000. This and the other durations: integers from 1 to 2^31 - 1 ms, what
   * Node's timers keep (batchSize at most 100,000, maxRunAttempts at most 1,000).
   */
  readonly leaseMs?: number;
  /** Wall clock for lease expiry (default: the client's clock). */
  readonly clock?: () => number;
  /** Longest sleep of an idle background loop; it polls faster right after finding work. Default 200. */
  readonly idlePollMs?: number;
  /** Keys asked from the notification index per page. Default 64. */
  readonly batchSize?: number;
  /**
   * Backoff after a failed run: base doubling per consecutive failure, capped. Default 100 / 30 000 ms.
   * runUntilIdle() waits the same (with full jitter) after a pass that failed retryably.
   */
  readonly retry?: { readonly baseMs?: number; readonly maxMs?: number };
  /** Attempts of one run on conflicts and other retryable errors before it counts as failed. Default 5. */
  readonly maxRunAttempts?: number;
  /**
   * Called when a run fails, and on store errors while scanning (failure undefined).
   * Default: console.warn, except for retryable errors (conflicts, busy locks): those are
   * contention, retried with the same backoff and counted in `stats`.
   */
  readonly onError?: (error: unknown, failure: RunFailure | undefined) => void;
  /** Called after each committed run. */
  readonly onRun?: (event: RunEvent) => void;
}

export interface WorkerStats {
  /** Committed handler runs. */
  runs: number;
  /** Runs skipped because the ack showed the change was already handled. */
  skipped: number;
  /** Attempts that ended in a retryable error (mostly ack conflicts with a concurrent run). */
  conflicts: number;
  /** Runs that failed (handler threw, or retryable errors outlasted maxRunAttempts). */
  failures: number;
  /** Notifications cleared. */
  cleared: number;
  /** Rows skipped because another worker held their lease. */
  leaseBusy: number;
  /** Times a background loop jumped to a new random position. */
  jumps: number;
  /** Rows read because the index listed them. */
  rowsScanned: number;
}

export interface RunUntilIdleOptions {
  /**
   * Reject with an error naming the pending rows (or with the last retryable error as its
   * cause) if not idle within this time. Default: no limit.
   */
  readonly timeoutMs?: number;
}
