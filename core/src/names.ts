import { allocBytes, copyBytes } from './byte-pool.js';
import { InvalidArgumentError } from './errors.js';

/** Table names: 1-64 characters of [A-Za-z0-9_.-], so every store can use them safely. */
export const TABLE_NAME = /^[A-Za-z0-9_.-]{1,64}$/;
export const MAX_COLUMN_BYTES = 256;
export const MAX_KEY_BYTES = 1024;
export const MAX_VALUE_BYTES = 1024 * 1024;

const encoder = new TextEncoder();

/**
 * A table, row or column name as messages show it: bare when it is plain (letters, digits,
 * `_ . : @ + -`), else as a JSON string, so a key with spaces, quotes, NUL or emoji reads
 * unambiguously. Not `/`: names are joined with it (table/row/column), and row `a/b` with
 * column `c` would read as row `a` with column `b/c` (review). The one rule for the
 * library's messages and the operator CLI's output (core's messages quoted every row key,
 * found by an operator's walkthrough).
 */
export function shownName(text: string): string {
  return /^[\w.:@+-]+$/u.test(text) ? text : JSON.stringify(text);
}

export function utf8Length(text: string): number {
  let bytes = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c < 0x80) bytes += 1;
    else if (c < 0x800) bytes += 2;
    else if (c >= 0xd800 && c <= 0xdbff) {
      bytes += 4;
      i++;
    } else bytes += 3;
  }
  return bytes;
}

export function validateTable(table: unknown): asserts table is string {
  if (typeof table !== 'string' || !TABLE_NAME.test(table)) {
    throw new InvalidArgumentError(
      `table name must be a string of 1-64 characters from [A-Za-z0-9_.-], got ${describe(table)}`,
    );
  }
}

/**
 * A table name a user may read and write: a valid store table name that does not start
 * with "__", which the library keeps for its own tables (version rows, leases).
 */
export function validateUserTable(table: unknown): asserts table is string {
  validateTable(table);
  if (table.startsWith('__')) {
    throw new InvalidArgumentError(
      `table names starting with "__" are reserved for the library's own tables, got ${describe(table)}`,
    );
  }
}

function validateText(
  kind: string,
  value: unknown,
  maxBytes: number,
  allowEmpty: boolean,
): asserts value is string {
  if (typeof value !== 'string')
    throw new InvalidArgumentError(`${kind} must be a string, got ${describe(value)}`);
  if (!allowEmpty && value.length === 0) throw new InvalidArgumentError(`${kind} must not be empty`);
  if (!value.isWellFormed())
    throw new InvalidArgumentError(`${kind} contains a lone surrogate (not valid UTF-8)`);
  // A UTF-16 code unit is at most 3 bytes of UTF-8 (a surrogate pair, two units, is 4), so
  // a short enough text needs no count: every read and write checks its key and column.
  if (value.length * 3 <= maxBytes) return;
  const bytes = utf8Length(value);
  if (bytes > maxBytes) throw new InvalidArgumentError(`${kind} is ${bytes} bytes; the limit is ${maxBytes}`);
}

export function validateColumn(column: unknown): asserts column is string {
  validateText('column name', column, MAX_COLUMN_BYTES, false);
}

export function validateRowKey(key: unknown): asserts key is string {
  validateText('row key', key, MAX_KEY_BYTES, false);
}

export function toValueBytes(value: unknown, maxBytes = MAX_VALUE_BYTES): Uint8Array {
  // A copy either way (the caller may reuse its buffer before the transaction commits),
  // from the byte pool: it lives until the commit copies it into the row.
  if (typeof value === 'string') {
    if (!value.isWellFormed()) throw new InvalidArgumentError('string value contains a lone surrogate');
    const bytes = allocBytes(checkValueSize(utf8Length(value), maxBytes));
    encoder.encodeInto(value, bytes);
    return bytes;
  }
  if (value instanceof Uint8Array) {
    checkValueSize(value.length, maxBytes);
    return copyBytes(value);
  }
  throw new InvalidArgumentError(`value must be a Uint8Array or a string, got ${describe(value)}`);
}

function checkValueSize(length: number, maxBytes: number): number {
  if (length > maxBytes) throw new InvalidArgumentError(`value is ${length} bytes; the limit is ${maxBytes}`);
  return length;
}

/**
 * The one key order of the library: UTF-8 byte order (= Unicode code point order).
 * JavaScript's `<` compares UTF-16 code units, which differs for characters above U+FFFF.
 */
export function compareKeys(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a.charCodeAt(i);
    const y = b.charCodeAt(i);
    if (x === y) continue;
    return codeUnitRank(x) - codeUnitRank(y);
  }
  return a.length - b.length;
}

/** Surrogates (D800-DFFF) encode code points above FFFF, so they rank after E000-FFFF. */
function codeUnitRank(c: number): number {
  if (c >= 0xd800 && c <= 0xdfff) return c + 0x2000;
  if (c >= 0xe000) return c - 0x800;
  return c;
}

export function describe(value: unknown): string {
  if (typeof value === 'string')
    return value.length > 40 ? `a string of ${value.length} characters` : JSON.stringify(value);
  if (value === null) return 'null';
  if (value instanceof Uint8Array) return `a Uint8Array of ${value.length} bytes`;
  return typeof value;
}
