import { assertMySqlReachable, DEFAULT_MYSQL_URL, MYSQL_URL_ENV } from '@percolator/mysql';
import { type EnsureOptions, ensureTestServer, type TestServer, type TestServerSpec } from './test-server.js';

export type { EnsureOptions, TestServer } from './test-server.js';

/**
 * A MySQL/MariaDB server for tests (`@percolator/testkit/mysql`): `$PERCOLATOR_MYSQL_URL`
 * if set (it must answer), else the local default if it answers, else a throwaway
 * `mariadb:10.11` container started with testcontainers if `docker info` succeeds
 * (testcontainers is loaded only then), else a StoreError naming the variable.
 */
export function ensureMySql(options: EnsureOptions = {}): Promise<TestServer> {
  return ensureTestServer(MYSQL, options);
}

export const MYSQL: TestServerSpec = {
  product: 'MySQL/MariaDB',
  envVar: MYSQL_URL_ENV,
  defaultUrl: DEFAULT_MYSQL_URL,
  exampleUrl: 'mysql://user:password@host:3306/db',
  probe: assertMySqlReachable,
  container: {
    image: 'mariadb:10.11',
    port: 3306,
    environment: (password) => ({ MARIADB_ROOT_PASSWORD: password, MARIADB_DATABASE: 'test' }),
    url: (host, port, password) => `mysql://root:${password}@${host}:${port}/test`,
  },
};
