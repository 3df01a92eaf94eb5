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
import { isolationSql, type SqlIsolation } from './postgres.js';

/** The part of mysql2/promise the bench uses. */
interface MySqlConnection {
  query(sql: string, values?: unknown): Promise<[unknown, unknown]>;
  release(): void;
  destroy(): void;
  /** The underlying connection (the promise wrapper is new on every checkout). */
  readonly connection?: object;
}
interface MySqlPool {
  getConnection(): Promise<MySqlConnection>;
  query(sql: string, values?: unknown): Promise<[unknown, unknown]>;
  end(): Promise<void>;
}
interface MySqlModule {
  createPool(options: {
    uri: string;
    connectionLimit: number;
    charset: string;
    connectTimeout: number;
  }): MySqlPool;
}

const TABLE_NAME = /^[a-z][a-z0-9_]{0,63}$/;
const LOAD_CHUNK = 500;

/**
 * The native baseline's data in MySQL/MariaDB: one InnoDB table `<ns>_native`, dropped at
 * the end. One per isolation level (`sibling`, on the same pool): cells on the same data
 * cannot take turns (runner.ts), and each level's cells must take turns with Percolator's.
 */
export class MySqlNativeData {
  private constructor(
    readonly pool: MySqlPool,
    readonly tableName: string,
    /** Whether drop() ends the pool (the first data made on it; its siblings share it). */
    private readonly ownsPool: boolean,
    /** The isolation level each pooled connection's session is set to (shared by siblings). */
    readonly levels: WeakMap<object, SqlIsolation> = new WeakMap(),
  ) {}

  static async create(url: string, tableName: string, poolSize: number): Promise<MySqlNativeData> {
    if (!TABLE_NAME.test(tableName)) throw new Error(`bad table name ${tableName}`);
    const mysql = loadDriver<MySqlModule>('mysql', 'mysql2/promise');
    const pool = mysql.createPool({
      uri: url,
      connectionLimit: poolSize,
      charset: 'utf8mb4',
      connectTimeout: 10_000,
    });
    const data = new MySqlNativeData(pool, tableName, true);
    try {
      await data.createTable();
    } catch (error) {
      await pool.end().catch(() => {});
      throw error;
    }
    return data;
  }

  /** Another table on this data's pool; drop it before this one (which ends the pool). */
  async sibling(tableName: string): Promise<MySqlNativeData> {
    if (!TABLE_NAME.test(tableName)) throw new Error(`bad table name ${tableName}`);
    const data = new MySqlNativeData(this.pool, tableName, false, this.levels);
    await data.createTable();
    return data;
  }

  private async createTable(): Promise<void> {
    await this.pool.query(
      `CREATE TABLE ${this.table} (tbl VARCHAR(16) NOT NULL, k VARCHAR(191) NOT NULL, v VARCHAR(4096) NOT NULL, ` +
        'PRIMARY KEY (tbl, k)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin',
    );
  }

  get table(): string {
    return `\`${this.tableName}\``;
  }

  async load(table: LogicalTable, entries: ReadonlyArray<readonly [string, string]>): Promise<void> {
    for (let i = 0; i < entries.length; i += LOAD_CHUNK) {
      const rows = entries.slice(i, i + LOAD_CHUNK).map(([k, v]) => [table, k, v]);
      await this.pool.query(`INSERT INTO ${this.table} (tbl, k, v) VALUES ?`, [rows]);
    }
  }

  async snapshot(table: LogicalTable): Promise<Map<string, string>> {
    const [rows] = await this.pool.query(`SELECT k, v FROM ${this.table} WHERE tbl = ?`, [table]);
    return new Map((rows as { k: string; v: string }[]).map((r) => [String(r.k), String(r.v)]));
  }

  /** e.g. "MariaDB 10.11.6" (for the report). */
  async serverVersion(): Promise<string> {
    const [rows] = await this.pool.query('SELECT VERSION() AS v');
    const v = String((rows as { v?: unknown }[])[0]?.v ?? '?');
    return /mariadb/i.test(v) ? `MariaDB ${v.split('-')[0]}` : `MySQL ${v}`;
  }

  async drop(): Promise<void> {
    try {
      await this.pool.query(`DROP TABLE IF EXISTS ${this.table}`);
    } finally {
      if (this.ownsPool) await this.pool.end();
    }
  }
}

/** Deadlock (1213), lock wait timeout (1205), MariaDB's snapshot-isolation "record has changed" (1020). */
function retryable(error: unknown): boolean {
  const errno = (error as { errno?: unknown } | null)?.errno;
  return errno === 1213 || errno === 1205 || errno === 1020;
}

class MySqlTx implements KvTx {
  readonly writes: [LogicalTable, readonly [string, string]][] = [];
  constructor(
    private readonly conn: MySqlConnection,
    private readonly table: string,
    private readonly counter: CallCounter,
  ) {}

  async read(
    table: LogicalTable,
    keys: readonly string[],
    options?: ReadOptions,
  ): Promise<(string | undefined)[]> {
    this.counter.add(1);
    // REPEATABLE READ in InnoDB reads a snapshot but writes over the latest version, so a
    // plain read-modify-write can lose an update: rows about to be written are locked.
    const [rows] = await trackCall(() =>
      this.conn.query(
        `SELECT k, v FROM ${this.table} WHERE tbl = ? AND k IN (?)${options?.forUpdate ? ' FOR UPDATE' : ''}`,
        [table, keys],
      ),
    );
    const found = new Map((rows as { k: string; v: string }[]).map((r) => [String(r.k), String(r.v)]));
    return keys.map((k) => found.get(k));
  }

  write(table: LogicalTable, entries: ReadonlyArray<readonly [string, string]>): void {
    for (const entry of entries) this.writes.push([table, entry]);
  }

  async flush(): Promise<void> {
    const rows: string[][] = [];
    for (const [table, entries] of groupByTable(this.writes))
      for (const [k, v] of entries) rows.push([table, k, v]);
    if (rows.length === 0) return;
    this.counter.add(1);
    await trackCall(() =>
      this.conn.query(
        `INSERT INTO ${this.table} (tbl, k, v) VALUES ? ON DUPLICATE KEY UPDATE v = VALUES(v)`,
        [rows],
      ),
    );
  }
}

/**
 * InnoDB's own transactions: START TRANSACTION (the session's isolation level is set once
 * per connection); the reads, with FOR UPDATE on rows the transaction will write; one
 * INSERT ... ON DUPLICATE KEY UPDATE for the writes; COMMIT. Deadlocks and lock timeouts
 * run the whole function again.
 */
export class MySqlNativeEngine implements Engine {
  readonly mode = 'native';
  readonly maxRowsPerTxn = Number.POSITIVE_INFINITY;
  readonly singleRowOnly = false;
  readonly dataKey: string;
  private readonly counter = new CallCounter();
  /** Attempts InnoDB aborted as deadlocks (1213; it detects them at once) or lock wait timeouts (1205). */
  private deadlocks = 0;

  constructor(
    private readonly data: MySqlNativeData,
    readonly variant: SqlIsolation,
    private readonly maxAttempts: number,
  ) {
    this.dataKey = `native:mysql:${data.tableName}`;
  }

  /** Connections are shared by both engines: set this engine's level whenever it differs (not counted). */
  private async prepare(conn: MySqlConnection): Promise<void> {
    const id = conn.connection ?? conn;
    if (this.data.levels.get(id) === this.variant) return;
    await conn.query(`SET SESSION TRANSACTION ISOLATION LEVEL ${isolationSql(this.variant)}`);
    await conn.query('SET SESSION innodb_lock_wait_timeout = 10');
    this.data.levels.set(id, this.variant);
  }

  async transact<T>(fn: (tx: KvTx) => Promise<T>, _hints?: TxHints): Promise<TxOutcome<T>> {
    const conn = await this.data.pool.getConnection();
    let broken = false;
    try {
      await this.prepare(conn);
      const retry = (error: unknown) => {
        const errno = (error as { errno?: unknown } | null)?.errno;
        if (errno === 1213 || errno === 1205) this.deadlocks++;
        return retryable(error);
      };
      return await retryTransaction(this.maxAttempts, retry, async () => {
        const tx = new MySqlTx(conn, this.data.table, this.counter);
        this.counter.add(1);
        await trackCall(() => conn.query('START TRANSACTION'));
        try {
          const value = await fn(tx);
          await tx.flush();
          this.counter.add(1);
          await trackCall(() => conn.query('COMMIT'));
          return value;
        } catch (error) {
          this.counter.add(1);
          await trackCall(() => conn.query('ROLLBACK')).catch(() => {
            broken = true;
          });
          throw error;
        }
      });
    } finally {
      if (broken) conn.destroy();
      else conn.release();
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
