import type { GcReport, TidyReport } from './reports.js';

/**
 * The event interface for metrics and tracing (docs/operations.md, "Metrics and tracing").
 * One listener, `new Percolator({ store, onEvent })`, receives every event of one client.
 * Without a listener nothing here runs: no event object is built, no clock is read.
 *
 * Times are `performance.now()` milliseconds (monotonic, the same origin as
 * `performance.timeOrigin`): `time` is when the thing started, `durationMs` how long it
 * took, each measured once. Events fire when the thing they describe is over, except
 * `transaction.begin`.
 */

/** The same object in every event of one transaction. */
export interface TransactionRef {
  /** Unique per client, in begin order. */
  readonly id: number;
  /** The start timestamp once drawn (a transaction of `db.transact` draws it with its first read). */
  readonly startTs: number | undefined;
  /** 1 for `db.begin()`; the attempt number within `db.transact`. */
  readonly attempt: number;
  /**
   * The listener's own slot: whatever it keeps for this transaction (its span, say),
   * undefined until it sets it. The library never reads it. Cheaper than a WeakMap keyed by
   * the ref: a WeakMap entry per transaction cost a busy client more than the span itself
   * (each entry is an ephemeron the garbage collector must trace).
   */
  listenerState: unknown;
}

/**
 * How a transaction ended:
 * - `committed`: past its commit point (the commit resolved).
 * - `rolledBack`: `tx.rollback()`, or `db.transact`'s function threw something that is
 *   not one of the kinds below. Nothing was written.
 * - `conflict`: a write conflict, or rolled back by another client (ConflictError).
 * - `snapshotTooOld`: its snapshot was pruned (SnapshotTooOldError).
 * - `lockNotResolved`: a live lock did not clear in time (LockNotResolvedError).
 * - `aborted`: its signal fired before the commit point (AbortedError).
 * - `commitUnknown`: the commit point's outcome could not be verified (CommitUnknownError).
 * - `failed`: any other error (a store error, bad input).
 */
export type TransactionOutcome =
  | 'committed'
  | 'rolledBack'
  | 'conflict'
  | 'snapshotTooOld'
  | 'lockNotResolved'
  | 'aborted'
  | 'commitUnknown'
  | 'failed';

/**
 * The commit steps (docs/protocol.md section 4): `prewrite` (every row's lock and data),
 * `commitPrimary` (the commit timestamp and the primary's commit CAS: the commit point),
 * `secondaries` (in the background after the commit point), `onePhase` (a commit in one
 * stamped step with no locks: one row, or up to `onePhaseMaxRows` where the store writes
 * several rows in one step; docs/protocol.md 4.5), `rollback` (removing our locks after a
 * failure before the commit point).
 */
export type CommitStepName = 'prewrite' | 'commitPrimary' | 'secondaries' | 'onePhase' | 'rollback';

interface Timed {
  /** performance.now() when it started. */
  readonly time: number;
  readonly durationMs: number;
}

/** A transaction started (`db.begin()`, or an attempt of `db.transact`). Fires at once. */
export interface TransactionBeginEvent {
  readonly type: 'transaction.begin';
  readonly transaction: TransactionRef;
  /** The store's name. */
  readonly store: string;
  /** In `db.transact`, from the second attempt on: the attempt that failed before this one. */
  readonly retryOf?: TransactionRef;
  /** The observer run this transaction is an attempt of (its `observer.begin` came first). */
  readonly observerRun?: ObserverRunRef;
  /** performance.now() at the start. */
  readonly time: number;
}

/** A transaction ended: committed, rolled back or failed. Exactly once per begin, unless it is abandoned. */
export interface TransactionEndEvent extends Timed {
  readonly type: 'transaction.end';
  readonly transaction: TransactionRef;
  readonly outcome: TransactionOutcome;
  readonly startTs: number | undefined;
  readonly commitTs?: number;
  /**
   * The start timestamp its locks and records carry, where that is not `startTs`: the
   * identity of a peeked read-write snapshot's commit (docs/protocol.md 4.10), which is what
   * a lock it leaves names. Absent where it is `startTs`, and for a one-step commit that
   * failed (its identity was to be the store's draw).
   */
  readonly identityTs?: number | undefined;
  /** Rows and distinct tables written (0 for a read-only transaction). */
  readonly rows: number;
  readonly tables: number;
  /** The error, for every outcome but `committed` and an explicit rollback. */
  readonly error?: unknown;
}

/**
 * `db.transact` runs its function again after a retryable failure (the attempt's end came
 * first). Emitted after the backoff, once the next attempt will run (`time` is when the
 * retry was decided): none when a signal or `close()` ends `transact` during the backoff.
 */
export interface TransactionRetryEvent {
  readonly type: 'transaction.retry';
  /** The attempt that failed. */
  readonly transaction: TransactionRef;
  /** The number of the next attempt. */
  readonly nextAttempt: number;
  /** The backoff before it. */
  readonly backoffMs: number;
  readonly error: unknown;
  readonly time: number;
}

/** One commit step finished (or failed: `error`). */
export interface CommitStepEndEvent extends Timed {
  readonly type: 'commit.step';
  readonly transaction: TransactionRef;
  readonly step: CommitStepName;
  /**
   * The commit's identity: the start timestamp its locks and records carry (for a peeked
   * read-write snapshot, the one its commit took, not `tx.startTs`: docs/protocol.md 4.10).
   * Undefined only for a one-step commit named by the store's draw that failed, or that
   * the store refused as too large (then a two-phase commit under a drawn identity
   * follows): a blind write's, or a peeked snapshot's. The store draws that identity with
   * the commit timestamp (equal to it once committed).
   */
  readonly startTs: number | undefined;
  /** Known once the commit point is passed. */
  readonly commitTs?: number;
  /** Rows the step wrote (or tried to). */
  readonly rows: number;
  readonly error?: unknown;
}

/**
 * A one-step commit named by the store's draw (a blind write, a peeked snapshot's commit)
 * lost its reply, and one of its rows, still at the version the step expected, was fenced
 * (docs/protocol.md 4.11): `fenced`, the lost step can never land and the commit is sent
 * again; `refused`, the row changed since the re-read (the step may have landed: unless
 * another row can be fenced, the commit ends CommitUnknownError); `failed`, the fence's
 * own outcome is unknown, or the store refused it with certainty on every send.
 */
export interface CommitFenceEvent extends Timed {
  readonly type: 'commit.fence';
  readonly transaction: TransactionRef | undefined;
  readonly table: string;
  readonly row: string;
  readonly outcome: 'fenced' | 'refused' | 'failed';
}

/**
 * A read met a lock at or below its snapshot and waited for it to be resolved: from the
 * first meeting until the read went on (`resolved`), gave up (`timedOut`:
 * LockNotResolvedError) or was stopped (`aborted`, or `failed` on any other error).
 */
export interface LockWaitEvent extends Timed {
  readonly type: 'lock.wait';
  readonly transaction: TransactionRef;
  readonly table: string;
  readonly row: string;
  /** The lock owner's start timestamp (the last one met, if several). */
  readonly lockStartTs: number;
  readonly outcome: 'resolved' | 'timedOut' | 'aborted' | 'failed';
}

/**
 * A lock left by another transaction was settled through its primary (docs/protocol.md
 * section 5): `rolledForward` (its transaction committed) or `rolledBack`. `by` is what
 * met it: a `read`, a `prewrite` of ours, or an `operator` (`db.resolveLocks`, the CLI's
 * `resolve`).
 */
export interface LockResolveEvent extends Timed {
  readonly type: 'lock.resolve';
  readonly transaction: TransactionRef | undefined;
  readonly by: 'read' | 'prewrite' | 'operator';
  readonly table: string;
  readonly row: string;
  readonly lockStartTs: number;
  readonly outcome: 'rolledForward' | 'rolledBack';
  /** For `rolledForward`: the owner's commit timestamp. */
  readonly commitTs?: number;
}

/**
 * One tidy pass over one head row (docs/protocol.md section 7): `background` after a
 * commit, `pressure` before a write to a full row, `gc` from `db.tidy()` and `db.gc()`.
 */
export interface TidyEvent extends Timed {
  readonly type: 'tidy';
  readonly store: string;
  readonly table: string;
  readonly row: string;
  readonly trigger: 'background' | 'pressure' | 'gc';
  /** What it did; undefined if it failed. */
  readonly report: TidyReport | undefined;
  readonly error?: unknown;
}

/** `db.gc()` (the CLI's `gc`) finished: one table, or one row of it. */
export interface GcEvent extends Timed {
  readonly type: 'gc';
  readonly store: string;
  readonly table: string;
  readonly row?: string;
  readonly dryRun: boolean;
  /** What it freed (or would free, dry); undefined if it failed. */
  readonly report: GcReport | undefined;
  readonly error?: unknown;
}

/**
 * The same object in the `observer.begin` and `observer.run` events of one observer run, and
 * in the `transaction.begin` of each transaction the run makes (`observerRun`), so a
 * listener can put those transactions under the run (the OpenTelemetry adapter makes the
 * run's span their parent).
 */
export interface ObserverRunRef {
  readonly observer: string;
  /** The listener's own slot, as `TransactionRef.listenerState`. The library never reads it. */
  listenerState: unknown;
}

/**
 * An observer worker starts one run of one observer on one notified cell. Fires at once;
 * its `observer.run` follows when the run ends, whatever the outcome.
 */
export interface ObserverBeginEvent {
  readonly type: 'observer.begin';
  readonly run: ObserverRunRef;
  readonly store: string;
  readonly observer: string;
  readonly table: string;
  readonly row: string;
  readonly column: string;
  /** performance.now() at the start (the `time` of its `observer.run` too). */
  readonly time: number;
}

/** One observer run of an observer worker on one notified cell, its retries included. */
export interface ObserverRunEvent extends Timed {
  readonly type: 'observer.run';
  /** The ref its `observer.begin` carried. */
  readonly run: ObserverRunRef;
  readonly observer: string;
  readonly table: string;
  readonly row: string;
  readonly column: string;
  /** `ran`: the handler's transaction committed; `skipped`: the ack showed the change handled; `failed`. */
  readonly outcome: 'ran' | 'skipped' | 'failed';
  readonly startTs?: number;
  readonly commitTs?: number;
  readonly error?: unknown;
}

export type PercolatorEvent =
  | TransactionBeginEvent
  | TransactionEndEvent
  | TransactionRetryEvent
  | CommitStepEndEvent
  | CommitFenceEvent
  | LockWaitEvent
  | LockResolveEvent
  | TidyEvent
  | GcEvent
  | ObserverBeginEvent
  | ObserverRunEvent;

export type PercolatorEventListener = (event: PercolatorEvent) => void;

/**
 * Delivers events to the listener. A listener that throws (or returns a rejected promise)
 * never changes what the library does: the error is reported once per client on
 * console.warn, and later ones are dropped.
 */
export class EventSink {
  private nextId = 1;
  private reported = false;

  constructor(
    private readonly listener: PercolatorEventListener,
    readonly store: string,
  ) {}

  /** The next transaction id of this client. */
  newTransaction(): number {
    return this.nextId++;
  }

  emit(event: PercolatorEvent): void {
    try {
      const result = this.listener(event) as unknown;
      if (result !== undefined && typeof (result as PromiseLike<unknown>).then === 'function') {
        (result as Promise<unknown>).then(undefined, (error: unknown) => this.report(error));
      }
    } catch (error) {
      this.report(error);
    }
  }

  private report(error: unknown): void {
    if (this.reported) return;
    this.reported = true;
    console.warn('percolator: an onEvent listener threw; its errors are ignored from now on:', error);
  }
}
