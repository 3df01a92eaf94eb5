import { DeleteTableCommand, DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { Percolator, StoreError } from '@percolator/core';
import { type DynamoDbLocal, startDynamoDbLocal } from '@percolator/testkit/dynamodb';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createDynamoDbStore, type DynamoDbRowStore } from '../src/store.js';
import { bytes, text, uniqueNamespace, useDynamoDb } from './helpers.js';
import { startProxy, type TestProxy } from './proxy.js';

/**
 * Lost replies, for real: a TCP proxy in front of DynamoDB forwards each request to the
 * service and then loses, resets or replaces its reply. The write did land, so the only
 * honest answer is StoreError 'unknown' (and a retried conditional write would have
 * failed its own condition and looked like a conflict).
 */
const db = useDynamoDb();
let ownLocal: DynamoDbLocal | undefined;
let upstream: { host: string; port: number };
let proxy: TestProxy;

beforeAll(async () => {
  // The proxy speaks plain TCP to an http endpoint; for an https one (real AWS) these
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
});

/** Options of a store on the DynamoDB behind the proxy (namespace to be set). */
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

/** A store through the proxy, and a direct one on the same namespace to check what landed. */
async function stores(
  requestTimeoutMs = 800,
): Promise<{ viaProxy: DynamoDbRowStore; direct: DynamoDbRowStore }> {
  proxy = await startProxy(upstream);
  const base = baseOptions();
  const namespace = uniqueNamespace('f');
  const direct = db.track(await createDynamoDbStore({ ...base, namespace }));
  const viaProxy = db.track(
    await createDynamoDbStore({
      ...base,
      endpoint: proxy.endpoint,
      namespace,
      requestTimeoutMs,
      retry: { maxAttempts: 3, baseDelayMs: 10, maxDelayMs: 50 },
    }),
  );
  return { viaProxy, direct };
}

/**
 * A caller's client through the proxy with the SDK's defaults (no request timeout of its
 * own), and a store on it with requestTimeoutMs 800. The caller destroys the client.
 */
async function callerStore(namespace: string): Promise<{ store: DynamoDbRowStore; client: DynamoDBClient }> {
  const base = baseOptions();
  const client = new DynamoDBClient({
    endpoint: proxy.endpoint,
    region: base.region,
    ...(base.credentials ? { credentials: base.credentials } : {}),
    maxAttempts: 1,
  });
  try {
    const store = db.track(
      await createDynamoDbStore({ client, tableName: base.tableName, namespace, requestTimeoutMs: 800 }),
    );
    return { store, client };
  } catch (error) {
    client.destroy();
    throw error;
  }
}

async function expectUnknown(promise: Promise<unknown>): Promise<StoreError> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(StoreError);
  expect((error as StoreError).applied).toBe('unknown');
  expect((error as StoreError).code).toBe('STORE_AMBIGUOUS');
  return error as StoreError;
}

describe('dynamodb store: ambiguous outcomes', () => {
  it('a conditional put whose reply is lost (timeout) is unknown, and did land', async () => {
    const { viaProxy, direct } = await stores();
    const created = await viaProxy.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('v1') });
    if (!created.ok) throw new Error('create failed');
    proxy.mode = 'drop-replies';
    const sentBefore = proxy.forwarded;
    await expectUnknown(
      viaProxy.checkAndSet({ table: 't', key: 'k', expected: created.version, state: bytes('v2') }),
    );
    expect(proxy.forwarded - sentBefore).toBe(1);
    const row = await direct.read('t', 'k');
    expect(text(row?.state ?? new Uint8Array())).toBe('v2');
    expect(row?.version).not.toBe(created.version);
  });

  it('creating the table survives a CreateTable that failed on its way and one whose reply was lost', async () => {
    // The first CreateTable never reaches the service (a reset before sending: outcome
    // unknown to the store); the second lands and its reply is lost. Sent once, as a
    // write, the first failure either failed the store at once or (being "unknown") left
    // it polling for a table nobody had created until tableWaitTimeoutMs.
    const target = db.target();
    const client = new DynamoDBClient({
      endpoint: target.endpoint,
      region: target.region,
      ...(target.credentials ? { credentials: target.credentials } : {}),
      maxAttempts: 1,
    });
    const reset = () =>
      Object.assign(new Error('socket hang up'), { name: 'Error', code: 'ECONNRESET', $metadata: {} });
    let creates = 0;
    client.middlewareStack.add(
      (next, context) => async (args) => {
        if ((context as { commandName?: string }).commandName !== 'CreateTableCommand') return next(args);
        creates++;
        if (creates === 1) throw reset(); // never sent
        const out = await next(args);
        if (creates === 2) throw reset(); // landed, reply lost
        return out;
      },
      { step: 'deserialize', name: 'failCreates' },
    );
    const tableName = `percolator_ct_${uniqueNamespace('t')}`;
    try {
      const store = db.track(
        await createDynamoDbStore({
          client,
          tableName,
          namespace: uniqueNamespace('c'),
          createTable: true,
          tableWaitTimeoutMs: 20_000,
        }),
      );
      expect(creates).toBe(3); // the third: ResourceInUseException, the table is there
      const created = await store.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('v') });
      expect(created.ok).toBe(true);
    } finally {
      await client.send(new DeleteTableCommand({ TableName: tableName })).catch(() => {});
      client.destroy();
    }
  });

  it('a table deleted under a running store: every call fails "no", not retryable, and a transaction at its first attempt', async () => {
    // Found by a user (on PostgreSQL): a dropped namespace was retried ten times, with
    // backoffs, before the error came; it stays missing until an operator acts.
    const target = db.target();
    const client = new DynamoDBClient({
      endpoint: target.endpoint,
      region: target.region,
      ...(target.credentials ? { credentials: target.credentials } : {}),
      maxAttempts: 1,
    });
    const tableName = `percolator_gone_${uniqueNamespace('t')}`;
    try {
      const store = db.track(
        await createDynamoDbStore({ client, tableName, namespace: uniqueNamespace('g'), createTable: true }),
      );
      await client.send(new DeleteTableCommand({ TableName: tableName }));
      for (const call of [
        () => store.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('v') }),
        () => store.read('t', 'k'),
      ]) {
        const error = await call().then(
          () => undefined,
          (e: unknown) => e,
        );
        expect(error).toBeInstanceOf(StoreError);
        expect((error as StoreError).applied).toBe('no');
        expect((error as StoreError).retryable).toBe(false);
      }
      const percolator = new Percolator({ store });
      let attempts = 0;
      const failed = await percolator
        .transact(async (tx) => {
          attempts++;
          tx.set('t', 'k', 'v', 'x');
        })
        .then(
          () => undefined,
          (e: unknown) => e,
        );
      expect(failed).toBeInstanceOf(StoreError);
      expect(attempts).toBe(1);
      await percolator.close();
    } finally {
      client.destroy();
    }
  });

  it("a caller's client with a retry strategy of its own: a conditional write the SDK sent again after its first landed is unknown, not a conflict", async () => {
    // maxAttempts: 1 passes the store's check, but a retryStrategy overrides it. The first
    // PutItem (and DeleteItem) lands and its reply is lost; the SDK sends it again, and the
    // resend fails its own condition: taken at its word, a conflict over our own write.
    const target = db.target();
    type Token = { getRetryCount(): number; getRetryDelay(): number };
    const token = (n: number): Token => ({ getRetryCount: () => n, getRetryDelay: () => 1 });
    const client = new DynamoDBClient({
      endpoint: target.endpoint,
      region: target.region,
      ...(target.credentials ? { credentials: target.credentials } : {}),
      maxAttempts: 1,
      retryStrategy: {
        mode: 'custom',
        acquireInitialRetryToken: async () => token(0),
        refreshRetryTokenForRetry: async (last: Token, error: unknown) => {
          if (last.getRetryCount() + 1 >= 3) throw error;
          return token(last.getRetryCount() + 1);
        },
        recordSuccess: () => {},
      } as never,
    });
    const sends = { PutItemCommand: 0, DeleteItemCommand: 0 };
    const lost = new Set<string>();
    client.middlewareStack.add(
      (next, context) => async (args) => {
        const name = (context as { commandName?: string }).commandName ?? '';
        if (!(name in sends)) return next(args);
        sends[name as keyof typeof sends]++;
        const out = await next(args); // landed
        if (!lost.has(name)) {
          lost.add(name);
          throw Object.assign(new Error('socket hang up'), {
            name: 'Error',
            code: 'ECONNRESET',
            $metadata: {},
          });
        }
        return out;
      },
      { step: 'deserialize', name: 'loseFirstReply' },
    );
    try {
      const store = db.track(
        await createDynamoDbStore({
          client,
          tableName: target.tableName,
          namespace: uniqueNamespace('r'),
          createTable: true,
        }),
      );
      await expectUnknown(store.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('mine') }));
      expect(sends.PutItemCommand).toBeGreaterThanOrEqual(2); // sent again by the SDK
      const row = (await store.read('t', 'k'))!;
      expect(text(row.state)).toBe('mine');
      await expectUnknown(store.checkAndSet({ table: 't', key: 'k', expected: row.version, state: null }));
      expect(sends.DeleteItemCommand).toBeGreaterThanOrEqual(2);
      expect(await store.read('t', 'k')).toBeNull();
    } finally {
      client.destroy();
    }
  });

  it("a caller's client with no request timeout: a write whose reply is lost is unknown at the store's deadline, a read fails retryably", async () => {
    // The SDK's default NodeHttpHandler has no request timeout: without the store's own
    // deadline (requestTimeoutMs, an abortSignal on every call) these calls hang for ever.
    const { direct } = await stores();
    const { store, client } = await callerStore(direct.namespace);
    try {
      const created = await store.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('v1') });
      if (!created.ok) throw new Error('create failed');
      proxy.mode = 'drop-replies';
      const before = proxy.forwarded;
      await expectUnknown(
        store.checkAndSet({ table: 't', key: 'k', expected: created.version, state: bytes('v2') }),
      );
      expect(proxy.forwarded - before).toBe(1);
      expect(text((await direct.read('t', 'k'))?.state ?? new Uint8Array())).toBe('v2');
      const lost = await store.read('t', 'k').catch((e: unknown) => e);
      expect(lost).toBeInstanceOf(StoreError);
      expect((lost as StoreError).applied).toBe('no');
      expect((lost as StoreError).retryable).toBe(true);
    } finally {
      client.destroy();
    }
  }, 30_000);

  it("the store's own client never cuts a reply still arriving, past requestTimeoutMs in all; a caller's client is bounded in all", async () => {
    // Our client bounds the wait for the headers and any quiet spell after them by
    // requestTimeoutMs (800 ms here); the proxy passes each reply's body on in pieces 150 ms
    // apart, 1.5 s in all.
    const { viaProxy, direct } = await stores(800);
    // A caller's client: its handler cannot be read back, so each call is bounded whole.
    const { store: theirs, client } = await callerStore(direct.namespace);
    try {
      const created = await direct.checkAndSet({
        table: 't',
        key: 'k',
        expected: null,
        state: bytes('slow'),
      });
      if (!created.ok) throw new Error('create failed');
      proxy.mode = 'slow-replies';
      expect(text((await viaProxy.read('t', 'k'))?.state ?? new Uint8Array())).toBe('slow');
      const written = await viaProxy.checkAndSet({
        table: 't',
        key: 'k',
        expected: created.version,
        state: bytes('slower'),
      });
      expect(written.ok).toBe(true);
      const cut = await theirs.read('t', 'k').catch((e: unknown) => e);
      expect(cut).toBeInstanceOf(StoreError);
      expect((cut as StoreError).retryable).toBe(true);
      expect((cut as Error).message).toContain('no reply within 800 ms');
    } finally {
      client.destroy();
    }
  }, 30_000);

  it("the store's own client: a reply whose body stalls after its headers fails after requestTimeoutMs of quiet (a write 'unknown'), never hangs", async () => {
    const { viaProxy, direct } = await stores(800);
    proxy.mode = 'stall-after-headers';
    await expectUnknown(
      viaProxy.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('landed') }),
    );
    expect(text((await direct.read('t', 'k'))?.state ?? new Uint8Array())).toBe('landed');
    const stalled = await viaProxy.read('t', 'k').catch((e: unknown) => e);
    expect(stalled).toBeInstanceOf(StoreError);
    expect((stalled as StoreError).retryable).toBe(true);
  }, 30_000);

  it("the store's own client: a call stuck before its handler (credentials that never resolve) ends at requestTimeoutMs, never hangs", async () => {
    const base = baseOptions();
    const given = base.credentials as { accessKeyId: string; secretAccessKey: string } | undefined;
    let stuck = false;
    const store = db.track(
      await createDynamoDbStore({
        ...base,
        namespace: uniqueNamespace('f'),
        requestTimeoutMs: 800,
        // Expiring at once, so the SDK asks for them again on every call.
        credentials: async () => {
          if (stuck) await new Promise(() => {});
          return {
            accessKeyId: given?.accessKeyId ?? 'l',
            secretAccessKey: given?.secretAccessKey ?? 'l',
            expiration: new Date(Date.now() + 1000),
          };
        },
      }),
    );
    const created = await store.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('v1') });
    expect(created.ok).toBe(true);
    stuck = true;
    await expectUnknown(store.checkAndSet({ table: 't', key: 'j', expected: null, state: bytes('v1') }));
    const read = await store.read('t', 'k').catch((e: unknown) => e);
    expect(read).toBeInstanceOf(StoreError);
    expect((read as StoreError).retryable).toBe(true);
  }, 30_000);

  it('requestTimeoutMs past the range of Node timers (2^31 - 1) is refused: a longer timer fires after 1 ms', async () => {
    const base = baseOptions();
    for (const requestTimeoutMs of [2 ** 31, 1e10, 0, 1.5]) {
      await expect(
        createDynamoDbStore({ ...base, namespace: uniqueNamespace('f'), requestTimeoutMs }),
      ).rejects.toThrow(/requestTimeoutMs must be an integer from 1 to 2147483647/);
    }
  });

  it('a 5xx reply to a conditional put is unknown and is not retried', async () => {
    const { viaProxy, direct } = await stores();
    proxy.mode = 'reply-500';
    const before = proxy.forwarded;
    await expectUnknown(
      viaProxy.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('landed') }),
    );
    expect(proxy.forwarded - before).toBe(1);
    // Had the adapter (or the SDK) resent it, the second attempt would have failed
    // `attribute_not_exists` and been reported as a conflict.
    expect(text((await direct.read('t', 'k'))?.state ?? new Uint8Array())).toBe('landed');
  });

  it('a reset connection during a transactional CAS (notified) or a delete is unknown', async () => {
    const { viaProxy, direct } = await stores();
    const created = await viaProxy.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('a') });
    if (!created.ok) throw new Error('create failed');
    proxy.mode = 'reset-on-reply';
    await expectUnknown(
      viaProxy.checkAndSet({
        table: 't',
        key: 'k',
        expected: created.version,
        state: bytes('b'),
        notified: true,
      }),
    );
    expect(await direct.scanNotified('t', { limit: 10 })).toEqual(['k']);
    expect(text((await direct.read('t', 'k'))?.state ?? new Uint8Array())).toBe('b');

    proxy.mode = 'pass';
    const plain = await viaProxy.checkAndSet({ table: 't', key: 'd', expected: null, state: bytes('d') });
    if (!plain.ok) throw new Error('create failed');
    proxy.mode = 'reset-on-reply';
    await expectUnknown(viaProxy.checkAndSet({ table: 't', key: 'd', expected: plain.version, state: null }));
    expect(await direct.read('t', 'd')).toBeNull();
  });

  it('a 200 reply cut off after its headers is unknown (PutItem, TransactWriteItems, UpdateItem), and each landed', async () => {
    const { viaProxy, direct } = await stores();
    proxy.mode = 'truncate-reply';
    const before = proxy.forwarded;
    await expectUnknown(
      viaProxy.checkAndSet({ table: 't', key: 'plain', expected: null, state: bytes('landed') }),
    );
    await expectUnknown(
      viaProxy.checkAndSet({ table: 't', key: 'flag', expected: null, state: bytes('f'), notified: true }),
    );
    const error = await expectUnknown(viaProxy.incrementCounter('c', 1));
    // The SDK saw DynamoDB's 200 status before the body broke off.
    expect((error.cause as { $metadata?: { httpStatusCode?: number } }).$metadata?.httpStatusCode).toBe(200);
    // Each was sent exactly once: no retry that could fail its own condition.
    expect(proxy.forwarded - before).toBe(3);
    expect(text((await direct.read('t', 'plain'))?.state ?? new Uint8Array())).toBe('landed');
    expect(text((await direct.read('t', 'flag'))?.state ?? new Uint8Array())).toBe('f');
    expect(await direct.scanNotified('t', { limit: 10 })).toEqual(['flag']);
    expect(await direct.incrementCounter('c', 1)).toBe(2);
  });

  it('checkAndSetMany is unknown when one request applied and another was refused', async () => {
    const { viaProxy, direct } = await stores();
    // Requests on table "refused" are throttled every time, so they end as applied "no".
    proxy.throttleMarker = '#r#refused';
    const onlyRefused = await viaProxy
      .checkAndSetMany([{ table: 'refused', key: 'x', expected: null, state: bytes('x') }])
      .catch((e: unknown) => e);
    expect(onlyRefused).toBeInstanceOf(StoreError);
    expect((onlyRefused as StoreError).applied).toBe('no');

    await expectUnknown(
      viaProxy.checkAndSetMany([
        { table: 't', key: 'a', expected: null, state: bytes('a') },
        { table: 'refused', key: 'x', expected: null, state: bytes('x') },
      ]),
    );
    expect(text((await direct.read('t', 'a'))?.state ?? new Uint8Array())).toBe('a');
    expect(await direct.read('refused', 'x')).toBeNull();
  });

  it('readMany resends UnprocessedKeys until every row is back, in request order', async () => {
    const { viaProxy, direct } = await stores(10_000);
    // 60 items near the 400 KB limit exceed BatchGetItem's 16 MB reply, so DynamoDB
    // answers part of the one request and returns the rest as UnprocessedKeys.
    const size = direct.capabilities.maxStateBytes;
    const written: string[] = [];
    for (let i = 0; i < 60; i++) {
      const state = new Uint8Array(size).fill(i);
      const result = await direct.checkAndSet({ table: 'big', key: `k${i}`, expected: null, state });
      if (!result.ok) throw new Error('create failed');
      written.push(result.version);
    }
    const order = [...written.keys()].reverse();
    const before = proxy.forwarded;
    const rows = await viaProxy.readMany(order.map((i) => ({ table: 'big', key: `k${i}` })));
    // More than one BatchGetItem for 60 keys (< 100 per request): the unprocessed ones were resent.
    expect(proxy.forwarded - before).toBeGreaterThan(1);
    expect(rows).toHaveLength(60);
    rows.forEach((row, position) => {
      const i = order[position] as number;
      expect(row?.version).toBe(written[i]);
      expect(row?.state.byteLength).toBe(size);
      expect(row?.state[0]).toBe(i);
      expect(row?.state[size - 1]).toBe(i);
    });
  });

  it('a counter increment whose reply is lost is unknown', async () => {
    const { viaProxy, direct } = await stores();
    expect(await viaProxy.incrementCounter('c', 1)).toBe(1);
    proxy.mode = 'reply-500';
    await expectUnknown(viaProxy.incrementCounter('c', 1));
    expect(await direct.incrementCounter('c', 1)).toBe(3);
  });

  it('a read is sent once (the core retries reads): a failure is applied "no", the next read gets through', async () => {
    const { viaProxy, direct } = await stores(500);
    await direct.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('r') });
    proxy.mode = 'reply-500-once';
    const before = proxy.forwarded;
    const error = await viaProxy.read('t', 'k').catch((e: unknown) => e);
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    expect(proxy.forwarded - before).toBe(1);
    const row = await viaProxy.read('t', 'k');
    expect(text(row?.state ?? new Uint8Array())).toBe('r');

    proxy.mode = 'drop-replies';
    const lost = await viaProxy.read('t', 'k').catch((e: unknown) => e);
    expect(lost).toBeInstanceOf(StoreError);
    expect((lost as StoreError).applied).toBe('no');
  });

  it('a throttled write is sent once and is applied "no", retryable (the core retries it)', async () => {
    const { viaProxy, direct } = await stores();
    proxy.mode = 'throttle-once';
    const before = proxy.forwarded;
    const error = await viaProxy
      .checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('t') })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    expect((error as StoreError).retryable).toBe(true);
    expect(await direct.read('t', 'k')).toBeNull();
    // The throttle reply came from the proxy: nothing reached DynamoDB.
    expect(proxy.forwarded - before).toBe(0);
    const result = await viaProxy.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('t') });
    expect(result.ok).toBe(true);
  });

  it('a refused connection is StoreError "no": nothing was sent', async () => {
    const { viaProxy, direct } = await stores();
    await proxy.close();
    await new Promise((resolve) => setTimeout(resolve, 100));
    const error = await viaProxy
      .checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('x') })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    expect(await direct.read('t', 'k')).toBeNull();
  });
});
