/**
 * The local Redis Cluster for tests (`@percolator/testkit/redis`): `redis-cluster.sh` in
 * this package, three masters on 127.0.0.1:7001-7003, and checks that it answers. Private
 * redis-servers a test may pause, kill and restart are in private.ts.
 */
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import {
  createRedisClient,
  createRedisClusterClient,
  DEFAULT_CLUSTER_NODES,
  defaultClusterNodes,
  type RedisClient,
} from '@percolator/redis';

/** The script that runs the local 3-master Redis Cluster: start | stop | status | acquire ID | release ID. */
export const REDIS_CLUSTER_SCRIPT = fileURLToPath(new URL('../redis-cluster.sh', import.meta.url));

export interface ClusterScriptOptions {
  /** Ports of the nodes, for the script's PERCOLATOR_REDIS_CLUSTER_PORTS. Default 7001 7002 7003. */
  readonly ports?: readonly number[];
  readonly timeoutMs?: number;
}

/**
 * Runs redis-cluster.sh. `acquire ID` starts the cluster if nothing answers and holds a
 * lease for process ID; `release ID` stops it only if `acquire` started it and no other
 * live process holds a lease (so parallel runs share one cluster).
 */
export function runClusterScript(
  command: 'start' | 'stop' | 'status' | 'acquire' | 'release',
  id?: number,
  options: ClusterScriptOptions = {},
): Promise<string> {
  const env = { ...process.env };
  if (options.ports) env.PERCOLATOR_REDIS_CLUSTER_PORTS = options.ports.join(' ');
  const args = [REDIS_CLUSTER_SCRIPT, command, ...(id === undefined ? [] : [String(id)])];
  return new Promise((resolve, reject) => {
    execFile('bash', args, { env, timeout: options.timeoutMs ?? 240_000 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`redis-cluster.sh ${command} failed: ${(stderr || error.message).trim()}`));
      else resolve(stdout.trim());
    });
  });
}

/** '' if every node answers and reports cluster_state:ok, else why not. */
export async function clusterProblem(
  nodes: readonly { host: string; port: number }[] = defaultClusterNodes(),
): Promise<string> {
  const problems = await Promise.all(
    nodes.map(async (node) => {
      const host = node.host.includes(':') ? `[${node.host}]` : node.host;
      const probe = createRedisClient(`redis://${host}:${node.port}`, 2000);
      probe.on('error', () => {});
      try {
        await probe.connect();
        const info = String(await probe.cluster('INFO'));
        return /cluster_state:ok/.test(info) ? '' : `${node.host}:${node.port} is not cluster_state:ok`;
      } catch (error) {
        return `${node.host}:${node.port}: ${(error as Error).message}`;
      } finally {
        probe.disconnect();
      }
    }),
  );
  return problems.filter(Boolean).join('; ');
}

/**
 * Fails unless the Redis Cluster at PERCOLATOR_REDIS_CLUSTER_NODES (default the local one)
 * answers. Under vitest it is started once per run by the workspace's globalSetup, never
 * by a test file (one that stopped it would break the files and runs still using it);
 * `setupError` is that setup's complaint, if any, to put in the message.
 */
export async function assertRedisCluster(setupError = ''): Promise<void> {
  const problem = await clusterProblem();
  if (!problem) return;
  throw new Error(
    `Redis Cluster not reachable at PERCOLATOR_REDIS_CLUSTER_NODES=${
      process.env.PERCOLATOR_REDIS_CLUSTER_NODES || DEFAULT_CLUSTER_NODES
    } (${problem})${setupError ? `; ${setupError}` : ''}. ` +
      'Set PERCOLATOR_REDIS_CLUSTER_NODES to a running cluster, or free the ports for the local one.',
  );
}

/** A connected Cluster client on the default nodes; the caller quits it. */
export async function connectCluster(commandTimeoutMs?: number): Promise<RedisClient> {
  const cluster = createRedisClusterClient(defaultClusterNodes(), commandTimeoutMs);
  // Failed commands reach the caller as errors; without a listener ioredis prints each one.
  cluster.on('error', () => {});
  try {
    await cluster.connect();
  } catch (error) {
    cluster.disconnect();
    throw new Error(
      `Redis Cluster not reachable at ${JSON.stringify(defaultClusterNodes())}: set PERCOLATOR_REDIS_CLUSTER_NODES (${(error as Error).message})`,
      { cause: error },
    );
  }
  return cluster;
}
