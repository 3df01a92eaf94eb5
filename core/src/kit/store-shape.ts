import type { RowStore, StoreCapabilities } from '../store.js';

/** The optional methods of a RowStore, one per capability. */
type OptionalMethod =
  | 'readMany'
  | 'checkAndSetMany'
  | 'scan'
  | 'incrementCounter'
  | 'scanNotified'
  | 'checkAndSetStamped'
  | 'readStamped';

/**
 * A store that implements every optional method, so its type promises them (whether it
 * may use one still follows its `capabilities`: a SQL schema made by hand may lack a
 * stamped routine, and then the flag is false and the method fails with StoreError 'no').
 */
export type FullRowStore = RowStore & Required<Pick<RowStore, OptionalMethod>>;

/** Every capability on, with the store's row limit; `overrides` turn some off. */
export function fullCapabilities(
  maxStateBytes: number,
  overrides: Partial<Omit<StoreCapabilities, 'maxStateBytes'>> = {},
): StoreCapabilities {
  return {
    batchRead: true,
    batchCheckAndSet: true,
    orderedScan: true,
    atomicCounter: true,
    notificationIndex: true,
    stampedCheckAndSet: true,
    stampedRead: true,
    ...overrides,
    maxStateBytes,
  };
}

/** The options every pooled (SQL) store takes, besides its connection URL and its pool. */
export interface PooledStoreOptions {
  /** Isolates this store's tables: /^[a-z][a-z0-9_]{0,31}$/, default 'percolator'. */
  readonly namespace?: string;
  /** Create the tables if missing (default true). Set false if you run the schema SQL yourself. */
  readonly createSchema?: boolean;
  /** Size of the pool the store opens when no `pool` is given (default 10). */
  readonly maxConnections?: number;
  /**
   * How long one statement may wait for its reply before the store gives up (default
   * 30000 ms). The connection is then destroyed and a write is StoreError 'unknown': it
   * may still run on the server. Applies to every data statement, also on a pool you pass.
   */
  readonly queryTimeoutMs?: number;
}

/** The option keys of PooledStoreOptions, for `checkOptionKeys`. */
export const POOLED_STORE_OPTION_KEYS = {
  pool: true,
  namespace: true,
  createSchema: true,
  maxConnections: true,
  queryTimeoutMs: true,
} as const;
