import { createServer, request as httpRequest, type Server } from 'node:http';
import { StoreError } from '@percolator/core';
import { type DynamoDbLocal, startDynamoDbLocal } from '@percolator/testkit/dynamodb';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createDynamoDbStore, type DynamoDbRowStore } from '../src/store.js';
import { bytes, text, uniqueNamespace, useDynamoDb } from './helpers.js';
import { startProxy, type TestProxy } from './proxy.js';

/**
 * Cases found by mutation testing of the DynamoDB adapter's failure mapping (calls.ts,
 * cas.ts and the batch outcome of store.ts): each fails with a small, plausible bug there
 * that the rest of the suite let through. A write's StoreError says 'no' only when
 * DynamoDB certainly refused it or it was never sent. Through proxies in front of the real
 * service, so a write reported lost here did land.
 */
const db = useDynamoDb();
let ownLocal: DynamoDbLocal | undefined;
let upstream: { host: string; port: number };
let proxy: TestProxy | undefined;
let front: Server | undefined;

beforeAll(async () => {
  // The proxies speak plain HTTP to an http endpoint; for an https one (real AWS) these
  // tests use a DynamoDB Local of their own.
  let url = new URL(db.target().endpoint);
  if (url.protocol !== 'http:') {
    ownLocal = await startDynamoDbLocal();
    url = new URL(ownLocal.endpoint);
  }
  upstream = { host: url.hostname, port: Number(url.port) };
});

afterAll(async () => {
  await ownLocal?.stop();
});

afterEach(async () => {
  await proxy?.close();
  proxy = undefined;
  if (front !== undefined) {
    front.closeAllConnections();
    await new Promise((resolve) => front!.close(resolve));
    front = undefined;
  }
});

function baseOptions() {
  return ownLocal
    ? {
        endpoint: ownLocal.endpoint,
        region: 'us-east-1',
        credentials: { accessKeyId: 'l', secretAccessKey: 'l' },
        tableName: 'percolator_test',
        createTable: true,
      }
    : db.target().storeOptions('unused');
}

/** A store through `endpoint`, and a direct one on the same namespace to check what landed. */
async function stores(endpoint: string): Promise<{ via: DynamoDbRowStore; direct: DynamoDbRowStore }> {
  const base = baseOptions();
  const namespace = uniqueNamespace('mg');
  const direct = db.track(await createDynamoDbStore({ ...base, namespace }));
  const via = db.track(
    await createDynamoDbStore({
      ...base,
      endpoint,
      namespace,
      requestTimeoutMs: 2000,
      retry: { maxAttempts: 3, baseDelayMs: 10, maxDelayMs: 50 },
    }),
  );
  return { via, direct };
}

async function errorOf(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    () => undefined,
    (e: unknown) => e,
  );
}

/**
 * An HTTP front (a load balancer, say) that forwards each request to DynamoDB and, while
 * `failing`, waits for DynamoDB's whole answer and replies with its own error page instead:
 * an HTTP status the SDK cannot parse into a service error. With `stripItems`, it drops
 * the item a failed condition returns (ReturnValuesOnConditionCheckFailure), as an
 * endpoint that does not support that option would. `conflictOnce` names an operation
 * (BatchWriteItem, say) whose next request is answered with a TransactionConflictException
 * without reaching DynamoDB. `forwarded` counts the requests DynamoDB got.
 */
async function startFront(status = 502): Promise<{
  endpoint: string;
  failing: boolean;
  stripItems: boolean;
  conflictOnce: string | undefined;
  forwarded: number;
}> {
  const state = {
    endpoint: '',
    failing: false,
    stripItems: false,
    conflictOnce: undefined as string | undefined,
    forwarded: 0,
  };
  front = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const target = String(req.headers['x-amz-target'] ?? '');
      if (state.conflictOnce !== undefined && target.endsWith(`.${state.conflictOnce}`)) {
        state.conflictOnce = undefined;
        const body = JSON.stringify({
          __type: 'com.amazonaws.dynamodb.v20120810#TransactionConflictException',
          message: 'injected by the test front',
        });
        res.writeHead(400, { 'content-type': 'application/x-amz-json-1.0' });
        res.end(body);
        return;
      }
      state.forwarded++;
      const out = httpRequest(
        { host: upstream.host, port: upstream.port, method: req.method, path: req.url, headers: req.headers },
        (reply) => {
          const body: Buffer[] = [];
          reply.on('data', (chunk: Buffer) => body.push(chunk));
          reply.on('end', () => {
            if (state.failing) {
              res.writeHead(status, { 'content-type': 'text/html' });
              res.end(`<html><body>${status} from the front</body></html>`);
              return;
            }
            let answer = Buffer.concat(body);
            if (state.stripItems && reply.statusCode === 400) {
              const parsed = JSON.parse(answer.toString('utf8')) as {
                Item?: unknown;
                CancellationReasons?: { Item?: unknown }[];
              };
              delete parsed.Item;
              for (const reason of parsed.CancellationReasons ?? []) delete reason.Item;
              answer = Buffer.from(JSON.stringify(parsed));
            }
            const headers: Record<string, string | string[] | undefined> = {
              ...reply.headers,
              'content-length': String(answer.length),
            };
            delete headers['x-amz-crc32'];
            res.writeHead(reply.statusCode ?? 500, headers);
            res.end(answer);
          });
        },
      );
      out.on('error', () => res.destroy());
      out.end(Buffer.concat(chunks));
    });
  });
  await new Promise<void>((resolve) => front!.listen(0, '127.0.0.1', resolve));
  const address = front.address();
  if (address === null || typeof address !== 'object') throw new Error('front did not bind');
  state.endpoint = `http://127.0.0.1:${address.port}`;
  return state;
}

describe('dynamodb: failures the existing failure tests do not show', () => {
  it("a 4xx from an intermediary after DynamoDB applied the write (no parsed service error) is 'unknown', and the write landed", async () => {
    for (const status of [408, 403]) {
      const gateway = await startFront(status);
      const { via, direct } = await stores(gateway.endpoint);
      gateway.failing = true;
      const before = gateway.forwarded;
      const error = await errorOf(
        via.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('landed') }),
      );
      expect(error).toBeInstanceOf(StoreError);
      expect((error as StoreError).applied).toBe('unknown');
      expect(
        ((error as StoreError).cause as { $metadata?: { httpStatusCode?: number } }).$metadata
          ?.httpStatusCode,
      ).toBe(status);
      expect(gateway.forwarded - before).toBe(1);
      expect(text((await direct.read('t', 'k'))?.state ?? new Uint8Array())).toBe('landed');
      front!.closeAllConnections();
      await new Promise((resolve) => front!.close(resolve));
      front = undefined;
    }
  });

  it("checkAndSetMany: one request refused (throttled), another's reply lost after it landed: 'unknown', whichever failed first", async () => {
    proxy = await startProxy(upstream);
    const { via, direct } = await stores(proxy.endpoint);
    // Requests on table "refused" are throttled (never forwarded); the others are forwarded
    // and their replies replaced by a 500.
    proxy.throttleMarker = '#r#refused';
    proxy.mode = 'reply-500';
    const error = await errorOf(
      via.checkAndSetMany([
        { table: 'refused', key: 'x', expected: null, state: bytes('x') },
        { table: 't', key: 'a', expected: null, state: bytes('a') },
      ]),
    );
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('unknown');
    expect(text((await direct.read('t', 'a'))?.state ?? new Uint8Array())).toBe('a');
    expect(await direct.read('refused', 'x')).toBeNull();
  });

  it('an endpoint that returns no item with a failed condition: the row is read, and a write that clears a flag still applies', async () => {
    const gateway = await startFront();
    const { via, direct } = await stores(gateway.endpoint);
    const flagged = await direct.checkAndSet({
      table: 't',
      key: 'k',
      expected: null,
      state: bytes('a'),
      notified: true,
    });
    if (!flagged.ok) throw new Error('create failed');
    gateway.stripItems = true;
    // The PutItem's condition (version matches, no flag) fails on the flag alone: the adapter
    // must see the row at the expected version and clear the flag in a transaction instead.
    const cleared = await via.checkAndSet({
      table: 't',
      key: 'k',
      expected: flagged.version,
      state: bytes('b'),
    });
    expect(cleared.ok).toBe(true);
    expect(text((await direct.read('t', 'k'))?.state ?? new Uint8Array())).toBe('b');
    expect(await direct.scanNotified('t', { limit: 10 })).toEqual([]);
    // A stale version: ok false with the row as it is (read, since none came back).
    const stale = await via.checkAndSet({
      table: 't',
      key: 'k',
      expected: flagged.version,
      state: bytes('c'),
    });
    expect(stale).toEqual({ ok: false, current: await direct.read('t', 'k') });
  });

  it('dropNamespace: a BatchWriteItem refused for a transaction conflict (rejected, not applied) is sent again, and the drop completes', async () => {
    const gateway = await startFront();
    const { via, direct } = await stores(gateway.endpoint);
    await direct.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('x') });
    gateway.conflictOnce = 'BatchWriteItem';
    await via.dropNamespace();
    expect(gateway.conflictOnce).toBeUndefined();
    expect(await direct.read('t', 'k')).toBeNull();
  });

  it('a notified CAS (one TransactWriteItems) whose condition fails answers ok: false with the row, not an error', async () => {
    const store = await db.store();
    const created = await store.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('a') });
    if (!created.ok) throw new Error('create failed');
    // DynamoDB cancels the transaction with a reason per item: [ConditionalCheckFailed, None].
    const stale = await store.checkAndSet({
      table: 't',
      key: 'k',
      expected: 'stale',
      state: bytes('b'),
      notified: true,
    });
    expect(stale).toEqual({ ok: false, current: { version: created.version, state: bytes('a') } });
    const removed = await store.checkAndSet({ table: 't', key: 'gone', expected: 'stale', state: null });
    expect(removed).toEqual({ ok: false, current: null });
    expect(await store.scanNotified('t', { limit: 10 })).toEqual([]);
  });
});
