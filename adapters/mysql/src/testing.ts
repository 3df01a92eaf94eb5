import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { StoreError } from '@percolator/core';
import { assertMySqlReachable, DEFAULT_MYSQL_URL, MYSQL_URL_ENV, redactUrl } from './env.js';

/**
 * A MySQL/MariaDB server for tests (`@percolator/mysql/testing`), chosen in this order:
 * 1. `$PERCOLATOR_MYSQL_URL` if set; it must answer, nothing else is tried;
 * 2. the local default (mysql://root@127.0.0.1:3306/test) if it answers;
 * 3. a throwaway `mariadb:10.11` container started with testcontainers, if `docker info`
 *    succeeds (testcontainers is loaded only then: `pnpm add -D testcontainers`);
 * 4. otherwise a StoreError('no') saying how to provide a server.
 * Nothing is ever skipped: with or without CI=true, no server means the run fails.
 */
export interface TestServer {
  readonly url: string;
  /** Stops the container if one was started (testcontainers' reaper also removes it at exit). */
  stop(): Promise<void>;
}

/** Seams for testing the choice itself; every default is the real thing. */
export interface EnsureOptions {
  readonly env?: NodeJS.ProcessEnv;
  /** The server tried when the variable is unset. */
  readonly localUrl?: string;
  readonly dockerAvailable?: () => Promise<boolean>;
  readonly startContainer?: () => Promise<TestServer>;
}

export async function ensureMySql(options: EnsureOptions = {}): Promise<TestServer> {
  const env = options.env ?? process.env;
  const fromEnv = env[MYSQL_URL_ENV]?.trim();
  if (fromEnv) {
    try {
      return { url: await assertMySqlReachable(fromEnv), stop: async () => {} };
    } catch (error) {
      throw new StoreError(
        `${MYSQL_URL_ENV} is set, so only that server is used, and it does not answer: ${(error as Error).message}`,
        'no',
        { cause: error },
      );
    }
  }
  const localUrl = options.localUrl ?? DEFAULT_MYSQL_URL;
  let localError: unknown;
  try {
    return { url: await assertMySqlReachable(localUrl), stop: async () => {} };
  } catch (error) {
    localError = error;
  }
  if (await (options.dockerAvailable ?? (() => dockerInfoSucceeds()))()) {
    return (options.startContainer ?? startMariaDbContainer)();
  }
  throw new StoreError(
    `No MySQL/MariaDB for the tests: nothing answers at ${redactUrl(localUrl)} and Docker is not available ` +
      `to start one with testcontainers. Start MariaDB or MySQL there, set ${MYSQL_URL_ENV} to a server ` +
      '(e.g. mysql://user:password@host:3306/db), or make `docker info` work.',
    'no',
    { cause: localError },
  );
}

/** Whether `<command> info` exits 0 within 10 s (a Docker engine answers). */
export function dockerInfoSucceeds(command = 'docker'): Promise<boolean> {
  return new Promise((resolve) => {
    execFile(command, ['info', '--format', '{{.ServerVersion}}'], { timeout: 10_000 }, (error) =>
      resolve(error === null),
    );
  });
}

async function startMariaDbContainer(): Promise<TestServer> {
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
  try {
    await untilReachable(() => assertMySqlReachable(url));
  } catch (error) {
    await stop().catch(() => {});
    throw error;
  }
  return { url, stop };
}

/** The port opens before the entrypoint's init restart is done: retry for up to 60 s. */
async function untilReachable(probe: () => Promise<unknown>): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      await probe();
      return;
    } catch (error) {
      if (attempt >= 120) throw error;
      await new Promise((resolve) => setTimeout(resolve, 500));
    }
  }
}
