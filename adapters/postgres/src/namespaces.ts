import { checkOptionKeys, InvalidArgumentError, type OptionKeys } from '@percolator/core';
import { NAMESPACE_PATTERN } from '@percolator/core/kit';
import { resolvePostgresUrl } from './env.js';
import { connectError, readError, writeError } from './errors.js';
import { createPgPool, guardClientErrors, type PgPool, type PgPoolClient } from './pg.js';
import { postgresNames, schemaLockKey } from './schema.js';

/*
 * Listing and dropping namespaces, for operators (the conformance CLI's `namespaces` and
 * `drop-namespace`). A namespace is the set of objects schema.ts creates in the
 * connection's current schema: tables `<ns>_rows` and `<ns>_counters`, sequence
 * `<ns>_version_seq`. Only objects with that name AND that shape count (a rows table has
 * the columns tbl, key, version, state, notified; a counters table name, value), so an
 * application table that merely ends in "_rows" is neither listed nor dropped. A namespace
 * is listed when one of its tables is there; half-dropped leftovers are listed too.
 */

export interface PostgresNamespace {
  readonly namespace: string;
  /** Its objects that exist, e.g. ["ns_counters", "ns_rows", "ns_version_seq"]. */
  readonly objects: string[];
  /** Whether every object the schema creates is there. */
  readonly complete: boolean;
}

export interface PostgresNamespaceOptions {
  /** Default: $PERCOLATOR_POSTGRES_URL or postgres://postgres@127.0.0.1:5432/test. */
  readonly connectionString?: string;
  /** A pool you own (left open). */
  readonly pool?: PgPool;
  /** How long the drop waits for locks held by clients still using the namespace (default 10000 ms). */
  readonly lockTimeoutMs?: number;
}

const OPTION_KEYS: OptionKeys<PostgresNamespaceOptions> = {
  connectionString: true,
  pool: true,
  lockTimeoutMs: true,
};

type Kind = 'rows' | 'counters' | 'version_seq';
const KINDS: readonly Kind[] = ['rows', 'counters', 'version_seq'];
const TABLE_COLUMNS: Record<Exclude<Kind, 'version_seq'>, readonly string[]> = {
  rows: ['tbl', 'key', 'version', 'state', 'notified'],
  counters: ['name', 'value'],
};

/**
 * Candidate objects of the current schema: any name ending in a namespace suffix, with its
 * kind and columns. The pattern is a bound value; the JavaScript side decides.
 */
const CATALOG_SQL = `SELECT c.relname AS name, c.relkind AS kind,
  ARRAY(SELECT a.attname::text FROM pg_attribute a
        WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped) AS columns
FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
WHERE s.nspname = current_schema() AND c.relkind IN ('r', 'p', 'S') AND c.relname ~ $1
ORDER BY c.relname`;
const CATALOG_PATTERN = '^[a-z][a-z0-9_]*_(rows|counters|version_seq)$';

interface CatalogRow {
  readonly name: string;
  readonly kind: string;
  readonly columns: string[];
}

/** The namespace and kind an object belongs to, or undefined if it is not one of ours. */
function classify(row: CatalogRow): { namespace: string; kind: Kind } | undefined {
  for (const kind of KINDS) {
    const suffix = `_${kind}`;
    if (!row.name.endsWith(suffix)) continue;
    const namespace = row.name.slice(0, -suffix.length);
    if (!NAMESPACE_PATTERN.test(namespace)) return undefined;
    if (kind === 'version_seq') return row.kind === 'S' ? { namespace, kind } : undefined;
    if (row.kind === 'S') return undefined;
    const has = new Set(row.columns);
    return TABLE_COLUMNS[kind].every((c) => has.has(c)) ? { namespace, kind } : undefined;
  }
  return undefined;
}

function group(rows: readonly CatalogRow[]): PostgresNamespace[] {
  const found = new Map<string, Map<Kind, string>>();
  for (const row of rows) {
    const hit = classify(row);
    if (hit === undefined) continue;
    let objects = found.get(hit.namespace);
    if (objects === undefined) found.set(hit.namespace, (objects = new Map()));
    objects.set(hit.kind, row.name);
  }
  const result: PostgresNamespace[] = [];
  for (const [namespace, objects] of [...found].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) {
    // A lone sequence is not enough to call it a namespace.
    if (!objects.has('rows') && !objects.has('counters')) continue;
    result.push({
      namespace,
      objects: [...objects.values()].sort(),
      complete: KINDS.every((k) => objects.has(k)),
    });
  }
  return result;
}

export function validateNamespaceName(namespace: unknown): string {
  if (typeof namespace !== 'string' || !NAMESPACE_PATTERN.test(namespace)) {
    throw new InvalidArgumentError(
      `namespace must match ${NAMESPACE_PATTERN}, got ${JSON.stringify(namespace)}`,
    );
  }
  return namespace;
}

async function withClient<T>(
  options: PostgresNamespaceOptions,
  work: (client: PgPoolClient) => Promise<T>,
): Promise<T> {
  checkOptionKeys('postgres namespaces', options, OPTION_KEYS);
  const pool =
    options.pool ??
    createPgPool({
      connectionString: options.connectionString ?? resolvePostgresUrl(),
      max: 1,
      connectionTimeoutMillis: 10_000,
      application_name: 'percolator:namespaces',
    });
  if (options.pool === undefined) pool.on('error', () => {});
  guardClientErrors(pool);
  try {
    let client: PgPoolClient;
    try {
      client = await pool.connect();
    } catch (error) {
      throw connectError(error);
    }
    try {
      const result = await work(client);
      client.release();
      return result;
    } catch (error) {
      client.release(true);
      throw error;
    }
  } finally {
    if (options.pool === undefined) await pool.end();
  }
}

async function catalog(client: PgPoolClient): Promise<PostgresNamespace[]> {
  const result = await client.query(CATALOG_SQL, [CATALOG_PATTERN]);
  return group(result.rows as unknown as CatalogRow[]);
}

/** The namespaces in the connection's current schema, by name. */
export async function listPostgresNamespaces(
  options: PostgresNamespaceOptions = {},
): Promise<PostgresNamespace[]> {
  return withClient(options, async (client) => {
    try {
      return await catalog(client);
    } catch (error) {
      throw readError('listing namespaces', error);
    }
  });
}

/**
 * Drops one namespace: exactly the objects `listPostgresNamespaces` shows for it, in one
 * transaction under the same advisory lock as schema changes. Resolves to what it dropped
 * (`undefined` when the namespace is not there: nothing is dropped). Identifiers are made
 * only from the validated name and fixed suffixes.
 */
export async function dropPostgresNamespace(
  namespace: string,
  options: PostgresNamespaceOptions = {},
): Promise<PostgresNamespace | undefined> {
  const ns = validateNamespaceName(namespace);
  const lockTimeoutMs = options.lockTimeoutMs ?? 10_000;
  if (!Number.isInteger(lockTimeoutMs) || lockTimeoutMs < 1) {
    throw new InvalidArgumentError(`lockTimeoutMs must be a positive integer, got ${String(lockTimeoutMs)}`);
  }
  return withClient(options, async (client) => {
    try {
      await client.query('BEGIN');
      await client.query(`SET LOCAL lock_timeout = ${lockTimeoutMs}`);
      await client.query('SELECT pg_advisory_xact_lock(hashtext($1))', [schemaLockKey(ns)]);
      const found = (await catalog(client)).find((n) => n.namespace === ns);
      if (found === undefined) {
        await client.query('ROLLBACK');
        return undefined;
      }
      const quoted = (name: string) => `"${name}"`;
      const expected = new Set(KINDS.map((k) => `${ns}_${k}`));
      // Every name comes from the catalog AND equals "<validated ns>_<fixed suffix>".
      const objects = found.objects.filter((o) => expected.has(o));
      const tables = objects.filter((o) => o !== `${ns}_version_seq`);
      if (tables.length > 0) await client.query(`DROP TABLE ${tables.map(quoted).join(', ')}`);
      if (objects.includes(`${ns}_version_seq`))
        await client.query(`DROP SEQUENCE ${quoted(`${ns}_version_seq`)}`);
      // The schema's functions (schema.ts) go with their namespace. They hold no data, so
      // they are not listed among the objects.
      const names = postgresNames(ns);
      await client.query(`DROP FUNCTION IF EXISTS ${names.readStampedSignature}`);
      await client.query(`DROP FUNCTION IF EXISTS ${names.casStampedManySignature}`);
      await client.query('COMMIT');
      return { ...found, objects };
    } catch (error) {
      throw writeError(`dropping namespace ${ns}`, error);
    }
  });
}
