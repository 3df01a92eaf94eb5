import { conformanceSuite } from '@percolator/conformance';
import { CompositeStore } from '@percolator/core';
import { assertPostgresReachable } from '@percolator/postgres';
import { afterAll, beforeAll } from 'vitest';
import { ensureRedisCluster, postgresPool, postgresStore, redisClusterStore } from './support/backends.js';
import { destroyComposite } from './support/composite.js';

// (c) Redis Cluster through the same routing: tables sharded by row key across a Redis
// Cluster namespace and PostgreSQL, one table routed to a second Cluster namespace, and
// the oracle is the Cluster's counter. Starts the local cluster (scripts/redis-cluster.sh)
// if it is down and PERCOLATOR_REDIS_CLUSTER_NODES is not set.
const pool = postgresPool(await assertPostgresReachable());
let stopCluster: () => Promise<void> = async () => {};
beforeAll(async () => {
  stopCluster = await ensureRedisCluster();
});
afterAll(async () => {
  await pool.end();
  await stopCluster();
});

conformanceSuite({
  name: 'composite(redis-cluster + postgres)',
  scale: Number(process.env.PERCOLATOR_CONFORMANCE_SCALE ?? 0.25),
  createStore: async () => {
    const [cluster, other, pg] = await Promise.all([
      redisClusterStore('rc'),
      redisClusterStore('rc2'),
      postgresStore(pool, 'rc'),
    ]);
    return new CompositeStore({
      routes: [{ table: 'conf.other-table_2', store: other }],
      default: { shards: [cluster, pg] },
      counterStore: cluster,
    });
  },
  destroyStore: destroyComposite,
});
