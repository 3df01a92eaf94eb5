import { conformanceSuite } from '@percolator/conformance';
import { storeFactory } from '@percolator/connect';
import { beforeAll } from 'vitest';
import { assertClusterReachable } from './helpers.js';

beforeAll(async () => {
  await assertClusterReachable();
});

// Stores from @percolator/connect (PERCOLATOR_REDIS_CLUSTER_NODES or the local cluster):
// each has its own Cluster client (like a separate process), quit when it is destroyed, and
// its own namespace; rows of one transaction land in different slots on different masters.
const stores = await storeFactory('redis-cluster', { prefix: 'confc' });

conformanceSuite({
  name: 'redis-cluster',
  createStore: stores.createStore,
  destroyStore: stores.destroyStore,
  scale: Number(process.env.PERCOLATOR_CONFORMANCE_SCALE ?? 0.5),
});
