/**
 * The real backends the integration tests run against, each with a clear failure message
 * naming the environment variable to set (tests never skip a backend).
 *
 * `integration/` is not a package, so drivers the adapters depend on (`pg`) are loaded
 * the way the adapter itself resolves them.
 */
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import {
  assertPostgresReachable,
  createPostgresStore,
  type PgPool,
  type PostgresStore,
  resolvePostgresUrl,
} from '@percolator/postgres';
import { createRedisStore, defaultRedisUrl, type RedisStore } from '@percolator/redis';
import { uniqueNamespace } from '@percolator/testkit';
import { ensurePostgres } from '@percolator/testkit/postgres';
import { assertRedisCluster, connectCluster } from '@percolator/testkit/redis';
import { inject } from 'vitest';

export { uniqueNamespace };

interface PgModule {
  Pool: new (config: {
    connectionString: string;
    max?: number;
  }) => PgPool & {
    query(text: string, values?: unknown[]): Promise<{ rows: Record<string, unknown>[] }>;
    on(event: 'error', listener: (error: Error) => void): unknown;
    end(): Promise<void>;
  };
}
const requireFromPostgresAdapter = createRequire(
  fileURLToPath(new URL('../../../adapters/postgres/package.json', import.meta.url)),
);
export const pg = requireFromPostgresAdapter('pg') as PgModule;

/** The second database for sharding tests (a fixed identifier, never user input). */
export const SHARD2_DATABASE = 'percolator_shard2';
export const POSTGRES_URL_2_ENV = 'PERCOLATOR_POSTGRES_URL_2';

function withDatabase(url: string, database: string): string {
  const parsed = new URL(url);
  parsed.pathname = `/${database}`;
  return parsed.toString();
}

let server: ReturnType<typeof ensurePostgres> | undefined;
/**
 * The PostgreSQL server for this test file: $PERCOLATOR_POSTGRES_URL, else the local
 * default, else a testcontainers server where Docker runs (see @percolator/testkit/postgres).
 */
export async function postgresUrl(): Promise<string> {
  server ??= ensurePostgres();
  return (await server).url;
}

/**
 * The URLs of two different PostgreSQL databases: $PERCOLATOR_POSTGRES_URL (default the
 * local `test` database) and $PERCOLATOR_POSTGRES_URL_2, by default database
 * `percolator_shard2` on the same server, created here if it is missing.
 */
export async function twoPostgresDatabases(): Promise<[string, string]> {
  const first = await postgresUrl();
  const configured = process.env[POSTGRES_URL_2_ENV]?.trim();
  if (configured) return [first, await assertPostgresReachable(configured)];
  const admin = new pg.Pool({ connectionString: withDatabase(first, 'postgres'), max: 1 });
  admin.on('error', () => {});
  try {
    const found = await admin.query('SELECT 1 FROM pg_database WHERE datname = $1', [SHARD2_DATABASE]);
    if (found.rows.length === 0) {
      try {
        await admin.query(`CREATE DATABASE ${SHARD2_DATABASE}`);
      } catch (error) {
        // Another process created it at the same moment.
        const code = (error as { code?: string }).code;
        if (code !== '42P04' && code !== '23505') throw error;
      }
    }
  } catch (error) {
    throw new Error(
      `cannot create database ${SHARD2_DATABASE} next to ${resolvePostgresUrl()} (${(error as Error).message}); ` +
        `create it or set ${POSTGRES_URL_2_ENV} to a second database`,
      { cause: error },
    );
  } finally {
    await admin.end();
  }
  const second = withDatabase(first, SHARD2_DATABASE);
  if (second === first) throw new Error(`${POSTGRES_URL_2_ENV} must name a database other than the first`);
  return [first, await assertPostgresReachable(second)];
}

/** A pool for a file's stores; the stores get their own namespaces. */
export function postgresPool(url: string, max = 8) {
  const pool = new pg.Pool({ connectionString: url, max });
  pool.on('error', () => {});
  return pool;
}

export function postgresStore(pool: PgPool, label = 'i'): Promise<PostgresStore> {
  return createPostgresStore({ pool, namespace: uniqueNamespace(label) });
}

export async function redisStore(label = 'i', url = defaultRedisUrl()): Promise<RedisStore> {
  try {
    return await createRedisStore({ url, namespace: uniqueNamespace(label) });
  } catch (error) {
    throw new Error(
      `Redis is not reachable at ${url}: set PERCOLATOR_REDIS_URL to a running Redis (${(error as Error).message})`,
      { cause: error },
    );
  }
}

/**
 * Fails unless the Redis Cluster at PERCOLATOR_REDIS_CLUSTER_NODES (default the local one)
 * answers. The local cluster is started once per vitest run by
 * scripts/vitest-global-setup.ts, never by a test file (a file that stopped it would break
 * the files and runs still using it).
 */
export function ensureRedisCluster(): Promise<void> {
  // Typed in scripts/vitest-global-setup.ts, which integration's tsconfig does not include.
  return assertRedisCluster(String((inject as (key: string) => unknown)('redisClusterSetupError') ?? ''));
}

/** A store on its own Cluster client (like a separate process); `close()` quits the client too. */
export async function redisClusterStore(label = 'i'): Promise<RedisStore> {
  const client = await connectCluster();
  const store = await createRedisStore({ client, namespace: uniqueNamespace(label) });
  const close = store.close.bind(store);
  store.close = async () => {
    await close();
    await client.quit();
  };
  return store;
}
