import {
  CreateTableCommand,
  type CreateTableCommandOutput,
  DescribeTableCommand,
  type DescribeTableCommandOutput,
  type TableDescription,
} from '@aws-sdk/client-dynamodb';
import { InvalidArgumentError, StoreError } from '@percolator/core';
import { sleep } from '@percolator/core/kit';
import { type Caller, errorName } from './calls.js';
import { ATTR } from './layout.js';

/** DynamoDB's own table-name rule. */
const DYNAMODB_TABLE_NAME = /^[A-Za-z0-9_.-]{3,255}$/;

export function validateDynamoTableName(name: unknown): asserts name is string {
  if (typeof name !== 'string' || !DYNAMODB_TABLE_NAME.test(name)) {
    throw new InvalidArgumentError(
      `tableName must be 3-255 characters from [A-Za-z0-9_.-], got ${JSON.stringify(name)}`,
    );
  }
}

/**
 * The table is not there, and the store was not asked to create it. An InvalidArgumentError
 * (the options name a table that does not exist), with the table's name; the operator CLI
 * reports it as not found (exit 4), like a SQL namespace that is not there.
 */
export class DynamoDbTableNotFoundError extends InvalidArgumentError {
  override readonly name = 'DynamoDbTableNotFoundError';
  constructor(
    readonly tableName: string,
    hint = 'pass createTable: true to create it',
  ) {
    super(`DynamoDB table ${tableName} does not exist (${hint})`);
  }
}

/**
 * Makes sure the DynamoDB table exists with our key schema and is ACTIVE. With `create`,
 * creates it (on-demand billing) if missing; a concurrent creator is fine
 * (ResourceInUseException), so this is idempotent.
 */
export async function ensureTable(
  caller: Caller,
  tableName: string,
  create: boolean,
  timeoutMs: number,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let description = await describeTable(caller, tableName);
  if (description === null) {
    if (!create) throw new DynamoDbTableNotFoundError(tableName);
    await createTable(caller, tableName);
    description = await describeTable(caller, tableName);
  }
  // UPDATING (a change of billing, capacity or indexes) takes reads and writes as ACTIVE
  // does: a store starting meanwhile waited out the whole change, and then failed.
  while (description?.TableStatus !== 'ACTIVE' && description?.TableStatus !== 'UPDATING') {
    if (Date.now() > deadline) {
      throw new StoreError(
        `DynamoDB table ${tableName} is ${description?.TableStatus ?? 'missing'}, not ACTIVE, after ${timeoutMs} ms`,
        'no',
      );
    }
    await sleep(500);
    description = await describeTable(caller, tableName);
    // Missing again (a create whose lost reply hid that it never landed, or a table that
    // was being deleted when we looked): create it again; ResourceInUse means it is there.
    if (description === null && create) await createTable(caller, tableName);
  }
  checkKeySchema(tableName, description);
  checkSingleRegion(tableName, description);
}

/**
 * A global table (replicas in other regions) checks a condition and adds to a counter in
 * each region apart, and replicates by last writer wins: two clients in two regions could
 * both apply a check-and-set on one version (a lost update) and draw the same timestamp.
 * Refused, rather than losing data in a way no test on one region shows (found in review).
 */
function checkSingleRegion(tableName: string, table: TableDescription): void {
  if ((table.Replicas?.length ?? 0) === 0 && table.GlobalTableVersion === undefined) return;
  throw new InvalidArgumentError(
    `DynamoDB table ${tableName} is a global table (replicated to ${
      table.Replicas?.map((r) => r.RegionName).join(', ') || 'other regions'
    }): its conditional writes and counters hold in each region apart, which cannot keep snapshot isolation; use a table in one region`,
  );
}

export async function describeTable(caller: Caller, tableName: string): Promise<TableDescription | null> {
  try {
    const out = await caller.maintenance<DescribeTableCommandOutput>(
      'DescribeTable',
      new DescribeTableCommand({ TableName: tableName }),
    );
    return out.Table ?? null;
  } catch (error) {
    if (error instanceof StoreError && errorName(error.cause) === 'ResourceNotFoundException') return null;
    throw error;
  }
}

async function createTable(caller: Caller, tableName: string): Promise<void> {
  try {
    // A maintenance call: retried on a transient failure (a resend of a create that landed
    // is ResourceInUseException, below).
    await caller.maintenance<CreateTableCommandOutput>(
      'CreateTable',
      new CreateTableCommand({
        TableName: tableName,
        BillingMode: 'PAY_PER_REQUEST',
        AttributeDefinitions: [
          { AttributeName: ATTR.partition, AttributeType: 'S' },
          { AttributeName: ATTR.sort, AttributeType: 'B' },
        ],
        KeySchema: [
          { AttributeName: ATTR.partition, KeyType: 'HASH' },
          { AttributeName: ATTR.sort, KeyType: 'RANGE' },
        ],
      }),
    );
  } catch (error) {
    // Someone else created it first; or our reply was lost after it was created.
    if (error instanceof StoreError && errorName(error.cause) === 'ResourceInUseException') return;
    throw error;
  }
}

function checkKeySchema(tableName: string, table: TableDescription): void {
  const types = new Map(table.AttributeDefinitions?.map((d) => [d.AttributeName, d.AttributeType]));
  const keys = new Map(table.KeySchema?.map((k) => [k.KeyType, k.AttributeName]));
  const ok =
    keys.size === 2 &&
    keys.get('HASH') === ATTR.partition &&
    keys.get('RANGE') === ATTR.sort &&
    types.get(ATTR.partition) === 'S' &&
    types.get(ATTR.sort) === 'B';
  if (!ok) {
    throw new InvalidArgumentError(
      `DynamoDB table ${tableName} has the wrong key schema: expected ${ATTR.partition} (S, HASH) and ${ATTR.sort} (B, RANGE)`,
    );
  }
}
