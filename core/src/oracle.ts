import { InvalidArgumentError } from './errors.js';
import { ORACLE_COUNTER, type RowStore } from './store.js';

/**
 * A timestamp oracle: strictly increasing integers, never repeated (docs/protocol.md section 3).
 */
export interface TimestampOracle {
  next(): Promise<number>;
  close?(): Promise<void>;
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
        if (!Number.isSafeInteger(top) || top > Number.MAX_SAFE_INTEGER - 1) {
          for (const w of batch) w.reject(new Error(`oracle returned an unusable timestamp ${top}`));
        } else {
          const first = top - batch.length + 1;
          for (const [i, w] of batch.entries()) w.resolve(first + i);
        }
        this.afterFetch();
      },
      (error: unknown) => {
        for (const w of batch) w.reject(error);
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
 * An in-process oracle: valid only when one process is the only client of the store.
 * It starts from wall time (microsecond scale) so timestamps keep increasing across
 * restarts of that one process, as long as its clock does not go back.
 */
export class LocalOracle extends BatchingOracle {
  private last = 0;
  constructor(private readonly clock: () => number = Date.now) {
    super();
  }
  protected reserve(count: number): Promise<number> {
    this.last = Math.max(this.last, this.clock() * 1000) + count;
    return Promise.resolve(this.last);
  }
}
