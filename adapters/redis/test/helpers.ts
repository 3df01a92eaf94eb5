import { uniqueNamespace } from '@percolator/testkit';
import { startPrivateRedis as startRedisServer } from '@percolator/testkit/private';
import { assertRedisCluster, connectCluster } from '@percolator/testkit/redis';
import { Redis } from 'ioredis';
import { inject } from 'vitest';
import { createRedisStore, defaultRedisUrl } from '../src/index.js';
import type { RedisClient, RedisStore } from '../src/store.js';

/** A fresh namespace per test, so concurrent runs never share data. */
export { uniqueNamespace };

export async function standaloneStore(namespace = uniqueNamespace()): Promise<RedisStore> {
  try {
    return await createRedisStore({ namespace });
  } catch (error) {
    throw new Error(
      `Redis is not reachable at ${defaultRedisUrl()}: set PERCOLATOR_REDIS_URL to a running Redis (${(error as Error).message})`,
    );
  }
}

/**
 * Fails unless the Redis Cluster answers. It is started once per vitest run by
 * scripts/vitest-global-setup.ts (not by test files: one file must not stop a cluster
 * another file or run still uses); its error, if any, is part of the message.
 */
export function assertClusterReachable(): Promise<void> {
  return assertRedisCluster(inject('redisClusterSetupError'));
}

export { connectCluster };

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
 * A redis-server of our own on a free port (@percolator/testkit/private; nothing on disk),
 * for tests that pause, flush or kill things and must not disturb the shared server on 6379.
 */
export async function startPrivateRedis(): Promise<PrivateRedis> {
  const server = await startRedisServer('none');
  const admin = new Redis({
    port: server.port,
    host: '127.0.0.1',
    lazyConnect: true,
    retryStrategy: () => 50,
  });
  admin.on('error', () => {});
  try {
    await admin.connect();
  } catch (error) {
    admin.disconnect();
    await server.destroy();
    throw error;
  }
  return {
    port: server.port,
    url: server.url,
    admin,
    async stop() {
      admin.disconnect();
      await server.destroy();
    },
  };
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

export const bytes = (text: string): Uint8Array => new TextEncoder().encode(text);
export const text = (data: Uint8Array): string => new TextDecoder().decode(data);
