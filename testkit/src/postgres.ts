import { randomBytes } from 'node:crypto';
import { assertPostgresReachable, DEFAULT_POSTGRES_URL, POSTGRES_URL_ENV } from '@percolator/postgres';

export type { EnsureOptions, TestServer } from './test-server.js';

import {
  type EnsureOptions,
  ensureTestServer,
  type TestServer,
  type TestServerSpec,
  untilReachable,
} from './test-server.js';

/**
 * A PostgreSQL server for tests (`@percolator/testkit/postgres`): `$PERCOLATOR_POSTGRES_URL`
 * if set (it must answer), else the local default if it answers, else a throwaway
 * `postgres:15` container started with testcontainers if `docker info` succeeds
 * (testcontainers is loaded only then), else a StoreError naming the variable.
 */
export function ensurePostgres(options: EnsureOptions = {}): Promise<TestServer> {
  return ensureTestServer(POSTGRES, options);
}

const POSTGRES: TestServerSpec = {
  product: 'PostgreSQL',
  envVar: POSTGRES_URL_ENV,
  defaultUrl: DEFAULT_POSTGRES_URL,
  exampleUrl: 'postgres://user:password@host:5432/db',
  probe: assertPostgresReachable,
  async startContainer() {
    const { GenericContainer, Wait } = await import('testcontainers');
    const password = randomBytes(12).toString('hex');
    const container = await new GenericContainer('postgres:15')
      .withEnvironment({ POSTGRES_PASSWORD: password, POSTGRES_DB: 'test' })
      .withExposedPorts(5432)
      .withWaitStrategy(Wait.forListeningPorts())
      .start();
    const url = `postgres://postgres:${password}@${container.getHost()}:${container.getMappedPort(5432)}/test`;
    const stop = async () => {
      await container.stop();
    };
    await untilReachable(() => assertPostgresReachable(url)).catch(async (error: unknown) => {
      await stop().catch(() => {});
      throw error;
    });
    return { url, stop };
  },
};
