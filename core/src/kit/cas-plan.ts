import { StoreError } from '../errors.js';
import type { CasRequest, CasResult, RowRef, StoredRow } from '../store.js';

/**
 * Planning a check-and-set for a store that runs statements (SQL): what one request asks
 * the database to do, decided before anything is sent. The request has passed the
 * contract check (checked-store.ts), so it is well-formed; planning only encodes it.
 */
export interface EncodedRef {
  readonly tbl: Buffer;
  readonly key: Buffer;
}

export type CasPlan = EncodedRef &
  (
    | { readonly kind: 'create'; readonly state: Buffer; readonly notified: boolean }
    | {
        readonly kind: 'update';
        readonly expected: string;
        readonly state: Buffer;
        readonly notified: boolean;
      }
    | { readonly kind: 'delete'; readonly expected: string }
    /** expected absent and delete: succeeds exactly when the row is absent. */
    | { readonly kind: 'ensureAbsent' }
    /** expected is no token this store issues: fails without a write. */
    | { readonly kind: 'unmatchable' }
  );

export function encodeRef(ref: RowRef): EncodedRef {
  return { tbl: Buffer.from(ref.table, 'utf8'), key: Buffer.from(ref.key, 'utf8') };
}

/** A view of the bytes as a Buffer (no copy), for a driver. */
export function asBuffer(bytes: Uint8Array): Buffer {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

/** A copy as a plain Uint8Array (driver buffers may be views of a shared slab). */
export function toBytes(buffer: Buffer): Uint8Array {
  return new Uint8Array(buffer);
}

/**
 * `isIssuable` says whether a version could have come from this store (e.g. a canonical
 * BIGINT); any other version matches no row, so the CAS fails without a write.
 */
export function planCas(request: CasRequest, isIssuable: (version: string) => boolean): CasPlan {
  const ref = encodeRef(request);
  const { expected, state } = request;
  const notified = request.notified === true;
  if (expected === null) {
    return state === null
      ? { ...ref, kind: 'ensureAbsent' }
      : { ...ref, kind: 'create', state: asBuffer(state), notified };
  }
  if (!isIssuable(expected)) return { ...ref, kind: 'unmatchable' };
  return state === null
    ? { ...ref, kind: 'delete', expected }
    : { ...ref, kind: 'update', expected, state: asBuffer(state), notified };
}

/** Versions that are BIGINT values of a sequence, printed without leading zeros, up to `max`. */
export function canonicalIntegerVersions(max: bigint): (version: string) => boolean {
  const digits = max.toString().length;
  const canonical = new RegExp(`^(0|[1-9][0-9]{0,${digits - 1}})$`);
  return (version) => canonical.test(version) && BigInt(version) <= max;
}

/**
 * Splits request indexes into groups in which each row appears at most once (one
 * statement cannot apply two changes to a row predictably). The n-th request for a row
 * goes to group n, so running the groups in order keeps each row's requests in order.
 * Without repeated rows this is a single group: one round trip.
 */
export function groupsWithDistinctRows(requests: readonly RowRef[]): number[][] {
  const seen = new Map<string, number>();
  const groups: number[][] = [];
  requests.forEach((request, index) => {
    const id = `${request.table}\u0000${request.key}`;
    const occurrence = seen.get(id) ?? 0;
    seen.set(id, occurrence + 1);
    (groups[occurrence] ??= []).push(index);
  });
  return groups;
}

/** Splits statements into round trips whose text fits `budget` bytes, in order. */
export function packRounds<T extends { sql: string }>(statements: readonly T[], budget: number): T[][] {
  const rounds: T[][] = [];
  let size = Number.POSITIVE_INFINITY;
  for (const statement of statements) {
    const length = Buffer.byteLength(statement.sql) + 2;
    if (size + length > budget) {
      rounds.push([]);
      size = 0;
    }
    rounds[rounds.length - 1]!.push(statement);
    size += length;
  }
  return rounds;
}

/**
 * A failed CAS with the row as it is now: `current` is a courtesy, so a failure of this
 * extra read only loses it.
 */
export async function failedWithCurrent(
  read: (table: string, key: string) => Promise<StoredRow | null>,
  ref: RowRef,
): Promise<CasResult> {
  try {
    return { ok: false, current: await read(ref.table, ref.key) };
  } catch {
    return { ok: false };
  }
}

/**
 * The results of a batch in request order: each request's outcome where the batch gave
 * one, else a failure carrying the row as it is now, read for all failed requests in one
 * `readMany` (if that read fails, the failures carry no `current`).
 */
export async function settleBatch(
  requests: readonly RowRef[],
  outcomes: readonly (CasResult | undefined)[],
  readMany: (refs: readonly RowRef[]) => Promise<(StoredRow | null)[]>,
): Promise<CasResult[]> {
  const failed = requests.filter((_, index) => outcomes[index] === undefined);
  let current: (StoredRow | null | undefined)[] = [];
  if (failed.length > 0) {
    try {
      current = await readMany(failed);
    } catch {
      current = [];
    }
  }
  let nextFailure = 0;
  return outcomes.map((outcome): CasResult => {
    if (outcome !== undefined) return outcome;
    const row = current[nextFailure++];
    return row === undefined ? { ok: false } : { ok: false, current: row };
  });
}

/**
 * A counter value as a JS number. Beyond 2^53 it cannot be one: the increment happened, so
 * not bad input, and whatever the call wrote with it may have landed ('unknown'); no retry
 * gets past it (not retryable).
 */
export function toSafeCounter(text: string, name: string): number {
  const value = Number(text);
  if (!Number.isSafeInteger(value)) {
    throw new StoreError(
      `counter ${JSON.stringify(name)} reached ${text}, beyond Number.MAX_SAFE_INTEGER`,
      'unknown',
      {
        retryable: false,
      },
    );
  }
  return value;
}
