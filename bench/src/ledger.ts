import { decodeValue } from './dataset.js';
import type { CheckOutcome } from './types.js';

/**
 * What the clients know they did in one cell, so the data afterwards can be checked:
 * committed increments per key, values committed by blind writes, keys whose last
 * transaction had an unknown outcome, reads that returned something that is not ours,
 * and timestamps handed out.
 */
export class Ledger {
  readonly deltas = new Map<string, number>();
  /**
   * Per key, the committed blind writes that may still be the row's last: each with when
   * its transaction was invoked and when it completed (performance.now()). A write invoked
   * after another completed comes after it in every store (its commit follows the other's),
   * so that other cannot be the last and is dropped: what is left are the latest writes and
   * those concurrent with them, a handful.
   */
  readonly written = new Map<string, { value: string; invoke: number; complete: number }[]>();
  /** Committed blind writes in all. */
  writes = 0;
  readonly uncertain = new Set<string>();
  /**
   * A single-row leg of a raw transfer ended with an unknown outcome: the total may be off
   * by its amount, so it cannot be checked exactly (an atomic transfer's unknown outcome
   * moves both rows or neither, and leaves the total as it was).
   */
  unbalanced = false;
  readonly badReads: string[] = [];
  reads = 0;
  /** For a read-only cell: the value each key read gave first (later reads must agree). */
  readonly readValues = new Map<string, string>();
  readonly timestamps: number[][];

  constructor(workers: number) {
    this.timestamps = Array.from({ length: workers }, () => []);
  }

  addDelta(key: string, delta: number): void {
    this.deltas.set(key, (this.deltas.get(key) ?? 0) + delta);
  }

  addWrite(key: string, value: string, invoke: number, complete: number): void {
    this.writes++;
    const latest = this.written.get(key)?.filter((w) => w.complete >= invoke) ?? [];
    latest.push({ value, invoke, complete });
    this.written.set(key, latest);
  }

  markUncertain(keys: readonly string[]): void {
    for (const key of keys) this.uncertain.add(key);
  }

  /**
   * In a cell where nothing writes: every read of `key` must give the same value, and the
   * check compares it with the row as it was before the cell (each row's value is its own,
   * dataset.ts, so a read of another row, or of nothing, shows).
   */
  noteUnchanging(key: string, value: string | undefined): void {
    if (value === undefined) return; // observeRead noted it
    const first = this.readValues.get(key);
    if (first === undefined) this.readValues.set(key, value);
    else if (first !== value && this.badReads.length < 20) {
      this.badReads.push(
        `${key} read as ${JSON.stringify(value.slice(0, 40))} after ${JSON.stringify(first.slice(0, 40))}`,
      );
    }
  }

  /** Records one read value; returns its integer, or undefined (and notes it) if it is not valid. */
  observeRead(key: string, value: string | undefined): number | undefined {
    this.reads++;
    const n = decodeValue(value);
    if (n === undefined && this.badReads.length < 20) {
      this.badReads.push(`${key} = ${value === undefined ? 'missing' : JSON.stringify(value.slice(0, 40))}`);
    }
    return n;
  }
}

export type CheckKind = 'reads' | 'deltas' | 'transfer' | 'blind' | 'timestamps';

const ok = (detail: string): CheckOutcome => ({ ok: true, detail });
const fail = (detail: string): CheckOutcome => ({ ok: false, detail });

/** A read that returned nothing or a value no client wrote: the transaction fails loudly. */
export class BadReadError extends Error {
  constructor(key: string) {
    super(`read of ${key} returned a missing or malformed value`);
    this.name = 'BadReadError';
  }
}

/**
 * Checks one cell. `before`/`after` are full snapshots of the table the workload wrote,
 * taken while nothing ran.
 */
export function verify(
  kind: CheckKind,
  ledger: Ledger,
  committed: number,
  before?: ReadonlyMap<string, string>,
  after?: ReadonlyMap<string, string>,
): CheckOutcome {
  if (ledger.badReads.length > 0) return fail(`bad reads: ${ledger.badReads.slice(0, 3).join('; ')}`);
  if (committed === 0) return fail('no transaction committed');
  switch (kind) {
    case 'reads':
      return verifyReads(ledger, before!);
    case 'timestamps':
      return verifyTimestamps(ledger);
    case 'blind':
      return verifyBlindWrites(ledger, before!, after!);
    case 'deltas':
    case 'transfer':
      return verifyDeltas(kind, ledger, before!, after!);
  }
}

function sameKeys(
  before: ReadonlyMap<string, string>,
  after: ReadonlyMap<string, string>,
): string | undefined {
  if (before.size !== after.size) return `row count changed from ${before.size} to ${after.size}`;
  for (const key of before.keys()) if (!after.has(key)) return `row ${key} disappeared`;
  return undefined;
}

function verifyDeltas(
  kind: 'deltas' | 'transfer',
  ledger: Ledger,
  before: ReadonlyMap<string, string>,
  after: ReadonlyMap<string, string>,
): CheckOutcome {
  const shape = sameKeys(before, after);
  if (shape) return fail(shape);
  const wrong: string[] = [];
  let sumBefore = 0;
  let sumAfter = 0;
  let committedDelta = 0;
  for (const [key, value] of before) {
    const was = decodeValue(value);
    const now = decodeValue(after.get(key));
    if (was === undefined || now === undefined) return fail(`row ${key} holds a malformed value`);
    const delta = ledger.deltas.get(key) ?? 0;
    sumBefore += was;
    sumAfter += now;
    committedDelta += delta;
    if (!ledger.uncertain.has(key) && now !== was + delta && wrong.length < 3) {
      wrong.push(`${key}: expected ${was} + ${delta} = ${was + delta}, found ${now}`);
    }
  }
  // A transfer's committed deltas sum to 0, except where one single-row leg of a raw
  // transfer committed and the other gave up: then the total moved by that leg, and no
  // money was created or lost.
  if (kind === 'transfer' && !ledger.unbalanced && sumAfter !== sumBefore + committedDelta) {
    return fail(
      committedDelta === 0
        ? `total balance changed from ${sumBefore} to ${sumAfter} (money was created or lost)`
        : `total balance is ${sumAfter}, expected ${sumBefore} + ${committedDelta} (the committed legs of transfers whose other leg gave up)`,
    );
  }
  if (wrong.length > 0) return fail(`lost or phantom updates: ${wrong.join('; ')}`);
  if (kind === 'deltas' && ledger.uncertain.size === 0 && sumAfter !== sumBefore + committedDelta) {
    return fail(`sum is ${sumAfter}, expected ${sumBefore} + ${committedDelta}`);
  }
  const what =
    kind !== 'transfer'
      ? ''
      : sumAfter === sumBefore
        ? `total ${sumAfter} unchanged, `
        : ledger.unbalanced
          ? `total ${sumAfter} not checked (a single-row leg's outcome is unknown), `
          : `total ${sumAfter} = ${sumBefore} + ${committedDelta} from legs whose other leg gave up, `;
  return ok(
    `${what}${before.size} rows match ${committedDelta === 0 ? 'the' : committedDelta} committed changes`,
  );
}

function verifyReads(ledger: Ledger, before: ReadonlyMap<string, string>): CheckOutcome {
  for (const [key, value] of ledger.readValues) {
    const was = before.get(key);
    if (value !== was) {
      return fail(
        `${key} read as ${JSON.stringify(value.slice(0, 30))}, but the row holds ${was === undefined ? 'nothing' : JSON.stringify(was.slice(0, 30))}`,
      );
    }
  }
  return ok(`${ledger.reads} reads each returned its row's value (${ledger.readValues.size} rows read)`);
}

function verifyBlindWrites(
  ledger: Ledger,
  before: ReadonlyMap<string, string>,
  after: ReadonlyMap<string, string>,
): CheckOutcome {
  const shape = sameKeys(before, after);
  if (shape) return fail(shape);
  for (const [key, was] of before) {
    if (ledger.uncertain.has(key)) continue;
    const now = after.get(key)!;
    const latest = ledger.written.get(key);
    if (latest ? !latest.some((w) => w.value === now) : now !== was) {
      return fail(
        `${key} holds ${JSON.stringify(now.slice(0, 30))}, which no committed write left there${latest ? ' last (a committed write that began after it had completed, or none)' : ''}`,
      );
    }
  }
  return ok(
    `every row holds the value of its last committed write (or of one concurrent with it), or its first one if none was (${ledger.writes} writes to ${ledger.written.size} rows)`,
  );
}

function verifyTimestamps(ledger: Ledger): CheckOutcome {
  const all: number[] = [];
  for (const [worker, list] of ledger.timestamps.entries()) {
    for (let i = 1; i < list.length; i++) {
      if (!(list[i]! > list[i - 1]!)) {
        return fail(`worker ${worker} got timestamp ${list[i]} after ${list[i - 1]}: not increasing`);
      }
    }
    for (const ts of list) all.push(ts);
  }
  all.sort((a, b) => a - b);
  for (let i = 1; i < all.length; i++) {
    if (all[i] === all[i - 1]) return fail(`timestamp ${all[i]} was handed out twice`);
  }
  return ok(`${all.length} timestamps, all distinct and increasing per client`);
}
