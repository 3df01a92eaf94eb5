import { uncheckedStore } from './checked-store.js';
import {
  type CompositeStoreOptions,
  type ResolvedConfig,
  type ResolvedPlacement,
  resolveConfig,
} from './composite/config.js';
import { mergeShards } from './composite/merge.js';
import { shardOf } from './composite/shard-hash.js';
import {
  ClosedError,
  InvalidArgumentError,
  RowTooLargeError,
  StoreError,
  UnsupportedOperationError,
} from './errors.js';
import { compareKeys } from './names.js';
import { LEASE_TABLE } from './observers/lease.js';
import type {
  CasRequest,
  CasResult,
  NotificationScanOptions,
  RowRef,
  RowStore,
  ScannedStoredRow,
  ScanOptions,
  StoreCapabilities,
  StoredRow,
} from './store.js';
import { baseTableOf, INTERNAL_TABLE_PREFIX, isVersionTable, versionTable } from './versions.js';

export type { CompositeStoreOptions, Placement, TableRoute } from './composite/config.js';
export { shardOf } from './composite/shard-hash.js';

/**
 * A RowStore made of other RowStores: each row goes to one underlying store, chosen by its
 * table and, for a sharded table, by a hash of its row key (`shardOf`). The core runs on it
 * unchanged, so one transaction may write rows in two PostgreSQL databases, or a
 * PostgreSQL row, a Redis key and a DynamoDB item, and commit them atomically with
 * snapshot isolation: the protocol only ever needs single-row CAS, and a row always lives
 * in exactly one store. The commit point is the primary row's CAS in its own store.
 *
 * The routing is part of the data layout: a row's store must never change while it holds
 * data, so every client must use the same routes, and changing them needs a migration
 * (docs/multi-store.md). That is also why versions need no store prefix: a version is only
 * ever compared by the store that issued it.
 */
export class CompositeStore implements RowStore {
  readonly name: string;
  readonly capabilities: StoreCapabilities;
  /** Every store that holds rows, each once. */
  readonly stores: readonly RowStore[];
  /** The store whose counter is the oracle, or null. */
  readonly counterStore: RowStore | null;
  private readonly config: ResolvedConfig;
  private closed = false;
  private closing: Promise<void> | undefined;

  constructor(options: CompositeStoreOptions) {
    this.config = resolveConfig(options);
    const { rowStores, counterStore } = this.config;
    // The stores as the caller gave them; calls go through their checked wrappers (config.ts).
    this.stores = rowStores.map(uncheckedStore);
    this.counterStore = counterStore === null ? null : uncheckedStore(counterStore);
    this.name = this.config.name ?? `composite(${rowStores.map((s) => s.name).join('+')})`;
    // What the composite can promise is what every store it may route to can do.
    const all = (flag: keyof Omit<StoreCapabilities, 'maxStateBytes' | 'sharedCallsInFlight'>) =>
      rowStores.every((s) => s.capabilities[flag]);
    this.capabilities = {
      batchRead: all('batchRead'),
      batchCheckAndSet: all('batchCheckAndSet'),
      orderedScan: all('orderedScan'),
      notificationIndex: all('notificationIndex'),
      atomicCounter: counterStore !== null,
      // A stamped CAS draws the commit timestamp in the row's own atomic step: impossible
      // when the counter and the row may live in different stores.
      stampedCheckAndSet: false,
      maxStateBytes: Math.min(...rowStores.map((s) => s.capabilities.maxStateBytes)),
    };
  }

  /** The store that holds (table, key). Throws InvalidArgumentError for a table with no route. */
  storeFor(table: string, key: string): RowStore {
    return uncheckedStore(this.route(table, key));
  }

  /** `storeFor`, behind the contract check: where calls go. */
  private route(table: string, key: string): RowStore {
    const { stores } = this.placement(table);
    return stores.length === 1 ? stores[0]! : stores[shardOf(key, stores.length)]!;
  }

  async read(table: string, key: string): Promise<StoredRow | null> {
    this.assertOpen();
    return this.route(table, key).read(table, key);
  }

  async checkAndSet(request: CasRequest): Promise<CasResult> {
    this.assertOpen();
    this.checkSize(request);
    return this.route(request.table, request.key).checkAndSet(request);
  }

  /** One call per store, all in parallel; results in request order. */
  async readMany(rows: readonly RowRef[]): Promise<(StoredRow | null)[]> {
    this.assertOpen();
    const out = new Array<StoredRow | null>(rows.length);
    await Promise.all(
      this.groupByStore(rows).map(async ({ store, indexes }) => {
        const refs = indexes.map((i) => rows[i]!);
        const found =
          store.capabilities.batchRead && store.readMany
            ? await store.readMany(refs)
            : await Promise.all(refs.map((r) => store.read(r.table, r.key)));
        indexes.forEach((i, n) => {
          out[i] = found[n] ?? null;
        });
      }),
    );
    return out;
  }

  /**
   * One call per store, all in parallel; each request applies or not on its own, as the
   * contract says. If any store's call fails, the whole call fails: with the store's own
   * "certainly not applied" error only if nothing anywhere was applied, otherwise with
   * `StoreError(..., 'unknown')` (the core then re-reads the rows).
   */
  async checkAndSetMany(requests: readonly CasRequest[]): Promise<CasResult[]> {
    this.assertOpen();
    for (const r of requests) this.checkSize(r);
    const out = new Array<CasResult>(requests.length);
    const groups = this.groupByStore(requests);
    const settled = await Promise.allSettled(
      groups.map(async ({ store, indexes }) => {
        const batch = indexes.map((i) => requests[i]!);
        const results =
          store.capabilities.batchCheckAndSet && store.checkAndSetMany
            ? await store.checkAndSetMany(batch)
            : await casOneByOne(store, batch);
        indexes.forEach((i, n) => {
          out[i] = results[n]!;
        });
        return results;
      }),
    );
    const failures = settled.flatMap((s) => (s.status === 'rejected' ? [s.reason as unknown] : []));
    if (failures.length === 0) return out;
    const appliedSomewhere = settled.some((s) => s.status === 'fulfilled' && s.value.some((r) => r.ok));
    if (!appliedSomewhere && failures.every(certainlyNotApplied)) throw failures[0];
    throw new StoreError(
      `checkAndSetMany failed on ${failures.length} of ${groups.length} stores; some requests may have been applied`,
      'unknown',
      { cause: failures[0] },
    );
  }

  /** Rows of `table` in compareKeys order; a sharded table's shards are merged. */
  async scan(table: string, options: ScanOptions): Promise<ScannedStoredRow[]> {
    this.assertOpen();
    const { stores } = this.placement(table);
    for (const s of stores) {
      if (!s.capabilities.orderedScan || !s.scan) {
        throw new UnsupportedOperationError(`store "${s.name}" (table "${table}") cannot scan in key order`);
      }
    }
    if (stores.length === 1) return stores[0]!.scan!(table, options);
    return mergeShards(
      stores.length,
      (shard, after, limit) =>
        stores[shard]!.scan!(table, { ...options, after: after ?? options.after, limit }),
      (row) => row.key,
      options.limit,
    );
  }

  /** Keys of notified rows of `table` in compareKeys order, merged over its shards. */
  async scanNotified(table: string, options: NotificationScanOptions): Promise<string[]> {
    this.assertOpen();
    const { stores } = this.placement(table);
    for (const s of stores) {
      if (!s.capabilities.notificationIndex || !s.scanNotified) {
        throw new UnsupportedOperationError(`store "${s.name}" (table "${table}") has no notification index`);
      }
    }
    if (stores.length === 1) return stores[0]!.scanNotified!(table, options);
    return mergeShards(
      stores.length,
      (shard, after, limit) => stores[shard]!.scanNotified!(table, { after: after ?? options.after, limit }),
      (key) => key,
      options.limit,
    );
  }

  /** Forwards to the counter store: one oracle for the whole deployment. */
  async incrementCounter(name: string, delta: number): Promise<number> {
    this.assertOpen();
    const counter = this.config.counterStore;
    if (counter === null) {
      throw new UnsupportedOperationError(
        `${this.name} has no counterStore; pass one shared oracle to every Percolator client`,
      );
    }
    return counter.incrementCounter!(name, delta);
  }

  /** Closes every underlying store once (the row stores and the counter store), unless `closeStores: false`. */
  close(): Promise<void> {
    // A second close() made while the first runs waits for the same stores to close.
    this.closing ??= this.closeStores();
    return this.closing;
  }

  private async closeStores(): Promise<void> {
    this.closed = true;
    if (!this.config.closeStores) return;
    const all = [...this.config.rowStores];
    const counter = this.config.counterStore;
    if (counter && !all.includes(counter)) all.push(counter);
    const results = await Promise.allSettled(all.map((s) => s.close()));
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
  }

  private placement(table: string): ResolvedPlacement {
    const placement = this.config.routes.get(table) ?? this.internalPlacement(table) ?? this.config.fallback;
    if (placement === undefined) {
      throw new InvalidArgumentError(
        `table ${JSON.stringify(table)} has no route in ${this.name}, and it has no default placement`,
      );
    }
    return placement;
  }

  /**
   * The library's own tables follow the data they serve, so no route has to name them:
   * a user table's version rows (`__v.` / `__h.`) go where that table goes, and observer
   * leases (`__lease`) go to the default placement, or else to the route of the table that
   * sorts first (UTF-8 byte order): every client finds them in one place however it lists
   * its routes (they went to the first route listed, so two clients listing the same
   * routes in other orders took leases in two stores, and ran rows twice: found in review).
   */
  private internalPlacement(table: string): ResolvedPlacement | undefined {
    if (!table.startsWith(INTERNAL_TABLE_PREFIX)) return undefined;
    if (isVersionTable(table)) {
      const base = baseTableOf(table) ?? this.hashedVersionTables().get(table);
      return base === undefined ? undefined : this.config.routes.get(base);
    }
    if (table === LEASE_TABLE) return this.config.fallback ?? this.leasePlacement();
    return undefined;
  }

  private leaseRoute: ResolvedPlacement | undefined;
  private leasePlacement(): ResolvedPlacement | undefined {
    if (this.leaseRoute === undefined) {
      const tables = [...this.config.routes.keys()].sort(compareKeys);
      this.leaseRoute = tables.length === 0 ? undefined : this.config.routes.get(tables[0]!);
    }
    return this.leaseRoute;
  }

  private hashedNames: Map<string, string> | undefined;
  private hashedVersionTables(): Map<string, string> {
    if (!this.hashedNames) {
      this.hashedNames = new Map();
      for (const table of this.config.routes.keys()) this.hashedNames.set(versionTable(table), table);
    }
    return this.hashedNames;
  }

  /** A state past the smallest store's limit is refused before anything is sent, whatever store it routes to. */
  private checkSize(request: CasRequest): void {
    const size = request.state?.length ?? 0;
    if (size > this.capabilities.maxStateBytes) {
      throw new RowTooLargeError(
        `row state of ${size} bytes exceeds ${this.name}'s limit of ${this.capabilities.maxStateBytes} (the smallest of its stores)`,
      );
    }
  }

  private groupByStore(refs: readonly RowRef[]): { store: RowStore; indexes: number[] }[] {
    const groups = new Map<RowStore, number[]>();
    refs.forEach((ref, i) => {
      const store = this.route(ref.table, ref.key);
      let indexes = groups.get(store);
      if (!indexes) groups.set(store, (indexes = []));
      indexes.push(i);
    });
    return [...groups].map(([store, indexes]) => ({ store, indexes }));
  }

  private assertOpen(): void {
    if (this.closed) throw new ClosedError(`${this.name} is closed`);
  }
}

/** For a store without batchCheckAndSet: its CASes in parallel, failing like a batch would. */
async function casOneByOne(store: RowStore, batch: readonly CasRequest[]): Promise<CasResult[]> {
  const settled = await Promise.allSettled(batch.map((r) => store.checkAndSet(r)));
  const failures = settled.flatMap((s) => (s.status === 'rejected' ? [s.reason as unknown] : []));
  if (failures.length === 0) return settled.map((s) => (s as PromiseFulfilledResult<CasResult>).value);
  const applied = settled.some((s) => s.status === 'fulfilled' && s.value.ok);
  if (!applied && failures.every(certainlyNotApplied)) throw failures[0];
  throw new StoreError(`checkAndSetMany on ${store.name}: some requests may have been applied`, 'unknown', {
    cause: failures[0],
  });
}

/** Errors that promise the store applied nothing: it refused before sending, or said so. */
function certainlyNotApplied(error: unknown): boolean {
  return (
    (error instanceof StoreError && error.applied === 'no') ||
    error instanceof RowTooLargeError ||
    error instanceof InvalidArgumentError
  );
}
