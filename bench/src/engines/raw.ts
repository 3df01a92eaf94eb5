import { ORACLE_COUNTER, StoreError } from '@percolator/core';
import type { CountingStore } from '../counting-store.js';
import {
  type Engine,
  type KvTx,
  type LogicalTable,
  nativeKey,
  TxFailure,
  type TxHints,
  type TxOutcome,
} from './engine.js';

/** The store table raw rows live in (their state is just the value's UTF-8 bytes). */
export const RAW_TABLE = 'bench_raw';
const LOAD_PARALLEL = 16;
const SCAN_PAGE = 500;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** Collects the single row a raw "transaction" reads and/or writes. */
class RawTx implements KvTx {
  key: string | undefined;
  readVersion: string | null | undefined;
  pending: string | undefined;

  constructor(private readonly store: CountingStore) {}

  private use(table: LogicalTable, keys: readonly string[]): string {
    const key = keys.length === 1 ? nativeKey(table, keys[0]!) : undefined;
    if (key === undefined || (this.key !== undefined && this.key !== key)) {
      throw new Error('raw mode runs single-row operations only');
    }
    this.key = key;
    return key;
  }

  async read(table: LogicalTable, keys: readonly string[]): Promise<(string | undefined)[]> {
    const row = await this.store.read(RAW_TABLE, this.use(table, keys));
    this.readVersion = row?.version ?? null;
    return [row ? decoder.decode(row.state) : undefined];
  }

  write(table: LogicalTable, entries: ReadonlyArray<readonly [string, string]>): void {
    this.use(
      table,
      entries.map(([key]) => key),
    );
    this.pending = entries[0]![1];
  }
}

/**
 * The baseline the paper compares against: plain single-row reads and check-and-set
 * writes through the adapter, on the same store, with no transaction protocol. A write
 * uses the version this engine last saw for the row (one CAS when nobody else wrote it),
 * like an application that caches versions; a lost race retries with the current one.
 */
export class RawEngine implements Engine {
  readonly mode = 'raw';
  readonly variant = 'cas';
  readonly maxRowsPerTxn = 1;
  readonly singleRowOnly = true;
  readonly dataKey: string;
  private readonly versions = new Map<string, string | null>();

  constructor(
    readonly store: CountingStore,
    private readonly maxAttempts: number,
  ) {
    this.dataKey = `raw:${store.name}`;
  }

  async transact<T>(fn: (tx: KvTx) => Promise<T>, _hints?: TxHints): Promise<TxOutcome<T>> {
    for (let attempts = 1; ; attempts++) {
      const tx = new RawTx(this.store);
      let value: T;
      try {
        value = await fn(tx);
        if (tx.pending === undefined || tx.key === undefined) return { value, attempts };
        if (await this.cas(tx.key, tx.pending, tx.readVersion)) return { value, attempts };
      } catch (error) {
        if (error instanceof StoreError && error.applied === 'unknown')
          throw new TxFailure('unknown', attempts, error);
        throw new TxFailure('error', attempts, error);
      }
      if (attempts >= this.maxAttempts)
        throw new TxFailure('gave-up', attempts, new Error('CAS kept losing'));
    }
  }

  /** One CAS; false if the row had changed (the caller runs the operation again). */
  private async cas(key: string, value: string, readVersion: string | null | undefined): Promise<boolean> {
    let expected = readVersion !== undefined ? readVersion : this.versions.get(key);
    if (expected === undefined) expected = (await this.store.read(RAW_TABLE, key))?.version ?? null;
    const result = await this.store.checkAndSet({
      table: RAW_TABLE,
      key,
      expected,
      state: encoder.encode(value),
    });
    if (result.ok) {
      this.versions.set(key, result.version);
      return true;
    }
    if (result.current !== undefined) this.versions.set(key, result.current?.version ?? null);
    else this.versions.delete(key);
    return false;
  }

  nextTimestamp(): Promise<number> {
    // No batching: one counter increment per timestamp, the oracle's unbatched baseline.
    return this.store.incrementCounter!(ORACLE_COUNTER, 1);
  }

  async load(table: LogicalTable, entries: ReadonlyArray<readonly [string, string]>): Promise<void> {
    let next = 0;
    const loader = async () => {
      while (next < entries.length) {
        const [key, value] = entries[next++]!;
        const rawKey = nativeKey(table, key);
        const result = await this.store.checkAndSet({
          table: RAW_TABLE,
          key: rawKey,
          expected: null,
          state: encoder.encode(value),
        });
        if (!result.ok) throw new Error(`raw row ${rawKey} already exists`);
        this.versions.set(rawKey, result.version);
      }
    };
    await Promise.all(Array.from({ length: LOAD_PARALLEL }, loader));
  }

  async snapshot(table: LogicalTable): Promise<Map<string, string>> {
    const out = new Map<string, string>();
    const prefix = nativeKey(table, '');
    let after: string | undefined;
    for (;;) {
      // '/' + 1 = '0': the end bound just past every key with this prefix.
      const page = await this.store.scan!(RAW_TABLE, {
        start: prefix,
        end: `${table}0`,
        after,
        limit: SCAN_PAGE,
      });
      for (const { key, row } of page) out.set(key.slice(prefix.length), decoder.decode(row.state));
      if (page.length < SCAN_PAGE) return out;
      after = page[page.length - 1]!.key;
    }
  }

  counters() {
    const total = this.store.total;
    return { roundTrips: total, commands: total, io: this.store.io };
  }

  async close(): Promise<void> {}
}
