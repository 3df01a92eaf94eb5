import { randomBytes } from 'node:crypto';
import { conformanceSuite } from '@percolator/conformance';
import type { RowStore } from '@percolator/core';
import { createPostgresStore, type PostgresStore } from '@percolator/postgres';
import { ensurePostgres } from '@percolator/testkit/postgres';
import pg from 'pg';
import { afterAll } from 'vitest';

// One pool for every store the suite creates; each store gets its own namespace (tables),
// and destroyStore drops it. Fails (never skips) when no server can be found or started (see @percolator/testkit).
const server = await ensurePostgres();
const url = server.url;
const pool = new pg.Pool({ connectionString: url, max: 10 });
pool.on('error', () => {});
afterAll(async () => {
  await pool.end();
  await server.stop();
});

conformanceSuite({
  name: 'postgres',
  scale: Number(process.env.PERCOLATOR_CONFORMANCE_SCALE ?? 0.25),
  createStore: () => createPostgresStore({ pool, namespace: `c_${randomBytes(6).toString('hex')}` }),
  destroyStore: async (store: RowStore) => {
    await (store as PostgresStore).dropNamespace();
    await store.close();
  },
});
