import { createServer, request as httpRequest, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { transactOnce } from '@percolator/conformance';
import { CounterOracle, Percolator, StoreError } from '@percolator/core';
import { LOCAL_CREDENTIALS, LOCAL_REGION } from '@percolator/testkit/dynamodb';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isAuthFailure } from '../src/calls.js';
import { createDynamoDbStore } from '../src/store.js';
import { uniqueNamespace, useDynamoDb } from './helpers.js';

/**
 * Authentication and authorization failures are StoreErrors that are not retryable, so
 * neither the adapter's retry layer nor `db.transact` sends them again. DynamoDB Local
 * accepts any credentials, so an HTTP front answers as AWS does (400, a JSON body naming
 * the exception) and otherwise forwards to DynamoDB Local.
 */

const AUTH_EXCEPTIONS = [
  ['UnrecognizedClientException', 'The security token included in the request is invalid.'],
  [
    'AccessDeniedException',
    'User: arn:aws:iam::123456789012:user/x is not authorized to perform: dynamodb:DescribeTable',
  ],
  [
    'InvalidSignatureException',
    'The request signature we calculated does not match the signature you provided.',
  ],
] as const;

interface Front {
  readonly endpoint: string;
  /** When set, every request is answered with this exception instead of being forwarded. */
  deny: readonly [string, string] | undefined;
  requests: number;
  close(): Promise<void>;
}

async function startFront(upstream?: string): Promise<Front> {
  const state = { deny: undefined as readonly [string, string] | undefined, requests: 0 };
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      state.requests++;
      if (state.deny !== undefined || upstream === undefined) {
        const [type, message] = state.deny ?? ['UnrecognizedClientException', 'no upstream'];
        const body = JSON.stringify({ __type: `com.amazonaws.dynamodb.v20120810#${type}`, message });
        res.writeHead(400, { 'Content-Type': 'application/x-amz-json-1.0', 'x-amzn-RequestId': 'test' });
        res.end(body);
        return;
      }
      const target = new URL(upstream);
      const forward = httpRequest(
        { host: target.hostname, port: target.port, method: req.method, path: req.url, headers: req.headers },
        (reply: IncomingMessage) => {
          res.writeHead(reply.statusCode ?? 500, reply.headers);
          reply.pipe(res);
        },
      );
      forward.on('error', () => res.destroy());
      forward.end(Buffer.concat(chunks));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    endpoint: `http://127.0.0.1:${port}`,
    get deny() {
      return state.deny;
    },
    set deny(value) {
      state.deny = value;
    },
    get requests() {
      return state.requests;
    },
    set requests(value) {
      state.requests = value;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

const options = (endpoint: string) => ({
  endpoint,
  region: LOCAL_REGION,
  credentials: { ...LOCAL_CREDENTIALS },
  tableName: 'percolator_test',
  namespace: uniqueNamespace(),
  retry: { maxAttempts: 3, baseDelayMs: 1, maxDelayMs: 5 },
});

describe('dynamodb: authentication and authorization failures are not retryable', () => {
  let front: Front;
  beforeAll(async () => {
    front = await startFront();
  });
  afterAll(async () => {
    await front?.close();
  });

  for (const [type, message] of AUTH_EXCEPTIONS) {
    it(`${type}: a non-retryable StoreError, sent once`, async () => {
      front.deny = [type, message];
      front.requests = 0;
      const error = await createDynamoDbStore(options(front.endpoint)).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(StoreError);
      expect((error as StoreError).retryable).toBe(false);
      expect((error as StoreError).applied).toBe('no');
      expect((error as Error).message).toContain(type);
      expect(isAuthFailure((error as StoreError).cause)).toBe(true);
      expect(front.requests).toBe(1);
    });
  }

  it('other refusals keep their meaning: throttling is retried, then retryable', async () => {
    front.deny = ['ThrottlingException', 'Rate exceeded'];
    front.requests = 0;
    const error = await createDynamoDbStore(options(front.endpoint)).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).retryable).toBe(true);
    expect(front.requests).toBe(3);
  });
});

describe('dynamodb: db.transact makes one attempt once the credentials are refused', () => {
  const dynamo = useDynamoDb();
  let front: Front;
  beforeAll(async () => {
    front = await startFront(dynamo.target().endpoint);
  });
  afterAll(async () => {
    await front?.close();
  });

  it('UnrecognizedClientException after the store opened: one attempt', async () => {
    const store = dynamo.track(
      await createDynamoDbStore({
        ...dynamo.target().storeOptions(uniqueNamespace()),
        endpoint: front.endpoint,
      }),
    );
    const db = new Percolator({ store, oracle: new CounterOracle(store) });
    await db.transact(async (tx) => tx.set('t', 'r', 'c', 'before'));

    front.deny = AUTH_EXCEPTIONS[0];
    front.requests = 0;
    const { error, attempts } = await transactOnce(db);
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).retryable).toBe(false);
    // One request (the start timestamp), no retry by the adapter or by transact.
    expect(front.requests).toBe(1);
    expect(attempts).toBeLessThanOrEqual(1);
    front.deny = undefined;
    await db.close();
  });
});
