import { backoffMs, sleep } from './backoff.js';
import { decodeRowAt, encodeRow } from './codec.js';
import { fence } from './commit/fence.js';
import type { ProtocolEnv } from './env.js';
import { InvalidArgumentError, PercolatorError, RowTooLargeError, StoreError } from './errors.js';
import type { TransactionRef } from './events.js';
import { shownName } from './names.js';
import { isCellEmpty, type RowState, rowHasNotification } from './row-state.js';
import { checkRoomToSettle } from './settle-cells.js';
import { type CasRequest, type CasResult, type StoredRow, writeStampInPlace } from './store.js';

/**
 * The read-modify-CAS loops every protocol step uses on head rows: `updateRow` for one
 * row, `updateRows` for many (docs/protocol.md section 6).
 *
 * `decide` looks at the row as it is now and says what to write, or that nothing needs
 * writing. Because every state we write carries our startTs, `decide` can recognise its
 * own earlier write. That is how ambiguity is handled: after a CAS whose outcome is
 * unknown we re-read and ask `decide` again; `attempt.ambiguous` tells it an earlier
 * attempt may have landed.
 */
/**
 * `reserve`: the write adds to the row (a prewrite, a one-step commit), so it must leave
 * room for every lock in the row to be settled (settle-cells.ts, `checkRoomToSettle`):
 * 'puts' with the slack kept for rollback records, 'deletes' (a write of deletes only)
 * without it.
 */
export type RowDecision<T> =
  | { write: RowState | null; result: T; reserve?: Reserve | undefined }
  | { done: T };

export type Reserve = 'puts' | 'deletes';

export interface AttemptInfo {
  /** An earlier CAS in this loop may have been applied. */
  readonly ambiguous: boolean;
}

export type Decide<T> = (row: RowState | undefined, attempt: AttemptInfo) => RowDecision<T>;

/**
 * A row as this client last saw it, from its row cache (row-cache.ts): sent as a CAS's
 * expected version, but never decided on alone. A decision on a guess that does not end
 * in a successful CAS (nothing to write, or an error) is made again on the row as read.
 */
export class Guess {
  constructor(readonly row: StoredRow | null) {}
}

/** What the caller knows of a row: the row, null (absent), undefined (nothing), or a guess. */
export type Known = StoredRow | null | undefined | Guess;

/** The caller's knowledge, else the row cache's guess, else nothing. */
export function knownOrGuess(
  env: ProtocolEnv,
  table: string,
  key: string,
  known: StoredRow | null | undefined,
): Known {
  if (known !== undefined || !env.rowCache) return known;
  const row = env.rowCache.get(table, key);
  return row === undefined ? undefined : new Guess(row);
}

/** The outcome stayed unknown: the loop could not re-read after an ambiguous CAS. */
export class AmbiguousOutcome extends Error {
  constructor(cause: unknown) {
    super('the outcome of a store write could not be verified', { cause });
  }
}

/**
 * An AmbiguousOutcome of a write that does not decide the transaction (a prewrite the
 * rollback then undid, a tidy pass before the commit step was sent), as the public error a
 * commit fails with: nothing of the transaction applied. Retryable unless what went wrong
 * cannot be fixed by trying again (credentials, say).
 */
export function notAppliedAfter(error: AmbiguousOutcome, message: string): StoreError {
  const cause = error.cause;
  // A lost reply is retryable once the call is known not to have applied; a reply that broke
  // the store's contract, or refused credentials, is not (StoreError.retryableIfNotApplied).
  const retryable =
    cause instanceof StoreError
      ? cause.retryableIfNotApplied
      : !(cause instanceof PercolatorError && !cause.retryable);
  return new StoreError(message, 'no', { cause, retryable });
}

/**
 * The retry budget, one per failure kind (a CAS lost to another writer is not a failure):
 * the store adapters do not retry writes themselves.
 */
const MAX_CAS_ATTEMPTS = 64;
const MAX_READ_ATTEMPTS = 6;
/** Store errors (not CAS losses) tolerated in one loop before giving up. */
const MAX_STORE_FAILURES = 8;

export interface RowUpdateResult<T> {
  readonly result: T;
  /** The row as this loop last saw or wrote it (undefined if unknown). */
  readonly stored: StoredRow | null | undefined;
  /** With `stamped`: the timestamp the store drew for a write this loop applied. */
  readonly timestamp?: number;
}

export async function updateRow<T>(
  env: ProtocolEnv,
  table: string,
  key: string,
  known: Known,
  decide: Decide<T>,
  startAmbiguous = false,
  /**
   * Send writes as stamped steps (`env.steps`, drawing from the oracle's counter): a
   * decision's records with commitTs STAMP get the drawn value. Only where `env.steps` is.
   */
  stamped = false,
  /**
   * The decision's records carry no identity the client knows (a one-step commit named by
   * the store's draw): after a write whose outcome is unknown, a row still at the version
   * it expected is fenced (commit/fence.ts), which makes the outcome certain. Holds the
   * transaction the write commits, for the fence's event.
   */
  fenceLost?: { readonly transaction: TransactionRef | undefined },
): Promise<RowUpdateResult<T>> {
  const cache = env.rowCache;
  // A guess only before anything may have landed: after an ambiguous CAS, the row as read.
  let guessed = known instanceof Guess && !startAmbiguous;
  let current = known instanceof Guess ? (guessed ? known.row : undefined) : known;
  let ambiguous = startAmbiguous;
  let lastError: unknown;
  let failures = 0;
  /** What the last write whose outcome is unknown expected (fenceLost; null: absent). */
  let lost: { readonly expected: string | null } | undefined;
  for (let attempt = 0; attempt < MAX_CAS_ATTEMPTS; attempt++) {
    if (current === undefined) {
      try {
        current = await readRow(env, table, key);
      } catch (error) {
        if (ambiguous) throw new AmbiguousOutcome(error);
        throw error;
      }
      cache?.set(table, key, current);
      if (ambiguous && lost !== undefined && (current?.version ?? null) === lost.expected) {
        const fenced = await fence(env, table, key, current, lost.expected, fenceLost?.transaction);
        if (fenced) {
          // The lost write can no longer land, and had not: decide as if it was never sent.
          current = fenced;
          ambiguous = false;
          lost = undefined;
          lastError = undefined;
        }
      }
    }
    let decision: RowDecision<T>;
    if (guessed) {
      // Only a write, checked by its CAS, is taken on a guess; anything else is decided
      // again on the row as it is.
      guessed = false;
      try {
        decision = decide(current ? decodeRowAt(current.state, table, key) : undefined, { ambiguous });
      } catch {
        current = undefined;
        continue;
      }
      if (!('write' in decision)) {
        current = undefined;
        continue;
      }
    } else {
      try {
        decision = decide(current ? decodeRowAt(current.state, table, key) : undefined, { ambiguous });
      } catch (error) {
        // A decision's own verdict (a conflict, a lock) is certain whatever landed: the row
        // as read shows it. A bad argument is no verdict on the row (a clock reading that
        // failed its check, say): after an attempt whose outcome is unknown, that attempt
        // may still land, so it must not read as "not written" (found in review).
        if (ambiguous && error instanceof InvalidArgumentError) throw new AmbiguousOutcome(error);
        throw error;
      }
      if (!('write' in decision)) return { result: decision.done, stored: current };
    }
    let request: CasRequest;
    try {
      request = casRequest(env, table, key, current?.version ?? null, decision.write, decision.reserve);
    } catch (error) {
      // Nothing is sent, but after an attempt whose outcome is unknown the row may hold it:
      // a row now too large for the store (grown by the row as re-read) must not read as
      // "not written" (as in the catch below).
      if (ambiguous) throw new AmbiguousOutcome(error);
      throw error;
    }
    try {
      if (stamped && request.state) {
        // A step of one row, shared with this turn's other stamped steps where the store can.
        const outcome = await env.steps!.send([{ ...request, state: request.state }]);
        if (outcome.ok) {
          // The state is this step's own encoding, and the store is done with it: stamp it in place.
          const stored = {
            version: outcome.versions[0]!,
            state: writeStampInPlace(request.state, outcome.timestamp),
          };
          cache?.set(table, key, stored);
          env.tidier.afterWrite(table, key, decision.write, stored);
          return { result: decision.result, stored, timestamp: outcome.timestamp };
        }
        current = outcome.current?.[0];
        if (current !== undefined) cache?.set(table, key, current);
        continue;
      }
      const outcome = await env.store.checkAndSet(request);
      if (outcome.ok) {
        const stored = request.state ? { version: outcome.version, state: request.state } : null;
        cache?.set(table, key, stored);
        env.tidier.afterWrite(table, key, decision.write, stored);
        return { result: decision.result, stored };
      }
      current = outcome.current;
      if (current !== undefined) cache?.set(table, key, current);
    } catch (error) {
      // Nothing was sent; but after an earlier attempt whose outcome is unknown the row may
      // hold that attempt's write, so the outcome stays unknown (a caller that took this for
      // "not written" would roll back a commit that landed).
      if (error instanceof RowTooLargeError) throw ambiguous ? new AmbiguousOutcome(error) : error;
      lastError = error;
      if (!(error instanceof StoreError && error.applied === 'no')) {
        ambiguous = true;
        // Only the store's own 'unknown' is fenced: an error that may repeat on every send
        // (a bug, a refusal of this request) ends the loop unknown, as before.
        lost =
          fenceLost !== undefined && error instanceof StoreError ? { expected: request.expected } : undefined;
      }
      current = undefined;
      cache?.delete(table, key);
      if (++failures >= MAX_STORE_FAILURES) break;
      await sleep(backoffMs(failures, 5, 500));
    }
  }
  if (ambiguous) throw new AmbiguousOutcome(lastError);
  throw (
    lastError ??
    new StoreError(`row ${table}/${key} changed on every one of ${MAX_CAS_ATTEMPTS} attempts`, 'no')
  );
}

/** One row of a batched update. */
export interface RowUpdate<T> {
  readonly table: string;
  readonly key: string;
  /**
   * The row as the caller last saw it; undefined = read it (coalesced with the others); a
   * `Guess` = try a CAS against it, and read it if the decision is not a write.
   */
  readonly known: Known;
  readonly decide: Decide<T>;
  /**
   * How this row is settled when the batch did not settle it (a lost race, an unknown
   * outcome, a decision that threw): by default `updateRow` from the row as now known.
   */
  readonly single?: (known: Known, ambiguous: boolean) => Promise<RowUpdateResult<T>>;
}

export interface UpdateRowsOptions {
  /** A decision error for which nothing at all is sent: the whole call rejects with it. */
  readonly abortIf?: (error: unknown) => boolean;
  /** Called just before the batch goes to the store (parts settled on their own: see `single`). */
  readonly beforeSend?: () => void;
}

/**
 * The one batched row-update primitive: read the rows not known yet (one coalesced
 * `readMany`), decide per row, send every write in one `checkAndSetMany`, then settle each
 * part the batch did not (a lost race, an unknown outcome, a decision that threw) on its
 * own through `single`, which re-reads and decides again. Because decisions recognise
 * their own earlier writes, a part that did land despite an unknown reply is not written
 * twice. On stores without `batchCheckAndSet`, or for one row, every row goes `single`
 * at once. Results are in request order, each fulfilled or rejected on its own.
 */
export async function updateRows<T>(
  env: ProtocolEnv,
  updates: readonly RowUpdate<T>[],
  options: UpdateRowsOptions = {},
): Promise<PromiseSettledResult<RowUpdateResult<T>>[]> {
  return Promise.allSettled(await startRowUpdates(env, updates, options));
}

/**
 * `updateRows`, one promise per row (in request order), for callers that act on each row
 * as soon as it is settled. Rejects as a whole only when `abortIf` stopped the batch.
 */
export async function startRowUpdates<T>(
  env: ProtocolEnv,
  updates: readonly RowUpdate<T>[],
  options: UpdateRowsOptions = {},
): Promise<Promise<RowUpdateResult<T>>[]> {
  const single = (u: RowUpdate<T>, known: Known, ambiguous: boolean) => {
    const p = u.single
      ? u.single(known, ambiguous)
      : updateRow(env, u.table, u.key, known, u.decide, ambiguous);
    // Settled below with allSettled; some start before the batch returns, so mark them handled now.
    p.catch(() => undefined);
    return p;
  };
  const { store } = env;
  const cache = env.rowCache;
  if (updates.length <= 1 || !store.capabilities.batchCheckAndSet || !store.checkAndSetMany) {
    return updates.map((u) => single(u, u.known, false));
  }
  const guessed = updates.map((u) => u.known instanceof Guess);
  const known = await Promise.all(
    updates.map((u) => {
      if (u.known instanceof Guess) return u.known.row;
      if (u.known !== undefined) return u.known;
      return env.reader.read(u.table, u.key).then(
        (row) => {
          cache?.set(u.table, u.key, row);
          return row;
        },
        () => undefined, // left unknown: settled on its own
      );
    }),
  );
  type Planned = { index: number; request: CasRequest; state: RowState | null; result: T };
  const planned: Planned[] = [];
  const settled: (Promise<RowUpdateResult<T>> | undefined)[] = updates.map(() => undefined);
  const retry: { index: number; row: StoredRow | null | undefined }[] = [];
  let abort: { error: unknown } | undefined;
  for (const [index, u] of updates.entries()) {
    const row = known[index];
    if (row === undefined) continue;
    let decision: RowDecision<T>;
    try {
      decision = u.decide(row ? decodeRowAt(row.state, u.table, u.key) : undefined, { ambiguous: false });
      if ('write' in decision) {
        const request = casRequest(
          env,
          u.table,
          u.key,
          row?.version ?? null,
          decision.write,
          decision.reserve,
        );
        planned.push({ index, request, state: decision.write, result: decision.result });
      } else if (guessed[index]) {
        // Nothing to write, on a guess: decide again on the row as it is.
        retry.push({ index, row: undefined });
      } else {
        settled[index] = Promise.resolve({ result: decision.done, stored: row });
      }
    } catch (error) {
      // An error decided on a guess says nothing: the row as read decides (never an abort).
      if (guessed[index]) retry.push({ index, row: undefined });
      else if (options.abortIf?.(error)) abort ??= { error };
      else retry.push({ index, row });
    }
  }
  if (abort) throw abort.error;
  for (const { index, row } of retry) settled[index] = single(updates[index]!, row, false);
  let results: CasResult[] | undefined;
  if (planned.length > 0) {
    try {
      options.beforeSend?.();
      results = await store.checkAndSetMany(planned.map((p) => p.request));
    } catch {
      results = undefined;
    }
    // A reply of the wrong length is a broken store: settle every part on its own.
    if (results?.length !== planned.length) results = undefined;
  }
  for (const [i, p] of planned.entries()) {
    const outcome = results?.[i];
    const u = updates[p.index]!;
    if (outcome?.ok) {
      const stored = p.request.state ? { version: outcome.version, state: p.request.state } : null;
      cache?.set(u.table, u.key, stored);
      env.tidier.afterWrite(u.table, u.key, p.state, stored);
      settled[p.index] = Promise.resolve({ result: p.result, stored });
    } else if (outcome) {
      if (outcome.current !== undefined) cache?.set(u.table, u.key, outcome.current);
      settled[p.index] = single(u, outcome.current, false);
    } else {
      cache?.delete(u.table, u.key);
      settled[p.index] = single(u, undefined, true);
    }
  }
  return updates.map((u, i) => settled[i] ?? single(u, undefined, false));
}

function casRequest(
  env: ProtocolEnv,
  table: string,
  key: string,
  expected: string | null,
  state: RowState | null,
  reserve?: Reserve,
): CasRequest {
  if (!state) return { table, key, expected, state: null, notified: false };
  env.tidier.beforeWrite(table, key, state);
  const bytes = encodeReserving(env, table, key, state, reserve);
  return { table, key, expected, state: bytes, notified: rowHasNotification(state) };
}

/** `encodeState`, then, for a write that adds to the row, its room-to-settle check (`Reserve`). */
export function encodeReserving(
  env: ProtocolEnv,
  table: string,
  key: string,
  state: RowState,
  reserve: Reserve | undefined,
): Uint8Array {
  const bytes = encodeState(env, table, key, state);
  if (reserve) checkRoomToSettle(env, table, key, bytes, reserve === 'puts');
  return bytes;
}

/** A read, retried on failure (reads change nothing, so retrying is always safe). */
export async function readRow(env: ProtocolEnv, table: string, key: string): Promise<StoredRow | null> {
  for (let attempt = 0; ; attempt++) {
    try {
      return await env.store.read(table, key);
    } catch (error) {
      if (attempt + 1 >= MAX_READ_ATTEMPTS) throw error;
      await sleep(backoffMs(attempt, 5, 500));
    }
  }
}

export function encodeState(env: ProtocolEnv, table: string, key: string, row: RowState): Uint8Array {
  for (const [column, cell] of row.cells) if (isCellEmpty(cell)) row.cells.delete(column);
  const bytes = encodeRow(row);
  if (bytes.length > env.store.capabilities.maxStateBytes) {
    throw new RowTooLargeError(
      `row ${table}/${shownName(key)} would be ${bytes.length} bytes; ${env.store.name} allows ${env.store.capabilities.maxStateBytes}`,
    );
  }
  return bytes;
}
