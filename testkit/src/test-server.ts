import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { redactUrl, StoreError } from '@percolator/core';

/**
 * Where tests find a server (`@percolator/testkit`; `ensurePostgres`, `ensureMySql` use it), in order:
 * 1. the environment variable, if set: it must answer, nothing else is tried;
 * 2. the local default, if it answers;
 * 3. a throwaway container started with testcontainers, if `docker info` succeeds;
 * 4. otherwise a StoreError('no') that names the variable.
 * Nothing is ever skipped: with or without CI=true, no server means the run fails.
 */
export interface TestServer {
  readonly url: string;
  /** Stops the container if one was started (testcontainers' reaper also removes it at exit). */
  stop(): Promise<void>;
}

/** What one adapter contributes: its names, its probe and its container. */
export interface TestServerSpec {
  /** For messages, e.g. "PostgreSQL". */
  readonly product: string;
  readonly envVar: string;
  readonly defaultUrl: string;
  /** An example URL for the message, e.g. "postgres://user:password@host:5432/db". */
  readonly exampleUrl: string;
  /** Resolves if a server answers at the URL; rejects with a message that hides passwords. */
  probe(url: string): Promise<unknown>;
  /** The throwaway container, started only when nothing else answers and Docker does. */
  readonly container: ContainerSpec;
}

/** A container image that serves the product, and how to reach it. */
export interface ContainerSpec {
  readonly image: string;
  /** The port the server listens on inside the container. */
  readonly port: number;
  /** The container's environment, given a fresh random password. */
  environment(password: string): Record<string, string>;
  /** The URL of the server at the mapped host and port. */
  url(host: string, port: number, password: string): string;
}

/** Seams for testing the choice itself; every default is the real thing. */
export interface EnsureOptions {
  readonly env?: NodeJS.ProcessEnv;
  /** The server tried when the variable is unset. */
  readonly localUrl?: string;
  readonly dockerAvailable?: () => Promise<boolean>;
  readonly startContainer?: () => Promise<TestServer>;
}

const noStop = async () => {};

export async function ensureTestServer(
  spec: TestServerSpec,
  options: EnsureOptions = {},
): Promise<TestServer> {
  const env = options.env ?? process.env;
  const fromEnv = env[spec.envVar]?.trim();
  if (fromEnv) {
    try {
      await spec.probe(fromEnv);
      return { url: fromEnv, stop: noStop };
    } catch (error) {
      throw new StoreError(
        `${spec.envVar} is set, so only that server is used, and it does not answer: ${(error as Error).message}`,
        'no',
        { cause: error },
      );
    }
  }
  const localUrl = options.localUrl ?? spec.defaultUrl;
  let localError: unknown;
  try {
    await spec.probe(localUrl);
    return { url: localUrl, stop: noStop };
  } catch (error) {
    localError = error;
  }
  if (await (options.dockerAvailable ?? (() => dockerInfoSucceeds()))()) {
    return (options.startContainer ?? (() => startContainer(spec)))();
  }
  throw new StoreError(
    `No ${spec.product} for the tests: nothing answers at ${redactUrl(localUrl)} and Docker is not ` +
      `available to start one with testcontainers. Start ${spec.product} there, set ${spec.envVar} to a ` +
      `server (e.g. ${spec.exampleUrl}), or make \`docker info\` work.`,
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

/** A container's port opens before its init is done: retry the probe for up to 60 s. */
export async function untilReachable(probe: () => Promise<unknown>): Promise<void> {
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

/**
 * Starts the spec's container with testcontainers (imported only here, only when Docker
 * answers) on a random port with a generated password, and waits until the probe answers.
 * testcontainers' reaper removes the container if the process dies.
 */
export async function startContainer(spec: Pick<TestServerSpec, 'container' | 'probe'>): Promise<TestServer> {
  const { GenericContainer, Wait } = await import('testcontainers');
  const { image, port } = spec.container;
  const password = randomBytes(12).toString('hex');
  const container = await new GenericContainer(image)
    .withEnvironment(spec.container.environment(password))
    .withExposedPorts(port)
    .withWaitStrategy(Wait.forListeningPorts())
    .start();
  const url = spec.container.url(container.getHost(), container.getMappedPort(port), password);
  const stop = async () => {
    await container.stop();
  };
  await untilReachable(() => spec.probe(url)).catch(async (error: unknown) => {
    await stop().catch(() => {});
    throw error;
  });
  return { url, stop };
}
