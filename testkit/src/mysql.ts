import { randomBytes } from 'node:crypto';
import { assertMySqlReachable, DEFAULT_MYSQL_URL, MYSQL_URL_ENV } from '@percolator/mysql';

export type { EnsureOptions, TestServer } from './test-server.js';

import {
  type EnsureOptions,
  ensureTestServer,
  type TestServer,
  type TestServerSpec,
  untilReachable,
} from './test-server.js';

/**
 * A MySQL/MariaDB server for tests (`@percolator/testkit/mysql`): `$PERCOLATOR_MYSQL_URL`
 * if set (it must answer), else the local default if it answers, else a throwaway
 * `mariadb:10.11` container started with testcontainers if `docker info` succeeds
 * (testcontainers is loaded only then), else a StoreError naming the variable.
 */
export function ensureMySql(options: EnsureOptions = {}): Promise<TestServer> {
  return ensureTestServer(MYSQL, options);
}

const MYSQL: TestServerSpec = {
  product: 'MySQL/MariaDB',
  envVar: MYSQL_URL_ENV,
  defaultUrl: DEFAULT_MYSQL_URL,
  exampleUrl: 'mysql://user:password@host:3306/db',
  probe: assertMySqlReachable,
  async startContainer() {
    const { GenericContainer, Wait } = await import('testcontainers');
    const password = randomBytes(12).toString('hex');
    const container = await new GenericContainer('mariadb:10.11')
      .withEnvironment({ MARIADB_ROOT_PASSWORD: password, MARIADB_DATABASE: 'test' })
      .withExposedPorts(3306)
      .withWaitStrategy(Wait.forListeningPorts())
      .start();
    const url = `mysql://root:${password}@${container.getHost()}:${container.getMappedPort(3306)}/test`;
    const stop = async () => {
      await container.stop();
    };
    await untilReachable(() => assertMySqlReachable(url)).catch(async (error: unknown) => {
      await stop().catch(() => {});
      throw error;
    });
    return { url, stop };
  },
};
