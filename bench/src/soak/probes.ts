/**
 * What the soak measures besides its own counters: server-side connections of the soak's
 * store client, this process's active resources, pending notifications and the size of the
 * history the soak's rows keep.
 */
import {
  inspectHeadRow,
  namedVersionRows,
  type RowRef,
  type RowStore,
  type StoredRow,
  versionTable,
} from '@percolator/core';
import { loadDriver } from '../drivers.js';

/** Counts the soak store's connections as the server sees them. */
export interface ConnectionProbe {
  /** What is counted, for the report. */
  readonly describe: string;
  count(): Promise<number>;
  close(): Promise<void>;
}

interface PgClient {
  connect(): Promise<unknown>;
  query(sql: string, values?: unknown[]): Promise<{ rows: Record<string, unknown>[] }>;
  end(): Promise<void>;
  on(event: 'error', listener: (error: unknown) => void): unknown;
}

/** pg_stat_activity rows with the adapter's application_name for the namespace. */
export async function postgresConnections(url: string, namespace: string): Promise<ConnectionProbe> {
  const pg = loadDriver<{ Client: new (config: object) => PgClient }>('postgres', 'pg');
  const client = new pg.Client({ connectionString: url, application_name: 'percolator-soak-probe' });
  client.on('error', () => {});
  await client.connect();
  const name = `percolator:${namespace}`;
  return {
    describe: `PostgreSQL pg_stat_activity rows with application_name '${name}'`,
    async count() {
      const { rows } = await client.query(
        'SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1',
        [name],
      );
      return Number(rows[0]!.n);
    },
    close: () => client.end(),
  };
}

interface MySqlConnection {
  query(sql: string, values?: unknown[]): Promise<[unknown, unknown]>;
  end(): Promise<void>;
}

/** Runs `statements` on a connection to `url` (without its database), then closes it. */
export async function mysqlAdmin(url: string, statements: readonly string[]): Promise<void> {
  const mysql = loadDriver<{ createConnection(config: object): Promise<MySqlConnection> }>(
    'mysql',
    'mysql2/promise',
  );
  const server = new URL(url);
  server.pathname = '/';
  const connection = await mysql.createConnection({ uri: server.href, connectTimeout: 10_000 });
  try {
    for (const sql of statements) await connection.query(sql);
  } finally {
    await connection.end();
  }
}

/**
 * information_schema.PROCESSLIST rows whose current database is the soak's own (the soak
 * runs MySQL/MariaDB in a database of its own, so its connections can be told apart).
 */
export async function mysqlConnections(url: string, database: string): Promise<ConnectionProbe> {
  const mysql = loadDriver<{ createConnection(config: object): Promise<MySqlConnection> }>(
    'mysql',
    'mysql2/promise',
  );
  const server = new URL(url);
  server.pathname = '/';
  const connection = await mysql.createConnection({ uri: server.href, connectTimeout: 10_000 });
  return {
    describe: `MySQL/MariaDB information_schema.PROCESSLIST rows in database '${database}'`,
    async count() {
      const [rows] = await connection.query(
        'SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE DB = ? AND ID <> CONNECTION_ID()',
        [database],
      );
      return Number((rows as { n: unknown }[])[0]!.n);
    },
    close: () => connection.end(),
  };
}

interface RedisLike {
  connect(): Promise<void>;
  call(...args: string[]): Promise<unknown>;
  quit(): Promise<unknown>;
  disconnect(): void;
  on(event: 'error', listener: (error: unknown) => void): unknown;
}

/** CLIENT LIST entries with the connection name the soak gave its store's client (via the URL). */
export async function redisConnections(url: string, name: string): Promise<ConnectionProbe> {
  const { createRedisClient } = (await import('@percolator/redis')) as unknown as {
    createRedisClient(url: string): RedisLike;
  };
  const client = createRedisClient(url);
  client.on('error', () => {});
  await client.connect();
  return {
    describe: `Redis CLIENT LIST entries named '${name}'`,
    async count() {
      const list = String(await client.call('CLIENT', 'LIST'));
      return list.split('\n').filter((line) => line.includes(` name=${name} `)).length;
    },
    close: async () => {
      await client.quit().catch(() => client.disconnect());
    },
  };
}

/** Sums several probes (a composite store's parts). */
export function sumProbes(probes: readonly ConnectionProbe[]): ConnectionProbe {
  return {
    describe: probes.map((p) => p.describe).join(' + '),
    count: async () => (await Promise.all(probes.map((p) => p.count()))).reduce((a, b) => a + b, 0),
    close: async () => {
      await Promise.all(probes.map((p) => p.close()));
    },
  };
}

export interface Resources {
  /** process.getActiveResourcesInfo() by type. */
  readonly byType: Record<string, number>;
  /** Timeout and Immediate entries. */
  readonly timers: number;
  /** Everything else (sockets, pipes, file requests, ...). */
  readonly handles: number;
  /** TCPSocketWrap and TLSWrap entries: this process's open TCP connections. */
  readonly sockets: number;
}

export function activeResources(): Resources {
  const byType: Record<string, number> = {};
  for (const type of process.getActiveResourcesInfo()) byType[type] = (byType[type] ?? 0) + 1;
  let timers = 0;
  let handles = 0;
  let sockets = 0;
  for (const [type, n] of Object.entries(byType)) {
    if (type === 'Timeout' || type === 'Immediate') timers += n;
    else handles += n;
    if (type === 'TCPSocketWrap' || type === 'TLSWrap') sockets += n;
  }
  return { byType, timers, handles, sockets };
}

/** Keys the notification index lists for `table` (pending notifications), paged. */
export async function pendingNotifications(store: RowStore, table: string): Promise<number> {
  if (!store.scanNotified) return Number.NaN;
  let count = 0;
  let after: string | undefined;
  for (;;) {
    const keys = await store.scanNotified(table, { limit: 500, ...(after !== undefined ? { after } : {}) });
    count += keys.length;
    if (keys.length < 500) return count;
    after = keys[keys.length - 1];
  }
}

function canScan(store: RowStore): boolean {
  return store.capabilities.orderedScan && typeof store.scan === 'function';
}

export interface HistorySize {
  readonly headRows: number;
  readonly headBytes: number;
  readonly versionRows: number;
  readonly versionBytes: number;
}

/**
 * The stored size of the soak's rows: each known head row, and the version rows of its
 * tables. With an ordered scan every version row of the table is counted (one nobody names
 * any more included: that would be a leak); without one, the version rows the head rows
 * name (the only ones that may exist).
 */
export async function historySize(store: RowStore, rows: readonly RowRef[]): Promise<HistorySize> {
  let headRows = 0;
  let headBytes = 0;
  let versionRows = 0;
  let versionBytes = 0;
  const named: RowRef[] = [];
  const heads = await readAll(store, rows);
  heads.forEach((stored, i) => {
    if (!stored) return;
    headRows++;
    headBytes += stored.state.length;
    const { table, key } = rows[i]!;
    if (!canScan(store)) named.push(...namedVersionRows(table, key, inspectHeadRow(stored.state)).named);
  });
  if (canScan(store)) {
    for (const table of new Set(rows.map((r) => r.table))) {
      let after: string | undefined;
      for (;;) {
        const page = await store.scan!(versionTable(table), {
          limit: 500,
          ...(after !== undefined ? { after } : {}),
        });
        for (const { row } of page) {
          versionRows++;
          versionBytes += row.state.length;
        }
        if (page.length < 500) break;
        after = page[page.length - 1]!.key;
      }
    }
  } else {
    for (const stored of await readAll(store, named)) {
      if (!stored) continue;
      versionRows++;
      versionBytes += stored.state.length;
    }
  }
  return { headRows, headBytes, versionRows, versionBytes };
}

/** Reads rows in batches (one round trip each where the store reads many at once). */
async function readAll(store: RowStore, rows: readonly RowRef[]): Promise<(StoredRow | null)[]> {
  const out: (StoredRow | null)[] = [];
  for (let i = 0; i < rows.length; i += 25) {
    const chunk = rows.slice(i, i + 25);
    out.push(
      ...(store.capabilities.batchRead && store.readMany
        ? await store.readMany(chunk)
        : await Promise.all(chunk.map((r) => store.read(r.table, r.key)))),
    );
  }
  return out;
}

/** What historySize counts version rows by, for the report. */
export function historyMethod(store: RowStore): string {
  return canScan(store)
    ? 'head rows of every key the soak writes + every row of their version tables (ordered scan)'
    : 'head rows of every key the soak writes + the version rows they name (no ordered scan)';
}
