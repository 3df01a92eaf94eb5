// Opens a store on any backend for the examples:
// `--backend memory|postgres|mysql|redis|redis-cluster|dynamodb`.
// Every run uses a fresh namespace and drops it afterwards. Connection settings come from
// the adapters' usual environment variables (PERCOLATOR_POSTGRES_URL, PERCOLATOR_MYSQL_URL,
// PERCOLATOR_REDIS_URL, PERCOLATOR_REDIS_CLUSTER_NODES (default 127.0.0.1:7001-7003; start
// one with scripts/redis-cluster.sh start), PERCOLATOR_DYNAMODB_ENDPOINT); DynamoDB Local
// is started when no endpoint is given (needs Java 17+).
import { randomBytes } from 'node:crypto';
import { MemoryStore } from '@percolator/core';

export const BACKENDS = ['memory', 'postgres', 'mysql', 'redis', 'redis-cluster', 'dynamodb'];

/** The value of `--name value` (or `--name=value`) in argv, else `fallback`. */
export function argument(name, fallback) {
  const args = process.argv.slice(2);
  for (let i = 0; i < args.length; i++) {
    if (args[i] === `--${name}`) return args[i + 1];
    if (args[i].startsWith(`--${name}=`)) return args[i].slice(name.length + 3);
  }
  return fallback;
}

/** Resolves to `{ store, close }`; `close()` drops the namespace and closes everything. */
export async function openStore(backend) {
  const namespace = `ex_${randomBytes(4).toString('hex')}`;
  const dropAndClose =
    (store, after = async () => {}) =>
    async () => {
      try {
        await store.dropNamespace();
      } finally {
        await store.close();
        await after();
      }
    };
  switch (backend) {
    case 'memory': {
      const store = new MemoryStore();
      return { store, close: () => store.close() };
    }
    case 'postgres': {
      const { createPostgresStore } = await import('@percolator/postgres');
      const store = await createPostgresStore({ namespace });
      return { store, close: dropAndClose(store) };
    }
    case 'mysql': {
      const { createMySqlStore } = await import('@percolator/mysql');
      const store = await createMySqlStore({ namespace });
      return { store, close: dropAndClose(store) };
    }
    case 'redis': {
      const { createRedisStore } = await import('@percolator/redis');
      const store = await createRedisStore({ namespace });
      return { store, close: dropAndClose(store) };
    }
    case 'redis-cluster': {
      const { createRedisClusterClient, createRedisStore, defaultClusterNodes } = await import(
        '@percolator/redis'
      );
      const nodes = defaultClusterNodes();
      const client = createRedisClusterClient(nodes);
      client.on('error', () => {}); // failures reach the caller through the failed command
      try {
        await client.connect();
      } catch (error) {
        client.disconnect();
        const where = nodes.map((n) => `${n.host}:${n.port}`).join(',');
        throw new Error(
          `Redis Cluster not reachable at ${where} (set PERCOLATOR_REDIS_CLUSTER_NODES): ${error.message}`,
        );
      }
      try {
        const store = await createRedisStore({ client, namespace });
        // The store does not quit a client it was given.
        return { store, close: dropAndClose(store, () => client.quit()) };
      } catch (error) {
        client.disconnect();
        throw error;
      }
    }
    case 'dynamodb': {
      const { createDynamoDbStore } = await import('@percolator/dynamodb');
      const tableName = process.env.PERCOLATOR_DYNAMODB_TABLE || 'percolator_examples';
      const external = process.env.PERCOLATOR_DYNAMODB_ENDPOINT;
      if (external) {
        const store = await createDynamoDbStore({
          endpoint: external,
          tableName,
          namespace,
          createTable: true,
        });
        return { store, close: dropAndClose(store) };
      }
      const { startDynamoDbLocal, LOCAL_CREDENTIALS, LOCAL_REGION } = await import(
        '@percolator/dynamodb/local'
      );
      const local = await startDynamoDbLocal();
      try {
        const store = await createDynamoDbStore({
          endpoint: local.endpoint,
          region: LOCAL_REGION,
          credentials: { ...LOCAL_CREDENTIALS },
          tableName,
          namespace,
          createTable: true,
        });
        return { store, close: dropAndClose(store, () => local.stop()) };
      } catch (error) {
        await local.stop();
        throw error;
      }
    }
    default:
      throw new Error(`unknown backend "${backend}"; choose one of ${BACKENDS.join(', ')}`);
  }
}
