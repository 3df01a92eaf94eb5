import { backoffMs, onAbort } from './backoff.js';
import { visibleWrite } from './cells.js';
import { decodeRowAt, decodeVersionRow, STAMP } from './codec.js';
import { abortedError, timed } from './commit/context.js';
import {
  type CommitContext,
  commitOnePhase,
  commitOnePhaseMany,
  commitTransaction,
  type RowMutations,
  rowId,
} from './commit/index.js';
import { keepInBackground, type ProtocolEnv } from './env.js';
import {
  AbortedError,
  ClosedError,
  CommitUnknownError,
  ConflictError,
  CorruptRowError,
  InvalidArgumentError,
  LockNotResolvedError,
  PercolatorError,
  SnapshotTooOldError,
  UnsupportedOperationError,
} from './errors.js';
import type { ObserverRunRef, TransactionOutcome, TransactionRef } from './events.js';
import { decodeJson, encodeJson, type JsonValue } from './json.js';
import { resolveLock } from './lock-resolver.js';
import {
  compareKeys,
  shownName,
  toValueBytes,
  validateColumn,
  validateRowKey,
  validateUserTable,
} from './names.js';
import { markNotifications, raiseMarksLater } from './observers/notifications.js';
import { isReservedColumn } from './observers/reserved.js';
import { checkInteger, checkOptionKeys, checkSignal } from './options.js';
import { usableTimestamp } from './oracle.js';
import { blockOf, type Cell, type Lock, type RowState } from './row-state.js';
import type { ScannedStoredRow, ScanOptions, StoredRow } from './store.js';
import { versionKey, versionTable } from './versions.js';

export interface ScanRange {
  /** Inclusive. */
  readonly start?: string;
  /** Exclusive. */
  readonly end?: string;
  /** At most this many rows. */
  readonly limit?: number;
}

export interface ScannedRow {
  readonly row: string;
  readonly columns: ReadonlyMap<string, Uint8Array>;
}

export interface CommitResult {
  readonly commitTs: number;
}

type Status = 'active' | 'committing' | 'committed' | 'rolledBack' | 'failed';

const decoder = new TextDecoder('utf-8', { ignoreBOM: true });
const noop = (): void => {};
const SCAN_PAGE = 256;
/**
 * Rows a transaction keeps as its reads decoded them: more than a commit of one step takes
 * would cost memory for little (a commit of more rows goes in two phases anyway).
 */
const KEPT_DECODED = 64;

/**
 * What a snapshot read of one cell found: a value (or absence), the startTs of a value that
 * lives in a version row, or a lock to resolve first.
 */
/** `moved`: the value's startTs; `block`: the startTs naming the version row that holds it. */
type CellView = { value: Uint8Array | undefined } | { moved: number; block: number } | { lock: Lock };

/** A version row that vanished between the head read and its own read. */
const GONE = Symbol('gone');

/**
 * The start timestamp a transaction draws with its first reads (`sendFirstReads` settles
 * it). A promise is made only for whoever waits on it (`ready`: a later read, a commit). A
 * read-only transaction of one read, the common case, has nobody waiting, and a promise
 * made anyway cost two (itself, and a handler so that its failure, which the reads get,
 * is not unhandled).
 */
class FirstDraw {
  private outcome: { readonly ts: number } | { readonly error: unknown } | undefined;
  private waiting: Promise<number> | undefined;
  private settleWaiting: { resolve: (ts: number) => void; reject: (error: unknown) => void } | undefined;

  wait(): Promise<number> {
    const outcome = this.outcome;
    if (outcome) return 'ts' in outcome ? Promise.resolve(outcome.ts) : Promise.reject(outcome.error);
    this.waiting ??= new Promise<number>((resolve, reject) => {
      this.settleWaiting = { resolve, reject };
    });
    return this.waiting;
  }

  resolve(ts: number): void {
    if (this.outcome) return;
    this.outcome = { ts };
    this.settleWaiting?.resolve(ts);
  }

  reject(error: unknown): void {
    if (this.outcome) return;
    this.outcome = { error };
    this.settleWaiting?.reject(error);
  }
}

/** `buffered()`: the transaction has no buffered write of the cell. */
const UNBUFFERED = Symbol('unbuffered');

/**
 * A transaction's identity in events. A class, not an object literal with a getter: one
 * cheap allocation per transaction. The transaction is a private field, so a listener that
 * serialises the ref gets `{ id, attempt, startTs }`, not the transaction.
 */
class Ref implements TransactionRef {
  readonly #tx: Transaction;
  listenerState: unknown = undefined;
  constructor(
    readonly id: number,
    readonly attempt: number,
    tx: Transaction,
  ) {
    this.#tx = tx;
  }
  get startTs(): number | undefined {
    return this.#tx.drawnStartTs;
  }
  toJSON(): { id: number; attempt: number; startTs: number | undefined } {
    return { id: this.id, attempt: this.attempt, startTs: this.startTs };
  }
}

/**
 * A snapshot-isolation transaction (docs/protocol.md section 4). Reads see exactly what was
 * committed before `startTs`, plus this transaction's own buffered writes. Writes are
 * buffered until `commit()`.
 */
export class Transaction {
  private readonly mutations = new Map<
    string,
    { table: string; row: string; cells: Map<string, Uint8Array | null> }
  >();
  /** Weak notifications (`notify`): row id -> the cells to mark notified. Made by the first `notify`. */
  private notifications: Map<string, { table: string; row: string; columns: Set<string> }> | undefined;
  /** Last version seen per row: the expected version of the first prewrite CAS. */
  private knownRows = new Map<string, StoredRow | null>();
  /**
   * Set once a commit attempt has taken `knownRows` (and `decodedRows`), which it trusts: a
   * read the caller left running across commit() (not awaited) may answer late with the row
   * as it was before this transaction's prewrite, and must not replace what the commit
   * knows (its secondaries' step would find no lock of ours to roll forward, and skip it).
   */
  private commitTookRows = false;
  /**
   * Rows as its reads decoded them, for its commit to start from (commit/context.ts,
   * decodeKnown): at most `KEPT_DECODED` rows, none in a read-only transaction.
   */
  private decodedRows: Map<string, { readonly stored: StoredRow; readonly state: RowState }> | undefined;
  private status: Status = 'active';
  /** The commit `commit()` started, if any (`finishForTransact`). */
  private ownCommit: Promise<CommitResult> | undefined;

  private ts: number | undefined;
  /**
   * The start timestamp was peeked, not drawn (`readPeeked`; a read-only transaction, or a
   * read-write one with `peekedWrites`): one above the counter's value then, so other
   * transactions may share it, and one may hold a lock at exactly this timestamp. Such a
   * lock was drawn after the peek, so its commit can only come later still: it is not
   * waited for (viewCell). Shared, it identifies nothing: the commit of a read-write one
   * gets an identity of its own (commitMutations).
   */
  private peeked = false;
  /**
   * With env.identityAhead: its commit's identity, drawn from the oracle beside its peek
   * (drawIdentityAhead); taken at commit (commitMutations).
   */
  private identityDraw: Promise<number> | undefined;
  /** The identity its commit took, where not `ts` (a peeked snapshot's; STAMP: the store's draw). */
  private identity: number | undefined;
  /** The start timestamp being drawn: by the oracle (or a peek of its own), or with the first reads. */
  private starting: Promise<number> | FirstDraw | undefined;
  /** Reads issued before the start timestamp, sent together in one stamped read. */
  private firstReads:
    | { table: string; row: string; resolve: (r: StoredRow | null) => void; reject: (e: unknown) => void }[]
    | undefined;

  /** @internal Its identity in events; only with an `onEvent` listener. */
  readonly ref: TransactionRef | undefined;
  /** performance.now() at the start, with an `onEvent` listener. */
  private readonly began: number = 0;

  /**
   * `startTs` undefined: the transaction draws it when it first needs it, with its first
   * reads in one round trip where the store offers stamped reads (`db.transact` does this).
   */
  constructor(
    private readonly env: ProtocolEnv,
    startTs?: number,
    /** Aborts reads (and lock waits) at once, and the commit up to its commit point. */
    private readonly signal?: AbortSignal,
    attempt = 1,
    /** The attempt of `db.transact` before this one, for events. */
    retryOf?: Transaction,
    /** Reads only: writes are refused, and the snapshot is peeked where the store can (see `peeked`). */
    readonly readOnly = false,
    /** The observer run this transaction is an attempt of, for events. */
    observerRun?: ObserverRunRef,
  ) {
    this.ts = startTs;
    const events = env.events;
    if (events) {
      this.ref = new Ref(events.newTransaction(), attempt, this);
      this.began = performance.now();
      events.emit({
        type: 'transaction.begin',
        transaction: this.ref,
        store: events.store,
        retryOf: retryOf?.ref,
        observerRun,
        time: this.began,
      });
    }
  }

  /** @internal The start timestamp if drawn yet (for events: `TransactionRef.startTs`). */
  get drawnStartTs(): number | undefined {
    return this.ts;
  }

  /** Emits `transaction.end` (with a listener only). */
  private ended(outcome: TransactionOutcome, commitTs: number | undefined, error: unknown): void {
    const events = this.env.events;
    if (!events) return;
    // Built field by field, no spreads: this runs once per transaction with a listener.
    const tables = this.mutations.size > 0 ? distinctTables(this.mutations.values()) : 0;
    events.emit({
      type: 'transaction.end',
      transaction: this.ref!,
      outcome,
      startTs: this.ts,
      commitTs,
      identityTs: this.identityTs(commitTs),
      rows: this.mutations.size,
      tables,
      time: this.began,
      durationMs: performance.now() - this.began,
      error,
    });
  }

  /** Its commit's identity where that is not its `startTs` (TransactionEndEvent.identityTs). */
  private identityTs(commitTs: number | undefined): number | undefined {
    const identity = this.identity === STAMP ? commitTs : this.identity;
    return identity === this.ts ? undefined : identity;
  }

  /**
   * The snapshot's start timestamp. A transaction of `db.transact` draws it with its first
   * read; before any read it is not known yet and this throws (use `await tx.ready()`).
   */
  get startTs(): number {
    if (this.ts === undefined) {
      throw new UnsupportedOperationError(
        'this transaction draws its start timestamp with its first read; await tx.ready() to draw it now',
      );
    }
    return this.ts;
  }

  /**
   * Draws the start timestamp now if it is not drawn yet, and resolves to it. A transaction
   * that is no longer active and drew none (a blind write takes the stamp of its one-step
   * commit as its start timestamp, docs/protocol.md 4.5) gets a ClosedError: a draw now
   * would name a snapshot it never had. `tx.startTs` gives the stamp once the commit is done.
   */
  ready(): Promise<number> {
    if (this.ts !== undefined) return Promise.resolve(this.ts);
    if (this.env.lifecycle.closed) return Promise.reject(new ClosedError('this Percolator client is closed'));
    if (this.status !== 'active') {
      return Promise.reject(
        new ClosedError(
          `transaction is ${this.status} and drew no start timestamp before its commit (a blind write stamps it in the commit: read tx.startTs once the commit is done)`,
        ),
      );
    }
    return this.draw();
  }

  /**
   * Whether its snapshot is peeked (`readPeeked`) rather than drawn: a read-only
   * transaction's wherever the store can, and a read-write one's with `peekedWrites`.
   */
  private peeks(): boolean {
    return (
      this.env.peekCounter !== undefined &&
      (this.readOnly ||
        // A write that read nothing before its commit needs a drawn identity anyway: its
        // start timestamp, drawn with the reads its commit makes (commitMutations).
        (this.env.peekedWrites && this.status === 'active'))
    );
  }

  /** `ready()`, inside the transaction (its reads, scans and commit): draws if not drawn yet. */
  private async draw(): Promise<number> {
    if (this.ts !== undefined) return this.ts;
    // The first reads' draw, if in flight; else this draw (the peek, or the oracle).
    let drawing: Promise<number>;
    if (this.starting instanceof FirstDraw) drawing = this.starting.wait();
    else {
      const peek = this.peeks();
      if (peek && this.starting === undefined) this.drawIdentityAhead();
      this.starting ??= (
        peek
          ? this.peek([]).then(
              ({ timestamp }) => timestamp,
              // As after a failed first read (sendFirstReads): the oracle is the other way.
              (failure: unknown) => {
                if (!oracleMayServe(failure)) throw failure;
                return this.env.oracle.next();
              },
            )
          : this.env.oracle.next()
      ).then((ts) => {
        this.ts ??= ts;
        return this.ts;
      });
      drawing = this.starting;
    }
    const mine = this.starting;
    // A store call (the peek, the oracle) close() waits for, as for a read.
    const { lifecycle } = this.env;
    lifecycle.readStarted();
    try {
      return await drawing;
    } catch (error) {
      if (this.starting === mine) this.starting = undefined; // a later call may try again
      throw error;
    } finally {
      lifecycle.readEnded();
    }
  }

  async get(table: string, row: string, column: string): Promise<Uint8Array | undefined> {
    const buffered = this.buffered(table, row, column);
    const value = buffered !== UNBUFFERED ? buffered : (await this.readCells(table, row, [column]))[0]!.value;
    // A copy of its own, always: a decoded value is a view into the stored row, and a
    // buffered write's bytes are what the commit will write (and share a slab of the byte
    // pool), so the caller may keep or change what it gets.
    return value?.slice();
  }

  /**
   * Checks a read's arguments, and answers this transaction's buffered write of the cell
   * (undefined for a buffered delete), or UNBUFFERED: then the getter reads the snapshot
   * (`readCells`). The value is a view, not a copy: callers that only decode it
   * (`getString`, `getJson`) need no copy; `get` makes one. Each getter awaits `readCells`
   * itself, with no async frame between (a read-only transaction of one read is a handful
   * of microseconds of client CPU, and each frame is a promise and its turns).
   */
  private buffered(table: string, row: string, column: string): Uint8Array | undefined | typeof UNBUFFERED {
    this.assertActive();
    validateUserTable(table);
    validateRowKey(row);
    validateColumn(column);
    const buffered = this.mutations.size > 0 ? this.mutations.get(rowId(table, row))?.cells : undefined;
    if (buffered?.has(column)) return buffered.get(column) ?? undefined;
    return UNBUFFERED;
  }

  /**
   * Reads cells of one row at this snapshot (one row read), resolving any lock at or
   * below the snapshot first. Buffered writes are not applied.
   */
  private async readCells(
    table: string,
    row: string,
    columns: readonly string[],
  ): Promise<{ value: Uint8Array | undefined; cell: Cell | undefined }[]> {
    // When the read first met a lock: a lock wait is timed (and bounded by lockWaitMs) from
    // there, and a read that meets none reads no clock.
    let waitStart = 0;
    let gone: Set<string> | undefined;
    let met: Lock | undefined;
    const { lifecycle } = this.env;
    lifecycle.readStarted();
    try {
      for (let attempt = 0; ; attempt++) {
        this.checkStop();
        const stored = await this.untilAborted(this.readRow(table, row));
        const id = this.remember(table, row, stored);
        const state = stored ? decodeRowAt(stored.state, table, row) : undefined;
        // Index loops, no closures: this runs for every read. The first locked column stops
        // the loop: an error a later column would raise (snapshot too old) comes after the
        // lock is settled and the row read again, or not at all if the wait gives up.
        const cells: (Cell | undefined)[] = [];
        const views: CellView[] = [];
        let blocked: Lock | undefined;
        let anyMoved = false;
        for (let i = 0; i < columns.length; i++) {
          const cell = state?.cells.get(columns[i]!);
          const view = this.viewCell(table, columns[i]!, cell);
          if ('lock' in view) {
            blocked = view.lock;
            break;
          }
          if ('moved' in view) anyMoved = true;
          cells.push(cell);
          views.push(view);
        }
        if (blocked) {
          if (met === undefined) waitStart = performance.now();
          met = blocked;
          await this.settleLock(table, row, met, attempt, waitStart);
          continue;
        }
        const out: { value: Uint8Array | undefined; cell: Cell | undefined }[] = [];
        if (!anyMoved) {
          // Values in the head row (the common case) need no further read, and no promise.
          for (let i = 0; i < views.length; i++) {
            const view = views[i]!;
            out.push({ cell: cells[i], value: 'value' in view ? view.value : undefined });
          }
        } else {
          const values = await Promise.all(
            views.map((view, i) => this.valueOf(table, row, columns[i]!, view, (gone ??= new Set()))),
          );
          if (values.includes(GONE)) continue;
          for (let i = 0; i < views.length; i++)
            out.push({ cell: cells[i], value: values[i] as Uint8Array | undefined });
        }
        if (met) this.waited(table, row, met, waitStart, undefined);
        if (id !== undefined && stored && state) this.keepDecoded(id, stored, state);
        return out;
      }
    } catch (error) {
      if (met) this.waited(table, row, met, waitStart, error);
      throw error;
    } finally {
      lifecycle.readEnded();
    }
  }

  /** Keeps a row (`id`, as `remember` gave it) as a read decoded it, for the commit's first decision on it. */
  private keepDecoded(id: string, stored: StoredRow, state: RowState): void {
    this.decodedRows ??= new Map();
    // A row read again replaces its older state (which no commit would take: it starts
    // from the row as last read).
    if (this.decodedRows.size < KEPT_DECODED || this.decodedRows.has(id))
      this.decodedRows.set(id, { stored, state });
  }

  /** Emits `lock.wait` for a read that met a lock (with a listener only). */
  private waited(table: string, row: string, lock: Lock, since: number, error: unknown): void {
    const events = this.env.events;
    if (!events) return;
    events.emit({
      type: 'lock.wait',
      transaction: this.ref!,
      table,
      row,
      lockStartTs: lock.startTs,
      outcome:
        error === undefined
          ? 'resolved'
          : error instanceof LockNotResolvedError
            ? 'timedOut'
            : error instanceof AbortedError
              ? 'aborted'
              : 'failed',
      time: since,
      durationMs: performance.now() - since,
    });
  }

  /**
   * The value a view points at. A `moved` value is read from its version row; if that row
   * is gone, GC pruned it after our head read: the caller re-reads the head, which then
   * says SnapshotTooOld. Gone twice for the same version while the head still names it is
   * a corrupt store, never a value.
   */
  private async valueOf(
    table: string,
    row: string,
    column: string,
    view: CellView,
    gone: Set<string>,
  ): Promise<Uint8Array | undefined | typeof GONE> {
    if ('value' in view) return view.value;
    if (!('moved' in view)) return undefined;
    // Stops at once on the caller's signal or the client's close, as the head row's read does.
    const stored = await this.untilAborted(
      this.env.reader.read(versionTable(table), versionKey(row, column, view.block)),
    );
    if (stored) {
      const value = decodeVersionRow(stored.state, view.moved);
      // A block holds every value its records name, from its creation on (cells.ts, markMoving).
      if (value === undefined) {
        throw new CorruptRowError(
          `${table}/${shownName(row)}/${shownName(column)}: the version row at ${view.block} does not hold the version at ${view.moved} its head row names`,
        );
      }
      return value;
    }
    const id = `${column}\u0000${view.moved}`;
    if (gone.has(id)) {
      throw new CorruptRowError(
        `${table}/${shownName(row)}/${shownName(column)}: the head row names a version at ${view.moved} whose version row is missing`,
      );
    }
    gone.add(id);
    return GONE;
  }

  /** Reads a value written by `setJson`: undefined when absent, InvalidArgumentError when not JSON. */
  async getJson<T extends JsonValue = JsonValue>(
    table: string,
    row: string,
    column: string,
  ): Promise<T | undefined> {
    const buffered = this.buffered(table, row, column);
    const bytes = buffered !== UNBUFFERED ? buffered : (await this.readCells(table, row, [column]))[0]!.value;
    return bytes === undefined
      ? undefined
      : (decodeJson(bytes, `${table}/${shownName(row)}/${shownName(column)}`) as T);
  }

  /**
   * Buffers a JSON value: numbers, strings, booleans, null, arrays and plain objects, which
   * read back exactly. Anything JSON would change or drop is an InvalidArgumentError, and so
   * is nesting of arrays and objects deeper than 1,000 levels.
   */
  setJson(table: string, row: string, column: string, value: JsonValue): void {
    this.assertActive();
    const bytes = encodeJson(value);
    if (bytes.length > this.maxValueBytes()) {
      throw new InvalidArgumentError(
        `JSON value is ${bytes.length} bytes; the limit is ${this.maxValueBytes()}`,
      );
    }
    this.buffer(table, row, column, bytes);
  }

  /**
   * The value as UTF-8 text (undefined if absent). Bytes that are not UTF-8 (a value set
   * as a Uint8Array) are decoded the way TextDecoder does, each bad sequence as U+FFFD, not
   * refused: read such values with `get`. (`getJson` refuses them: a JSON value is text.)
   */
  async getString(table: string, row: string, column: string): Promise<string | undefined> {
    const buffered = this.buffered(table, row, column);
    const bytes = buffered !== UNBUFFERED ? buffered : (await this.readCells(table, row, [column]))[0]!.value;
    return bytes === undefined ? undefined : decoder.decode(bytes);
  }

  set(table: string, row: string, column: string, value: Uint8Array | string): void {
    this.assertActive();
    this.buffer(table, row, column, toValueBytes(value, this.maxValueBytes()));
  }

  delete(table: string, row: string, column: string): void {
    this.assertActive();
    this.buffer(table, row, column, null);
  }

  /**
   * A weak notification (docs/protocol.md section 8): marks the cell notified without writing
   * it, so the observers of (table, column) run for this row. It takes no lock and never
   * conflicts; it is written with the prewrites (startTs) and again after the commit point
   * (commitTs), and only if this transaction commits (a transaction with no writes marks it
   * at commit). Observers it triggers may run more than once.
   */
  notify(table: string, row: string, column: string): void {
    this.assertActive();
    this.assertWritable();
    validateUserTable(table);
    validateRowKey(row);
    validateColumn(column);
    rejectReserved(column);
    const id = rowId(table, row);
    this.notifications ??= new Map();
    let n = this.notifications.get(id);
    if (!n) {
      n = { table, row, columns: new Set() };
      this.notifications.set(id, n);
    }
    n.columns.add(column);
  }

  /**
   * @internal For the observer framework: the newest write of `column` visible to this
   * snapshot (its commit and start timestamps) and the value of `ackColumn`, from one row
   * read. Locks at or below the snapshot are resolved first, as `get` does.
   */
  async observedState(
    table: string,
    row: string,
    column: string,
    ackColumn: string,
  ): Promise<{ write: { commitTs: number; startTs: number } | undefined; ack: Uint8Array | undefined }> {
    this.assertActive();
    const [observed, ack] = await this.readCells(table, row, [column, ackColumn]);
    const record = observed!.cell ? visibleWrite(observed!.cell, this.startTs) : undefined;
    return {
      write: record ? { commitTs: record.commitTs, startTs: record.startTs } : undefined,
      ack: ack!.value,
    };
  }

  /**
   * @internal For the observer framework: whether the transaction is still open (its
   * handler did not commit or roll it back: the worker commits it, with the ack).
   */
  get isActive(): boolean {
    return this.status === 'active';
  }

  /** @internal For the observer framework: buffers a write to a reserved column (an ack). */
  setReserved(table: string, row: string, column: string, value: string): void {
    this.assertActive();
    if (!isReservedColumn(column)) throw new InvalidArgumentError('not a reserved column');
    this.buffer(table, row, column, toValueBytes(value), false);
  }

  /**
   * Rows of `table` in key order (UTF-8 byte order) at this snapshot, with this
   * transaction's writes applied: those made before the scan began. Writes made while it
   * runs (a loop that inserts what it finds missing) show in later reads and scans, not in
   * this one: before, changes to stored rows showed and new rows did not (found in review).
   */
  async *scan(table: string, range: ScanRange = {}): AsyncGenerator<ScannedRow> {
    this.assertActive();
    // Checked before the draw: bad input changes nothing (a misspelt `from` scanned the whole table).
    validateUserTable(table);
    checkOptionKeys<ScanRange>('scan', range, { start: true, end: true, limit: true });
    if (range.start !== undefined) validateRowKey(range.start);
    if (range.end !== undefined) validateRowKey(range.end);
    const limit = range.limit ?? Number.POSITIVE_INFINITY;
    if (limit !== Number.POSITIVE_INFINITY) checkInteger('scan limit', limit, 0);
    await this.draw();
    const { store } = this.env;
    if (!store.capabilities.orderedScan || !store.scan) {
      throw new UnsupportedOperationError(`store "${store.name}" cannot scan rows in key order`);
    }
    const inRange = (key: string) =>
      (range.start === undefined || compareKeys(key, range.start) >= 0) &&
      (range.end === undefined || compareKeys(key, range.end) < 0);
    // The transaction's writes to the range as the scan begins (each row's cells copied).
    const own = [...this.mutations.values()]
      .filter((m) => m.table === table && inRange(m.row))
      .sort((a, b) => compareKeys(a.row, b.row))
      .map((m) => ({ row: m.row, cells: new Map(m.cells) }));
    const ownCells = new Map(own.map((m) => [m.row, m.cells]));
    let ownIndex = 0;
    let yielded = 0;
    let after: string | undefined;
    let exhausted = false;
    while (yielded < limit) {
      const page = exhausted
        ? []
        : await this.scanPage(table, { start: range.start, end: range.end, after, limit: SCAN_PAGE });
      if (page.length < SCAN_PAGE) exhausted = true;
      for (const { key, row } of page) {
        this.scanGoesOn();
        while (ownIndex < own.length && compareKeys(own[ownIndex]!.row, key) < 0 && yielded < limit) {
          const m = own[ownIndex++]!;
          const result = overlay(m.row, m.cells, new Map());
          if (result) {
            yield result;
            yielded++;
          }
        }
        if (yielded >= limit) return;
        if (own[ownIndex]?.row === key) ownIndex++;
        const result = overlay(key, ownCells.get(key), await this.visibleColumns(table, key, row));
        if (result) {
          yield result;
          yielded++;
        }
        if (yielded >= limit) return;
        after = key;
      }
      if (exhausted) {
        while (ownIndex < own.length && yielded < limit) {
          this.scanGoesOn();
          const m = own[ownIndex++]!;
          const result = overlay(m.row, m.cells, new Map());
          if (result) {
            yield result;
            yielded++;
          }
        }
        return;
      }
    }
  }

  /**
   * Commits the buffered writes. A `signal` (or the transaction's own, from
   * `db.transact`) that fires before the commit point rolls back and rejects with
   * AbortedError; once the commit point is passed the transaction is committed, and this
   * resolves, whatever the signal does.
   */
  commit(options: { signal?: AbortSignal } = {}): Promise<CommitResult> {
    const active = this.status === 'active';
    const done = this.commitOnce(options);
    // The commit this transaction ran, for `db.transact` when its function called commit()
    // itself (`finishForTransact`). Its status leaves 'active' before the first await.
    if (active && this.status !== 'active') this.ownCommit = done;
    return done;
  }

  private async commitOnce(options: { signal?: AbortSignal }): Promise<CommitResult> {
    if (this.status === 'active' && this.env.lifecycle.closed) {
      // The client closed while this transaction was open: it ends here, failed, and says
      // so (a listener's span for it was left open, found in review).
      this.status = 'failed';
      const error = new ClosedError('this Percolator client is closed');
      this.ended('failed', undefined, error);
      throw error;
    }
    this.assertActive();
    checkOptionKeys<{ signal?: AbortSignal }>('commit', options, { signal: true });
    checkSignal('commit', options.signal);
    const signal = options.signal ?? this.signal;
    if (signal?.aborted) {
      this.status = 'failed';
      const error = abortedError(signal);
      this.ended('aborted', undefined, error);
      throw error;
    }
    if (this.commitUnwritten()) return { commitTs: this.ts! };
    this.status = 'committing';
    const { lifecycle } = this.env;
    lifecycle.commitStarted();
    try {
      const commitTs = await this.commitMutations(signal);
      this.status = 'committed';
      this.ended('committed', commitTs, undefined);
      return { commitTs };
    } catch (error) {
      this.status = 'failed';
      this.ended(outcomeOf(error), undefined, error);
      throw error;
    } finally {
      this.dropBuffers();
      lifecycle.commitEnded();
    }
  }

  /**
   * @internal Commits at once a transaction with nothing to write whose snapshot is taken
   * (a read-only transaction, or one that read and wrote nothing): committed as is, at its
   * start timestamp, with no store call (what commitMutations would conclude). False when
   * there is something to commit; then `commit()` does. `db.transact` calls this first, so
   * such a transaction ends with no promise of its own (it checks its signal first, as
   * `commit()` does).
   */
  commitUnwritten(): boolean {
    if (
      this.status !== 'active' ||
      this.mutations.size > 0 ||
      this.notifications !== undefined ||
      this.ts === undefined
    )
      return false;
    this.status = 'committed';
    this.ended('committed', this.ts, undefined);
    this.dropBuffers();
    return true;
  }

  /**
   * @internal `db.transact`'s commit, once its function returned. The function may have
   * ended the transaction itself: after its own `commit()` this is that commit's outcome
   * (awaited if still running, its error if it failed); after its own `rollback()`,
   * nothing: nothing was written, and the function chose so.
   */
  finishForTransact(): Promise<unknown> {
    if (this.status === 'active') return this.commit();
    if (this.status === 'rolledBack') return Promise.resolve();
    return this.ownCommit!;
  }

  /**
   * @internal For `db.transact` after its function threw: whether running the function again
   * could commit its writes twice. True when the function started a commit of its own that
   * committed, or whose outcome is unknown (CommitUnknownError: it may have landed). False
   * when it started none, or one that certainly wrote nothing: `commit()` rejects with any
   * other error only when nothing was committed (docs/protocol.md section 6). Waits for
   * that commit to end first, awaited by the function or not, so `transact` never settles
   * while a commit of its transaction still runs, and that commit's rejection is handled.
   */
  async mayHaveCommittedByHand(): Promise<boolean> {
    if (this.ownCommit === undefined) return false;
    try {
      await this.ownCommit;
      return true;
    } catch (error) {
      return error instanceof CommitUnknownError;
    }
  }

  /**
   * Lets go of what only this transaction's commit needed: its buffered values and the rows
   * it read (views into the byte pool's slabs keep a whole slab alive, and a caller may
   * keep a finished transaction). The commit's background work keeps its own references.
   */
  private dropBuffers(): void {
    if (this.mutations.size > 0) this.mutations.clear();
    this.decodedRows = undefined;
    // A new map, not cleared: the commit's background work keeps the old one.
    if (this.knownRows.size > 0) this.knownRows = new Map();
  }

  /**
   * Discards the buffered writes. Nothing was written before commit, so nothing needs
   * undoing. After the transaction has ended (committed, failed, rolled back) it does
   * nothing. While its commit is in flight it rejects with ClosedError: that commit, not
   * this call, decides the outcome (its promise tells which).
   */
  async rollback(): Promise<void> {
    if (this.status === 'committing') {
      throw new ClosedError(
        `transaction ${this.ts ?? '(not started)'} is committing: its commit() decides the outcome, and this rollback() changes nothing`,
      );
    }
    return this.rollbackAfter(undefined);
  }

  /** @internal `rollback()` because of `error` (`db.transact`'s function threw it): events say why. */
  async rollbackAfter(error: unknown): Promise<void> {
    if (this.status !== 'active') return;
    this.status = 'rolledBack';
    if (this.ref) this.ended(error === undefined ? 'rolledBack' : outcomeOf(error), undefined, error);
    this.dropBuffers();
    this.notifications = undefined;
  }

  private async commitMutations(signal: AbortSignal | undefined): Promise<number> {
    if (this.stampsItsStart()) {
      // One stamped CAS is the whole transaction: its start and commit timestamp are the one
      // value the store draws in the atomic step (commitOnePhase).
      const commitTs = await this.commitRows(this.rowMutations(), signal, STAMP);
      this.ts ??= commitTs; // drawn already if the rows took two phases after all
      return commitTs;
    }
    if (
      this.ts === undefined &&
      this.env.stampedReadCounter !== undefined &&
      !this.env.stampedReads.preferOracle()
    ) {
      // A transaction that only wrote: its start timestamp comes with a read of the rows it
      // writes, which its commit needs anyway (one round trip for both).
      await Promise.all([...this.mutations.values()].map((m) => this.readAndRemember(m.table, m.row)));
    }
    if (this.ts === undefined) await this.draw(); // otherwise drawn now (no await when drawn: every commit passes here)
    const rows = this.rowMutations();
    const notified = this.notifications ? [...this.notifications.values()] : [];
    if (rows.length === 0) {
      // Nothing to commit: the weak notifications are the whole transaction.
      if (notified.length > 0) await markNotifications(this.env, notified, this.startTs);
      return this.startTs;
    }
    // A peeked snapshot may be shared, so it cannot name this transaction's locks and
    // records (docs/protocol.md 4.10): a commit in one step takes the value the store draws
    // in it (STAMP, as a blind write's does), any other commit an identity drawn now. Its
    // conflict check stays at the snapshot (ctx.snapshotTs).
    const identity = !this.peeked
      ? this.startTs
      : notified.length === 0 && this.env.stampsOne && this.oneStep(rows.length)
        ? STAMP
        : await this.drawnIdentity();
    if (notified.length === 0) return this.commitRows(rows, signal, identity);
    // Weak notifications on rows this transaction does not write are marked before the
    // commit point (a client crash after it loses none); rows it writes get theirs in the
    // prewrite CAS. After the commit point every mark is raised to commitTs, so a worker
    // that ran below commitTs (and so missed our writes) runs again.
    const notifyOnly = notified.filter((n) => !this.mutations.has(rowId(n.table, n.row)));
    if (notifyOnly.length > 0) await markNotifications(this.env, notifyOnly, this.startTs);
    const commitTs = await this.commitRows(rows, signal, identity);
    // After the commit point: a mark that fails is raised again in the background.
    await markNotifications(this.env, notified, commitTs).catch(() =>
      raiseMarksLater(this.env, notified, commitTs),
    );
    return commitTs;
  }

  private rowMutations(): RowMutations[] {
    const rows: RowMutations[] = [];
    for (const [id, m] of this.mutations) {
      // Fields named, not spread: a spread copies through a slow path on every commit.
      rows.push({ table: m.table, row: m.row, cells: m.cells, notify: this.notifications?.get(id)?.columns });
    }
    return rows;
  }

  /**
   * Whether this transaction can be one stamped CAS with no start timestamp drawn first: it
   * read nothing (no start timestamp yet), writes one row (or rows one stamped CAS of many
   * rows takes), and marks no notification with
   * `tx.notify` (a mark written apart from its writes, at its start timestamp). An observed
   * column it writes gets its notification in the same CAS, stamped like its record.
   */
  private stampsItsStart(): boolean {
    if (this.ts !== undefined || this.starting !== undefined || !this.env.stampsOne) {
      return false;
    }
    const rows = this.mutations.size;
    // Nothing written: nothing to stamp (a transaction that read and wrote nothing draws its
    // start timestamp as any other, and commits with no store call).
    if (rows === 0) return false;
    return this.oneStep(rows) && (this.notifications?.size ?? 0) === 0;
  }

  /** Whether a commit of `rows` rows goes in one stamped step (with `stampsOne`). */
  private oneStep(rows: number): boolean {
    return rows === 1 || (this.env.stampsMany && rows <= this.env.onePhaseMaxRows);
  }

  private async commitRows(
    rows: RowMutations[],
    signal: AbortSignal | undefined,
    startTs: number = this.startTs,
    oneStep = true,
  ): Promise<number> {
    this.commitTookRows = true;
    // A peeked snapshot is not the identity: the conflict check is against it (4.10).
    const snapshotTs = this.peeked && startTs !== this.ts ? this.ts : undefined;
    // Set on every attempt: a one-step try (STAMP) may fall back to a drawn identity equal
    // to the snapshot, which is then no identity apart from it.
    this.identity = snapshotTs !== undefined ? startTs : undefined;
    // A deterministic primary: the first row in (table, key) order.
    rows.sort((a, b) => (a.table === b.table ? compareKeys(a.row, b.row) : a.table < b.table ? -1 : 1));
    const first = rows[0]!;
    const ctx: CommitContext = {
      env: this.env,
      startTs,
      snapshotTs,
      rows,
      primary: { table: first.table, row: first.row, column: first.cells.keys().next().value! },
      knownRows: this.knownRows,
      decodedRows: this.decodedRows,
      transaction: this,
      crashed: undefined,
      prewriteSent: false,
      signal,
      trace: this.ref,
    };
    const stamps = this.env.stampsOne;
    // Where a step of several rows costs the store about what one row's does, a single row
    // goes that way too: the values its commit moves out of the head row ride in the step
    // (one-phase.ts; capability stampedManyForOneRow).
    const many = this.env.stampsMany && (this.env.oneRowCarriesMoves || rows.length > 1);
    if (rows.length === 1 && stamps && !many) {
      return timed(
        ctx,
        'onePhase',
        1,
        () => commitOnePhase(ctx),
        (commitTs) => commitTs,
      );
    }
    if (many && oneStep && (rows.length === 1 ? stamps : rows.length <= this.env.onePhaseMaxRows)) {
      const commitTs = await timed(
        ctx,
        'onePhase',
        rows.length,
        () => commitOnePhaseMany(ctx),
        (commitTs) => commitTs,
      );
      // Too large for one step of this store: nothing was written.
      if (commitTs !== undefined) return commitTs;
      // A blind write never drew a start timestamp, and a peeked snapshot is no identity
      // (4.10): two phases need one.
      if (startTs === STAMP) {
        const identity = await this.env.oracle.next();
        this.ts ??= identity;
        return this.commitRows(rows, signal, identity, false);
      }
    }
    return commitTransaction(ctx);
  }

  private viewCell(table: string, column: string, cell: Cell | undefined): CellView {
    if (!cell) return { value: undefined };
    // A lock at or below our snapshot may belong to a commit below it: never ignore it.
    // (A peeked snapshot shares its timestamp; a lock at exactly it commits above it.)
    if (
      cell.lock &&
      (cell.lock.startTs < this.startTs || (cell.lock.startTs === this.startTs && !this.peeked))
    )
      return { lock: cell.lock };
    if (this.startTs <= cell.prunedThrough) {
      throw new SnapshotTooOldError(
        `snapshot ${this.startTs} is older than the kept history of ${table}/${column} (pruned through ${cell.prunedThrough})`,
      );
    }
    const record = visibleWrite(cell, this.startTs);
    if (record?.kind !== 'put') return { value: undefined };
    if (record.value === 'moved') return { moved: record.startTs, block: blockOf(record) };
    const value = cell.valueAt(record.startTs);
    if (!value)
      throw new CorruptRowError(
        `${table}/${column} has a commit record at ${record.commitTs} without its value`,
      );
    return { value };
  }

  /** All visible columns of one scanned row, resolving locks (and re-reading) as needed. */
  private async visibleColumns(
    table: string,
    key: string,
    first: StoredRow,
  ): Promise<Map<string, Uint8Array>> {
    let stored: StoredRow | null = first;
    let waitStart = 0; // when a lock was first met, as in readCells
    const gone = new Set<string>();
    let met: Lock | undefined;
    const { lifecycle } = this.env;
    lifecycle.readStarted();
    try {
      for (let attempt = 0; ; attempt++) {
        this.remember(table, key, stored);
        const columns = new Map<string, Uint8Array>();
        if (!stored) {
          if (met) this.waited(table, key, met, waitStart, undefined);
          return columns;
        }
        const state: RowState = decodeRowAt(stored.state, table, key);
        let blocking: Lock | undefined;
        const moved: { column: string; view: CellView }[] = [];
        for (const [column, cell] of state.cells) {
          const view = this.viewCell(table, column, cell);
          if ('lock' in view) {
            blocking = view.lock;
            break;
          }
          if (isReservedColumn(column)) continue;
          if ('moved' in view) moved.push({ column, view });
          else if (view.value) columns.set(column, view.value.slice());
        }
        if (blocking) {
          if (met === undefined) waitStart = performance.now();
          met = blocking;
          await this.settleLock(table, key, blocking, attempt, waitStart);
        } else {
          const values = await Promise.all(
            moved.map((m) => this.valueOf(table, key, m.column, m.view, gone)),
          );
          if (!values.includes(GONE)) {
            for (const [i, m] of moved.entries()) columns.set(m.column, values[i] as Uint8Array);
            if (met) this.waited(table, key, met, waitStart, undefined);
            return columns;
          }
        }
        this.checkStop();
        stored = await this.untilAborted(this.env.reader.read(table, key));
      }
    } catch (error) {
      if (met) this.waited(table, key, met, waitStart, error);
      throw error;
    } finally {
      lifecycle.readEnded();
    }
  }

  /**
   * A scan's next page. Between pages and rows the caller runs its own code: the
   * transaction may have been committed, the client closed or the signal fired since, and
   * the scan stops there with ClosedError or AbortedError (it would read on after a commit
   * without this transaction's own writes, which the commit let go).
   */
  private async scanPage(table: string, options: ScanOptions): Promise<ScannedStoredRow[]> {
    this.scanGoesOn();
    const { lifecycle } = this.env;
    lifecycle.readStarted();
    try {
      return await this.untilAborted(this.env.store.scan!(table, options));
    } finally {
      lifecycle.readEnded();
    }
  }

  /** A scan resumed by its caller goes on only while the transaction is active and not aborted. */
  private scanGoesOn(): void {
    this.assertActive();
    this.checkStop();
  }

  /** Resolve a lock, or wait (bounded) while its owner may still be committing. */
  private async settleLock(
    table: string,
    row: string,
    lock: Lock,
    attempt: number,
    waitStart: number,
  ): Promise<void> {
    // A lock of a commit this client has in flight: wait for that commit to finish (it
    // holds its locks for a round trip or two), then read again. No round trip to its
    // primary, no backoff sleep longer than the lock lives. Past lockWaitMs, the usual way.
    const local = this.env.localCommits.finished(lock.startTs);
    const left = this.env.lockWaitMs - (performance.now() - waitStart);
    if (local && left > 0) {
      await this.env.lifecycle.pause(left, this.signal, local);
      this.checkStopWaiting();
      return;
    }
    const resolved =
      (await this.untilAborted(resolveLock(this.env, table, row, lock, this.ref, 'read'))) !== 'alive';
    // Resolved once is the common case. Resolved again and again means our re-reads keep
    // seeing the lock (a lagging store, or a stream of new owners): back off all the same.
    if (resolved && attempt < 2) return;
    const remaining = this.env.lockWaitMs - (performance.now() - waitStart);
    if (remaining <= 0) {
      throw new LockNotResolvedError(
        `${table}/${shownName(row)} stayed locked by live transaction ${lock.startTs}; retry later`,
      );
    }
    // The backoff ends at the deadline at the latest: the read then goes once more (a
    // re-read and its primary's fate) and gives up if the lock still lives. Uncapped, the
    // last backoff (up to a quarter of the TTL) ran past lockWaitMs: a reader with
    // lockWaitMs 1000 gave up after up to 2 s (found by a user following the docs).
    await this.env.lifecycle.pause(
      Math.min(remaining, backoffMs(attempt, 5, Math.max(10, this.env.lockTtlMs / 4))),
      this.signal,
    );
    this.checkStopWaiting();
  }

  /** After a lock wait: as checkStop, and a close() that has begun ends the wait too. */
  private checkStopWaiting(): void {
    this.checkStop();
    if (this.env.lifecycle.stopping) throw new ClosedError('this Percolator client is closing');
  }

  /**
   * Reads and lock waits stop at once when the caller aborts, and at their next step once
   * the client is closed (close() waits for the reads in flight: lifecycle.readStarted).
   */
  private checkStop(): void {
    if (this.signal?.aborted) throw abortedError(this.signal);
    if (this.env.lifecycle.closed) throw new ClosedError('this Percolator client is closed');
  }

  /**
   * `work` (a read, settling a lock), or AbortedError as soon as the caller's signal aborts,
   * whichever comes first: a store that keeps failing keeps its retries going for seconds,
   * and the caller asked to stop now. The work itself goes on: a read, or a lock settled as
   * any reader would settle it, is harmless done or not. It is kept with the client's
   * background work (close() waits for it), its outcome dropped. Without a signal, `work`.
   */
  private untilAborted<T>(work: Promise<T>): Promise<T> {
    const signal = this.signal;
    if (!signal) return work;
    const abandon = () => keepInBackground(this.env.background, work.then(noop, noop));
    if (signal.aborted) {
      abandon();
      return Promise.reject(abortedError(signal));
    }
    return new Promise<T>((resolve, reject) => {
      const stop = onAbort(signal, () => {
        abandon();
        reject(abortedError(signal));
      });
      work.then(
        (value) => {
          stop();
          resolve(value);
        },
        (error: unknown) => {
          stop();
          reject(error);
        },
      );
    });
  }

  /**
   * Notes a row as read: the expected version of this transaction's first CAS on it, and the
   * client's guess for later writes (row-cache.ts). A read-only transaction writes nothing,
   * so it notes nothing (on a busy read path that bookkeeping cost about a tenth of a read).
   * Returns the row's id where it noted it.
   */
  private remember(table: string, row: string, stored: StoredRow | null): string | undefined {
    if (this.readOnly || this.commitTookRows) return undefined;
    const id = rowId(table, row);
    this.knownRows.set(id, stored);
    this.env.rowCache?.set(table, row, stored);
    return id;
  }

  /** One head row, read with the start timestamp if it is not drawn yet. */
  private readRow(table: string, row: string): Promise<StoredRow | null> {
    return this.ts === undefined ? this.firstRead(table, row) : this.env.reader.read(table, row);
  }

  private async readAndRemember(table: string, row: string): Promise<StoredRow | null> {
    const stored = await this.readRow(table, row);
    this.remember(table, row, stored);
    return stored;
  }

  /**
   * A read before the start timestamp is known. Where the store can, the reads issued in
   * the same tick go out with the timestamp in one round trip (`readStamped`: the counter
   * first, then the reads, in one atomic step), so they see every commit below it.
   * Otherwise, or if that fails, the timestamp comes from the oracle first.
   */
  private firstRead(table: string, row: string): Promise<StoredRow | null> {
    const peek = this.peeks();
    const counter = peek ? this.env.peekCounter : this.env.stampedReadCounter;
    if ((!peek && counter === undefined) || (this.starting !== undefined && this.firstReads === undefined)) {
      return this.draw().then(() => this.env.reader.read(table, row));
    }
    // A peek draws nothing, so it is the cheaper way under load too. Otherwise the gauge
    // chooses (env.ts, StampedReadGauge), and learns how long its choice took.
    const gauge = this.env.stampedReads;
    const way = peek || this.firstReads !== undefined ? 'idle' : gauge.choose();
    if (way === 'oracle') {
      const since = performance.now();
      return this.draw()
        .then(() => this.env.reader.read(table, row))
        .then((stored) => {
          gauge.record('oracle', performance.now() - since);
          return stored;
        });
    }
    return new Promise((resolve, reject) => {
      if (!this.firstReads) {
        this.firstReads = [];
        // Counted from now: transactions starting meanwhile count the client as under load.
        // A peek writes nothing, so it never does.
        if (!peek) gauge.inFlight++;
        // Anyone who needs the timestamp meanwhile (another read, a commit) waits for this batch.
        const settle = new FirstDraw();
        this.starting = settle;
        const measured = way === 'stamped' ? performance.now() : undefined;
        if (peek) this.drawIdentityAhead();
        queueMicrotask(() => this.sendFirstReads(counter!, settle, peek, measured));
      }
      this.firstReads.push({ table, row, resolve, reject });
    });
  }

  /**
   * A peeked snapshot (`readPeeked`): the counter's value V and the rows as one snapshot.
   * The start timestamp is V + 1: every commit at or below V is seen (visibility is
   * `commitTs < startTs`), and any timestamp drawn later is above V, so its commit is not.
   * Another draw may return V + 1 itself: as a commitTs it is not below the snapshot, so
   * not seen; as a startTs its lock is not waited on (viewCell). Sets `peeked`.
   */
  private async peek(
    refs: readonly { table: string; key: string }[],
  ): Promise<{ timestamp: number; rows: (StoredRow | null)[] }> {
    // Shared with the other transactions of this client that peek in this turn
    // (env.peeks exists exactly when env.peekCounter does, the only way here).
    // The reply's size and counter value were checked on the way (checked-store.ts checks
    // every reply of every store: a wrong one is a non-retryable StoreError).
    const { timestamp, rows } = await this.env.peeks!.peek(refs);
    if (this.ts === undefined) this.peeked = true;
    return { timestamp: timestamp + 1, rows };
  }

  /**
   * With env.identityAhead, for a read-write transaction whose snapshot is being peeked:
   * draws its commit's identity now, beside the peek, so that both cost one round trip
   * (docs/protocol.md 4.10, "Identity ahead"). The identity may come out below the
   * snapshot; the commit checks both (prewrite.ts, applyPrewrite).
   */
  private drawIdentityAhead(): void {
    // Drawn anew with every peek: after a failed peek the next one is later, and an identity
    // far below its snapshot would only widen the window where history pruned on the
    // primary refuses the commit (prewrite.ts).
    if (!this.env.identityAhead || this.readOnly) return;
    const draw = this.env.oracle.next();
    // A failed draw is not this transaction's failure yet: its commit draws again. Kept as
    // background work, so close() waits for it: a read-only use of the transaction never
    // takes it, and the client must make no store call once close() has resolved.
    keepInBackground(this.env.background, draw.then(noop, noop));
    this.identityDraw = draw;
  }

  /** Its commit's identity: the one drawn ahead (once), else one drawn now. */
  private async drawnIdentity(): Promise<number> {
    const ahead = this.identityDraw;
    if (ahead !== undefined) {
      // Taken once: an identity names one commit.
      this.identityDraw = undefined;
      try {
        return await ahead;
      } catch {
        // Drawn again below.
      }
    }
    return this.env.oracle.next();
  }

  private sendFirstReads(
    counter: string,
    settle: FirstDraw,
    peek = false,
    /** A stamped read the gauge chose under load: when it started, to report its time. */
    measuredSince?: number,
  ): void {
    const batch = this.firstReads!;
    this.firstReads = undefined;
    const refs = batch.map((r) => ({ table: r.table, key: r.row }));
    const gauge = this.env.stampedReads;
    const fail = (failure: unknown): void => {
      // A failure that retrying cannot fix (credentials, bad input) ends the reads here.
      if (!oracleMayServe(failure)) {
        this.starting = undefined;
        settle.reject(failure);
        for (const r of batch) r.reject(failure);
        return;
      }
      // Reads change nothing: after a failed stamped read, take the timestamp from the
      // oracle and read again the usual way (the rows are read after it is drawn).
      if (measuredSince !== undefined) gauge.recordFailure(performance.now() - measuredSince);
      this.env.oracle.next().then(
        (ts) => {
          this.ts = ts;
          settle.resolve(ts);
          for (const r of batch) this.env.reader.read(r.table, r.row).then(r.resolve, r.reject);
        },
        (error: unknown) => {
          this.starting = undefined; // a later read may try again
          settle.reject(error);
          for (const r of batch) r.reject(error);
        },
      );
    };
    // One handler pair (on the store's own promise, or handed to the shared peek), no async
    // frame between: a read-only transaction's whole read is a few microseconds of client
    // CPU, and each frame is a promise and its turns.
    // Never throws: anything that goes wrong in it goes to `fail`, as a `.catch` after it
    // would have taken it (the shared peek calls it directly, among other transactions').
    const ok = (reply: { readonly timestamp: number; readonly rows: (StoredRow | null)[] }) => {
      try {
        // Checked on the way, as every reply (checked-store.ts): one row per ref, a timestamp.
        const { timestamp, rows } = reply;
        // A peek answers the counter's value V; the snapshot is V + 1 (see `peek`).
        const ts = peek ? timestamp + 1 : usableTimestamp('readStamped', timestamp);
        if (peek && this.ts === undefined) this.peeked = true;
        this.ts = ts;
        if (measuredSince !== undefined) gauge.record('stamped', performance.now() - measuredSince);
        settle.resolve(ts);
        for (let i = 0; i < batch.length; i++) batch[i]!.resolve(rows[i]!);
      } catch (error) {
        fail(error);
      }
    };
    if (peek) this.env.peeks!.request(refs, ok, fail);
    else
      this.env.store.readStamped!(refs, counter)
        .finally(() => gauge.inFlight--)
        .then(ok, fail);
  }

  private buffer(table: string, row: string, column: string, value: Uint8Array | null, user = true): void {
    this.assertWritable();
    validateUserTable(table);
    validateRowKey(row);
    if (user) {
      validateColumn(column);
      rejectReserved(column);
    }
    const id = rowId(table, row);
    let m = this.mutations.get(id);
    if (!m) {
      m = { table, row, cells: new Map() };
      this.mutations.set(id, m);
    }
    m.cells.set(column, value);
  }

  private maxValueBytes(): number {
    // While a value is rewritten its head row holds two values (the current one and the
    // pending one of the lock) plus records: a value that fits can always be rewritten.
    return Math.min(
      1024 * 1024,
      Math.max(0, Math.floor((this.env.store.capabilities.maxStateBytes - 4096) / 2)),
    );
  }

  private assertActive(): void {
    if (this.status !== 'active')
      throw new ClosedError(`transaction ${this.ts ?? '(not started)'} is ${this.status}`);
    if (this.env.lifecycle.closed) throw new ClosedError('this Percolator client is closed');
  }

  /** A read-only transaction buffers nothing: a write is a typed error, and changes nothing. */
  private assertWritable(): void {
    if (this.readOnly)
      throw new UnsupportedOperationError('this transaction is read-only (readOnly: true): it cannot write');
  }
}

/** The outcome events report for a transaction that ended with `error`. */
function outcomeOf(error: unknown): TransactionOutcome {
  if (error instanceof ConflictError) return 'conflict';
  if (error instanceof SnapshotTooOldError) return 'snapshotTooOld';
  if (error instanceof LockNotResolvedError) return 'lockNotResolved';
  if (error instanceof AbortedError) return 'aborted';
  if (error instanceof CommitUnknownError) return 'commitUnknown';
  if (error instanceof PercolatorError) return 'failed';
  // Anything else came from the caller's own code (db.transact's function).
  return 'rolledBack';
}

function rejectReserved(column: string): void {
  if (isReservedColumn(column)) {
    throw new InvalidArgumentError('column names starting with "\\u0000percolator:" are reserved');
  }
}

/**
 * After a failed stamped read or peek, whether the oracle may give the start timestamp
 * instead: reads change nothing, so any failure qualifies except one that retrying cannot
 * fix (credentials, bad input).
 */
function oracleMayServe(failure: unknown): boolean {
  return !(failure instanceof PercolatorError) || failure.retryable;
}

/**
 * How many tables the rows name: a short list while they are few (most transactions: no Set
 * per transaction with a listener), a Set past 8.
 */
function distinctTables(rows: Iterable<{ readonly table: string }>): number {
  const few: string[] = [];
  let many: Set<string> | undefined;
  for (const { table } of rows) {
    if (many) many.add(table);
    else if (!few.includes(table)) {
      few.push(table);
      if (few.length > 8) many = new Set(few);
    }
  }
  return many ? many.size : few.length;
}

/** A scanned row: its visible columns with the transaction's own writes (`own`) over them. */
function overlay(
  row: string,
  own: ReadonlyMap<string, Uint8Array | null> | undefined,
  columns: Map<string, Uint8Array>,
): ScannedRow | undefined {
  if (own) {
    for (const [column, value] of own) {
      // A copy, as `get` gives: the caller may keep or change it.
      if (value) columns.set(column, value.slice());
      else columns.delete(column);
    }
  }
  return columns.size > 0 ? { row, columns } : undefined;
}
