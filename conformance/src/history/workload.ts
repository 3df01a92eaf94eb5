/**
 * A randomised concurrent list-append workload (Elle's), run through Percolator clients on
 * one store. Each list is one cell holding a JSON array; an append reads the list and
 * writes it back one longer, and records that read too. Every attempt is one history
 * entry: committed (ok), certainly not committed (fail), or unknown (info), with when it
 * was invoked and completed (performance.now(), one clock for every client of the run).
 */
import { ClientCrash, type Percolator, type Transaction } from '@percolator/core';
import { type CrashPlans, type StopPoint, stopOutcome } from '../crash.js';
import type { Random } from '../random.js';
import type { ListAppendMop, ListAppendOp } from './checker.js';

export const LIST_TABLES = ['h_lists', 'h_lists_2'] as const;
export const LIST_COLUMN = 'list';

export interface ListAppendWorkload {
  /** Clients to spread the workers over (several clients on the same store). */
  readonly clients: readonly Percolator[];
  /** Concurrent workers, each running transactions one after another. */
  readonly workers: number;
  /** Transaction attempts in total. */
  readonly transactions: number;
  /** Distinct lists; few, so transactions contend. */
  readonly keys: number;
  /** Operations per transaction: 1..maxOps. */
  readonly maxOps: number;
  readonly random: Random;
  /** The first value appended (default 1); values are unique within a history. */
  readonly firstValue?: number;
  /**
   * Called before each commit with the number of rows the transaction writes; returning a
   * step makes that client stop (ClientCrash) at the step. The attempt is recorded with the
   * outcome the step makes certain (stopOutcome): fail before the primary's commit, ok
   * (reads kept) from it on.
   */
  readonly crashAt?: (random: Random, writtenRows: number) => StopPoint | undefined;
  /** Told where a client stopped, e.g. to move a fake clock past the lock TTL. */
  readonly onCrash?: (point: StopPoint) => void;
  /** Sorts an error into fail/info; throws on errors the workload should not see. */
  readonly outcomeOf: (error: unknown) => 'fail' | 'info';
  /** Awaited before each transaction starts (a rate limit, e.g. the soak's). */
  readonly pace?: () => Promise<void>;
  /** Told each history entry as it is recorded (live counts, e.g. the soak's throughput). */
  readonly onRecord?: (op: ListAppendOp) => void;
}

export interface ListAppendRun {
  readonly history: ListAppendOp[];
  readonly crashes: number;
  /**
   * Transactions that failed before commit() with an error of unknown outcome (a lost read
   * reply, say): recorded as failed, since nothing of a transaction is written before its
   * commit, but counted here as the ambiguous faults they were.
   */
  readonly unknownBeforeCommit: number;
}

/** A stop point as text, e.g. "afterPrewrite (isPrimary false)". */
export function stopLabel(point: StopPoint): string {
  return point.isPrimary === undefined ? point.step : `${point.step} (isPrimary ${point.isPrimary})`;
}

/** Where a list lives: spread over two tables so transactions span tables. */
export function listCell(key: string): readonly [string, string] {
  const n = Number(key.slice(1));
  return [LIST_TABLES[n % LIST_TABLES.length]!, key];
}

export function parseList(text: string | undefined): number[] {
  if (text === undefined) return [];
  const parsed: unknown = JSON.parse(text);
  if (!Array.isArray(parsed) || !parsed.every((v) => Number.isInteger(v))) {
    throw new Error(`a list cell holds ${text}, not a JSON array of integers`);
  }
  return parsed as number[];
}

/**
 * Runs the workload. `plansFor(client)` gives the CrashPlans whose hook that client was
 * built with (when crashes are wanted).
 */
export async function runListAppend(
  workload: ListAppendWorkload,
  plansFor?: (client: Percolator) => CrashPlans | undefined,
): Promise<ListAppendRun> {
  const history: ListAppendOp[] = [];
  const keys = Array.from({ length: workload.keys }, (_, i) => `k${i}`);
  let nextValue = workload.firstValue ?? 1;
  let started = 0;
  let crashes = 0;
  let unknownBeforeCommit = 0;

  const worker = async (w: number) => {
    const random = workload.random.fork(`worker ${w}`);
    const db = workload.clients[w % workload.clients.length]!;
    while (started < workload.transactions) {
      started++;
      await workload.pace?.();
      const plan = Array.from({ length: random.between(1, workload.maxOps) }, () => ({
        key: random.pick(keys),
        append: random.chance(0.5),
      }));
      const mops: ListAppendMop[] = [];
      // Before begin() draws the start timestamp: a commit acknowledged earlier must be seen.
      const invoke = performance.now();
      /** The snapshot of its reads, and (committed) its commit timestamp: the checker's visibility rule. */
      const stamps: { startTs?: number; commitTs?: number } = {};
      const record = (type: ListAppendOp['type']) => {
        const complete = performance.now();
        // Reads of a failed transaction carry no information; an unknown one's count once a
        // committed read shows that it committed (the checker decides).
        const txn = type !== 'fail' ? mops : mops.map((m) => (m.f === 'r' ? { ...m, value: null } : m));
        const op: ListAppendOp = {
          id: history.length,
          process: w,
          type,
          txn,
          invoke,
          complete,
          ...(type === 'fail' ? {} : stamps),
        };
        history.push(op);
        workload.onRecord?.(op);
      };
      let tx: Transaction;
      try {
        // A plan that only reads runs read-only: a peeked snapshot where the store can.
        tx = await db.begin({ readOnly: plan.every((p) => !p.append) });
      } catch (error) {
        workload.outcomeOf(error);
        continue;
      }
      try {
        for (const { key, append } of plan) {
          await jitter(random);
          const [table, row] = listCell(key);
          const list = parseList(await tx.getString(table, row, LIST_COLUMN));
          mops.push({ f: 'r', key, value: list });
          if (append) {
            const value = nextValue++;
            tx.set(table, row, LIST_COLUMN, JSON.stringify([...list, value]));
            mops.push({ f: 'append', key, value });
          }
        }
      } catch (error) {
        await tx.rollback();
        // commit() was never called, so nothing of it was written (writes are buffered
        // until the commit), whatever the error says of the store call: it failed. Recorded
        // unknown, a read that showed one of its appends would count as proof that it
        // committed instead of as an aborted read (G1a).
        if (workload.outcomeOf(error) === 'info') unknownBeforeCommit++;
        record('fail');
        continue;
      }
      // Every op of a plan reads first, so the snapshot is drawn (or peeked) by now.
      stamps.startTs = tx.startTs;
      const writtenRows = new Set(plan.filter((p) => p.append).map((p) => p.key)).size;
      const crash = writtenRows > 0 ? workload.crashAt?.(random, writtenRows) : undefined;
      if (crash !== undefined) plansFor?.(db)?.set(tx, crash);
      await jitter(random);
      try {
        const { commitTs } = await tx.commit();
        if (writtenRows > 0) stamps.commitTs = commitTs;
        record('ok');
      } catch (error) {
        if (error instanceof ClientCrash) {
          crashes++;
          // The stop was planned here, so its outcome is known: recording it unknown would
          // let an uncommitted transaction show (G1a) or a committed one vanish unnoticed.
          record(crash === undefined ? 'info' : stopOutcome(crash));
          if (crash !== undefined) workload.onCrash?.(crash);
        } else {
          record(workload.outcomeOf(error));
        }
      }
    }
  };
  await Promise.all(Array.from({ length: workload.workers }, (_, w) => worker(w)));
  return { history, crashes, unknownBeforeCommit };
}

/**
 * Lets other workers run for a few (seeded) microtask turns, so transactions interleave in
 * more ways than the store's own awaits give, and still deterministically.
 */
async function jitter(random: Random): Promise<void> {
  const turns = random.chance(0.5) ? random.between(1, 8) : 0;
  for (let i = 0; i < turns; i++) await Promise.resolve();
}

/** Reads every list: the final state, as the operations of one history entry. */
export async function readAllLists(tx: Transaction, keys: number): Promise<ListAppendMop[]> {
  const mops: ListAppendMop[] = [];
  for (let i = 0; i < keys; i++) {
    const key = `k${i}`;
    const [table, row] = listCell(key);
    mops.push({ f: 'r', key, value: parseList(await tx.getString(table, row, LIST_COLUMN)) });
  }
  return mops;
}
