import { putUint64BE } from './codec.js';

/**
 * The single-row contract (docs/protocol.md section 1). A store keeps, per (table, key), an
 * opaque state and a version token, and offers an atomic check-and-set on one row.
 * Everything else the protocol needs is built in the core on top of this.
 *
 * Rules every adapter must keep (the conformance suite checks them):
 * - `read` is linearizable for that row.
 * - `checkAndSet` applies only if the row's current version equals `expected`
 *   (`null` = the row must be absent), atomically.
 * - Version tokens are never reused for a key, not even after a delete and re-create.
 * - A call whose outcome is unknown (timeout, lost connection after sending) must not be
 *   reported as a plain failure: throw `StoreError(..., 'unknown')` or any other error.
 *   Throw `StoreError(..., 'no')` only when the store certainly did not apply it.
 * - Keys are compared in UTF-8 byte order (see `compareKeys`) wherever order matters.
 */
export type Version = string;

export interface StoredRow {
  readonly version: Version;
  readonly state: Uint8Array;
}

export interface CasRequest {
  readonly table: string;
  readonly key: string;
  /** The version the row must have, or `null` if the row must not exist. */
  readonly expected: Version | null;
  /**
   * The new state, or `null` to delete the row. Often a view into a larger buffer (the
   * core's byte pool): use its `byteOffset` and `byteLength`, never its whole `buffer`, and
   * keep a copy, not the array, if the store keeps the bytes (core/src/byte-pool.ts).
   */
  readonly state: Uint8Array | null;
  /**
   * Whether the row carries a pending notification after this write. Stores with the
   * `notificationIndex` capability keep an index of such rows (docs/protocol.md section 8).
   */
  readonly notified?: boolean;
}

export type CasResult =
  | { readonly ok: true; readonly version: Version }
  | {
      readonly ok: false;
      /** The row as it is now (`null` = absent), if the store returns it cheaply. */
      readonly current?: StoredRow | null;
    };

/** The reply of `checkAndSetStampedMany`: every row written with one timestamp, or none. */
export type StampedManyResult =
  | { readonly ok: true; readonly versions: readonly Version[]; readonly timestamp: number }
  | { readonly ok: false; readonly current?: readonly (StoredRow | null | undefined)[] };

export interface RowRef {
  readonly table: string;
  readonly key: string;
}

export interface ScanOptions {
  /** Inclusive lower bound. */
  readonly start?: string;
  /** Exclusive upper bound. */
  readonly end?: string;
  /** Return only keys strictly greater than this (paging). */
  readonly after?: string;
  /** At most this many rows (required: stores page). */
  readonly limit: number;
}

export interface ScannedStoredRow {
  readonly key: string;
  readonly row: StoredRow;
}

export interface NotificationScanOptions {
  /** Return only keys strictly greater than this. Workers start at random positions. */
  readonly after?: string;
  readonly limit: number;
}

/**
 * Optional capabilities. They make things faster or possible (scans, the observer
 * index, a shared oracle); correctness never depends on them. A store declares what it
 * offers here and implements the matching method; the core never sniffs for methods.
 */
export interface StoreCapabilities {
  /** `readMany`: many reads in one round trip. */
  readonly batchRead: boolean;
  /** `checkAndSetMany`: many independent single-row CAS in one round trip (not atomic together). */
  readonly batchCheckAndSet: boolean;
  /** `scan`: rows of one table in key order. */
  readonly orderedScan: boolean;
  /** `incrementCounter`: an atomic, durable counter (used by the default oracle). */
  readonly atomicCounter: boolean;
  /** `scanNotified`: an index of rows whose `notified` flag is set. */
  readonly notificationIndex: boolean;
  /**
   * `checkAndSetStamped`: a CAS whose state carries a timestamp the store draws from the
   * default oracle's counter in the same atomic step as the write (see `checkAndSetStamped`).
   * Lets a single-row transaction commit in one CAS, and a primary commit without a
   * separate round trip for its commit timestamp. Needs the counter and the row in one
   * server that can run the step next to the data (a Lua script, one SQL transaction).
   */
  readonly stampedCheckAndSet: boolean;
  /**
   * `checkAndSetStampedMany` (absent means false): `checkAndSetStamped` over several rows,
   * all or nothing, one drawn value for all. Lets a multi-row transaction commit in one
   * round trip with no locks (one-phase commit, docs/protocol.md 4.5), where the rows and
   * the counter live in one server that can run the step next to the data.
   */
  readonly stampedCheckAndSetMany?: boolean;
  /**
   * With `stampedCheckAndSetMany`: a step of a few rows costs the store about what one
   * `checkAndSetStamped` does (a cost hint, absent means false). A one-row commit whose old
   * values leave its head row then sends their version rows in one `checkAndSetStampedMany`
   * with it, instead of a single-row stamped CAS followed by a tidy pass (docs/protocol.md
   * 7.2). Redis (one script either way) and the memory store declare it; MariaDB does not
   * (its procedure of two rows costs about 1.35 times the single-row one, and one-row
   * writes that carried their moves ran 7-13 % slower), nor PostgreSQL (no gain measured).
   * Multi-row one-step commits carry their moves on every store with the capability.
   */
  readonly stampedManyForOneRow?: boolean;
  /**
   * `readStamped`: a start timestamp and a batch of reads in one round trip (absent means
   * false). Lets a transaction's first reads need no separate round trip to the oracle.
   */
  readonly stampedRead?: boolean;
  /**
   * With `stampedRead`: a stamped read costs the store about what a plain read does, with
   * no durable write or lock of its own (Redis: the counter's INCR runs in memory, in the
   * same script). The client then uses stamped reads under load too, one round trip per
   * transaction, instead of sharing the batched oracle's fetches (two round trips). Absent
   * or false (PostgreSQL, MySQL: a stamped read commits a counter update, which serialises
   * on the counter row): stamped reads while the client is otherwise idle, and under load
   * only while they measure clearly faster than the oracle's way (docs/protocol.md 4.1).
   */
  readonly stampedReadUnderLoad?: boolean;
  /**
   * `readPeeked`: a counter's current value and a batch of reads, as one snapshot, in one
   * round trip, writing nothing (absent means false). Lets a read-only transaction take its
   * snapshot without drawing a timestamp: no counter write, no lock, no wait on one.
   */
  readonly peekedRead?: boolean;
  /**
   * A cost hint for the calls a client's transactions share (absent means 1): the shared
   * peeks of read-only transactions and the shared stamped steps of commits, how many of
   * each the client splits what its transactions ask at once into, an integer from 1 to
   * 64. 1 (PostgreSQL, MariaDB: each call costs the server a statement and a snapshot):
   * one call for all a turn asks, the fewest calls. 3 (Redis: a call costs the server
   * little next to the client's own work on a transaction): the client works on one call's
   * replies while the store answers the next, instead of the two taking turns
   * (core/src/sharing.ts; docs/protocol.md 4.1).
   */
  readonly sharedCallsInFlight?: number;
  /** Largest state (bytes) one row may hold. */
  readonly maxStateBytes: number;
}

export interface RowStore {
  readonly capabilities: StoreCapabilities;
  /** A short name for messages and reports, e.g. "memory", "postgres". */
  readonly name: string;

  read(table: string, key: string): Promise<StoredRow | null>;
  checkAndSet(request: CasRequest): Promise<CasResult>;

  /** capability `batchRead`; results in request order. */
  readMany?(rows: readonly RowRef[]): Promise<(StoredRow | null)[]>;
  /** capability `batchCheckAndSet`; results in request order; each applies or not on its own. */
  checkAndSetMany?(requests: readonly CasRequest[]): Promise<CasResult[]>;
  /** capability `orderedScan`: existing rows with start <= key < end (and key > after), in key order. */
  scan?(table: string, options: ScanOptions): Promise<ScannedStoredRow[]>;
  /** capability `atomicCounter`: adds `delta` (>= 1) and returns the new value. Starts at 0. */
  incrementCounter?(name: string, delta: number): Promise<number>;
  /**
   * capability `notificationIndex`: keys of rows in `table` whose last CAS set `notified`,
   * in key order. May return keys whose flag has since been cleared, or whose row is gone
   * (the core re-reads every row); must never omit a row whose flag is set once the CAS
   * that set it has returned.
   */
  scanNotified?(table: string, options: NotificationScanOptions): Promise<string[]>;
  /**
   * capability `stampedCheckAndSet`. In one atomic step: add 1 to counter `counter` (the
   * counter `incrementCounter` serves), write the new value into `request.state` at
   * `STAMP_OFFSET` as an unsigned 64-bit big-endian integer (overwriting the 8 placeholder
   * bytes there), and apply the CAS with that state. Resolves to the CAS result and, when
   * applied, `timestamp` (the value drawn). Atomic means: whoever draws a later value from
   * the counter (by `incrementCounter` or another stamped CAS) and then reads the row sees
   * this write. The counter may also be advanced when the CAS does not apply. `state` is
   * never null. Lost replies follow the usual rules (StoreError 'unknown').
   */
  checkAndSetStamped?(
    request: CasRequest & { readonly state: Uint8Array },
    counter: string,
  ): Promise<CasResult & { timestamp?: number }>;

  /**
   * capability `stampedCheckAndSetMany`. `checkAndSetStamped` for several rows as ONE atomic
   * step, all or nothing: add 1 to counter `counter`, write the new value into every
   * request's state at `STAMP_OFFSET`, and apply every CAS, but only if every request's
   * `expected` matches its row (a version, or absent for `null`). If any does not match,
   * nothing is written (the counter may still advance) and the reply is `ok: false`, with
   * each row as it is now where the store returns that cheaply (`undefined` = not known;
   * answer every row where you can: the core's shared steps tell by them which transaction
   * of a step lost the race, and resend the others alone where a row is not known).
   * Atomic means: whoever draws a later value from the counter and then reads any of these
   * rows sees every one of these writes. The requests name distinct rows (the core sends at
   * most 64, or one transaction's step where that is more); every `state` is non-null.
   * Versions come back in request order. Lost replies follow the usual rules (StoreError
   * 'unknown'): the core re-reads and finds out.
   */
  checkAndSetStampedMany?(
    requests: readonly (CasRequest & { readonly state: Uint8Array })[],
    counter: string,
  ): Promise<StampedManyResult>;

  /**
   * capability `stampedRead`. In one round trip: add 1 to counter `counter` (the counter
   * `incrementCounter` serves), then read `rows`, strictly after the increment: every write
   * that a stamped CAS or any other writer made visible before the counter reached the
   * returned value is seen (a later counter value, then a read). In SQL that means the
   * reads take their snapshot after the increment has waited out any lock on the counter
   * row; a single statement whose snapshot predates the wait is NOT enough. Results in
   * request order.
   */
  readStamped?(
    rows: readonly RowRef[],
    counter: string,
  ): Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }>;

  /**
   * capability `peekedRead`. In one round trip, changing nothing: the current value of
   * counter `counter` (0 if it was never drawn from) and `rows`, as one snapshot, or with
   * the rows read after the value (a row may then show later writes too, as any later read
   * of a transaction does; never fewer). The rule:
   * if the value returned is V, the rows show every write that a stamped CAS stamped with a
   * value <= V, and every write acknowledged before a draw from the counter (by
   * `incrementCounter`, a stamped CAS or `readStamped`) that returned a value <= V. A
   * draw in flight (not yet durable) is neither waited for nor counted. In SQL, one
   * statement whose snapshot reads both the counter and the rows is enough (a draw commits
   * after the writes before it, and releases the counter row only after it commits).
   * Results in request order.
   */
  readPeeked?(
    rows: readonly RowRef[],
    counter: string,
  ): Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }>;

  close(): Promise<void>;
}

/**
 * The members of the RowStore contract (methods, the name and capabilities, and
 * `constructor`): what a store wrapper checks or counts itself and passes nothing else
 * through as. Any other member of a store (an adapter's `namespace`, `dropNamespace`) is
 * the adapter's own.
 */
export const ROW_STORE_MEMBERS: ReadonlySet<string> = new Set([
  'constructor',
  'name',
  'capabilities',
  'read',
  'checkAndSet',
  'readMany',
  'checkAndSetMany',
  'scan',
  'incrementCounter',
  'scanNotified',
  'checkAndSetStamped',
  'checkAndSetStampedMany',
  'readStamped',
  'readPeeked',
  'close',
]);

/**
 * Where a stamped state holds its timestamp: bytes [STAMP_OFFSET, STAMP_OFFSET + 8), big
 * endian. The core's head-row format keeps that slot right after its format byte.
 */
export const STAMP_OFFSET = 1;

/** Writes `timestamp` into a stamped state's slot (what a store does inside its atomic step). */
export function writeStamp(state: Uint8Array, timestamp: number): Uint8Array {
  return writeStampInPlace(state.slice(), timestamp);
}

/** `writeStamp` into `state` itself, for a store writing its own copy of a state. */
export function writeStampInPlace(state: Uint8Array, timestamp: number): Uint8Array {
  if (state.length < STAMP_OFFSET + 8) throw new RangeError('a stamped state has no stamp slot');
  putUint64BE(state, STAMP_OFFSET, timestamp);
  return state;
}

/** The counter name the default oracle draws timestamps from. */
export const ORACLE_COUNTER = 'percolator.oracle';

/** Whether `value` has the shape of a RowStore (its required methods and capabilities). */
export function isRowStore(value: unknown): value is RowStore {
  if (typeof value !== 'object' || value === null) return false;
  const s = value as Partial<RowStore>;
  return (
    typeof s.read === 'function' &&
    typeof s.checkAndSet === 'function' &&
    typeof s.close === 'function' &&
    typeof s.capabilities === 'object' &&
    s.capabilities !== null
  );
}
