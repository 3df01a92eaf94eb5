import { type AttributeValue, QueryCommand, type QueryCommandOutput } from '@aws-sdk/client-dynamodb';
import {
  compareKeys,
  type NotificationScanOptions,
  type ScannedStoredRow,
  type ScanOptions,
} from '@percolator/core';
import type { CasContext } from './cas.js';
import {
  ATTR,
  decodeSortKey,
  type Item,
  keyBytes,
  notifyPartition,
  rowFromPresentItem,
  rowPartition,
} from './layout.js';

interface Range {
  readonly lower?: { readonly key: string; readonly inclusive: boolean };
  /** Exclusive. */
  readonly upper?: string;
}

/** Rows of one table with start <= key < end and key > after, in key (= UTF-8 byte) order. */
export async function scanRows(
  ctx: CasContext,
  table: string,
  options: ScanOptions,
): Promise<ScannedStoredRow[]> {
  const range = toRange(options.start, options.after, options.end);
  const items = await queryRange(ctx, rowPartition(ctx.namespace, table), range, options.limit, false);
  return items.map((item) => ({ key: decodeSortKey(item), row: rowFromPresentItem(item) }));
}

/** Keys of rows whose flag is set (their index items), in key order. */
export async function scanNotifiedKeys(
  ctx: CasContext,
  table: string,
  options: NotificationScanOptions,
): Promise<string[]> {
  const range = toRange(undefined, options.after, undefined);
  const items = await queryRange(ctx, notifyPartition(ctx.namespace, table), range, options.limit, true);
  return items.map(decodeSortKey);
}

function toRange(start: string | undefined, after: string | undefined, end: string | undefined): Range {
  let lower: Range['lower'];
  if (start) lower = { key: start, inclusive: true };
  // `after` wins over `start` when it is at or beyond it (then it excludes that key).
  if (after && (lower === undefined || compareKeys(after, lower.key) >= 0))
    lower = { key: after, inclusive: false };
  return end === undefined ? { lower } : { lower, upper: end };
}

/**
 * One key condition on the sort key. DynamoDB allows only one, and BETWEEN is inclusive
 * at both ends, so with two bounds we ask for [lower, upper] and drop the bound keys that
 * must be excluded here.
 */
function keyCondition(partition: string, range: Range) {
  const values: Record<string, AttributeValue> = { ':pk': { S: partition } };
  // Every placeholder given must be used, so `#sk` is added only with a bound (or projection).
  const names: Record<string, string> = { '#pk': ATTR.partition };
  if (range.lower !== undefined || range.upper !== undefined) names['#sk'] = ATTR.sort;
  let expression = '#pk = :pk';
  const { lower, upper } = range;
  if (lower !== undefined && upper !== undefined) {
    expression += ' AND #sk BETWEEN :lo AND :hi';
    values[':lo'] = { B: keyBytes(lower.key) };
    values[':hi'] = { B: keyBytes(upper) };
  } else if (lower !== undefined) {
    expression += lower.inclusive ? ' AND #sk >= :lo' : ' AND #sk > :lo';
    values[':lo'] = { B: keyBytes(lower.key) };
  } else if (upper !== undefined) {
    expression += ' AND #sk < :hi';
    values[':hi'] = { B: keyBytes(upper) };
  }
  return {
    KeyConditionExpression: expression,
    ExpressionAttributeNames: names,
    ExpressionAttributeValues: values,
  };
}

async function queryRange(
  ctx: CasContext,
  partition: string,
  range: Range,
  limit: number,
  keysOnly: boolean,
): Promise<Item[]> {
  const { lower, upper } = range;
  if (limit === 0 || upper === '') return [];
  // An empty or inverted range (BETWEEN would reject an inverted one).
  if (lower !== undefined && upper !== undefined && compareKeys(lower.key, upper) >= 0) return [];
  const condition = keyCondition(partition, range);
  const out: Item[] = [];
  let startKey: Item | undefined;
  do {
    const page = await ctx.caller.read<QueryCommandOutput>(
      'Query',
      new QueryCommand({
        TableName: ctx.tableName,
        ...condition,
        ...(keysOnly
          ? {
              ProjectionExpression: '#sk',
              ExpressionAttributeNames: { ...condition.ExpressionAttributeNames, '#sk': ATTR.sort },
            }
          : {}),
        ConsistentRead: true,
        // Up to two bound keys may be dropped below.
        Limit: Math.min(limit - out.length + 2, 1000),
        ExclusiveStartKey: startKey,
      }),
    );
    for (const item of page.Items ?? []) {
      const key = decodeSortKey(item);
      if (upper !== undefined && key === upper) continue;
      if (lower !== undefined && !lower.inclusive && key === lower.key) continue;
      out.push(item);
      if (out.length === limit) return out;
    }
    startKey = page.LastEvaluatedKey;
  } while (startKey !== undefined);
  return out;
}
