import { checkedStore, InvalidArgumentError, redactUrl, StoreError } from '@percolator/core';
import { resolveUrl, validateNamespace } from '@percolator/core/kit';
import type { Cluster, Redis } from 'ioredis';
import { createRedisClient, REDIS_URL } from './client.js';
import { isAuthFailure } from './errors.js';
import { checkOptionKeys, type OptionKeys } from './options.js';
import {
  CAS_MANY_SCRIPT,
  CAS_SCRIPT,
  loadScripts,
  READ_PEEKED_SCRIPT,
  READ_STAMPED_SCRIPT,
} from './scripts.js';
import { type RedisClient, RedisStore } from './store.js';

export { DEFAULT_NAMESPACE, NAMESPACE_PATTERN, NAMESPACE_PATTERN as NAMESPACE } from '@percolator/core/kit';
export {
  clusterOptions,
  createRedisClient,
  createRedisClusterClient,
  DEFAULT_CLUSTER_NODES,
  DEFAULT_COMMAND_TIMEOUT_MS,
  DEFAULT_REDIS_URL,
  defaultClusterNodes,
  defaultRedisUrl,
  parseNodes,
  redisConnectionOptions,
} from './client.js';
export {
  dropRedisNamespace,
  listRedisNamespaces,
  type RedisNamespace,
  type RedisNamespaceOptions,
} from './namespaces.js';
export { REDIS_MAX_STATE_BYTES, type RedisClient, RedisStore } from './store.js';

export interface RedisStoreOptions {
  /**
   * An ioredis `Redis` or `Cluster` client. The store does not quit it on close. Use the
   * options of `redisConnectionOptions()` / `clusterOptions()` (see client.ts for why).
   */
  client?: Redis | Cluster;
  /** Used when no client is given; default env PERCOLATOR_REDIS_URL or redis://127.0.0.1:6379. */
  url?: string;
  /** Prefix of every key; /^[a-z][a-z0-9_]{0,31}$/, default "percolator". */
  namespace?: string;
  /** Command timeout of a client the store creates; default 10 s. */
  commandTimeoutMs?: number;
}

const OPTION_KEYS: OptionKeys<RedisStoreOptions> = {
  client: true,
  url: true,
  namespace: true,
  commandTimeoutMs: true,
};

/**
 * A client passed in must never send a command again after its reply was lost, nor read
 * from replicas: a script resent after it ran answers as if it had not (a delete finds the
 * row gone, a put finds another writer's row: "not applied" for a write that was), and a
 * replica's read may be stale. ioredis does the first by default (standalone
 * `autoResendUnfulfilledCommands`, Cluster `retryDelayOnFailover`), so such a client is
 * refused, as one with a `keyPrefix` is; `createRedisClient` and `createRedisClusterClient`
 * (or the options of `redisConnectionOptions` and `clusterOptions`) make one that is not.
 * So is a Cluster client with `enableAutoPipelining`: under faults its node connections
 * handed replies to the wrong commands (client.ts, clusterOptions). And one with neither
 * `maxRetriesPerRequest: 0` nor a `commandTimeout`: a command in flight at a dropped
 * connection would then never be answered.
 */
function checkNoResend(client: RedisClient): void {
  const cluster = (client as { isCluster?: boolean }).isCluster === true;
  const options = client.options as {
    autoResendUnfulfilledCommands?: boolean;
    retryDelayOnFailover?: number;
    scaleReads?: unknown;
    enableAutoPipelining?: boolean;
    maxRetriesPerRequest?: number | null;
    commandTimeout?: number;
    redisOptions?: {
      autoResendUnfulfilledCommands?: boolean;
      maxRetriesPerRequest?: number | null;
      commandTimeout?: number;
    };
  };
  const wrong: string[] = [];
  const nodeOptions = cluster ? options.redisOptions : options;
  // ioredis's default for a missing setting is true.
  if (nodeOptions?.autoResendUnfulfilledCommands !== false)
    wrong.push(`autoResendUnfulfilledCommands: false${cluster ? ' (in redisOptions)' : ''}`);
  // Without resending, a command in flight when the connection dropped is set aside and
  // then dropped at the reconnect without an answer: it fails only when the reconnects give
  // up (maxRetriesPerRequest 0: at the first close) or its commandTimeout fires. With
  // neither, the caller's promise never settles.
  const timeout = nodeOptions?.commandTimeout;
  if (nodeOptions?.maxRetriesPerRequest !== 0 && !(typeof timeout === 'number' && timeout > 0))
    wrong.push(`maxRetriesPerRequest: 0 or a commandTimeout${cluster ? ' (in redisOptions)' : ''}`);
  if (cluster && options.retryDelayOnFailover !== 0) wrong.push('retryDelayOnFailover: 0');
  if (cluster && options.scaleReads !== undefined && options.scaleReads !== 'master')
    wrong.push("scaleReads: 'master'");
  // ioredis tests the setting for truth, so does this.
  if (cluster && options.enableAutoPipelining) wrong.push('enableAutoPipelining: false');
  if (wrong.length > 0) {
    throw new InvalidArgumentError(
      `the redis client passed in could send a write again after its reply was lost, read from a replica, hand a reply to the wrong command, or leave a command unanswered after a reconnect: it needs ${wrong.join(', ')}; make it with ${cluster ? 'createRedisClusterClient() or clusterOptions()' : 'createRedisClient() or redisConnectionOptions()'}`,
    );
  }
}

/** Connects (if needed), loads the scripts and resolves to a ready store. */
export async function createRedisStore(options: RedisStoreOptions = {}): Promise<RedisStore> {
  checkOptionKeys('createRedisStore', options, OPTION_KEYS);
  const namespace = validateNamespace(options.namespace);
  // null opened a connection of the store's own, silently; {} or a URL string failed with
  // a TypeError further on.
  if (
    options.client !== undefined &&
    (typeof options.client !== 'object' ||
      options.client === null ||
      typeof (options.client as { sendCommand?: unknown }).sendCommand !== 'function')
  )
    throw new InvalidArgumentError(
      'createRedisStore: client must be an ioredis Redis or Cluster client (pass url for a connection string)',
    );
  if (options.client && (options.url !== undefined || options.commandTimeoutMs !== undefined)) {
    throw new InvalidArgumentError('createRedisStore: give either client or url/commandTimeoutMs, not both');
  }
  let client: RedisClient;
  const owns = !options.client;
  if (options.client) {
    client = options.client;
    if (client.options.keyPrefix) {
      // ioredis would prefix command keys but not SCAN patterns; use `namespace` instead.
      throw new InvalidArgumentError('the redis client must not have a keyPrefix; use the namespace option');
    }
    checkNoResend(client);
    try {
      await whenReady(client);
    } catch (error) {
      throw new StoreError(
        `the redis client passed in (${describeClient(client)}) did not connect: ${(error as Error).message}`,
        'no',
        { cause: error, retryable: (error as { retryable?: unknown }).retryable !== false },
      );
    }
  } else {
    const { url, source } = resolveUrl(REDIS_URL, options.url);
    client = createRedisClient(url, options.commandTimeoutMs);
    // A refused AUTH (WRONGPASS) arrives only as an 'error' event; connect() then fails
    // with a bare "Connection is closed.", so the last event is kept to say why.
    let authFailure: unknown;
    client.on('error', (error) => {
      // Connection errors also reach the caller through the failed command; without a
      // listener ioredis would print every reconnect attempt.
      if (isAuthFailure(error)) authFailure = error;
    });
    try {
      await client.connect();
    } catch (error) {
      client.disconnect();
      const cause = authFailure ?? error;
      throw new StoreError(
        `cannot connect to Redis at ${redactUrl(url)} (from ${source}): ${(cause as Error).message}`,
        'no',
        { cause, retryable: !isAuthFailure(cause) },
      );
    }
  }
  if (!client.isCluster) {
    // A standalone client on a node of a Cluster would be given the standalone store's
    // one-step scripts, which name keys of many slots (CROSSSLOT), and its row commands
    // would meet MOVED for the slots of other nodes: every call failing as retryable, for
    // ever, with no word of why (found in review). INFO refused (an ACL) proves nothing.
    const info = await (client as Redis).info('cluster').catch(() => '');
    if (/^cluster_enabled:1\b/m.test(info)) {
      if (owns) client.disconnect();
      throw new InvalidArgumentError(
        `the ${describeClient(client)} is a node of a Redis Cluster: connect with a Cluster client (createRedisClusterClient, or the redis-cluster backend with the node list), not a standalone one`,
      );
    }
  }
  try {
    // The stamped and peeked reads and the stamped CAS of many rows run only on a standalone
    // Redis (see RedisStore). Every script a store runs is loaded here, so no first call pays
    // EVALSHA, NOSCRIPT, then EVAL with the script's whole text.
    await loadScripts(
      client,
      client.isCluster
        ? [CAS_SCRIPT]
        : [CAS_SCRIPT, CAS_MANY_SCRIPT, READ_STAMPED_SCRIPT, READ_PEEKED_SCRIPT],
    );
  } catch (error) {
    if (owns) client.disconnect();
    throw new StoreError(`redis SCRIPT LOAD failed: ${(error as Error).message}`, 'no', {
      cause: error,
      retryable: !isAuthFailure(error),
    });
  }
  return checkedStore(new RedisStore(client, namespace, owns));
}

const READY_TIMEOUT_MS = 15_000;

async function whenReady(client: RedisClient): Promise<void> {
  if (client.status === 'ready') return;
  if (client.status === 'wait') {
    let authFailure: unknown;
    const onError = (error: unknown) => {
      if (isAuthFailure(error)) authFailure = error;
    };
    client.on('error', onError);
    try {
      await client.connect();
    } catch (error) {
      if (authFailure === undefined) throw error;
      throw notAuthenticated(authFailure);
    } finally {
      client.off('error', onError);
    }
    return;
  }
  if (client.status === 'end' || client.status === 'close') {
    throw new StoreError(`the redis client is ${client.status}`, 'no');
  }
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(
      () => done(new StoreError('the redis client did not become ready', 'no')),
      READY_TIMEOUT_MS,
    );
    const onReady = () => done();
    const onEnd = () => done(new StoreError('the redis client ended before it was ready', 'no'));
    // A refused AUTH will not be fixed by the client's reconnects: fail now, not after the wait.
    const onError = (error: unknown) => {
      if (isAuthFailure(error)) done(notAuthenticated(error));
    };
    function done(error?: Error) {
      clearTimeout(timer);
      client.off('ready', onReady);
      client.off('end', onEnd);
      client.off('error', onError);
      if (error) reject(error);
      else resolve();
    }
    client.on('ready', onReady);
    client.on('end', onEnd);
    client.on('error', onError);
  });
}

function notAuthenticated(error: unknown): StoreError {
  return new StoreError(`the redis client could not authenticate: ${(error as Error).message}`, 'no', {
    cause: error,
    retryable: false,
  });
}

/** Where a caller's client connects, for messages (no passwords). */
function describeClient(client: RedisClient): string {
  const nodes = (client as { startupNodes?: unknown }).startupNodes;
  if (Array.isArray(nodes)) {
    const list = nodes.map((n) =>
      typeof n === 'string' ? n : `${(n as { host?: string }).host}:${(n as { port?: number }).port}`,
    );
    return `Redis Cluster at ${list.join(',')}`;
  }
  const { host, port } = client.options as { host?: string; port?: number };
  return `Redis at ${host}:${port}`;
}
