import { nextTurn } from '../backoff.js';
import { InvalidArgumentError, RowTooLargeError, StoreError } from '../errors.js';
import { usableTimestamp } from '../oracle.js';
import { MAX_SHARED_ROWS, sharedCallRows } from '../sharing.js';
import type { CasRequest, RowStore, StampedManyResult, StoredRow } from '../store.js';

/** A stamped CAS request: its state carries the stamp slot the store fills. */
export type StampedRequest = CasRequest & { readonly state: Uint8Array };

interface Waiter {
  readonly requests: readonly StampedRequest[];
  /** `table \0 key` of each request, to keep the rows of one shared step distinct. */
  readonly ids: readonly string[];
  readonly resolve: (reply: StampedManyResult) => void;
  readonly reject: (error: unknown) => void;
}

/**
 * Group commit: the stamped steps (docs/protocol.md 4.5) that this client's transactions
 * send in the same turn of the event loop go to the store as one `checkAndSetStampedMany`,
 * as the read-only transactions of a turn share one peek (peek-batcher.ts) and the batched
 * oracle shares one counter call (docs/protocol.md 4.5, "Shared stamped steps").
 *
 * Why: every step draws from the oracle's counter and commits a store transaction of its
 * own. On PostgreSQL a draw holds the counter row until its transaction is durable (row
 * locks go after the commit record is flushed), so steps sent one by one queue on that row
 * and commit one flush at a time, whatever the number of clients. MariaDB releases the row
 * before its flush; there a shared step saves a call, a draw and a commit per transaction.
 * A step shared by k transactions draws once and commits once for all k.
 *
 * Why it is safe: the shared step is one atomic step that draws one value, so the
 * transactions in it commit at the same instant with the same commit timestamp. Their rows
 * are distinct (two steps that name a common row never share), so no write of one can hide
 * a write of another, and a snapshot drawn from the counter sees all of them or none, as
 * if each had drawn its own adjacent value at that instant. Each keeps its own start
 * timestamp; a blind write (whose start timestamp is its stamp) shares the stamp with the
 * others of its step, on other rows, where no record of it can be mistaken for theirs.
 *
 * Each transaction gets its own reply, in its own order:
 * - applied: its versions and the one timestamp;
 * - refused: the store refuses the whole step if any row changed. A transaction whose own
 *   rows are shown changed gets the refusal with them; the others did not lose a race and
 *   go again, together, then each on its own if refused again (then the reply is its own);
 * - failed (lost request, lost reply, an error): each gets the same error and settles it
 *   as after its own step (a lost reply: each re-reads its rows and finds its records or
 *   not, since the step landed whole or not at all);
 * - too large for one step of this store, or refused by its checks (nothing was sent):
 *   each goes on its own, so that only a transaction whose own request was wrong fails.
 *
 * With more than one shared call in flight (`sharedCallsInFlight`: the store's cost hint,
 * or the client's option) the rows asked for are split among about that many steps:
 * once the waiting rows would pass their share (sharing.ts), they go at once, before the
 * turn ends, and the rest wait for the next.
 */
export class SharedSteps {
  private waiting: Waiter[] = [];
  /** Rows of the waiting steps. */
  private waitingRows = 0;
  /**
   * With more than one call in flight: rows of the steps asked for and not answered yet
   * (waiting, sent, or sent again).
   */
  private outstandingRows = 0;

  private readonly one: boolean;
  private readonly share: boolean;
  private readonly callsInFlight: number;

  constructor(
    private readonly store: RowStore,
    private readonly counter: string,
    options: {
      /** The store has `checkAndSetStamped`: a step of one row goes as that. */
      readonly one: boolean;
      /** The store has `checkAndSetStampedMany` and group commit is on: steps may share. */
      readonly share: boolean;
      /** The client's `sharedCallsInFlight`: its option, else the store's hint, else 1. */
      readonly callsInFlight?: number;
    },
  ) {
    this.one = options.one;
    this.share = options.share;
    this.callsInFlight = options.callsInFlight ?? 1;
  }

  /** Sends one transaction's stamped step, shared with the others of this turn where it can be. */
  send(requests: readonly StampedRequest[]): Promise<StampedManyResult> {
    if (!this.share) return this.alone(requests);
    // With one call in flight (PostgreSQL, MariaDB) the whole turn is packed when it ends,
    // into steps of up to MAX_SHARED_ROWS rows, so that each step is as full as can be; no
    // count of outstanding rows is needed, nor kept.
    const split = this.callsInFlight > 1;
    const n = requests.length;
    if (split) {
      this.outstandingRows += n;
      if (
        this.waiting.length > 0 &&
        this.waitingRows + n > sharedCallRows(this.outstandingRows, this.callsInFlight)
      )
        this.flush();
    }
    return new Promise((resolve, reject) => {
      if (this.waiting.length === 0) nextTurn(() => this.flush());
      const ids = requests.map((r) => `${r.table}\u0000${r.key}`);
      this.waiting.push(
        split
          ? {
              requests,
              ids,
              // Answered, however it ends (shared, alone, again): its rows are no longer outstanding.
              resolve: (reply) => {
                this.outstandingRows -= n;
                resolve(reply);
              },
              reject: (error) => {
                this.outstandingRows -= n;
                reject(error);
              },
            }
          : { requests, ids, resolve, reject },
      );
      this.waitingRows += n;
    });
  }

  private flush(): void {
    const waiting = this.waiting;
    // Sent already, by a step that filled its share before the turn ended.
    if (waiting.length === 0) return;
    this.waiting = [];
    this.waitingRows = 0;
    // Pack in order of asking: a step joins the first shared step it fits, with no row in common.
    const steps: { waiters: Waiter[]; ids: Set<string>; rows: number }[] = [];
    for (const w of waiting) {
      let into = steps.find(
        (s) => s.rows + w.requests.length <= MAX_SHARED_ROWS && !w.ids.some((id) => s.ids.has(id)),
      );
      if (!into) {
        into = { waiters: [], ids: new Set(), rows: 0 };
        steps.push(into);
      }
      into.waiters.push(w);
      for (const id of w.ids) into.ids.add(id);
      into.rows += w.requests.length;
    }
    for (const s of steps) this.sendShared(s.waiters, true);
  }

  /**
   * One transaction's step on its own: the single-row stamped CAS for one row where the
   * store has it (cheaper on some stores: one row lock and no list to unpack), read as a step.
   */
  private async alone(requests: readonly StampedRequest[]): Promise<StampedManyResult> {
    if (requests.length > 1 || !this.one)
      return usableStep(await this.store.checkAndSetStampedMany!(requests, this.counter));
    const outcome = await this.store.checkAndSetStamped!(requests[0]!, this.counter);
    if (!outcome.ok) return { ok: false, current: [outcome.current] };
    if (outcome.timestamp === undefined) {
      // Applied without a timestamp breaks the contract: the re-read finds out what landed.
      throw new StoreError('checkAndSetStamped applied a write but returned no timestamp', 'unknown');
    }
    return {
      ok: true,
      versions: [outcome.version],
      timestamp: usableTimestamp('checkAndSetStamped', outcome.timestamp, 'unknown'),
    };
  }

  private sendAlone(w: Waiter): void {
    this.alone(w.requests).then(w.resolve, w.reject);
  }

  /** `again`: whether the waiters that did not lose a race may share once more after a refusal. */
  private sendShared(waiters: readonly Waiter[], again: boolean): void {
    if (waiters.length === 1) {
      this.sendAlone(waiters[0]!);
      return;
    }
    const requests = waiters.flatMap((w) => w.requests);
    let call: Promise<StampedManyResult>;
    try {
      call = this.store.checkAndSetStampedMany!(requests, this.counter);
    } catch (error) {
      // A store that throws instead of rejecting: settled below as a rejection, never an
      // exception out of whoever flushed (a timer, or another transaction's send).
      call = Promise.reject(error);
    }
    call.then(
      (reply) => {
        let outcome: StampedManyResult;
        try {
          outcome = usableStep(reply);
        } catch (error) {
          for (const w of waiters) w.reject(error);
          return;
        }
        let at = 0;
        const retry: Waiter[] = [];
        for (const w of waiters) {
          const n = w.requests.length;
          if (outcome.ok) {
            w.resolve({
              ok: true,
              versions: outcome.versions.slice(at, at + n),
              timestamp: outcome.timestamp,
            });
          } else {
            const current = outcome.current?.slice(at, at + n);
            const fate = current ? raceOf(w.requests, current) : 'untold';
            if (fate === 'lost') w.resolve({ ok: false, current: current! });
            else if (fate === 'clean' && again) retry.push(w);
            // Its rows not shown, or refused again though they looked unchanged: alone, its own reply.
            else this.sendAlone(w);
          }
          at += n;
        }
        if (retry.length > 0) this.sendShared(retry, false);
      },
      (error: unknown) => {
        // Refused before anything was sent: each goes alone, so that a request only one of
        // them got wrong (too large, refused by the store's checks) fails only its own.
        if (error instanceof RowTooLargeError || error instanceof InvalidArgumentError) {
          for (const w of waiters) this.sendAlone(w);
        } else for (const w of waiters) w.reject(error);
      },
    );
  }
}

/**
 * An applied step's stamp, if below MAX_TIMESTAMP. Past it the rows were written with it
 * ('unknown': each transaction re-reads its rows and finds out), and no row written later
 * can hold it exactly (codec.ts refuses to encode it).
 */
function usableStep(outcome: StampedManyResult): StampedManyResult {
  if (outcome.ok) usableTimestamp('checkAndSetStampedMany', outcome.timestamp, 'unknown');
  return outcome;
}

/**
 * What a refused shared step says of one transaction's rows, as the store showed them:
 * 'lost' if one of them is not what it expected (it lost a race: its refusal), 'clean' if
 * every one is (the refusal was another's), 'untold' if the store did not show them all.
 */
function raceOf(
  requests: readonly StampedRequest[],
  current: readonly (StoredRow | null | undefined)[],
): 'lost' | 'clean' | 'untold' {
  let untold = false;
  for (const [i, r] of requests.entries()) {
    const row = current[i];
    if (row === undefined) untold = true;
    // Versions are never reused for a key: the same version is the same row.
    else if ((row?.version ?? null) !== r.expected) return 'lost';
  }
  return untold ? 'untold' : 'clean';
}
