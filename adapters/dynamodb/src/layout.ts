import { randomBytes } from 'node:crypto';
import type { AttributeValue } from '@aws-sdk/client-dynamodb';
import type { StoredRow, Version } from '@percolator/core';

/**
 * How rows map to DynamoDB items. One DynamoDB table holds every namespace; all items of
 * a namespace have a partition key starting with `<namespace>#` (namespaces are
 * [a-z0-9_] and table names [A-Za-z0-9_.-], so `#` cannot occur inside either part).
 *
 *   row          pk = `<ns>#r#<table>`  sk = UTF-8 bytes of the row key   v, s, [n]
 *   notify index pk = `<ns>#n#<table>`  sk = UTF-8 bytes of the row key   (no other attributes)
 *   counter      pk = `<ns>#c`          sk = UTF-8 bytes of the name      c
 *
 * One partition key per (namespace, table) keeps a table's rows in one item collection,
 * so a Query returns them in sort-key order. DynamoDB compares binary sort keys as
 * unsigned bytes, which for UTF-8 is exactly `compareKeys` order.
 */
export const ATTR = {
  partition: 'pk',
  sort: 'sk',
  version: 'v',
  state: 's',
  /** Present only while the row's last write set `notified`; an index item exists then. */
  notified: 'n',
  counter: 'c',
} as const;

export type Item = Record<string, AttributeValue>;
export type ItemKey = { pk: AttributeValue; sk: AttributeValue };

const encoder = new TextEncoder();
const decoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

export function rowPartition(namespace: string, table: string): string {
  return `${namespace}#r#${table}`;
}

export function notifyPartition(namespace: string, table: string): string {
  return `${namespace}#n#${table}`;
}

export function counterPartition(namespace: string): string {
  return `${namespace}#c`;
}

export function keyBytes(key: string): Uint8Array {
  return encoder.encode(key);
}

export function itemKey(partition: string, key: string): ItemKey {
  return { pk: { S: partition }, sk: { B: keyBytes(key) } };
}

export function decodeSortKey(item: Item): string {
  const bytes = item[ATTR.sort]?.B;
  if (bytes === undefined) throw new Error('DynamoDB item without a binary sort key');
  return decoder.decode(bytes);
}

/**
 * A fresh version token: 128 random bits. Tokens are never derived from the previous
 * version (no counter), so a row that is deleted and created again can never get a
 * version it had before, and a stale CAS holding an old token cannot succeed (ABA).
 */
export function newVersion(): Version {
  return randomBytes(16).toString('base64url');
}

export function rowFromItem(item: Item | undefined): StoredRow | null {
  return item === undefined ? null : rowFromPresentItem(item);
}

export function rowFromPresentItem(item: Item): StoredRow {
  const version = item[ATTR.version]?.S;
  if (version === undefined) throw new Error('DynamoDB row item without a version attribute');
  return { version, state: item[ATTR.state]?.B ?? new Uint8Array(0) };
}

/** DynamoDB's item size limit: 400 KB, counting attribute names and values. */
export const DYNAMODB_ITEM_LIMIT = 400 * 1024;

/**
 * The largest state we accept. A row item's overhead beside the state is at most about
 * 1.2 KB: `pk` (2 + 32-byte namespace + 3 + 64-byte table), `sk` (2 + 1024-byte key),
 * `v` (1 + 22), `s` (1), `n` (1 + 1). We reserve 4 KB, so an item at this limit is
 * always accepted by DynamoDB.
 */
export const MAX_STATE_BYTES = DYNAMODB_ITEM_LIMIT - 4 * 1024;
