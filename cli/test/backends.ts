/**
 * The stores the CLI tests run on: memory, PostgreSQL, MariaDB, Redis, Redis Cluster,
 * DynamoDB Local and a composite (PostgreSQL + Redis), each on a fresh namespace, with the
 * connection options a child `percolator` process needs to reach the same data. A backend
 * that cannot be reached fails its tests (never skips).
 */
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CompositeStore, MemoryStore, type RowStore } from '@percolator/core';
import { createDynamoDbStore } from '@percolator/dynamodb';
import { createMySqlStore } from '@percolator/mysql';
import { createPostgresStore } from '@percolator/postgres';
import { createRedisClusterClient, createRedisStore, defaultClusterNodes } from '@percolator/redis';
import { dynamoDbTarget } from '@percolator/testkit/dynamodb';
import { runCli } from '../src/cli.js';

export const POSTGRES_URL = process.env.PERCOLATOR_POSTGRES_URL || 'postgres://postgres@127.0.0.1:5432/test';
export const MYSQL_URL = process.env.PERCOLATOR_MYSQL_URL || 'mysql://root@127.0.0.1:3306/test';
export const REDIS_URL = process.env.PERCOLATOR_REDIS_URL || 'redis://127.0.0.1:6379';

/** Runs the CLI in this process on `store` (its connection options ignored): exit code, stdout, stderr. */
export async function onStore(
  store: RowStore,
  ...argv: string[]
): Promise<{ code: number; out: string; err: string }> {
  let out = '';
  let err = '';
  const code = await runCli(argv, {
    out: (t) => {
      out += t;
    },
    err: (t) => {
      err += t;
    },
    openStore: async () => ({ store, target: 'the test store', close: async () => {} }),
  });
  return { code, out, err };
}

export function uniqueNamespace(label = 'cli'): string {
  return `${label}_${randomBytes(5).toString('hex')}`;
}

export interface TestBackend {
  readonly store: RowStore;
  /** Connection options for a child process (undefined: the memory store, unreachable from outside). */
  readonly argv?: readonly string[];
  cleanup(): Promise<void>;
}

interface Droppable extends RowStore {
  dropNamespace(): Promise<void>;
}

async function dropAndClose(store: RowStore): Promise<void> {
  try {
    await (store as Droppable).dropNamespace();
  } finally {
    await store.close();
  }
}

export const BACKEND_NAMES = [
  'memory',
  'postgres',
  'mysql',
  'redis',
  'redis-cluster',
  'dynamodb',
  'composite',
] as const;
export type TestBackendName = (typeof BACKEND_NAMES)[number];

export async function openTestBackend(name: TestBackendName): Promise<TestBackend> {
  const namespace = uniqueNamespace();
  switch (name) {
    case 'memory': {
      const store = new MemoryStore();
      return { store, cleanup: () => store.close() };
    }
    case 'postgres': {
      const store = await createPostgresStore({ connectionString: POSTGRES_URL, namespace });
      return {
        store,
        argv: ['--backend', 'postgres', '--url', POSTGRES_URL, '--namespace', namespace],
        cleanup: () => dropAndClose(store),
      };
    }
    case 'mysql': {
      const store = await createMySqlStore({ uri: MYSQL_URL, namespace });
      return {
        store,
        argv: ['--backend', 'mysql', '--url', MYSQL_URL, '--namespace', namespace],
        cleanup: () => dropAndClose(store),
      };
    }
    case 'redis': {
      const store = await createRedisStore({ url: REDIS_URL, namespace });
      return {
        store,
        argv: ['--backend', 'redis', '--url', REDIS_URL, '--namespace', namespace],
        cleanup: () => dropAndClose(store),
      };
    }
    case 'redis-cluster': {
      const nodes = defaultClusterNodes();
      const client = createRedisClusterClient(nodes);
      client.on('error', () => undefined);
      const store = await createRedisStore({ client, namespace });
      return {
        store,
        argv: [
          '--backend',
          'redis-cluster',
          '--url',
          nodes.map((n) => `${n.host}:${n.port}`).join(','),
          '--namespace',
          namespace,
        ],
        cleanup: async () => {
          await dropAndClose(store).finally(() => client.quit().catch(() => undefined));
        },
      };
    }
    case 'dynamodb': {
      const target = await dynamoDbTarget();
      const options = target.storeOptions(namespace);
      const store = await createDynamoDbStore(options);
      return {
        store,
        argv: [
          '--backend',
          'dynamodb',
          '--url',
          target.endpoint,
          '--dynamodb-table',
          target.tableName,
          '--region',
          target.region,
          '--namespace',
          namespace,
        ],
        cleanup: async () => {
          await dropAndClose(store).finally(() => target.stop());
        },
      };
    }
    case 'composite': {
      // Rows spread over PostgreSQL and Redis by key, one table only in Redis; the oracle
      // is PostgreSQL's counter (as a deployment's config file would say).
      const pg = await createPostgresStore({ connectionString: POSTGRES_URL, namespace });
      const redis = await createRedisStore({ url: REDIS_URL, namespace });
      const store = new CompositeStore({
        routes: [{ table: 'docs', store: redis }],
        default: { shards: [pg, redis] },
        counterStore: pg,
        closeStores: false,
      });
      const file = join(tmpdir(), `percolator-cli-${namespace}.json`);
      writeFileSync(
        file,
        JSON.stringify({
          stores: {
            pg: { backend: 'postgres', url: POSTGRES_URL, namespace },
            cache: { backend: 'redis', url: REDIS_URL, namespace },
          },
          routes: [{ table: 'docs', store: 'cache' }],
          default: { shards: ['pg', 'cache'] },
          counterStore: 'pg',
        }),
      );
      return {
        store,
        argv: ['--config', file],
        cleanup: async () => {
          await store.close();
          await Promise.all([dropAndClose(pg), dropAndClose(redis)]);
        },
      };
    }
  }
}
