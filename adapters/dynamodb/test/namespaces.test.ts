import { DynamoDBClient, GetItemCommand, PutItemCommand } from '@aws-sdk/client-dynamodb';
import { InvalidArgumentError, Percolator } from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { dropDynamoDbNamespace, listDynamoDbNamespaces } from '../src/namespaces.js';
import { uniqueNamespace, useDynamoDb } from './helpers.js';

const dynamo = useDynamoDb();

function adminOptions() {
  const t = dynamo.target();
  return { endpoint: t.endpoint, region: t.region, credentials: t.credentials, tableName: t.tableName };
}

describe('dynamodb namespaces: list and drop', () => {
  it('lists a namespace by item kind, deletes only its layout items, and then it is gone', async () => {
    const ns = uniqueNamespace('ns');
    const store = await dynamo.store({ namespace: ns });
    const db = new Percolator({ store });
    await db.transact(async (tx) => {
      tx.set('accounts', 'alice', 'balance', '10');
      tx.set('audit', 'a1', 'who', 'alice');
    });
    await db.close();

    // An item under the prefix that is not of the layout stays.
    const t = dynamo.target();
    const client = new DynamoDBClient({ endpoint: t.endpoint, region: t.region, credentials: t.credentials });
    const stray = { pk: { S: `${ns}#x#other` }, sk: { B: new TextEncoder().encode('k') } };
    await client.send(new PutItemCommand({ TableName: dynamo.target().tableName, Item: stray }));

    const listed = (await listDynamoDbNamespaces(adminOptions())).find((n) => n.namespace === ns);
    expect(listed?.kinds.rows).toBe(2);
    expect(listed?.kinds.counters).toBeGreaterThanOrEqual(1);
    expect(listed?.items).toBe(listed!.kinds.rows + listed!.kinds.notifyIndex + listed!.kinds.counters);

    expect(await dropDynamoDbNamespace(ns, adminOptions())).toEqual({ namespace: ns, items: listed!.items });
    expect((await listDynamoDbNamespaces(adminOptions())).map((n) => n.namespace)).not.toContain(ns);
    expect(await dropDynamoDbNamespace(ns, adminOptions())).toBeUndefined();
    const left = await client.send(
      new GetItemCommand({ TableName: dynamo.target().tableName, Key: stray, ConsistentRead: true }),
    );
    expect(left.Item).toBeDefined();
    client.destroy();
  });

  it("a store's dropNamespace deletes the same items as dropDynamoDbNamespace, and no stray one", async () => {
    const ns = uniqueNamespace('ns');
    const store = await dynamo.store({ namespace: ns });
    const db = new Percolator({ store });
    await db.transact(async (tx) => tx.set('accounts', 'alice', 'balance', '10'));
    await db.close();
    const t = dynamo.target();
    const client = new DynamoDBClient({ endpoint: t.endpoint, region: t.region, credentials: t.credentials });
    const stray = { pk: { S: `${ns}#x#other` }, sk: { B: new TextEncoder().encode('k') } };
    await client.send(new PutItemCommand({ TableName: t.tableName, Item: stray }));
    await store.dropNamespace();
    expect((await listDynamoDbNamespaces(adminOptions())).map((n) => n.namespace)).not.toContain(ns);
    const left = await client.send(
      new GetItemCommand({ TableName: t.tableName, Key: stray, ConsistentRead: true }),
    );
    expect(left.Item).toBeDefined();
    client.destroy();
  });

  it('rejects names that are not namespaces before sending anything', async () => {
    for (const bad of ['a#r', 'Upper', '', 'a b', `a${'b'.repeat(32)}`]) {
      await expect(
        dropDynamoDbNamespace(bad, { endpoint: 'http://127.0.0.1:1', region: 'us-east-1', tableName: 't' }),
      ).rejects.toBeInstanceOf(InvalidArgumentError);
    }
  });
});
