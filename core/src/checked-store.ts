import { InvalidArgumentError, RowTooLargeError, StoreError } from './errors.js';
import {
  compareKeys,
  describe,
  MAX_KEY_BYTES,
  shownName,
  utf8Length,
  validateRowKey,
  validateTable,
} from './names.js';
// The RowStore contract's own types: every store (and the contract check) names the same
// list, by necessity; `duplicates` pairs these import lists.
import {
  type CasRequest,
  type CasResult,
  type NotificationScanOptions,
  ROW_STORE_MEMBERS,
  type RowRef,
  type RowStore,
  type ScannedStoredRow,
  type ScanOptions,
  STAMP_OFFSET,
  type StampedManyResult,
  type StoreCapabilities,
  type StoredRow,
} from './store.js';

/**
 * The store contract, checked once for every store (in the spirit of kysely's
 * RuntimeDriver): `checkedStore(store)` gives a RowStore that validates every call's
 * arguments before the store sees them, and every reply before the core sees it.
 * docs/writing-an-adapter.md lists the rules; an adapter checks none of them itself.
 *
 * Arguments. Bad input is `InvalidArgumentError` (a state past `maxStateBytes`:
 * `RowTooLargeError`), thrown before anything reaches the store, so nothing changes; a
 * batch with one bad item sends nothing at all. A scan or notification scan with
 * `limit: 0` resolves to `[]` without asking the store.
 *
 * Replies. A reply that breaks the contract (a version that is not a non-empty string, a
 * state that is not bytes, a batch answer of the wrong length, scan keys out of order or
 * out of range) is `StoreError`: 'no' for reads, 'unknown' for writes (the write may have
 * landed; the core re-reads), never retryable. It is a bug in the adapter, so it is
 * reported, never repaired.
 *
 * Cost: the checks are type tests and one pass over each key; a reply costs one `.then`.
 * The core applies it wherever a store enters (the Percolator constructor, each store of
 * a CompositeStore, the conformance suite's factory); applying it twice is a no-op.
 */
export function checkedStore<S extends RowStore>(store: S): S {
  if (store instanceof CheckedStore) return store;
  return new CheckedStore(store) as unknown as S;
}

/** The store under a checked one (itself if it is not checked). */
export function uncheckedStore<S extends RowStore>(store: S): S {
  return store instanceof CheckedStore ? (store.inner as S) : store;
}

type StampedRequest = CasRequest & { readonly state: Uint8Array };
type StampedCasResult = CasResult & { timestamp?: number };
type StampedReadResult = { readonly timestamp: number; readonly rows: (StoredRow | null)[] };

class CheckedStore implements RowStore {
  declare readonly readMany?: (rows: readonly RowRef[]) => Promise<(StoredRow | null)[]>;
  declare readonly checkAndSetMany?: (requests: readonly CasRequest[]) => Promise<CasResult[]>;
  declare readonly scan?: (table: string, options: ScanOptions) => Promise<ScannedStoredRow[]>;
  declare readonly incrementCounter?: (name: string, delta: number) => Promise<number>;
  declare readonly scanNotified?: (table: string, options: NotificationScanOptions) => Promise<string[]>;
  declare readonly checkAndSetStamped?: (
    request: StampedRequest,
    counter: string,
  ) => Promise<StampedCasResult>;
  declare readonly checkAndSetStampedMany?: (
    requests: readonly StampedRequest[],
    counter: string,
  ) => Promise<StampedManyResult>;
  declare readonly readStamped?: (rows: readonly RowRef[], counter: string) => Promise<StampedReadResult>;
  declare readonly readPeeked?: (rows: readonly RowRef[], counter: string) => Promise<StampedReadResult>;

  /*
   * Every call answers with a promise: a store method that throws instead of rejecting (or
   * returns something that is not a promise) gives the caller the same failure as a
   * rejection, never an exception out of whoever called it (a timer, a batch's flush, a
   * microtask that sends a transaction's first reads), which would leave its waiters
   * pending for ever. So each call to the store is inside its method's try.
   */

  /** Reply checks of the hot calls, bound once: a call allocates no closure of its own. */
  private readonly onRead: (row: StoredRow | null) => StoredRow | null;
  private readonly onCas: (result: CasResult) => CasResult;

  constructor(readonly inner: RowStore) {
    this.onRead = (row) => replyRow(inner, 'read', row, 'no');
    this.onCas = (result) => replyCas(inner, 'checkAndSet', result);
    // Only the methods the store has: the core looks at capabilities, but a caller that
    // tests for a method must see the same shape as the store's own.
    const self = this as {
      -readonly [K in keyof CheckedStore]: CheckedStore[K];
    };
    if (inner.readMany) self.readMany = (rows) => this.checkedReadMany(rows);
    if (inner.checkAndSetMany) self.checkAndSetMany = (requests) => this.checkedCasMany(requests);
    if (inner.scan) self.scan = (table, options) => this.checkedScan(table, options);
    if (inner.incrementCounter) self.incrementCounter = (name, delta) => this.checkedIncrement(name, delta);
    if (inner.scanNotified) self.scanNotified = (table, options) => this.checkedScanNotified(table, options);
    if (inner.checkAndSetStamped)
      self.checkAndSetStamped = (request, counter) => this.checkedStampedCas(request, counter);
    if (inner.checkAndSetStampedMany)
      self.checkAndSetStampedMany = (requests, counter) => this.checkedStampedCasMany(requests, counter);
    if (inner.readStamped) self.readStamped = (rows, counter) => this.checkedReadStamped(rows, counter);
    if (inner.readPeeked) self.readPeeked = (rows, counter) => this.checkedReadPeeked(rows, counter);
    passThrough(this, inner);
  }

  get name(): string {
    return this.inner.name;
  }

  /** Read on every call: an adapter may settle its capabilities while it starts. */
  get capabilities(): StoreCapabilities {
    return this.inner.capabilities;
  }

  read(table: string, key: string): Promise<StoredRow | null> {
    try {
      checkRef(table, key);
      return this.inner.read(table, key).then(this.onRead);
    } catch (error) {
      return Promise.reject(error);
    }
  }

  checkAndSet(request: CasRequest): Promise<CasResult> {
    try {
      checkCasRequest(request, this.inner.capabilities.maxStateBytes);
      return this.inner.checkAndSet(request).then(this.onCas);
    } catch (error) {
      return Promise.reject(error);
    }
  }

  close(): Promise<void> {
    try {
      return this.inner.close();
    } catch (error) {
      return Promise.reject(error);
    }
  }

  private checkedReadMany(rows: readonly RowRef[]): Promise<(StoredRow | null)[]> {
    try {
      checkRefs('readMany', rows);
      return this.inner.readMany!(rows).then((found) =>
        replyRows(this.inner, 'readMany', found, rows.length),
      );
    } catch (error) {
      return Promise.reject(error);
    }
  }

  private checkedCasMany(requests: readonly CasRequest[]): Promise<CasResult[]> {
    try {
      if (!Array.isArray(requests)) throw new InvalidArgumentError('checkAndSetMany expects an array');
      const max = this.inner.capabilities.maxStateBytes;
      for (const request of requests) checkCasRequest(request, max);
      return this.inner.checkAndSetMany!(requests).then((results) => {
        if (!Array.isArray(results) || results.length !== requests.length) {
          throw malformed(this.inner, 'checkAndSetMany', `${requests.length} results`, results, 'unknown');
        }
        for (const result of results) replyCas(this.inner, 'checkAndSetMany', result);
        return results;
      });
    } catch (error) {
      return Promise.reject(error);
    }
  }

  private checkedStampedCas(request: StampedRequest, counter: string): Promise<StampedCasResult> {
    try {
      checkStampedRequest(request, this.inner.capabilities.maxStateBytes);
      checkCounterName(counter);
      return this.inner.checkAndSetStamped!(request, counter).then((result) => {
        replyCas(this.inner, 'checkAndSetStamped', result);
        if (result.ok && !isTimestamp(result.timestamp)) {
          throw malformed(this.inner, 'checkAndSetStamped', 'a timestamp', result.timestamp, 'unknown');
        }
        return result;
      });
    } catch (error) {
      return Promise.reject(error);
    }
  }

  private checkedStampedCasMany(
    requests: readonly StampedRequest[],
    counter: string,
  ): Promise<StampedManyResult> {
    try {
      checkStampedManyRequests(requests, this.inner.capabilities.maxStateBytes);
      checkCounterName(counter);
      const what = 'checkAndSetStampedMany';
      return this.inner.checkAndSetStampedMany!(requests, counter).then((result) => {
        if (typeof result !== 'object' || result === null) {
          throw malformed(this.inner, what, 'a result { ok, ... }', result, 'unknown');
        }
        if (result.ok === true) {
          const { versions } = result;
          if (!Array.isArray(versions) || versions.length !== requests.length) {
            throw malformed(this.inner, what, `${requests.length} versions`, versions, 'unknown');
          }
          for (const version of versions) {
            if (typeof version !== 'string' || version.length === 0) {
              throw malformed(this.inner, what, 'a non-empty version', version, 'unknown');
            }
          }
          if (!isTimestamp(result.timestamp)) {
            throw malformed(this.inner, what, 'a timestamp', result.timestamp, 'unknown');
          }
        } else if (result.ok === false) {
          const { current } = result;
          if (current !== undefined) {
            if (!Array.isArray(current) || current.length !== requests.length) {
              throw malformed(this.inner, what, `${requests.length} current rows`, current, 'unknown');
            }
            for (const row of current) if (row !== undefined) replyRow(this.inner, what, row, 'unknown');
          }
        } else {
          throw malformed(this.inner, what, 'ok: true or false', (result as { ok: unknown }).ok, 'unknown');
        }
        return result;
      });
    } catch (error) {
      return Promise.reject(error);
    }
  }

  private checkedReadStamped(rows: readonly RowRef[], counter: string): Promise<StampedReadResult> {
    try {
      checkRefs('readStamped', rows);
      checkCounterName(counter);
      return this.inner.readStamped!(rows, counter).then((reply) => {
        if (typeof reply !== 'object' || reply === null || !isTimestamp(reply.timestamp)) {
          throw malformed(this.inner, 'readStamped', 'a timestamp', reply?.timestamp, 'no');
        }
        replyRows(this.inner, 'readStamped', reply.rows, rows.length);
        return reply;
      });
    } catch (error) {
      return Promise.reject(error);
    }
  }

  private checkedReadPeeked(rows: readonly RowRef[], counter: string): Promise<StampedReadResult> {
    try {
      checkRefs('readPeeked', rows);
      checkCounterName(counter);
      return this.inner.readPeeked!(rows, counter).then((reply) => {
        // 0 is a value here: the counter was never drawn from.
        if (
          typeof reply !== 'object' ||
          reply === null ||
          !(reply.timestamp === 0 || isTimestamp(reply.timestamp))
        ) {
          throw malformed(this.inner, 'readPeeked', 'a counter value', reply?.timestamp, 'no');
        }
        replyRows(this.inner, 'readPeeked', reply.rows, rows.length);
        return reply;
      });
    } catch (error) {
      return Promise.reject(error);
    }
  }

  private checkedScan(table: string, options: ScanOptions): Promise<ScannedStoredRow[]> {
    try {
      checkTable(table);
      checkScanOptions(options);
      checkBound('start', options.start);
      checkBound('end', options.end);
      if (options.limit === 0) return Promise.resolve([]);
      return this.inner.scan!(table, options).then((rows) => {
        if (!Array.isArray(rows) || rows.length > options.limit) {
          throw malformed(this.inner, 'scan', `at most ${options.limit} rows`, rows, 'no');
        }
        let previous: string | undefined;
        for (const entry of rows) {
          const key = entry?.key;
          if (!inScanRange(key, previous, options)) {
            throw malformed(this.inner, 'scan', 'keys in range and in key order', key, 'no');
          }
          replyRow(this.inner, 'scan', entry.row, 'no', false);
          previous = key;
        }
        return rows;
      });
    } catch (error) {
      return Promise.reject(error);
    }
  }

  private checkedScanNotified(table: string, options: NotificationScanOptions): Promise<string[]> {
    try {
      checkTable(table);
      checkScanOptions(options);
      if (options.limit === 0) return Promise.resolve([]);
      return this.inner.scanNotified!(table, options).then((keys) => {
        if (!Array.isArray(keys) || keys.length > options.limit) {
          throw malformed(this.inner, 'scanNotified', `at most ${options.limit} keys`, keys, 'no');
        }
        let previous: string | undefined;
        for (const key of keys) {
          if (!inScanRange(key, previous, options)) {
            throw malformed(this.inner, 'scanNotified', 'keys after `after`, in key order', key, 'no');
          }
          previous = key;
        }
        return keys;
      });
    } catch (error) {
      return Promise.reject(error);
    }
  }

  private checkedIncrement(name: string, delta: number): Promise<number> {
    try {
      checkCounterName(name);
      if (typeof delta !== 'number' || !Number.isSafeInteger(delta) || delta < 1) {
        throw new InvalidArgumentError(`counter delta must be an integer >= 1, got ${describe(delta)}`);
      }
      return this.inner.incrementCounter!(name, delta).then((value) => {
        if (!Number.isSafeInteger(value) || value < delta) {
          throw malformed(this.inner, 'incrementCounter', `a safe integer >= ${delta}`, value, 'unknown');
        }
        return value;
      });
    } catch (error) {
      return Promise.reject(error);
    }
  }
}

/**
 * An adapter's own members (a namespace, `dropNamespace`, a client) stay reachable on the
 * checked store, so its factory can hand out the checked store with its full type: methods
 * are called on the store itself, fields are read from it on each access.
 */
function passThrough(outer: object, inner: RowStore): void {
  const target = inner as unknown as Record<string, unknown>;
  for (let o: object | null = inner; o !== null && o !== Object.prototype; o = Object.getPrototypeOf(o)) {
    for (const name of Object.getOwnPropertyNames(o)) {
      if (ROW_STORE_MEMBERS.has(name) || name in outer) continue;
      const value = target[name];
      Object.defineProperty(
        outer,
        name,
        typeof value === 'function'
          ? {
              value: (...args: unknown[]) =>
                Reflect.apply(target[name] as (...a: unknown[]) => unknown, inner, args),
            }
          : { get: () => target[name] },
      );
    }
  }
}

/**
 * Table names already found valid. A deployment has few tables and the hot path names the
 * same ones again and again, so a set lookup replaces the pattern test; bounded, so a
 * caller inventing names cannot grow it without end.
 */
const validTables = new Set<string>();

function checkTable(table: unknown): void {
  if (typeof table === 'string' && validTables.has(table)) return;
  validateTable(table);
  if (validTables.size < 4096) validTables.add(table);
}

function checkRef(table: unknown, key: unknown): void {
  checkTable(table);
  validateRowKey(key);
}

function checkRefs(what: string, rows: readonly RowRef[]): void {
  if (!Array.isArray(rows)) throw new InvalidArgumentError(`${what} expects an array of { table, key }`);
  for (const ref of rows) {
    if (typeof ref !== 'object' || ref === null) {
      throw new InvalidArgumentError(`${what} expects an array of { table, key }, got ${describe(ref)}`);
    }
    checkRef(ref.table, ref.key);
  }
}

function checkCasRequest(request: CasRequest, maxStateBytes: number): void {
  if (typeof request !== 'object' || request === null) {
    throw new InvalidArgumentError(`a check-and-set request must be an object, got ${describe(request)}`);
  }
  const { table, key, expected, state, notified } = request;
  checkRef(table, key);
  // No store issues an empty version (the contract), so '' is a caller's bug, not a stale version.
  if (expected !== null && (typeof expected !== 'string' || expected.length === 0)) {
    throw new InvalidArgumentError(
      `expected must be null or a non-empty version string, got ${describe(expected)}`,
    );
  }
  if (state !== null && !(state instanceof Uint8Array)) {
    throw new InvalidArgumentError(`state must be a Uint8Array or null, got ${describe(state)}`);
  }
  if (notified !== undefined && typeof notified !== 'boolean') {
    throw new InvalidArgumentError(`notified must be a boolean when given, got ${describe(notified)}`);
  }
  if (state !== null && state.byteLength > maxStateBytes) {
    throw new RowTooLargeError(
      `state of ${table}/${shownName(key).slice(0, 80)} is ${state.byteLength} bytes; ` +
        `this store accepts at most ${maxStateBytes} (capabilities.maxStateBytes)`,
    );
  }
}

/**
 * The requests of one `checkAndSetStampedMany`: a non-empty array of stamped requests
 * (each a valid CAS with a state that has room for the stamp, within `maxStateBytes`),
 * naming distinct rows. InvalidArgumentError or RowTooLargeError otherwise. Adapters whose
 * one step relies on that shape check it too (a bare store may be called unchecked).
 */
export function checkStampedManyRequests(requests: readonly StampedRequest[], maxStateBytes: number): void {
  if (!Array.isArray(requests) || requests.length === 0) {
    throw new InvalidArgumentError('checkAndSetStampedMany expects a non-empty array of requests');
  }
  const seen = new Set<string>();
  for (const request of requests) {
    checkStampedRequest(request, maxStateBytes);
    const id = `${request.table}\u0000${request.key}`;
    if (seen.has(id)) {
      throw new InvalidArgumentError(
        `checkAndSetStampedMany names row ${request.table}/${shownName(request.key).slice(0, 80)} twice`,
      );
    }
    seen.add(id);
  }
}

/** A stamped CAS request: a state with room for the stamp, never a delete. */
function checkStampedRequest(request: StampedRequest, maxStateBytes: number): void {
  checkCasRequest(request, maxStateBytes);
  if (request.state === null) {
    throw new InvalidArgumentError('a stamped check-and-set needs a state (a Uint8Array), never null');
  }
  if (request.state.byteLength < STAMP_OFFSET + 8) {
    throw new InvalidArgumentError(
      `a stamped state needs at least ${STAMP_OFFSET + 8} bytes (the stamp slot), got ${request.state.byteLength}`,
    );
  }
}

function checkScanOptions(options: NotificationScanOptions): void {
  if (typeof options !== 'object' || options === null) {
    throw new InvalidArgumentError(`scan options must be an object, got ${describe(options)}`);
  }
  const { limit } = options;
  if (typeof limit !== 'number' || !Number.isSafeInteger(limit) || limit < 0) {
    throw new InvalidArgumentError(`limit must be a non-negative integer, got ${describe(limit)}`);
  }
  checkBound('after', options.after);
}

/** Scan bounds are any well-formed strings up to a key's length; they need not be keys (may be empty). */
function checkBound(name: string, value: unknown): void {
  if (value === undefined) return;
  if (typeof value !== 'string' || !value.isWellFormed()) {
    throw new InvalidArgumentError(
      `scan option ${name} must be a well-formed string, got ${describe(value)}`,
    );
  }
  if (utf8Length(value) > MAX_KEY_BYTES) {
    throw new InvalidArgumentError(`scan option ${name} is longer than ${MAX_KEY_BYTES} UTF-8 bytes`);
  }
}

/** Counter names: non-empty, well-formed, up to a key's length. */
export function checkCounterName(name: unknown): void {
  if (typeof name !== 'string' || name.length === 0 || !name.isWellFormed()) {
    throw new InvalidArgumentError(
      `counter name must be a non-empty, well-formed string, got ${describe(name)}`,
    );
  }
  if (utf8Length(name) > MAX_KEY_BYTES) {
    throw new InvalidArgumentError(`counter name is longer than ${MAX_KEY_BYTES} UTF-8 bytes`);
  }
}

function isTimestamp(value: unknown): boolean {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 1;
}

function inScanRange(
  key: unknown,
  previous: string | undefined,
  options: ScanOptions | NotificationScanOptions,
) {
  if (typeof key !== 'string') return false;
  if (previous !== undefined && compareKeys(previous, key) >= 0) return false;
  if (options.after !== undefined && compareKeys(key, options.after) <= 0) return false;
  const { start, end } = options as ScanOptions;
  if (start !== undefined && compareKeys(key, start) < 0) return false;
  return end === undefined || compareKeys(key, end) < 0;
}

function replyRow(
  store: RowStore,
  what: string,
  row: StoredRow | null,
  applied: 'no' | 'unknown',
  nullable = true,
): StoredRow | null {
  if (row === null && nullable) return row;
  if (
    typeof row !== 'object' ||
    row === null ||
    typeof row.version !== 'string' ||
    row.version.length === 0 ||
    !(row.state instanceof Uint8Array)
  ) {
    throw malformed(store, what, 'a row { version, state } or null', row, applied);
  }
  return row;
}

function replyRows(
  store: RowStore,
  what: string,
  rows: (StoredRow | null)[],
  expected: number,
): (StoredRow | null)[] {
  if (!Array.isArray(rows) || rows.length !== expected) {
    throw malformed(store, what, `${expected} rows`, rows, 'no');
  }
  for (const row of rows) replyRow(store, what, row, 'no');
  return rows;
}

function replyCas<T extends CasResult>(store: RowStore, what: string, result: T): T {
  if (typeof result !== 'object' || result === null) {
    throw malformed(store, what, 'a result { ok, ... }', result, 'unknown');
  }
  if (result.ok === true) {
    if (typeof result.version !== 'string' || result.version.length === 0) {
      throw malformed(store, what, 'a non-empty version', result.version, 'unknown');
    }
  } else if (result.ok === false) {
    if (result.current !== undefined) replyRow(store, what, result.current, 'unknown');
  } else {
    throw malformed(store, what, 'ok: true or false', (result as { ok: unknown }).ok, 'unknown');
  }
  return result;
}

function malformed(
  store: RowStore,
  what: string,
  wanted: string,
  got: unknown,
  applied: 'no' | 'unknown',
): StoreError {
  const shown = Array.isArray(got) ? `an array of ${got.length}` : describe(got);
  return new StoreError(
    `${store.name}: ${what} broke the store contract: expected ${wanted}, got ${shown}`,
    applied,
    { retryable: false },
  );
}
