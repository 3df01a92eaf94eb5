import {
  CreateTableCommand,
  DeleteTableCommand,
  DynamoDBClient,
  ListTablesCommand,
  PutItemCommand,
} from '@aws-sdk/client-dynamodb';
import { ClosedError, InvalidArgumentError, RowTooLargeError } from '@percolator/core';
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
  it('creates, reads, updates and deletes a row with check-and-set', async () => {
    const store = await db.store();
    expect(store.name).toBe('dynamodb');
    expect(await store.read('t', 'k')).toBeNull();

    const created = await store.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('one') });
    expect(created.ok).toBe(true);
    if (!created.ok) return;
    const row = await store.read('t', 'k');
    expect(row?.version).toBe(created.version);
    expect(text(row?.state ?? new Uint8Array())).toBe('one');

    // Creating again fails and reports the current row.
    const again = await store.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('x') });
    expect(again).toEqual({ ok: false, current: { version: created.version, state: bytes('one') } });

    const updated = await store.checkAndSet({
      table: 't',
      key: 'k',
      expected: created.version,
      state: bytes('two'),
    });
    expect(updated.ok).toBe(true);
    if (!updated.ok) return;
    expect(updated.version).not.toBe(created.version);

    // A stale version fails and gets the current row back.
    const stale = await store.checkAndSet({
      table: 't',
      key: 'k',
      expected: created.version,
      state: bytes('no'),
    });
    expect(stale).toEqual({ ok: false, current: { version: updated.version, state: bytes('two') } });

    const staleDelete = await store.checkAndSet({
      table: 't',
      key: 'k',
      expected: created.version,
      state: null,
    });
    expect(staleDelete.ok).toBe(false);
    const deleted = await store.checkAndSet({ table: 't', key: 'k', expected: updated.version, state: null });
    expect(deleted.ok).toBe(true);
    expect(await store.read('t', 'k')).toBeNull();

    // The row is gone: a CAS expecting its last version fails with current = null.
    const gone = await store.checkAndSet({
      table: 't',
      key: 'k',
      expected: updated.version,
      state: bytes('z'),
    });
    expect(gone).toEqual({ ok: false, current: null });
  });

  it('"delete if absent" succeeds only when the row is absent', async () => {
    const store = await db.store();
    const absent = await store.checkAndSet({ table: 't', key: 'k', expected: null, state: null });
    expect(absent.ok).toBe(true);
    expect(await store.read('t', 'k')).toBeNull();
    const made = await store.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('v') });
    expect(made.ok).toBe(true);
    const present = await store.checkAndSet({ table: 't', key: 'k', expected: null, state: null });
    expect(present.ok).toBe(false);
    expect(await store.read('t', 'k')).not.toBeNull();
  });

  it('stores empty and binary states and NUL / emoji / astral keys exactly', async () => {
    const store = await db.store();
    const all = new Uint8Array(256).map((_, i) => i);
    const keys = ['\u0000', 'a\u0000b', '😀', '\uFFFF', 'é', 'k'.repeat(10), '\u{10FFFF}'];
    for (const [i, key] of keys.entries()) {
      const state = i % 2 === 0 ? new Uint8Array(0) : all;
      const result = await store.checkAndSet({ table: 'tbl.x-1', key, expected: null, state });
      expect(result.ok).toBe(true);
      const row = await store.read('tbl.x-1', key);
      expect(row?.state).toEqual(state);
    }
    // A longest key (1024 UTF-8 bytes) works too.
    const longKey = '😀'.repeat(256);
    expect(
      (await store.checkAndSet({ table: 't', key: longKey, expected: null, state: bytes('l') })).ok,
    ).toBe(true);
    expect(text((await store.read('t', longKey))?.state ?? new Uint8Array())).toBe('l');
    // 'a\u0000b' and 'a' are different rows.
    expect(await store.read('tbl.x-1', 'a')).toBeNull();
  });

  it('never reuses a version, even after delete and re-create (no ABA)', async () => {
    const store = await db.store();
    const seen = new Set<string>();
    let firstVersion: string | undefined;
    for (let round = 0; round < 5; round++) {
      const created = await store.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('same') });
      if (!created.ok) throw new Error('create failed');
      firstVersion ??= created.version;
      expect(seen.has(created.version)).toBe(false);
      seen.add(created.version);
      const deleted = await store.checkAndSet({
        table: 't',
        key: 'k',
        expected: created.version,
        state: null,
      });
      expect(deleted.ok).toBe(true);
      if (deleted.ok) seen.add(deleted.version);
    }
    const last = await store.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('same') });
    expect(last.ok).toBe(true);
    // A CAS holding the first incarnation's version cannot succeed on the re-created row.
    const aba = await store.checkAndSet({
      table: 't',
      key: 'k',
      expected: firstVersion ?? '',
      state: bytes('x'),
    });
    expect(aba.ok).toBe(false);
  });

  it('lets exactly one of many concurrent CAS win', async () => {
    const store = await db.store();
    const base = await store.checkAndSet({ table: 't', key: 'race', expected: null, state: bytes('0') });
    if (!base.ok) throw new Error('create failed');
    const results = await Promise.all(
      Array.from({ length: 16 }, (_, i) =>
        store.checkAndSet({ table: 't', key: 'race', expected: base.version, state: bytes(`w${i}`) }),
      ),
    );
    const winners = results.filter((r) => r.ok);
    expect(winners).toHaveLength(1);
    const winner = winners[0] as { ok: true; version: string };
    const final = await store.read('t', 'race');
    expect(final?.version).toBe(winner.version);
    for (const r of results) if (!r.ok) expect(r.current?.version).toBe(winner.version);

    // Concurrent creation of an absent row: one winner too.
    const creates = await Promise.all(
      Array.from({ length: 16 }, (_, i) =>
        store.checkAndSet({ table: 't', key: 'fresh', expected: null, state: bytes(`c${i}`) }),
      ),
    );
    expect(creates.filter((r) => r.ok)).toHaveLength(1);
  });

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

  it('rejects bad rows, keys, versions and options without writing anything', async () => {
    const store = await db.store();
    const bad: unknown[] = [
      { table: 'bad table', key: 'k', expected: null, state: bytes('x') },
      { table: 't', key: '', expected: null, state: bytes('x') },
      { table: 't', key: '\uD800', expected: null, state: bytes('x') },
      { table: 't', key: 'k'.repeat(1025), expected: null, state: bytes('x') },
      { table: 't', key: 'k', expected: 5, state: bytes('x') },
      { table: 't', key: 'k', expected: null, state: 'text' },
      { table: 't', key: 'k', expected: null, state: bytes('x'), notified: 'yes' },
    ];
    for (const request of bad) {
      await expect(store.checkAndSet(request as never)).rejects.toBeInstanceOf(InvalidArgumentError);
    }
    await expect(store.read('t', '')).rejects.toBeInstanceOf(InvalidArgumentError);
    await expect(store.scan('t', { limit: -1 })).rejects.toBeInstanceOf(InvalidArgumentError);
    await expect(store.incrementCounter('c', 0)).rejects.toBeInstanceOf(InvalidArgumentError);
    await expect(store.incrementCounter('', 1)).rejects.toBeInstanceOf(InvalidArgumentError);
    await expect(store.readMany([{ table: 't', key: '' }])).rejects.toBeInstanceOf(InvalidArgumentError);
    expect(await store.scan('t', { limit: 10 })).toEqual([]);
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

  it('rejects an oversized state with RowTooLargeError before sending anything', async () => {
    const t = db.target();
    const client = rawClient();
    let sent = 0;
    client.middlewareStack.add(
      (next) => async (args) => {
        sent++;
        return next(args);
      },
      { step: 'initialize', name: 'countCommands' },
    );
    const store = db.track(
      await createDynamoDbStore({
        client,
        tableName: t.tableName,
        namespace: uniqueNamespace(),
        createTable: true,
      }),
    );
    const before = sent;
    const tooBig = new Uint8Array(MAX_STATE_BYTES + 1);
    await expect(
      store.checkAndSet({ table: 't', key: 'k', expected: null, state: tooBig }),
    ).rejects.toBeInstanceOf(RowTooLargeError);
    await expect(
      store.checkAndSet({ table: 't', key: 'k', expected: null, state: tooBig, notified: true }),
    ).rejects.toBeInstanceOf(RowTooLargeError);
    await expect(
      store.checkAndSetMany([
        { table: 't', key: 'small', expected: null, state: bytes('ok') },
        { table: 't', key: 'k', expected: null, state: tooBig },
      ]),
    ).rejects.toBeInstanceOf(RowTooLargeError);
    expect(sent).toBe(before);
    expect(await store.read('t', 'small')).toBeNull();
    await store.close();
    client.destroy();
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
