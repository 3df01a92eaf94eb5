/**
 * Store factories for the CLI, one per backend. Adapters are imported only when chosen
 * (and by a computed name), so the CLI works for the memory store even if an adapter
 * package is missing or broken. Every store gets a fresh random namespace and is dropped
 * after its case.
 */
import { randomBytes } from 'node:crypto';
import { MemoryStore, type RowStore } from '@percolator/core';

export const BACKENDS = ['memory', 'postgres', 'mysql', 'redis', 'redis-cluster', 'dynamodb'] as const;
export type BackendName = (typeof BACKENDS)[number];

/** Workload scale that keeps each backend's run to a few minutes at most. */
export const DEFAULT_SCALES: Record<BackendName, number> = {
  memory: 1,
  redis: 0.5,
  'redis-cluster': 0.5,
  postgres: 0.25,
  mysql: 0.25,
  dynamodb: 0.1,
};

export interface BackendOptions {
  /** Connection URL (cluster: comma-separated host:port list; DynamoDB: endpoint). */
  readonly url?: string;
  /** DynamoDB region and table. */
  readonly region?: string;
  readonly table?: string;
}

export interface Backend {
  readonly name: BackendName;
  /** Where it connects, with any password hidden. */
  readonly target: string;
  createStore(): Promise<RowStore>;
  destroyStore(store: RowStore): Promise<void>;
  /** Stops anything the backend started (DynamoDB Local). */
  close(): Promise<void>;
}

/** A store with the cleanup method every adapter offers. */
interface DroppableStore extends RowStore {
  dropNamespace(): Promise<void>;
}

let counter = 0;
/** /^[a-z][a-z0-9_]{0,31}$/: "conf_" + 8 hex + "_" + a counter. */
export function freshNamespace(): string {
  return `conf_${randomBytes(4).toString('hex')}_${(counter++).toString(36)}`;
}

/** Imports an adapter package, or throws an error that says to build it. */
export async function load(specifier: string): Promise<Record<string, unknown>> {
  try {
    return (await import(specifier)) as Record<string, unknown>;
  } catch (error) {
    // The adapters are optional peers: a user installs the ones for the stores they run.
    const missing = (error as { code?: string }).code === 'ERR_MODULE_NOT_FOUND';
    throw new Error(
      missing
        ? `cannot load ${specifier}: install it next to @percolator/conformance (npm install ${specifier}); in this repository run \`pnpm build\` (${(error as Error).message})`
        : `cannot load ${specifier} (is it built? run \`pnpm build\`): ${(error as Error).message}`,
      {
        cause: error,
      },
    );
  }
}

function factory<T>(
  module: Record<string, unknown>,
  name: string,
  specifier: string,
): (options: T) => Promise<RowStore> {
  const fn = module[name];
  if (typeof fn !== 'function') throw new Error(`${specifier} does not export ${name}()`);
  return async (options: T) => (await fn(options)) as RowStore;
}

async function dropAndClose(store: RowStore): Promise<void> {
  try {
    await (store as DroppableStore).dropNamespace?.();
  } finally {
    await store.close();
  }
}

function redact(url: string): string {
  return url.replace(/\/\/([^:@/]*):[^@/]*@/, '//$1:***@');
}

export async function openBackend(name: BackendName, options: BackendOptions = {}): Promise<Backend> {
  switch (name) {
    case 'memory':
      return {
        name,
        target: 'in-process',
        createStore: async () => new MemoryStore(),
        destroyStore: (store) => store.close(),
        close: async () => {},
      };
    case 'postgres': {
      const spec = '@percolator/postgres';
      const create = factory<{ connectionString?: string; namespace: string }>(
        await load(spec),
        'createPostgresStore',
        spec,
      );
      return {
        name,
        target: redact(options.url ?? process.env.PERCOLATOR_POSTGRES_URL ?? 'the adapter default'),
        createStore: () => create({ connectionString: options.url, namespace: freshNamespace() }),
        destroyStore: dropAndClose,
        close: async () => {},
      };
    }
    case 'mysql': {
      const spec = '@percolator/mysql';
      const create = factory<{ uri?: string; namespace: string }>(await load(spec), 'createMySqlStore', spec);
      return {
        name,
        target: redact(options.url ?? process.env.PERCOLATOR_MYSQL_URL ?? 'the adapter default'),
        createStore: () => create({ uri: options.url, namespace: freshNamespace() }),
        destroyStore: dropAndClose,
        close: async () => {},
      };
    }
    case 'redis': {
      const spec = '@percolator/redis';
      const create = factory<{ url?: string; namespace: string }>(await load(spec), 'createRedisStore', spec);
      return {
        name,
        target: redact(options.url ?? process.env.PERCOLATOR_REDIS_URL ?? 'the adapter default'),
        createStore: () => create({ url: options.url, namespace: freshNamespace() }),
        destroyStore: dropAndClose,
        close: async () => {},
      };
    }
    case 'redis-cluster':
      return redisCluster(options);
    case 'dynamodb':
      return dynamoDb(options);
  }
}

interface QuittableClient {
  quit(): Promise<unknown>;
  on?(event: 'error', listener: (error: unknown) => void): unknown;
}

async function redisCluster(options: BackendOptions): Promise<Backend> {
  const spec = '@percolator/redis';
  const module = await load(spec);
  const create = factory<{ client: QuittableClient; namespace: string }>(module, 'createRedisStore', spec);
  const { createRedisClusterClient, parseNodes, defaultClusterNodes } = module as {
    createRedisClusterClient?: (nodes?: unknown) => QuittableClient;
    parseNodes?: (list: string, source?: string) => unknown;
    defaultClusterNodes?: () => unknown;
  };
  if (!createRedisClusterClient || !parseNodes || !defaultClusterNodes) {
    throw new Error(`${spec} does not export createRedisClusterClient/parseNodes/defaultClusterNodes`);
  }
  // "redis://a:7001,b:7002" or "a:7001,b:7002"; default PERCOLATOR_REDIS_CLUSTER_NODES or the local cluster.
  const list = options.url?.replace(/^rediss?:\/\//, '');
  const nodes = list ? parseNodes(list, '--url') : defaultClusterNodes();
  // Each store has its own Cluster client, like a separate process; the store does not
  // quit a client it was given, so destroyStore does.
  const clients = new WeakMap<RowStore, QuittableClient>();
  return {
    name: 'redis-cluster',
    target: JSON.stringify(nodes),
    async createStore() {
      const client = createRedisClusterClient(nodes);
      // Failed commands reach the store as errors; without a listener ioredis prints each one.
      client.on?.('error', () => undefined);
      try {
        const store = await create({ client, namespace: freshNamespace() });
        clients.set(store, client);
        return store;
      } catch (error) {
        await client.quit().catch(() => undefined);
        throw error;
      }
    },
    async destroyStore(store) {
      try {
        await dropAndClose(store);
      } finally {
        await clients
          .get(store)
          ?.quit()
          .catch(() => undefined);
      }
    },
    close: async () => {},
  };
}

interface DynamoTarget {
  readonly endpoint: string;
  readonly local: boolean;
  storeOptions(namespace: string): Record<string, unknown>;
  stop(): Promise<void>;
}

async function dynamoDb(options: BackendOptions): Promise<Backend> {
  const spec = '@percolator/dynamodb';
  const create = factory<Record<string, unknown>>(await load(spec), 'createDynamoDbStore', spec);
  const local = (await load(`${spec}/local`)) as {
    dynamoDbTarget?: (env?: NodeJS.ProcessEnv) => Promise<DynamoTarget>;
    LOCAL_CREDENTIALS?: { accessKeyId: string; secretAccessKey: string };
  };
  if (!local.dynamoDbTarget) throw new Error(`${spec}/local does not export dynamoDbTarget()`);
  // --url wins; else PERCOLATOR_DYNAMODB_ENDPOINT; else a DynamoDB Local started for this run.
  const env: NodeJS.ProcessEnv = { ...process.env };
  if (options.url) env.PERCOLATOR_DYNAMODB_ENDPOINT = options.url;
  if (options.region) env.AWS_REGION = options.region;
  if (options.table) env.PERCOLATOR_DYNAMODB_TABLE = options.table;
  const target = await local.dynamoDbTarget(env);
  // DynamoDB Local wants some credentials, whatever they are.
  const loopback = /^https?:\/\/(127\.0\.0\.1|localhost|\[::1\])[:/]/.test(target.endpoint);
  const credentials =
    loopback && !process.env.AWS_ACCESS_KEY_ID && local.LOCAL_CREDENTIALS
      ? { ...local.LOCAL_CREDENTIALS }
      : undefined;
  return {
    name: 'dynamodb',
    target: `${target.endpoint}${target.local ? ' (DynamoDB Local started for this run)' : ''}`,
    createStore: () => {
      const storeOptions = target.storeOptions(freshNamespace());
      return create(
        credentials && !storeOptions.credentials ? { ...storeOptions, credentials } : storeOptions,
      );
    },
    destroyStore: dropAndClose,
    close: () => target.stop(),
  };
}
