import {
  BatchGetItemCommand,
  type BatchGetItemCommandOutput,
  ScanCommand,
  type ScanCommandOutput,
  type WriteRequest,
} from '@aws-sdk/client-dynamodb';
import type { RowRef, StoredRow } from '@percolator/core';
import type { CasContext } from './cas.js';
import {
  ATTR,
  decodeSortKey,
  type Item,
  itemKey,
  namespacePrefix,
  rowFromPresentItem,
  rowPartition,
} from './layout.js';
import { writeChunk } from './namespaces.js';

/** BatchGetItem takes at most 100 keys, BatchWriteItem at most 25 requests. */
const GET_CHUNK = 100;
const WRITE_CHUNK = 25;
/** Chunks in flight at once (the machine running DynamoDB Local may be small). */
const PARALLEL_CHUNKS = 4;

/** `pk` + NUL + key: table names and namespaces never contain NUL, so this is unambiguous. */
function refId(partition: string, key: string): string {
  return `${partition}\u0000${key}`;
}

/** Strongly consistent reads of many rows; results in request order. */
export async function readMany(ctx: CasContext, rows: readonly RowRef[]): Promise<(StoredRow | null)[]> {
  const ids = rows.map((ref) => refId(rowPartition(ctx.namespace, ref.table), ref.key));
  // BatchGetItem rejects duplicate keys in one request.
  const unique = new Map<string, RowRef>();
  rows.forEach((ref, i) => {
    unique.set(ids[i] as string, ref);
  });
  const refs = [...unique.values()];
  const found = new Map<string, StoredRow>();
  const chunks: RowRef[][] = [];
  for (let i = 0; i < refs.length; i += GET_CHUNK) chunks.push(refs.slice(i, i + GET_CHUNK));
  for (let i = 0; i < chunks.length; i += PARALLEL_CHUNKS) {
    await Promise.all(chunks.slice(i, i + PARALLEL_CHUNKS).map((chunk) => getChunk(ctx, chunk, found)));
  }
  return ids.map((id) => found.get(id) ?? null);
}

/**
 * One BatchGetItem of up to 100 keys, resending UnprocessedKeys (throttling, or the
 * 16 MB reply limit) with backoff: a partial success, so not a retry of a failure.
 */
async function getChunk(
  ctx: CasContext,
  refs: readonly RowRef[],
  found: Map<string, StoredRow>,
): Promise<void> {
  const keys: Item[] = refs.map((ref) => itemKey(rowPartition(ctx.namespace, ref.table), ref.key));
  await ctx.caller.untilProcessed('BatchGetItem', keys, async (pending) => {
    const out = await ctx.caller.read<BatchGetItemCommandOutput>(
      'BatchGetItem',
      new BatchGetItemCommand({ RequestItems: { [ctx.tableName]: { Keys: pending, ConsistentRead: true } } }),
    );
    for (const item of out.Responses?.[ctx.tableName] ?? []) {
      found.set(refId(item[ATTR.partition]?.S ?? '', decodeSortKey(item)), rowFromPresentItem(item));
    }
    return out.UnprocessedKeys?.[ctx.tableName]?.Keys ?? [];
  });
}

/** Deletes every item whose partition key belongs to the namespace (Scan + BatchWriteItem). */
export async function dropNamespace(ctx: CasContext): Promise<void> {
  let startKey: Item | undefined;
  do {
    const page = await ctx.caller.maintenance<ScanCommandOutput>(
      'Scan',
      new ScanCommand({
        TableName: ctx.tableName,
        FilterExpression: 'begins_with(#pk, :prefix)',
        ProjectionExpression: '#pk, #sk',
        ExpressionAttributeNames: { '#pk': ATTR.partition, '#sk': ATTR.sort },
        ExpressionAttributeValues: { ':prefix': { S: namespacePrefix(ctx.namespace) } },
        ConsistentRead: true,
        ExclusiveStartKey: startKey,
      }),
    );
    const deletes: WriteRequest[] = (page.Items ?? []).map((item) => ({
      DeleteRequest: {
        Key: { [ATTR.partition]: item[ATTR.partition], [ATTR.sort]: item[ATTR.sort] } as Item,
      },
    }));
    for (let i = 0; i < deletes.length; i += WRITE_CHUNK) {
      await writeChunk(ctx.caller, ctx.tableName, deletes.slice(i, i + WRITE_CHUNK));
    }
    startKey = page.LastEvaluatedKey;
  } while (startKey !== undefined);
}
