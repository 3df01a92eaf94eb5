import { readFile } from 'node:fs/promises';
import {
  CompositeStore,
  InvalidArgumentError,
  type Placement,
  type RowStore,
  StoreError,
  type TableRoute,
  validateUserTable,
} from '@percolator/core';
import { BACKENDS, type BackendName, isBackendName } from './backends.js';
import { type ConnectedStore, type ConnectOptions, openStoreFrom } from './open.js';

/**
 * A composite deployment written down (JSON): named stores, and how tables route to them.
 * It mirrors `CompositeStore`'s options, with store names in place of stores:
 *
 * {
 *   "name": "shop",
 *   "stores": {
 *     "main":  { "backend": "postgres", "urlEnv": "SHOP_PG_URL", "namespace": "shop" },
 *     "cache": { "backend": "redis", "url": "redis://127.0.0.1:6379", "namespace": "shop" }
 *   },
 *   "routes": [{ "table": "sessions", "store": "cache" }, { "table": "events", "shards": ["main", "cache"] }],
 *   "default": "main",
 *   "counterStore": "main"
 * }
 */
export interface CompositeConfig {
  readonly name?: string;
  readonly stores: Readonly<Record<string, StoreConfig>>;
  readonly routes?: readonly RouteConfig[];
  /** A store name, or { shards: [names] }. */
  readonly default?: string | { readonly shards: readonly string[] };
  /** The store whose atomic counter is the timestamp oracle, or null (every client then passes one shared oracle). */
  readonly counterStore: string | null;
}

export interface StoreConfig {
  readonly backend: BackendName;
  /** The connection URL (see ConnectOptions.url). Give at most one of url and urlEnv. */
  readonly url?: string;
  /** The name of an environment variable holding the URL, so passwords stay out of the file. */
  readonly urlEnv?: string;
  readonly namespace?: string;
  readonly maxConnections?: number;
  /** DynamoDB region. */
  readonly region?: string;
  /** The DynamoDB table holding the namespace (`table` in ConnectOptions; named apart from the routes' tables). */
  readonly dynamoTable?: string;
  readonly create?: boolean;
}

export type RouteConfig =
  | { readonly table: string; readonly store: string }
  | { readonly table: string; readonly shards: readonly string[] };

const CONFIG_KEYS = new Set(['name', 'stores', 'routes', 'default', 'counterStore']);
const STORE_KEYS: Record<string, 'string' | 'number' | 'boolean'> = {
  backend: 'string',
  url: 'string',
  urlEnv: 'string',
  namespace: 'string',
  maxConnections: 'number',
  region: 'string',
  dynamoTable: 'string',
  create: 'boolean',
};
const STORE_NAME = /^[A-Za-z][A-Za-z0-9_-]{0,63}$/;

function bad(where: string, why: string, cause?: unknown): InvalidArgumentError {
  return new InvalidArgumentError(`composite config: ${where}: ${why}`, { cause });
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * Checks a parsed JSON value and returns it as a CompositeConfig. Every mistake is an
 * InvalidArgumentError naming where it is. Table names, the counter's presence and shard
 * rules are checked again by CompositeStore when the deployment is opened.
 */
export function parseCompositeConfig(value: unknown): CompositeConfig {
  if (!isObject(value)) throw bad('the file', 'must hold a JSON object');
  for (const key of Object.keys(value)) {
    if (!CONFIG_KEYS.has(key)) throw bad(key, `unknown field; fields are ${[...CONFIG_KEYS].join(', ')}`);
  }
  if (value.name !== undefined && (typeof value.name !== 'string' || value.name === '')) {
    throw bad('name', 'must be a non-empty string');
  }
  if (!isObject(value.stores) || Object.keys(value.stores).length === 0) {
    throw bad('stores', 'must be an object with at least one named store');
  }
  const names = new Set<string>();
  for (const [name, store] of Object.entries(value.stores)) {
    const where = `stores.${name}`;
    if (!STORE_NAME.test(name)) throw bad(where, `store names must match ${STORE_NAME}`);
    if (!isObject(store)) throw bad(where, 'must be an object');
    for (const [key, v] of Object.entries(store)) {
      const type = STORE_KEYS[key];
      if (type === undefined) {
        throw bad(`${where}.${key}`, `unknown field; fields are ${Object.keys(STORE_KEYS).join(', ')}`);
      }
      if (typeof v !== type) throw bad(`${where}.${key}`, `must be a ${type}`);
    }
    if (!isBackendName(store.backend)) throw bad(`${where}.backend`, `must be one of ${BACKENDS.join(', ')}`);
    if (store.url !== undefined && store.urlEnv !== undefined) {
      throw bad(where, 'give at most one of url and urlEnv');
    }
    names.add(name);
  }
  const storeName = (v: unknown, where: string): string => {
    if (typeof v !== 'string' || !names.has(v)) {
      // What was there, without its text when that could be a secret (a URL with a password
      // written where a store name belongs: found in review).
      const got =
        typeof v === 'string' && !STORE_NAME.test(v)
          ? `a string that names no store (${v.length} characters${/^[a-z][a-z0-9+.-]*:\/\//i.test(v) ? ', a URL' : ''})`
          : JSON.stringify(v);
      throw bad(where, `must name a store in "stores" (${[...names].join(', ')}), got ${got}`);
    }
    return v;
  };
  const shardNames = (v: unknown, where: string): string[] => {
    if (!Array.isArray(v) || v.length === 0) throw bad(where, 'must be a non-empty array of store names');
    const list = v.map((s, i) => storeName(s, `${where}[${i}]`));
    const twice = list.find((name, i) => list.indexOf(name) !== i);
    if (twice !== undefined) throw bad(where, `names store ${twice} twice (each shard once)`);
    return list;
  };
  // Checked here, before any store is opened (and so before any is created), as well as by
  // the CompositeStore: a file it would refuse created tables first (found in review).
  const routed = new Set<string>();
  if (value.routes !== undefined) {
    if (!Array.isArray(value.routes)) throw bad('routes', 'must be an array');
    value.routes.forEach((route: unknown, i: number) => {
      const where = `routes[${i}]`;
      if (!isObject(route)) throw bad(where, 'must be { table, store } or { table, shards }');
      for (const key of Object.keys(route)) {
        if (key !== 'table' && key !== 'store' && key !== 'shards')
          throw bad(`${where}.${key}`, 'unknown field');
      }
      if (typeof route.table !== 'string') throw bad(`${where}.table`, 'must be a string');
      try {
        validateUserTable(route.table);
      } catch (error) {
        throw bad(`${where}.table`, (error as Error).message);
      }
      if (routed.has(route.table)) throw bad(`${where}.table`, `table ${route.table} is routed twice`);
      routed.add(route.table);
      if ((route.store === undefined) === (route.shards === undefined)) {
        throw bad(where, 'needs exactly one of store and shards');
      }
      if (route.store !== undefined) storeName(route.store, `${where}.store`);
      else shardNames(route.shards, `${where}.shards`);
    });
  }
  if (value.default !== undefined) {
    if (isObject(value.default)) {
      for (const key of Object.keys(value.default)) {
        if (key !== 'shards') throw bad(`default.${key}`, 'unknown field');
      }
      shardNames(value.default.shards, 'default.shards');
    } else storeName(value.default, 'default');
  }
  if ((value.routes === undefined || value.routes.length === 0) && value.default === undefined) {
    throw bad('the file', 'needs routes, a default, or both');
  }
  if (value.counterStore === undefined) {
    throw bad(
      'counterStore',
      'is required: the store whose counter is the timestamp oracle, or null if every client passes one shared oracle',
    );
  }
  if (value.counterStore !== null) storeName(value.counterStore, 'counterStore');
  return value as unknown as CompositeConfig;
}

/** Reads and checks a composite config file (JSON). */
export async function readCompositeConfig(path: string): Promise<CompositeConfig> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (error) {
    throw new InvalidArgumentError(`cannot read composite config ${path}: ${(error as Error).message}`);
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (error) {
    // Node quotes the text around a bad token, which may be part of a password (an unquoted
    // URL): only where it is.
    const at = /position (\d+)/.exec((error as Error).message)?.[1];
    throw new InvalidArgumentError(
      `composite config ${path} is not JSON${at === undefined ? '' : ` (at character ${at})`}`,
    );
  }
  return parseCompositeConfig(parsed);
}

/** An open composite deployment. */
export interface ConnectedComposite {
  readonly store: CompositeStore;
  /** Each named store, open. */
  readonly stores: ReadonlyMap<string, ConnectedStore>;
  /** "name: target" of every store, passwords hidden. */
  readonly target: string;
  /** Drops every store's namespace (they stay open). */
  dropNamespace(): Promise<void>;
  /** Closes the composite and every store (and client) it opened. */
  close(): Promise<void>;
}

export interface OpenCompositeOptions {
  /** Where urlEnv and each backend's defaults are read. Default `process.env`. */
  readonly env?: NodeJS.ProcessEnv;
}

/** Opens every store of a config (parsed again, so a hand-built object is checked too) and the composite over them. */
export async function openComposite(
  config: CompositeConfig,
  options: OpenCompositeOptions = {},
): Promise<ConnectedComposite> {
  const checked = parseCompositeConfig(config);
  const env = options.env ?? process.env;
  const stores = new Map<string, ConnectedStore>();
  const closeOpened = async () => {
    for (const c of stores.values()) await c.close().catch(() => undefined);
  };
  try {
    for (const [name, s] of Object.entries(checked.stores)) {
      let url = s.url;
      if (s.urlEnv !== undefined) {
        url = env[s.urlEnv]?.trim();
        if (!url) throw bad(`stores.${name}.urlEnv`, `the environment variable ${s.urlEnv} is not set`);
      }
      const connect: ConnectOptions = {
        env,
        ...(url === undefined ? {} : { url }),
        ...(s.namespace === undefined ? {} : { namespace: s.namespace }),
        ...(s.maxConnections === undefined ? {} : { maxConnections: s.maxConnections }),
        ...(s.region === undefined ? {} : { region: s.region }),
        ...(s.dynamoTable === undefined ? {} : { table: s.dynamoTable }),
        ...(s.create === undefined ? {} : { create: s.create }),
      };
      // Messages name what the file says (stores.NAME.url, or the variable urlEnv names),
      // not connect's url option.
      const label =
        s.urlEnv !== undefined
          ? `${s.urlEnv} (stores.${name}.urlEnv)`
          : s.url !== undefined
            ? `stores.${name}.url`
            : undefined;
      try {
        stores.set(name, await openStoreFrom(s.backend, connect, label));
      } catch (error) {
        // Which store, for a setting refused (the message names the field, not the store).
        if (error instanceof InvalidArgumentError && !error.message.startsWith('composite config'))
          throw bad(`stores.${name}`, error.message, error);
        throw error;
      }
    }
    const store = (name: string): RowStore => stores.get(name)!.store;
    const placement = (p: string | { readonly shards: readonly string[] }): Placement =>
      typeof p === 'string' ? store(p) : { shards: p.shards.map(store) };
    const routes: TableRoute[] = (checked.routes ?? []).map((r) =>
      'store' in r
        ? { table: r.table, store: store(r.store) }
        : { table: r.table, shards: r.shards.map(store) },
    );
    const composite = new CompositeStore({
      ...(checked.name === undefined ? {} : { name: checked.name }),
      routes,
      ...(checked.default === undefined ? {} : { default: placement(checked.default) }),
      counterStore: checked.counterStore === null ? null : store(checked.counterStore),
      // Closed below through each ConnectedStore, which also quits clients opened for them.
      closeStores: false,
    });
    let closed: Promise<void> | undefined;
    return {
      store: composite,
      stores,
      target: [...stores].map(([name, c]) => `${name}: ${c.backend} ${c.target}`).join('; '),
      async dropNamespace() {
        // Every store but the counter's first, each tried; the counter's last, and only once
        // every other is empty: a counter dropped beside rows left behind would start again
        // from 0 below their timestamps (found in review).
        const counterName = checked.counterStore;
        const failures: string[] = [];
        let first: unknown;
        for (const [name, c] of stores) {
          if (name === counterName) continue;
          try {
            await c.dropNamespace();
          } catch (error) {
            first ??= error;
            failures.push(`${name}: ${(error as Error).message}`);
          }
        }
        if (failures.length > 0) {
          const kept = counterName === null ? '' : `; the counter store ${counterName} was left as it was`;
          if (failures.length === 1 && first instanceof Error) {
            first.message += kept;
            throw first;
          }
          throw new StoreError(`dropping the namespace failed in ${failures.join('; ')}${kept}`, 'unknown', {
            cause: first,
          });
        }
        if (counterName !== null) await stores.get(counterName)!.dropNamespace();
      },
      close: () => {
        closed ??= (async () => {
          try {
            await composite.close();
          } finally {
            await closeOpened();
          }
        })();
        return closed;
      },
    };
  } catch (error) {
    await closeOpened();
    throw error;
  }
}
