import { backoffMs, sleep } from './backoff.js';
import { decodeRow, encodeRow } from './codec.js';
import type { ProtocolEnv } from './env.js';
import { RowTooLargeError, StoreError } from './errors.js';
import { isCellEmpty, type RowState, rowHasNotification } from './row-state.js';
import type { StoredRow } from './store.js';

/**
 * The one read-modify-CAS loop every protocol step uses on a single row.
 *
 * `decide` looks at the row as it is now and says what to write, or that nothing needs
 * writing. Because every state we write carries our startTs, `decide` can recognise its
 * own earlier write. That is how ambiguity is handled (PROTOCOL.md section 6): after a
 * CAS whose outcome is unknown we re-read and ask `decide` again; `attempt.ambiguous`
 * tells it an earlier attempt may have landed.
 */
export type RowDecision<T> = { write: RowState | null; result: T } | { done: T };

export interface AttemptInfo {
  /** An earlier CAS in this loop may have been applied. */
  readonly ambiguous: boolean;
}

/** The outcome stayed unknown: the loop could not re-read after an ambiguous CAS. */
export class AmbiguousOutcome extends Error {
  constructor(cause: unknown) {
    super('the outcome of a store write could not be verified', { cause });
  }
}

const MAX_CAS_ATTEMPTS = 64;
const MAX_READ_ATTEMPTS = 6;
/** Store errors (not CAS losses) tolerated in one loop before giving up. */
const MAX_STORE_FAILURES = 8;

export interface RowUpdateResult<T> {
  readonly result: T;
  /** The row as this loop last saw or wrote it (undefined if unknown). */
  readonly stored: StoredRow | null | undefined;
}

export async function updateRow<T>(
  env: ProtocolEnv,
  table: string,
  key: string,
  known: StoredRow | null | undefined,
  decide: (row: RowState | undefined, attempt: AttemptInfo) => RowDecision<T>,
): Promise<RowUpdateResult<T>> {
  let current = known;
  let ambiguous = false;
  let lastError: unknown;
  let failures = 0;
  for (let attempt = 0; attempt < MAX_CAS_ATTEMPTS; attempt++) {
    if (current === undefined) {
      try {
        current = await readRow(env, table, key);
      } catch (error) {
        if (ambiguous) throw new AmbiguousOutcome(error);
        throw error;
      }
    }
    const decision = decide(current ? decodeRow(current.state) : undefined, { ambiguous });
    if (!('write' in decision)) return { result: decision.done, stored: current };
    const state = decision.write ? encodeState(env, table, key, decision.write) : null;
    try {
      const outcome = await env.store.checkAndSet({
        table,
        key,
        expected: current?.version ?? null,
        state,
        notified: decision.write ? rowHasNotification(decision.write) : false,
      });
      if (outcome.ok) {
        return { result: decision.result, stored: state ? { version: outcome.version, state } : null };
      }
      current = outcome.current;
    } catch (error) {
      if (error instanceof RowTooLargeError) throw error;
      lastError = error;
      if (!(error instanceof StoreError && error.applied === 'no')) ambiguous = true;
      current = undefined;
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
      `row ${table}/${JSON.stringify(key)} would be ${bytes.length} bytes; ${env.store.name} allows ${env.store.capabilities.maxStateBytes}`,
    );
  }
  return bytes;
}
