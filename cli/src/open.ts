/**
 * Opening the store an operator points at: one backend from `--backend`/`--url` (or the
 * adapters' environment variables), or a composite deployment from `--config FILE`. A
 * store is opened without creating anything (SQL `createSchema: false`, DynamoDB without
 * `createTable`), so pointing the CLI at the wrong place never leaves a schema behind.
 * Adapters are loaded only when asked for: they are optional peers.
 */
import { readFile } from 'node:fs/promises';
import { CompositeStore, type Placement, type RowStore, type TableRoute } from '@percolator/core';
import { UsageError } from './errors.js';

export const BACKENDS = ['postgres', 'mysql', 'redis', 'redis-cluster', 'dynamodb'] as const;
export type BackendName = (typeof BACKENDS)[number];

/** The adapters' rule for namespaces (NAMESPACE_PATTERN in each adapter). */
export const NAMESPACE_NAME = /^[a-z][a-z0-9_]{0,31}$/;
export const DEFAULT_NAMESPACE = 'percolator';

export interface StoreTarget {
  readonly backend: BackendName;
  readonly url?: string;
  readonly namespace?: string;
  /** DynamoDB region and table. */
  readonly region?: string;
  readonly dynamoTable?: string;
}

/** A store opened for the CLI, and how to let go of it. */
export interface OpenedStore {
  readonly store: RowStore;
  /** Where it connects, with any password hidden. */
  readonly target: string;
  close(): Promise<void>;
}

/** The store could not be reached or opened. */
export class UnreachableError extends Error {
  override readonly name = 'UnreachableError';
}

/** The namespace is not there (a SQL store opened without creating its schema). */
export class NamespaceNotFoundError extends Error {
  override readonly name = 'NamespaceNotFoundError';
}

export function redact(url: string): string {
  return url.replace(/\/\/([^:@/]*):[^@/]*@/, '//$1:***@');
}

async function load(specifier: string): Promise<Record<string, unknown>> {
  try {
    return (await import(specifier)) as Record<string, unknown>;
  } catch (error) {
    const missing = (error as { code?: string }).code === 'ERR_MODULE_NOT_FOUND';
    throw new UsageError(
      missing
        ? `cannot load ${specifier}: install it next to @percolator/cli (npm install ${specifier})`
        : `cannot load ${specifier} (is it built? run \`pnpm build\`): ${(error as Error).message}`,
    );
  }
}

type Factory = (options: Record<string, unknown>) => Promise<RowStore>;

function factory(module: Record<string, unknown>, name: string, specifier: string): Factory {
  const fn = module[name];
  if (typeof fn !== 'function') throw new UsageError(`${specifier} does not export ${name}() (is it built?)`);
  return fn as Factory;
}

interface QuittableClient {
  quit(): Promise<unknown>;
  on(event: 'error', listener: (error: unknown) => void): unknown;
}

function checkNamespace(namespace: string): string {
  if (!NAMESPACE_NAME.test(namespace))
    throw new UsageError(
      `not a namespace name: ${JSON.stringify(namespace)} (a lowercase letter, then up to 31 of [a-z0-9_])`,
    );
  return namespace;
}

/** Opens one backend's store on one namespace. */
export async function openBackend(t: StoreTarget): Promise<OpenedStore> {
  if (!(BACKENDS as readonly string[]).includes(t.backend))
    throw new UsageError(`unknown backend ${JSON.stringify(t.backend)}: one of ${BACKENDS.join(', ')}`);
  const namespace = checkNamespace(t.namespace ?? DEFAULT_NAMESPACE);
  const plain = (store: RowStore, target: string): OpenedStore => ({
    store,
    target: `${t.backend} ${target} namespace ${namespace}`,
    close: () => store.close(),
  });
  try {
    switch (t.backend) {
      case 'postgres': {
        const spec = '@percolator/postgres';
        const url = t.url ?? process.env.PERCOLATOR_POSTGRES_URL;
        const store = await factory(
          await load(spec),
          'createPostgresStore',
          spec,
        )({
          ...(url === undefined ? {} : { connectionString: url }),
          namespace,
          createSchema: false,
          maxConnections: 4,
        });
        return plain(store, redact(url ?? 'postgres://postgres@127.0.0.1:5432/test'));
      }
      case 'mysql': {
        const spec = '@percolator/mysql';
        const url = t.url ?? process.env.PERCOLATOR_MYSQL_URL;
        const store = await factory(
          await load(spec),
          'createMySqlStore',
          spec,
        )({
          ...(url === undefined ? {} : { uri: url }),
          namespace,
          createSchema: false,
          maxConnections: 4,
        });
        return plain(store, redact(url ?? 'mysql://root@127.0.0.1:3306/test'));
      }
      case 'redis': {
        const spec = '@percolator/redis';
        const module = await load(spec);
        const url = t.url ?? (module.defaultRedisUrl as () => string)();
        const store = await factory(module, 'createRedisStore', spec)({ url, namespace });
        return plain(store, redact(url));
      }
      case 'redis-cluster': {
        const spec = '@percolator/redis';
        const module = await load(spec);
        const { createRedisClusterClient, parseNodes, defaultClusterNodes } = module as unknown as {
          createRedisClusterClient: (nodes: unknown) => QuittableClient;
          parseNodes: (list: string, source?: string) => unknown;
          defaultClusterNodes: () => unknown;
        };
        const list = t.url?.replace(/^rediss?:\/\//, '');
        let nodes: unknown;
        try {
          nodes = list ? parseNodes(list, '--url') : defaultClusterNodes();
        } catch (error) {
          throw new UsageError((error as Error).message);
        }
        const client = createRedisClusterClient(nodes);
        client.on('error', () => undefined);
        let store: RowStore;
        try {
          store = await factory(module, 'createRedisStore', spec)({ client, namespace });
        } catch (error) {
          await client.quit().catch(() => undefined);
          throw error;
        }
        return {
          store,
          target: `redis-cluster ${JSON.stringify(nodes)} namespace ${namespace}`,
          close: async () => {
            await store.close().catch(() => undefined);
            await client.quit().catch(() => undefined);
          },
        };
      }
      case 'dynamodb': {
        const spec = '@percolator/dynamodb';
        const endpoint = t.url ?? process.env.PERCOLATOR_DYNAMODB_ENDPOINT;
        const module = await load(spec);
        const region = t.region ?? (process.env.AWS_REGION || process.env.AWS_DEFAULT_REGION || 'us-east-1');
        const tableName = t.dynamoTable ?? (process.env.PERCOLATOR_DYNAMODB_TABLE || 'percolator_test');
        const loopback =
          endpoint !== undefined && /^https?:\/\/(127\.0\.0\.1|localhost|\[::1\])[:/]/.test(endpoint);
        // DynamoDB Local wants some credentials, whatever they are.
        const credentials =
          loopback && !process.env.AWS_ACCESS_KEY_ID
            ? { accessKeyId: 'local', secretAccessKey: 'local' }
            : undefined;
        // createTable is off by default: a missing table is an error, never created here.
        const store = await factory(
          module,
          'createDynamoDbStore',
          spec,
        )({
          ...(endpoint === undefined ? {} : { endpoint }),
          region,
          tableName,
          namespace,
          ...(credentials ? { credentials } : {}),
        });
        return plain(store, `${endpoint ?? `AWS ${region}`} table ${tableName}`);
      }
    }
  } catch (error) {
    if (error instanceof UsageError) throw error;
    if ((t.backend === 'postgres' || t.backend === 'mysql') && (await namespaceMissing(t, namespace)))
      throw new NamespaceNotFoundError(`namespace ${namespace} not found on ${t.backend}`);
    throw new UnreachableError(`cannot open ${t.backend}: ${(error as Error).message}`);
  }
}

/** After a failed open of a SQL store: whether the server answers and has no such namespace. */
async function namespaceMissing(t: StoreTarget, namespace: string): Promise<boolean> {
  try {
    const spec = t.backend === 'postgres' ? '@percolator/postgres' : '@percolator/mysql';
    const module = await load(spec);
    const list = module[t.backend === 'postgres' ? 'listPostgresNamespaces' : 'listMySqlNamespaces'] as (
      o: unknown,
    ) => Promise<{ namespace: string }[]>;
    const url =
      t.url ?? process.env[t.backend === 'postgres' ? 'PERCOLATOR_POSTGRES_URL' : 'PERCOLATOR_MYSQL_URL'];
    const options =
      url === undefined ? {} : t.backend === 'postgres' ? { connectionString: url } : { uri: url };
    return !(await list(options)).some((l) => l.namespace === namespace);
  } catch {
    return false;
  }
}

// ---------------------------------------------------------------------------------------
// Composite deployments

/**
 * A composite deployment as a JSON file (docs/operations.md): named stores, then the same
 * routing every client of the deployment uses (core's CompositeStoreOptions, with store
 * names in place of store objects).
 *
 *     {
 *       "stores": {
 *         "pg":    { "backend": "postgres", "url": "postgres://app@db/app", "namespace": "app" },
 *         "cache": { "backend": "redis", "url": "redis://cache:6379" }
 *       },
 *       "routes": [{ "table": "sessions", "store": "cache" }],
 *       "default": "pg",
 *       "counterStore": "pg"
 *     }
 *
 * `default` may also be `{ "shards": ["pg", "cache"] }`, and a route `{ "table", "shards" }`.
 */
export interface CompositeConfig {
  readonly stores: Record<string, StoreTarget>;
  readonly routes?: readonly ({ table: string; store: string } | { table: string; shards: string[] })[];
  readonly default?: string | { shards: string[] };
  readonly counterStore: string | null;
  readonly name?: string;
}

const CONFIG_KEYS = new Set(['stores', 'routes', 'default', 'counterStore', 'name']);
const STORE_KEYS = new Set(['backend', 'url', 'namespace', 'region', 'dynamoTable']);

export function parseCompositeConfig(text: string, source: string): CompositeConfig {
  let config: unknown;
  try {
    config = JSON.parse(text);
  } catch (error) {
    throw new UsageError(`${source}: not JSON (${(error as Error).message})`);
  }
  const bad = (why: string) => new UsageError(`${source}: ${why}`);
  if (typeof config !== 'object' || config === null || Array.isArray(config))
    throw bad('must be a JSON object');
  const c = config as Record<string, unknown>;
  for (const key of Object.keys(c))
    if (!CONFIG_KEYS.has(key)) throw bad(`unknown field "${key}"; fields are ${[...CONFIG_KEYS].join(', ')}`);
  if (typeof c.stores !== 'object' || c.stores === null || Object.keys(c.stores).length === 0)
    throw bad('"stores" must name at least one store: { "name": { "backend": ..., "url": ... } }');
  for (const [name, s] of Object.entries(c.stores as Record<string, unknown>)) {
    if (typeof s !== 'object' || s === null) throw bad(`stores.${name} must be an object`);
    for (const key of Object.keys(s))
      if (!STORE_KEYS.has(key)) throw bad(`stores.${name} has unknown field "${key}"`);
    const backend = (s as { backend?: unknown }).backend;
    if (!(BACKENDS as readonly unknown[]).includes(backend))
      throw bad(`stores.${name}.backend must be one of ${BACKENDS.join(', ')}`);
  }
  if (!('counterStore' in c))
    throw bad('"counterStore" is required: the store whose counter is the oracle, or null');
  const names = new Set(Object.keys(c.stores as object));
  const known = (n: unknown, where: string) => {
    if (typeof n !== 'string' || !names.has(n))
      throw bad(`${where} names no store in "stores": ${JSON.stringify(n)}`);
  };
  if (c.counterStore !== null) known(c.counterStore, 'counterStore');
  return c as unknown as CompositeConfig;
}

/** Opens every store of a composite deployment (each once) and the composite over them. */
export async function openComposite(
  config: CompositeConfig,
  defaultNamespace?: string,
): Promise<OpenedStore> {
  const opened = new Map<string, OpenedStore>();
  const closeAll = () => Promise.all([...opened.values()].map((o) => o.close().catch(() => undefined)));
  try {
    for (const [name, target] of Object.entries(config.stores))
      opened.set(name, await openBackend({ ...target, namespace: target.namespace ?? defaultNamespace }));
    const store = (name: string, where: string): RowStore => {
      const o = opened.get(name);
      if (!o) throw new UsageError(`${where} names no store in "stores": ${JSON.stringify(name)}`);
      return o.store;
    };
    const placement = (p: string | { shards: string[] }, where: string): Placement =>
      typeof p === 'string'
        ? store(p, where)
        : { shards: (p.shards ?? []).map((n, i) => store(n, `${where}.shards[${i}]`)) };
    const routes: TableRoute[] = (config.routes ?? []).map((r, i) =>
      'store' in r
        ? { table: r.table, store: store(r.store, `routes[${i}].store`) }
        : { table: r.table, shards: r.shards.map((n, j) => store(n, `routes[${i}].shards[${j}]`)) },
    );
    let composite: CompositeStore;
    try {
      composite = new CompositeStore({
        routes,
        ...(config.default === undefined ? {} : { default: placement(config.default, 'default') }),
        counterStore: config.counterStore === null ? null : store(config.counterStore, 'counterStore'),
        ...(config.name === undefined ? {} : { name: config.name }),
        closeStores: false,
      });
    } catch (error) {
      throw new UsageError(`composite config: ${(error as Error).message}`);
    }
    return {
      store: composite,
      target: `composite of ${[...opened.entries()].map(([n, o]) => `${n} (${o.target})`).join(', ')}`,
      close: async () => {
        await composite.close().catch(() => undefined);
        await closeAll();
      },
    };
  } catch (error) {
    await closeAll();
    throw error;
  }
}

export async function loadCompositeConfig(file: string): Promise<CompositeConfig> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (error) {
    throw new UsageError(`cannot read --config ${file}: ${(error as Error).message}`);
  }
  return parseCompositeConfig(text, file);
}
