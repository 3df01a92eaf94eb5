/** Helpers shared by the store-contract cases (raw store calls). */
import type { RowStore, StoredRow } from '@percolator/core';
import type { Random } from '../random.js';
import { check, format, sameBytes, show } from '../util.js';
import { oracleFor } from './harness.js';

export const T = 'conf_rows';
export const OTHER = 'conf.other-table_2';
/**
 * States are stored and read back up to this size; a store that declares more is tested
 * at this size and the case says so. It covers every adapter's limit (64 MiB at most).
 */
export const LARGE_CAP = 64 * 1024 * 1024;
/** A past-the-limit state is only built when the limit is at most this (memory bound). */
export const PAST_LIMIT_CAP = 256 * 1024 * 1024;

export async function create(
  store: RowStore,
  table: string,
  key: string,
  state: Uint8Array,
): Promise<string> {
  const r = await store.checkAndSet({ table, key, expected: null, state });
  check(r.ok, `creating (${table}, ${format(key)}) with expected=null failed on an absent row`);
  return r.version;
}

export async function mustRead(store: RowStore, table: string, key: string): Promise<StoredRow> {
  const row = await store.read(table, key);
  check(row !== null, `read(${table}, ${format(key)}) returned null for a row that exists`);
  return row;
}

export async function expectRow(
  store: RowStore,
  table: string,
  key: string,
  version: string,
  state: Uint8Array,
) {
  const row = await mustRead(store, table, key);
  check(row.version === version, () => `read(${format(key)}) version ${row.version}, expected ${version}`);
  check(
    sameBytes(row.state, state),
    () => `read(${format(key)}) state ${show(row.state)}, expected ${show(state)}`,
  );
}

export function checkCurrent(
  current: StoredRow | null | undefined,
  actual: StoredRow | null,
  what: string,
): void {
  if (current === undefined) return; // optional
  if (actual === null) {
    check(current === null, `${what}: failed CAS reported current ${format(current)} but the row is absent`);
    return;
  }
  check(current !== null, `${what}: failed CAS reported the row absent but it exists`);
  check(
    current.version === actual.version,
    `${what}: failed CAS reported version ${current.version}, row has ${actual.version}`,
  );
  check(
    sameBytes(current.state, actual.state),
    `${what}: failed CAS reported a state that differs from the row's`,
  );
}

export function oracleOption(store: RowStore) {
  const oracle = oracleFor(store);
  return oracle ? { oracle } : {};
}

/** Deterministic pseudo-random bytes (fast enough for megabytes). */
export function noise(size: number, random: Random): Uint8Array {
  const out = new Uint8Array(size);
  let x = (random.int(2 ** 31) | 1) >>> 0;
  for (let i = 0; i < size; i++) {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    out[i] = x & 0xff;
  }
  return out;
}

/**
 * Keys that break naive adapters: NUL, emoji, combining marks, quoting, wildcards, and a
 * leading U+FEFF (a TextDecoder built without `ignoreBOM` drops it, and the key read back
 * is another key). Near the front: the readMany and scanNotified cases take the first few.
 */
export const TRICKY_KEYS: readonly string[] = [
  'plain',
  'a',
  'a\u0000',
  '\uFEFFbom',
  '\uFEFF',
  'a\u0000b',
  'a\u0001',
  '\u0000',
  ' ',
  'space in key ',
  '🦄',
  '👩‍👩‍👧‍👦',
  'ключ',
  '中文键',
  'e\u0301',
  '\u00e9',
  "'; DROP TABLE rows; --",
  '%_*?[]{}()^$.|+\\',
  '"quoted"',
  'a/b:c#d',
  'line\nbreak\ttab',
  '\u007f',
  '\u0080',
  '\u07ff',
  '\u0800',
  '\ue000',
  '\ufffd',
  '𐀀',
  '😀',
  // The longest key: 256 four-byte characters = 1024 UTF-8 bytes.
  '😀'.repeat(256),
];

export const ALL_BYTES = Uint8Array.from({ length: 256 }, (_, i) => i);
