import { randomBytes } from 'node:crypto';
import { conformanceSuite } from '@percolator/conformance';
import type { RowStore } from '@percolator/core';
import { createMySqlStore, type MySqlStore } from '@percolator/mysql';
import { ensureMySql } from '@percolator/testkit/mysql';
import { createPool } from 'mysql2/promise';
import { afterAll } from 'vitest';

// One pool for every store the suite creates; each store gets its own namespace (tables),
// and destroyStore drops them. Fails (never skips) when no server can be found or started (see @percolator/testkit).
const server = await ensureMySql();
const url = server.url;
const pool = createPool({ uri: url, connectionLimit: 10, multipleStatements: true });
afterAll(async () => {
  await pool.end();
  await server.stop();
});

conformanceSuite({
  name: 'mysql',
  scale: Number(process.env.PERCOLATOR_CONFORMANCE_SCALE ?? 0.25),
  createStore: () => createMySqlStore({ pool, namespace: `c_${randomBytes(6).toString('hex')}` }),
  destroyStore: async (store: RowStore) => {
    await (store as MySqlStore).dropNamespace();
    await store.close();
  },
});
