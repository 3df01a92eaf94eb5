/**
 * The real backends the integration tests run against, each with a clear failure message
 * naming the environment variable to set (tests never skip a backend).
 *
 * `integration/` is not a package, so drivers the adapters depend on (`pg`) are loaded
 * the way the adapter itself resolves them.
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import {
  assertPostgresReachable,
  createPostgresStore,
  type PgPool,
  type PostgresStore,
  resolvePostgresUrl,
} from '@percolator/postgres';
import {
  createRedisClusterClient,
  createRedisStore,
  defaultClusterNodes,
  defaultRedisUrl,
  type RedisClient,
  type RedisStore,
} from '@percolator/redis';

/** /^[a-z][a-z0-9_]{0,31}$/ and unique per call, so concurrent runs never share data. */
export function uniqueNamespace(label: string): string {
  return `${label}_${randomBytes(5).toString('hex')}`.slice(0, 32);
}

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

/**
 * The URLs of two different PostgreSQL databases: $PERCOLATOR_POSTGRES_URL (default the
 * local `test` database) and $PERCOLATOR_POSTGRES_URL_2, by default database
 * `percolator_shard2` on the same server, created here if it is missing.
 */
export async function twoPostgresDatabases(): Promise<[string, string]> {
  const first = await assertPostgresReachable();
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

const execFileAsync = promisify(execFile);
const CLUSTER_SCRIPT = fileURLToPath(new URL('../../../scripts/redis-cluster.sh', import.meta.url));

async function runClusterScript(command: 'start' | 'stop' | 'status'): Promise<void> {
  // Async: a blocking call would stall vitest's worker for the seconds a start takes.
  await execFileAsync('bash', [CLUSTER_SCRIPT, command], { timeout: 120_000 });
}

/**
 * Makes sure a Redis Cluster answers: PERCOLATOR_REDIS_CLUSTER_NODES if set, else the
 * local test cluster, started with scripts/redis-cluster.sh when it is down. Returns a
 * function that stops only what this call started.
 */
export async function ensureRedisCluster(): Promise<() => Promise<void>> {
  if (process.env.PERCOLATOR_REDIS_CLUSTER_NODES) return async () => {};
  const up = await runClusterScript('status').then(
    () => true,
    () => false,
  );
  if (up) return async () => {};
  try {
    await runClusterScript('start');
  } catch (error) {
    const stderr = String((error as { stderr?: unknown }).stderr ?? '').trim();
    throw new Error(
      `could not start the local Redis Cluster with scripts/redis-cluster.sh (${stderr || (error as Error).message}); ` +
        'start one and set PERCOLATOR_REDIS_CLUSTER_NODES',
    );
  }
  return () => runClusterScript('stop');
}

/** A store on its own Cluster client (like a separate process); `close()` quits the client too. */
export async function redisClusterStore(label = 'i'): Promise<RedisStore> {
  const client: RedisClient = createRedisClusterClient(defaultClusterNodes());
  client.on('error', () => {});
  try {
    await client.connect();
  } catch (error) {
    client.disconnect();
    throw new Error(
      `Redis Cluster not reachable at ${JSON.stringify(defaultClusterNodes())}: set PERCOLATOR_REDIS_CLUSTER_NODES (${(error as Error).message})`,
      { cause: error },
    );
  }
  const store = await createRedisStore({ client, namespace: uniqueNamespace(label) });
  const close = store.close.bind(store);
  store.close = async () => {
    await close();
    await client.quit();
  };
  return store;
}
