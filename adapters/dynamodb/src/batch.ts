import {
  BatchGetItemCommand,
  type BatchGetItemCommandOutput,
  GetItemCommand,
  type GetItemCommandOutput,
  TransactGetItemsCommand,
  type TransactGetItemsCommandOutput,
} from '@aws-sdk/client-dynamodb';
import { type RowRef, type StoredRow, StoreError } from '@percolator/core';
import { classify } from './calls.js';
import type { CasContext } from './cas.js';
import {
  ATTR,
  counterPartition,
  decodeSortKey,
  type Item,
  itemKey,
  rowFromPresentItem,
  rowPartition,
} from './layout.js';
import { deleteNamespaceItems } from './namespaces.js';

/** BatchGetItem takes at most 100 keys. */
const GET_CHUNK = 100;
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

/** TransactGetItems takes at most 100 items: the counter and 99 rows. */
const PEEK_ROWS = 99;

/**
 * `readPeeked`: the counter's value (0 if absent) and the rows in one TransactGetItems,
 * which DynamoDB isolates serializably from every standard write (PutItem, UpdateItem,
 * DeleteItem): it reads as of one point in the order of writes. So if it sees value V, it
 * sees the draw of V (an UpdateItem ADD) and every write acknowledged before it. Writes
 * nothing. Costs twice the read capacity of the same strongly consistent reads.
 *
 * Rows past the first 99 are read after it (BatchGetItem), and so are all of them when
 * DynamoDB refuses the combined read (refusedWhole), as it does when the items come to
 * more than one TransactGetItems answers (4 MB: about 21 rows holding values near the
 * largest): the counter is then read alone (a strongly consistent GetItem). So too when the
 * service cancels it for a conflict (an item of it being written: the counter, which every
 * draw writes, under load), and for a while after (conflictsSeen). A snapshot's reads may come
 * after its timestamp (every later read of a transaction does): a strongly consistent read
 * after the peek sees every write acknowledged before it, so all of V's.
 */
export async function readPeeked(
  ctx: CasContext,
  rows: readonly RowRef[],
  counter: string,
): Promise<{ timestamp: number; rows: (StoredRow | null)[] }> {
  const ids = rows.map((ref) => refId(rowPartition(ctx.namespace, ref.table), ref.key));
  // TransactGetItems rejects two operations on one item.
  const unique = new Map<string, RowRef>();
  rows.forEach((ref, i) => {
    unique.set(ids[i] as string, ref);
  });
  const refs = [...unique.values()];
  let first = refs.slice(0, PEEK_ROWS);
  let peeked: { timestamp: number; items: (Item | undefined)[] };
  const apart = async () => {
    first = [];
    return { timestamp: await counterValue(ctx, counter), items: [] };
  };
  if (conflictsSeen.has(ctx) && performance.now() < conflictsSeen.get(ctx)!) {
    peeked = await apart();
  } else {
    try {
      peeked = await peekWith(ctx, counter, first);
    } catch (error) {
      if (conflicted(error)) {
        // The counter (or a row) was being written as it read: the service cancels a
        // TransactGetItems then, and under load the counter, which every draw writes, is
        // being written most of the time (the transaction's own identity draw beside its
        // peek included). Read apart, and keep to that for a while.
        conflictsSeen.set(ctx, performance.now() + APART_AFTER_CONFLICT_MS);
        peeked = await apart();
      } else {
        if (first.length === 0 || !refusedWhole(error)) throw error;
        peeked = await apart();
      }
    }
  }
  const found = new Map<string, StoredRow>();
  first.forEach((ref, i) => {
    const item = peeked.items[i];
    if (item !== undefined)
      found.set(refId(rowPartition(ctx.namespace, ref.table), ref.key), rowFromPresentItem(item));
  });
  if (refs.length > first.length) {
    const rest = refs.slice(first.length);
    const later = await readMany(ctx, rest);
    rest.forEach((ref, i) => {
      const row = later[i];
      if (row) found.set(refId(rowPartition(ctx.namespace, ref.table), ref.key), row);
    });
  }
  return { timestamp: peeked.timestamp, rows: ids.map((id) => found.get(id) ?? null) };
}

/**
 * Read apart after a TransactGetItems was cancelled for a conflict: the counter with one
 * strongly consistent GetItem, then the rows with BatchGetItem, for this long before the
 * combined read is tried again (per store). Read apart, nothing conflicts: standard reads
 * are never cancelled.
 */
const APART_AFTER_CONFLICT_MS = 1000;
const conflictsSeen = new WeakMap<CasContext, number>();

/** A TransactGetItems the service cancelled because an item was being written (TransactionConflict). */
function conflicted(error: unknown): boolean {
  const cause = (error instanceof StoreError ? error.cause : error) as
    | { name?: string; CancellationReasons?: { Code?: string }[] }
    | undefined;
  if (cause?.name === 'TransactionConflictException') return true;
  return (
    cause?.name === 'TransactionCanceledException' &&
    (cause.CancellationReasons ?? []).some((reason) => reason.Code === 'TransactionConflict')
  );
}

/**
 * The counter's value (0 if absent) by one strongly consistent GetItem: it sees every draw
 * acknowledged before it, and so does a strongly consistent read of the rows after it
 * (every write of every commit at or below the value, or its locks).
 */
async function counterValue(ctx: CasContext, counter: string): Promise<number> {
  const out = await ctx.caller.read<GetItemCommandOutput>(
    'GetItem',
    new GetItemCommand({
      TableName: ctx.tableName,
      Key: itemKey(counterPartition(ctx.namespace), counter),
      ConsistentRead: true,
    }),
  );
  const timestamp = out.Item === undefined ? 0 : Number(out.Item[ATTR.counter]?.N);
  if (!Number.isSafeInteger(timestamp) || timestamp < 0) {
    throw new StoreError(`dynamodb: counter ${JSON.stringify(counter)} holds no safe integer`, 'no');
  }
  return timestamp;
}

/** One TransactGetItems: the counter, then `refs` (at most 99, no two alike), in order. */
async function peekWith(
  ctx: CasContext,
  counter: string,
  refs: readonly RowRef[],
): Promise<{ timestamp: number; items: (Item | undefined)[] }> {
  const out = await ctx.caller.read<TransactGetItemsCommandOutput>(
    'TransactGetItems',
    new TransactGetItemsCommand({
      TransactItems: [
        { Get: { TableName: ctx.tableName, Key: itemKey(counterPartition(ctx.namespace), counter) } },
        ...refs.map((ref) => ({
          Get: { TableName: ctx.tableName, Key: itemKey(rowPartition(ctx.namespace, ref.table), ref.key) },
        })),
      ],
    }),
  );
  const responses = out.Responses ?? [];
  if (responses.length !== refs.length + 1) {
    throw new StoreError('dynamodb: TransactGetItems answered with the wrong number of items', 'no');
  }
  const counterItem = responses[0]?.Item;
  const timestamp = counterItem === undefined ? 0 : Number(counterItem[ATTR.counter]?.N);
  if (!Number.isSafeInteger(timestamp) || timestamp < 0) {
    throw new StoreError(`dynamodb: counter ${JSON.stringify(counter)} holds no safe integer`, 'no');
  }
  return { timestamp, items: responses.slice(1).map((r) => r.Item) };
}

/**
 * DynamoDB refused the TransactGetItems as a whole, for a reason retrying it will not fix:
 * an answer over 4 MB (DynamoDB Local: a ValidationException, "Payload in response is too
 * large"; the service documents the limit, not the error's name), or anything else it
 * rejects outright. Not throttling, a conflict or a lost reply (those fail the read as
 * retryable, as before). Peeking the counter alone and reading the rows after is then
 * always safe: a refusal that is not about the combined read fails those calls too, and
 * reaches the caller from there.
 */
function refusedWhole(error: unknown): boolean {
  return classify(error instanceof StoreError ? error.cause : error) === 'rejected';
}

/** Deletes the namespace's items (namespaces.ts, deleteNamespaceItems). */
export async function dropNamespace(ctx: CasContext): Promise<void> {
  await deleteNamespaceItems(ctx.caller, ctx.tableName, ctx.namespace);
}
