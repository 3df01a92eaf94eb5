/**
 * Redis servers for tests (`@percolator/testkit/redis`): the local Redis Cluster
 * (`redis-cluster.sh` in this package, three masters on 127.0.0.1:7001-7003) and private
 * redis-server processes that a test may pause, kill and restart without disturbing the
 * shared server.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  createRedisClient,
  createRedisClusterClient,
  DEFAULT_CLUSTER_NODES,
  defaultClusterNodes,
  type RedisClient,
} from '@percolator/redis';
import { freePort } from './ports.js';

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

export interface PrivateRedis {
  readonly port: number;
  readonly url: string;
  /** SIGKILL: no shutdown, no final save. Resolves once the process is gone. */
  kill(): Promise<void>;
  /** Starts it again on the same port and data directory; resolves once it listens. */
  restart(): Promise<void>;
  /** Kills it and removes its data directory. */
  stop(): Promise<void>;
}

export interface PrivateRedisOptions {
  /**
   * Keep an append-only file with `appendfsync always` (every acknowledged write is on
   * disk before the reply), so `kill()` + `restart()` bring back exactly what was
   * acknowledged, locks included. Default false (nothing on disk).
   */
  readonly durable?: boolean;
}

/** A redis-server of our own on a free port on 127.0.0.1 (redis-server must be on PATH). */
export async function startPrivateRedis(options: PrivateRedisOptions = {}): Promise<PrivateRedis> {
  const port = await freePort('127.0.0.1');
  const dir = mkdtempSync(join(tmpdir(), 'percolator-redis-'));
  const persistence = options.durable
    ? ['--appendonly', 'yes', '--appendfsync', 'always']
    : ['--appendonly', 'no'];
  let child: ChildProcess | undefined;
  const kill = async () => {
    const proc = child;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
    proc.kill('SIGKILL');
    await exited;
  };
  const launch = async () => {
    const proc = spawn(
      'redis-server',
      ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--save', '', ...persistence],
      { stdio: 'ignore' },
    );
    child = proc;
    const spawnFailed = new Promise<never>((_, reject) =>
      proc.once('error', (e) =>
        reject(new Error(`redis-server could not be started (is it on PATH?): ${e.message}`)),
      ),
    );
    try {
      await Promise.race([waitForPort(port), spawnFailed]);
    } catch (error) {
      await kill();
      throw error;
    }
  };
  const stop = async () => {
    await kill();
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    await launch();
  } catch (error) {
    await stop();
    throw error;
  }
  return { port, url: `redis://127.0.0.1:${port}`, kill, restart: launch, stop };
}

async function waitForPort(port: number): Promise<void> {
  const deadline = Date.now() + 15_000;
  for (;;) {
    const open = await new Promise<boolean>((resolve) => {
      const socket = new Socket();
      socket.once('connect', () => {
        socket.destroy();
        resolve(true);
      });
      socket.once('error', () => resolve(false));
      socket.connect(port, '127.0.0.1');
    });
    if (open) return;
    if (Date.now() > deadline) throw new Error(`redis-server did not listen on port ${port} within 15 s`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
