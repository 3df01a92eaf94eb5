import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';
import {
  createRedisClusterClient,
  createRedisStore,
  defaultClusterNodes,
  defaultRedisUrl,
} from '../src/index.js';
import type { RedisClient, RedisStore } from '../src/store.js';

/** A fresh namespace per test, so concurrent runs never share keys. */
export function uniqueNamespace(label = 't'): string {
  return `${label}_${randomBytes(6).toString('hex')}`.slice(0, 32);
}

export async function standaloneStore(namespace = uniqueNamespace()): Promise<RedisStore> {
  try {
    return await createRedisStore({ namespace });
  } catch (error) {
    throw new Error(
      `Redis is not reachable at ${defaultRedisUrl()}: set PERCOLATOR_REDIS_URL to a running Redis (${(error as Error).message})`,
    );
  }
}

const CLUSTER_SCRIPT = fileURLToPath(new URL('../../../scripts/redis-cluster.sh', import.meta.url));

async function clusterAnswers(): Promise<boolean> {
  const node = defaultClusterNodes()[0]!;
  const probe = new Redis({ ...node, lazyConnect: true, retryStrategy: null, connectTimeout: 1000 });
  probe.on('error', () => {});
  try {
    await probe.connect();
    const info = await probe.cluster('INFO');
    return /cluster_state:ok/.test(info as string);
  } catch {
    return false;
  } finally {
    probe.disconnect();
  }
}

/**
 * Makes sure the test cluster runs. Starts it with scripts/redis-cluster.sh when it is not
 * reachable and PERCOLATOR_REDIS_CLUSTER_NODES is not set; returns a function that stops
 * what this call started (and nothing else).
 */
export async function ensureCluster(): Promise<() => void> {
  if (await clusterAnswers()) return () => {};
  if (process.env.PERCOLATOR_REDIS_CLUSTER_NODES) {
    throw new Error(
      `Redis Cluster not reachable at PERCOLATOR_REDIS_CLUSTER_NODES=${process.env.PERCOLATOR_REDIS_CLUSTER_NODES}`,
    );
  }
  try {
    execFileSync('bash', [CLUSTER_SCRIPT, 'start'], { stdio: 'pipe', timeout: 60_000 });
  } catch (error) {
    const stderr = (error as { stderr?: Buffer }).stderr?.toString() ?? '';
    throw new Error(
      `could not start the local Redis Cluster with scripts/redis-cluster.sh (${stderr.trim()}); ` +
        'start one and set PERCOLATOR_REDIS_CLUSTER_NODES',
    );
  }
  return () => {
    execFileSync('bash', [CLUSTER_SCRIPT, 'stop'], { stdio: 'pipe', timeout: 60_000 });
  };
}

export async function connectCluster(commandTimeoutMs?: number) {
  const cluster = createRedisClusterClient(defaultClusterNodes(), commandTimeoutMs);
  cluster.on('error', () => {});
  await cluster.connect();
  return cluster;
}

/** A store on a Cluster client the caller owns (store.close() leaves it open). */
export async function clusterStore(client: RedisClient, namespace = uniqueNamespace()): Promise<RedisStore> {
  return await createRedisStore({ client, namespace });
}

/** Every key of a namespace, on every master (or the one server). */
export async function namespaceKeys(client: RedisClient, namespace: string): Promise<string[]> {
  const nodes = client.isCluster ? (client as import('ioredis').Cluster).nodes('master') : [client as Redis];
  const keys: string[] = [];
  for (const node of nodes) {
    let cursor = '0';
    do {
      const [next, batch] = await node.scan(cursor, 'MATCH', `${namespace}:*`, 'COUNT', 1000);
      cursor = next;
      keys.push(...batch);
    } while (cursor !== '0');
  }
  return keys;
}

export interface PrivateRedis {
  readonly port: number;
  readonly url: string;
  /** A plain admin connection (not the store's). */
  readonly admin: Redis;
  stop(): Promise<void>;
}

/**
 * A redis-server of our own on a free port, for tests that pause, flush or kill things
 * and must not disturb the shared server on 6379.
 */
export async function startPrivateRedis(): Promise<PrivateRedis> {
  const port = await freePort();
  const child: ChildProcess = spawn(
    'redis-server',
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'],
    { stdio: 'ignore' },
  );
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const admin = new Redis({ port, host: '127.0.0.1', lazyConnect: true, retryStrategy: () => 50 });
  admin.on('error', () => {});
  for (let i = 0; ; i++) {
    try {
      await admin.connect();
      break;
    } catch (error) {
      if (i > 100) {
        child.kill('SIGKILL');
        throw new Error(`redis-server did not start on port ${port}: ${(error as Error).message}`);
      }
      admin.disconnect();
      await sleep(50);
    }
  }
  return {
    port,
    url: `redis://127.0.0.1:${port}`,
    admin,
    async stop() {
      admin.disconnect();
      if (child.exitCode === null) child.kill('SIGKILL');
      await exited;
    },
  };
}

async function freePort(): Promise<number> {
  return await new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => resolve(typeof address === 'object' && address ? address.port : 0));
    });
  });
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

export const bytes = (text: string): Uint8Array => new TextEncoder().encode(text);
export const text = (data: Uint8Array): string => new TextDecoder().decode(data);
