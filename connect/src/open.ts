import { InvalidArgumentError, MemoryStore, type RowStore, redactUrl } from '@percolator/core';
import { ADAPTER_PACKAGES, BACKEND_ENV, BACKENDS, type BackendName, isBackendName } from './backends.js';
import { loadAdapter } from './load.js';

type PostgresModule = typeof import('@percolator/postgres');
type MySqlModule = typeof import('@percolator/mysql');
type RedisModule = typeof import('@percolator/redis');
type DynamoDbModule = typeof import('@percolator/dynamodb');

/** How to reach a backend. Everything is optional: unset fields come from the environment. */
export interface ConnectOptions {
  /**
   * postgres, mysql, redis: the connection URL. redis-cluster: the node list
   * "host:port,host:port" (a leading redis:// is allowed). dynamodb: the endpoint.
   * Default: the backend's variable in `env` (BACKEND_ENV), else the adapter's default
   * (the local test servers; DynamoDB: the AWS endpoint for the region).
   */
  readonly url?: string;
  /** The store's namespace (/^[a-z][a-z0-9_]{0,31}$/). Default: the adapter's ("percolator"). */
  readonly namespace?: string;
  /** Where unset settings are read. Default `process.env`. */
  readonly env?: NodeJS.ProcessEnv;
  /** postgres, mysql: pool size. Default: the adapter's (10). */
  readonly maxConnections?: number;
  /**
   * dynamodb: region. Default AWS_REGION, AWS_DEFAULT_REGION; else, with an endpoint
   * (DynamoDB Local), us-east-1, and without one the AWS SDK's own lookup (the region of
   * your AWS profile), so a region set there is not overridden.
   */
  readonly region?: string;
  /** dynamodb: the table holding every namespace. Default PERCOLATOR_DYNAMODB_TABLE, else "percolator_test". */
  readonly table?: string;
  /**
   * Create what the namespace needs if it is missing (SQL: its tables; DynamoDB: the
   * table). Default true. false: a missing namespace or table is an error (for tools
   * that only read). Redis has nothing to create (a namespace is its keys), so a Redis
   * namespace with no keys opens empty either way; so does a DynamoDB namespace with no
   * items in an existing table.
   */
  readonly create?: boolean;
}

/** An open store and what to do with it when done. */
export interface ConnectedStore {
  readonly backend: BackendName;
  readonly store: RowStore;
  /** Where it connects, with any password hidden (for messages and reports). */
  readonly target: string;
  /** Deletes everything of the store's namespace (memory: nothing to do). The store stays open. */
  dropNamespace(): Promise<void>;
  /** Closes the store and any client opened for it. */
  close(): Promise<void>;
}

/** DynamoDB Local checks that credentials are present, not what they are. */
export const LOCAL_DYNAMODB_CREDENTIALS = Object.freeze({ accessKeyId: 'local', secretAccessKey: 'local' });
export const DEFAULT_DYNAMODB_REGION = 'us-east-1';
export const DEFAULT_DYNAMODB_TABLE = 'percolator_test';

const OPTION_KEYS = new Set(['url', 'namespace', 'env', 'maxConnections', 'region', 'table', 'create']);

function checkOptions(backend: unknown, options: ConnectOptions): asserts backend is BackendName {
  if (!isBackendName(backend)) {
    throw new InvalidArgumentError(
      `unknown backend ${JSON.stringify(backend)}; choose one of ${BACKENDS.join(', ')}`,
    );
  }
  if (typeof options !== 'object' || options === null) {
    throw new InvalidArgumentError('openStore options must be an object');
  }
  for (const key of Object.keys(options)) {
    if (!OPTION_KEYS.has(key)) {
      throw new InvalidArgumentError(
        `unknown openStore option "${key}"; options are ${[...OPTION_KEYS].join(', ')}`,
      );
    }
  }
  if (options.url !== undefined && (typeof options.url !== 'string' || options.url.trim() === '')) {
    throw new InvalidArgumentError('url must be a non-empty string');
  }
  // Settings of another backend would be ignored: refused, so a command line or a config
  // file that names them for the wrong store says so.
  if (options.maxConnections !== undefined) {
    if (backend !== 'postgres' && backend !== 'mysql') {
      throw new InvalidArgumentError(`maxConnections is for postgres and mysql, not ${backend}`);
    }
    if (!Number.isSafeInteger(options.maxConnections) || options.maxConnections < 1) {
      throw new InvalidArgumentError(
        `maxConnections must be a positive integer, got ${String(options.maxConnections)}`,
      );
    }
  }
  // 'false' (from a config file or an environment variable) was a truthy create.
  if (options.create !== undefined && typeof options.create !== 'boolean')
    throw new InvalidArgumentError(`create must be a boolean, got ${typeof options.create}`);
  for (const key of ['region', 'table'] as const) {
    if (options[key] !== undefined && backend !== 'dynamodb') {
      throw new InvalidArgumentError(`${key} is for dynamodb, not ${backend}`);
    }
  }
}

/** The URL schemes each URL-configured backend takes. */
const URL_SCHEMES: Record<'postgres' | 'mysql' | 'redis', readonly string[]> = {
  postgres: ['postgres:', 'postgresql:'],
  mysql: ['mysql:', 'mariadb:'],
  redis: ['redis:', 'rediss:'],
};

/**
 * A URL as an error may show it: redacted, and only if it parses as a URL with a host. A
 * value that does not (a typo, a password pasted in the wrong place) is not echoed at all:
 * redaction finds a password only where a URL puts one (found in review).
 */
function shownUrl(url: string): string {
  try {
    if (new URL(url).host !== '') return redactUrl(url);
  } catch {
    // not a URL
  }
  return `a value that is not a URL with a host (${url.length} characters, not shown)`;
}

/**
 * A connection URL checked before any driver sees it: a driver's own parse error is an
 * untyped TypeError that carries the whole URL, password included, in its `input`.
 */
function checkedUrl(backend: 'postgres' | 'mysql' | 'redis', url: string, source: string): string {
  if (backend === 'postgres') {
    // pg parses its own strings, more than a URL: `postgres://user@/db?host=/run/pg` (a
    // socket), `socket:/run/pg?db=x`, a bare socket path; its errors carry no password.
    if (!/^(postgres(ql)?:\/\/|socket:|\/)/i.test(url)) {
      throw new InvalidArgumentError(
        `${source} must start with postgres://, postgresql:// or socket:, got ${shownUrl(url)}`,
      );
    }
    return url;
  }
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new InvalidArgumentError(`${source} is not a valid ${backend} URL: ${shownUrl(url)}`);
  }
  if (!URL_SCHEMES[backend].includes(parsed.protocol)) {
    throw new InvalidArgumentError(
      `${source} must start with ${URL_SCHEMES[backend].map((p) => `${p}//`).join(' or ')}, got ${shownUrl(url)}`,
    );
  }
  // ioredis takes the path as the database number; anything else it ignores (db 0).
  if (backend === 'redis' && !/^\/?\d*$/.test(parsed.pathname)) {
    throw new InvalidArgumentError(
      `${source}: the path of a redis URL is a database number, got ${JSON.stringify(parsed.pathname)}`,
    );
  }
  return url;
}

/** Where a backend's URL came from, for messages. */
function urlSource(backend: BackendName, options: ConnectOptions): string {
  return options.url !== undefined ? 'url' : BACKEND_ENV[backend as Exclude<BackendName, 'memory'>];
}

/** `options.url`, else the backend's variable in the environment (trimmed; empty counts as unset). */
export function configuredUrl(backend: BackendName, options: ConnectOptions = {}): string | undefined {
  if (options.url !== undefined) return options.url.trim();
  if (backend === 'memory') return undefined;
  const fromEnv = (options.env ?? process.env)[BACKEND_ENV[backend]]?.trim();
  return fromEnv ? fromEnv : undefined;
}

/** Whether an endpoint is on this machine (then DynamoDB Local credentials are used if none are set). */
export function isLoopbackUrl(url: string): boolean {
  return /^[a-z]+:\/\/(127\.\d+\.\d+\.\d+|localhost|\[::1\])(?=[:/]|$)/i.test(url);
}

/**
 * The one rule for DynamoDB Local's placeholder credentials (LOCAL_DYNAMODB_CREDENTIALS): an
 * endpoint on this machine, and no AWS_ACCESS_KEY_ID in the environment (then the AWS SDK's
 * default chain, which finds nothing on a machine without AWS settings). connect, the CLI
 * and the testkit's dynamoDbTarget all follow it.
 */
export function usesLocalDynamoDbCredentials(
  endpoint: string,
  env: NodeJS.ProcessEnv = process.env,
): boolean {
  return isLoopbackUrl(endpoint) && !env.AWS_ACCESS_KEY_ID;
}

interface Droppable extends RowStore {
  dropNamespace(): Promise<void>;
}

function connected(
  backend: BackendName,
  store: Droppable,
  target: string,
  after: () => Promise<unknown> = async () => {},
): ConnectedStore {
  let closed: Promise<void> | undefined;
  return {
    backend,
    store,
    target,
    dropNamespace: () => store.dropNamespace(),
    close: () => {
      closed ??= (async () => {
        try {
          await store.close();
        } finally {
          await after();
        }
      })();
      return closed;
    },
  };
}

/**
 * How to reach a backend through its adapter: the adapter module, the connection part of
 * its options (no namespace), where that is, and what to release after (a Cluster
 * client opened here). The one place that turns a URL or the environment into adapter
 * options; openStore and openNamespaceAdmin build on it.
 */
interface Connection<M> {
  readonly module: M;
  readonly options: Record<string, unknown>;
  readonly target: string;
  release(): Promise<void>;
}

const nothing = async () => {};

async function connection(backend: Exclude<BackendName, 'memory'>, options: ConnectOptions) {
  const url = configuredUrl(backend, options);
  switch (backend) {
    case 'postgres': {
      const module = await loadAdapter<PostgresModule>(ADAPTER_PACKAGES.postgres);
      const resolved =
        url === undefined
          ? module.DEFAULT_POSTGRES_URL
          : checkedUrl(backend, url, urlSource(backend, options));
      return {
        module,
        options: { connectionString: resolved },
        target: redactUrl(resolved),
        release: nothing,
      };
    }
    case 'mysql': {
      const module = await loadAdapter<MySqlModule>(ADAPTER_PACKAGES.mysql);
      const resolved =
        url === undefined ? module.DEFAULT_MYSQL_URL : checkedUrl(backend, url, urlSource(backend, options));
      return { module, options: { uri: resolved }, target: redactUrl(resolved), release: nothing };
    }
    case 'redis': {
      const module = await loadAdapter<RedisModule>(ADAPTER_PACKAGES.redis);
      const resolved =
        url === undefined ? module.DEFAULT_REDIS_URL : checkedUrl(backend, url, urlSource(backend, options));
      return { module, options: { url: resolved }, target: redactUrl(resolved), release: nothing };
    }
    case 'redis-cluster': {
      const module = await loadAdapter<RedisModule>(ADAPTER_PACKAGES.redis);
      const { nodes, target } = clusterNodes(module, url, options);
      // Its own Cluster client, like a separate process. Stores and namespace functions do
      // not quit a client they were given, so release() does.
      const client = module.createRedisClusterClient(nodes);
      // Failed commands reach the store as errors; without a listener ioredis prints each one.
      client.on('error', () => undefined);
      return {
        module,
        options: { client },
        target,
        release: async () => {
          await client.quit().catch(() => client.disconnect());
        },
      };
    }
    case 'dynamodb': {
      const module = await loadAdapter<DynamoDbModule>(ADAPTER_PACKAGES.dynamodb);
      const { region, tableName, local, target } = dynamoDbSettings(url, options);
      return {
        module,
        options: {
          ...(url === undefined ? {} : { endpoint: url }),
          ...(region === undefined ? {} : { region }),
          tableName,
          // The SDK annotates the credentials object it is given: a copy per use.
          ...(local ? { credentials: { ...LOCAL_DYNAMODB_CREDENTIALS } } : {}),
        },
        target,
        release: nothing,
      };
    }
  }
}

type AnyConnection =
  | Connection<PostgresModule>
  | Connection<MySqlModule>
  | Connection<RedisModule>
  | Connection<DynamoDbModule>;

function clusterNodes(redis: RedisModule, url: string | undefined, options: ConnectOptions) {
  const source =
    options.url !== undefined ? 'url' : url !== undefined ? BACKEND_ENV['redis-cluster'] : 'default';
  // TLS is not set up here: a rediss:// node list would connect in plain text.
  if (url !== undefined && /^rediss:\/\//i.test(url)) {
    throw new InvalidArgumentError(
      `${source}: rediss:// (TLS) is not supported for a Redis Cluster node list here; make the Cluster client yourself with TLS (clusterOptions() plus redisOptions.tls) and pass it to createRedisStore({ client })`,
    );
  }
  const nodes = redis.parseNodes((url ?? redis.DEFAULT_CLUSTER_NODES).replace(/^redis:\/\//i, ''), source);
  return { nodes, target: nodes.map((n) => `${n.host}:${n.port}`).join(',') };
}

function dynamoDbSettings(url: string | undefined, options: ConnectOptions) {
  const env = options.env ?? process.env;
  // Without an endpoint and a region of our own, the SDK's lookup (the AWS profile too).
  const region =
    options.region ??
    (env.AWS_REGION || env.AWS_DEFAULT_REGION || (url === undefined ? undefined : DEFAULT_DYNAMODB_REGION));
  const tableName = options.table ?? (env.PERCOLATOR_DYNAMODB_TABLE || DEFAULT_DYNAMODB_TABLE);
  const where =
    url === undefined ? `AWS DynamoDB (${region ?? 'the region of the AWS configuration'})` : redactUrl(url);
  return {
    region,
    tableName,
    // DynamoDB Local wants some credentials, whatever they are.
    local: url !== undefined && usesLocalDynamoDbCredentials(url, env),
    target: `${where} table ${tableName}`,
  };
}

/**
 * Where `openStore(backend, options)` would connect, with any password hidden, without
 * connecting (the adapter package is loaded for its defaults).
 */
export async function describeTarget(backend: BackendName, options: ConnectOptions = {}): Promise<string> {
  checkOptions(backend, options);
  const url = configuredUrl(backend, options);
  switch (backend) {
    case 'memory':
      return 'in-process';
    case 'redis-cluster':
      return clusterNodes(await loadAdapter<RedisModule>(ADAPTER_PACKAGES.redis), url, options).target;
    case 'dynamodb':
      return dynamoDbSettings(url, options).target;
    default: {
      const c = await connection(backend, options);
      await c.release();
      return c.target;
    }
  }
}

/**
 * Opens one store of a backend. The adapter package is imported only here, only for the
 * backend chosen. The returned `target` never contains a password.
 */
export async function openStore(backend: BackendName, options: ConnectOptions = {}): Promise<ConnectedStore> {
  return await openStoreFrom(backend, options);
}

/**
 * Where a store's URL came from, as a message names it: `label` (a composite config's
 * `stores.NAME.url`, say), else connect's own `url` option, the backend's variable, or the
 * adapter's default. The adapters name their own option (pg's "connectionString", mysql2's
 * "uri"), which is not what a user of connect (or of a tool built on it) set.
 */
function urlOrigin(backend: Exclude<BackendName, 'memory'>, options: ConnectOptions, label?: string): string {
  if (label !== undefined) return label;
  if (options.url !== undefined) return 'the url option';
  if (configuredUrl(backend, options) !== undefined) return BACKEND_ENV[backend];
  return `the adapter's default (no url option, ${BACKEND_ENV[backend]} not set)`;
}

/**
 * A failure to open, said the same way for every backend: where it connected and where that
 * came from (DynamoDB's said neither, found in review), never the adapter's option name.
 */
function explainOpenError(
  error: unknown,
  backend: Exclude<BackendName, 'memory'>,
  target: string,
  options: ConnectOptions,
  label?: string,
): void {
  if (!(error instanceof Error)) return;
  const origin = urlOrigin(backend, options, label);
  const named = error.message.replace(/\bfrom the (connectionString|uri|url) option\b/g, `from ${origin}`);
  error.message = named;
  if (/connecting to |cannot connect to /.test(named)) return;
  // DynamoDB without an endpoint goes to AWS itself: no URL to say the origin of.
  const from =
    backend === 'dynamodb' && configuredUrl(backend, options) === undefined && label === undefined
      ? ''
      : `, from ${origin}`;
  error.message = `${named} (connecting to ${target}${from})`;
}

/** openStore, naming where the URL came from as `label` in messages (openComposite). */
export async function openStoreFrom(
  backend: BackendName,
  options: ConnectOptions = {},
  label?: string,
): Promise<ConnectedStore> {
  checkOptions(backend, options);
  if (backend === 'memory') {
    const store = new MemoryStore();
    return {
      backend,
      store,
      target: 'in-process',
      dropNamespace: async () => {},
      close: () => store.close(),
    };
  }
  const c = (await connection(backend, options)) as AnyConnection;
  const namespace = options.namespace === undefined ? {} : { namespace: options.namespace };
  const pool = options.maxConnections === undefined ? {} : { maxConnections: options.maxConnections };
  const create = options.create ?? true;
  let store: Droppable;
  try {
    switch (backend) {
      case 'postgres':
        store = await (c.module as PostgresModule).createPostgresStore({
          ...c.options,
          ...namespace,
          ...pool,
          createSchema: create,
        });
        break;
      case 'mysql':
        store = await (c.module as MySqlModule).createMySqlStore({
          ...c.options,
          ...namespace,
          ...pool,
          createSchema: create,
        });
        break;
      case 'redis':
      case 'redis-cluster':
        store = await (c.module as RedisModule).createRedisStore({ ...c.options, ...namespace });
        break;
      case 'dynamodb':
        store = await (c.module as DynamoDbModule).createDynamoDbStore({
          ...(c.options as { tableName: string }),
          ...namespace,
          createTable: create,
        });
        break;
    }
  } catch (error) {
    await c.release();
    if (backend === 'redis-cluster' && error instanceof Error) {
      // The adapter speaks of "the redis client passed in": here connect made it, from a node
      // list whose origin the user should see, as for every other backend (it said neither,
      // and told a user who had passed --url to set the variable: found by a new user).
      // Only that message: a failure after connecting (a refused SCRIPT LOAD) gets the
      // origin appended below, as on the other backends (review).
      const notConnected = /^the redis client passed in \([^)]*\) did not connect: /;
      if (notConnected.test(error.message))
        error.message = `cannot connect to the Redis Cluster at ${c.target}, from ${urlOrigin(backend, options, label)}: ${error.message.replace(notConnected, '')}`;
    }
    explainOpenError(error, backend, c.target, options, label);
    throw error;
  }
  return connected(backend, store, c.target, c.release);
}

/** One namespace a store holds: its name, a one-line description, and the adapter's own record. */
export interface ListedNamespace {
  readonly namespace: string;
  readonly detail: string;
  readonly record: unknown;
}

/** Lists and drops the namespaces of one backend (its catalog: tables, keys or items). */
export interface NamespaceAdmin {
  readonly backend: Exclude<BackendName, 'memory'>;
  /** Where it connects, with any password hidden. */
  readonly target: string;
  list(): Promise<ListedNamespace[]>;
  /** Drops everything of the namespace; resolves to what was dropped, or undefined if it was not there. */
  drop(namespace: string): Promise<string | undefined>;
  close(): Promise<void>;
}

interface SqlRecord {
  readonly namespace: string;
  readonly objects: string[];
  readonly complete: boolean;
}

interface CountRecord {
  readonly namespace: string;
  readonly kinds: Readonly<Record<string, number>>;
}

function countDetail(total: number, kinds: Readonly<Record<string, number>>, unit: string): string {
  const parts = Object.entries(kinds)
    .filter(([, n]) => n > 0)
    .map(([kind, n]) => `${kind} ${n}`)
    .join(', ');
  return `${total} ${unit}${total === 1 ? '' : 's'} (${parts})`;
}

function plural(n: number, unit: string): string {
  return `${n} ${unit}${n === 1 ? '' : 's'}`;
}

/**
 * Opens the namespace catalog of a backend (the memory store has none). Names are
 * checked by the adapters, which build identifiers from the validated name only.
 */
export async function openNamespaceAdmin(
  backend: BackendName,
  options: Omit<ConnectOptions, 'namespace' | 'maxConnections' | 'create'> = {},
): Promise<NamespaceAdmin> {
  checkOptions(backend, options);
  if (backend === 'memory') {
    throw new InvalidArgumentError(
      'the memory store lives inside one process: it has no namespaces to list or drop',
    );
  }
  const c = (await connection(backend, options)) as AnyConnection;
  const sql = (
    list: (o: never) => Promise<SqlRecord[]>,
    drop: (n: string, o: never) => Promise<SqlRecord | undefined>,
  ) => ({
    list: async () =>
      (await list(c.options as never)).map((r) => ({
        namespace: r.namespace,
        detail: `${r.objects.join(', ')}${r.complete ? '' : '  (incomplete)'}`,
        record: r as unknown,
      })),
    drop: async (namespace: string) => (await drop(namespace, c.options as never))?.objects.join(', '),
  });
  let ops: Pick<NamespaceAdmin, 'list' | 'drop'>;
  switch (backend) {
    case 'postgres': {
      const m = c.module as PostgresModule;
      ops = sql(m.listPostgresNamespaces, m.dropPostgresNamespace);
      break;
    }
    case 'mysql': {
      const m = c.module as MySqlModule;
      ops = sql(m.listMySqlNamespaces, m.dropMySqlNamespace);
      break;
    }
    case 'redis':
    case 'redis-cluster': {
      const m = c.module as RedisModule;
      ops = {
        list: async () =>
          (await m.listRedisNamespaces(c.options)).map((r) => ({
            namespace: r.namespace,
            detail: countDetail(r.keys, (r as CountRecord).kinds, 'key'),
            record: r as unknown,
          })),
        drop: async (namespace) => {
          const dropped = await m.dropRedisNamespace(namespace, c.options);
          return dropped === undefined ? undefined : plural(dropped.keys, 'key');
        },
      };
      break;
    }
    case 'dynamodb': {
      const m = c.module as DynamoDbModule;
      const o = c.options as { tableName: string };
      ops = {
        list: async () =>
          (await m.listDynamoDbNamespaces(o)).map((r) => ({
            namespace: r.namespace,
            detail: countDetail(r.items, (r as CountRecord).kinds, 'item'),
            record: r as unknown,
          })),
        drop: async (namespace) => {
          const dropped = await m.dropDynamoDbNamespace(namespace, o);
          return dropped === undefined ? undefined : plural(dropped.items, 'item');
        },
      };
      break;
    }
  }
  return { backend, target: c.target, ...ops, close: c.release };
}
