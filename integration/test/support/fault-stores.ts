/**
 * Store instances for the fault tests: one per simulated client process (its own pool or
 * connection), all in one namespace, at an address the test chooses (a private server,
 * or a TcpProxy in front of a server). Driver timeouts of 5 s instead of 10, so a request
 * the network swallowed fails sooner.
 */
import { randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { CompositeStore, type RowStore } from '@percolator/core';
import { createDynamoDbStore, type DynamoDbRowStore } from '@percolator/dynamodb';
import { createMySqlStore, type MySqlStore } from '@percolator/mysql';
import { createPostgresStore, type PostgresStore } from '@percolator/postgres';
import { clusterOptions, createRedisStore, type RedisClient, type RedisStore } from '@percolator/redis';
import { LOCAL_CREDENTIALS, LOCAL_REGION } from '@percolator/testkit/dynamodb';
import { ACCOUNT_TABLES, LIST_TABLES } from './fault-workload.js';

// `integration/` is not a package: load ioredis the way the Redis adapter resolves it.
const { Cluster } = createRequire(
  fileURLToPath(new URL('../../../adapters/redis/package.json', import.meta.url)),
)('ioredis') as { Cluster: new (nodes: unknown[], options: unknown) => RedisClient & { disconnect(): void } };

export type FaultStoreKind = 'postgres' | 'mariadb' | 'redis' | 'redis-cluster' | 'dynamodb';

/**
 * Timeouts of the drivers in these tests: a swallowed request fails within this. Not
 * shorter: on a loaded CI machine a healthy request can take a second or two.
 */
export const REQUEST_TIMEOUT_MS = 5000;

export function faultNamespace(label: string): string {
  return `${label}_${randomBytes(5).toString('hex')}`.slice(0, 32);
}

export interface Address {
  /** postgres/mysql/redis URL, DynamoDB endpoint; for a cluster the seed nodes. */
  readonly url: string;
  readonly nodes?: readonly { host: string; port: number }[];
  /** Cluster only: where to really connect for each announced host:port (through proxies). */
  readonly natMap?: Record<string, { host: string; port: number }>;
}

interface Droppable extends RowStore {
  dropNamespace(): Promise<void>;
}

/** A store instance of `kind` at `address`, in `namespace`. `close()` also ends its own client. */
export async function openStore(
  kind: FaultStoreKind,
  address: Address,
  namespace: string,
): Promise<RowStore> {
  switch (kind) {
    case 'postgres':
      return createPostgresStore({
        connectionString: address.url,
        namespace,
        maxConnections: 4,
        queryTimeoutMs: REQUEST_TIMEOUT_MS,
      });
    case 'mariadb':
      return createMySqlStore({
        uri: address.url,
        namespace,
        maxConnections: 4,
        queryTimeoutMs: REQUEST_TIMEOUT_MS,
      });
    case 'redis':
      return createRedisStore({ url: address.url, namespace, commandTimeoutMs: REQUEST_TIMEOUT_MS });
    case 'redis-cluster': {
      const client = new Cluster([...(address.nodes ?? [])], {
        ...clusterOptions(REQUEST_TIMEOUT_MS),
        ...(address.natMap ? { natMap: address.natMap } : {}),
      });
      client.on('error', () => undefined);
      const store = await createRedisStore({ client, namespace }).catch(async (error: unknown) => {
        client.disconnect();
        throw error;
      });
      const close = store.close.bind(store);
      store.close = async () => {
        await close();
        client.disconnect();
      };
      return store;
    }
    case 'dynamodb':
      return createDynamoDbStore({
        endpoint: address.url,
        region: LOCAL_REGION,
        credentials: { ...LOCAL_CREDENTIALS },
        tableName: 'percolator_faults',
        namespace,
        createTable: true,
        requestTimeoutMs: REQUEST_TIMEOUT_MS,
      });
  }
}

/**
 * The fault tests' composite: each family of the workload's rows (lists, accounts) split
 * over both members (its first table in `first`, its second in `second`), so transfers
 * and list-appends span both; the oracle is `first`'s counter. `close()` closes both.
 */
export function compositeOf(first: RowStore, second: RowStore): CompositeStore {
  return new CompositeStore({
    routes: [
      ...[LIST_TABLES[0], ACCOUNT_TABLES[0]].map((table) => ({ table, store: first })),
      ...[LIST_TABLES[1], ACCOUNT_TABLES[1]].map((table) => ({ table, store: second })),
    ],
    counterStore: first,
  });
}

/**
 * Drops the namespace (a composite's: each member's), best effort (the server may be
 * gone), and closes the store.
 */
export async function dropStore(store: RowStore): Promise<void> {
  const members = store instanceof CompositeStore ? store.stores : [store];
  await Promise.all(members.map((m) => (m as Droppable).dropNamespace?.().catch(() => undefined)));
  await store.close().catch(() => undefined);
}

export type { DynamoDbRowStore, MySqlStore, PostgresStore, RedisStore };

/**
 * What a Redis Cluster client's connections are doing, for a failure message: each node
 * connection's address (as mapped), status, and the commands it awaits replies for, oldest
 * first. A case that cannot reach a master after a heal then says which connection is
 * stuck, and how (one whose replies run one behind shows the command that never got its own).
 */
export function describeClusterClient(store: RowStore): string {
  const client = (store as RedisStore).client as unknown as {
    status?: string;
    nodes?: (role: 'all') => {
      status: string;
      options: { host?: string; port?: number };
      offlineQueue?: { length: number };
      commandQueue?: { length: number; toArray?: () => { command: { name: string } }[] };
    }[];
  };
  if (typeof client.nodes !== 'function') return 'not a cluster client';
  const nodes = client.nodes('all').map((n) => {
    const awaiting = n.commandQueue?.toArray?.().map((i) => i.command.name) ?? [];
    return `${n.options.host}:${n.options.port} ${n.status} (offline queue ${n.offlineQueue?.length ?? '?'}, in flight ${n.commandQueue?.length ?? '?'}: ${awaiting.join(', ') || 'none'})`;
  });
  return `cluster ${client.status}; nodes: ${nodes.join('; ') || 'none'}`;
}
