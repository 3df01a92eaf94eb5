import { randomBytes } from 'node:crypto';
import { conformanceSuite } from '@percolator/conformance';
import type { RowStore } from '@percolator/core';
import { assertPostgresReachable, createPostgresStore, type PostgresStore } from '@percolator/postgres';
import pg from 'pg';
import { afterAll } from 'vitest';

// One pool for every store the suite creates; each store gets its own namespace (tables),
// and destroyStore drops it. Fails (never skips) when the server is unreachable.
const url = await assertPostgresReachable();
const pool = new pg.Pool({ connectionString: url, max: 10 });
pool.on('error', () => {});
afterAll(() => pool.end());

conformanceSuite({
  name: 'postgres',
  scale: Number(process.env.PERCOLATOR_CONFORMANCE_SCALE ?? 0.25),
  createStore: () => createPostgresStore({ pool, namespace: `c_${randomBytes(6).toString('hex')}` }),
  destroyStore: async (store: RowStore) => {
    await (store as PostgresStore).dropNamespace();
    await store.close();
  },
});
