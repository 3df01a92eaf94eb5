import { createServer, type Server, Socket } from 'node:net';
import { redactUrl, StoreError } from '@percolator/core';
import {
  dockerInfoSucceeds,
  ensureTestServer,
  type TestServer,
  type TestServerSpec,
} from '@percolator/testkit';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

/**
 * How adapters' tests find a server. The probes are real: a TCP listener that answers, a
 * port where nothing listens, a Docker CLI that is absent or fails. Only the container
 * start is replaced, by one that must not be reached or that hands out the listener.
 */
const NOTHING_LISTENS = 'tcp://user:secret@127.0.0.1:1';
let listener: Server;
let answering: string;

beforeAll(async () => {
  listener = createServer((socket) => socket.end());
  await new Promise<void>((resolve) => listener.listen(0, '127.0.0.1', resolve));
  answering = `tcp://127.0.0.1:${(listener.address() as { port: number }).port}`;
});
afterAll(() => new Promise<void>((resolve) => listener.close(() => resolve())));

const spec: TestServerSpec = {
  product: 'ExampleDB',
  envVar: 'PERCOLATOR_EXAMPLE_URL',
  defaultUrl: NOTHING_LISTENS,
  exampleUrl: 'tcp://user:password@host:1234',
  probe: (url) =>
    new Promise((resolve, reject) => {
      const { hostname, port } = new URL(url);
      const socket = new Socket();
      socket.once('connect', () => resolve(socket.destroy()));
      socket.once('error', (error) => reject(new Error(`${redactUrl(url)}: ${error.message}`)));
      socket.connect(Number(port), hostname);
    }),
  container: {
    image: 'no-such-image-may-be-started-here',
    port: 1,
    environment: () => ({}),
    url: () => 'tcp://127.0.0.1:1',
  },
};

async function failure(promise: Promise<unknown>): Promise<StoreError> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(StoreError);
  expect((error as StoreError).applied).toBe('no');
  return error as StoreError;
}

describe('ensureTestServer: where an adapter test server comes from', () => {
  it('probes Docker with the real CLI: absent or failing means no Docker', async () => {
    expect(await dockerInfoSucceeds('percolator-no-such-docker-cli')).toBe(false);
    expect(await dockerInfoSucceeds('false')).toBe(false);
  });

  it('unset variable, nothing listening, no Docker: a clear message naming the variable, CI or not', async () => {
    for (const env of [{}, { CI: 'true' }]) {
      const error = await failure(
        ensureTestServer(spec, {
          env,
          dockerAvailable: () => dockerInfoSucceeds('percolator-no-such-docker-cli'),
        }),
      );
      expect(error.message).toContain('PERCOLATOR_EXAMPLE_URL');
      expect(error.message).toMatch(/docker info/);
      expect(error.message).not.toContain('secret');
    }
  });

  it('a set variable is the only server tried: unreachable fails, no local or Docker fallback', async () => {
    let dockerAsked = 0;
    const error = await failure(
      ensureTestServer(spec, {
        env: { PERCOLATOR_EXAMPLE_URL: NOTHING_LISTENS },
        localUrl: answering, // answers, but must not be used
        dockerAvailable: async () => {
          dockerAsked++;
          return true;
        },
      }),
    );
    expect(error.message).toContain('PERCOLATOR_EXAMPLE_URL is set');
    expect(error.message).not.toContain('secret');
    expect(dockerAsked).toBe(0);
  });

  it('a set, reachable variable is used as is', async () => {
    const server = await ensureTestServer(spec, { env: { PERCOLATOR_EXAMPLE_URL: answering } });
    expect(server.url).toBe(answering);
  });

  it('unset variable: the local default when it answers, without asking Docker', async () => {
    const server = await ensureTestServer(spec, {
      env: {},
      localUrl: answering,
      dockerAvailable: () => Promise.reject(new Error('Docker must not be asked')),
    });
    expect(server.url).toBe(answering);
  });

  it('unset variable, nothing local, Docker available: the started container is used and stopped', async () => {
    let stopped = 0;
    const container: TestServer = {
      url: answering,
      stop: async () => {
        stopped++;
      },
    };
    const server = await ensureTestServer(spec, {
      env: {},
      dockerAvailable: async () => true,
      startContainer: async () => container,
    });
    expect(server.url).toBe(answering);
    await server.stop();
    expect(stopped).toBe(1);
  });
});
