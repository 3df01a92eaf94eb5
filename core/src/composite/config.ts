import { checkedStore } from '../checked-store.js';
import { InvalidArgumentError } from '../errors.js';
import { describe, validateTable } from '../names.js';
import { isRowStore, type RowStore } from '../store.js';

/** Where a table's rows live: one store, or several with rows spread by a hash of the row key. */
export type Placement = RowStore | { readonly shards: readonly RowStore[] };

/** One table's placement. Give exactly one of `store` and `shards`. */
export type TableRoute =
  | { readonly table: string; readonly store: RowStore }
  | { readonly table: string; readonly shards: readonly RowStore[] };

export interface CompositeStoreOptions {
  /** Per-table placements; a table may appear once. */
  readonly routes?: readonly TableRoute[];
  /** Placement of every table not listed in `routes`. Without it, such tables are an error. */
  readonly default?: Placement;
  /**
   * The store whose atomic counter is the deployment's timestamp oracle: the composite's
   * `incrementCounter` forwards to it, so `new Percolator({ store: composite })` uses it.
   * Every client of the deployment must name the same store (same database / namespace).
   * `null`: no counter; then every client must pass one shared `oracle` to Percolator.
   * Required, so the choice is always deliberate.
   */
  readonly counterStore: RowStore | null;
  /** For messages and reports. Default "composite(<store names>)". */
  readonly name?: string;
  /** Whether `close()` closes every underlying store (once). Default true. */
  readonly closeStores?: boolean;
}

/** A placement after validation: one or more stores; a row's store is `stores[shardOf(key, n)]`. */
export interface ResolvedPlacement {
  readonly stores: readonly RowStore[];
}

export interface ResolvedConfig {
  readonly routes: ReadonlyMap<string, ResolvedPlacement>;
  readonly fallback: ResolvedPlacement | undefined;
  readonly counterStore: RowStore | null;
  /** Every store that holds rows, each once, in first-mention order. */
  readonly rowStores: readonly RowStore[];
  readonly name: string | undefined;
  readonly closeStores: boolean;
}

const OPTION_KEYS = new Set(['routes', 'default', 'counterStore', 'name', 'closeStores']);

/** Checks the whole configuration up front; every mistake is an InvalidArgumentError. */
export function resolveConfig(options: CompositeStoreOptions): ResolvedConfig {
  if (typeof options !== 'object' || options === null) {
    throw new InvalidArgumentError('CompositeStore needs an options object');
  }
  for (const key of Object.keys(options)) {
    if (!OPTION_KEYS.has(key)) {
      throw new InvalidArgumentError(
        `unknown CompositeStore option "${key}"; options are ${[...OPTION_KEYS].join(', ')}`,
      );
    }
  }
  // Every store enters behind the contract check, one wrapper per store (so identity still
  // tells two placements of one store apart from two stores).
  const wrappers = new Map<RowStore, RowStore>();
  const check = (store: RowStore): RowStore => {
    let wrapped = wrappers.get(store);
    if (wrapped === undefined) wrappers.set(store, (wrapped = checkedStore(store)));
    return wrapped;
  };
  const rowStores: RowStore[] = [];
  const remember = (store: RowStore) => {
    if (!rowStores.includes(store)) rowStores.push(store);
  };

  const routes = new Map<string, ResolvedPlacement>();
  if (options.routes !== undefined) {
    if (!Array.isArray(options.routes)) throw new InvalidArgumentError('routes must be an array');
    options.routes.forEach((route: unknown, i: number) => {
      const where = `routes[${i}]`;
      if (typeof route !== 'object' || route === null) {
        throw new InvalidArgumentError(`${where} must be { table, store } or { table, shards }`);
      }
      const r = route as Record<string, unknown>;
      for (const key of Object.keys(r)) {
        if (key !== 'table' && key !== 'store' && key !== 'shards') {
          throw new InvalidArgumentError(
            `${where} has unknown field "${key}"; a route is { table, store } or { table, shards }`,
          );
        }
      }
      try {
        validateTable(r.table);
      } catch (error) {
        throw new InvalidArgumentError(`${where}: ${(error as Error).message}`);
      }
      if (routes.has(r.table)) throw new InvalidArgumentError(`${where}: table "${r.table}" is routed twice`);
      if ((r.store === undefined) === (r.shards === undefined)) {
        throw new InvalidArgumentError(`${where} (table "${r.table}") needs exactly one of store and shards`);
      }
      const placement =
        r.store !== undefined
          ? single(r.store, `${where}.store`, check)
          : sharded(r.shards, `${where}.shards`, check);
      placement.stores.forEach(remember);
      routes.set(r.table, placement);
    });
  }

  let fallback: ResolvedPlacement | undefined;
  if (options.default !== undefined) {
    const d: unknown = options.default;
    if (isRowStore(d)) fallback = single(d, 'default', check);
    else if (typeof d === 'object' && d !== null && 'shards' in d) {
      for (const key of Object.keys(d)) {
        if (key !== 'shards') throw new InvalidArgumentError(`default has unknown field "${key}"`);
      }
      fallback = sharded((d as { shards: unknown }).shards, 'default.shards', check);
    } else {
      throw new InvalidArgumentError(
        `default must be a RowStore or { shards: RowStore[] }, got ${describe(d)}`,
      );
    }
    fallback.stores.forEach(remember);
  }
  if (rowStores.length === 0) {
    throw new InvalidArgumentError('CompositeStore needs at least one route or a default placement');
  }

  const counterStore: unknown = options.counterStore;
  if (counterStore === undefined) {
    throw new InvalidArgumentError(
      'counterStore is required: the store whose atomic counter serves as the timestamp oracle ' +
        'of the whole deployment, or null if every client passes one shared oracle to Percolator',
    );
  }
  if (counterStore !== null) {
    if (!isRowStore(counterStore)) throw new InvalidArgumentError('counterStore must be a RowStore or null');
    if (!counterStore.capabilities.atomicCounter || typeof counterStore.incrementCounter !== 'function') {
      throw new InvalidArgumentError(
        `counterStore "${counterStore.name}" has no atomic counter (capability atomicCounter)`,
      );
    }
  }

  if (options.name !== undefined && (typeof options.name !== 'string' || options.name.length === 0)) {
    throw new InvalidArgumentError('name must be a non-empty string');
  }
  if (options.closeStores !== undefined && typeof options.closeStores !== 'boolean') {
    throw new InvalidArgumentError('closeStores must be a boolean');
  }
  return {
    routes,
    fallback,
    counterStore: counterStore === null ? null : check(counterStore),
    rowStores,
    name: options.name,
    closeStores: options.closeStores ?? true,
  };
}

function single(store: unknown, where: string, check: (store: RowStore) => RowStore): ResolvedPlacement {
  if (!isRowStore(store))
    throw new InvalidArgumentError(`${where} must be a RowStore, got ${describe(store)}`);
  return { stores: [check(store)] };
}

function sharded(shards: unknown, where: string, check: (store: RowStore) => RowStore): ResolvedPlacement {
  if (!Array.isArray(shards) || shards.length === 0) {
    throw new InvalidArgumentError(`${where} must be a non-empty array of RowStores`);
  }
  shards.forEach((s: unknown, i: number) => {
    if (!isRowStore(s))
      throw new InvalidArgumentError(`${where}[${i}] must be a RowStore, got ${describe(s)}`);
    // The same store twice would make two shard numbers share one set of rows.
    if (shards.indexOf(s) !== i) {
      throw new InvalidArgumentError(
        `${where}[${i}] repeats ${where}[${shards.indexOf(s)}]; shards must differ`,
      );
    }
  });
  return { stores: (shards as RowStore[]).map(check) };
}
