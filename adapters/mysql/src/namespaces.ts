import { checkOptionKeys, InvalidArgumentError, type OptionKeys, StoreError } from '@percolator/core';
import { NAMESPACE_PATTERN } from '@percolator/core/kit';
import { type Connection, createConnection, type Pool, type PoolConnection } from 'mysql2/promise';
import { resolveMySqlUrl } from './env.js';
import { connectError, readError, writeError } from './errors.js';
import { schemaLockName } from './schema.js';

/*
 * Listing and dropping namespaces, for operators (the conformance CLI's `namespaces` and
 * `drop-namespace`). A namespace is the set of objects schema.ts creates in the
 * connection's database: tables `<ns>_rows`, `<ns>_counters`, `<ns>_version_blocks` and
 * the procedures `<ns>_stamped_cas_v<N>`, `<ns>_stamped_read_v<N>` and
 * `<ns>_cas_stamped_many_v<N>`. Only objects with that name AND that shape count
 * (the tables' columns; the procedure's comment names percolator), so an application table
 * that merely ends in "_rows" is neither listed nor dropped. A namespace is listed when
 * one of its tables is there; half-dropped leftovers are listed too.
 */

export interface MySqlNamespace {
  readonly namespace: string;
  /**
   * Its objects that exist, e.g. ["ns_cas_stamped_many_v4", "ns_counters", "ns_rows",
   * "ns_stamped_cas_v1", "ns_stamped_read_v1", "ns_version_blocks"].
   */
  readonly objects: string[];
  /** Whether every table the schema creates is there. */
  readonly complete: boolean;
}

export interface MySqlNamespaceOptions {
  /** Default: $PERCOLATOR_MYSQL_URL or mysql://root@127.0.0.1:3306/test. */
  readonly uri?: string;
  /** A pool you own (left open). */
  readonly pool?: Pool;
  /** How long the drop waits for the schema lock, and (without `pool`) for table locks. Default 10 s. */
  readonly lockTimeoutSeconds?: number;
}

const OPTION_KEYS: OptionKeys<MySqlNamespaceOptions> = { uri: true, pool: true, lockTimeoutSeconds: true };

type TableKind = 'rows' | 'counters' | 'version_blocks';
const TABLE_COLUMNS: Record<TableKind, readonly string[]> = {
  rows: ['tbl', 'row_key', 'version', 'state', 'notified'],
  counters: ['name', 'value'],
  version_blocks: ['id', 'allocated_at'],
};
const TABLE_KINDS = Object.keys(TABLE_COLUMNS) as TableKind[];
const PROCEDURE = /^(.+)_(?:stamped_cas|stamped_read|cas_stamped_many|cas_slots[0-9]{1,2})_v[0-9]{1,4}$/;

// Two cheap catalog reads (a correlated subquery over information_schema is slow on MariaDB).
const TABLES_SQL = `SELECT TABLE_NAME AS name FROM information_schema.TABLES
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_TYPE = 'BASE TABLE' AND TABLE_NAME REGEXP ?`;
const COLUMNS_SQL = `SELECT TABLE_NAME AS name, GROUP_CONCAT(COLUMN_NAME SEPARATOR ',') AS columns
FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME REGEXP ?
GROUP BY TABLE_NAME`;
const TABLES_PATTERN = '^[a-z][a-z0-9_]*_(rows|counters|version_blocks)$';
const ROUTINES_SQL = `SELECT ROUTINE_NAME AS name FROM information_schema.ROUTINES
WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_TYPE = 'PROCEDURE' AND ROUTINE_NAME REGEXP ?
  AND ROUTINE_COMMENT LIKE 'percolator %'`;
const ROUTINES_PATTERN =
  '^[a-z][a-z0-9_]*_(stamped_cas|stamped_read|cas_stamped_many|cas_slots[0-9]{1,2})_v[0-9]+$';

type Row = Record<string, unknown>;
type Queryable = Connection | PoolConnection;

function classifyTable(name: string, columns: string): { namespace: string; kind: TableKind } | undefined {
  for (const kind of TABLE_KINDS) {
    const suffix = `_${kind}`;
    if (!name.endsWith(suffix)) continue;
    const namespace = name.slice(0, -suffix.length);
    if (!NAMESPACE_PATTERN.test(namespace)) return undefined;
    const has = new Set(columns.split(','));
    return TABLE_COLUMNS[kind].every((c) => has.has(c)) ? { namespace, kind } : undefined;
  }
  return undefined;
}

async function catalog(connection: Queryable): Promise<MySqlNamespace[]> {
  const [tables] = await connection.query({ sql: TABLES_SQL, values: [TABLES_PATTERN], rowsAsArray: false });
  const [columnRows] = await connection.query({
    sql: COLUMNS_SQL,
    values: [TABLES_PATTERN],
    rowsAsArray: false,
  });
  const columnsOf = new Map((columnRows as Row[]).map((r) => [String(r.name), String(r.columns ?? '')]));
  const [routines] = await connection.query({
    sql: ROUTINES_SQL,
    values: [ROUTINES_PATTERN],
    rowsAsArray: false,
  });
  const found = new Map<string, { tables: Set<TableKind>; objects: string[] }>();
  const entry = (namespace: string) => {
    let e = found.get(namespace);
    if (e === undefined) found.set(namespace, (e = { tables: new Set(), objects: [] }));
    return e;
  };
  for (const row of tables as Row[]) {
    const name = String(row.name);
    const hit = classifyTable(name, columnsOf.get(name) ?? '');
    if (hit === undefined) continue;
    const e = entry(hit.namespace);
    e.tables.add(hit.kind);
    e.objects.push(name);
  }
  for (const row of routines as Row[]) {
    const name = String(row.name);
    const namespace = PROCEDURE.exec(name)?.[1];
    // Only next to a table of the same namespace: a lone procedure is not a namespace.
    if (namespace !== undefined && found.has(namespace)) found.get(namespace)!.objects.push(name);
  }
  return [...found]
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([namespace, e]) => ({
      namespace,
      objects: e.objects.sort(),
      complete: TABLE_KINDS.every((k) => e.tables.has(k)),
    }));
}

export function validateNamespaceName(namespace: unknown): string {
  if (typeof namespace !== 'string' || !NAMESPACE_PATTERN.test(namespace)) {
    throw new InvalidArgumentError(
      `namespace must match ${NAMESPACE_PATTERN}, got ${JSON.stringify(namespace)}`,
    );
  }
  return namespace;
}

async function withConnection<T>(
  options: MySqlNamespaceOptions,
  work: (connection: Queryable) => Promise<T>,
): Promise<T> {
  checkOptionKeys('mysql namespaces', options, OPTION_KEYS);
  let connection: Queryable;
  try {
    connection =
      options.pool !== undefined
        ? await options.pool.getConnection()
        : await createConnection({
            uri: options.uri ?? resolveMySqlUrl(),
            connectTimeout: 10_000,
            charset: 'utf8mb4',
          });
  } catch (error) {
    throw connectError(error);
  }
  // A dying connection may emit 'error'; removed again below, so a pooled connection that
  // serves many calls does not collect one listener per call.
  const onError = () => {};
  connection.on('error', onError);
  let broken = false;
  try {
    return await work(connection);
  } catch (error) {
    broken = true;
    throw error;
  } finally {
    if (options.pool !== undefined) {
      connection.removeListener('error', onError);
      if (broken) (connection as PoolConnection).destroy();
      else (connection as PoolConnection).release();
    } else {
      await (connection as Connection).end().catch(() => connection.destroy());
    }
  }
}

/** The namespaces in the connection's database, by name. */
export async function listMySqlNamespaces(options: MySqlNamespaceOptions = {}): Promise<MySqlNamespace[]> {
  return withConnection(options, async (connection) => {
    try {
      return await catalog(connection);
    } catch (error) {
      throw readError('listing namespaces', error);
    }
  });
}

/**
 * Drops one namespace: exactly the objects `listMySqlNamespaces` shows for it, under the
 * same named lock as schema changes. Resolves to what it dropped (`undefined` when the
 * namespace is not there: nothing is dropped). Identifiers are made only from the
 * validated name and fixed suffixes. DDL is not transactional in MySQL: a failure part way
 * leaves the rest, which a second drop removes.
 */
export async function dropMySqlNamespace(
  namespace: string,
  options: MySqlNamespaceOptions = {},
): Promise<MySqlNamespace | undefined> {
  const ns = validateNamespaceName(namespace);
  const timeout = options.lockTimeoutSeconds ?? 10;
  if (!Number.isInteger(timeout) || timeout < 1) {
    throw new InvalidArgumentError(`lockTimeoutSeconds must be a positive integer, got ${String(timeout)}`);
  }
  const lock = schemaLockName(ns);
  return withConnection(options, async (connection) => {
    let got: unknown;
    try {
      const [rows] = await connection.query({ sql: 'SELECT GET_LOCK(?, ?) AS got', values: [lock, timeout] });
      got = (rows as Row[])[0]?.got;
    } catch (error) {
      throw readError(`locking namespace ${ns}`, error);
    }
    if (Number(got) !== 1) throw new StoreError(`mysql: timed out waiting for lock ${lock}`, 'no');
    try {
      const found = (await catalog(connection)).find((n) => n.namespace === ns);
      if (found === undefined) return undefined;
      const tables = new Set(TABLE_KINDS.map((k) => `${ns}_${k}`));
      const quoted = (name: string) => `\`${name}\``;
      // Every name comes from the catalog AND is "<validated ns>_<fixed suffix>".
      const procedures = found.objects.filter((o) => PROCEDURE.exec(o)?.[1] === ns);
      const dropTables = found.objects.filter((o) => tables.has(o));
      // Not on a pooled connection of yours: the setting would stay with it.
      if (options.pool === undefined) await connection.query(`SET SESSION lock_wait_timeout = ${timeout}`);
      for (const procedure of procedures)
        await connection.query(`DROP PROCEDURE IF EXISTS ${quoted(procedure)}`);
      if (dropTables.length > 0)
        await connection.query(`DROP TABLE IF EXISTS ${dropTables.map(quoted).join(', ')}`);
      return { ...found, objects: [...procedures, ...dropTables].sort() };
    } catch (error) {
      throw writeError(`dropping namespace ${ns}`, error);
    } finally {
      await connection.query('DO RELEASE_LOCK(?)', [lock]).catch(() => {});
    }
  });
}
