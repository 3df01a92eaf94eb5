import { trackCall } from '../critical-path.js';
import { loadDriver } from '../drivers.js';
import {
  CallCounter,
  type Engine,
  type KvTx,
  type LogicalTable,
  nativeKey,
  type ReadOptions,
  retryTransaction,
  sleep,
  type TxHints,
  type TxOutcome,
} from './engine.js';

type AttributeValue = { S?: string; N?: string };
type Item = Record<string, AttributeValue>;

/** The part of @aws-sdk/client-dynamodb the bench uses (loaded through the adapter). */
interface DynamoSdk {
  DynamoDBClient: new (config: Record<string, unknown>) => DynamoClient;
  CreateTableCommand: CommandClass;
  DescribeTableCommand: CommandClass;
  DeleteTableCommand: CommandClass;
  BatchWriteItemCommand: CommandClass;
  TransactGetItemsCommand: CommandClass;
  BatchGetItemCommand: CommandClass;
  TransactWriteItemsCommand: CommandClass;
  ScanCommand: CommandClass;
}
type CommandClass = new (input: Record<string, unknown>) => object;
interface DynamoClient {
  // biome-ignore lint/suspicious/noExplicitAny: the SDK's outputs are typed loosely here on purpose
  send(command: object): Promise<any>;
  destroy(): void;
}

export interface DynamoTarget {
  readonly endpoint: string;
  readonly region: string;
  readonly credentials?: { readonly accessKeyId: string; readonly secretAccessKey: string };
}

const TABLE_NAME = /^[a-z][a-z0-9_]{2,63}$/;
/** DynamoDB transactions hold at most 100 items. */
export const DYNAMODB_TRANSACTION_LIMIT = 100;

function isRetryable(error: unknown): boolean {
  const name = (error as { name?: unknown } | null)?.name;
  return (
    name === 'TransactionCanceledException' ||
    name === 'TransactionConflictException' ||
    name === 'ThrottlingException' ||
    name === 'ProvisionedThroughputExceededException' ||
    name === 'RequestLimitExceeded'
  );
}

class DynamoTx implements KvTx {
  /** Version attribute of every row read (the write condition). */
  readonly versions = new Map<string, string>();
  readonly writes = new Map<string, { table: LogicalTable; value: string }>();

  constructor(
    private readonly engine: DynamoNativeEngine,
    private readonly counter: CallCounter,
  ) {}

  async read(
    table: LogicalTable,
    keys: readonly string[],
    options?: ReadOptions,
  ): Promise<(string | undefined)[]> {
    if (keys.length > DYNAMODB_TRANSACTION_LIMIT)
      throw new Error('more than 100 items in one DynamoDB transaction');
    // Rows the transaction will write are checked again by the conditions of its
    // TransactWriteItems, and one item is one snapshot: a consistent BatchGetItem does, as an
    // application would send it. Only several rows read and not written need a
    // TransactGetItems, so that they are read as one snapshot.
    if (options?.forUpdate === true || keys.length === 1) return this.readConsistent(table, keys);
    const { sdk, client, tableName } = this.engine;
    this.counter.add(1);
    const out = await trackCall(() =>
      client.send(
        new sdk.TransactGetItemsCommand({
          TransactItems: keys.map((k) => ({
            Get: { TableName: tableName, Key: { pk: { S: nativeKey(table, k) } } },
          })),
        }),
      ),
    );
    return keys.map((k, i) => {
      const item: Item | undefined = out.Responses?.[i]?.Item;
      if (item?.ver?.N !== undefined) this.versions.set(nativeKey(table, k), item.ver.N);
      return item?.v?.S;
    });
  }

  private async readConsistent(
    table: LogicalTable,
    keys: readonly string[],
  ): Promise<(string | undefined)[]> {
    const { sdk, client, tableName } = this.engine;
    const found = new Map<string, Item>();
    let pending: Record<string, unknown>[] = [...new Set(keys)].map((k) => ({
      pk: { S: nativeKey(table, k) },
    }));
    while (pending.length > 0) {
      this.counter.add(1);
      const request = { [tableName]: { Keys: pending, ConsistentRead: true } };
      const out = (await trackCall(() =>
        client.send(new sdk.BatchGetItemCommand({ RequestItems: request })),
      )) as {
        Responses?: Record<string, Item[]>;
        UnprocessedKeys?: Record<string, { Keys?: Record<string, unknown>[] }>;
      };
      for (const item of out.Responses?.[tableName] ?? [])
        if (item.pk?.S !== undefined) found.set(item.pk.S, item);
      pending = out.UnprocessedKeys?.[tableName]?.Keys ?? [];
    }
    return keys.map((k) => {
      const item = found.get(nativeKey(table, k));
      if (item?.ver?.N !== undefined) this.versions.set(nativeKey(table, k), item.ver.N);
      return item?.v?.S;
    });
  }

  write(table: LogicalTable, entries: ReadonlyArray<readonly [string, string]>): void {
    for (const [k, value] of entries) this.writes.set(nativeKey(table, k), { table, value });
  }

  /** One TransactWriteItems: writes conditioned on the versions read, read-only rows checked. */
  async commit(): Promise<void> {
    if (this.writes.size === 0) return;
    const { sdk, client, tableName } = this.engine;
    const items: Record<string, unknown>[] = [];
    for (const [pk, { table, value }] of this.writes) {
      const ver = this.versions.get(pk);
      items.push({
        Update: {
          TableName: tableName,
          Key: { pk: { S: pk } },
          UpdateExpression: 'SET v = :v, tbl = :t ADD ver :one',
          ...(ver === undefined ? {} : { ConditionExpression: 'ver = :ver' }),
          ExpressionAttributeValues: {
            ':v': { S: value },
            ':t': { S: table },
            ':one': { N: '1' },
            ...(ver === undefined ? {} : { ':ver': { N: ver } }),
          },
        },
      });
    }
    for (const [pk, ver] of this.versions) {
      if (this.writes.has(pk)) continue;
      items.push({
        ConditionCheck: {
          TableName: tableName,
          Key: { pk: { S: pk } },
          ConditionExpression: 'ver = :ver',
          ExpressionAttributeValues: { ':ver': { N: ver } },
        },
      });
    }
    if (items.length > DYNAMODB_TRANSACTION_LIMIT)
      throw new Error('more than 100 items in one DynamoDB transaction');
    this.counter.add(1);
    await trackCall(() => client.send(new sdk.TransactWriteItemsCommand({ TransactItems: items })));
  }
}

/**
 * DynamoDB's own transactions: TransactGetItems for the reads, TransactWriteItems for
 * the writes, each write conditioned on the version attribute it read (optimistic
 * concurrency, the documented pattern); a cancelled transaction runs the function again.
 * Limited to 100 items per transaction.
 */
export class DynamoNativeEngine implements Engine {
  readonly mode = 'native';
  readonly variant = 'transact-items';
  readonly maxRowsPerTxn = DYNAMODB_TRANSACTION_LIMIT;
  readonly singleRowOnly = false;
  readonly dataKey: string;
  private readonly counter = new CallCounter();

  private constructor(
    readonly sdk: DynamoSdk,
    readonly client: DynamoClient,
    readonly tableName: string,
    private readonly maxAttempts: number,
  ) {
    this.dataKey = `native:dynamodb:${tableName}`;
  }

  /** Creates the table `tableName` (on-demand) and waits until it is ACTIVE. */
  static async create(
    target: DynamoTarget,
    tableName: string,
    maxAttempts: number,
  ): Promise<DynamoNativeEngine> {
    if (!TABLE_NAME.test(tableName)) throw new Error(`bad table name ${tableName}`);
    const sdk = loadDriver<DynamoSdk>('dynamodb', '@aws-sdk/client-dynamodb');
    const client = new sdk.DynamoDBClient({
      endpoint: target.endpoint,
      region: target.region,
      ...(target.credentials ? { credentials: { ...target.credentials } } : {}),
      // Our own retries, so every request is counted.
      maxAttempts: 1,
    });
    const engine = new DynamoNativeEngine(sdk, client, tableName, maxAttempts);
    try {
      await client.send(
        new sdk.CreateTableCommand({
          TableName: tableName,
          AttributeDefinitions: [{ AttributeName: 'pk', AttributeType: 'S' }],
          KeySchema: [{ AttributeName: 'pk', KeyType: 'HASH' }],
          BillingMode: 'PAY_PER_REQUEST',
        }),
      );
      for (let i = 0; ; i++) {
        const out = await client.send(new sdk.DescribeTableCommand({ TableName: tableName }));
        if (out.Table?.TableStatus === 'ACTIVE') break;
        if (i > 600) throw new Error(`table ${tableName} did not become ACTIVE`);
        await sleep(500);
      }
    } catch (error) {
      client.destroy();
      throw error;
    }
    return engine;
  }

  async transact<T>(fn: (tx: KvTx) => Promise<T>, _hints?: TxHints): Promise<TxOutcome<T>> {
    return retryTransaction(this.maxAttempts, isRetryable, async () => {
      const tx = new DynamoTx(this, this.counter);
      const value = await fn(tx);
      await tx.commit();
      return value;
    });
  }

  async load(table: LogicalTable, entries: ReadonlyArray<readonly [string, string]>): Promise<void> {
    const batches: Item[][] = [];
    for (let i = 0; i < entries.length; i += 25) {
      batches.push(
        entries.slice(i, i + 25).map(([k, v]) => ({
          pk: { S: nativeKey(table, k) },
          tbl: { S: table },
          v: { S: v },
          ver: { N: '1' },
        })),
      );
    }
    let next = 0;
    const loader = async () => {
      while (next < batches.length) {
        let requests = batches[next++]!.map((Item) => ({ PutRequest: { Item } }));
        for (let attempt = 0; requests.length > 0; attempt++) {
          if (attempt > 20) throw new Error('BatchWriteItem kept leaving items unprocessed');
          if (attempt > 0) await sleep(Math.min(1000, 20 * 2 ** attempt));
          const out = await this.client.send(
            new this.sdk.BatchWriteItemCommand({ RequestItems: { [this.tableName]: requests } }),
          );
          requests = out.UnprocessedItems?.[this.tableName] ?? [];
        }
      }
    };
    await Promise.all(Array.from({ length: 8 }, loader));
  }

  async snapshot(table: LogicalTable): Promise<Map<string, string>> {
    const out = new Map<string, string>();
    const strip = nativeKey(table, '').length;
    let start: Item | undefined;
    do {
      const page = await this.client.send(
        new this.sdk.ScanCommand({
          TableName: this.tableName,
          ConsistentRead: true,
          FilterExpression: 'tbl = :t',
          ExpressionAttributeValues: { ':t': { S: table } },
          ...(start ? { ExclusiveStartKey: start } : {}),
        }),
      );
      for (const item of (page.Items ?? []) as Item[]) out.set(item.pk!.S!.slice(strip), item.v?.S ?? '');
      start = page.LastEvaluatedKey;
    } while (start);
    return out;
  }

  counters() {
    return { roundTrips: this.counter.roundTrips, commands: this.counter.commands };
  }

  /** Deletes the table and closes the client. */
  async close(): Promise<void> {
    try {
      await this.client.send(new this.sdk.DeleteTableCommand({ TableName: this.tableName }));
    } finally {
      this.client.destroy();
    }
  }
}
