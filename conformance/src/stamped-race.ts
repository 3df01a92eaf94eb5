/**
 * The race that proves a stamp and its write are one atomic step (store.ts,
 * `checkAndSetStamped` and `readStamped`): stamped writers (creates, then updates, of
 * rows of their own) race readers that draw a counter value and then read every row. A
 * reader whose value is above a write's stamp must see that write (or a later one of the
 * row). Used by the conformance suite for every store that declares the capability, and by
 * adapter tests to show the check fails for a step that is not atomic.
 */
import { type CasRequest, type CasResult, type RowRef, STAMP_OFFSET, type StoredRow } from '@percolator/core';

export type StampedWrite = (
  request: CasRequest & { readonly state: Uint8Array },
  counter: string,
) => Promise<CasResult & { timestamp?: number }>;

/** Draws a counter value, then reads `rows` (in request order). */
export type DrawThenRead = (
  rows: readonly RowRef[],
  counter: string,
) => Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }>;

export interface StampedRaceOptions {
  readonly write: StampedWrite;
  readonly read: DrawThenRead;
  readonly counter?: string;
  readonly table?: string;
  /** Rows written (default 60), each `rounds` times (default 4). */
  readonly rows?: number;
  readonly rounds?: number;
  /** Concurrent writers and readers (default 5 each). */
  readonly writers?: number;
  readonly readers?: number;
  /**
   * The reads peek (`readPeeked`): they return the counter's value without drawing, so a
   * read must see every write whose stamp is at or below its value (not only below), and
   * reads may share values.
   */
  readonly peeked?: boolean;
}

export interface StampedRaceResult {
  /** Reads that break the rule: above a write's stamp, yet the row read missing or older. */
  readonly violations: string[];
  readonly writes: number;
  readonly reads: number;
  /** Reads whose value was below the last stamp: they raced the writes (the check means something). */
  readonly readsDuringWrites: number;
  /** Values handed out twice (by two reads, or by a read and a write): must be 0. */
  readonly repeatedValues: number;
}

/** A state with the stamp slot (placeholder bytes) and a tail naming the write. */
export function stampTemplate(tail: string): Uint8Array {
  const text = new TextEncoder().encode(tail);
  const out = new Uint8Array(STAMP_OFFSET + 8 + text.length).fill(0xee, STAMP_OFFSET, STAMP_OFFSET + 8);
  out.set(text, STAMP_OFFSET + 8);
  return out;
}

/** The stamp in a stored state. */
export function stampOf(state: Uint8Array): number {
  return Number(new DataView(state.buffer, state.byteOffset, state.byteLength).getBigUint64(STAMP_OFFSET));
}

export async function stampedRace(options: StampedRaceOptions): Promise<StampedRaceResult> {
  const counter = options.counter ?? 'race.counter';
  const table = options.table ?? 'race';
  const rounds = options.rounds ?? 4;
  const keys = Array.from({ length: options.rows ?? 60 }, (_, i) => `r${i}`);
  const refs = keys.map((key) => ({ table, key }));
  const writers = options.writers ?? 5;
  const writes: { key: string; ts: number }[] = [];
  const samples: { timestamp: number; stamps: (number | null)[] }[] = [];
  let writing = true;

  // Each writer holds its last write until some read has come back, so at least one read
  // draws its timestamp below the last stamp, however fast the writes are on this store.
  let readBack!: () => void;
  let readFailed!: (error: unknown) => void;
  const firstRead = new Promise<void>((resolve, reject) => {
    readBack = resolve;
    readFailed = reject;
  });
  firstRead.catch(() => undefined);
  const writer = async (mine: string[]) => {
    for (const [k, key] of mine.entries()) {
      let expected: string | null = null;
      for (let round = 0; round < rounds; round++) {
        if (k === mine.length - 1 && round === rounds - 1) await firstRead;
        const r = await options.write(
          { table, key, expected, state: stampTemplate(`${key}.${round}`) },
          counter,
        );
        if (!r.ok || r.timestamp === undefined) {
          throw new Error(`stamped write of ${key} round ${round} did not apply: ${JSON.stringify(r)}`);
        }
        writes.push({ key, ts: r.timestamp });
        expected = r.version;
      }
    }
  };
  const reader = async () => {
    try {
      while (writing) {
        const { timestamp, rows } = await options.read(refs, counter);
        samples.push({ timestamp, stamps: rows.map((row) => (row === null ? null : stampOf(row.state))) });
        readBack();
      }
    } catch (error) {
      readFailed(error);
      throw error;
    }
  };
  const running = Array.from({ length: writers }, (_, w) => writer(keys.filter((_, i) => i % writers === w)));
  const reading = Array.from({ length: options.readers ?? 5 }, () => reader());
  await Promise.all(running).finally(() => {
    writing = false;
  });
  await Promise.all(reading);

  const peeked = options.peeked === true;
  const lastStamp = Math.max(...writes.map((w) => w.ts));
  // Peeks share values by design; draws and stamps never do.
  const all = [...(peeked ? [] : samples.map((x) => x.timestamp)), ...writes.map((w) => w.ts)];
  const violations: string[] = [];
  const index = new Map(keys.map((key, i) => [key, i]));
  for (const { timestamp, stamps } of samples) {
    for (const { key, ts } of writes) {
      if (peeked ? timestamp < ts : timestamp <= ts) continue;
      const seen = stamps[index.get(key)!]!;
      if (seen === null || seen < ts) {
        violations.push(
          `${peeked ? 'peeked' : 'drew'} ${timestamp} ${peeked ? '>=' : '>'} stamp ${ts} of ${key}, then read ${seen ?? 'nothing'}`,
        );
      }
    }
  }
  return {
    violations,
    writes: writes.length,
    reads: samples.length,
    readsDuringWrites: samples.filter((x) => x.timestamp < lastStamp).length,
    repeatedValues: all.length - new Set(all).size,
  };
}

/** `read` for stores without stampedRead: draw with `incrementCounter`, then `readMany` (or `read`s). */
export function drawThenReadMany(store: {
  incrementCounter?(name: string, delta: number): Promise<number>;
  readMany?(rows: readonly RowRef[]): Promise<(StoredRow | null)[]>;
  read(table: string, key: string): Promise<StoredRow | null>;
}): DrawThenRead {
  return async (rows, counter) => {
    const timestamp = await store.incrementCounter!(counter, 1);
    const found = store.readMany
      ? await store.readMany(rows)
      : await Promise.all(rows.map((r) => store.read(r.table, r.key)));
    return { timestamp, rows: found };
  };
}

/**
 * `write` for a peeked race on any store with a counter: a plain CAS, then, once it is
 * acknowledged, a draw from the counter; the value drawn stands for its stamp. (A peek that
 * returns at least that value must see the write.)
 */
export function writeThenDraw(store: {
  checkAndSet(request: CasRequest): Promise<CasResult>;
  incrementCounter?(name: string, delta: number): Promise<number>;
}): StampedWrite {
  return async (request, counter) => {
    const result = await store.checkAndSet(request);
    if (!result.ok) return result;
    // The stamp slot holds the drawn value, as a stamped CAS would have written it.
    const timestamp = await store.incrementCounter!(counter, 1);
    const state = Uint8Array.from(request.state);
    new DataView(state.buffer).setBigUint64(STAMP_OFFSET, BigInt(timestamp));
    const again = await store.checkAndSet({ ...request, expected: result.version, state });
    if (!again.ok) return again;
    return { ...again, timestamp };
  };
}

/** A stamped CAS that must have applied: its version and timestamp (throws otherwise). */
export function appliedStamp(result: CasResult & { timestamp?: number }): {
  version: string;
  timestamp: number;
} {
  if (!result.ok || result.timestamp === undefined) {
    throw new Error(`expected the stamped CAS to apply: ${JSON.stringify(result)}`);
  }
  return { version: result.version, timestamp: result.timestamp };
}

/** The error a promise rejects with (undefined if it resolves). */
export function errorOf(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    () => undefined,
    (e: unknown) => e,
  );
}
