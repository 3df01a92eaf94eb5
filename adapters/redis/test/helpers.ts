import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:net';
import { Redis } from 'ioredis';
import { inject } from 'vitest';
import {
  createRedisClusterClient,
  createRedisStore,
  DEFAULT_CLUSTER_NODES,
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

/** Whether every node answers and reports cluster_state:ok ('' if so, else why not). */
async function clusterProblem(nodes: readonly { host: string; port: number }[]): Promise<string> {
  const problems = await Promise.all(
    nodes.map(async (node) => {
      const probe = new Redis({ ...node, lazyConnect: true, retryStrategy: null, connectTimeout: 2000 });
      probe.on('error', () => {});
      try {
        await probe.connect();
        const info = (await probe.cluster('INFO')) as string;
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
 * Fails unless the Redis Cluster answers. It is started once per vitest run by
 * scripts/vitest-global-setup.ts (not by test files: one file must not stop a cluster
 * another file or run still uses); its error, if any, is part of the message.
 */
export async function assertClusterReachable(): Promise<void> {
  const nodes = defaultClusterNodes();
  const problem = await clusterProblem(nodes);
  if (!problem) return;
  const setupError = inject('redisClusterSetupError');
  throw new Error(
    `Redis Cluster not reachable at PERCOLATOR_REDIS_CLUSTER_NODES=${
      process.env.PERCOLATOR_REDIS_CLUSTER_NODES || DEFAULT_CLUSTER_NODES
    } (${problem})${setupError ? `; ${setupError}` : ''}. ` +
      'Set PERCOLATOR_REDIS_CLUSTER_NODES to a running cluster, or free the ports for the local one.',
  );
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
