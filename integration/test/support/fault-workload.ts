/**
 * The workload every fault test runs while it breaks something: several Percolator
 * clients (each on a store instance of its own, like separate processes), each with a few
 * workers committing, one transaction after another until stopped:
 * - list-append transactions (Elle's): read a few lists, append to some;
 * - transfers: move an amount between two accounts, and append the transfer's id to both
 *   accounts' logs, so the transfer is also a list-append transaction to the checker.
 *
 * Every attempt is recorded as committed (ok), certainly not committed (fail) or unknown
 * (info, e.g. CommitUnknownError). `verify()` then checks the history with the suite's
 * Elle-style checker (no snapshot-isolation anomaly), that every acknowledged commit is in
 * the final state (appends and transfers), that no failed transfer is, that each account's
 * balance is its starting balance plus the transfers in its log, and that the total is
 * conserved. It does its final read and a write to every row with a client whose clock is
 * lockTtlMs + 1 s ahead of the moment it is called, in one attempt: every row is writable
 * again within lockTtlMs + 1 s of the fault's end, whatever locks the fault left.
 */

import {
  type CheckResult,
  checkListAppend,
  describeCheck,
  type ListAppendMop,
  type ListAppendOp,
  Random,
} from '@percolator/conformance';
import {
  ClientCrash,
  CommitUnknownError,
  ConflictError,
  LockNotResolvedError,
  Percolator,
  type RowStore,
  SnapshotTooOldError,
  StoreError,
  type TimestampOracle,
  type Transaction,
} from '@percolator/core';

/** Lists k0..k3 and accounts a0..a3, each family over two tables (so a composite can split them). */
export const LIST_TABLES = ['fw_lists_a', 'fw_lists_b'] as const;
export const ACCOUNT_TABLES = ['fw_bank_a', 'fw_bank_b'] as const;
export const WORKLOAD_TABLES = [...LIST_TABLES, ...ACCOUNT_TABLES] as const;
const LIST_KEYS = ['k0', 'k1', 'k2', 'k3'];
const ACCOUNT_KEYS = ['a0', 'a1', 'a2', 'a3'];
const START_BALANCE = 1000;

function cell(key: string): readonly [string, string] {
  const n = Number(key.slice(1));
  return [(key.startsWith('a') ? ACCOUNT_TABLES : LIST_TABLES)[n % 2]!, key];
}

function parseList(text: string | undefined): number[] {
  if (text === undefined) return [];
  const parsed: unknown = JSON.parse(text);
  if (!Array.isArray(parsed)) throw new Error(`a list cell holds ${text}`);
  return parsed as number[];
}

export type Outcome = 'ok' | 'fail' | 'info';

/** fail: certainly not committed; info: may have committed. Anything else is a bug to report. */
export function outcomeOf(error: unknown): Exclude<Outcome, 'ok'> | undefined {
  if (error instanceof CommitUnknownError || error instanceof ClientCrash) return 'info';
  if (error instanceof StoreError) return error.applied === 'no' ? 'fail' : 'info';
  if (error instanceof ConflictError || error instanceof LockNotResolvedError) return 'fail';
  if (error instanceof SnapshotTooOldError) return 'fail';
  return undefined;
}

interface Transfer {
  readonly from: string;
  readonly to: string;
  readonly amount: number;
}

export interface WorkloadClient {
  readonly db: Percolator;
  /** Workers on this client (default 2). */
  readonly workers?: number;
}

export interface WorkloadStats {
  readonly attempts: number;
  readonly ok: number;
  readonly fail: number;
  readonly info: number;
  /** Counted by error class and message start, for reports. */
  readonly errors: Record<string, number>;
}

export class FaultWorkload {
  readonly history: ListAppendOp[] = [];
  private readonly transfers = new Map<number, Transfer>();
  private readonly errorCounts = new Map<string, number>();
  /** Error messages (digits masked), counted: what a slow or failing run met, for its log. */
  private readonly errorMessages = new Map<string, number>();
  /** Errors no transaction should ever see (an untyped driver error, say): each fails the test. */
  readonly unexpected: string[] = [];
  private nextValue = 1;
  private running = false;
  private workers: Promise<void>[] = [];
  private okCount = 0;
  /** Acknowledged commits per client (index into `clients`). */
  private readonly okByClient = new Map<number, number>();
  private waiters: Array<{ target: number; client: number | undefined; resolve: () => void }> = [];

  constructor(
    private readonly clients: readonly WorkloadClient[],
    private readonly seed = 1,
  ) {}

  /** Commits acknowledged so far. */
  get acked(): number {
    return this.okCount;
  }

  get stats(): WorkloadStats {
    const by = (t: Outcome) => this.history.filter((o) => o.type === t).length;
    return {
      attempts: this.history.length,
      ok: by('ok'),
      fail: by('fail'),
      info: by('info'),
      errors: Object.fromEntries(this.errorCounts),
    };
  }

  /** Creates every row (balances and empty logs and lists) before the workload starts. */
  async setUp(db: Percolator): Promise<void> {
    await db.transact(async (tx) => {
      for (const key of ACCOUNT_KEYS) {
        const [t, r] = cell(key);
        tx.set(t, r, 'bal', String(START_BALANCE));
        tx.set(t, r, 'log', '[]');
      }
      for (const key of LIST_KEYS) {
        const [t, r] = cell(key);
        tx.set(t, r, 'list', '[]');
      }
    });
  }

  start(): void {
    this.running = true;
    const random = new Random(this.seed);
    this.clients.forEach((c, ci) => {
      for (let w = 0; w < (c.workers ?? 2); w++) {
        this.workers.push(this.worker(c.db, ci * 10 + w, random.fork(`worker ${ci}.${w}`)));
      }
    });
  }

  /**
   * Resolves once `more` further commits have been acknowledged (proves clients work again);
   * with `client`, commits of that client (index into the clients given), so a fault armed
   * for it next is armed on a client that works.
   */
  /** The `n` most frequent error messages, with their counts. */
  topErrors(n = 4): string {
    return [...this.errorMessages]
      .sort((a, b) => b[1] - a[1])
      .slice(0, n)
      .map(([m, c]) => `${c}x ${m}`)
      .join(' | ');
  }

  waitForAcks(more: number, timeoutMs = 60_000, what = 'commits', client?: number): Promise<void> {
    const target = this.acksOf(client) + more;
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        reject(
          new Error(
            `${what}: no ${more} commits acknowledged${client === undefined ? '' : ` by client ${client}`} within ${timeoutMs} ms (${this.okCount} in all; errors ${JSON.stringify(Object.fromEntries(this.errorCounts))}; unexpected ${this.unexpected.slice(0, 3).join(' | ')})`,
          ),
        );
      }, timeoutMs);
      this.waiters.push({
        target,
        client,
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
      });
      this.wake();
    });
  }

  async stop(): Promise<void> {
    this.running = false;
    await Promise.all(this.workers);
    this.workers = [];
  }

  private acksOf(client: number | undefined): number {
    return client === undefined ? this.okCount : (this.okByClient.get(client) ?? 0);
  }

  private wake(): void {
    this.waiters = this.waiters.filter((w) => {
      if (this.acksOf(w.client) < w.target) return true;
      w.resolve();
      return false;
    });
  }

  private record(type: Outcome, mops: ListAppendMop[], process: number): void {
    const txn = type === 'ok' ? mops : mops.map((m) => (m.f === 'r' ? { ...m, value: null } : m));
    this.history.push({ process, type, txn });
    if (type === 'ok') {
      this.okCount++;
      const client = Math.floor(process / 10);
      this.okByClient.set(client, (this.okByClient.get(client) ?? 0) + 1);
      this.wake();
    }
  }

  private noteError(error: unknown): Exclude<Outcome, 'ok'> {
    const name = error instanceof Error ? error.constructor.name : typeof error;
    const applied = error instanceof StoreError ? `(${error.applied})` : '';
    const key = `${name}${applied}`;
    this.errorCounts.set(key, (this.errorCounts.get(key) ?? 0) + 1);
    const message = `${key}: ${(error instanceof Error ? error.message : String(error)).replace(/\d+/g, 'N').slice(0, 120)}`;
    this.errorMessages.set(message, (this.errorMessages.get(message) ?? 0) + 1);
    const outcome = outcomeOf(error);
    if (outcome === undefined) {
      this.unexpected.push(`${key}: ${error instanceof Error ? error.message : String(error)}`);
      return 'info';
    }
    return outcome;
  }

  private async worker(db: Percolator, process: number, random: Random): Promise<void> {
    while (this.running) {
      let tx: Transaction;
      try {
        tx = await db.begin();
      } catch (error) {
        this.noteError(error);
        await sleep(20);
        continue;
      }
      const mops: ListAppendMop[] = [];
      const transfer = random.chance(0.4);
      try {
        if (transfer) await this.transfer(tx, random, mops);
        else await this.appends(tx, random, mops);
      } catch (error) {
        await tx.rollback().catch(() => undefined);
        this.record(this.noteError(error), mops, process);
        await sleep(20);
        continue;
      }
      try {
        await tx.commit();
        this.record('ok', mops, process);
      } catch (error) {
        this.record(this.noteError(error), mops, process);
        await sleep(20);
      }
      await sleep(random.between(0, 3));
    }
  }

  private async appends(tx: Transaction, random: Random, mops: ListAppendMop[]): Promise<void> {
    const n = random.between(1, 3);
    for (let i = 0; i < n; i++) {
      const key = random.pick(LIST_KEYS);
      const [t, r] = cell(key);
      const list = parseList(await tx.getString(t, r, 'list'));
      mops.push({ f: 'r', key, value: list });
      if (random.chance(0.6)) {
        const value = this.nextValue++;
        tx.set(t, r, 'list', JSON.stringify([...list, value]));
        mops.push({ f: 'append', key, value });
      }
    }
  }

  private async transfer(tx: Transaction, random: Random, mops: ListAppendMop[]): Promise<void> {
    const from = random.pick(ACCOUNT_KEYS);
    const to = random.pick(ACCOUNT_KEYS.filter((k) => k !== from));
    const amount = random.between(1, 20);
    const id = this.nextValue++;
    this.transfers.set(id, { from, to, amount });
    for (const [key, delta] of [
      [from, -amount],
      [to, amount],
    ] as const) {
      const [t, r] = cell(key);
      const balance = Number(await tx.getString(t, r, 'bal'));
      const log = parseList(await tx.getString(t, r, 'log'));
      mops.push({ f: 'r', key, value: log });
      tx.set(t, r, 'bal', String(balance + delta));
      tx.set(t, r, 'log', JSON.stringify([...log, id]));
      mops.push({ f: 'append', key, value: id });
    }
  }

  /**
   * Final read plus a write to every row, in one attempt by a client whose clock is
   * lockTtlMs + 1 s ahead; then every check. Call after stop() and after the fault ended.
   */
  async verify(options: { store: RowStore; oracle?: TimestampOracle; lockTtlMs: number }): Promise<Verdict> {
    const ahead = options.lockTtlMs + 1000;
    const checker = new Percolator({
      store: options.store,
      ...(options.oracle ? { oracle: options.oracle } : {}),
      lockTtlMs: options.lockTtlMs,
      lockWaitMs: 100,
      clock: () => Date.now() + ahead,
    });
    const finalRead: ListAppendMop[] = [];
    const balances = new Map<string, number>();
    // Locks get no second chance: a conflict or an unresolved lock fails at once. A request
    // the network lost (StoreError, CommitUnknownError; on a loaded machine a request can
    // time out) is tried again, for at most 60 s: a client that does not reconnect fails.
    const deadline = Date.now() + 60_000;
    let transportRetries = 0;
    try {
      for (;;) {
        finalRead.length = 0;
        balances.clear();
        try {
          const tx = await checker.begin();
          for (const key of [...LIST_KEYS, ...ACCOUNT_KEYS]) {
            const [t, r] = cell(key);
            const list = parseList(await tx.getString(t, r, key.startsWith('a') ? 'log' : 'list'));
            finalRead.push({ f: 'r', key, value: list });
            if (key.startsWith('a')) balances.set(key, Number((await tx.getString(t, r, 'bal')) ?? 'NaN'));
            tx.set(t, r, 'probe', String(Date.now()));
          }
          await tx.commit();
          break;
        } catch (error) {
          const transport = error instanceof StoreError || error instanceof CommitUnknownError;
          if (!transport || Date.now() > deadline) throw error;
          transportRetries++;
          await sleep(250);
        }
      }
    } catch (error) {
      throw new Error(
        `a row was not writable ${ahead} ms (lockTtlMs + 1 s) after the fault ended: ${(error as Error).constructor.name}: ${(error as Error).message}` +
          (transportRetries > 0 ? ` (after ${transportRetries} tries the network failed)` : ''),
        { cause: error },
      );
    } finally {
      await checker.close();
    }
    const history: ListAppendOp[] = [...this.history, { type: 'ok' as const, txn: finalRead }].map(
      (op, id) => ({
        ...op,
        id,
      }),
    );
    const check = checkListAppend(history);
    const final = new Map(finalRead.map((m) => [m.key, m.f === 'r' ? (m.value ?? []) : []]));
    const lost: string[] = [];
    const phantom: string[] = [];
    const partial: string[] = [];
    for (const op of history.slice(0, -1)) {
      // All of a transaction's appends landed, or none (an unknown outcome resolved one way).
      const appends = op.txn.filter((m) => m.f === 'append');
      const landed = appends.filter((m) => final.get(m.key)?.includes(m.value) ?? false);
      if (landed.length > 0 && landed.length < appends.length)
        partial.push(`T${op.id} (${op.type}): ${landed.length} of ${appends.length} appends landed`);
      for (const m of op.txn) {
        if (m.f !== 'append') continue;
        const present = final.get(m.key)?.includes(m.value) ?? false;
        if (op.type === 'ok' && !present) lost.push(`${m.value} in ${m.key}`);
        if (op.type === 'fail' && present) phantom.push(`${m.value} in ${m.key}`);
      }
    }
    // Balances: the start plus every transfer in the account's log; the total is conserved.
    const balanceErrors: string[] = [];
    let total = 0;
    for (const key of ACCOUNT_KEYS) {
      let expected = START_BALANCE;
      for (const id of final.get(key) ?? []) {
        const t = this.transfers.get(id);
        if (!t) {
          balanceErrors.push(`${key}'s log holds ${id}, which no transfer wrote`);
          continue;
        }
        if (t.from === key) expected -= t.amount;
        else if (t.to === key) expected += t.amount;
        else balanceErrors.push(`${key}'s log holds transfer ${id} between ${t.from} and ${t.to}`);
      }
      const balance = balances.get(key) ?? Number.NaN;
      total += balance;
      if (balance !== expected) balanceErrors.push(`${key} holds ${balance}, its log says ${expected}`);
    }
    // A transfer in one account's log is in the other's too (atomic).
    for (const [id, t] of this.transfers) {
      const inFrom = final.get(t.from)?.includes(id) ?? false;
      const inTo = final.get(t.to)?.includes(id) ?? false;
      if (inFrom !== inTo) balanceErrors.push(`transfer ${id} landed in ${inFrom ? t.from : t.to} only`);
    }
    const expectedTotal = START_BALANCE * ACCOUNT_KEYS.length;
    if (total !== expectedTotal) balanceErrors.push(`the total is ${total}, not ${expectedTotal}`);
    return {
      check,
      lost,
      phantom,
      partial,
      balanceErrors,
      transportRetries,
      stats: this.stats,
      unexpected: [...this.unexpected],
      describe: () =>
        [
          describeCheck(check),
          lost.length ? `acknowledged appends lost (${lost.length}): ${lost.slice(0, 5).join(', ')}` : '',
          phantom.length ? `failed appends present: ${phantom.slice(0, 5).join(', ')}` : '',
          partial.length ? `partly landed: ${partial.slice(0, 5).join(', ')}` : '',
          ...balanceErrors.slice(0, 5),
          this.unexpected.length ? `unexpected errors: ${this.unexpected.slice(0, 3).join(' | ')}` : '',
        ]
          .filter(Boolean)
          .join('\n'),
    };
  }
}

export interface Verdict {
  readonly check: CheckResult;
  /** Appends of acknowledged transactions missing from the final state. */
  readonly lost: readonly string[];
  /** Appends of transactions that certainly failed, present anyway. */
  readonly phantom: readonly string[];
  /** Transactions (any outcome) of which some appends landed and some did not. */
  readonly partial: readonly string[];
  readonly balanceErrors: readonly string[];
  /** Final-check attempts lost to the network (not to locks) before one went through. */
  readonly transportRetries: number;
  readonly stats: WorkloadStats;
  readonly unexpected: readonly string[];
  describe(): string;
}

/** True when nothing at all is wrong. */
export function clean(v: Verdict): boolean {
  return (
    v.check.valid &&
    v.lost.length === 0 &&
    v.phantom.length === 0 &&
    v.partial.length === 0 &&
    v.balanceErrors.length === 0 &&
    v.unexpected.length === 0
  );
}

export function summary(v: Verdict): string {
  const { attempts, ok, fail, info } = v.stats;
  const settled = info - v.partial.length;
  const verified = v.lost.length === 0 ? 'all present' : `${v.lost.length} acknowledged appends MISSING`;
  const retried =
    v.transportRetries > 0 ? `; final check retried ${v.transportRetries}x on network errors` : '';
  return `${attempts} attempts: ${ok} acknowledged (${verified}), ${fail} failed, ${info} unknown (${settled} resolved all-or-nothing); anomalies ${v.check.anomalies.length}${retried}`;
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
