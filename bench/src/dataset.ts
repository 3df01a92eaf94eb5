import type { LogicalTable } from './engines/engine.js';

/**
 * The data every engine of a backend holds: `records` YCSB-style rows in `kv` and
 * `accounts` balances in `acct`. A value is an integer, a colon, and padding up to the
 * configured size, so every mode moves the same number of bytes.
 */
export interface DatasetShape {
  readonly records: number;
  readonly accounts: number;
  readonly valueBytes: number;
}

export const INITIAL_BALANCE = 1000;

export function recordKey(i: number): string {
  return `user${String(i).padStart(7, '0')}`;
}

export function accountKey(i: number): string {
  return `acct${String(i).padStart(7, '0')}`;
}

export function keyOf(table: LogicalTable, i: number): string {
  return table === 'kv' ? recordKey(i) : accountKey(i);
}

export function encodeValue(n: number, size: number): string {
  const head = `${n}:`;
  return head.length >= size ? head : head + 'x'.repeat(size - head.length);
}

/** The integer of a value, or undefined if it is not one of ours (a wrong read). */
export function decodeValue(value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const colon = value.indexOf(':');
  if (colon <= 0) return undefined;
  const head = value.slice(0, colon);
  if (!/^-?\d+$/.test(head)) return undefined;
  const n = Number(head);
  return Number.isSafeInteger(n) ? n : undefined;
}

export function initialRows(table: LogicalTable, shape: DatasetShape): [string, string][] {
  const count = table === 'kv' ? shape.records : shape.accounts;
  // A record's value starts at its own number, so a read that returns another row's value
  // shows (ledger.ts, the read check); every account starts with the same balance.
  const start = (i: number) => (table === 'kv' ? i : INITIAL_BALANCE);
  return Array.from({ length: count }, (_, i) => [keyOf(table, i), encodeValue(start(i), shape.valueBytes)]);
}
