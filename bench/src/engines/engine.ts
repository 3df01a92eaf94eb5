import type { IoCounts } from '../counting-store.js';
import type { Mode } from '../types.js';

/**
 * An Engine runs the same logical transactions (read some keys, write some keys) in one
 * mode: through Percolator, as raw single-row adapter calls, or with the store's native
 * transactions. Workloads are written once against this interface.
 */

/**
 * The logical tables: `kv` (YCSB-style records) and `acct` (balances), which every engine
 * holds, and the history workload's cells (Percolator and raw engines only).
 */
export type LogicalTable = 'kv' | 'acct' | 'hist_fresh' | 'hist_long';
export const LOGICAL_TABLES: readonly LogicalTable[] = ['kv', 'acct'];

export interface ReadOptions {
  /**
   * The transaction will write these rows. Stores whose default isolation lets a
   * read-modify-write lose an update (MySQL REPEATABLE READ) lock them (FOR UPDATE);
   * Percolator and the others ignore it.
   */
  readonly forUpdate?: boolean;
}

export interface KvTx {
  /** Values in key order; undefined for a missing key. */
  read(table: LogicalTable, keys: readonly string[], options?: ReadOptions): Promise<(string | undefined)[]>;
  /** Buffered until the transaction commits. */
  write(table: LogicalTable, entries: ReadonlyArray<readonly [string, string]>): void;
}

export interface TxHints {
  /** The transaction only reads (Redis then needs no WATCH). */
  readonly readOnly?: boolean;
}

export interface TxOutcome<T> {
  readonly value: T;
  /** 1 + the number of aborted attempts. */
  readonly attempts: number;
}

/**
 * A transaction that did not commit. `gave-up`: it kept conflicting (nothing applied);
 * `unknown`: it may or may not have applied (commit outcome unknown); `error`: anything else.
 */
export class TxFailure extends Error {
  constructor(
    readonly kind: 'gave-up' | 'unknown' | 'error',
    readonly attempts: number,
    cause: unknown,
  ) {
    super(`${kind}: ${cause instanceof Error ? cause.message : String(cause)}`, { cause });
    this.name = 'TxFailure';
  }
}

export interface Counters {
  /** Store round trips (RowStore calls, statements, or pipelined command groups). */
  readonly roundTrips: number;
  /** Commands sent (differs from round trips only where commands are pipelined). */
  readonly commands: number;
  /** Calls, rows and bytes through the RowStore, by direction (engines on a counted RowStore). */
  readonly io?: IoCounts;
  /** Transactions the store aborted as deadlocks and that were run again (native SQL engines). */
  readonly deadlocks?: number;
}

export interface Engine {
  readonly mode: Mode;
  /** `si`, `cas`, `read-committed`, `repeatable-read`, `serializable`, `watch-multi-exec`, `transact-items`. */
  readonly variant: string;
  /** Engines with the same dataKey share physical data: it is loaded once. */
  readonly dataKey: string;
  /** Most rows one transaction may touch (DynamoDB transactions: 100). */
  readonly maxRowsPerTxn: number;
  /** Only single-row transactions (raw mode). */
  readonly singleRowOnly: boolean;
  transact<T>(fn: (tx: KvTx) => Promise<T>, hints?: TxHints): Promise<TxOutcome<T>>;
  /** A timestamp from the store's oracle (percolator: batched; raw: one counter increment each). */
  nextTimestamp?(): Promise<number>;
  /** Creates the rows (not measured). */
  load(table: LogicalTable, entries: ReadonlyArray<readonly [string, string]>): Promise<void>;
  /** Every row of `table` (not measured; used by the correctness checks while nothing runs). */
  snapshot(table: LogicalTable): Promise<Map<string, string>>;
  counters(): Counters;
  /** Waits for work the engine finishes in the background after a commit returned. */
  settle?(): Promise<void>;
  close(): Promise<void>;
}

export function label(engine: Pick<Engine, 'mode' | 'variant'>): string {
  return engine.mode === 'percolator'
    ? engine.variant === 'si'
      ? 'percolator'
      : `percolator+${engine.variant.replace(/^si\+/, '')}`
    : `${engine.mode}:${engine.variant}`;
}

/** Full-jitter exponential backoff, the same shape the core uses between attempts. */
export function backoffMs(attempt: number, baseMs = 2, capMs = 100): number {
  return Math.random() * Math.min(capMs, baseMs * 2 ** Math.min(attempt, 16));
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** A mutable pair of counters an engine bumps as it talks to its store. */
export class CallCounter implements Counters {
  roundTrips = 0;
  commands = 0;
  add(roundTrips: number, commands = roundTrips): void {
    this.roundTrips += roundTrips;
    this.commands += commands;
  }
}

/**
 * Runs `attempt` until it commits: `retryable(error)` says a failure was a serialization
 * failure / deadlock / lost race, after which the whole transaction function runs again.
 */
export async function retryTransaction<T>(
  maxAttempts: number,
  retryable: (error: unknown) => boolean,
  attempt: () => Promise<T>,
): Promise<TxOutcome<T>> {
  for (let attempts = 1; ; attempts++) {
    try {
      return { value: await attempt(), attempts };
    } catch (error) {
      if (error instanceof TxFailure) throw error;
      if (!retryable(error)) throw new TxFailure('error', attempts, error);
      if (attempts >= maxAttempts) throw new TxFailure('gave-up', attempts, error);
      await sleep(backoffMs(attempts));
    }
  }
}

/** The store key a native table uses for a logical row. */
export function nativeKey(table: LogicalTable, key: string): string {
  return `${table}/${key}`;
}

export function groupByTable<T>(entries: ReadonlyArray<readonly [LogicalTable, T]>): Map<LogicalTable, T[]> {
  const out = new Map<LogicalTable, T[]>();
  for (const [table, item] of entries) {
    let list = out.get(table);
    if (!list) out.set(table, (list = []));
    list.push(item);
  }
  return out;
}
