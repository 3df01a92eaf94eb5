import { MemoryStore, type RowStore } from '@percolator/core';
import { CountingStore } from './counting-store.js';
import { type DatasetShape, initialRows } from './dataset.js';
import { DynamoNativeEngine } from './engines/dynamodb.js';
import type { Engine } from './engines/engine.js';
import { MySqlNativeData, MySqlNativeEngine } from './engines/mysql.js';
import { PercolatorEngine } from './engines/percolator.js';
import { PostgresNativeData, PostgresNativeEngine } from './engines/postgres.js';
import { RawEngine } from './engines/raw.js';
import { RedisNativeEngine } from './engines/redis.js';
import { redisAnswers, runClusterScript } from './services.js';
import type { BackendName } from './types.js';

/** A backend that is set up: its engines (percolator, raw, natives) over fresh namespaces. */
export interface OpenBackend {
  readonly name: BackendName;
  /** Where it runs, without passwords. */
  readonly target: string;
  readonly engines: readonly Engine[];
  readonly notes: readonly string[];
  /** Drops everything the bench created and stops what it started. */
  close(): Promise<void>;
}

export interface BackendSettings {
  /** Random hex making every name this run creates unique. */
  readonly runId: string;
  readonly maxConcurrency: number;
  readonly maxAttempts: number;
  /** May start the local Redis Cluster / DynamoDB Local. */
  readonly startServices: boolean;
}

/** The backend could not be reached (or started); `reason` says why and what to set. */
export class BackendUnavailable extends Error {
  constructor(
    readonly backend: BackendName,
    readonly reason: string,
  ) {
    super(`${backend}: ${reason}`);
  }
}

interface DroppableStore extends RowStore {
  dropNamespace(): Promise<void>;
}

function message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** Closes in order, collecting failures, so one failed cleanup does not skip the rest. */
async function closeAll(steps: ReadonlyArray<() => Promise<unknown>>): Promise<void> {
  const failures: string[] = [];
  for (const step of steps) {
    try {
      await step();
    } catch (error) {
      failures.push(message(error));
    }
  }
  if (failures.length > 0) throw new Error(`cleanup failed: ${failures.join('; ')}`);
}

/** Percolator and raw engines over one store, each with its own call counter. */
function storeEngines(store: RowStore, settings: BackendSettings): Engine[] {
  return [
    new PercolatorEngine(new CountingStore(store), settings.maxAttempts),
    new RawEngine(new CountingStore(store), settings.maxAttempts),
  ];
}

function redact(url: string): string {
  return url.replace(/\/\/[^@/]*@/, '//***@');
}

export async function openBackend(name: BackendName, settings: BackendSettings): Promise<OpenBackend> {
  const namespace = `bench_${settings.runId}`;
  const nativeName = `bench_${settings.runId}_native`;
  // Pools sized for the workers, plus a little for Percolator's parallel reads and writes.
  const poolSize = Math.min(32, Math.max(10, settings.maxConcurrency * 2));
  // One connection per native transaction; capped so a large --concurrency does not
  // exhaust the server's connection limit (transactions then wait for a connection).
  const nativePool = Math.min(40, settings.maxConcurrency + 2);
  const { maxAttempts } = settings;
  switch (name) {
    case 'memory': {
      const store = new MemoryStore();
      const engines = storeEngines(store, settings);
      return {
        name,
        target: 'in-process',
        engines,
        notes: ['memory: no native baseline (an in-process map has no transactions of its own)'],
        close: () => closeAll(engines.map((e) => () => e.close())),
      };
    }
    case 'postgres': {
      const pg = await import('@percolator/postgres');
      const url = pg.resolvePostgresUrl();
      try {
        await pg.assertPostgresReachable(url);
      } catch (error) {
        throw new BackendUnavailable(name, message(error));
      }
      const store = await pg.createPostgresStore({
        connectionString: url,
        namespace,
        maxConnections: poolSize,
      });
      let data: PostgresNativeData;
      try {
        data = await PostgresNativeData.create(url, nativeName, nativePool);
      } catch (error) {
        await closeAll([() => store.dropNamespace(), () => store.close()]);
        throw error;
      }
      const engines = [
        ...storeEngines(store, settings),
        new PostgresNativeEngine(data, 'repeatable-read', maxAttempts),
        new PostgresNativeEngine(data, 'serializable', maxAttempts),
      ];
      return {
        name,
        target: pg.redactUrl(url),
        engines,
        notes: [],
        close: () =>
          closeAll([
            ...engines.map((e) => () => e.close()),
            () => store.dropNamespace(),
            () => store.close(),
            () => data.drop(),
          ]),
      };
    }
    case 'mysql': {
      const my = await import('@percolator/mysql');
      const url = my.resolveMySqlUrl();
      try {
        await my.assertMySqlReachable(url);
      } catch (error) {
        throw new BackendUnavailable(name, message(error));
      }
      const store = await my.createMySqlStore({ uri: url, namespace, maxConnections: poolSize });
      let data: MySqlNativeData;
      try {
        data = await MySqlNativeData.create(url, nativeName, nativePool);
      } catch (error) {
        await closeAll([() => store.dropNamespace(), () => store.close()]);
        throw error;
      }
      const engines = [
        ...storeEngines(store, settings),
        new MySqlNativeEngine(data, 'repeatable-read', maxAttempts),
        new MySqlNativeEngine(data, 'serializable', maxAttempts),
      ];
      return {
        name,
        target: my.redactUrl(url),
        engines,
        notes: [],
        close: () =>
          closeAll([
            ...engines.map((e) => () => e.close()),
            () => store.dropNamespace(),
            () => store.close(),
            () => data.drop(),
          ]),
      };
    }
    case 'redis': {
      const redis = await import('@percolator/redis');
      const url = redis.defaultRedisUrl();
      let store: DroppableStore;
      try {
        store = await redis.createRedisStore({ url, namespace });
      } catch (error) {
        throw new BackendUnavailable(name, message(error));
      }
      const native = new RedisNativeEngine(url, nativeName, maxAttempts);
      const engines = [...storeEngines(store, settings), native];
      return {
        name,
        target: redact(url),
        engines,
        notes: [],
        close: () =>
          closeAll([
            ...engines.map((e) => () => e.close()),
            () => store.dropNamespace(),
            () => store.close(),
          ]),
      };
    }
    case 'redis-cluster':
      return openRedisCluster(settings, namespace);
    case 'dynamodb':
      return openDynamoDb(settings, namespace, nativeName);
  }
}

async function openRedisCluster(settings: BackendSettings, namespace: string): Promise<OpenBackend> {
  const redis = await import('@percolator/redis');
  const nodes = redis.defaultClusterNodes();
  const target = nodes.map((n) => `${n.host}:${n.port}`).join(',');
  const reachable = async () =>
    (await Promise.all(nodes.map((n) => redisAnswers(n.host, n.port)))).every(Boolean);
  let started = false;
  if (!(await reachable())) {
    const custom = Boolean(process.env.PERCOLATOR_REDIS_CLUSTER_NODES);
    if (custom || !settings.startServices) {
      throw new BackendUnavailable(
        'redis-cluster',
        `no Redis Cluster answers at ${target} (set PERCOLATOR_REDIS_CLUSTER_NODES, or run scripts/redis-cluster.sh start)`,
      );
    }
    try {
      await runClusterScript('start');
      started = true;
    } catch (error) {
      throw new BackendUnavailable('redis-cluster', `could not start the local cluster: ${message(error)}`);
    }
  }
  const stopCluster = async () => {
    if (started) await runClusterScript('stop');
  };
  const client = redis.createRedisClusterClient(nodes);
  let store: DroppableStore;
  try {
    store = await redis.createRedisStore({ client, namespace });
  } catch (error) {
    client.disconnect();
    await stopCluster().catch(() => {});
    throw new BackendUnavailable('redis-cluster', message(error));
  }
  const engines = storeEngines(store, settings);
  return {
    name: 'redis-cluster',
    target,
    engines,
    notes: [
      'redis-cluster: no native baseline (WATCH/MULTI/EXEC cannot span hash slots)',
      ...(started
        ? ['redis-cluster: started with scripts/redis-cluster.sh for this run and stopped after']
        : []),
    ],
    close: () =>
      closeAll([
        ...engines.map((e) => () => e.close()),
        () => store.dropNamespace(),
        () => store.close(),
        () => client.quit(),
        stopCluster,
      ]),
  };
}

async function openDynamoDb(
  settings: BackendSettings,
  namespace: string,
  nativeName: string,
): Promise<OpenBackend> {
  const { createDynamoDbStore } = await import('@percolator/dynamodb');
  const { dynamoDbTarget } = await import('@percolator/dynamodb/local');
  if (!process.env.PERCOLATOR_DYNAMODB_ENDPOINT && !settings.startServices) {
    throw new BackendUnavailable(
      'dynamodb',
      'PERCOLATOR_DYNAMODB_ENDPOINT is not set and starting DynamoDB Local is off',
    );
  }
  let target: Awaited<ReturnType<typeof dynamoDbTarget>>;
  try {
    target = await dynamoDbTarget();
  } catch (error) {
    throw new BackendUnavailable('dynamodb', message(error));
  }
  let store: DroppableStore;
  let native: DynamoNativeEngine;
  try {
    store = await createDynamoDbStore(target.storeOptions(namespace));
  } catch (error) {
    await target.stop();
    throw new BackendUnavailable('dynamodb', message(error));
  }
  try {
    native = await DynamoNativeEngine.create(target, nativeName, settings.maxAttempts);
  } catch (error) {
    await closeAll([() => store.dropNamespace(), () => store.close(), () => target.stop()]);
    throw error;
  }
  const engines = [...storeEngines(store, settings), native];
  return {
    name: 'dynamodb',
    target: target.local ? `DynamoDB Local ${target.endpoint}` : target.endpoint,
    engines,
    notes: target.local ? ['dynamodb: DynamoDB Local (in-memory, started for this run)'] : [],
    close: () =>
      closeAll([
        ...engines.map((e) => () => e.close()),
        () => store.dropNamespace(),
        () => store.close(),
        () => target.stop(),
      ]),
  };
}

/** Loads the data set once per physical copy (engines sharing a dataKey share data). */
export async function loadData(backend: OpenBackend, shape: DatasetShape): Promise<void> {
  const loaded = new Set<string>();
  for (const engine of backend.engines) {
    if (loaded.has(engine.dataKey)) continue;
    loaded.add(engine.dataKey);
    await engine.load('kv', initialRows('kv', shape));
    // Raw mode runs single-row reads and writes on `kv` only.
    if (!engine.singleRowOnly) await engine.load('acct', initialRows('acct', shape));
  }
}
