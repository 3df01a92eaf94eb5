import { InvalidArgumentError } from '../errors.js';
import { checkBooleans, checkInteger, checkOptionKeys, type OptionKeys } from '../options.js';
import { redactUrl } from '../redact.js';
import type { RowStore, StoreCapabilities } from '../store.js';
import { resolveUrl, type UrlLookup } from './env.js';
import { validateNamespace } from './namespace.js';
import { validateQueryTimeout } from './options.js';

/** The optional methods of a RowStore, one per capability. */
type OptionalMethod =
  | 'readMany'
  | 'checkAndSetMany'
  | 'scan'
  | 'incrementCounter'
  | 'scanNotified'
  | 'checkAndSetStamped'
  | 'checkAndSetStampedMany'
  | 'readStamped'
  | 'readPeeked';

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
    stampedCheckAndSetMany: true,
    stampedRead: true,
    peekedRead: true,
    ...overrides,
    maxStateBytes,
  };
}

/** A store in a namespace of its own, which it can drop. */
export type NamespacedStore = FullRowStore & {
  readonly namespace: string;
  /** Drops this namespace's tables: all of its data. The store is unusable afterwards. */
  dropNamespace(): Promise<void>;
};

/** The options every pooled (SQL) store takes, besides its connection URL. */
export interface PooledStoreOptions {
  /** A driver pool you own; `close()` leaves it open. */
  readonly pool?: unknown;
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

/** What a pooled store's factory settles before it connects. */
export interface PooledOpening {
  readonly namespace: string;
  readonly queryTimeoutMs: number;
  /** No pool was passed: the store opens one and ends it on close. */
  readonly ownsPool: boolean;
  readonly url: string;
  /** Where the URL came from, so a failure names what to fix. */
  readonly source: string;
  /** Adds where the store tried to connect to a failure's message (for a pool it opened). */
  explain(error: unknown): void;
}

/** Checks a pooled store's options and resolves its URL (the option `lookup.option` names). */
export function openPooled<O extends PooledStoreOptions>(
  factory: string,
  options: O,
  keys: OptionKeys<O>,
  lookup: UrlLookup,
): PooledOpening {
  checkOptionKeys(factory, options, keys);
  // Each would go to the driver as it is: a pool of -1 connections waited forever (mysql2)
  // or refused every connection (pg), 0 meant no limit, and createSchema: 'false' (from an
  // environment variable, say) ran the DDL it was meant to skip.
  if (options.maxConnections !== undefined)
    checkInteger(`${factory}: maxConnections`, options.maxConnections, 1, 100_000);
  checkBooleans(factory, options, 'createSchema');
  const { pool } = options;
  if (pool !== undefined && (pool === null || typeof pool !== 'object')) {
    throw new InvalidArgumentError(
      `${factory}: pool must be the driver's pool object, got ${pool === null ? 'null' : typeof pool}`,
    );
  }
  const given = (options as Record<string, unknown>)[lookup.option];
  // '' went to the driver, which took its own default (localhost, PG* variables) over the
  // environment's URL; a number failed later with a TypeError.
  if (given !== undefined && (typeof given !== 'string' || given.trim() === ''))
    throw new InvalidArgumentError(
      `${factory}: ${lookup.option} must be a non-empty connection URL string, got ${typeof given === 'string' ? 'an empty string' : typeof given}`,
    );
  // With a pool of the caller's, a URL or a pool size would be dropped without a word.
  if (pool !== undefined) {
    const ignored = [lookup.option, 'maxConnections'].filter(
      (k) => (options as Record<string, unknown>)[k] !== undefined,
    );
    if (ignored.length > 0)
      throw new InvalidArgumentError(
        `${factory}: give either pool or ${ignored.join(' and ')}, not both (a pool of yours has its own connection settings)`,
      );
  }
  const namespace = validateNamespace(options.namespace);
  const queryTimeoutMs = validateQueryTimeout(options.queryTimeoutMs);
  const ownsPool = options.pool === undefined;
  const { url, source } = resolveUrl(lookup, given as string | undefined);
  return {
    namespace,
    queryTimeoutMs,
    ownsPool,
    url,
    source,
    explain(error) {
      if (ownsPool && error instanceof Error)
        error.message += ` (connecting to ${redactUrl(url)}, from ${source})`;
    },
  };
}
