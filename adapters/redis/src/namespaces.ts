import { checkOptionKeys, InvalidArgumentError, type OptionKeys, StoreError } from '@percolator/core';
import { validateNamespace } from '@percolator/core/kit';
import type { Cluster, Redis } from 'ioredis';
import { createRedisClient, defaultRedisUrl } from './client.js';
import { dropFailed, isAuthFailure, toStoreError } from './errors.js';

/*
 * Listing and dropping namespaces, for operators (the conformance CLI's `namespaces` and
 * `drop-namespace`). keys.ts lays a namespace out as keys `<ns>:r:{...}` (rows),
 * `<ns>:i:{...}` (scan indexes), `<ns>:n:{...}` (notification indexes) and `<ns>:c:{...}`
 * (counters). Listing SCANs every master for keys of that shape and groups them by
 * prefix; dropping SCANs for `<ns>:[rinc]:{*` and UNLINKs what it finds. Only keys of that
 * shape count, so an application key such as "session:abc" is neither listed nor dropped.
 * The namespace (validated, no glob characters) is the only variable part of the pattern.
 */

const LAYOUT = /^([a-z][a-z0-9_]{0,31}):([rinc]):\{/;
const KIND_NAMES = { r: 'rows', i: 'scanIndexes', n: 'notifyIndexes', c: 'counters' } as const;
type Kind = keyof typeof KIND_NAMES;

export interface RedisNamespace {
  readonly namespace: string;
  /** Keys of the namespace, all kinds. */
  readonly keys: number;
  /** Keys by kind: row hashes, per-table scan and notification indexes, counters. */
  readonly kinds: { rows: number; scanIndexes: number; notifyIndexes: number; counters: number };
}

export interface RedisNamespaceOptions {
  /** An ioredis `Redis` or `Cluster` client (left open). */
  readonly client?: Redis | Cluster;
  /** Used when no client is given; default env PERCOLATOR_REDIS_URL or redis://127.0.0.1:6379. */
  readonly url?: string;
}

const OPTION_KEYS: OptionKeys<RedisNamespaceOptions> = { client: true, url: true };

async function withClient<T>(
  options: RedisNamespaceOptions,
  work: (nodes: Redis[]) => Promise<T>,
): Promise<T> {
  checkOptionKeys('redis namespaces', options, OPTION_KEYS);
  if (options.client !== undefined && options.url !== undefined) {
    throw new InvalidArgumentError('give either client or url, not both');
  }
  let client = options.client;
  if (client === undefined) {
    const own = createRedisClient(options.url ?? defaultRedisUrl());
    let authFailure: unknown;
    own.on('error', (error) => {
      if (isAuthFailure(error)) authFailure = error;
    });
    try {
      await own.connect();
    } catch (error) {
      own.disconnect();
      const cause = authFailure ?? error;
      throw new StoreError(`cannot connect to Redis: ${(cause as Error).message}`, 'no', {
        cause,
        retryable: !isAuthFailure(cause),
      });
    }
    client = own;
  }
  try {
    if (client.status === 'wait') await client.connect();
    const nodes = client.isCluster ? (client as Cluster).nodes('master') : [client as Redis];
    return await work(nodes);
  } finally {
    if (options.client === undefined) await client.quit().catch(() => client.disconnect());
  }
}

async function scanNode(
  node: Redis,
  pattern: string,
  onKeys: (keys: string[]) => Promise<void>,
): Promise<void> {
  let cursor = '0';
  do {
    const [next, keys] = await node.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
    cursor = next;
    if (keys.length > 0) await onKeys(keys);
  } while (cursor !== '0');
}

/** The namespaces on the server (every master of a cluster), by name. */
export async function listRedisNamespaces(options: RedisNamespaceOptions = {}): Promise<RedisNamespace[]> {
  return withClient(options, async (nodes) => {
    const found = new Map<string, Record<Kind, number>>();
    try {
      await Promise.all(
        nodes.map((node) =>
          scanNode(node, '*:[rinc]:{*', async (keys) => {
            for (const key of keys) {
              const match = LAYOUT.exec(key);
              if (match === null) continue;
              const [, namespace, kind] = match as unknown as [string, string, Kind];
              let counts = found.get(namespace);
              if (counts === undefined) found.set(namespace, (counts = { r: 0, i: 0, n: 0, c: 0 }));
              counts[kind]++;
            }
          }),
        ),
      );
    } catch (error) {
      throw toStoreError(error, 'listing namespaces (SCAN)', 'read');
    }
    return [...found]
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([namespace, c]) => ({
        namespace,
        keys: c.r + c.i + c.n + c.c,
        kinds: { rows: c.r, scanIndexes: c.i, notifyIndexes: c.n, counters: c.c },
      }));
  });
}

/**
 * Drops one namespace: UNLINKs every key of its layout on every master. Resolves to the
 * number of keys it removed, or `undefined` when the namespace had no keys (nothing is
 * dropped). Like the store's `dropNamespace`, clients still writing to the namespace may
 * add keys back while it runs.
 */
export async function dropRedisNamespace(
  namespace: string,
  options: RedisNamespaceOptions = {},
): Promise<{ namespace: string; keys: number } | undefined> {
  const ns = validateNamespace(namespace);
  return withClient(options, async (nodes) => {
    let removed = 0;
    let sent = false;
    try {
      await Promise.all(
        nodes.map((node) =>
          scanNode(node, `${ns}:[rinc]:{*`, async (keys) => {
            sent ||= keys.length > 0;
            // One UNLINK per key: in a cluster the keys of one node span many slots.
            const counts = await Promise.all(keys.map((key) => node.unlink(key)));
            for (const n of counts) removed += n;
          }),
        ),
      );
    } catch (error) {
      throw dropFailed(toStoreError(error, `dropping namespace ${ns}`, 'write'), sent);
    }
    return removed === 0 ? undefined : { namespace: ns, keys: removed };
  });
}
