import { conformanceSuite } from '@percolator/conformance';
import { CompositeStore } from '@percolator/core';
import { afterAll } from 'vitest';
import {
  ensureRedisCluster,
  postgresPool,
  postgresStore,
  postgresUrl,
  redisClusterStore,
} from './support/backends.js';
import { destroyComposite } from './support/composite.js';

// (c) Redis Cluster through the same routing: tables sharded by row key across a Redis
// Cluster namespace and PostgreSQL, one table routed to a second Cluster namespace, and
// the oracle is the Cluster's counter. The local cluster is started once per vitest run
// (scripts/vitest-global-setup.ts); this file only checks that it answers.
await ensureRedisCluster();
const pool = postgresPool(await postgresUrl());
afterAll(async () => {
  await pool.end();
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
