import { InvalidArgumentError, redactUrl } from '@percolator/core';
import { type UrlLookup, urlFromEnv, validateQueryTimeout } from '@percolator/core/kit';
import { Cluster, type ClusterOptions, Redis, type RedisOptions } from 'ioredis';

export const DEFAULT_REDIS_URL = 'redis://127.0.0.1:6379';
export const DEFAULT_CLUSTER_NODES = '127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003';
export const DEFAULT_COMMAND_TIMEOUT_MS = 10_000;

export const REDIS_URL: UrlLookup = {
  option: 'url',
  variable: 'PERCOLATOR_REDIS_URL',
  fallback: DEFAULT_REDIS_URL,
};

export function defaultRedisUrl(): string {
  return urlFromEnv(REDIS_URL);
}

/** "host:port,host:port" from PERCOLATOR_REDIS_CLUSTER_NODES, or the local test cluster. */
export function defaultClusterNodes(): { host: string; port: number }[] {
  return parseNodes(process.env.PERCOLATOR_REDIS_CLUSTER_NODES || DEFAULT_CLUSTER_NODES);
}

const NODE = /^(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9._-]+)):(\d{1,5})$/;

/**
 * "host:port,host:port" (an IPv6 address in brackets: "[::1]:7001") as ioredis wants it.
 * Anything else throws InvalidArgumentError naming `source`, where the list came from
 * (default PERCOLATOR_REDIS_CLUSTER_NODES, the usual source; a CLI passes e.g. "--url"),
 * rather than handing ioredis a NaN port.
 */
export function parseNodes(
  list: string,
  source = 'PERCOLATOR_REDIS_CLUSTER_NODES',
): { host: string; port: number }[] {
  const bad = (why: string) =>
    new InvalidArgumentError(
      `Redis Cluster nodes (${source}) must be "host:port,host:port" with IPv6 in brackets: ${why}`,
    );
  if (typeof list !== 'string') throw bad(`got ${typeof list}`);
  const entries = list.split(',').map((s) => s.trim());
  if (entries.every((s) => s.length === 0)) throw bad('the list is empty');
  return entries.map((entry) => {
    const match = NODE.exec(entry);
    const port = Number(match?.[3]);
    if (!match || port < 1 || port > 65535) throw bad(`${JSON.stringify(redactUrl(entry))} is not host:port`);
    return { host: (match[1] ?? match[2])!, port };
  });
}

/**
 * Connection options for one Redis connection, chosen so that a command's outcome is
 * never misreported:
 * - `autoResendUnfulfilledCommands: false`: a command that was in flight when the
 *   connection dropped is NOT sent again after reconnecting (it may already have run; a
 *   resent INCRBY would count twice). The caller gets an error instead ('unknown').
 * - `maxRetriesPerRequest: 0`: with the option above, ioredis would otherwise keep such a
 *   command pending until it times out; 0 makes it fail as soon as the connection closes.
 * - `enableOfflineQueue: false`: while reconnecting, new commands fail at once and are
 *   certainly not sent ('no', retryable) instead of queueing.
 * - `commandTimeout`: a command with no reply in time fails ('unknown': it may still run).
 * - `enableAutoPipelining: false` (ioredis's default): each command is written as it is
 *   sent. Concurrent commands (readMany, checkAndSetMany, scans) are still pipelined on
 *   the wire: none waits for another's reply. Auto-pipelining (commands gathered into one
 *   write per turn of the event loop) cost more client CPU than the writes it saved:
 *   every engine ran faster without it (docs/cost-history.md, twentieth session); and on
 *   a Cluster it handed replies to the wrong commands (clusterOptions).
 * - `lazyConnect`: the store connects and waits for "ready" itself.
 */
export function redisConnectionOptions(commandTimeoutMs?: number): RedisOptions {
  // 1 to 2^31 - 1: a longer timer fires after 1 ms (every command would time out).
  const timeout = validateQueryTimeout(commandTimeoutMs, 'commandTimeoutMs', DEFAULT_COMMAND_TIMEOUT_MS);
  return {
    lazyConnect: true,
    connectionName: 'percolator',
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    autoResendUnfulfilledCommands: false,
    commandTimeout: timeout,
    connectTimeout: 10_000,
    enableAutoPipelining: false,
  };
}

/**
 * Cluster options with the same aims. ioredis always gives node connections an offline
 * queue and no reconnect strategy, so a dropped node connection fails its in-flight
 * commands with "Connection is closed."; `retryDelayOnFailover: 0` stops the Cluster from
 * sending those again (the default would resend them after 100 ms). MOVED, ASK, TRYAGAIN
 * and CLUSTERDOWN replies mean the command did not run, and are still followed.
 *
 * `enableAutoPipelining: false`, on the Cluster (whose setting routes every command; its
 * node connections' is off too, for the calls made on a node directly). With it on,
 * the partition test (integration/test/partition.test.ts, a master cut off while the
 * others answer) failed in 3 of 51 runs (2 of the 23 with a second process loading a
 * core): twice with a node connection that answered every command with the reply of the
 * one before (every command timed out, though the test's proxy had passed every byte of
 * that connection), once with reads given the rows of other keys (the history checker's
 * "garbage-read"). With it off, 0 of 36 runs failed, all with a core loaded. ioredis sends
 * a Cluster's auto-pipelined commands as batches per node, each routed by its first
 * command and retried whole; its issues list open faults there (redis/ioredis#2075).
 * Without it, commands still go out without waiting for each other's replies.
 */
export function clusterOptions(commandTimeoutMs?: number): ClusterOptions {
  const {
    lazyConnect: _lazy,
    enableOfflineQueue: _queue,
    ...perNode
  } = redisConnectionOptions(commandTimeoutMs);
  return {
    lazyConnect: true,
    enableOfflineQueue: false,
    retryDelayOnFailover: 0,
    enableAutoPipelining: false,
    redisOptions: perNode,
  };
}

export function createRedisClient(url = defaultRedisUrl(), commandTimeoutMs?: number): Redis {
  return new Redis(url, redisConnectionOptions(commandTimeoutMs));
}

/** A Cluster client with the options above. The caller connects it and quits it. */
export function createRedisClusterClient(
  nodes: readonly { host: string; port: number }[] = defaultClusterNodes(),
  commandTimeoutMs?: number,
): Cluster {
  return new Cluster([...nodes], clusterOptions(commandTimeoutMs));
}
