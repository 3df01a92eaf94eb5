import {
  CommitUnknownError,
  CounterOracle,
  isRetryable,
  Percolator,
  type PercolatorOptions,
  StoreError,
  type Transaction,
} from '@percolator/core';
import type { CountingStore } from '../counting-store.js';
import {
  type Engine,
  type KvTx,
  type LogicalTable,
  type ReadOptions,
  TxFailure,
  type TxHints,
  type TxOutcome,
} from './engine.js';

/** The one column every benchmark row uses. */
export const COLUMN = 'v';
const LOAD_CHUNK = 64;
const LOAD_PARALLEL = 4;

const decoder = new TextDecoder();

class PercolatorKvTx implements KvTx {
  constructor(
    private readonly tx: Transaction,
    private readonly prefix: string,
  ) {}

  read(
    table: LogicalTable,
    keys: readonly string[],
    _options?: ReadOptions,
  ): Promise<(string | undefined)[]> {
    // The core has no multi-get: the gets go out together, as an application would send them.
    const physical = this.prefix + table;
    return Promise.all(keys.map((key) => this.tx.getString(physical, key, COLUMN)));
  }

  write(table: LogicalTable, entries: ReadonlyArray<readonly [string, string]>): void {
    const physical = this.prefix + table;
    for (const [key, value] of entries) this.tx.set(physical, key, COLUMN, value);
  }
}

/** Transactions through @percolator/core on a counted store; one client shared by all workers. */
export class PercolatorEngine implements Engine {
  readonly mode = 'percolator';
  /** 'si', or 'si+otel' / 'si+otel-events' for the engines with OpenTelemetry on (`--tracing`). */
  readonly variant: string;
  /** Put before every table name (see the constructor's option). */
  readonly tablePrefix: string;
  readonly maxRowsPerTxn = Number.POSITIVE_INFINITY;
  readonly singleRowOnly = false;
  readonly dataKey: string;
  private readonly db: Percolator;
  private readonly oracle: CounterOracle;

  constructor(
    readonly store: CountingStore,
    private readonly maxAttempts: number,
    /** Client options other than the store (tests shorten lock TTLs). */
    readonly clientOptions: Omit<PercolatorOptions, 'store'> = {},
    options: {
      /**
       * Put before every table name: an engine with its own prefix has its own data, so
       * its cells can be interleaved with another Percolator engine's on the same store.
       */
      readonly tablePrefix?: string;
      /** Default 'si'; the traced engines are 'si+otel', 'si+otel-events'. */
      readonly variant?: string;
    } = {},
  ) {
    this.tablePrefix = options.tablePrefix ?? '';
    const tablePrefix = this.tablePrefix;
    this.variant = options.variant ?? 'si';
    this.dataKey = `percolator:${store.name}:${tablePrefix}`;
    this.db = new Percolator({ ...this.clientOptions, store: this.store });
    // A second client of the same counter: timestamps stay unique across both.
    this.oracle = new CounterOracle(store);
  }

  /** The Percolator client, for workloads that need more than get/set (observers). */
  get client(): Percolator {
    return this.db;
  }

  async transact<T>(fn: (tx: KvTx) => Promise<T>, hints?: TxHints): Promise<TxOutcome<T>> {
    let attempts = 0;
    try {
      const value = await this.db.transact(
        (tx) => {
          attempts++;
          return fn(new PercolatorKvTx(tx, this.tablePrefix));
        },
        { maxAttempts: this.maxAttempts, readOnly: hints?.readOnly === true },
      );
      return { value, attempts };
    } catch (error) {
      throw new TxFailure(classify(error), Math.max(attempts, 1), error);
    }
  }

  nextTimestamp(): Promise<number> {
    return this.oracle.next();
  }

  async load(table: LogicalTable, entries: ReadonlyArray<readonly [string, string]>): Promise<void> {
    const chunks: (readonly (readonly [string, string])[])[] = [];
    for (let i = 0; i < entries.length; i += LOAD_CHUNK) chunks.push(entries.slice(i, i + LOAD_CHUNK));
    let next = 0;
    const loader = async () => {
      while (next < chunks.length) {
        const chunk = chunks[next++]!;
        await this.db.transact(async (tx) => new PercolatorKvTx(tx, this.tablePrefix).write(table, chunk), {
          maxAttempts: 20,
        });
      }
    };
    await Promise.all(Array.from({ length: LOAD_PARALLEL }, loader));
  }

  async snapshot(table: LogicalTable): Promise<Map<string, string>> {
    const out = new Map<string, string>();
    const tx = await this.db.begin();
    try {
      for await (const row of tx.scan(this.tablePrefix + table)) {
        const value = row.columns.get(COLUMN);
        if (value) out.set(row.row, decoder.decode(value));
      }
    } finally {
      await tx.rollback();
    }
    return out;
  }

  /**
   * Waits for the work commits left in the background (secondary commits, the tidy step),
   * so those calls count in the cell that caused them. The client stays: its row cache is
   * what an application's long-lived client has, as the raw engine keeps its versions.
   */
  async settle(): Promise<void> {
    await this.db.flush();
  }

  counters() {
    const total = this.store.total;
    return { roundTrips: total, commands: total, io: this.store.io };
  }

  async close(): Promise<void> {
    await this.db.close();
  }
}

function classify(error: unknown): TxFailure['kind'] {
  if (error instanceof CommitUnknownError) return 'unknown';
  // A store that failed is an error even when retrying might help; only conflicts "give up".
  if (error instanceof StoreError) return error.applied === 'unknown' ? 'unknown' : 'error';
  if (isRetryable(error)) return 'gave-up';
  return 'error';
}
