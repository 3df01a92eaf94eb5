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
 * `<ns>_version_seq`, functions `<ns>_read_stamped` and `<ns>_cas_stamped_many`. Only
 * objects with that name AND that shape count (a rows table has the columns tbl, key,
 * version, state, notified; a counters table name, value; a function the argument types
 * schema.ts gives it), so an application table that merely ends in "_rows" is neither
 * listed nor dropped. A namespace is listed when one of its tables is there; half-dropped
 * leftovers are listed too. The functions hold no data, but they are listed: the drop
 * removes them, and it drops exactly what the list shows (they were left out of the list
 * and dropped all the same, found by a user).
 */

export interface PostgresNamespace {
  readonly namespace: string;
  /** Its objects that exist, e.g. ["ns_counters", "ns_rows", "ns_version_seq"]. */
  readonly objects: string[];
  /**
   * Whether every table and sequence the schema creates is there (the functions may be
   * missing from a schema made by an older version: the store works without them).
   */
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

/** The schema's functions of the current schema, with their argument types (compared below). */
const FUNCTIONS_SQL = `SELECT p.proname AS name, oidvectortypes(p.proargtypes) AS args
FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace
WHERE s.nspname = current_schema() AND p.proname ~ $1
ORDER BY p.proname`;
const FUNCTIONS_PATTERN = '^[a-z][a-z0-9_]*_(read_stamped|cas_stamped_many)$';

interface FunctionRow {
  readonly name: string;
  readonly args: string;
}

/** `"name"(a, b)` -> `a, b`: the argument types of a signature of postgresNames. */
const argsOf = (signature: string) => signature.slice(signature.indexOf('(') + 1, -1);

/** The namespace a function of the schema belongs to, with its drop signature, or undefined. */
function classifyFunction(row: FunctionRow): { namespace: string; signature: string } | undefined {
  for (const suffix of ['_read_stamped', '_cas_stamped_many'] as const) {
    if (!row.name.endsWith(suffix)) continue;
    const namespace = row.name.slice(0, -suffix.length);
    if (!NAMESPACE_PATTERN.test(namespace)) return undefined;
    const names = postgresNames(namespace);
    const signature = suffix === '_read_stamped' ? names.readStampedSignature : names.casStampedManySignature;
    return row.args === argsOf(signature) ? { namespace, signature } : undefined;
  }
  return undefined;
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

function group(rows: readonly CatalogRow[], functions: readonly FunctionRow[]): PostgresNamespace[] {
  const found = new Map<string, Map<Kind, string>>();
  for (const row of rows) {
    const hit = classify(row);
    if (hit === undefined) continue;
    let objects = found.get(hit.namespace);
    if (objects === undefined) found.set(hit.namespace, (objects = new Map()));
    objects.set(hit.kind, row.name);
  }
  const functionsOf = new Map<string, string[]>();
  for (const row of functions) {
    const hit = classifyFunction(row);
    if (hit !== undefined)
      functionsOf.set(hit.namespace, [...(functionsOf.get(hit.namespace) ?? []), row.name]);
  }
  const result: PostgresNamespace[] = [];
  for (const [namespace, objects] of [...found].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) {
    // A lone sequence (or function) is not enough to call it a namespace.
    if (!objects.has('rows') && !objects.has('counters')) continue;
    result.push({
      namespace,
      objects: [...objects.values(), ...(functionsOf.get(namespace) ?? [])].sort(),
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
  const functions = await client.query(FUNCTIONS_SQL, [FUNCTIONS_PATTERN]);
  return group(result.rows as unknown as CatalogRow[], functions.rows as unknown as FunctionRow[]);
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
      const names = postgresNames(ns);
      const signatures = new Map([
        [`${ns}_read_stamped`, names.readStampedSignature],
        [`${ns}_cas_stamped_many`, names.casStampedManySignature],
      ]);
      const expected = new Set([...KINDS.map((k) => `${ns}_${k}`), ...signatures.keys()]);
      // Every name comes from the catalog AND equals "<validated ns>_<fixed suffix>"; a
      // function is dropped by the signature schema.ts gives it (the one the list matched).
      const objects = found.objects.filter((o) => expected.has(o));
      const tables = objects.filter((o) => o === `${ns}_rows` || o === `${ns}_counters`);
      if (tables.length > 0) await client.query(`DROP TABLE ${tables.map(quoted).join(', ')}`);
      if (objects.includes(`${ns}_version_seq`))
        await client.query(`DROP SEQUENCE ${quoted(`${ns}_version_seq`)}`);
      for (const [name, signature] of signatures)
        if (objects.includes(name)) await client.query(`DROP FUNCTION ${signature}`);
      await client.query('COMMIT');
      return { ...found, objects };
    } catch (error) {
      throw writeError(`dropping namespace ${ns}`, error);
    }
  });
}
