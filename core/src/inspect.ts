import { decodeRow, decodeRowAt, decodeVersionRow } from './codec.js';
import { InvalidArgumentError, UnsupportedOperationError } from './errors.js';
import { primaryVerdict } from './lock-resolver.js';
import { compareKeys, validateColumn, validateUserTable } from './names.js';
import { isReservedColumn, parseAckColumn } from './observers/reserved.js';
import { checkedClock, checkFunction, checkInteger, checkOptionKeys } from './options.js';
import {
  type Cell,
  isAnchored,
  type Lock,
  type RecordKind,
  type RowKey,
  type ValuePlace,
  type WriteKind,
} from './row-state.js';
import type { RowRef, RowStore } from './store.js';
import { versionKey, versionTable } from './versions.js';

/**
 * A read-only, plain-data view of a stored head row (docs/protocol.md section 2), for
 * operators, tests and tools: what it holds, never a way to change it. Throws
 * CorruptRowError for a row in a format this version does not know.
 */
export interface HeadRowView {
  readonly cells: readonly CellView[];
}

export interface CellView {
  readonly column: string;
  readonly lock?: {
    readonly startTs: number;
    readonly primary: { readonly table: string; readonly row: string; readonly column: string };
    readonly kind: WriteKind;
    readonly ttlMs: number;
    readonly wallTimeMs: number;
    readonly secondaries?: readonly RowKey[];
  };
  /** Newest first. */
  readonly writes: readonly {
    readonly commitTs: number;
    readonly startTs: number;
    readonly kind: RecordKind;
    readonly wallTimeMs: number;
    /** Where a put's value lives. */
    readonly value: ValuePlace;
    /**
     * For a `moving` or `moved` put in a block of several values: the startTs naming the
     * version row that holds it (its group's anchor). Absent: its own startTs.
     */
    readonly block?: number;
    /** Bytes of the value when it is in the head row. */
    readonly inlineBytes?: number;
    readonly secondaries?: readonly RowKey[];
  }[];
  /** Bytes of every value kept in the head row (the lock's pending value included). */
  readonly inlineBytes: number;
  readonly prunedThrough: number;
  readonly notifyTs: number;
  readonly acks: Readonly<Record<string, number>>;
  /** startTs of version rows waiting to be deleted. */
  readonly garbage: readonly number[];
}

/** A head row, decoded for people. With `at`, a row that cannot be decoded is named in the error. */
export function inspectHeadRow(
  state: Uint8Array,
  at?: { readonly table: string; readonly key: string },
): HeadRowView {
  const row = at ? decodeRowAt(state, at.table, at.key) : decodeRow(state);
  const cells: CellView[] = [];
  for (const [column, cell] of row.cells) {
    let inlineBytes = 0;
    for (const value of cell.data.values()) inlineBytes += value.length;
    cells.push({
      column,
      ...(cell.lock ? { lock: { ...cell.lock, primary: { ...cell.lock.primary } } } : {}),
      writes: cell.writes.map((w) => ({
        commitTs: w.commitTs,
        startTs: w.startTs,
        kind: w.kind,
        wallTimeMs: w.wallTimeMs,
        value: w.value,
        ...(isAnchored(w) ? { block: w.block } : {}),
        ...(cell.data.has(w.startTs) ? { inlineBytes: cell.data.get(w.startTs)!.length } : {}),
        ...(w.secondaries ? { secondaries: w.secondaries } : {}),
      })),
      inlineBytes,
      prunedThrough: cell.prunedThrough,
      notifyTs: cell.notifyTs,
      acks: Object.fromEntries(cell.acks),
      garbage: [...cell.garbage],
    });
  }
  return { cells };
}

/**
 * Where the version row of (table, row, column) named by `startTs` lives: for a record,
 * pass its `block ?? startTs`.
 */
export function versionRowRef(table: string, row: string, column: string, startTs: number): RowRef {
  return { table: versionTable(table), key: versionKey(row, column, startTs) };
}

/**
 * Every version row a head row names (`moving`, `moved` and `garbage`): the only version
 * rows of that row that may exist. `moved` ones must exist.
 */
export function namedVersionRows(
  table: string,
  row: string,
  view: HeadRowView,
): { named: RowRef[]; mustExist: RowRef[] } {
  const named = new Map<string, RowRef>();
  const mustExist = new Map<string, RowRef>();
  for (const cell of view.cells) {
    for (const w of cell.writes) {
      if (w.value === 'inline') continue;
      const ref = versionRowRef(table, row, cell.column, w.block ?? w.startTs);
      named.set(ref.key, ref);
      if (w.value === 'moved') mustExist.set(ref.key, ref);
    }
    for (const ts of cell.garbage) {
      const ref = versionRowRef(table, row, cell.column, ts);
      named.set(ref.key, ref);
    }
  }
  return { named: [...named.values()], mustExist: [...mustExist.values()] };
}

/**
 * The value written at `startTs` that a version row holds (CorruptRowError for an unknown
 * format); `undefined` if the row is a block that does not hold it.
 */
export function versionRowValue(state: Uint8Array, startTs: number): Uint8Array | undefined {
  return decodeVersionRow(state, startTs);
}

// ---------------------------------------------------------------------------------------
// Operators' read-only questions (docs/operations.md). Each is plain store reads and the
// protocol's own rules; none writes anything or draws a timestamp.

/** What a lock's primary cell says about its transaction, as a reader would judge it now. */
export type PrimaryFate =
  | { readonly state: 'committed'; readonly commitTs: number }
  | { readonly state: 'rolled-back' }
  /**
   * Not decided yet. `expired`: the owner is presumed dead (its lock is past its TTL, or
   * its primary prewrite never landed), and the next reader to meet a lock of it rolls
   * the transaction back. Otherwise a reader waits for it.
   */
  | {
      readonly state: 'pending';
      readonly expired: boolean;
      /**
       * The primary's lock of the transaction, which decides `expired`: only it is refreshed
       * by its owner's heartbeat, so a secondary lock's own age says nothing about its owner.
       * `ageMs` is the time since its prewrite or last heartbeat. Absent while the primary
       * holds no lock of the transaction (its prewrite not landed): then the lock met decides.
       */
      readonly primaryLock?: { readonly wallTimeMs: number; readonly ttlMs: number; readonly ageMs: number };
    };

/**
 * The fate of the transaction that left `lock` (a lock found anywhere): one plain read of
 * its primary row, judged by the resolver's own rule (primaryVerdict). Changes nothing.
 */
export async function primaryFate(
  store: RowStore,
  lock: Pick<CellView['lock'] & {}, 'startTs' | 'primary' | 'ttlMs' | 'wallTimeMs' | 'kind'>,
  nowMs: number = Date.now(),
): Promise<PrimaryFate> {
  const { table, row, column } = lock.primary;
  const stored = await store.read(table, row);
  const cell = stored ? decodeRowAt(stored.state, table, row).cells.get(column) : undefined;
  const verdict = primaryVerdict(cell, lock as Lock, nowMs);
  if (verdict === 'alive' || verdict === 'abandoned') {
    const held = cell?.lock?.startTs === lock.startTs ? cell.lock : undefined;
    return {
      state: 'pending',
      expired: verdict === 'abandoned',
      ...(held
        ? { primaryLock: { wallTimeMs: held.wallTimeMs, ttlMs: held.ttlMs, ageMs: nowMs - held.wallTimeMs } }
        : {}),
    };
  }
  return verdict.committed ? { state: 'committed', commitTs: verdict.commitTs } : { state: 'rolled-back' };
}

/** One lock found by scanLocks. */
export interface LockedCell {
  readonly table: string;
  readonly row: string;
  readonly column: string;
  readonly lock: NonNullable<CellView['lock']>;
  /** nowMs minus the lock's wall time (its prewrite; a primary lock's: or its owner's last heartbeat). */
  readonly ageMs: number;
  /**
   * Its transaction is past its TTL as a reader judges it (`fate` pending and expired): by
   * its primary's lock, the one the heartbeat refreshes (a secondary lock of a live
   * transaction outgrows its own TTL), or by its own while the primary holds no lock of it.
   * False once the primary has decided the transaction (committed or rolled back).
   */
  readonly expired: boolean;
  readonly fate: PrimaryFate;
}

export interface ScanLocksOptions {
  /** Only locks at least this old (ms). Default 0. */
  readonly olderThanMs?: number;
  /** Wall clock the ages are measured against. Default Date.now. */
  readonly clock?: () => number;
  /** Rows read per page, 1 to 100,000. Default 256. */
  readonly pageSize?: number;
}

/**
 * Every lock in `table`, in row order, each with its primary's fate: a walk over the
 * table's head rows (needs the `orderedScan` capability; UnsupportedOperationError
 * otherwise). Reads only.
 */
export async function* scanLocks(
  store: RowStore,
  table: string,
  options: ScanLocksOptions = {},
): AsyncGenerator<LockedCell> {
  validateUserTable(table);
  // A misspelt key or NaN listed every lock, and pageSize 0 failed with a TypeError.
  checkOptionKeys<ScanLocksOptions>('scanLocks', options, { olderThanMs: true, clock: true, pageSize: true });
  if (options.olderThanMs !== undefined) checkInteger('scanLocks olderThanMs', options.olderThanMs, 0);
  if (options.pageSize !== undefined) checkInteger('scanLocks pageSize', options.pageSize, 1, 100_000);
  if (options.clock !== undefined) checkFunction('scanLocks clock', options.clock);
  const olderThanMs = options.olderThanMs ?? 0;
  const clock = options.clock ? checkedClock('scanLocks clock', options.clock) : Date.now;
  const fates = new Map<string, PrimaryFate>();
  const pending = new Map<
    string,
    { readonly fate: PrimaryFate & { state: 'pending' }; readonly atMs: number }
  >();
  for await (const { key, row } of scanHeadRows(store, table, options.pageSize ?? 256)) {
    const nowMs = clock();
    for (const cell of inspectHeadRow(row.state, { table, key }).cells) {
      const lock = cell.lock;
      if (!lock) continue;
      const ageMs = nowMs - lock.wallTimeMs;
      if (ageMs < olderThanMs) continue;
      const id = `${lock.primary.table}\u0000${lock.primary.row}\u0000${lock.primary.column}\u0000${lock.startTs}`;
      let fate = fates.get(id) ?? reuse(pending.get(id), lock, nowMs);
      if (!fate) {
        fate = await primaryFate(store, lock, nowMs);
        // Decided verdicts never change. A pending one is reused for a while (`reuse`): a
        // transaction that crashed over 10,000 rows has 10,000 locks, and its primary row
        // lists them all; read and decoded once per lock, a review's `locks` took 56 s.
        if (fate.state !== 'pending') fates.set(id, fate);
        else pending.set(id, { fate, atMs: nowMs });
      }
      yield {
        table,
        row: key,
        column: cell.column,
        lock,
        ageMs,
        expired: fate.state === 'pending' && fate.expired,
        fate,
      };
    }
  }
}

/** How long scanLocks takes a pending verdict of a primary as still true (ms). */
const PENDING_REUSE_MS = 1000;

/**
 * A pending verdict read at most PENDING_REUSE_MS ago, judged again at `nowMs`: expiry by
 * the primary's lock as read (its heartbeat may have moved it since: at most a second's
 * worth), or by the lock met while the primary holds none. Undefined, so the primary is
 * read again, when too old or when the judgement would change (expiry crossed: the
 * primary alone says what follows).
 */
function reuse(
  cached: { readonly fate: PrimaryFate & { state: 'pending' }; readonly atMs: number } | undefined,
  lock: { readonly wallTimeMs: number; readonly ttlMs: number },
  nowMs: number,
): PrimaryFate | undefined {
  if (!cached || nowMs - cached.atMs > PENDING_REUSE_MS || nowMs < cached.atMs) return undefined;
  const p = cached.fate.primaryLock;
  const expired = p ? p.wallTimeMs + p.ttlMs < nowMs : lock.wallTimeMs + lock.ttlMs < nowMs;
  if (expired !== cached.fate.expired) return undefined;
  return p ? { ...cached.fate, primaryLock: { ...p, ageMs: nowMs - p.wallTimeMs } } : cached.fate;
}

/** Head rows of a user table in key order, page by page. */
async function* scanHeadRows(store: RowStore, table: string, pageSize: number) {
  if (!store.capabilities.orderedScan || !store.scan) {
    throw new UnsupportedOperationError(`store "${store.name}" cannot scan rows in key order`);
  }
  let after: string | undefined;
  for (;;) {
    const page = await store.scan(table, { limit: pageSize, ...(after === undefined ? {} : { after }) });
    yield* page;
    if (page.length < pageSize) return;
    after = page[page.length - 1]!.key;
  }
}

/** Pending notifications of one observed column (scanNotifications). */
export interface PendingColumn {
  readonly table: string;
  readonly column: string;
  /** Cells of this column whose notification is set (with `observer`: that this observer has not handled). */
  readonly pending: number;
  /** The pending cell whose unhandled change is oldest. */
  readonly oldest: {
    readonly row: string;
    readonly notifyTs: number;
    /** Wall time of the oldest committed change not yet acknowledged; undefined if none is known (a weak notification, a write still locked, or, without `observer`, a change only an observer that never ran on the row has not handled). */
    readonly sinceMs?: number;
  };
}

export interface ScanNotificationsOptions {
  /**
   * Count only what this observer has not handled: cells whose newest committed write is
   * newer than its ack (the check an observer run makes before running its handler).
   * Without it: every cell whose notification flag is set.
   */
  readonly observer?: string;
  /**
   * Only this column. The store does not know which columns an observer watches, so with
   * `observer` alone every notified column of the table counts, those it does not watch
   * included (it has no ack there): name its column to count only that.
   */
  readonly column?: string;
  /** Keys asked from the notification index per page, 1 to 100,000. Default 256. */
  readonly pageSize?: number;
}

/**
 * Pending notifications in `table` per observed column, with the oldest unhandled change
 * of each: found through the store's notification index (the rows observer workers
 * visit), else, on a store without one, a walk over the table. Reads only.
 */
export async function scanNotifications(
  store: RowStore,
  table: string,
  options: ScanNotificationsOptions = {},
): Promise<PendingColumn[]> {
  validateUserTable(table);
  checkOptionKeys<ScanNotificationsOptions>('scanNotifications', options, {
    observer: true,
    column: true,
    pageSize: true,
  });
  if (options.observer !== undefined && typeof options.observer !== 'string')
    throw new InvalidArgumentError(
      `scanNotifications observer must be a string, got ${typeof options.observer}`,
    );
  if (options.column !== undefined) validateColumn(options.column);
  // 0 asked for empty pages for ever: a short page is the end, and no page was short.
  if (options.pageSize !== undefined)
    checkInteger('scanNotifications pageSize', options.pageSize, 1, 100_000);
  const pageSize = options.pageSize ?? 256;
  const byColumn = new Map<string, { pending: number; oldest: PendingColumn['oldest'] }>();
  const visit = (key: string, state: Uint8Array) => {
    const row = decodeRow(state);
    for (const [column, cell] of row.cells) {
      if (cell.notifyTs === 0 || isReservedColumn(column)) continue;
      if (options.column !== undefined && column !== options.column) continue;
      // The acks of this column's observers: ordinary cells in the same row.
      const acks: number[] = [];
      for (const [name, ackCell] of row.cells) {
        const observer = ackObserver(name, column);
        if (observer === undefined || (options.observer !== undefined && observer !== options.observer))
          continue;
        acks.push(ackValue(ackCell));
      }
      if (options.observer !== undefined && acks.length === 0) acks.push(0);
      // The oldest change some observer has not acknowledged (the least advanced ack).
      const ackTs = acks.length > 0 ? Math.min(...acks) : 0;
      const unhandled = cell.writes.filter(
        (w) => w.kind !== 'rollback' && w.commitTs > ackTs && w.startTs !== ackTs,
      );
      if (options.observer !== undefined) {
        const newest = cell.writes.find((w) => w.kind !== 'rollback');
        // runObserver's own test: nothing newer than the ack means nothing to run.
        if (!newest || newest.commitTs <= ackTs || newest.startTs === ackTs) continue;
      }
      const sinceMs = unhandled.length > 0 ? Math.min(...unhandled.map((w) => w.wallTimeMs)) : undefined;
      const entry = byColumn.get(column);
      const candidate = { row: key, notifyTs: cell.notifyTs, ...(sinceMs === undefined ? {} : { sinceMs }) };
      if (!entry) byColumn.set(column, { pending: 1, oldest: candidate });
      else {
        entry.pending++;
        if (olderChange(candidate, entry.oldest)) entry.oldest = candidate;
      }
    }
  };
  if (store.capabilities.notificationIndex && store.scanNotified) {
    let after: string | undefined;
    for (;;) {
      const keys = await store.scanNotified(table, {
        limit: pageSize,
        ...(after === undefined ? {} : { after }),
      });
      const rows =
        store.capabilities.batchRead && store.readMany && keys.length > 1
          ? await store.readMany(keys.map((key) => ({ table, key })))
          : await Promise.all(keys.map((key) => store.read(table, key)));
      keys.forEach((key, i) => {
        const stored = rows[i];
        if (stored) visit(key, stored.state);
      });
      if (keys.length < pageSize) break;
      after = keys[keys.length - 1];
    }
  } else {
    for await (const { key, row } of scanHeadRows(store, table, pageSize)) visit(key, row.state);
  }
  return [...byColumn.entries()]
    .sort(([a], [b]) => compareKeys(a, b))
    .map(([column, { pending, oldest }]) => ({ table, column, pending, oldest }));
}

function olderChange(a: PendingColumn['oldest'], b: PendingColumn['oldest']): boolean {
  if (a.sinceMs !== undefined && b.sinceMs !== undefined) return a.sinceMs < b.sinceMs;
  if (a.sinceMs !== undefined) return true;
  if (b.sinceMs !== undefined) return false;
  return a.notifyTs < b.notifyTs;
}

/** The observer whose ack of `column` is kept in reserved column `name`, if it is one. */
function ackObserver(name: string, column: string): string | undefined {
  const ack = parseAckColumn(name);
  return ack?.column === column ? ack.observer : undefined;
}

const ackDecoder = new TextDecoder('utf-8', { ignoreBOM: true });

/** The startTs an ack cell's newest committed value records (0 if none is readable in the head row). */
function ackValue(cell: Cell): number {
  const newest = cell.writes.find((w) => w.kind !== 'rollback');
  if (newest?.kind !== 'put') return 0;
  const bytes = cell.data.get(newest.startTs);
  const ts = bytes ? Number(ackDecoder.decode(bytes)) : 0;
  return Number.isSafeInteger(ts) && ts > 0 ? ts : 0;
}

/** One observer's ack in a head row: the startTs of its last run that handled `column`. */
export interface ObserverAck {
  readonly observer: string;
  readonly column: string;
  /** 0 when the ack holds no readable value in the head row. */
  readonly ackTs: number;
}

/** The observer acks a head row holds (reserved cells next to the observed ones). */
export function observerAcks(state: Uint8Array): ObserverAck[] {
  const acks: ObserverAck[] = [];
  for (const [name, cell] of decodeRow(state).cells) {
    const parsed = parseAckColumn(name);
    if (parsed) acks.push({ ...parsed, ackTs: ackValue(cell) });
  }
  return acks;
}
