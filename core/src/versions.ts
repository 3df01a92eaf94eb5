import { createHash } from 'node:crypto';
import { MAX_KEY_BYTES, utf8Length } from './names.js';

/**
 * Where an old value lives once it leaves its head row (docs/protocol.md section 2): an
 * immutable version row, one per (cell, startTs), in an internal table beside the user
 * table. Its name and key are derived from the cell and the timestamp alone, so any client
 * can find, create (create-only) or delete it without asking anyone.
 */

/** Table names starting with this are the library's own (version rows, leases). */
export const INTERNAL_TABLE_PREFIX = '__';
const VERSION_PREFIX = '__v.';
const HASHED_VERSION_PREFIX = '__h.';
/** Store table names are at most 64 characters: the longest user name that fits after the prefix. */
const MAX_PLAIN = 64 - VERSION_PREFIX.length;

function sha256(text: string): string {
  return createHash('sha256').update(text).digest('hex');
}

/** The internal table holding the version rows of `table`. */
export function versionTable(table: string): string {
  return table.length <= MAX_PLAIN
    ? `${VERSION_PREFIX}${table}`
    : `${HASHED_VERSION_PREFIX}${sha256(table).slice(0, MAX_PLAIN)}`;
}

/** Whether `table` is a version table (of any user table). */
export function isVersionTable(table: string): boolean {
  return table.startsWith(VERSION_PREFIX) || table.startsWith(HASHED_VERSION_PREFIX);
}

/**
 * The user table a version table belongs to, where the name tells (`__v.` names);
 * `undefined` for a hashed name, which only a list of known tables can answer.
 */
export function baseTableOf(table: string): string | undefined {
  return table.startsWith(VERSION_PREFIX) ? table.slice(VERSION_PREFIX.length) : undefined;
}

/**
 * The key of the version row of (row, column) written at `startTs`: injective
 * (`<ts>.<column length>.<column><row>`: the length says where the column ends), and
 * hashed when that would pass the store's key limit.
 */
export function versionKey(row: string, column: string, startTs: number): string {
  const ts = startTs.toString(36);
  const plain = `${ts}.${column.length.toString(36)}.${column}${row}`;
  if (utf8Length(plain) <= MAX_KEY_BYTES) return plain;
  return `${ts}#${sha256(`${column.length}.${column}${row}`)}`;
}
