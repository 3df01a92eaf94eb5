import {
  type AttributeValue,
  DeleteItemCommand,
  GetItemCommand,
  type GetItemCommandOutput,
  PutItemCommand,
  TransactWriteItemsCommand,
} from '@aws-sdk/client-dynamodb';
import type { CasRequest, CasResult, StoredRow } from '@percolator/core';
import { type Caller, isConditionFailure } from './calls.js';
import {
  ATTR,
  type Item,
  itemKey,
  newVersion,
  notifyPartition,
  rowFromItem,
  rowPartition,
} from './layout.js';

/**
 * The single-row check-and-set.
 *
 * Each row is one item; the check is a condition on its version attribute `v`
 * (`attribute_not_exists(pk)` for "must be absent"). Every successful write stores a
 * fresh random version, so versions never repeat (see `newVersion`).
 *
 * Notification index: a row whose last write set `notified` carries the attribute `n`,
 * and a separate index item (pk `<ns>#n#<table>`, same sort key) exists for it. Both
 * change together in one TransactWriteItems, so `scanNotified`, a strongly consistent
 * Query of the index items, sees a flag as soon as the CAS that set it has returned.
 * (A sparse GSI would be cheaper but is only eventually consistent, and the contract
 * forbids omitting a flagged row.) Writes that neither set nor clear a flag stay a
 * single conditional PutItem/DeleteItem: their condition also requires `n` to be absent,
 * and only when that part fails do we fall back to the transaction that also deletes
 * the index item.
 */
export interface CasContext {
  readonly caller: Caller;
  readonly tableName: string;
  readonly namespace: string;
}

const NAMES_VERSION = { '#v': ATTR.version };

export async function checkAndSet(ctx: CasContext, request: CasRequest): Promise<CasResult> {
  if (request.state === null) return remove(ctx, request);
  if (request.notified === true) return writeWithIndex(ctx, request, request.state);
  return put(ctx, request, request.state);
}

function rowItem(
  ctx: CasContext,
  request: CasRequest,
  state: Uint8Array,
  version: string,
  notified: boolean,
): Item {
  const item: Item = {
    ...itemKey(rowPartition(ctx.namespace, request.table), request.key),
    [ATTR.version]: { S: version },
    [ATTR.state]: { B: state },
  };
  if (notified) item[ATTR.notified] = { BOOL: true };
  return item;
}

/** The condition "row is at `expected`" (or absent), with its placeholders. */
interface Condition {
  ConditionExpression: string;
  ExpressionAttributeNames: Record<string, string>;
  ExpressionAttributeValues?: Record<string, AttributeValue>;
}

function versionCondition(expected: string | null, requireNoFlag: boolean): Condition {
  if (expected === null) {
    // An absent row has no `n` either.
    return {
      ConditionExpression: 'attribute_not_exists(#pk)',
      ExpressionAttributeNames: { '#pk': ATTR.partition },
    };
  }
  const values: Record<string, AttributeValue> = { ':expected': { S: expected } };
  if (!requireNoFlag) {
    return {
      ConditionExpression: '#v = :expected',
      ExpressionAttributeNames: NAMES_VERSION,
      ExpressionAttributeValues: values,
    };
  }
  return {
    ConditionExpression: '#v = :expected AND attribute_not_exists(#n)',
    ExpressionAttributeNames: { ...NAMES_VERSION, '#n': ATTR.notified },
    ExpressionAttributeValues: values,
  };
}

async function put(ctx: CasContext, request: CasRequest, state: Uint8Array): Promise<CasResult> {
  const version = newVersion();
  try {
    await ctx.caller.write(
      'PutItem',
      new PutItemCommand({
        TableName: ctx.tableName,
        Item: rowItem(ctx, request, state, version, false),
        ...versionCondition(request.expected, true),
        ReturnValuesOnConditionCheckFailure: 'ALL_OLD',
      }),
    );
    return { ok: true, version };
  } catch (error) {
    if (!isConditionFailure(error)) throw error;
    const current = await itemAfterConditionFailure(ctx, request, error);
    // The version matched, so the condition failed on `n`: this write clears a flag.
    if (request.expected !== null && current?.[ATTR.version]?.S === request.expected) {
      return writeWithIndex(ctx, request, state);
    }
    return { ok: false, current: rowFromItem(current) };
  }
}

async function remove(ctx: CasContext, request: CasRequest): Promise<CasResult> {
  if (request.expected === null) {
    // "Delete if absent": nothing to write. A strongly consistent read decides; the
    // returned version is fresh and never stored, so no later CAS can match it.
    const current = await readItem(ctx, request);
    return current === undefined
      ? { ok: true, version: newVersion() }
      : { ok: false, current: rowFromItem(current) };
  }
  try {
    await ctx.caller.write(
      'DeleteItem',
      new DeleteItemCommand({
        TableName: ctx.tableName,
        Key: itemKey(rowPartition(ctx.namespace, request.table), request.key),
        ...versionCondition(request.expected, true),
        ReturnValuesOnConditionCheckFailure: 'ALL_OLD',
      }),
    );
    return { ok: true, version: newVersion() };
  } catch (error) {
    if (!isConditionFailure(error)) throw error;
    const current = await itemAfterConditionFailure(ctx, request, error);
    if (current?.[ATTR.version]?.S === request.expected) return writeWithIndex(ctx, request, null);
    return { ok: false, current: rowFromItem(current) };
  }
}

/**
 * The row write and the index item change in one transaction: set the flag (put the
 * index item) when `notified`, otherwise clear it (delete the index item). `state` null
 * deletes the row. Only the row write is conditional.
 */
async function writeWithIndex(
  ctx: CasContext,
  request: CasRequest,
  state: Uint8Array | null,
): Promise<CasResult> {
  const version = newVersion();
  const notified = state !== null && request.notified === true;
  const rowKey = itemKey(rowPartition(ctx.namespace, request.table), request.key);
  const indexKey = itemKey(notifyPartition(ctx.namespace, request.table), request.key);
  const condition = {
    ...versionCondition(request.expected, false),
    ReturnValuesOnConditionCheckFailure: 'ALL_OLD' as const,
  };
  const rowWrite =
    state === null
      ? { Delete: { TableName: ctx.tableName, Key: rowKey, ...condition } }
      : {
          Put: {
            TableName: ctx.tableName,
            Item: rowItem(ctx, request, state, version, notified),
            ...condition,
          },
        };
  const indexWrite = notified
    ? { Put: { TableName: ctx.tableName, Item: indexKey } }
    : { Delete: { TableName: ctx.tableName, Key: indexKey } };
  try {
    await ctx.caller.write(
      'TransactWriteItems',
      new TransactWriteItemsCommand({ TransactItems: [rowWrite, indexWrite] }),
    );
    return { ok: true, version };
  } catch (error) {
    if (!isConditionFailure(error)) throw error;
    return { ok: false, current: rowFromItem(await itemAfterConditionFailure(ctx, request, error)) };
  }
}

/**
 * The item as it was when the condition failed: DynamoDB returns it with
 * ReturnValuesOnConditionCheckFailure = ALL_OLD. An endpoint that does not support that
 * option returns nothing, which looks like "absent", so then we read it (consistently).
 */
async function itemAfterConditionFailure(
  ctx: CasContext,
  request: CasRequest,
  error: unknown,
): Promise<Item | undefined> {
  const e = error as { Item?: Item; CancellationReasons?: { Item?: Item }[] };
  const returned = e.Item ?? e.CancellationReasons?.[0]?.Item;
  if (returned !== undefined) return returned;
  return readItem(ctx, request);
}

export async function readItem(
  ctx: CasContext,
  ref: { table: string; key: string },
): Promise<Item | undefined> {
  const out = await ctx.caller.read<GetItemCommandOutput>(
    'GetItem',
    new GetItemCommand({
      TableName: ctx.tableName,
      Key: itemKey(rowPartition(ctx.namespace, ref.table), ref.key),
      ConsistentRead: true,
    }),
  );
  return out.Item;
}

export async function readRow(
  ctx: CasContext,
  ref: { table: string; key: string },
): Promise<StoredRow | null> {
  return rowFromItem(await readItem(ctx, ref));
}
