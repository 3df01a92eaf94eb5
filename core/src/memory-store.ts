import { nextTurn } from './backoff.js';
import { RowTooLargeError } from './errors.js';
import { fullCapabilities } from './kit/store-shape.js';
import { compareKeys } from './names.js';
import { checkInteger, checkOptionKeys } from './options.js';
import { MAX_SHARED_CALLS_IN_FLIGHT } from './sharing.js';
import type {
  CasRequest,
  CasResult,
  NotificationScanOptions,
  RowRef,
  RowStore,
  ScannedStoredRow,
  ScanOptions,
  StoreCapabilities,
  StoredRow,
} from './store.js';
import { type StampedManyResult, writeStampInPlace } from './store.js';

interface MemoryRow {
  version: string;
  state: Uint8Array;
  notified: boolean;
}

class MemoryTable {
  readonly rows = new Map<string, MemoryRow>();
  /**
   * The scan index, kept lazily: a write costs a push or a set insert, never a splice in
   * a long array (the tidy step creates and deletes version rows all the time, and the
   * transactions themselves never scan). `keys()` brings it up to date for a scan.
   */
  private sortedKeys: string[] = [];
  /** Keys of rows created since the index was last brought up to date (unsorted). */
  private pending: string[] = [];
  /** Keys in `sortedKeys` or `pending` whose row is gone. */
  private readonly stale = new Set<string>();
  /** Keys of rows with a pending notification, in compareKeys order: a page costs a search, not a sort. */
  readonly notified: string[] = [];

  /** A row was created. */
  added(key: string): void {
    // Deleted and created again before the index caught up: its key is still listed.
    if (this.stale.delete(key)) return;
    this.pending.push(key);
  }

  /** A row was deleted. */
  removed(key: string): void {
    this.stale.add(key);
    if (this.stale.size * 2 > this.sortedKeys.length + this.pending.length) this.catchUp();
  }

  /** Row keys in compareKeys order, for a scan. */
  keys(): readonly string[] {
    if (this.pending.length > 0 || this.stale.size > 0) this.catchUp();
    return this.sortedKeys;
  }

  private catchUp(): void {
    const live = (key: string) => !this.stale.has(key);
    const added = this.pending.filter(live).sort(compareKeys);
    this.sortedKeys = mergeSorted(
      this.stale.size > 0 ? this.sortedKeys.filter(live) : this.sortedKeys,
      added,
    );
    this.pending = [];
    this.stale.clear();
  }
}

/** Two arrays in compareKeys order, merged. */
function mergeSorted(a: readonly string[], b: readonly string[]): string[] {
  if (b.length === 0) return a as string[];
  const out: string[] = new Array(a.length + b.length);
  let i = 0;
  let j = 0;
  let k = 0;
  while (i < a.length && j < b.length) out[k++] = compareKeys(a[i]!, b[j]!) <= 0 ? a[i++]! : b[j++]!;
  while (i < a.length) out[k++] = a[i++]!;
  while (j < b.length) out[k++] = b[j++]!;
  return out;
}

function insertSorted(keys: string[], key: string): void {
  const i = lowerBound(keys, key);
  if (keys[i] !== key) keys.splice(i, 0, key);
}

function removeSorted(keys: string[], key: string): void {
  const i = lowerBound(keys, key);
  if (keys[i] === key) keys.splice(i, 1);
}

/** Index of the first key strictly greater than `after` (0 when undefined). */
function firstAfter(keys: readonly string[], after: string | undefined): number {
  if (after === undefined) return 0;
  const i = lowerBound(keys, after);
  return keys[i] === after ? i + 1 : i;
}

function lowerBound(keys: readonly string[], key: string): number {
  let lo = 0;
  let hi = keys.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (compareKeys(keys[mid]!, key) < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/**
 * Every MemoryStore call resolves on a later macrotask, as a networked store's would. A
 * store that answered on the microtask queue would let a `transact` loop run forever
 * without yielding: timers (backoff, lock TTLs, heartbeats, a caller's timeouts) would
 * never fire and concurrent clients would run one at a time. Calls are applied at once, in
 * call order, so the semantics are those of an instant store; only the replies wait, and
 * all replies pending in one turn share a single setImmediate.
 */
let pendingReplies: (() => void)[] = [];

function flushReplies(): void {
  const replies = pendingReplies;
  pendingReplies = [];
  for (const reply of replies) reply();
}

/** Runs `apply` now and settles the returned promise with its outcome on a later macrotask. */
function later<T>(apply: () => T): Promise<T> {
  let settle: () => void;
  const promise = new Promise<T>((resolve, reject) => {
    try {
      const value = apply();
      settle = () => resolve(value);
    } catch (error) {
      settle = () => reject(error);
    }
  });
  if (pendingReplies.length === 0) nextTurn(flushReplies);
  pendingReplies.push(settle!);
  return promise;
}

export interface MemoryStoreOptions {
  /** Largest state per row; default 16 MiB. */
  maxStateBytes?: number;
  /**
   * The cost hint `sharedCallsInFlight` to declare (StoreCapabilities; default: none, so
   * 1): lets tests run a client that splits its shared calls, as on Redis, on this store.
   */
  sharedCallsInFlight?: number;
}

/**
 * The reference store: every capability, in one process. Many Percolator clients may
 * share one MemoryStore (and so one oracle counter). States are copied in and out, so a
 * caller can never change stored bytes behind the store's back.
 */
export class MemoryStore implements RowStore {
  readonly name = 'memory';
  readonly capabilities: StoreCapabilities;
  private readonly tables = new Map<string, MemoryTable>();
  private readonly counters = new Map<string, number>();
  /** Versions come from one counter for the whole store, so they never repeat. */
  private lastVersion = 0;

  constructor(options: MemoryStoreOptions = {}) {
    checkOptionKeys<MemoryStoreOptions>('MemoryStore', options, {
      maxStateBytes: true,
      sharedCallsInFlight: true,
    });
    if (options.maxStateBytes !== undefined)
      checkInteger('MemoryStore maxStateBytes', options.maxStateBytes, 1);
    if (options.sharedCallsInFlight !== undefined)
      checkInteger(
        'MemoryStore sharedCallsInFlight',
        options.sharedCallsInFlight,
        1,
        MAX_SHARED_CALLS_IN_FLIGHT,
      );
    // A step of several rows is one synchronous step here too: as cheap as one row's.
    this.capabilities = fullCapabilities(options.maxStateBytes ?? 16 * 1024 * 1024, {
      stampedManyForOneRow: true,
      ...(options.sharedCallsInFlight !== undefined
        ? { sharedCallsInFlight: options.sharedCallsInFlight }
        : {}),
    });
  }

  private table(name: string): MemoryTable {
    let t = this.tables.get(name);
    if (!t) {
      t = new MemoryTable();
      this.tables.set(name, t);
    }
    return t;
  }

  private readNow(table: string, key: string): StoredRow | null {
    const row = this.tables.get(table)?.rows.get(key);
    // A copy, so a caller can never change stored bytes behind the store's back.
    return row ? { version: row.version, state: row.state.slice() } : null;
  }

  read(table: string, key: string): Promise<StoredRow | null> {
    return later(() => this.readNow(table, key));
  }

  readMany(refs: readonly RowRef[]): Promise<(StoredRow | null)[]> {
    return later(() => refs.map((r) => this.readNow(r.table, r.key)));
  }

  checkAndSet(request: CasRequest): Promise<CasResult> {
    return later(() => this.casNow(request));
  }

  checkAndSetMany(requests: readonly CasRequest[]): Promise<CasResult[]> {
    return later(() => requests.map((r) => this.casNow(r)));
  }

  readStamped(
    refs: readonly RowRef[],
    counter: string,
  ): Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }> {
    return later(() => {
      const timestamp = this.incrementNow(counter, 1);
      return { timestamp, rows: refs.map((r) => this.readNow(r.table, r.key)) };
    });
  }

  readPeeked(
    refs: readonly RowRef[],
    counter: string,
  ): Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }> {
    // One synchronous step: the counter's value and the rows are one snapshot.
    return later(() => ({
      timestamp: this.counters.get(counter) ?? 0,
      rows: refs.map((r) => this.readNow(r.table, r.key)),
    }));
  }

  checkAndSetStamped(
    request: CasRequest & { readonly state: Uint8Array },
    counter: string,
  ): Promise<CasResult & { timestamp?: number }> {
    return later(() => this.casStampedNow(request, counter));
  }

  private casStampedNow(
    request: CasRequest & { readonly state: Uint8Array },
    counter: string,
  ): CasResult & { timestamp?: number } {
    const row = this.tables.get(request.table)?.rows.get(request.key);
    if ((row?.version ?? null) !== request.expected)
      return { ok: false, current: row ? { version: row.version, state: row.state.slice() } : null };
    if (request.state.length > this.capabilities.maxStateBytes) return this.casNow(request); // throws RowTooLargeError
    const timestamp = this.incrementNow(counter, 1);
    const result = this.casNow(request, timestamp);
    return result.ok ? { ...result, timestamp } : result;
  }

  checkAndSetStampedMany(
    requests: readonly (CasRequest & { readonly state: Uint8Array })[],
    counter: string,
  ): Promise<StampedManyResult> {
    return later(() => this.casStampedManyNow(requests, counter));
  }

  /** All or nothing, in one synchronous step: every check first, then every write. */
  private casStampedManyNow(
    requests: readonly (CasRequest & { readonly state: Uint8Array })[],
    counter: string,
  ): StampedManyResult {
    const matches = requests.every(
      (request) =>
        (this.tables.get(request.table)?.rows.get(request.key)?.version ?? null) === request.expected,
    );
    if (!matches) {
      // Every row as it is now, as the networked stores answer (a shared step tells by them
      // which of its transactions lost the race: shared-steps.ts).
      return { ok: false, current: requests.map((r) => this.readNow(r.table, r.key)) };
    }
    for (const request of requests) {
      if (request.state.length > this.capabilities.maxStateBytes) return this.casNow(request) as never; // throws RowTooLargeError
    }
    const timestamp = this.incrementNow(counter, 1);
    const versions = requests.map((request) => {
      const result = this.casNow(request, timestamp);
      if (!result.ok) throw new Error('memory store: a checked row changed within one step');
      return result.version;
    });
    return { ok: true, versions, timestamp };
  }

  /** One check-and-set; with `stamp`, the stored copy gets it in its stamp slot (checkAndSetStamped). */
  private casNow(request: CasRequest, stamp?: number): CasResult {
    const { table: tableName, key, expected, state } = request;
    if (state && state.length > this.capabilities.maxStateBytes) {
      throw new RowTooLargeError(
        `row state of ${state.length} bytes exceeds the memory store limit of ${this.capabilities.maxStateBytes}`,
      );
    }
    const table = this.table(tableName);
    const row = table.rows.get(key);
    if ((row?.version ?? null) !== expected) {
      return { ok: false, current: row ? { version: row.version, state: row.state.slice() } : null };
    }
    const version = (++this.lastVersion).toString(36);
    if (state === null) {
      if (row) {
        table.rows.delete(key);
        table.removed(key);
        if (row.notified) removeSorted(table.notified, key);
      }
      return { ok: true, version };
    }
    const notified = request.notified ?? false;
    if (!row) table.added(key);
    const copy = state.slice();
    table.rows.set(key, {
      version,
      state: stamp === undefined ? copy : writeStampInPlace(copy, stamp),
      notified,
    });
    if (notified && !row?.notified) insertSorted(table.notified, key);
    if (!notified && row?.notified) removeSorted(table.notified, key);
    return { ok: true, version };
  }

  scan(tableName: string, options: ScanOptions): Promise<ScannedStoredRow[]> {
    return later(() => this.scanNow(tableName, options));
  }

  private scanNow(tableName: string, options: ScanOptions): ScannedStoredRow[] {
    const table = this.tables.get(tableName);
    if (!table) return [];
    const keys = table.keys();
    let i = options.start === undefined ? 0 : lowerBound(keys, options.start);
    i = Math.max(i, firstAfter(keys, options.after));
    const out: ScannedStoredRow[] = [];
    for (; i < keys.length && out.length < options.limit; i++) {
      const key = keys[i]!;
      if (options.end !== undefined && compareKeys(key, options.end) >= 0) break;
      const row = table.rows.get(key);
      if (!row) continue; // deleted: a stale key of the index
      out.push({ key, row: { version: row.version, state: row.state.slice() } });
    }
    return out;
  }

  scanNotified(tableName: string, options: NotificationScanOptions): Promise<string[]> {
    return later(() => this.scanNotifiedNow(tableName, options));
  }

  private scanNotifiedNow(tableName: string, options: NotificationScanOptions): string[] {
    const table = this.tables.get(tableName);
    if (!table) return [];
    const start = firstAfter(table.notified, options.after);
    return table.notified.slice(start, start + options.limit);
  }

  incrementCounter(name: string, delta: number): Promise<number> {
    return later(() => this.incrementNow(name, delta));
  }

  private incrementNow(name: string, delta: number): number {
    const value = (this.counters.get(name) ?? 0) + delta;
    this.counters.set(name, value);
    return value;
  }

  close(): Promise<void> {
    return later(() => undefined);
  }
}
