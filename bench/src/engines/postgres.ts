import type { PgPool, PgPoolClient } from '@percolator/postgres';
import { trackCall } from '../critical-path.js';
import { loadDriver } from '../drivers.js';
import {
  CallCounter,
  type Engine,
  groupByTable,
  type KvTx,
  type LogicalTable,
  type ReadOptions,
  retryTransaction,
  type TxHints,
  type TxOutcome,
} from './engine.js';

interface PgModule {
  Pool: new (options: {
    connectionString: string;
    max: number;
    connectionTimeoutMillis?: number;
    application_name?: string;
  }) => PgPool;
}

/** Identifiers are made only from this validated name (never from user input). */
const SCHEMA_NAME = /^[a-z][a-z0-9_]{0,62}$/;
const LOAD_CHUNK = 1000;

/**
 * The isolation levels the SQL baselines run at: READ COMMITTED (PostgreSQL's default,
 * and the cheapest that keeps a transfer correct once the rows it writes are locked as
 * they are read), REPEATABLE READ (MariaDB's default) and SERIALIZABLE.
 */
export const SQL_ISOLATIONS = ['read-committed', 'repeatable-read', 'serializable'] as const;
export type SqlIsolation = (typeof SQL_ISOLATIONS)[number];

/** The SQL words of a level (a fixed string per level: nothing else reaches the statement). */
export function isolationSql(level: SqlIsolation): string {
  switch (level) {
    case 'read-committed':
      return 'READ COMMITTED';
    case 'repeatable-read':
      return 'REPEATABLE READ';
    case 'serializable':
      return 'SERIALIZABLE';
  }
}

/**
 * The native baseline's data in PostgreSQL: a schema of its own holding one plain table
 * `kv (tbl, k, v)`, dropped at the end. One per isolation level (`sibling`, on the same
 * pool): cells on the same data cannot take turns (runner.ts), and each level's cells must
 * take turns with Percolator's, as raw's do.
 */
export class PostgresNativeData {
  private constructor(
    readonly pool: PgPool,
    readonly schema: string,
    /** Whether drop() ends the pool (the first data made on it; its siblings share it). */
    private readonly ownsPool: boolean,
  ) {}

  static async create(url: string, schema: string, poolSize: number): Promise<PostgresNativeData> {
    if (!SCHEMA_NAME.test(schema)) throw new Error(`bad schema name ${schema}`);
    const pg = loadDriver<PgModule>('postgres', 'pg');
    const pool = new pg.Pool({
      connectionString: url,
      max: poolSize,
      connectionTimeoutMillis: 10_000,
      application_name: 'percolator-bench',
    });
    pool.on('error', () => {
      // An idle connection dropped; the next query reports it.
    });
    const data = new PostgresNativeData(pool, schema, true);
    try {
      await data.createTables();
    } catch (error) {
      await pool.end().catch(() => {});
      throw error;
    }
    return data;
  }

  /** Another schema on this data's pool; drop it before this one (which ends the pool). */
  async sibling(schema: string): Promise<PostgresNativeData> {
    if (!SCHEMA_NAME.test(schema)) throw new Error(`bad schema name ${schema}`);
    const data = new PostgresNativeData(this.pool, schema, false);
    await data.createTables();
    return data;
  }

  private async createTables(): Promise<void> {
    await this.run(`CREATE SCHEMA "${this.schema}"`);
    await this.run(
      `CREATE TABLE "${this.schema}".kv (tbl text COLLATE "C" NOT NULL, k text COLLATE "C" NOT NULL, ` +
        'v text NOT NULL, PRIMARY KEY (tbl, k))',
    );
  }

  get table(): string {
    return `"${this.schema}".kv`;
  }

  private async run(text: string, values?: unknown[]) {
    const client = await this.pool.connect();
    try {
      return await client.query(text, values);
    } finally {
      client.release();
    }
  }

  async load(table: LogicalTable, entries: ReadonlyArray<readonly [string, string]>): Promise<void> {
    for (let i = 0; i < entries.length; i += LOAD_CHUNK) {
      const chunk = entries.slice(i, i + LOAD_CHUNK);
      await this.run(
        `INSERT INTO ${this.table} (tbl, k, v) SELECT $1, * FROM unnest($2::text[], $3::text[])`,
        [table, chunk.map(([k]) => k), chunk.map(([, v]) => v)],
      );
    }
  }

  async snapshot(table: LogicalTable): Promise<Map<string, string>> {
    const result = await this.run(`SELECT k, v FROM ${this.table} WHERE tbl = $1`, [table]);
    return new Map(result.rows.map((r) => [String(r.k), String(r.v)]));
  }

  /** e.g. "16.4" (for the report). */
  async serverVersion(): Promise<string> {
    const result = await this.run('SHOW server_version');
    return `PostgreSQL ${String(result.rows[0]?.server_version ?? '?').split(' ')[0]}`;
  }

  async drop(): Promise<void> {
    try {
      await this.run(`DROP SCHEMA IF EXISTS "${this.schema}" CASCADE`);
    } finally {
      if (this.ownsPool) await this.pool.end();
    }
  }
}

const sqlState = (error: unknown) => (error as { code?: unknown } | null)?.code;

/** SQLSTATE 40001 serialization_failure, 40P01 deadlock_detected: run the transaction again. */
function retryable(error: unknown): boolean {
  const code = sqlState(error);
  return code === '40001' || code === '40P01';
}

/**
 * One connection's statements, one at a time: a workload may issue two reads at once
 * (Promise.all), and pg deprecates queueing a query on a busy client. A failed statement
 * does not block the ones after it (ROLLBACK must still go out).
 */
class Serial {
  private tail: Promise<unknown> = Promise.resolve();

  constructor(private readonly client: PgPoolClient) {}

  query(text: string, values?: unknown[]) {
    const next = this.tail.then(
      () => trackCall(() => this.client.query(text, values)),
      () => trackCall(() => this.client.query(text, values)),
    );
    this.tail = next.catch(() => {});
    return next;
  }
}

class SqlTx implements KvTx {
  readonly writes: [LogicalTable, readonly [string, string]][] = [];
  constructor(
    private readonly client: Serial,
    private readonly table: string,
    private readonly counter: CallCounter,
  ) {}

  /**
   * Rows the transaction will write are locked as they are read (FOR UPDATE), in key
   * order, by one statement: two transfers between the same accounts then lock them in the
   * same order and never deadlock. (Locked by the UPDATE instead, in the order of its
   * arguments, they do, and each deadlock waits out deadlock_timeout, 1 s by default,
   * before PostgreSQL breaks it: that, not the isolation level, would be measured.)
   */
  async read(
    table: LogicalTable,
    keys: readonly string[],
    options?: ReadOptions,
  ): Promise<(string | undefined)[]> {
    this.counter.add(1);
    const lock = options?.forUpdate ? ' ORDER BY k FOR UPDATE' : '';
    const result = await this.client.query(
      `SELECT k, v FROM ${this.table} WHERE tbl = $1 AND k = ANY($2::text[])${lock}`,
      [table, keys],
    );
    const found = new Map(result.rows.map((r) => [String(r.k), String(r.v)]));
    return keys.map((k) => found.get(k));
  }

  write(table: LogicalTable, entries: ReadonlyArray<readonly [string, string]>): void {
    for (const entry of entries) this.writes.push([table, entry]);
  }

  /** One UPDATE per logical table (rows exist: the data set is loaded up front). */
  async flush(): Promise<void> {
    for (const [table, entries] of groupByTable(this.writes)) {
      this.counter.add(1);
      await this.client.query(
        `UPDATE ${this.table} AS t SET v = d.v FROM unnest($2::text[], $3::text[]) AS d(k, v) ` +
          'WHERE t.tbl = $1 AND t.k = d.k',
        [table, entries.map(([k]) => k), entries.map(([, v]) => v)],
      );
    }
  }
}

/**
 * PostgreSQL's own transactions: BEGIN ISOLATION LEVEL <level>; the reads (one SELECT per
 * read call, locking the rows it will write FOR UPDATE in key order, so transactions
 * never deadlock); one UPDATE for the writes; COMMIT. Serialization failures and
 * deadlocks run the whole function again, as an application must.
 */
export class PostgresNativeEngine implements Engine {
  readonly mode = 'native';
  readonly maxRowsPerTxn = Number.POSITIVE_INFINITY;
  readonly singleRowOnly = false;
  readonly dataKey: string;
  private readonly counter = new CallCounter();
  /** Attempts PostgreSQL aborted as deadlocks (each waited out deadlock_timeout first). */
  private deadlocks = 0;

  constructor(
    private readonly data: PostgresNativeData,
    readonly variant: SqlIsolation,
    private readonly maxAttempts: number,
  ) {
    this.dataKey = `native:postgres:${data.schema}`;
  }

  async transact<T>(fn: (tx: KvTx) => Promise<T>, _hints?: TxHints): Promise<TxOutcome<T>> {
    const pooled = await this.data.pool.connect();
    const client = new Serial(pooled);
    let broken: Error | undefined;
    try {
      const retry = (error: unknown) => {
        if (sqlState(error) === '40P01') this.deadlocks++;
        return retryable(error);
      };
      return await retryTransaction(this.maxAttempts, retry, async () => {
        const tx = new SqlTx(client, this.data.table, this.counter);
        this.counter.add(1);
        await client.query(`BEGIN ISOLATION LEVEL ${isolationSql(this.variant)}`);
        try {
          const value = await fn(tx);
          await tx.flush();
          this.counter.add(1);
          await client.query('COMMIT');
          return value;
        } catch (error) {
          this.counter.add(1);
          await client.query('ROLLBACK').catch((e: Error) => {
            broken = e;
          });
          throw error;
        }
      });
    } finally {
      pooled.release(broken);
    }
  }

  load(table: LogicalTable, entries: ReadonlyArray<readonly [string, string]>): Promise<void> {
    return this.data.load(table, entries);
  }

  snapshot(table: LogicalTable): Promise<Map<string, string>> {
    return this.data.snapshot(table);
  }

  counters() {
    return {
      roundTrips: this.counter.roundTrips,
      commands: this.counter.commands,
      deadlocks: this.deadlocks,
    };
  }

  async close(): Promise<void> {}
}
