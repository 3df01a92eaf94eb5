import { checkCounterName } from './checked-store.js';
import { MAX_TIMESTAMP } from './codec.js';
import { InvalidArgumentError, StoreError } from './errors.js';
import { describe } from './names.js';
import { ORACLE_COUNTER, type RowStore } from './store.js';

/**
 * A timestamp oracle: strictly increasing integers from 1 to MAX_TIMESTAMP (2^52 - 1),
 * never repeated (docs/protocol.md section 3). A client never closes an oracle it was
 * given: its creator owns it, as it owns the store.
 */
export interface TimestampOracle {
  next(): Promise<number>;
}

/**
 * A timestamp past MAX_TIMESTAMP: the deployment's timestamps are used up. Not retryable
 * (every later draw is past it too); `applied` is the call's own (a stamped write past it
 * may have landed).
 */
export function pastMaxTimestamp(what: string, value: number, applied: 'no' | 'unknown' = 'no'): StoreError {
  return new StoreError(
    `${what} gave timestamp ${value}, past MAX_TIMESTAMP (2^52 - 1), the highest a row holds exactly: ` +
      'this deployment has used up its timestamps (docs/protocol.md section 3)',
    applied,
    { retryable: false },
  );
}

/**
 * A failed timestamp draw, as the transaction that asked for it sees it: a draw changes no
 * row, so whatever became of it (a counter increment whose reply was lost may have landed,
 * and then timestamps were skipped, which the protocol allows) nothing of the transaction
 * was applied. `StoreError(..., 'unknown')` from the store (STORE_AMBIGUOUS, not retried)
 * becomes `StoreError(..., 'no')`, retryable as its failure is (a lost reply: yes; a reply
 * that broke the store's contract: no; `retryableIfNotApplied`): without this a stalled
 * counter server failed
 * every transaction as "may have been applied", a rolled-back write included (found by a
 * new user's walkthrough). Any other failure is its own. Steps that draw and write in one
 * call (a stamped CAS) do not come here: their 'unknown' is real.
 */
export function drawFailed(error: unknown): unknown {
  if (!(error instanceof StoreError) || error.applied !== 'unknown') return error;
  // Retryable as a lost reply is; not a reply that broke the store's contract (review).
  return new StoreError(
    `${error.message} (a timestamp draw, which changes no row: nothing of the transaction was applied)`,
    'no',
    { cause: error, retryable: error.retryableIfNotApplied },
  );
}

/** A store's stamped reply (`readStamped`, a stamped CAS): its timestamp, if below the limit. */
export function usableTimestamp(what: string, value: number, applied: 'no' | 'unknown' = 'no'): number {
  if (value > MAX_TIMESTAMP) throw pastMaxTimestamp(what, value, applied);
  return value;
}

/**
 * The `oracle` option: an object with `next()`, every value checked (`CheckedOracle`).
 * InvalidArgumentError for anything else.
 */
export function checkedOracle(oracle: unknown): TimestampOracle {
  if (oracle instanceof CheckedOracle) return oracle;
  // The library's own oracles (not a subclass, which may override what they check) hand
  // out checked, increasing values already: a second check would cost a promise per draw.
  if (typeof oracle === 'object' && oracle !== null) {
    const prototype = Object.getPrototypeOf(oracle);
    if (
      (prototype === CounterOracle.prototype || prototype === LocalOracle.prototype) &&
      !Object.hasOwn(oracle, 'next')
    )
      return oracle as TimestampOracle;
  }
  if (
    (typeof oracle !== 'object' && typeof oracle !== 'function') ||
    oracle === null ||
    typeof (oracle as { next?: unknown }).next !== 'function'
  ) {
    throw new InvalidArgumentError(`oracle must be an object with a next() method, got ${describe(oracle)}`);
  }
  return new CheckedOracle(oracle as TimestampOracle);
}

/**
 * A caller's oracle, each value checked before the client uses it: an integer from 1 to
 * MAX_TIMESTAMP, above every value it handed this client before the call was made (the
 * contract: strictly increasing; calls in flight together may answer in any order). A
 * value that is not is a non-retryable StoreError, before anything is written with it: a
 * start timestamp fails the transaction's first read or `begin`, a commit timestamp (drawn
 * before the commit point) rolls the transaction back.
 */
/** The most values CheckedOracle keeps to check calls in flight against each other. */
const RECENT_CAP = 65_536;

class CheckedOracle implements TimestampOracle {
  /** The highest value handed out so far: a later call must get more. */
  private highest = 0;
  /** The floors of the calls in flight (a multiset: floor -> calls). */
  private readonly pending = new Map<number, number>();
  /**
   * Values handed out that a call still in flight could also get (above its floor): two
   * calls in flight together must not get the same value (start timestamps name their
   * transactions: two that shared one would take each other's locks for their own).
   */
  private readonly recent = new Set<number>();
  /** The lowest floor in flight when `recent` was last pruned. */
  private prunedAt = 0;
  constructor(private readonly inner: TimestampOracle) {}

  next(): Promise<number> {
    const floor = this.highest;
    this.pending.set(floor, (this.pending.get(floor) ?? 0) + 1);
    let drawn: Promise<number>;
    try {
      drawn = Promise.resolve(this.inner.next());
    } catch (error) {
      // Thrown instead of rejected: the same failure, never an exception out of a commit step.
      drawn = Promise.reject(error);
    }
    return drawn.then(
      (ts: unknown) => {
        this.settled(floor);
        return this.checked(ts, floor);
      },
      (error: unknown) => {
        this.settled(floor);
        throw drawFailed(error);
      },
    );
  }

  private settled(floor: number): void {
    const n = this.pending.get(floor)!;
    if (n > 1) this.pending.set(floor, n - 1);
    else this.pending.delete(floor);
  }

  private checked(ts: unknown, floor: number): number {
    if (typeof ts !== 'number' || !Number.isSafeInteger(ts) || ts < 1) {
      throw new StoreError(
        `oracle broke the TimestampOracle contract: next() must give an integer from 1 to MAX_TIMESTAMP (2^52 - 1), got ${describe(ts)}`,
        'no',
        { retryable: false },
      );
    }
    if (ts > MAX_TIMESTAMP) throw pastMaxTimestamp('oracle', ts);
    if (ts <= floor) {
      throw new StoreError(
        `oracle broke the TimestampOracle contract: next() gave ${ts}, not above ${floor}, which it gave before this call`,
        'no',
        { retryable: false },
      );
    }
    if (this.recent.has(ts)) {
      throw new StoreError(
        `oracle broke the TimestampOracle contract: next() gave ${ts} to two calls in flight together`,
        'no',
        { retryable: false },
      );
    }
    if (ts > this.highest) this.highest = ts;
    // Kept while a call in flight could still get it; none in flight, none kept.
    if (this.pending.size === 0) {
      this.recent.clear();
      this.prunedAt = 0;
      return ts;
    }
    this.recent.add(ts);
    let lowest = Number.POSITIVE_INFINITY;
    for (const floor of this.pending.keys()) if (floor < lowest) lowest = floor;
    // Pruned when the lowest floor moved (not on every draw), and capped: a call that never
    // settles would otherwise keep every later value. Past the cap the oldest go first,
    // which only narrows what a repeat is checked against.
    if (lowest !== this.prunedAt || this.recent.size > RECENT_CAP) {
      this.prunedAt = lowest;
      for (const v of this.recent) if (v <= lowest || this.recent.size > RECENT_CAP) this.recent.delete(v);
    }
    return ts;
  }
}

/**
 * Batching the paper's way: requests that arrive while a fetch is in flight wait and
 * share the next fetch's range. A timestamp is never handed to a request made after the
 * fetch that produced it was sent, so no request gets a timestamp older than a commit
 * that finished before it asked.
 */
abstract class BatchingOracle implements TimestampOracle {
  private inFlight = false;
  private waiting: Array<{ resolve: (ts: number) => void; reject: (e: unknown) => void }> = [];

  /**
   * Whether a fetch is in flight or requests are waiting: then a new request shares a
   * batch, which is cheaper for the store than a timestamp drawn on its own.
   */
  get busy(): boolean {
    return this.inFlight || this.waiting.length > 0;
  }

  /** Reserve `count` timestamps; resolves to the highest one (range is top-count+1 .. top). */
  protected abstract reserve(count: number): Promise<number>;

  next(): Promise<number> {
    return new Promise((resolve, reject) => {
      this.waiting.push({ resolve, reject });
      if (!this.inFlight) this.fetch();
    });
  }

  private fetch(): void {
    const batch = this.waiting;
    this.waiting = [];
    this.inFlight = true;
    let reserved: Promise<number>;
    try {
      reserved = Promise.resolve(this.reserve(batch.length));
    } catch (error) {
      // A reserve that throws instead of rejecting fails this batch like a rejection; left
      // to escape, it would leave inFlight set and every later next() waiting for ever.
      reserved = Promise.reject(error);
    }
    reserved.then(
      (top) => {
        const first = top - batch.length + 1;
        if (!Number.isSafeInteger(top) || first < 1) {
          const error = new StoreError(`oracle reserved an unusable range ending at ${top}`, 'no', {
            retryable: false,
          });
          for (const w of batch) w.reject(error);
        } else if (top > MAX_TIMESTAMP) {
          const error = pastMaxTimestamp('oracle', top);
          for (const w of batch) w.reject(error);
        } else {
          for (const [i, w] of batch.entries()) w.resolve(first + i);
        }
        this.afterFetch();
      },
      (error: unknown) => {
        const failed = drawFailed(error);
        for (const w of batch) w.reject(failed);
        this.afterFetch();
      },
    );
  }

  private afterFetch(): void {
    this.inFlight = false;
    if (this.waiting.length > 0) this.fetch();
  }
}

/**
 * The default oracle: an atomic counter in the store itself, so every client of the same
 * store (in any process) shares one order.
 */
export class CounterOracle extends BatchingOracle {
  constructor(
    private readonly store: RowStore,
    readonly counterName: string = ORACLE_COUNTER,
  ) {
    super();
    if (store === null || typeof store !== 'object' || typeof store.capabilities !== 'object') {
      throw new InvalidArgumentError(`CounterOracle needs a RowStore, got ${describe(store)}`);
    }
    // Checked here, not on every draw: a bad name would fail every transaction's first read.
    checkCounterName(counterName);
    if (!store.capabilities.atomicCounter || !store.incrementCounter) {
      throw new InvalidArgumentError(
        `store "${store.name}" has no atomic counter; pass an oracle shared by all clients`,
      );
    }
  }
  protected reserve(count: number): Promise<number> {
    return this.store.incrementCounter!(this.counterName, count);
  }
}

/**
 * An in-process oracle: valid only when one process is the only client of the store, and
 * one instance serves every client in it (two would both count from the wall clock).
 * It starts from wall time (microsecond scale) so timestamps keep increasing across
 * restarts of that one process, as long as its clock does not go back. `clock` gives
 * milliseconds since 1970, as Date.now; fractions (performance.timeOrigin +
 * performance.now()) are kept to the microsecond. MAX_TIMESTAMP is reached in 2112.
 */
export class LocalOracle extends BatchingOracle {
  private last = 0;
  constructor(private readonly clock: () => number = Date.now) {
    super();
    if (typeof clock !== 'function') {
      throw new InvalidArgumentError(`LocalOracle clock must be a function, got ${describe(clock)}`);
    }
  }
  protected reserve(count: number): Promise<number> {
    const ms = this.clock();
    // Not kept: one bad reading would leave every later draw NaN.
    if (typeof ms !== 'number' || !Number.isFinite(ms)) {
      return Promise.reject(
        new StoreError(`LocalOracle clock gave ${describe(ms)}, not a time in ms`, 'no', {
          retryable: false,
        }),
      );
    }
    // Whole microseconds: a fractional clock gave a fractional timestamp, refused every draw.
    const next = Math.max(this.last, Math.floor(ms * 1000)) + count;
    // Not kept either: one reading far in the future would fail every later draw.
    if (next > MAX_TIMESTAMP) return Promise.reject(pastMaxTimestamp('LocalOracle', next));
    this.last = next;
    return Promise.resolve(this.last);
  }
}
