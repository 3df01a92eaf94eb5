import { nextTurn } from './backoff.js';
import { MAX_TIMESTAMP } from './codec.js';
import { StoreError } from './errors.js';
import { pastMaxTimestamp } from './oracle.js';
import { sharedCallRows } from './sharing.js';
import type { RowRef, RowStore, StoredRow } from './store.js';

interface Waiter {
  readonly refs: readonly RowRef[];
  readonly resolve: (reply: { readonly timestamp: number; readonly rows: (StoredRow | null)[] }) => void;
  readonly reject: (error: unknown) => void;
}

/**
 * Shares one `readPeeked` among the transactions of a client whose first reads
 * go out in the same turn of the event loop (docs/protocol.md 4.1, "Shared peeks"), as the
 * batched oracle shares one counter fetch among every transaction that asks while a fetch
 * is in flight. Under concurrent load, replies arrive together and the transactions they
 * wake start their next ones together: their peeks become one round trip and one
 * statement instead of one each.
 *
 * Why it is safe: a peek changes nothing, and what a read-only transaction needs of it is
 * a snapshot taken after the transaction began: the counter's value V and its rows as one
 * snapshot (the `readPeeked` rule). A shared peek is taken after every transaction in it
 * asked, so it is such a snapshot for each of them. Peeked transactions may share a start
 * timestamp: no lock or record carries it, as a read-write one commits under an identity
 * drawn for it alone (`peekedWrites`, docs/protocol.md 4.10).
 *
 * Each transaction gets its own rows, in its own order, and the same failure if the peek
 * fails (each then falls back on its own, as after a failed peek of its own).
 *
 * With more than one shared call in flight (`sharedCallsInFlight`: the store's cost hint,
 * or the client's option) the rows asked for are split among about that many peeks:
 * once the waiting rows would pass their share (sharing.ts), they go at once, before the
 * turn ends, and the rest wait for the next.
 */
export class PeekBatcher {
  private waiting: Waiter[] = [];
  /** Rows of the waiting peeks. */
  private waitingRows = 0;
  /** Rows of the shared peeks sent and not answered yet. */
  private inFlightRows = 0;

  constructor(
    private readonly store: RowStore,
    private readonly counter: string,
    private readonly callsInFlight = 1,
  ) {}

  peek(
    refs: readonly RowRef[],
  ): Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }> {
    return new Promise((resolve, reject) => this.request(refs, resolve, reject));
  }

  /**
   * `peek` with callbacks, no promise of its own: a transaction's first reads hand theirs
   * (a read-only transaction of one read is a few microseconds of client CPU, and each
   * promise is an allocation and its turns). Exactly one of them is called, once; neither
   * may throw (a promise's resolve and reject never do, and neither does the transaction's).
   */
  request(refs: readonly RowRef[], resolve: Waiter['resolve'], reject: Waiter['reject']): void {
    const asked = this.waitingRows + refs.length;
    if (this.waiting.length > 0 && asked > sharedCallRows(this.inFlightRows + asked, this.callsInFlight))
      this.flush();
    if (this.waiting.length === 0) nextTurn(() => this.flush());
    this.waiting.push({ refs, resolve, reject });
    this.waitingRows += refs.length;
  }

  private flush(): void {
    const batch = this.waiting;
    if (batch.length === 0) return;
    this.waiting = [];
    this.waitingRows = 0;
    const refs: RowRef[] = [];
    for (const w of batch) for (const r of w.refs) refs.push(r);
    let call: Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }>;
    try {
      call = this.store.readPeeked!(refs, this.counter);
    } catch (error) {
      // A store that throws instead of rejecting: the same failure for each, not an
      // exception out of whoever flushed (a timer, or a transaction's first reads).
      for (const w of batch) w.reject(error);
      return;
    }
    this.inFlightRows += refs.length;
    call.then(
      (reply) => {
        this.inFlightRows -= refs.length;
        const { timestamp, rows } = reply;
        // A reply of the wrong size is a broken store (the checked store, which the core
        // puts under this batcher, refuses one before it gets here): a failure for each, never
        // a waiter's rows cut from the wrong place, nor a missing row taken for an absent one.
        if (!Array.isArray(rows) || rows.length !== refs.length) {
          const error = new StoreError(
            `readPeeked broke the store contract: expected ${refs.length} rows, got ${Array.isArray(rows) ? rows.length : typeof rows}`,
            'no',
            { retryable: false },
          );
          for (const w of batch) w.reject(error);
          return;
        }
        // The snapshot is V + 1 (transaction.ts, `peek`): a timestamp like any other.
        if (timestamp >= MAX_TIMESTAMP) {
          const error = pastMaxTimestamp('readPeeked', timestamp + 1);
          for (const w of batch) w.reject(error);
          return;
        }
        if (batch.length === 1) {
          resolve(batch[0]!, { timestamp, rows });
          return;
        }
        let at = 0;
        for (const w of batch) {
          resolve(w, { timestamp, rows: rows.slice(at, at + w.refs.length) });
          at += w.refs.length;
        }
      },
      (error: unknown) => {
        this.inFlightRows -= refs.length;
        for (const w of batch) w.reject(error);
      },
    );
  }
}

/**
 * Each waiter's callback on its own: one that throws (none should: `request`) never keeps
 * the others from theirs; it gets the error instead.
 */
function resolve(
  w: Waiter,
  reply: { readonly timestamp: number; readonly rows: (StoredRow | null)[] },
): void {
  try {
    w.resolve(reply);
  } catch (error) {
    w.reject(error);
  }
}
