import { backoffMs, sleep } from '../backoff.js';
import { decodeRowAt } from '../codec.js';
import { detached } from '../detached.js';
import { observedKey, type ProtocolEnv } from '../env.js';
import {
  ClosedError,
  InvalidArgumentError,
  isRetryable,
  PercolatorError,
  UnsupportedOperationError,
} from '../errors.js';
import type { ObserverRunRef } from '../events.js';
import { compareKeys, shownName, TABLE_NAME, validateColumn, validateUserTable } from '../names.js';
import {
  checkBooleans,
  checkedClock,
  checkFunction,
  checkInteger,
  checkOptionKeys,
  MAX_TIMER_MS,
  type OptionKeys,
} from '../options.js';
import { readRow } from '../row-update.js';
import { type Lease, Leases } from './lease.js';
import { clearNotification } from './notifications.js';
import { StartPositions } from './positions.js';
import { isReservedColumn, parseAckColumn } from './reserved.js';
import { runObserver, type TransactionSource } from './run.js';
import type {
  NotifiedCell,
  Observer,
  RunFailure,
  RunUntilIdleOptions,
  WorkerOptions,
  WorkerStats,
} from './types.js';

/** runUntilIdle() ran out of time with notifications still pending. */
export class ObserversNotIdleError extends PercolatorError {
  constructor(message: string, options?: { readonly cause?: unknown }) {
    super('NOT_IDLE', message, { cause: options?.cause, retryable: true });
  }
}

/**
 * Reported (through `onError`, or logged) when a worker meets the acknowledgement of an
 * observer it does not run, on a column it observes: another worker runs a different set of
 * observers there. A notification marks a cell, not an observer, and a worker clears it once
 * its own observers have run, so the other worker's observer may never see that change.
 * Every worker of an observed column must run all of its observers (docs/observers.md,
 * "One set of observers per column"). Not retryable: it is a deployment's configuration.
 */
export class ObserversDifferError extends PercolatorError {
  constructor(message: string) {
    super('OBSERVERS_DIFFER', message, { retryable: false });
  }
}

/** What processing one row found. */
interface RowOutcome {
  /** Some observer run (or skip) happened: it may have left new notifications elsewhere. */
  readonly processed: boolean;
  /** A notification for this worker's observers is still there (or may be). */
  readonly pending: boolean;
  /** Another worker holds the row's lease. */
  readonly leased: boolean;
  /** Earliest time (performance.now ms) a failed run may be retried. */
  readonly retryAt?: number;
}

const IDLE: RowOutcome = { processed: false, pending: false, leased: false };
const MIN_POLL_MS = 5;
const MAX_JUMPS_PER_SWEEP = 16;

export function validateObservers(observers: readonly Observer[]): void {
  if (!Array.isArray(observers) || observers.length === 0) {
    throw new InvalidArgumentError('a worker needs at least one observer');
  }
  const names = new Set<string>();
  for (const o of observers) {
    if (typeof o !== 'object' || o === null) throw new InvalidArgumentError('an observer must be an object');
    if (typeof o.name !== 'string' || !TABLE_NAME.test(o.name)) {
      throw new InvalidArgumentError(
        `observer name must be 1-64 characters from [A-Za-z0-9_.-], got ${JSON.stringify(o.name)}`,
      );
    }
    if (names.has(o.name)) throw new InvalidArgumentError(`two observers are named "${o.name}"`);
    names.add(o.name);
    validateUserTable(o.table);
    validateColumn(o.column);
    if (typeof o.handler !== 'function') {
      throw new InvalidArgumentError(`observer "${o.name}" needs a handler function`);
    }
    checkOptionKeys<Observer>(`observer "${o.name}"`, o, {
      name: true,
      table: true,
      column: true,
      handler: true,
      weak: true,
    });
    // A truthy string ("false") made the observer weak: no ack, a run per notification.
    checkBooleans(`observer "${o.name}"`, o, 'weak');
  }
}

const WORKER_OPTIONS: OptionKeys<WorkerOptions> = {
  observers: true,
  concurrency: true,
  leaseMs: true,
  clock: true,
  idlePollMs: true,
  batchSize: true,
  retry: true,
  maxRunAttempts: true,
  onError: true,
  onRun: true,
};

/**
 * The worker's options besides the observers: unknown keys (a misspelt one fell back to its
 * default), functions, and numbers within what timers keep (a longer delay fires after
 * 1 ms: an idle poll or a lease renewal of that length hammered the store).
 */
function checkWorkerOptions(options: WorkerOptions): void {
  checkOptionKeys<WorkerOptions>('worker', options, WORKER_OPTIONS);
  if (options.retry !== undefined)
    checkOptionKeys<NonNullable<WorkerOptions['retry']>>('worker retry', options.retry, {
      baseMs: true,
      maxMs: true,
    });
  for (const key of ['clock', 'onError', 'onRun'] as const)
    if (options[key] !== undefined) checkFunction(`worker ${key}`, options[key]);
}

function positiveInteger(
  value: number | undefined,
  fallback: number,
  what: string,
  max = MAX_TIMER_MS,
): number {
  const v = value ?? fallback;
  checkInteger(what, v, 1, max);
  return v;
}

/**
 * Runs observers (docs/protocol.md section 8). It finds notified rows through the store's
 * notification index (never a full scan), takes an advisory lease per row so workers in
 * this or other processes do not run the same row at once, runs each observer of each
 * notified cell in its own transaction, and clears the notification unless a newer
 * write arrived meanwhile.
 */
export class ObserverWorker {
  readonly stats: WorkerStats = {
    runs: 0,
    skipped: 0,
    conflicts: 0,
    failures: 0,
    cleared: 0,
    leaseBusy: 0,
    jumps: 0,
    rowsScanned: 0,
  };
  private readonly byCell = new Map<string, Observer[]>();
  private readonly tables: string[];
  private readonly leases: Leases;
  private readonly positions = new StartPositions();
  /** Rows this worker is processing now (leases are per worker, not per loop). */
  private readonly inFlight = new Set<string>();
  /** Backoff of failed runs: "table\0row\0column\0observer" -> state. */
  private readonly retries = new Map<string, { attempts: number; retryAt: number }>();
  /** Observers of our columns that we do not run, reported once each (checkAck). */
  private readonly foreignObservers = new Set<string>();
  private readonly concurrency: number;
  private readonly leaseMs: number;
  private readonly idlePollMs: number;
  private readonly batchSize: number;
  private readonly retryBaseMs: number;
  private readonly retryMaxMs: number;
  private readonly maxRunAttempts: number;
  private running = false;
  /** Counts stop()s: the loops of an earlier start() end even if start() runs again meanwhile. */
  private generation = 0;
  /** The background loops still running, each with the generation (start()) it belongs to. */
  private readonly loops = new Map<Promise<void>, number>();
  private readonly sleepers = new Set<() => void>();
  /** The runUntilIdle calls in progress: the client's close() waits for them (drained). */
  private readonly drains = new Set<Promise<void>>();
  /** When forgetOldRetries may sweep again. */
  private nextRetrySweep = 0;

  constructor(
    private readonly db: TransactionSource,
    private readonly env: ProtocolEnv,
    private readonly options: WorkerOptions,
  ) {
    validateObservers(options.observers);
    checkWorkerOptions(options);
    const store = env.store;
    if (!store.capabilities.notificationIndex || !store.scanNotified) {
      throw new UnsupportedOperationError(
        `store "${store.name}" has no notification index; observer workers need scanNotified`,
      );
    }
    for (const o of options.observers) {
      const key = observedKey(o.table, o.column);
      this.byCell.set(key, [...(this.byCell.get(key) ?? []), o]);
    }
    this.tables = [...new Set(options.observers.map((o) => o.table))];
    this.concurrency = positiveInteger(options.concurrency, 4, 'concurrency', 65_536);
    this.leaseMs = positiveInteger(options.leaseMs, 10_000, 'leaseMs');
    this.idlePollMs = positiveInteger(options.idlePollMs, 200, 'idlePollMs');
    this.batchSize = positiveInteger(options.batchSize, 64, 'batchSize', 100_000);
    this.retryBaseMs = positiveInteger(options.retry?.baseMs, 100, 'retry.baseMs');
    this.retryMaxMs = positiveInteger(options.retry?.maxMs, 30_000, 'retry.maxMs');
    this.maxRunAttempts = positiveInteger(options.maxRunAttempts, 5, 'maxRunAttempts', 1000);
    this.leases = new Leases(
      store,
      this.leaseMs,
      options.clock ? checkedClock('worker clock', options.clock) : env.clock,
    );
  }

  get isRunning(): boolean {
    return this.running;
  }

  /** Starts `concurrency` background loops; each scans from random positions until stop(). */
  start(): void {
    this.notClosing();
    if (this.running) return;
    this.running = true;
    const generation = this.generation;
    // In no caller's context: the loops outlive the call (detached.ts).
    detached(() => {
      for (let i = 0; i < this.concurrency; i++) {
        const loop = this.loop(generation);
        this.loops.set(loop, generation);
        const forget = () => this.loops.delete(loop);
        loop.then(forget, forget);
      }
    });
  }

  /**
   * Stops the loops; resolves once the rows they were processing are finished, those of
   * every earlier start() included (a stop() still waiting, or one not awaited, leaves
   * nothing for the next stop() or close() to skip). A start() meanwhile starts loops of
   * its own, which this stop leaves running.
   */
  async stop(): Promise<void> {
    this.running = false;
    const stopped = this.generation++;
    for (const wake of this.sleepers) wake();
    await Promise.all(
      [...this.loops].filter(([, generation]) => generation <= stopped).map(([loop]) => loop),
    );
  }

  /** Whether the loops of `generation` (one start()) are to go on. */
  private live(generation: number): boolean {
    return this.running && this.generation === generation;
  }

  /**
   * Processes notifications until none is pending for this worker's observers, then
   * resolves. Works whether or not start() was called. Rows leased by other workers and
   * runs waiting out a failure backoff count as pending: it waits for them. A pass that
   * fails retryably (a scan of the index over a dropped connection, a timeout) is reported
   * and tried again after a backoff (as a background loop tries its next sweep after its
   * idle pause, which doubles up to `idlePollMs` while sweeps find nothing to do or fail): a
   * job draining notifications should not fail on what the next attempt gets past. It
   * rejects with a non-retryable error at once (once the rows of its batch still running
   * are done), and, past `timeoutMs`, with ObserversNotIdleError (its
   * cause the last error, if the last pass failed). The client's close() ends it with
   * ClosedError once its current batch of rows is done (a backoff or poll it waits out ends
   * at once), and waits for it: no store call follows close().
   */
  runUntilIdle(options: RunUntilIdleOptions = {}): Promise<void> {
    try {
      checkOptionKeys<RunUntilIdleOptions>('runUntilIdle', options, { timeoutMs: true });
      // NaN was no limit, and a string ("1000") a deadline of about now.
      if (options.timeoutMs !== undefined) checkInteger('runUntilIdle timeoutMs', options.timeoutMs, 0);
    } catch (error) {
      return Promise.reject(error);
    }
    const drain = this.drain(options);
    this.drains.add(drain);
    const forget = () => this.drains.delete(drain);
    drain.then(forget, forget);
    return drain;
  }

  /**
   * @internal Resolves once no runUntilIdle of this worker is in progress (the client's
   * close() waits for them, after telling them to end).
   */
  async drained(): Promise<void> {
    await Promise.allSettled([...this.drains]);
  }

  /**
   * Drops the backoff of runs that failed long ago. An entry is forgotten when the same cell
   * later runs here, but a cell another worker settled is never seen again: without this a
   * long-lived worker would keep one entry per cell that ever failed on it. Past
   * `retryMaxMs` after its retry time an entry says nothing a fresh start would not (its
   * next backoff starts from the first). At most one sweep per `retryMaxMs`.
   */
  private forgetOldRetries(): void {
    const now = performance.now();
    if (now < this.nextRetrySweep) return;
    this.nextRetrySweep = now + this.retryMaxMs;
    for (const [key, entry] of this.retries)
      if (entry.retryAt < now - this.retryMaxMs) this.retries.delete(key);
  }

  /** ClosedError once the client's close() has begun. */
  private notClosing(): void {
    if (this.env.lifecycle.closing.signal.aborted) {
      throw new ClosedError('this Percolator client is closed: its observer workers have stopped');
    }
  }

  private async drain(options: RunUntilIdleOptions): Promise<void> {
    const deadline = performance.now() + (options.timeoutMs ?? Number.POSITIVE_INFINITY);
    const closing = this.env.lifecycle.closing.signal;
    let failures = 0;
    for (;;) {
      this.notClosing();
      let pass: Awaited<ReturnType<ObserverWorker['fullPass']>>;
      try {
        pass = await this.fullPass();
      } catch (error) {
        if (!isRetryable(error)) throw error;
        this.reportError(error, undefined);
        if (performance.now() >= deadline) {
          throw new ObserversNotIdleError(
            `observers not idle after ${options.timeoutMs} ms: the last pass failed: ${error instanceof Error ? error.message : String(error)}`,
            { cause: error },
          );
        }
        const delay = backoffMs(failures++, this.retryBaseMs, this.retryMaxMs);
        await sleep(Math.max(1, Math.min(delay, deadline - performance.now())), closing);
        continue;
      }
      failures = 0;
      if (!pass.processed && pass.pending.length === 0) return;
      if (performance.now() >= deadline) {
        const sample = pass.pending.slice(0, 5).map((r) => JSON.stringify(r));
        throw new ObserversNotIdleError(
          `observers not idle after ${options.timeoutMs} ms: ${pass.pending.length} ${pass.pending.length === 1 ? 'row' : 'rows'} pending, e.g. ${sample.join(', ')}`,
        );
      }
      if (!pass.processed) {
        // Everything left is leased elsewhere or backing off: wait a little.
        const untilRetry = pass.retryAt - performance.now();
        await sleep(
          Math.max(MIN_POLL_MS, Math.min(this.idlePollMs, untilRetry, deadline - performance.now())),
          closing,
        );
      }
    }
  }

  /** One sweep over every observed table's notified rows, `concurrency` rows at a time. */
  private async fullPass(): Promise<{ processed: boolean; pending: string[]; retryAt: number }> {
    let processed = false;
    const pending: string[] = [];
    let retryAt = Number.POSITIVE_INFINITY;
    for (const table of this.tables) {
      for await (const keys of this.ring(table, this.positions.pick(table))) {
        // Between batches: a client closing ends the pass (runUntilIdle: ClosedError).
        this.notClosing();
        const outcomes = await mapLimit(keys, this.concurrency, (key) => this.processRow(table, key));
        outcomes.forEach((o, i) => {
          if (o.processed) processed = true;
          if (o.pending) pending.push(`${table}/${keys[i]}`);
          if (o.retryAt !== undefined) retryAt = Math.min(retryAt, o.retryAt);
        });
      }
    }
    return { processed, pending, retryAt };
  }

  /** A background loop: sweeps from random positions, backs off while there is nothing to do. */
  private async loop(generation: number): Promise<void> {
    let idleMs = MIN_POLL_MS;
    while (this.live(generation)) {
      let active = false;
      try {
        for (const table of shuffle(this.tables)) {
          if (!this.live(generation)) break;
          if (await this.sweep(table, generation)) active = true;
        }
      } catch (error) {
        this.reportError(error, undefined);
      }
      if (active) idleMs = MIN_POLL_MS;
      else {
        // stop() wakes only loops already asleep: one stopped mid-sweep must not sleep now.
        if (!this.live(generation)) break;
        await this.pause(idleMs * (0.5 + Math.random()));
        idleMs = Math.min(this.idlePollMs, idleMs * 2);
      }
    }
  }

  /**
   * Scans one table's notified rows from a random position, wrapping around once, and
   * processes them one at a time. Meeting a row another worker holds means a scanner is
   * just ahead: jump to a new random position instead of trailing it (bus clumping).
   * Returns whether it processed anything.
   */
  private async sweep(table: string, generation: number): Promise<boolean> {
    let active = false;
    for (let jumps = 0; jumps <= MAX_JUMPS_PER_SWEEP && this.live(generation); jumps++) {
      let jumped = false;
      scan: for await (const keys of this.ring(table, this.positions.pick(table))) {
        for (const key of keys) {
          if (!this.live(generation)) return active;
          const outcome = await this.processRow(table, key);
          if (outcome.processed) active = true;
          if (outcome.leased) {
            this.stats.jumps++;
            jumped = true;
            break scan;
          }
        }
      }
      if (!jumped) return active;
    }
    return active;
  }

  /**
   * Pages of notified keys of `table` after `start`, then from the beginning up to and
   * including `start`: every listed key once.
   */
  private async *ring(table: string, start: string | undefined): AsyncGenerator<string[]> {
    const scanNotified = this.env.store.scanNotified!.bind(this.env.store);
    let after = start;
    let wrapped = start === undefined;
    for (;;) {
      const page = await scanNotified(table, { after, limit: this.batchSize });
      for (const key of page) this.positions.observe(table, key);
      if (wrapped && start !== undefined) {
        const end = page.findIndex((k) => compareKeys(k, start) > 0);
        if (end >= 0) {
          if (end > 0) yield page.slice(0, end);
          return;
        }
      }
      if (page.length > 0) yield page;
      if (page.length < this.batchSize) {
        if (wrapped) return;
        wrapped = true;
        after = undefined;
      } else {
        after = page[page.length - 1];
      }
    }
  }

  /** Lease the row, run the observers of each of its notified cells, release. */
  private async processRow(table: string, key: string): Promise<RowOutcome> {
    const id = `${table}\u0000${key}`;
    if (this.inFlight.has(id)) return { processed: false, pending: true, leased: false };
    this.inFlight.add(id);
    try {
      let lease: Lease | undefined;
      try {
        lease = await this.leases.acquire(table, key);
      } catch (error) {
        this.reportError(error, undefined);
        return { processed: false, pending: true, leased: false, retryAt: performance.now() + 50 };
      }
      if (!lease) {
        this.stats.leaseBusy++;
        return { processed: false, pending: true, leased: true };
      }
      const renewal = setInterval(() => void lease.renew(), Math.max(1, Math.floor(this.leaseMs / 3)));
      renewal.unref();
      try {
        return await this.processLeasedRow(table, key);
      } finally {
        clearInterval(renewal);
        await lease.release();
      }
    } finally {
      this.inFlight.delete(id);
    }
  }

  private async processLeasedRow(table: string, key: string): Promise<RowOutcome> {
    let stored: Awaited<ReturnType<typeof readRow>>;
    try {
      stored = await readRow(this.env, table, key);
    } catch (error) {
      this.reportError(error, undefined);
      return { processed: false, pending: true, leased: false, retryAt: performance.now() + 50 };
    }
    this.stats.rowsScanned++;
    if (!stored) return IDLE;
    const work: { column: string; notifyTs: number; observers: Observer[] }[] = [];
    for (const [column, cell] of decodeRowAt(stored.state, table, key).cells) {
      const observers = this.byCell.get(observedKey(table, column));
      if (cell.notifyTs > 0 && observers) work.push({ column, notifyTs: cell.notifyTs, observers });
      else if (observers === undefined && isReservedColumn(column)) this.checkAck(table, column);
    }
    if (work.length === 0) return IDLE;
    let processed = false;
    let pending = false;
    let retryAt: number | undefined;
    for (const { column, notifyTs, observers } of work) {
      const result = await this.processCell({ table, row: key, column }, notifyTs, observers);
      if (result.processed) processed = true;
      if (result.pending) pending = true;
      if (result.retryAt !== undefined) retryAt = Math.min(retryAt ?? Infinity, result.retryAt);
    }
    return { processed, pending, leased: false, retryAt };
  }

  /** Every observer of one notified cell, then the clear. */
  private async processCell(
    cell: NotifiedCell,
    notifyTs: number,
    observers: readonly Observer[],
  ): Promise<{ processed: boolean; pending: boolean; retryAt?: number }> {
    const retryKey = (o: Observer) => `${cell.table}\u0000${cell.row}\u0000${cell.column}\u0000${o.name}`;
    // While any observer of the cell backs off, leave the whole cell alone: the others
    // would only find their acks current again.
    const now = performance.now();
    const waiting = observers
      .map((o) => this.retries.get(retryKey(o))?.retryAt ?? 0)
      .filter((at) => at > now);
    if (waiting.length > 0) return { processed: false, pending: true, retryAt: Math.min(...waiting) };
    let coveredBelow = Number.POSITIVE_INFINITY;
    let allDone = true;
    let retryAt: number | undefined;
    for (const observer of observers) {
      const backoff = this.retries.get(retryKey(observer));
      const events = this.env.events;
      const time = events ? performance.now() : 0;
      // With a listener: one ref for the run's begin and end events and its transactions'.
      const run: ObserverRunRef | undefined = events
        ? { observer: observer.name, listenerState: undefined }
        : undefined;
      if (run) {
        const { table, row, column } = cell;
        events!.emit({
          type: 'observer.begin',
          run,
          store: events!.store,
          observer: observer.name,
          table,
          row,
          column,
          time,
        });
      }
      try {
        const result = await runObserver(this.db, observer, cell, this.maxRunAttempts, this.stats, run);
        events?.emit({
          type: 'observer.run',
          run: run!,
          observer: observer.name,
          table: cell.table,
          row: cell.row,
          column: cell.column,
          outcome: result.ran ? 'ran' : 'skipped',
          startTs: result.startTs,
          ...(result.ran ? { commitTs: result.commitTs } : {}),
          time,
          durationMs: performance.now() - time,
        });
        this.retries.delete(retryKey(observer));
        coveredBelow = Math.min(coveredBelow, result.startTs);
        if (result.ran) {
          this.stats.runs++;
          // The run committed: a callback that throws (or rejects) must not make it count
          // as a failed run, nor escape as an unhandled rejection.
          this.callback(() =>
            this.options.onRun?.({
              ...cell,
              observer: observer.name,
              startTs: result.startTs,
              commitTs: result.commitTs,
            }),
          );
        } else {
          this.stats.skipped++;
        }
      } catch (error) {
        events?.emit({
          type: 'observer.run',
          run: run!,
          observer: observer.name,
          table: cell.table,
          row: cell.row,
          column: cell.column,
          outcome: 'failed',
          error,
          time,
          durationMs: performance.now() - time,
        });
        allDone = false;
        this.stats.failures++;
        const attempts = (backoff?.attempts ?? 0) + 1;
        const delay = Math.min(this.retryMaxMs, this.retryBaseMs * 2 ** Math.min(attempts - 1, 20));
        const at = performance.now() + delay;
        this.retries.set(retryKey(observer), { attempts, retryAt: at });
        this.forgetOldRetries();
        retryAt = Math.min(retryAt ?? Infinity, at);
        this.reportError(error, { ...cell, observer: observer.name, attempt: attempts, retryInMs: delay });
      }
    }
    if (!allDone) return { processed: true, pending: true, retryAt };
    try {
      const cleared = await clearNotification(
        this.env,
        cell.table,
        cell.row,
        cell.column,
        notifyTs,
        coveredBelow,
      );
      if (cleared) this.stats.cleared++;
      return { processed: true, pending: !cleared };
    } catch (error) {
      this.reportError(error, undefined);
      return { processed: true, pending: true };
    }
  }

  /** An ack column of `table`: reports, once, an observer of a column we observe that we do not run. */
  private checkAck(table: string, name: string): void {
    const ack = parseAckColumn(name);
    if (ack === undefined) return;
    const ours = this.byCell.get(observedKey(table, ack.column));
    if (ours === undefined || ours.some((o) => o.name === ack.observer)) return;
    const key = `${table}\u0000${ack.column}\u0000${ack.observer}`;
    if (this.foreignObservers.has(key)) return;
    this.foreignObservers.add(key);
    this.reportError(
      new ObserversDifferError(
        `observer "${ack.observer}" has run on ${table}/${ack.column}, which this worker observes without it (it runs ${ours.map((o) => `"${o.name}"`).join(', ')}): a notification this worker clears after its own observers may never reach "${ack.observer}"; run every observer of a column in every worker that observes it`,
      ),
      undefined,
    );
  }

  /** Runs a user callback: whatever it throws, or the promise it returns rejects with, is dropped. */
  private callback(call: () => unknown): void {
    try {
      const result = call() as { then?: unknown } | undefined;
      if (result !== null && typeof result === 'object' && typeof result.then === 'function') {
        (result as Promise<unknown>).then(undefined, () => undefined);
      }
    } catch {
      // dropped: see above
    }
  }

  private reportError(error: unknown, failure: RunFailure | undefined): void {
    // A run the client's close() cut short (a lock wait it ended) is not news.
    if (error instanceof ClosedError && this.env.lifecycle.closing.signal.aborted) return;
    if (this.options.onError) {
      // A throwing (or rejecting) error callback must not stop the worker.
      this.callback(() => this.options.onError?.(error, failure));
      return;
    }
    // By default only what needs a person is logged: contention (conflicts, busy locks)
    // that outlasted a run's attempts is retried later anyway and shows in `stats`.
    if (isRetryable(error)) return;
    const where = failure
      ? `observer "${failure.observer}" failed on ${failure.table}/${shownName(failure.row)}/${shownName(failure.column)} (attempt ${failure.attempt}, retry in ${failure.retryInMs} ms)`
      : 'observer worker error';
    console.warn(`${where}:`, error);
  }

  /** A sleep that stop() cuts short. */
  private pause(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.sleepers.delete(done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.sleepers.add(done);
    });
  }
}

function shuffle<T>(items: readonly T[]): T[] {
  const out = [...items];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

/**
 * `fn` over `items` with at most `limit` calls in flight; results in input order. After a
 * call fails no lane takes another item, and the first error is thrown once every call in
 * flight has ended: a caller that stops on it (runUntilIdle, then close()) leaves no row
 * still being processed behind it.
 */
async function mapLimit<T, R>(items: readonly T[], limit: number, fn: (item: T) => Promise<R>): Promise<R[]> {
  const results = new Array<R>(items.length);
  let next = 0;
  let failure: { error: unknown } | undefined;
  const lanes = Array.from({ length: Math.min(limit, items.length) }, async () => {
    while (failure === undefined && next < items.length) {
      const i = next++;
      try {
        results[i] = await fn(items[i]!);
      } catch (error) {
        failure ??= { error };
      }
    }
  });
  await Promise.all(lanes);
  if (failure !== undefined) throw failure.error;
  return results;
}
