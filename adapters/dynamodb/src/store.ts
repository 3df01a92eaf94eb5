import {
  type DynamoDBClient,
  UpdateItemCommand,
  type UpdateItemCommandOutput,
} from '@aws-sdk/client-dynamodb';
// The RowStore contract's own types: every store (and the contract check) names the same
// list, by necessity; `duplicates` pairs these import lists.
import {
  type CasRequest,
  type CasResult,
  ClosedError,
  checkedStore,
  InvalidArgumentError,
  type NotificationScanOptions,
  type RowRef,
  type RowStore,
  type ScannedStoredRow,
  type ScanOptions,
  type StoreCapabilities,
  type StoredRow,
  StoreError,
} from '@percolator/core';
import { validateNamespace } from '@percolator/core/kit';
import { dropNamespace, readMany, readPeeked } from './batch.js';
import { Caller, DEFAULT_RETRY, type RetryPolicy } from './calls.js';
import { type CasContext, checkAndSet, readRow } from './cas.js';
import { type ClientOptions, resolveClient } from './client.js';
import { ATTR, counterPartition, itemKey, MAX_STATE_BYTES } from './layout.js';
import { checkOptionKeys, type OptionKeys } from './options.js';
import { scanNotifiedKeys, scanRows } from './scan.js';
import { ensureTable, validateDynamoTableName } from './table.js';

export interface DynamoDbStoreOptions extends ClientOptions {
  /** The DynamoDB table holding every namespace (key schema: pk S HASH, sk B RANGE). */
  readonly tableName: string;
  /** Separates stores sharing one DynamoDB table. /^[a-z][a-z0-9_]{0,31}$/, default "percolator". */
  readonly namespace?: string;
  /** Create the table (on-demand billing) if it is missing, and wait until it is ACTIVE. */
  readonly createTable?: boolean;
  /** How long to wait for the table to become ACTIVE. Default 5 minutes. */
  readonly tableWaitTimeoutMs?: number;
  /** Backoff for throttled and transient calls (see README: writes are retried only when surely not applied). */
  readonly retry?: Partial<RetryPolicy>;
}

/**
 * The store: a RowStore whose optional methods (all implemented here) are not optional,
 * plus `dropNamespace`.
 */
export type DynamoDbRowStore = RowStore &
  Required<Pick<RowStore, 'readMany' | 'checkAndSetMany' | 'scan' | 'incrementCounter' | 'scanNotified'>> & {
    readonly tableName: string;
    readonly namespace: string;
    /** Deletes every item of this namespace: rows, notification index entries, counters. */
    dropNamespace(): Promise<void>;
  };

export const DYNAMODB_CAPABILITIES: StoreCapabilities = Object.freeze({
  batchRead: true,
  // DynamoDB has no batch of independent conditional writes (TransactWriteItems is
  // all-or-nothing), so `checkAndSetMany` sends parallel PutItems: not one round trip.
  batchCheckAndSet: false,
  orderedScan: true,
  atomicCounter: true,
  notificationIndex: true,
  stampedCheckAndSet: false,
  // TransactGetItems reads the oracle's counter and the rows as one serializable snapshot.
  peekedRead: true,
  maxStateBytes: MAX_STATE_BYTES,
});

const OPTION_KEYS: OptionKeys<DynamoDbStoreOptions> = {
  client: true,
  endpoint: true,
  region: true,
  credentials: true,
  requestTimeoutMs: true,
  tableName: true,
  namespace: true,
  createTable: true,
  tableWaitTimeoutMs: true,
  retry: true,
};

const RETRY_KEYS: OptionKeys<RetryPolicy> = { maxAttempts: true, baseDelayMs: true, maxDelayMs: true };

export async function createDynamoDbStore(options: DynamoDbStoreOptions): Promise<DynamoDbRowStore> {
  if (options === undefined) {
    throw new InvalidArgumentError('createDynamoDbStore needs options: at least { tableName }');
  }
  checkOptionKeys('createDynamoDbStore', options, OPTION_KEYS);
  if (options.retry !== undefined) checkOptionKeys('createDynamoDbStore retry', options.retry, RETRY_KEYS);
  const namespace = validateNamespace(options.namespace);
  validateDynamoTableName(options.tableName);
  const policy = resolveRetry(options.retry);
  // 'true' (from an environment variable, say) was taken as false.
  if (options.createTable !== undefined && typeof options.createTable !== 'boolean')
    throw new InvalidArgumentError(
      `createDynamoDbStore: createTable must be a boolean, got ${typeof options.createTable}`,
    );
  const waitMs = options.tableWaitTimeoutMs ?? 5 * 60_000;
  if (!Number.isInteger(waitMs) || waitMs < 0)
    throw new InvalidArgumentError('tableWaitTimeoutMs must be >= 0');
  const { client, owned, deadlineMs, untilHandler } = await resolveClient(options);
  const caller = new Caller(client, policy, deadlineMs, untilHandler);
  try {
    await ensureTable(caller, options.tableName, options.createTable === true, waitMs);
  } catch (error) {
    if (owned) client.destroy();
    throw error;
  }
  return checkedStore<DynamoDbRowStore>(
    new DynamoDbStore(client, owned, { caller, tableName: options.tableName, namespace }),
  );
}

function resolveRetry(retry: Partial<RetryPolicy> | undefined): RetryPolicy {
  const policy = { ...DEFAULT_RETRY, ...retry };
  for (const [name, value] of Object.entries(policy)) {
    if (!Number.isInteger(value) || value < (name === 'maxAttempts' ? 1 : 0)) {
      throw new InvalidArgumentError(
        `retry.${name} must be a ${name === 'maxAttempts' ? 'positive' : 'non-negative'} integer`,
      );
    }
  }
  return policy;
}

class DynamoDbStore implements DynamoDbRowStore {
  readonly name = 'dynamodb';
  readonly capabilities = DYNAMODB_CAPABILITIES;
  readonly tableName: string;
  readonly namespace: string;
  private closed = false;

  constructor(
    private readonly client: DynamoDBClient,
    private readonly ownsClient: boolean,
    private readonly ctx: CasContext,
  ) {
    this.tableName = ctx.tableName;
    this.namespace = ctx.namespace;
  }

  private open(): CasContext {
    if (this.closed) throw new ClosedError('the DynamoDB store is closed');
    return this.ctx;
  }

  async read(table: string, key: string): Promise<StoredRow | null> {
    const ctx = this.open();
    return readRow(ctx, { table, key });
  }

  async checkAndSet(request: CasRequest): Promise<CasResult> {
    const ctx = this.open();
    return checkAndSet(ctx, request);
  }

  async readMany(rows: readonly RowRef[]): Promise<(StoredRow | null)[]> {
    const ctx = this.open();
    return readMany(ctx, rows);
  }

  /**
   * Independent CAS of many rows, sent in parallel (DynamoDB has no batched conditional
   * write); each applies or not on its own. If any call fails, an error is thrown after
   * all have settled: StoreError 'unknown' when any request applied or may have applied
   * (the batch as a whole is then neither done nor undone), else the first failure.
   */
  async checkAndSetMany(requests: readonly CasRequest[]): Promise<CasResult[]> {
    const ctx = this.open();
    const settled = await Promise.allSettled(requests.map((request) => checkAndSet(ctx, request)));
    const failures = settled.flatMap((s) => (s.status === 'rejected' ? [s.reason as unknown] : []));
    if (failures.length > 0) {
      const unknown = failures.find((e) => !(e instanceof StoreError) || e.applied === 'unknown');
      if (unknown !== undefined) throw unknown;
      const applied = settled.filter((s) => s.status === 'fulfilled' && s.value.ok).length;
      if (applied === 0) throw failures[0];
      const first = failures[0] as StoreError;
      throw new StoreError(
        `${first.message} (${applied} other requests of this batch were applied)`,
        'unknown',
        { cause: first },
      );
    }
    return settled.map((s) => (s as PromiseFulfilledResult<CasResult>).value);
  }

  async scan(table: string, options: ScanOptions): Promise<ScannedStoredRow[]> {
    const ctx = this.open();
    return scanRows(ctx, table, options);
  }

  async scanNotified(table: string, options: NotificationScanOptions): Promise<string[]> {
    const ctx = this.open();
    return scanNotifiedKeys(ctx, table, options);
  }

  /** One TransactGetItems (batch.ts): the counter's value and the rows as one snapshot. */
  async readPeeked(
    rows: readonly RowRef[],
    counter: string,
  ): Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }> {
    const ctx = this.open();
    return readPeeked(ctx, rows, counter);
  }

  /** UpdateItem ADD is atomic; not idempotent, so a lost reply is an unknown outcome. */
  async incrementCounter(name: string, delta: number): Promise<number> {
    const ctx = this.open();
    const out = await ctx.caller.write<UpdateItemCommandOutput>(
      'UpdateItem',
      new UpdateItemCommand({
        TableName: ctx.tableName,
        Key: itemKey(counterPartition(ctx.namespace), name),
        UpdateExpression: 'ADD #c :delta',
        ExpressionAttributeNames: { '#c': ATTR.counter },
        ExpressionAttributeValues: { ':delta': { N: String(delta) } },
        ReturnValues: 'UPDATED_NEW',
      }),
    );
    const value = Number(out.Attributes?.[ATTR.counter]?.N);
    if (!Number.isSafeInteger(value)) {
      // Not retryable (as on Redis): a counter past 2^53 stays past it; a retry only adds.
      throw new StoreError(
        `counter ${JSON.stringify(name)} is not a safe integer after the increment`,
        'unknown',
        { retryable: false },
      );
    }
    return value;
  }

  async dropNamespace(): Promise<void> {
    await dropNamespace(this.open());
  }

  /** Destroys the client only if this store created it. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.ownsClient) this.client.destroy();
  }
}
