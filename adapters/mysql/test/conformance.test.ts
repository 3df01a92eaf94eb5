import { randomBytes } from 'node:crypto';
import { conformanceSuite } from '@percolator/conformance';
import type { RowStore } from '@percolator/core';
import { assertMySqlReachable, createMySqlStore, type MySqlStore } from '@percolator/mysql';
import { createPool } from 'mysql2/promise';
import { afterAll } from 'vitest';

// One pool for every store the suite creates; each store gets its own namespace (tables),
// and destroyStore drops them. Fails (never skips) when the server is unreachable.
const url = await assertMySqlReachable();
const pool = createPool({ uri: url, connectionLimit: 10, multipleStatements: true });
afterAll(() => pool.end());

conformanceSuite({
  name: 'mysql',
  scale: Number(process.env.PERCOLATOR_CONFORMANCE_SCALE ?? 0.25),
  createStore: () => createMySqlStore({ pool, namespace: `c_${randomBytes(6).toString('hex')}` }),
  destroyStore: async (store: RowStore) => {
    await (store as MySqlStore).dropNamespace();
    await store.close();
  },
});
