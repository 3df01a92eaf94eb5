import { StoreError } from '@percolator/core';
import { MYSQL_URL_ENV, resolveMySqlUrl } from '@percolator/mysql';
import { describe, expect, it } from 'vitest';
import { dockerInfoSucceeds, ensureMySql, type TestServer } from '../src/testing.js';

/**
 * How the tests find a server. The probes are real: a port where nothing listens, a
 * Docker CLI that is absent or fails, the real local server. Only the container start is
 * replaced, by one that must not be reached or that hands out the local server.
 */
const NOTHING_LISTENS = 'mysql://root:secret@127.0.0.1:1/test';
const local = resolveMySqlUrl();

function neverStart(): Promise<TestServer> {
  throw new Error('no container may be started here');
}

async function failure(promise: Promise<unknown>): Promise<StoreError> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(StoreError);
  expect((error as StoreError).applied).toBe('no');
  return error as StoreError;
}

describe('ensureMySql: where the test server comes from', () => {
  it('probes Docker with the real CLI: absent or failing means no Docker', async () => {
    expect(await dockerInfoSucceeds('percolator-no-such-docker-cli')).toBe(false);
    expect(await dockerInfoSucceeds('false')).toBe(false);
  });

  it('unset variable, nothing listening, no Docker: a clear message naming the variable', async () => {
    for (const env of [{}, { CI: 'true' }]) {
      const error = await failure(
        ensureMySql({
          env,
          localUrl: NOTHING_LISTENS,
          dockerAvailable: () => dockerInfoSucceeds('percolator-no-such-docker-cli'),
          startContainer: neverStart,
        }),
      );
      expect(error.message).toContain(MYSQL_URL_ENV);
      expect(error.message).toMatch(/docker info/);
      expect(error.message).not.toContain('secret');
    }
  });

  it('a set variable is the only server tried: unreachable fails, no local or Docker fallback', async () => {
    let dockerAsked = 0;
    const error = await failure(
      ensureMySql({
        env: { [MYSQL_URL_ENV]: NOTHING_LISTENS },
        localUrl: local, // answers, but must not be used
        dockerAvailable: async () => {
          dockerAsked++;
          return true;
        },
        startContainer: neverStart,
      }),
    );
    expect(error.message).toContain(`${MYSQL_URL_ENV} is set`);
    expect(error.message).not.toContain('secret');
    expect(dockerAsked).toBe(0);
  });

  it('a set, reachable variable is used as is', async () => {
    const server = await ensureMySql({
      env: { [MYSQL_URL_ENV]: local },
      localUrl: NOTHING_LISTENS,
      startContainer: neverStart,
    });
    expect(server.url).toBe(local);
    await server.stop();
  });

  it('unset variable: the local default when it answers, without asking Docker', async () => {
    const server = await ensureMySql({
      env: {},
      localUrl: local,
      dockerAvailable: () => Promise.reject(new Error('Docker must not be asked')),
      startContainer: neverStart,
    });
    expect(server.url).toBe(local);
    await server.stop();
  });

  it('unset variable, nothing local, Docker available: the started container is used', async () => {
    let stopped = 0;
    const server = await ensureMySql({
      env: {},
      localUrl: NOTHING_LISTENS,
      dockerAvailable: async () => true,
      startContainer: async () => ({
        url: local,
        stop: async () => {
          stopped++;
        },
      }),
    });
    expect(server.url).toBe(local);
    await server.stop();
    expect(stopped).toBe(1);
  });
});
