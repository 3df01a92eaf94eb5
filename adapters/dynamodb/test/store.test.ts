import {
  CreateTableCommand,
  DeleteTableCommand,
  DynamoDBClient,
  ListTablesCommand,
  PutItemCommand,
} from '@aws-sdk/client-dynamodb';
import { ClosedError, InvalidArgumentError } from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { DYNAMODB_ITEM_LIMIT, MAX_STATE_BYTES } from '../src/layout.js';
import { createDynamoDbStore } from '../src/store.js';
import { bytes, text, uniqueNamespace, useDynamoDb } from './helpers.js';

const db = useDynamoDb();

function rawClient(): DynamoDBClient {
  const t = db.target();
  return new DynamoDBClient({
    endpoint: t.endpoint,
    region: t.region,
    maxAttempts: 1,
    ...(t.credentials ? { credentials: { ...t.credentials } } : {}),
  });
}

describe('dynamodb store: single-row contract', () => {
  it('isolates namespaces and drops one namespace completely', async () => {
    const t = db.target();
    // "x_ab" starts with "x_a": prefix matching must not confuse them.
    const base = uniqueNamespace('x');
    const a = db.track(await createDynamoDbStore(t.storeOptions(`${base}_a`)));
    const ab = db.track(await createDynamoDbStore(t.storeOptions(`${base}_ab`)));
    for (let i = 0; i < 60; i++) {
      await a.checkAndSet({
        table: 't',
        key: `k${i}`,
        expected: null,
        state: bytes('a'),
        notified: i % 3 === 0,
      });
    }
    await ab.checkAndSet({ table: 't', key: 'k0', expected: null, state: bytes('ab'), notified: true });
    await a.incrementCounter('c', 5);
    await ab.incrementCounter('c', 7);
    expect(text((await a.read('t', 'k0'))?.state ?? new Uint8Array())).toBe('a');
    expect(text((await ab.read('t', 'k0'))?.state ?? new Uint8Array())).toBe('ab');
    expect(await a.scan('t', { limit: 100 })).toHaveLength(60);
    expect(await ab.scan('t', { limit: 100 })).toHaveLength(1);

    await a.dropNamespace();
    expect(await a.read('t', 'k0')).toBeNull();
    expect(await a.scan('t', { limit: 100 })).toEqual([]);
    expect(await a.scanNotified('t', { limit: 100 })).toEqual([]);
    expect(await a.incrementCounter('c', 1)).toBe(1);
    // The other namespace is untouched.
    expect(text((await ab.read('t', 'k0'))?.state ?? new Uint8Array())).toBe('ab');
    expect(await ab.scanNotified('t', { limit: 10 })).toEqual(['k0']);
    expect(await ab.incrementCounter('c', 1)).toBe(8);
  });
});

describe('dynamodb store: input checks and limits', () => {
  it('rejects a bad namespace or table name with InvalidArgumentError', async () => {
    const t = db.target();
    for (const namespace of ['', 'Bad', '1abc', 'a-b', 'a#b', 'a'.repeat(33), 42]) {
      await expect(
        createDynamoDbStore({ ...t.storeOptions('ok'), namespace: namespace as string }),
      ).rejects.toBeInstanceOf(InvalidArgumentError);
    }
    await expect(createDynamoDbStore({ ...t.storeOptions('ok'), tableName: 'x' })).rejects.toBeInstanceOf(
      InvalidArgumentError,
    );
    const store = await createDynamoDbStore({ ...t.storeOptions('ok'), namespace: undefined });
    expect(store.namespace).toBe('percolator');
    await store.close();
  });

  it('declares a maxStateBytes that fits the 400 KB item limit in the worst case', async () => {
    const store = await db.store({ namespace: `z${uniqueNamespace('w').padEnd(31, '0')}`.slice(0, 32) });
    expect(store.namespace).toHaveLength(32);
    expect(store.capabilities.maxStateBytes).toBe(MAX_STATE_BYTES);
    expect(MAX_STATE_BYTES).toBeLessThan(DYNAMODB_ITEM_LIMIT);
    // Longest table name, longest key, notified (the extra `n` attribute): still accepted.
    const table = 'T'.repeat(64);
    const key = '😀'.repeat(256);
    const state = new Uint8Array(MAX_STATE_BYTES).fill(7);
    const created = await store.checkAndSet({ table, key, expected: null, state, notified: true });
    expect(created.ok).toBe(true);
    expect((await store.read(table, key))?.state.length).toBe(MAX_STATE_BYTES);
    const plain = await store.checkAndSet({
      table,
      key,
      expected: created.ok ? created.version : null,
      state,
    });
    expect(plain.ok).toBe(true);
  });

  it('the endpoint itself refuses an item over 400 KB (the limit we plan for is real)', async () => {
    const client = rawClient();
    try {
      await expect(
        client.send(
          new PutItemCommand({
            TableName: db.target().tableName,
            Item: {
              pk: { S: `${uniqueNamespace()}#r#t` },
              sk: { B: bytes('k') },
              s: { B: new Uint8Array(DYNAMODB_ITEM_LIMIT) },
            },
          }),
        ),
      ).rejects.toMatchObject({ name: 'ValidationException' });
    } finally {
      client.destroy();
    }
  });
});

describe('dynamodb store: table and client lifecycle', () => {
  it('creates the table idempotently, checks its schema, and refuses a missing table without createTable', async () => {
    const t = db.target();
    const tableName = `pt_${uniqueNamespace()}`;
    const client = rawClient();
    try {
      await expect(
        createDynamoDbStore({ ...t.storeOptions(uniqueNamespace()), tableName, createTable: false }),
      ).rejects.toBeInstanceOf(InvalidArgumentError);
      // Two stores racing to create the same table both succeed.
      const [s1, s2] = await Promise.all([
        createDynamoDbStore({ ...t.storeOptions(uniqueNamespace()), tableName }),
        createDynamoDbStore({ ...t.storeOptions(uniqueNamespace()), tableName }),
      ]);
      expect((await s1.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('1') })).ok).toBe(
        true,
      );
      await s1.close();
      await s2.close();
      const listed = await client.send(new ListTablesCommand({}));
      expect(listed.TableNames).toContain(tableName);

      const wrongName = `pw_${uniqueNamespace()}`;
      await client.send(
        new CreateTableCommand({
          TableName: wrongName,
          BillingMode: 'PAY_PER_REQUEST',
          AttributeDefinitions: [{ AttributeName: 'id', AttributeType: 'S' }],
          KeySchema: [{ AttributeName: 'id', KeyType: 'HASH' }],
        }),
      );
      await expect(
        createDynamoDbStore({ ...t.storeOptions(uniqueNamespace()), tableName: wrongName }),
      ).rejects.toThrow(/wrong key schema/);
      await client.send(new DeleteTableCommand({ TableName: wrongName }));
    } finally {
      await client.send(new DeleteTableCommand({ TableName: tableName })).catch(() => {});
      client.destroy();
    }
  });

  it('refuses a client that retries on its own; close() leaves a passed client usable', async () => {
    const t = db.target();
    const retrying = new DynamoDBClient({
      endpoint: t.endpoint,
      region: t.region,
      ...(t.credentials ? { credentials: { ...t.credentials } } : {}),
    });
    await expect(
      createDynamoDbStore({ client: retrying, tableName: t.tableName, namespace: uniqueNamespace() }),
    ).rejects.toThrow(/maxAttempts: 1/);
    retrying.destroy();

    const client = rawClient();
    const store = await createDynamoDbStore({ client, tableName: t.tableName, namespace: uniqueNamespace() });
    await store.close();
    await expect(store.read('t', 'k')).rejects.toBeInstanceOf(ClosedError);
    // Not ours: still works.
    expect((await client.send(new ListTablesCommand({}))).TableNames).toContain(t.tableName);
    client.destroy();

    const owned = await db.store();
    await owned.close();
    await expect(
      owned.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('x') }),
    ).rejects.toBeInstanceOf(ClosedError);
  });
});

describe('dynamodb store: the table', () => {
  /** A client whose DescribeTable answers are changed by `alter` (DynamoDB Local has no global tables). */
  function describing(alter: (table: Record<string, unknown>) => void) {
    const client = rawClient();
    client.middlewareStack.add(
      (next, context) => async (args) => {
        const result = await next(args);
        const table = (result.output as { Table?: Record<string, unknown> }).Table;
        if (context.commandName === 'DescribeTableCommand' && table) alter(table);
        return result;
      },
      { step: 'initialize' },
    );
    return client;
  }

  it('a global table (replicas in other regions) is refused: its conditions and counters hold per region', async () => {
    const t = db.target();
    const client = describing((table) => {
      table.Replicas = [{ RegionName: 'us-west-2' }, { RegionName: 'eu-west-1' }];
    });
    const error = await createDynamoDbStore({
      client,
      tableName: t.tableName,
      namespace: uniqueNamespace('global'),
      createTable: true,
    }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(InvalidArgumentError);
    expect((error as Error).message).toMatch(/is a global table \(replicated to us-west-2, eu-west-1\)/);
    client.destroy();
  });

  it('a table being updated (billing, capacity, indexes) is used at once: it takes reads and writes', async () => {
    const t = db.target();
    const client = describing((table) => {
      table.TableStatus = 'UPDATING';
    });
    const store = db.track(
      await createDynamoDbStore({
        client,
        tableName: t.tableName,
        namespace: uniqueNamespace('updating'),
        createTable: true,
        tableWaitTimeoutMs: 1000,
      }),
    );
    expect((await store.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('x') })).ok).toBe(
      true,
    );
    client.destroy();
  });
});

describe('dynamodb store: peeked reads', () => {
  it('a peek the service cancels for a conflict (an item being written: the counter, under load) reads apart, and keeps to that for a while', async () => {
    // DynamoDB Local never cancels a TransactGetItems for a write in progress; the service
    // does (found in review): the client answers the first one as the service would.
    const t = db.target();
    const client = rawClient();
    const sent: string[] = [];
    let cancel = 1;
    client.middlewareStack.add(
      (next, context) => async (args) => {
        sent.push(String(context.commandName));
        if (context.commandName === 'TransactGetItemsCommand' && cancel > 0) {
          cancel--;
          throw Object.assign(
            new Error(
              'Transaction cancelled, please refer cancellation reasons for specific reasons [TransactionConflict, None]',
            ),
            {
              name: 'TransactionCanceledException',
              $fault: 'client',
              $metadata: { httpStatusCode: 400 },
              CancellationReasons: [{ Code: 'TransactionConflict' }, { Code: 'None' }],
            },
          );
        }
        return next(args);
      },
      { step: 'initialize' },
    );
    const store = db.track(
      await createDynamoDbStore({
        client,
        tableName: t.tableName,
        namespace: uniqueNamespace('conflict'),
        createTable: true,
      }),
    );
    expect((await store.checkAndSet({ table: 't', key: 'a', expected: null, state: bytes('A') })).ok).toBe(
      true,
    );
    expect(await store.incrementCounter('c', 7)).toBe(7);
    sent.length = 0;
    const first = await store.readPeeked!(
      [
        { table: 't', key: 'a' },
        { table: 't', key: 'absent' },
      ],
      'c',
    );
    expect(first.timestamp).toBe(7);
    expect(first.rows.map((row) => (row ? text(row.state) : null))).toEqual(['A', null]);
    // The cancelled combined read, then the counter and the rows apart: no retry of it.
    expect(sent).toEqual(['TransactGetItemsCommand', 'GetItemCommand', 'BatchGetItemCommand']);
    sent.length = 0;
    const second = await store.readPeeked!([{ table: 't', key: 'a' }], 'c');
    expect(second.timestamp).toBe(7);
    expect(sent).toEqual(['GetItemCommand', 'BatchGetItemCommand']);
    expect(await store.incrementCounter('c', 1)).toBe(8); // the peeks drew nothing
    client.destroy();
  });

  it('over the 4 MB TransactGetItems answers, peek the counter alone and read the rows after: the same rows and value, and still no write', async () => {
    const t = db.target();
    const client = rawClient();
    const sent: string[] = [];
    client.middlewareStack.add(
      (next, context) => async (args) => {
        sent.push(String(context.commandName));
        return next(args);
      },
      { step: 'initialize' },
    );
    const store = db.track(
      await createDynamoDbStore({
        client,
        tableName: t.tableName,
        namespace: uniqueNamespace('peek'),
        createTable: true,
      }),
    );
    // 24 rows of ~190 KB: about 4.5 MB, past what one TransactGetItems answers.
    const refs = Array.from({ length: 24 }, (_, i) => ({ table: 't', key: `big${i}` }));
    for (const [i, ref] of refs.entries()) {
      const state = new Uint8Array(190_000).fill(i + 1);
      expect((await store.checkAndSet({ ...ref, expected: null, state })).ok).toBe(true);
    }
    const small = [{ table: 't', key: 'big3' }, { table: 't', key: 'absent' }, refs[5]!];
    expect(await store.incrementCounter('c', 41)).toBe(41);
    sent.length = 0;
    const all = await store.readPeeked!([...refs, { table: 't', key: 'absent' }, refs[0]!], 'c');
    expect(all.timestamp).toBe(41);
    expect(all.rows).toHaveLength(26);
    refs.forEach((_, i) => {
      const state = all.rows[i]?.state;
      expect(state?.byteLength).toBe(190_000);
      expect(state?.[0]).toBe(i + 1);
    });
    expect(all.rows[24]).toBeNull();
    expect(all.rows[25]?.state[0]).toBe(1); // a repeated ref, answered twice
    // The refused peek, the counter alone, then the rows (BatchGetItem, 16 MB a call): no write.
    expect(sent[0]).toBe('TransactGetItemsCommand');
    expect(sent[1]).toBe('GetItemCommand');
    expect(sent.slice(2).every((name) => name === 'BatchGetItemCommand')).toBe(true);
    // A wave that fits is still one call.
    sent.length = 0;
    const few = await store.readPeeked!(small, 'c');
    expect(sent).toEqual(['TransactGetItemsCommand']);
    expect(few.timestamp).toBe(41);
    expect(few.rows.map((row) => row?.state[0] ?? null)).toEqual([4, null, 6]);
    expect(await store.incrementCounter('c', 1)).toBe(42); // the peeks drew nothing
    client.destroy();
  });
});
