import { conformanceSuite } from '@percolator/conformance';
import { CompositeStore } from '@percolator/core';
import { afterAll } from 'vitest';
import { postgresPool, postgresStore, twoPostgresDatabases } from './support/backends.js';
import { destroyComposite } from './support/composite.js';

// (a) Rows sharded by row key across two PostgreSQL databases (by default `test` and
// `percolator_shard2`, created if missing); the oracle is the first database's counter.
const [firstUrl, secondUrl] = await twoPostgresDatabases();
const first = postgresPool(firstUrl);
const second = postgresPool(secondUrl);
afterAll(async () => {
  await Promise.all([first.end(), second.end()]);
});

conformanceSuite({
  name: 'composite(postgres shard 1 + postgres shard 2)',
  scale: Number(process.env.PERCOLATOR_CONFORMANCE_SCALE ?? 0.25),
  createStore: async () => {
    const [a, b] = await Promise.all([postgresStore(first, 'sh1'), postgresStore(second, 'sh2')]);
    return new CompositeStore({ default: { shards: [a, b] }, counterStore: a });
  },
  destroyStore: destroyComposite,
});
