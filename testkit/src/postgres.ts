import { assertPostgresReachable, DEFAULT_POSTGRES_URL, POSTGRES_URL_ENV } from '@percolator/postgres';
import { type EnsureOptions, ensureTestServer, type TestServer, type TestServerSpec } from './test-server.js';

export type { EnsureOptions, TestServer } from './test-server.js';

/**
 * A PostgreSQL server for tests (`@percolator/testkit/postgres`): `$PERCOLATOR_POSTGRES_URL`
 * if set (it must answer), else the local default if it answers, else a throwaway
 * `postgres:15` container started with testcontainers if `docker info` succeeds
 * (testcontainers is loaded only then), else a StoreError naming the variable.
 */
export function ensurePostgres(options: EnsureOptions = {}): Promise<TestServer> {
  return ensureTestServer(POSTGRES, options);
}

export const POSTGRES: TestServerSpec = {
  product: 'PostgreSQL',
  envVar: POSTGRES_URL_ENV,
  defaultUrl: DEFAULT_POSTGRES_URL,
  exampleUrl: 'postgres://user:password@host:5432/db',
  probe: assertPostgresReachable,
  container: {
    image: 'postgres:15',
    port: 5432,
    environment: (password) => ({ POSTGRES_PASSWORD: password, POSTGRES_DB: 'test' }),
    url: (host, port, password) => `postgres://postgres:${password}@${host}:${port}/test`,
  },
};
