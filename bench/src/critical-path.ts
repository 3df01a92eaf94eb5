import { AsyncLocalStorage } from 'node:async_hooks';

/**
 * Sequential round trips: how many times a transaction waits on its store, as opposed to
 * how many calls it makes. Calls that overlap (a `Promise.all` of reads, a batch) are one
 * wait; calls one after another are one wait each.
 *
 * A transaction runs inside `traced()`, and every store call made in its async context
 * (AsyncLocalStorage) is recorded as an interval. When the transaction returns, the calls
 * that had finished are its critical path: the number of separate stretches of time in
 * which at least one of them was in flight is its count of sequential round trips. Calls
 * still in flight when it returned (the secondaries a commit leaves to the background) and
 * calls made in its context afterwards (the tidy step) count as background.
 */

/** Event order: intervals are compared by the order things happened, not by the clock. */
let clock = 0;

interface Interval {
  readonly start: number;
  end?: number;
}

export interface TraceFigures {
  /** Separate stretches in which at least one critical-path call was in flight. */
  readonly sequential: number;
  /** Calls that finished before the transaction returned. */
  readonly criticalCalls: number;
  /** Calls made in the transaction's context that were not on its critical path. */
  readonly backgroundCalls: number;
}

/** The store calls of one traced transaction. */
export class CallTrace {
  private readonly calls: Interval[] = [];
  private closedAt: number | undefined;

  /** Records the start of a call; `end(interval)` records its end. */
  begin(): Interval {
    const interval: Interval = { start: ++clock };
    this.calls.push(interval);
    return interval;
  }

  end(interval: Interval): void {
    interval.end ??= ++clock;
  }

  /** The transaction returned: calls after this, or still running, are background. */
  close(): void {
    this.closedAt ??= ++clock;
  }

  figures(): TraceFigures {
    const closedAt = this.closedAt ?? Number.POSITIVE_INFINITY;
    let sequential = 0;
    let critical = 0;
    let reach = -1;
    // Calls are recorded in start order, so one pass merges overlapping intervals.
    for (const call of this.calls) {
      if (call.end === undefined || call.end > closedAt) continue;
      critical++;
      if (call.start > reach) sequential++;
      reach = Math.max(reach, call.end);
    }
    return { sequential, criticalCalls: critical, backgroundCalls: this.calls.length - critical };
  }
}

const storage = new AsyncLocalStorage<CallTrace>();

/**
 * Makes `call()` as a store call of the transaction running (if one is traced); the
 * result is the call's own. A call that does not return a promise is not a round trip.
 */
export function trackCall<T>(call: () => T): T {
  const trace = storage.getStore();
  if (!trace) return call();
  const interval = trace.begin();
  let result: T;
  try {
    result = call();
  } catch (error) {
    trace.end(interval);
    throw error;
  }
  if (!isPromiseLike(result)) {
    trace.end(interval);
    return result;
  }
  return Promise.resolve(result).finally(() => trace.end(interval)) as T;
}

function isPromiseLike(value: unknown): value is PromiseLike<unknown> {
  return (
    typeof value === 'object' && value !== null && typeof (value as { then?: unknown }).then === 'function'
  );
}

/**
 * Runs `fn` as one traced transaction. The trace is closed when `fn` settles; read its
 * figures after waiting for the background work it left (so that is counted as such).
 */
export async function traced<T>(fn: () => Promise<T>): Promise<{ value: T; trace: CallTrace }> {
  const trace = new CallTrace();
  try {
    const value = await storage.run(trace, fn);
    return { value, trace };
  } finally {
    trace.close();
  }
}

/**
 * Turns the async context tracking off again once the traced transactions are done. While
 * any AsyncLocalStorage is enabled, Node runs a hook on every promise in the process, which
 * would tax the next measured cell (and the protocol, which makes more promises than a raw
 * transaction, more than its baseline). `traced()` turns it back on when next needed.
 */
export function stopTracing(): void {
  storage.disable();
}
