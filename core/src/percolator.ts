import { backoffMs, onAbort, sleep } from './backoff.js';
import type { PrunePolicy } from './cells.js';
import { checkedStore } from './checked-store.js';
import { abortedError } from './commit/context.js';
import { SharedSteps } from './commit/shared-steps.js';
import { Lifecycle, observedKey, type PercolatorHooks, type ProtocolEnv, StampedReadGauge } from './env.js';
import { ClosedError, InvalidArgumentError, isRetryable, UnsupportedOperationError } from './errors.js';
import { EventSink, type ObserverRunRef, type PercolatorEventListener } from './events.js';
import { addGcReports, emptyGcReport, type GcOptions, type GcReport, gcRow } from './gc.js';
import { LocalCommits } from './local-commits.js';
import { validateColumn, validateRowKey, validateUserTable } from './names.js';
import type { WorkerOptions } from './observers/types.js';
import { ObserverWorker, validateObservers } from './observers/worker.js';
import {
  checkBooleans,
  checkedClock,
  checkFunction,
  checkInteger,
  checkOptionKeys,
  checkSignal,
  MAX_TIMER_MS,
  type OptionKeys,
} from './options.js';
import { CounterOracle, checkedOracle, type TimestampOracle } from './oracle.js';
import { PeekBatcher } from './peek-batcher.js';
import { type ResolvedLock, type ResolveOptions, resolveRowLocks } from './resolve.js';
import { RowCache } from './row-cache.js';
import { RowReader } from './row-reader.js';
import { readRow } from './row-update.js';
import { MAX_SHARED_CALLS_IN_FLIGHT } from './sharing.js';
import { isRowStore, type RowStore } from './store.js';
import { Tidier, type TidyOptions, type TidyReport } from './tidy.js';
import { Transaction } from './transaction.js';

export interface PercolatorOptions {
  readonly store: RowStore;
  /**
   * Default: a CounterOracle over the store's atomic counter, so every client of the same
   * store, in any process, shares one timestamp order. A given oracle's values are checked
   * (integers from 1 to MAX_TIMESTAMP, increasing); the client never closes it.
   */
  readonly oracle?: TimestampOracle;
  /**
   * Lock time-to-live; a committing client refreshes its primary lock every ttl/3. Default
   * 5000. An integer from 1 to 2^31 - 1 (the range of Node's timers), as `lockWaitMs`.
   */
  readonly lockTtlMs?: number;
  /**
   * How long a reader waits on a live lock before LockNotResolvedError: an integer from 0 to
   * 2^31 - 1. Default 2 × lockTtlMs (at most 2^31 - 1).
   */
  readonly lockWaitMs?: number;
  /**
   * Wall clock used for lock expiry and pruning, in milliseconds. Default Date.now. Every
   * reading is checked: one that is not a number from 0 to 2^53 - 1 is never written
   * anywhere, and fails the call that took it with InvalidArgumentError (or, where an
   * earlier send of the commit may still land, CommitUnknownError); a fraction is rounded
   * down.
   */
  readonly clock?: () => number;
  /** Old-version pruning (docs/protocol.md section 7). */
  readonly gc?: Partial<PrunePolicy>;
  /**
   * (table, column) pairs that have observers: writes to them leave a notification. Every
   * client that may write an observed column must list it (a write by a client that does
   * not know leaves no notification); `db.worker()` adds its own observers' columns to the
   * client it is created on. See docs/observers.md.
   */
  readonly observedColumns?: ReadonlyArray<{ readonly table: string; readonly column: string }>;
  /**
   * Test hooks at named commit steps: they may delay the client or simulate its crash.
   * For metrics and tracing use `onEvent`.
   */
  readonly hooks?: PercolatorHooks;
  /**
   * Receives this client's events for metrics and tracing: transactions, commit steps,
   * lock waits and resolutions, retries, tidy passes, observer runs, each with timing
   * (docs/operations.md, "Metrics and tracing"; `@percolator/opentelemetry` turns them
   * into spans and metrics). Called synchronously: keep it cheap. An error it throws is
   * reported once and never affects a transaction. Without it no event is built.
   */
  readonly onEvent?: PercolatorEventListener;
  /**
   * Bytes of head rows this client remembers as it writes them and reads them in
   * transactions that may write (default 8 MiB; 0: none). The bound is on the memory kept
   * alive: a row that is a view into a larger buffer counts that buffer, once. A write to a
   * row it remembers goes straight to its CAS, expecting the remembered version, instead
   * of reading the row first: a one-row blind write is then one round trip. A row that has
   * changed since costs one failed CAS, which returns the row as it is (row-cache.ts says
   * why a guess is never a wrong write).
   */
  readonly rowCacheBytes?: number;
  /**
   * The most rows a transaction may write and still commit in one step, where the store
   * can write several rows and draw their commit timestamp in one atomic step (capability
   * `stampedCheckAndSetMany`: PostgreSQL, MySQL/MariaDB, standalone Redis, memory). Such a
   * commit takes no locks and is one round trip (docs/protocol.md 4.5). Default 16; 1 keeps
   * every multi-row transaction on the two-phase path (prewrite, commit point,
   * secondaries), as on stores without the capability. A one-row transaction commits in one
   * step wherever the store stamps a single row, whatever this says; where the store also
   * has the many-row step and declares it as cheap as one row's (`stampedManyForOneRow`:
   * Redis, memory) and this is above 1, the old values its commit moves out of the head
   * row go in that step with it (docs/protocol.md 7.2), else the tidy step moves them.
   */
  readonly onePhaseMaxRows?: number;
  /**
   * Group commit (default true): the stamped steps (one-step commits, stamped primary
   * commits) that this client's transactions send in the same turn of the event loop go to
   * the store as one atomic step with one commit timestamp, where the store can write
   * several rows in one stamped step (`stampedCheckAndSetMany`): one call, one draw from
   * the oracle's counter and one commit for several transactions (on PostgreSQL, where a
   * draw holds the counter row until it is durable, one flush; docs/protocol.md 4.5,
   * "Shared stamped steps"). false: each step goes on its own.
   */
  readonly groupCommit?: boolean;
  /**
   * How many calls this client splits its shared peeks and shared stamped steps into under
   * load, an integer from 1 to 64 (docs/protocol.md 4.1, "Shared calls in flight").
   * Default: the store's cost hint of that name (3 on standalone Redis, else 1). 1 sends one
   * call for all that a turn of the event loop asks, the fewest calls; more lets the
   * client work on one call's replies while the store answers the next. With a network
   * round trip far above the client's work per transaction, the fewest calls can be a
   * little faster (on Redis with a 1 ms round trip: reads 1.02 of a raw read with 1, 0.97
   * with 3).
   */
  readonly sharedCallsInFlight?: number;
  /**
   * Peeked snapshots for read-write transactions (docs/protocol.md 4.10): a transaction
   * takes its snapshot as a read-only one does, from the oracle counter's value with its
   * first reads (`peekedRead`: one round trip that draws and writes nothing), and its
   * commit gets its own timestamp: in the one-step commit, the value the store draws for
   * it; otherwise one drawn at commit. Saves the draw of a start timestamp: on PostgreSQL
   * and MySQL/MariaDB a durable write to the counter row, which every draw waits its turn
   * for. The price: a one-step commit whose reply is lost ends CommitUnknownError (its
   * rows carry only the value the store drew, which the client never learnt), where a
   * transaction with a drawn start timestamp reads its rows and finds out.
   * On a store with no stamped CAS (DynamoDB) every commit takes two phases under an
   * identity drawn from the oracle beside the peek, so the snapshot and the identity cost
   * one round trip, where a drawn start timestamp and the first reads cost two.
   * Needs the default oracle and `peekedRead`. Default: true where a draw costs the store
   * more than a read does (`stampedReadUnderLoad` false: PostgreSQL, MySQL/MariaDB,
   * DynamoDB, memory), false where it does not (standalone Redis).
   */
  readonly peekedWrites?: boolean;
}

/** The default of `onePhaseMaxRows`. */
export const DEFAULT_ONE_PHASE_MAX_ROWS = 16;

/** The default of `rowCacheBytes`. */
export const DEFAULT_ROW_CACHE_BYTES = 8 * 1024 * 1024;

export interface TransactOptions {
  /** Attempts before giving up with the last retryable error (a ConflictError for conflicts). Default 10. */
  readonly maxAttempts?: number;
  /**
   * Aborts the transaction: reads and lock waits stop at once, a commit that has not passed
   * its commit point rolls back, and `transact` rejects with AbortedError. A transaction
   * past its commit point is committed and `transact` resolves.
   */
  readonly signal?: AbortSignal;
  /**
   * A deadline for the whole call, attempts and backoff included: as a signal firing after
   * this many ms. 0 to 2^31 - 1 (the range of Node's timers); a fraction rounds up. 0 is a
   * deadline already past: AbortedError at once, `fn` never runs (as a timer of 0 ms, it
   * depended on whether the store answered within one turn of the event loop).
   */
  readonly timeoutMs?: number;
  /**
   * The function only reads: a write is an UnsupportedOperationError. On a store with
   * `peekedRead` (and the default oracle) the snapshot then costs no timestamp draw: its
   * first reads and the oracle counter's value come back in one round trip that writes
   * nothing (docs/protocol.md 4.1, "Peeked snapshots"). Its start timestamp may be shared
   * with other read-only transactions. Default false.
   */
  readonly readOnly?: boolean;
}

const CLIENT_OPTIONS: OptionKeys<PercolatorOptions> = {
  store: true,
  oracle: true,
  lockTtlMs: true,
  lockWaitMs: true,
  clock: true,
  gc: true,
  observedColumns: true,
  hooks: true,
  onEvent: true,
  rowCacheBytes: true,
  onePhaseMaxRows: true,
  groupCommit: true,
  sharedCallsInFlight: true,
  peekedWrites: true,
};
const GC_OPTIONS: OptionKeys<PrunePolicy> = {
  retentionMs: true,
  maxVersionsPerCell: true,
  inlineHistoryBytes: true,
  versionBlockBytes: true,
};

/** The largest version block by default, or half the store's largest row if that is less. */
const DEFAULT_VERSION_BLOCK_BYTES = 64 * 1024;

export const DEFAULT_PRUNE_POLICY: PrunePolicy = {
  retentionMs: 60_000,
  maxVersionsPerCell: 32,
  inlineHistoryBytes: 512,
};

/** A client of one store. Cheap to create; many may share a store. */
export class Percolator {
  readonly store: RowStore;
  private readonly env: ProtocolEnv;
  /** The same set as env.observed: worker() adds to it. */
  private readonly observed: Set<string>;
  private readonly workers = new Set<ObserverWorker>();
  private closed = false;

  constructor(options: PercolatorOptions) {
    checkOptionKeys<PercolatorOptions>('Percolator', options, CLIENT_OPTIONS);
    if (!isRowStore(options.store)) {
      throw new InvalidArgumentError(
        typeof (options.store as { then?: unknown } | undefined)?.then === 'function'
          ? 'Percolator needs a store, and was given a Promise: await the store factory (createPostgresStore and the others are async)'
          : "Percolator needs a store: a RowStore (read, checkAndSet, close, capabilities), such as new MemoryStore() or an adapter's",
      );
    }
    if (options.gc !== undefined) checkOptionKeys<PrunePolicy>('Percolator gc', options.gc, GC_OPTIONS);
    const store = checkedStore(options.store);
    // Timer-driven values (the heartbeat every lockTtlMs / 3, a lock wait) stay within
    // what Node's timers keep: a longer delay fires after 1 ms.
    const lockTtlMs = options.lockTtlMs ?? 5000;
    checkInteger('lockTtlMs', lockTtlMs, 1, MAX_TIMER_MS);
    const lockWaitMs = options.lockWaitMs ?? Math.min(2 * lockTtlMs, MAX_TIMER_MS);
    checkInteger('lockWaitMs', lockWaitMs, 0, MAX_TIMER_MS);
    if (options.clock !== undefined) checkFunction('clock', options.clock);
    if (options.hooks !== undefined) {
      checkOptionKeys<PercolatorHooks>('Percolator hooks', options.hooks, { onCommitStep: true });
      if (options.hooks.onCommitStep !== undefined)
        checkFunction('hooks.onCommitStep', options.hooks.onCommitStep);
    }
    const gc = options.gc ?? {};
    const prune: PrunePolicy = {
      retentionMs: gc.retentionMs ?? DEFAULT_PRUNE_POLICY.retentionMs,
      maxVersionsPerCell: gc.maxVersionsPerCell ?? DEFAULT_PRUNE_POLICY.maxVersionsPerCell,
      inlineHistoryBytes: gc.inlineHistoryBytes ?? DEFAULT_PRUNE_POLICY.inlineHistoryBytes,
      // A block must fit a row of the store with room to spare.
      versionBlockBytes:
        gc.versionBlockBytes ??
        Math.min(DEFAULT_VERSION_BLOCK_BYTES, Math.floor(store.capabilities.maxStateBytes / 2)),
    };
    // Infinity keeps versions whatever their age (the CLI's resolve and dump prune nothing).
    if (prune.retentionMs !== Number.POSITIVE_INFINITY) checkInteger('gc.retentionMs', prune.retentionMs, 0);
    checkInteger('gc.maxVersionsPerCell', prune.maxVersionsPerCell, 1);
    checkInteger('gc.inlineHistoryBytes', prune.inlineHistoryBytes, 0);
    // A block is one version row: one larger than the store's rows could never be written.
    checkInteger('gc.versionBlockBytes', prune.versionBlockBytes, 0, store.capabilities.maxStateBytes);
    if (options.onEvent !== undefined) checkFunction('onEvent', options.onEvent);
    const rowCacheBytes = options.rowCacheBytes ?? DEFAULT_ROW_CACHE_BYTES;
    checkInteger('rowCacheBytes', rowCacheBytes, 0);
    const onePhaseMaxRows = options.onePhaseMaxRows ?? DEFAULT_ONE_PHASE_MAX_ROWS;
    checkInteger('onePhaseMaxRows', onePhaseMaxRows, 1);
    if (options.groupCommit !== undefined && typeof options.groupCommit !== 'boolean')
      throw new InvalidArgumentError('groupCommit must be a boolean');
    if (options.peekedWrites !== undefined && typeof options.peekedWrites !== 'boolean')
      throw new InvalidArgumentError('peekedWrites must be a boolean');
    const observed = new Set<string>();
    const { observedColumns = [] } = options;
    if (!Array.isArray(observedColumns))
      throw new InvalidArgumentError('observedColumns must be an array of { table, column }');
    for (const [i, entry] of observedColumns.entries()) {
      // Other fields are let through: an observer ({ table, column, ... }) may be listed as is.
      if (typeof entry !== 'object' || entry === null)
        throw new InvalidArgumentError(`observedColumns[${i}] must be a { table, column } object`);
      const { table, column } = entry as { table: string; column: string };
      try {
        validateUserTable(table);
        validateColumn(column);
      } catch (error) {
        throw error instanceof InvalidArgumentError
          ? new InvalidArgumentError(`observedColumns[${i}]: ${error.message}`)
          : error;
      }
      observed.add(observedKey(table, column));
    }
    const defaultOracle = options.oracle === undefined ? new CounterOracle(store) : undefined;
    // A caller's oracle: each value checked before it is used (oracle.ts, CheckedOracle).
    const oracle = options.oracle === undefined ? defaultOracle! : checkedOracle(options.oracle);
    this.store = store;
    this.observed = observed;
    const peekCounter =
      defaultOracle && store.capabilities.peekedRead === true && store.readPeeked
        ? defaultOracle.counterName
        : undefined;
    // Stamped commits need the write and the commit timestamp drawn in one atomic step
    // from the same counter the oracle uses: only possible with the default oracle. The
    // single-row and the many-row stamped CAS are separate capabilities.
    const stampsOne = !!defaultOracle && store.capabilities.stampedCheckAndSet && !!store.checkAndSetStamped;
    const storeStampsMany =
      !!defaultOracle && store.capabilities.stampedCheckAndSetMany === true && !!store.checkAndSetStampedMany;
    const peekedWrites =
      peekCounter !== undefined && (options.peekedWrites ?? store.capabilities.stampedReadUnderLoad !== true);
    if (options.sharedCallsInFlight !== undefined)
      checkInteger('sharedCallsInFlight', options.sharedCallsInFlight, 1, MAX_SHARED_CALLS_IN_FLIGHT);
    const declared = store.capabilities.sharedCallsInFlight;
    if (declared !== undefined)
      checkInteger('store.capabilities.sharedCallsInFlight', declared, 1, MAX_SHARED_CALLS_IN_FLIGHT);
    const callsInFlight = options.sharedCallsInFlight ?? declared ?? 1;
    const env: Omit<ProtocolEnv, 'tidier'> & { tidier?: Tidier } = {
      store,
      reader: new RowReader(store, (table, key) => readRow(this.env, table, key)),
      oracle,
      clock: options.clock ? checkedClock('clock', options.clock) : Date.now,
      lockTtlMs,
      lockWaitMs,
      prune,
      hooks: options.hooks ?? {},
      events: options.onEvent ? new EventSink(options.onEvent, store.name) : undefined,
      steps:
        defaultOracle && (stampsOne || storeStampsMany)
          ? new SharedSteps(store, defaultOracle.counterName, {
              one: stampsOne,
              share: storeStampsMany && options.groupCommit !== false,
              callsInFlight,
            })
          : undefined,
      stampsOne,
      // One atomic stamped write of many rows: the same counter, and rows to spare.
      stampsMany: onePhaseMaxRows > 1 && storeStampsMany,
      oneRowCarriesMoves: store.capabilities.stampedManyForOneRow === true,
      onePhaseMaxRows,
      // A first read stamped with the start timestamp must draw it from the oracle's counter.
      stampedReads: new StampedReadGauge(
        () => (defaultOracle ? defaultOracle.busy : true),
        store.capabilities.stampedReadUnderLoad === true,
      ),
      stampedReadCounter:
        defaultOracle && store.capabilities.stampedRead === true && store.readStamped
          ? defaultOracle.counterName
          : undefined,
      peekCounter,
      // A peeked snapshot identifies nothing: its one-step commit takes the value the store
      // draws as the transaction's identity, any other commit one drawn from the oracle
      // (transaction.ts, commitMutations); where no commit takes one step, drawn ahead.
      peekedWrites,
      identityAhead: peekedWrites && !stampsOne,
      peeks: peekCounter !== undefined ? new PeekBatcher(store, peekCounter, callsInFlight) : undefined,
      observed,
      localCommits: new LocalCommits(),
      background: new Set(),
      lifecycle: new Lifecycle(),
      rowCache: rowCacheBytes > 0 ? new RowCache(rowCacheBytes) : undefined,
    };
    env.tidier = new Tidier(env as ProtocolEnv);
    this.env = env as ProtocolEnv;
  }

  /**
   * Starts a transaction; drive it by hand with get/set/commit/rollback. With `readOnly`
   * (as for `transact`) its snapshot is peeked where the store can, and writes are refused;
   * without, it is peeked with `peekedWrites`, else drawn from the oracle.
   */
  async begin(options: { readonly readOnly?: boolean } = {}): Promise<Transaction> {
    if (this.closed) throw new ClosedError('this Percolator client is closed');
    checkOptionKeys<{ readOnly?: boolean }>('begin', options, { readOnly: true });
    if (options.readOnly !== undefined && typeof options.readOnly !== 'boolean')
      throw new InvalidArgumentError('readOnly must be a boolean');
    if (options.readOnly || this.env.peekedWrites) {
      // A peeked snapshot (a read-only transaction's, or with `peekedWrites`): a peek of no
      // rows, which draws and writes nothing.
      const tx = new Transaction(this.env, undefined, undefined, 1, undefined, options.readOnly === true);
      try {
        await tx.ready();
      } catch (error) {
        // Its begin event has gone out: its end goes too (a span left open otherwise).
        await tx.rollbackAfter(error);
        throw error;
      }
      return tx;
    }
    return this.beginDrawn();
  }

  /**
   * @internal A read-write transaction whose start timestamp is drawn, never peeked: an
   * observer run's (observers/run.ts). Its ack is its start timestamp, read as "every
   * write committed at or below it was seen", which holds only for a drawn one (a peeked
   * snapshot can equal a later commit timestamp, docs/protocol.md 4.10), and its commit is
   * named by it, which the next run compares with the ack.
   */
  async beginDrawn(observerRun?: ObserverRunRef): Promise<Transaction> {
    if (this.closed) throw new ClosedError('this Percolator client is closed');
    return new Transaction(
      this.env,
      await this.env.oracle.next(),
      undefined,
      1,
      undefined,
      false,
      observerRun,
    );
  }

  /**
   * Runs `fn` in a transaction and commits it. On a retryable failure (conflict, a lock
   * that would not clear, a snapshot too old) the WHOLE function runs again with a new
   * start timestamp: buffered writes are never re-applied. An error thrown by `fn` itself
   * is rethrown unchanged; a CommitUnknownError is never retried.
   */
  async transact<T>(fn: (tx: Transaction) => Promise<T>, options: TransactOptions = {}): Promise<T> {
    checkFunction('transact', fn);
    checkOptionKeys<TransactOptions>('transact', options, {
      maxAttempts: true,
      signal: true,
      timeoutMs: true,
      readOnly: true,
    });
    if (options.readOnly !== undefined && typeof options.readOnly !== 'boolean')
      throw new InvalidArgumentError('readOnly must be a boolean');
    const maxAttempts = options.maxAttempts ?? 10;
    const { timeoutMs } = options;
    // A fraction of a millisecond is rounded up (a deadline never fires early); past the
    // timers' range AbortSignal.timeout would throw a RangeError, or fire at once.
    if (
      timeoutMs !== undefined &&
      !(typeof timeoutMs === 'number' && timeoutMs >= 0 && timeoutMs <= MAX_TIMER_MS)
    )
      throw new InvalidArgumentError(`timeoutMs must be a number of milliseconds from 0 to ${MAX_TIMER_MS}`);
    checkSignal('transact', options.signal);
    if (!Number.isSafeInteger(maxAttempts) || maxAttempts < 1)
      throw new InvalidArgumentError('maxAttempts must be a positive integer');
    if (timeoutMs === undefined) return this.attempts(fn, options, maxAttempts, options.signal);
    // A signal of this call's own, aborted by the deadline or by the caller's signal, and
    // let go of when the call ends: AbortSignal.any kept every combined signal referenced by
    // a long-lived caller's signal on Node 20, and AbortSignal.timeout kept a timer for the
    // whole timeoutMs after the call was done (found in review).
    const own = new AbortController();
    const expire = () =>
      own.abort(new DOMException(`transact timed out after ${timeoutMs} ms`, 'TimeoutError'));
    if (timeoutMs === 0) expire();
    const timer = timeoutMs === 0 ? undefined : setTimeout(expire, Math.ceil(timeoutMs));
    timer?.unref?.();
    const caller = options.signal;
    let unfollow: (() => void) | undefined;
    if (caller?.aborted) own.abort(caller.reason);
    else if (caller) unfollow = onAbort(caller, () => own.abort(caller.reason));
    try {
      return await this.attempts(fn, options, maxAttempts, own.signal);
    } finally {
      clearTimeout(timer);
      unfollow?.();
    }
  }

  /** transact's attempts, under `signal` (the caller's, or one with its deadline). */
  private async attempts<T>(
    fn: (tx: Transaction) => Promise<T>,
    options: TransactOptions,
    maxAttempts: number,
    signal: AbortSignal | undefined,
  ): Promise<T> {
    let previous: Transaction | undefined;
    for (let attempt = 1; ; attempt++) {
      if (this.closed) throw new ClosedError('this Percolator client is closed');
      if (signal?.aborted) throw abortedError(signal);
      // The start timestamp is drawn with the first read (in one round trip with it where
      // the store can), or at commit for a transaction that only writes. A timestamp that
      // could not be fetched fails the attempt like any retryable failure.
      const tx = new Transaction(this.env, undefined, signal, attempt, previous, options.readOnly === true);
      previous = tx;
      let result: T;
      try {
        result = await fn(tx);
      } catch (error) {
        await tx.rollbackAfter(error);
        // The function's own error is rethrown unchanged, the signal fired or not (an
        // AbortedError of a read the signal stopped is one too). A retryable one is run
        // again, unless the signal fired (then AbortedError), or a commit the function
        // started itself committed or may have (its writes would commit twice). That commit
        // is waited for first, whatever the error.
        if (await tx.mayHaveCommittedByHand()) throw error;
        if (!isRetryable(error)) throw error;
        // A retryable failure after the signal fired is the abort, on the last attempt too.
        if (signal?.aborted) throw abortedError(signal);
        if (attempt >= maxAttempts) throw error;
        await this.backoff(tx, attempt, error, signal);
        continue;
      }
      try {
        // A read-only transaction (nothing written, snapshot taken) ends here, with no await.
        if (!signal?.aborted && tx.commitUnwritten()) return result;
        // The function may have committed or rolled back by hand (finishForTransact).
        await tx.finishForTransact();
        return result;
      } catch (error) {
        if (!isRetryable(error)) throw error;
        if (signal?.aborted) throw abortedError(signal);
        if (attempt >= maxAttempts) throw error;
        await this.backoff(tx, attempt, error, signal);
      }
    }
  }

  private async backoff(
    tx: Transaction,
    attempt: number,
    error: unknown,
    signal: AbortSignal | undefined,
  ): Promise<void> {
    const ms = backoffMs(attempt, 2, 100);
    const decided = performance.now();
    await sleep(ms, signal);
    // Emitted once the next attempt will run: a signal or close() during the backoff ends
    // `transact` with no next attempt, and the event counted a retry that never ran (found
    // in review). Its time is still the decision's.
    const events = this.env.events;
    if (events && !this.closed && !signal?.aborted) {
      events.emit({
        type: 'transaction.retry',
        transaction: tx.ref!,
        nextAttempt: attempt + 1,
        backoffMs: ms,
        error,
        time: decided,
      });
    }
  }

  /**
   * An observer worker on this client (docs/protocol.md section 8). Its observers' columns are
   * added to this client's observed columns, so its handlers' writes to them (and this
   * client's other writes) leave notifications. Call `start()` to run in the background,
   * or `runUntilIdle()` to process what is pending; see docs/observers.md.
   */
  worker(options: WorkerOptions): ObserverWorker {
    if (this.closed) throw new ClosedError('this Percolator client is closed');
    if (typeof options !== 'object' || options === null)
      throw new InvalidArgumentError('worker options are required');
    validateObservers(options.observers);
    const worker = new ObserverWorker(this, this.env, options);
    for (const o of options.observers) this.observed.add(observedKey(o.table, o.column));
    this.workers.add(worker);
    return worker;
  }

  /**
   * Runs the tidy step on one row now (docs/protocol.md section 7): moves its old values to
   * version rows, deletes the version rows its pruning left, and settles the secondaries of
   * held commit records. With `force`, every superseded value moves and every held record
   * is settled, not only past the thresholds. Commits do this in the background on their
   * own; this is for operators (gc) and tests. Resolves to what it did.
   */
  async tidy(table: string, row: string, options: TidyOptions = {}): Promise<TidyReport> {
    if (this.closed) throw new ClosedError('this Percolator client is closed');
    validateUserTable(table);
    validateRowKey(row);
    checkOptionKeys<TidyOptions>('tidy', options, { force: true, settleHeld: true });
    checkBooleans('tidy', options, 'force', 'settleHeld');
    return this.env.tidier.tidyRow(table, row, undefined, options);
  }

  /**
   * Settles the locks in one row the way a reader that met them would (docs/protocol.md
   * section 5): each lock's primary decides; a committed transaction's lock is rolled
   * forward, a rolled-back or abandoned one (past its TTL) rolled back. A lock whose owner
   * may still be committing is left alone, or waited on for up to `waitMs` like a reader
   * waits. Never decides a fate by itself. Resolves to what it found and did, per lock.
   */
  async resolveLocks(table: string, row: string, options: ResolveOptions = {}): Promise<ResolvedLock[]> {
    if (this.closed) throw new ClosedError('this Percolator client is closed');
    validateUserTable(table);
    validateRowKey(row);
    checkOptionKeys<ResolveOptions>('resolveLocks', options, { waitMs: true, signal: true, onSettled: true });
    if (options.waitMs !== undefined) checkInteger('resolveLocks waitMs', options.waitMs, 0);
    checkSignal('resolveLocks', options.signal);
    if (options.onSettled !== undefined) checkFunction('resolveLocks onSettled', options.onSettled);
    return resolveRowLocks(this.env, table, row, options);
  }

  /**
   * Garbage collection now (docs/protocol.md section 7): prunes the rows of `table` (or one
   * row) as far as this client's `gc` policy allows, settles held commit records, and
   * deletes the version rows that frees. With `dryRun`, only reports what would go. A
   * whole-table run needs the `orderedScan` capability.
   */
  async gc(table: string, options: GcOptions & { readonly row?: string } = {}): Promise<GcReport> {
    if (this.closed) throw new ClosedError('this Percolator client is closed');
    checkOptionKeys<GcOptions & { row?: string }>('gc', options, {
      dryRun: true,
      row: true,
      onProgress: true,
    });
    checkBooleans('gc', options, 'dryRun');
    if (options.onProgress !== undefined) checkFunction('gc onProgress', options.onProgress);
    validateUserTable(table);
    const events = this.env.events;
    if (!events) return this.gcNow(table, options);
    const time = performance.now();
    let report: GcReport | undefined;
    let failure: unknown;
    try {
      report = await this.gcNow(table, options);
      return report;
    } catch (error) {
      failure = error;
      throw error;
    } finally {
      events.emit({
        type: 'gc',
        store: events.store,
        table,
        ...(options.row !== undefined ? { row: options.row } : {}),
        dryRun: options.dryRun === true,
        report,
        time,
        durationMs: performance.now() - time,
        ...(failure !== undefined ? { error: failure } : {}),
      });
    }
  }

  private async gcNow(table: string, options: GcOptions & { readonly row?: string }): Promise<GcReport> {
    const progress = (total: GcReport, row: string) => options.onProgress?.({ ...total }, row);
    if (options.row !== undefined) {
      validateRowKey(options.row);
      const report = await gcRow(this.env, table, options.row, options);
      if (report.rows > 0) progress(report, options.row);
      return report;
    }
    const { store } = this;
    if (!store.capabilities.orderedScan || !store.scan)
      throw new UnsupportedOperationError(
        `store "${store.name}" cannot scan rows in key order: gc one row at a time`,
      );
    const total = emptyGcReport();
    let after: string | undefined;
    for (;;) {
      const page = await store.scan(table, { limit: 256, ...(after === undefined ? {} : { after }) });
      for (const { key } of page) {
        const row = await gcRow(this.env, table, key, options);
        if (row.rows === 0) continue;
        addGcReports(total, row);
        progress(total, key);
      }
      if (page.length < 256) return total;
      after = page[page.length - 1]!.key;
    }
  }

  /**
   * Resolves once the work this client runs in the background after its commits is done:
   * secondary commits and tidy steps (docs/protocol.md sections 4 and 7). Commits are
   * complete without it; this is for tests, measurements and orderly shutdowns.
   */
  async flush(): Promise<void> {
    while (this.env.background.size > 0) {
      this.env.tidier.hurry();
      await Promise.all([...this.env.background]);
    }
  }

  /**
   * Stops this client's observer workers, then closes it: every later call of its
   * transactions (begun or in `transact`, reads, writes, commits) is a ClosedError and
   * changes nothing. Waits for the commits in flight to end, and for their background work
   * (secondaries, tidy steps), and for the reads in flight (a read, or a scan's page,
   * stops at its next step with ClosedError; a lock wait ends at once): once it resolves
   * the client makes no further store call, and the store may be closed. Does not close
   * the store: its creator owns it.
   */
  async close(): Promise<void> {
    // Workers first (their rows in progress still need the client), and every
    // runUntilIdle in progress ends with ClosedError once its current batch is done.
    this.env.lifecycle.closing.abort();
    await Promise.all([...this.workers].map((w) => Promise.all([w.stop(), w.drained()])));
    this.closed = true;
    this.env.lifecycle.close();
    // The commits in flight end; a read in flight stops at its next step (ClosedError).
    await this.env.lifecycle.idle();
    await this.flush();
  }
}
