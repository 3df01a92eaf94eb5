import { conformanceSuite } from '@percolator/conformance';
import type { RowStore } from '@percolator/core';
import { beforeAll } from 'vitest';
import { createRedisStore } from '../src/index.js';
import type { RedisStore } from '../src/store.js';
import { assertClusterReachable, connectCluster, uniqueNamespace } from './helpers.js';

beforeAll(async () => {
  await assertClusterReachable();
});

// Each store has its own Cluster client (like a separate process) and namespace; rows of
// one transaction land in different slots on different masters.
conformanceSuite({
  name: 'redis-cluster',
  createStore: async () => {
    const client = await connectCluster();
    return await createRedisStore({ client, namespace: uniqueNamespace('confc') });
  },
  destroyStore: async (store: RowStore) => {
    const redis = store as RedisStore;
    await redis.dropNamespace();
    await redis.close();
    await redis.client.quit();
  },
  scale: Number(process.env.PERCOLATOR_CONFORMANCE_SCALE ?? 0.5),
});
