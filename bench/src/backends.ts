import { type ConnectedStore, openStore } from '@percolator/connect';
import {
  CompositeStore,
  MemoryStore,
  type PercolatorEventListener,
  type PercolatorOptions,
  type RowStore,
  redactUrl,
} from '@percolator/core';
import { CompositeCountingStore, CountingStore } from './counting-store.js';
import { type DatasetShape, initialRows } from './dataset.js';
import { type ProxyGroup, startProxies } from './delay-proxy.js';
import { delayedStore } from './delayed-store.js';
import { DynamoNativeEngine } from './engines/dynamodb.js';
import { type Engine, LOGICAL_TABLES, type LogicalTable } from './engines/engine.js';
import { MySqlNativeData, MySqlNativeEngine } from './engines/mysql.js';
import { PercolatorEngine } from './engines/percolator.js';
import {
  PostgresNativeData,
  PostgresNativeEngine,
  SQL_ISOLATIONS,
  type SqlIsolation,
} from './engines/postgres.js';
import { RawEngine } from './engines/raw.js';
import { RedisNativeEngine } from './engines/redis.js';
import { httpAnswers, redisAnswers, runClusterScript, type SharedServices } from './services.js';
import type { BackendName } from './types.js';

/** A backend that is set up: its engines (percolator, raw, natives) over fresh namespaces. */
export interface OpenBackend {
  readonly name: BackendName;
  /** Where it runs, without passwords. */
  readonly target: string;
  readonly engines: readonly Engine[];
  readonly notes: readonly string[];
  /** Why there is no native baseline, when there is none (reported as a skipped mode). */
  readonly nativeMissing?: string;
  /** Server version(s), where cheap to ask. */
  readonly version?: string;
  /** The workloads it runs when the command line names none (slow backends keep the default short). */
  readonly defaultWorkloads?: readonly string[];
  /** The history workload's cells of each kind, when --history-cells is not given (slow backends: fewer). */
  readonly historyCells?: number;
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
  /** DynamoDB Local, started at most once per run. */
  readonly services: SharedServices;
  /** `--rtt`: milliseconds added to every round trip to a backend (0 or absent: none). */
  readonly rttMs?: number;
  /** `--inline-history-bytes`: the Percolator engines' `gc.inlineHistoryBytes`. */
  readonly inlineHistoryBytes?: number;
  /** `--version-block-bytes`: the Percolator engines' `gc.versionBlockBytes`. */
  readonly versionBlockBytes?: number;
  /** `--tracing`: another Percolator engine per listener (variant `si+<kind>`). */
  readonly traced?: readonly { readonly kind: string; readonly onEvent: PercolatorEventListener }[];
}

/** The URL clients should use for the server at `url`: itself, or (with --rtt) its delay proxy. */
type Via = (url: string, defaultPort: number) => Promise<string>;

/** Why --rtt leaves the Redis Cluster out. */
export const RTT_CLUSTER_REASON =
  "--rtt does not apply to redis-cluster (its client follows MOVED redirects to the nodes' own ports, past any proxy)";

/** The backend could not be reached (or started); `reason` says why and what to set. */
export class BackendUnavailable extends Error {
  constructor(
    readonly backend: BackendName,
    readonly reason: string,
  ) {
    super(`${backend}: ${reason}`);
  }
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

/** The Percolator engines' client options from the run's settings. */
function clientOptions(settings: BackendSettings): Omit<PercolatorOptions, 'store'> {
  const gc = {
    ...(settings.inlineHistoryBytes === undefined ? {} : { inlineHistoryBytes: settings.inlineHistoryBytes }),
    ...(settings.versionBlockBytes === undefined ? {} : { versionBlockBytes: settings.versionBlockBytes }),
  };
  return Object.keys(gc).length === 0 ? {} : { gc };
}

/** Percolator and raw engines over one store, each with its own call counter. */
function storeEngines(store: RowStore, settings: BackendSettings): Engine[] {
  return [
    ...percolatorEngines(() => new CountingStore(store), settings),
    new RawEngine(new CountingStore(store), settings.maxAttempts),
  ];
}

/**
 * The Percolator engine, and with `--tracing` the same again per kind with its listener.
 * Each traced engine has tables of its own (`t1_acct`, `t2_acct`, ...), and the plain one
 * then has `t0_acct`: names of one length, as a name is in every key, lock and commit
 * record (with `otel_sampled_acct` against `acct`, the longer keys alone made a traced
 * engine that recorded nothing measure 0.91-0.94 of the plain one on the memory store).
 * Their cells are interleaved (runner.ts).
 */
function percolatorEngines(counted: () => CountingStore, settings: BackendSettings): Engine[] {
  const traced = settings.traced ?? [];
  return [
    new PercolatorEngine(
      counted(),
      settings.maxAttempts,
      clientOptions(settings),
      traced.length > 0 ? { tablePrefix: 't0_' } : {},
    ),
    ...traced.map(
      ({ kind, onEvent }, i) =>
        new PercolatorEngine(
          counted(),
          settings.maxAttempts,
          { ...clientOptions(settings), onEvent },
          { tablePrefix: `t${i + 1}_`, variant: `si+${kind}` },
        ),
    ),
  ];
}

/**
 * Opens a backend. With `--rtt`, every server it talks to is reached through a delay
 * proxy (delay-proxy.ts), Percolator, raw and native clients alike, and the in-memory store
 * waits in process (delayed-store.ts); the proxies close with the backend.
 */
export async function openBackend(name: BackendName, settings: BackendSettings): Promise<OpenBackend> {
  const rtt = settings.rttMs ?? 0;
  if (rtt <= 0) return openStores(name, settings, async (url) => url);
  if (name === 'redis-cluster') throw new BackendUnavailable(name, RTT_CLUSTER_REASON);
  const groups: ProxyGroup[] = [];
  const via: Via = async (url, defaultPort) => {
    const parsed = new URL(url);
    const host = parsed.hostname.replace(/^\[|\]$/g, '');
    const group = await startProxies([{ host, port: Number(parsed.port || defaultPort) }], rtt);
    groups.push(group);
    parsed.hostname = '127.0.0.1';
    parsed.port = String(group.proxies[0]!.port);
    return parsed.href;
  };
  const closeProxies = () => closeAll(groups.map((g) => () => g.close()));
  let backend: OpenBackend;
  try {
    backend = await openStores(name, settings, via);
  } catch (error) {
    await closeProxies().catch(() => {});
    throw error;
  }
  const how =
    name === 'memory'
      ? 'every store call waits in process'
      : `through ${groups.length} loopback delay prox${groups.length === 1 ? 'y' : 'ies'}`;
  return {
    ...backend,
    notes: [...backend.notes, `${name}: --rtt ${rtt} ms added to every round trip (${how})`],
    close: () => closeAll([() => backend.close(), closeProxies]),
  };
}

async function openStores(name: BackendName, settings: BackendSettings, via: Via): Promise<OpenBackend> {
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
      const rtt = settings.rttMs ?? 0;
      const store = rtt > 0 ? delayedStore(new MemoryStore(), rtt) : new MemoryStore();
      const engines = storeEngines(store, settings);
      return {
        name,
        target: 'in-process',
        engines,
        notes: [],
        nativeMissing: 'an in-process map has no transactions of its own',
        close: () => closeAll(engines.map((e) => () => e.close())),
      };
    }
    case 'postgres':
    case 'mysql':
      return openSql(name, settings, namespace, nativeName, poolSize, nativePool, via);
    case 'redis': {
      const redis = await import('@percolator/redis');
      const url = await via(redis.defaultRedisUrl(), 6379);
      let opened: ConnectedStore;
      try {
        opened = await openStore('redis', { url, namespace });
      } catch (error) {
        throw new BackendUnavailable(name, message(error));
      }
      const native = new RedisNativeEngine(url, nativeName, maxAttempts);
      const engines = [...storeEngines(opened.store, settings), native];
      return {
        name,
        target: opened.target,
        engines,
        notes: [],
        version: await native.serverVersion().catch(() => undefined),
        close: () =>
          closeAll([
            ...engines.map((e) => () => e.close()),
            () => opened.dropNamespace(),
            () => opened.close(),
          ]),
      };
    }
    case 'redis-cluster':
      return openRedisCluster(settings, namespace);
    case 'dynamodb':
      return openDynamoDb(settings, namespace, nativeName, via);
    case 'mixed':
      return openMixed(settings, `${namespace}_mixed`, poolSize, via);
  }
}

/** What the bench needs of a SQL backend: where it is, and its native baseline. */
interface SqlBackend<
  D extends { serverVersion(): Promise<string>; drop(): Promise<unknown>; sibling(name: string): Promise<D> },
> {
  readonly port: number;
  /** The server's URL (the adapter's variable or default), once it answers. */
  reachable(): Promise<string>;
  data(url: string, name: string, poolSize: number): Promise<D>;
  engine(data: D, isolation: SqlIsolation, maxAttempts: number): Engine;
}

const SQL_BACKENDS = {
  postgres: {
    port: 5432,
    async reachable() {
      const pg = await import('@percolator/postgres');
      return pg.assertPostgresReachable(pg.resolvePostgresUrl());
    },
    data: (url, name, poolSize) => PostgresNativeData.create(url, name, poolSize),
    engine: (data, isolation, maxAttempts) => new PostgresNativeEngine(data, isolation, maxAttempts),
  } satisfies SqlBackend<PostgresNativeData>,
  mysql: {
    port: 3306,
    async reachable() {
      const my = await import('@percolator/mysql');
      return my.assertMySqlReachable(my.resolveMySqlUrl());
    },
    data: (url, name, poolSize) => MySqlNativeData.create(url, name, poolSize),
    engine: (data, isolation, maxAttempts) => new MySqlNativeEngine(data, isolation, maxAttempts),
  } satisfies SqlBackend<MySqlNativeData>,
};

/** Each isolation level's native table: `<run>_native_rc`, `_rr`, `_ser`. */
const LEVEL_SUFFIX: Record<SqlIsolation, string> = {
  'read-committed': 'rc',
  'repeatable-read': 'rr',
  serializable: 'ser',
};

/** PostgreSQL or MySQL: Percolator and raw engines, and the native engine at three isolation levels. */
async function openSql(
  name: 'postgres' | 'mysql',
  settings: BackendSettings,
  namespace: string,
  nativeName: string,
  poolSize: number,
  nativePool: number,
  via: Via,
): Promise<OpenBackend> {
  const sql = SQL_BACKENDS[name] as SqlBackend<PostgresNativeData | MySqlNativeData>;
  let direct: string;
  try {
    direct = await sql.reachable();
  } catch (error) {
    throw new BackendUnavailable(name, message(error));
  }
  const url = await via(direct, sql.port);
  const opened = await openStore(name, { url, namespace, maxConnections: poolSize });
  // A table of its own per isolation level, on one pool: cells on one table cannot take
  // turns, and each level's must take turns with Percolator's (runner.ts).
  const datas: (PostgresNativeData | MySqlNativeData)[] = [];
  const dropData = () => closeAll([...datas].reverse().map((d) => () => d.drop()));
  try {
    for (const level of SQL_ISOLATIONS) {
      const name = `${nativeName}_${LEVEL_SUFFIX[level]}`;
      datas.push(datas.length === 0 ? await sql.data(url, name, nativePool) : await datas[0]!.sibling(name));
    }
  } catch (error) {
    await closeAll([dropData, () => opened.dropNamespace(), () => opened.close()]);
    throw error;
  }
  const data = datas[0]!;
  const engines = [
    ...storeEngines(opened.store, settings),
    ...SQL_ISOLATIONS.map((level, i) => sql.engine(datas[i]!, level, settings.maxAttempts)),
  ];
  return {
    name,
    target: opened.target,
    engines,
    notes: [],
    version: await data.serverVersion().catch(() => undefined),
    close: () =>
      closeAll([
        ...engines.map((e) => () => e.close()),
        () => opened.dropNamespace(),
        () => opened.close(),
        dropData,
      ]),
  };
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
        `no Redis Cluster answers at ${target} (set PERCOLATOR_REDIS_CLUSTER_NODES, or run testkit/redis-cluster.sh start)`,
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
  let opened: ConnectedStore;
  try {
    opened = await openStore('redis-cluster', { url: target, namespace });
  } catch (error) {
    await stopCluster().catch(() => {});
    throw new BackendUnavailable('redis-cluster', message(error));
  }
  const engines = storeEngines(opened.store, settings);
  return {
    name: 'redis-cluster',
    target,
    engines,
    notes: started
      ? ['redis-cluster: started with testkit/redis-cluster.sh for this run and stopped after']
      : [],
    nativeMissing: 'WATCH/MULTI/EXEC cannot span hash slots',
    close: () =>
      closeAll([
        ...engines.map((e) => () => e.close()),
        () => opened.dropNamespace(),
        () => opened.close(),
        stopCluster,
      ]),
  };
}

type DynamoDbTarget = Awaited<ReturnType<SharedServices['dynamoDb']>>;

/** The run's DynamoDB endpoint, or BackendUnavailable saying why there is none. */
async function dynamoDbTarget(
  settings: BackendSettings,
  backend: BackendName,
  via: Via,
): Promise<DynamoDbTarget> {
  const target = await directDynamoDbTarget(settings, backend);
  if ((settings.rttMs ?? 0) > 0 && target.endpoint.startsWith('https:'))
    throw new BackendUnavailable(backend, `--rtt proxies plain TCP to local servers, not ${target.endpoint}`);
  const endpoint = await via(target.endpoint, target.endpoint.startsWith('https:') ? 443 : 80);
  if (endpoint === target.endpoint) return target;
  // The proxy's URL has a trailing slash the SDK does not want.
  const proxied = endpoint.replace(/\/$/, '');
  return {
    ...target,
    endpoint: proxied,
    storeOptions: (ns) => ({ ...target.storeOptions(ns), endpoint: proxied }),
  };
}

async function directDynamoDbTarget(
  settings: BackendSettings,
  backend: BackendName,
): Promise<DynamoDbTarget> {
  const endpoint = process.env.PERCOLATOR_DYNAMODB_ENDPOINT;
  if (!endpoint && !settings.startServices) {
    throw new BackendUnavailable(
      backend,
      'PERCOLATOR_DYNAMODB_ENDPOINT is not set and starting DynamoDB Local is off',
    );
  }
  // Probe first: an unreachable endpoint otherwise surfaces as whatever the SDK trips on
  // first (often CredentialsProviderError), which hides the real reason.
  // Patient: a JVM on a busy machine can take seconds to answer.
  if (endpoint && !(await httpAnswers(endpoint, 10_000))) {
    throw new BackendUnavailable(
      backend,
      `nothing answers at PERCOLATOR_DYNAMODB_ENDPOINT=${endpoint} (unset it to start DynamoDB Local)`,
    );
  }
  try {
    return await settings.services.dynamoDb();
  } catch (error) {
    throw new BackendUnavailable(backend, message(error));
  }
}

/** createDynamoDbStore, with a reason that names what to set when credentials are missing. */
async function createDynamoStore(target: DynamoDbTarget, namespace: string, backend: BackendName) {
  const { createDynamoDbStore } = await import('@percolator/dynamodb');
  try {
    return await createDynamoDbStore(target.storeOptions(namespace));
  } catch (error) {
    const reason =
      (error as { name?: unknown }).name === 'CredentialsProviderError'
        ? `${target.endpoint} answers, but no AWS credentials were found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)`
        : `DynamoDB at ${target.endpoint}: ${message(error)}`;
    throw new BackendUnavailable(backend, reason);
  }
}

function dynamoLabel(target: DynamoDbTarget): string {
  return target.local ? `DynamoDB Local ${target.endpoint}` : target.endpoint;
}

async function openDynamoDb(
  settings: BackendSettings,
  namespace: string,
  nativeName: string,
  via: Via,
): Promise<OpenBackend> {
  const target = await dynamoDbTarget(settings, 'dynamodb', via);
  const store = await createDynamoStore(target, namespace, 'dynamodb');
  let native: DynamoNativeEngine;
  try {
    native = await DynamoNativeEngine.create(target, nativeName, settings.maxAttempts);
  } catch (error) {
    await closeAll([() => store.dropNamespace(), () => store.close()]);
    throw error;
  }
  const engines = [...storeEngines(store, settings), native];
  return {
    name: 'dynamodb',
    target: dynamoLabel(target),
    engines,
    notes: target.local ? ['dynamodb: DynamoDB Local (in-memory, started for this run)'] : [],
    version: target.local ? 'DynamoDB Local' : undefined,
    // 120-160 single-row transactions/s here: 4 × 1,000 versions take 25-35 s, not minutes.
    historyCells: 4,
    close: () =>
      closeAll([...engines.map((e) => () => e.close()), () => store.dropNamespace(), () => store.close()]),
  };
}

/** The workloads `mixed` runs by default: DynamoDB makes it slow, and transfer is the point. */
const MIXED_WORKLOADS = ['read', 'write', 'transfer'];

/**
 * One CompositeStore over PostgreSQL, Redis and DynamoDB: every table's rows sharded by a
 * hash of the row key across the three (shard order postgres, redis, dynamodb), so most
 * transfers touch two different stores. The timestamp oracle is the PostgreSQL store's
 * counter (docs/multi-store.md, "The oracle"). Each engine gets its own composite over
 * its own counted stores, so round trips are counted per underlying store.
 */
async function openMixed(
  settings: BackendSettings,
  namespace: string,
  poolSize: number,
  via: Via,
): Promise<OpenBackend> {
  const pg = await import('@percolator/postgres');
  const redis = await import('@percolator/redis');
  const direct = pg.resolvePostgresUrl();
  try {
    await pg.assertPostgresReachable(direct);
  } catch (error) {
    throw new BackendUnavailable('mixed', `needs PostgreSQL: ${message(error)}`);
  }
  const url = await via(direct, 5432);
  const redisUrl = await via(redis.defaultRedisUrl(), 6379);
  const target = await dynamoDbTarget(settings, 'mixed', via);
  const stores: Pick<ConnectedStore, 'store' | 'dropNamespace' | 'close'>[] = [];
  const dropAll = () => closeAll(stores.flatMap((s) => [() => s.dropNamespace(), () => s.close()]));
  try {
    stores.push(await openStore('postgres', { url, namespace, maxConnections: poolSize }));
    try {
      stores.push(await openStore('redis', { url: redisUrl, namespace }));
    } catch (error) {
      throw new BackendUnavailable('mixed', `needs Redis at ${redactUrl(redisUrl)}: ${message(error)}`);
    }
    const dynamo = await createDynamoStore(target, namespace, 'mixed');
    stores.push({ store: dynamo, dropNamespace: () => dynamo.dropNamespace(), close: () => dynamo.close() });
  } catch (error) {
    await dropAll().catch(() => {});
    throw error;
  }
  const counted = () => {
    const parts = stores.map((s) => new CountingStore(s.store));
    const composite = new CompositeStore({
      name: 'mixed(postgres+redis+dynamodb)',
      default: { shards: parts },
      counterStore: parts[0]!,
      closeStores: false,
    });
    return new CompositeCountingStore(composite, parts);
  };
  const engines = [...percolatorEngines(counted, settings), new RawEngine(counted(), settings.maxAttempts)];
  return {
    name: 'mixed',
    target: `${redactUrl(url)} + ${redactUrl(redisUrl)} + ${dynamoLabel(target)}`,
    engines,
    notes: [
      'mixed: one CompositeStore; rows of every table sharded by key hash over PostgreSQL, Redis and ' +
        "DynamoDB; timestamp oracle: the PostgreSQL store's counter. Round trips are counted per underlying store.",
    ],
    nativeMissing: 'no native transaction spans PostgreSQL, Redis and DynamoDB',
    defaultWorkloads: MIXED_WORKLOADS,
    historyCells: 4,
    close: () => closeAll([...engines.map((e) => () => e.close()), dropAll]),
  };
}

/** Loads `tables` once per physical copy (engines sharing a dataKey share data). */
export async function loadData(
  backend: OpenBackend,
  shape: DatasetShape,
  tables: readonly LogicalTable[] = LOGICAL_TABLES,
): Promise<void> {
  const loaded = new Set<string>();
  for (const engine of backend.engines) {
    if (loaded.has(engine.dataKey)) continue;
    loaded.add(engine.dataKey);
    for (const table of tables) await engine.load(table, initialRows(table, shape));
  }
}
