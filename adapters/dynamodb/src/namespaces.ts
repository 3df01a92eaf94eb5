import {
  BatchWriteItemCommand,
  type BatchWriteItemCommandOutput,
  ScanCommand,
  type ScanCommandOutput,
  type WriteRequest,
} from '@aws-sdk/client-dynamodb';
import { checkOptionKeys, type OptionKeys } from '@percolator/core';
import { validateNamespace } from '@percolator/core/kit';
import { Caller, DEFAULT_RETRY } from './calls.js';
import { type ClientOptions, resolveClient } from './client.js';
import { ATTR, counterPartition, type Item, notifyPartition, rowPartition } from './layout.js';
import { DynamoDbTableNotFoundError, describeTable, validateDynamoTableName } from './table.js';

/*
 * Listing and dropping namespaces, for operators (the conformance CLI's `namespaces` and
 * `drop-namespace`). layout.ts puts a namespace's items under partition keys
 * `<ns>#r#<table>` (rows), `<ns>#n#<table>` (notification index) and `<ns>#c` (counters).
 * Listing Scans the table (partition keys only) and groups the items of that shape by
 * namespace; dropping Scans for that namespace's shapes and deletes what it finds. The
 * namespace (validated) is only ever a bound expression value.
 */

const LAYOUT = /^([a-z][a-z0-9_]{0,31})#(?:(r|n)#|(c)$)/;

export interface DynamoDbNamespace {
  readonly namespace: string;
  /** Items of the namespace, all kinds. */
  readonly items: number;
  /** Items by kind: rows, notification index entries, counters. */
  readonly kinds: { rows: number; notifyIndex: number; counters: number };
}

export interface DynamoDbNamespaceOptions extends ClientOptions {
  /** The DynamoDB table holding the namespaces. */
  readonly tableName: string;
}

const OPTION_KEYS: OptionKeys<DynamoDbNamespaceOptions> = {
  client: true,
  endpoint: true,
  region: true,
  credentials: true,
  requestTimeoutMs: true,
  tableName: true,
};

const WRITE_CHUNK = 25;

async function withCaller<T>(
  options: DynamoDbNamespaceOptions,
  work: (caller: Caller) => Promise<T>,
): Promise<T> {
  checkOptionKeys('dynamodb namespaces', options, OPTION_KEYS);
  validateDynamoTableName(options.tableName);
  const { tableName: _table, ...clientOptions } = options;
  const { client, owned, deadlineMs, untilHandler } = await resolveClient(clientOptions);
  try {
    return await work(new Caller(client, DEFAULT_RETRY, deadlineMs, untilHandler));
  } finally {
    if (owned) client.destroy();
  }
}

/** Pages of a consistent Scan, partition and sort keys only. */
async function scanKeys(
  caller: Caller,
  tableName: string,
  filter: Pick<ScanCommand['input'], 'FilterExpression' | 'ExpressionAttributeValues'>,
  onPage: (items: Item[]) => Promise<void>,
): Promise<void> {
  let startKey: Item | undefined;
  do {
    const page = await caller.maintenance<ScanCommandOutput>(
      'Scan',
      new ScanCommand({
        TableName: tableName,
        ProjectionExpression: '#pk, #sk',
        ExpressionAttributeNames: { '#pk': ATTR.partition, '#sk': ATTR.sort },
        ConsistentRead: true,
        ExclusiveStartKey: startKey,
        ...filter,
      }),
    );
    await onPage((page.Items ?? []) as Item[]);
    startKey = page.LastEvaluatedKey;
  } while (startKey !== undefined);
}

/** DynamoDbTableNotFoundError if the table is not there (a scan of it would fail with ResourceNotFoundException). */
async function tableThere(caller: Caller, tableName: string): Promise<void> {
  if ((await describeTable(caller, tableName)) === null)
    throw new DynamoDbTableNotFoundError(tableName, 'no namespace can be in it');
}

/** The namespaces in the table, by name. Reads the whole table (keys only). */
export async function listDynamoDbNamespaces(
  options: DynamoDbNamespaceOptions,
): Promise<DynamoDbNamespace[]> {
  return withCaller(options, async (caller) => {
    const found = new Map<string, { r: number; n: number; c: number }>();
    await tableThere(caller, options.tableName);
    await scanKeys(caller, options.tableName, {}, async (items) => {
      for (const item of items) {
        const match = LAYOUT.exec(item[ATTR.partition]?.S ?? '');
        if (match === null) continue;
        const namespace = match[1]!;
        const kind = (match[2] ?? match[3]) as 'r' | 'n' | 'c';
        let counts = found.get(namespace);
        if (counts === undefined) found.set(namespace, (counts = { r: 0, n: 0, c: 0 }));
        counts[kind]++;
      }
    });
    return [...found]
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([namespace, c]) => ({
        namespace,
        items: c.r + c.n + c.c,
        kinds: { rows: c.r, notifyIndex: c.n, counters: c.c },
      }));
  });
}

/**
 * Drops one namespace: deletes every item of its layout. Resolves to the number of items
 * it deleted, or `undefined` when the namespace had none (nothing is dropped).
 */
export async function dropDynamoDbNamespace(
  namespace: string,
  options: DynamoDbNamespaceOptions,
): Promise<{ namespace: string; items: number } | undefined> {
  validateNamespace(namespace);
  return withCaller(options, async (caller) => {
    await tableThere(caller, options.tableName);
    const deleted = await deleteNamespaceItems(caller, options.tableName, namespace);
    return deleted === 0 ? undefined : { namespace, items: deleted };
  });
}

/**
 * Deletes every item of the namespace: its rows, notification index entries and counters,
 * and nothing else (another item whose partition key merely starts with "<ns>#" stays).
 * The one deletion both `dropDynamoDbNamespace` and a store's `dropNamespace` run. Returns
 * how many items it deleted.
 */
export async function deleteNamespaceItems(
  caller: Caller,
  tableName: string,
  namespace: string,
): Promise<number> {
  let deleted = 0;
  await scanKeys(
    caller,
    tableName,
    {
      FilterExpression: 'begins_with(#pk, :rows) OR begins_with(#pk, :notify) OR #pk = :counters',
      ExpressionAttributeValues: {
        // rowPartition(ns, '') is "<ns>#r#": the prefix of every table's rows.
        ':rows': { S: rowPartition(namespace, '') },
        ':notify': { S: notifyPartition(namespace, '') },
        ':counters': { S: counterPartition(namespace) },
      },
    },
    async (items) => {
      const deletes: WriteRequest[] = items.map((item) => ({
        DeleteRequest: { Key: { [ATTR.partition]: item[ATTR.partition]!, [ATTR.sort]: item[ATTR.sort]! } },
      }));
      for (let i = 0; i < deletes.length; i += WRITE_CHUNK) {
        await writeChunk(caller, tableName, deletes.slice(i, i + WRITE_CHUNK));
      }
      deleted += deletes.length;
    },
  );
  return deleted;
}

/** Deletes are idempotent, so resending them (and UnprocessedItems) is always safe. */
export async function writeChunk(caller: Caller, tableName: string, requests: WriteRequest[]): Promise<void> {
  await caller.untilProcessed('BatchWriteItem', requests, async (pending) => {
    const out = await caller.maintenance<BatchWriteItemCommandOutput>(
      'BatchWriteItem',
      new BatchWriteItemCommand({ RequestItems: { [tableName]: pending } }),
    );
    return out.UnprocessedItems?.[tableName] ?? [];
  });
}
