import { onAbort } from './backoff.js';
import type { PrunePolicy } from './cells.js';
import type { SharedSteps } from './commit/shared-steps.js';
import type { EventSink, TidyEvent } from './events.js';
import type { LocalCommits } from './local-commits.js';
import type { TimestampOracle } from './oracle.js';
import type { PeekBatcher } from './peek-batcher.js';
import type { TidyOptions, TidyReport } from './reports.js';
import type { RowCache } from './row-cache.js';
import type { RowReader } from './row-reader.js';
import type { RowState } from './row-state.js';
import type { RowStore, StoredRow } from './store.js';

export type CommitStep =
  | 'beforePrewrite'
  | 'afterPrewrite'
  | 'beforeCommitPrimary'
  | 'afterCommitPrimary'
  | 'afterCommitSecondary';

export interface CommitStepEvent {
  readonly step: CommitStep;
  /**
   * The commit's identity: the `startTs` its locks and records carry. For a read-write
   * transaction with a peeked snapshot, the one its commit took (docs/protocol.md 4.10), not
   * `tx.startTs`; STAMP in a one-step commit named by the store's draw.
   */
  readonly startTs: number;
  /** The transaction's snapshot, `tx.startTs` (its `startTs` unless peeked). */
  readonly snapshotTs: number;
  /**
   * The transaction committing: the `Transaction` object `db.begin()` or `db.transact`
   * gave (typed `object` here, compare it by identity). What tells apart transactions of
   * one client that share a peeked snapshot.
   */
  readonly transaction: object;
  readonly table?: string;
  readonly row?: string;
  readonly isPrimary?: boolean;
  readonly commitTs?: number;
}

export interface PercolatorHooks {
  /**
   * Called at each named commit step of a two-phase commit. It may await (to delay the
   * client there). If it throws, the transaction's client behaves as if it crashed at that
   * point: it makes no further store call for that transaction, and commit() rejects with
   * the thrown error. A one-step commit (up to `onePhaseMaxRows` rows where the store can
   * stamp several rows at once: PostgreSQL, MariaDB, Redis, memory; a one-row one wherever
   * the store stamps a row) takes no locks and calls no hook: with `onePhaseMaxRows: 1`, a
   * transaction of two rows or more goes through the steps on every store.
   */
  onCommitStep?(event: CommitStepEvent): void | Promise<void>;
}

/** What every protocol step needs: one object, built once per client. */
export interface ProtocolEnv {
  readonly store: RowStore;
  /** Snapshot reads, coalesced into batches where the store can read many rows at once. */
  readonly reader: RowReader;
  readonly oracle: TimestampOracle;
  readonly clock: () => number;
  readonly lockTtlMs: number;
  /** How long (real ms) a reader waits on a live lock before LockNotResolvedError. */
  readonly lockWaitMs: number;
  readonly prune: PrunePolicy;
  readonly hooks: PercolatorHooks;
  /** The `onEvent` listener's sink; undefined without one (then no event is built). */
  readonly events: EventSink | undefined;
  /**
   * When the store can stamp a CAS from the oracle's counter, of one row or of several
   * (it holds the counter's name): where every stamped step goes, shared by the steps of
   * one turn where the store can (group commit, shared-steps.ts).
   */
  readonly steps: SharedSteps | undefined;
  /**
   * With `steps`: the store stamps a single-row CAS (`stampedCheckAndSet`). Single-row
   * transactions then commit in one CAS, and primary commits draw their commitTs in the
   * same step.
   */
  readonly stampsOne: boolean;
  /**
   * With `steps`: the store can stamp a CAS of several rows, all or nothing, and
   * `onePhaseMaxRows` allows more than one: such transactions commit in one step.
   */
  readonly stampsMany: boolean;
  /**
   * With `stampsMany`: the store declares `stampedManyForOneRow`, so one-row
   * transactions commit through the many-row step too, carrying their moves in it.
   */
  readonly oneRowCarriesMoves: boolean;
  /** The most rows a one-step commit of several rows takes (`onePhaseMaxRows`). */
  readonly onePhaseMaxRows: number;
  /** The oracle's counter, when the store can draw a start timestamp and read in one step. */
  readonly stampedReadCounter: string | undefined;
  /**
   * The oracle's counter, when the store can read it and rows as one snapshot, writing
   * nothing (`readPeeked`): read-only transactions then take their snapshot that way.
   */
  readonly peekCounter: string | undefined;
  /**
   * With `peekCounter`: read-write transactions peek their snapshot too (the `peekedWrites`
   * option; docs/protocol.md 4.10).
   */
  readonly peekedWrites: boolean;
  /**
   * With `peekedWrites` on a store with no stamped CAS (so every commit takes two phases
   * under a drawn identity): the identity is drawn from the oracle beside the peek, not
   * after it (docs/protocol.md 4.10, "Identity ahead").
   */
  readonly identityAhead: boolean;
  /** With `peekCounter`: the peeks of this client's transactions, shared per turn (peek-batcher.ts). */
  readonly peeks: PeekBatcher | undefined;
  /** How this client chooses between a stamped first read and the batched oracle. */
  readonly stampedReads: StampedReadGauge;
  /** (table, column) pairs that carry observers: writes to them set a notification. */
  readonly observed: ReadonlySet<string>;
  /** Commits of this client holding locks: a reader that meets one waits for it (local-commits.ts). */
  readonly localCommits: LocalCommits;
  /** Work that outlives a commit (the tidy step); awaited by close(). */
  readonly background: Set<Promise<unknown>>;
  /** Whether the client is closed, and its commits in flight (close() waits for them). */
  readonly lifecycle: Lifecycle;
  /** Moves old values out of head rows, deletes pruned version rows, settles held records. */
  readonly tidier: RowTidier;
  /** Head rows as this client last saw them: guesses for a CAS's expected version (row-cache.ts). */
  readonly rowCache: RowCache | undefined;
}

/**
 * A client's open or closed state, for its transactions: once closed, a transaction's calls
 * are ClosedError. Counts the commits and the reads in flight (a number, no promise per
 * call: every commit and read passes here), so that `close()` can wait until the last one
 * has ended (a commit having handed its secondaries to the background work it then waits
 * for; a read stopping at its next step with ClosedError).
 */
export class Lifecycle {
  /** `close()` has begun: observer workers stop, and `runUntilIdle` ends with ClosedError. */
  readonly closing = new AbortController();
  private isClosed = false;
  /**
   * Lock waits of reads in progress, woken by `close()`. A set of callbacks rather than an
   * AbortSignal: a signal combined with each caller's (AbortSignal.any) stays referenced by
   * this long-lived one on Node 20, and a listener per waiting read passes Node's
   * listener warning under contention.
   */
  private readonly waits = new Set<() => void>();
  private busy = 0;
  private waiters: (() => void)[] = [];

  constructor() {
    // Lock waits end as soon as close() begins, not once the observer workers have stopped:
    // a run's read waiting on a lock kept close() waiting for lockWaitMs per attempt (found
    // in review).
    this.closing.signal.addEventListener('abort', () => this.wakeAll(), { once: true });
  }

  get closed(): boolean {
    return this.isClosed;
  }

  /** close() has begun (or is done): a lock wait stops. */
  get stopping(): boolean {
    return this.isClosed || this.closing.signal.aborted;
  }

  private wakeAll(): void {
    for (const wake of [...this.waits]) wake();
  }

  /** Later calls of the client's transactions are ClosedError; reads waiting on a lock stop. */
  close(): void {
    this.isClosed = true;
    this.wakeAll();
  }

  /**
   * Waits `ms`, or until `until` settles, `signal` aborts or the client's close() begins,
   * whichever comes first (a read's wait on a lock).
   */
  pause(ms: number, signal: AbortSignal | undefined, until?: Promise<unknown>): Promise<void> {
    return new Promise((resolve) => {
      if (this.stopping || signal?.aborted) return resolve();
      let stop: (() => void) | undefined;
      const done = () => {
        clearTimeout(timer);
        this.waits.delete(done);
        stop?.();
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.waits.add(done);
      if (signal) stop = onAbort(signal, done);
      until?.then(done, done);
    });
  }

  commitStarted(): void {
    this.busy++;
  }

  commitEnded(): void {
    this.ended();
  }

  /** A transaction's read (one row, or a page of a scan) is in flight: close() waits for it. */
  readStarted(): void {
    this.busy++;
  }

  readEnded(): void {
    this.ended();
  }

  private ended(): void {
    if (--this.busy > 0 || this.waiters.length === 0) return;
    const waiters = this.waiters;
    this.waiters = [];
    for (const resolve of waiters) resolve();
  }

  /** Resolves once no commit or read is in flight. */
  idle(): Promise<void> {
    if (this.busy === 0) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push(resolve));
  }
}

/**
 * What the protocol asks of the tidy step; `Tidier` (tidy.ts) implements it. Declared here,
 * not imported from tidy.ts, so this file of shared types depends on no protocol module.
 */
export interface RowTidier {
  /** Every secondary of the transaction at `startTs` is committed: its primary record may drop its list. */
  release(table: string, key: string, column: string, startTs: number): void;
  /** Called on every head-row state about to be written. */
  beforeWrite(table: string, key: string, state: RowState): void;
  /** Starts the background tidy batch that is waiting for more rows now (flush, close). */
  hurry(): void;
  /** A version row created by a one-step commit, with its store version: deleting it later needs no read. */
  created(table: string, key: string, version: string): void;
  /** Called after every head-row write. */
  afterWrite(table: string, key: string, state: RowState | null, stored: StoredRow | null | undefined): void;
  tidyRow(
    table: string,
    key: string,
    known?: StoredRow | null,
    options?: TidyOptions,
    trigger?: TidyEvent['trigger'],
  ): Promise<TidyReport>;
}

/**
 * A stamped read draws a timestamp of its own: one round trip less for the transaction, but
 * one counter write per transaction for the store. The batched oracle shares one counter
 * write among every transaction that asks while a fetch is in flight, at the price of
 * waiting for that fetch and then for a read. Which is faster under load depends on the
 * network and on the store (docs/protocol.md 4.1, "How the client chooses"):
 *
 * - Idle (no oracle fetch in flight or waiting, no stamped read in flight): a stamped read.
 * - Under load: the batched oracle, unless stamped first reads have lately been clearly
 *   faster (below FASTER of the oracle way's time, both measured under load on this
 *   client, each smoothed over its samples, MIN_SAMPLES of each at least): then stamped
 *   reads. At most every REFRESH_MS the way not in use is taken once, so a change of
 *   conditions is seen; that is a few calls a second at most.
 * - A store that declares `stampedReadUnderLoad` (its stamped read writes nothing durable:
 *   Redis) gets stamped reads always.
 *
 * Which way a transaction goes changes nothing but its speed: both give a timestamp drawn
 * after the transaction began, read before its rows (4.1).
 */
export class StampedReadGauge {
  inFlight = 0;
  /** What each way took, under load on this client. */
  private readonly stamped: WayTimes;
  private readonly oracle: WayTimes;

  constructor(
    private readonly oracleBusy: () => boolean,
    /** The store's `stampedReadUnderLoad`: a stamped read is as cheap as a read, so always use one. */
    private readonly underLoad = false,
    private readonly now: () => number = () => performance.now(),
  ) {
    this.stamped = new WayTimes(now());
    this.oracle = new WayTimes(now());
  }

  /** Whether a transaction starting now takes the batched oracle. A query: changes nothing. */
  preferOracle(): boolean {
    return !this.underLoad && this.loaded() && !this.stampedFaster();
  }

  /**
   * How the next first reads go: `idle` and `stamped` send a stamped read (`stamped` is
   * measured: report it with `record`), `oracle` draws from the oracle first (measured too).
   */
  choose(): 'idle' | 'stamped' | 'oracle' {
    if (this.underLoad || !this.loaded()) return 'idle';
    const stamped = this.stampedFaster();
    const unused = stamped ? this.oracle : this.stamped;
    const t = this.now();
    // Now and then the way not in use, so that its time is known when conditions change.
    if (t - unused.last >= REFRESH_MS) {
      unused.last = t;
      return stamped ? 'oracle' : 'stamped';
    }
    return stamped ? 'stamped' : 'oracle';
  }

  /** A first read under load, by `way`, had its rows after `ms`. */
  record(way: 'stamped' | 'oracle', ms: number): void {
    this[way].add(ms, this.now());
  }

  /**
   * A stamped read under load failed after `ms` and its transaction falls back to the
   * oracle: that way cost the failure and then the oracle's way, so it is counted so.
   */
  recordFailure(ms: number): void {
    this.record('stamped', ms + (this.oracle.ms ?? ms));
  }

  private loaded(): boolean {
    return this.inFlight > 0 || this.oracleBusy();
  }

  private stampedFaster(): boolean {
    const { stamped, oracle } = this;
    return (
      stamped.samples >= MIN_SAMPLES && oracle.samples >= MIN_SAMPLES && stamped.ms! < FASTER * oracle.ms!
    );
  }
}

/** One way's smoothed time (milliseconds from a first read's start to its rows), its samples, its last use. */
class WayTimes {
  ms: number | undefined = undefined;
  samples = 0;
  constructor(
    /** When it last ran under load, or was last tried. */
    public last: number,
  ) {}

  add(ms: number, now: number): void {
    this.ms = this.ms === undefined ? ms : this.ms + SMOOTHING * (ms - this.ms);
    this.samples++;
    this.last = now;
  }
}

/**
 * Stamped reads must be this much faster than the oracle's way before they are used under
 * load: they also cost the store a counter write each, which slows every other write of
 * the counter (stamped commits), and their time is measured while few of them run.
 */
const FASTER = 0.55;
/** How often, at most, the way not in use is tried under load (when a transaction starts). */
const REFRESH_MS = 250;
/** Samples of each way before stamped reads may be chosen under load (a second of tries). */
const MIN_SAMPLES = 4;
/** Weight of a new measurement in the smoothed time. */
const SMOOTHING = 0.1;

/** Keeps `job` in `background` (work `flush()` and `close()` wait for) until it settles. */
export function keepInBackground(background: Set<Promise<unknown>>, job: Promise<unknown>): void {
  background.add(job);
  void job.finally(() => background.delete(job));
}

export function observedKey(table: string, column: string): string {
  return `${table}\u0000${column}`;
}
