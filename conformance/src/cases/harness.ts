/** What the protocol, history and fault cases share: clients, clocks, error classes. */
import {
  type CasResult,
  ClientCrash,
  CommitUnknownError,
  ConflictError,
  LocalOracle,
  LockNotResolvedError,
  Percolator,
  type PercolatorEventListener,
  type PercolatorHooks,
  type PrunePolicy,
  type RowStore,
  SnapshotTooOldError,
  StoreError,
  type TimestampOracle,
  type Transaction,
} from '@percolator/core';
import {
  type CallListener,
  FaultyStore,
  type RandomFaults,
  type StoreOperation,
  WRITE_OPERATIONS,
} from '../faulty-store.js';
import type { CaseContext, Part } from '../types.js';
import { ConformanceFailure, check, errorText } from '../util.js';

/** A wall clock the test moves by hand, so lock expiry needs no sleeping. */
export class FakeClock {
  constructor(public nowMs = 1_700_000_000_000) {}
  readonly now = (): number => this.nowMs;
  advance(ms: number): void {
    this.nowMs += ms;
  }
}

/** Random faults used when a part runs "with faults". Modest, so work still gets done. */
export const DEFAULT_RANDOM_FAULTS: RandomFaults = {
  failBefore: 0.03,
  failAfter: 0.03,
  delay: 0.05,
  maxDelayMs: 3,
};

/**
 * The history's faults: the default ones, and calls reported failed while still on their
 * way, which land later (FaultyStore 'late'): the checker then sees what a write that
 * arrives after its client gave up on it can do to a history. Only where the run waits for
 * them (FaultyStore.settle) before its final read.
 */
export const HISTORY_RANDOM_FAULTS: RandomFaults = { ...DEFAULT_RANDOM_FAULTS, late: 0.02, maxLateMs: 5 };

export type FaultMode = 'clean' | 'faulty';

/** Lock TTL of the protocol cases: long enough for a loaded machine, short enough to wait out. */
export const LOCK_TTL_MS = 1000;

/** Reads one column of several cells in one transaction, in the order given. */
export async function readAll(tx: Transaction, cells: readonly (readonly [string, string])[], column = 'v') {
  const out: (string | undefined)[] = [];
  for (const [table, row] of cells) out.push(await tx.getString(table, row, column));
  return out;
}

/**
 * Every client of one store must share one timestamp order. Stores with an atomic counter
 * give that through the default oracle; for the others all clients in this process share
 * one LocalOracle per store.
 */
const sharedOracles = new WeakMap<RowStore, TimestampOracle>();

export function oracleFor(store: RowStore): TimestampOracle | undefined {
  if (store.capabilities.atomicCounter) return undefined;
  let oracle = sharedOracles.get(store);
  if (oracle === undefined) sharedOracles.set(store, (oracle = new LocalOracle()));
  return oracle;
}

export interface ClientOptions {
  readonly clock?: FakeClock;
  readonly lockTtlMs?: number;
  readonly lockWaitMs?: number;
  /**
   * Test hooks at commit steps. They name the two-phase steps, so a client with hooks
   * commits every multi-row transaction in two phases (`onePhaseMaxRows` 1) unless
   * `onePhaseMaxRows` says otherwise.
   */
  readonly hooks?: PercolatorHooks;
  /** The client's `onePhaseMaxRows` (default: the client's own, or 1 with `hooks`). */
  readonly onePhaseMaxRows?: number;
  /** Wrap the store in a FaultyStore with these random faults (seeded from ctx.random). */
  readonly faults?: RandomFaults;
  /** The client's `onEvent` listener (to count what the client did). */
  readonly onEvent?: PercolatorEventListener;
  /**
   * With `faults`: whether the client's first row write surely loses its reply (default
   * true). A case that injects its own, more precise, fault of that kind passes false, so
   * the forced one does not take the call meant for its own.
   */
  readonly forceLostReply?: boolean;
  /** Wrap the store in a FaultyStore even without random faults (to hold or fail calls). */
  readonly wrap?: boolean;
  /** Old-version pruning and moving (the client's `gc` option). */
  readonly gc?: Partial<PrunePolicy>;
  /** (table, column) pairs with observers: writes to them leave a notification. */
  readonly observed?: ReadonlyArray<{ readonly table: string; readonly column: string }>;
  /**
   * The client's `peekedWrites` (default: the client's own; docs/protocol.md 4.10): read-write
   * transactions peek their snapshot and their commit takes an identity of its own. Cases
   * that follow a transaction's records by its start timestamp, or settle a lost reply by
   * a re-read, need false.
   */
  readonly peekedWrites?: boolean;
  /**
   * The client's `sharedCallsInFlight` (default: what the store declares). Cases that count
   * the calls one turn's transactions share set 1.
   */
  readonly sharedCallsInFlight?: number;
}

export interface Client {
  readonly db: Percolator;
  /** The wrapper this client talks through, when it has one. */
  readonly faulty?: FaultyStore;
}

/** A Percolator client over `store`, closed after the case. */
export function client(ctx: CaseContext, store: RowStore, options: ClientOptions = {}): Client {
  const faulty =
    options.faults !== undefined || options.wrap
      ? new FaultyStore(store, { seed: ctx.random.int(2 ** 31), random: options.faults })
      : undefined;
  const oracle = oracleFor(store);
  const db = new Percolator({
    store: faulty ?? store,
    ...(oracle ? { oracle } : {}),
    ...(options.clock ? { clock: options.clock.now } : {}),
    ...(options.onEvent ? { onEvent: options.onEvent } : {}),
    ...(options.lockTtlMs !== undefined ? { lockTtlMs: options.lockTtlMs } : {}),
    ...(options.lockWaitMs !== undefined ? { lockWaitMs: options.lockWaitMs } : {}),
    ...(options.hooks ? { hooks: options.hooks, onePhaseMaxRows: 1 } : {}),
    ...(options.onePhaseMaxRows !== undefined ? { onePhaseMaxRows: options.onePhaseMaxRows } : {}),
    ...(options.observed ? { observedColumns: options.observed } : {}),
    ...(options.gc ? { gc: options.gc } : {}),
    ...(options.peekedWrites !== undefined ? { peekedWrites: options.peekedWrites } : {}),
    ...(options.sharedCallsInFlight !== undefined
      ? { sharedCallsInFlight: options.sharedCallsInFlight }
      : {}),
  });
  ctx.defer(async () => {
    faulty?.clearFaults();
    await db.close();
  });
  if (faulty && options.faults) {
    // Random faults on a short case may miss every write: the first write this client
    // sends loses its reply after it ran, for sure (the case's proof below).
    if (options.forceLostReply !== false) faulty.inject({ kind: 'after', operation: ROW_WRITES, times: 1 });
    const tallied = { faulty, writes: 0 };
    faulty.onCall((call) => {
      if (ROW_WRITES.includes(call.operation)) tallied.writes++;
    });
    tally(ctx).push(tallied);
  }
  return { db, faulty };
}

/** The calls that write rows (a counter draw's lost reply loses only a timestamp). */
const ROW_WRITES: readonly StoreOperation[] = WRITE_OPERATIONS.filter((op) => op !== 'incrementCounter');

/**
 * A completed single-row write call (`onCall`) whose check-and-set took effect. A call that
 * completed is not enough: a CAS that lost to another writer completes too, having written
 * nothing.
 */
export function applied(outcome: Parameters<CallListener>[1]): boolean {
  return outcome.ok && (outcome.result as CasResult | undefined)?.ok === true;
}

/** A client with random faults, and the row writes it sent. */
interface Tallied {
  readonly faulty: FaultyStore;
  writes: number;
}

const tallies = new WeakMap<CaseContext, Tallied[]>();

/**
 * Notes, once per case, how many faults its clients with random faults injected, and
 * checks that one of their writes lost its reply if they wrote at all (a client that only
 * reads has none to lose).
 */
function tally(ctx: CaseContext): Tallied[] {
  let stores = tallies.get(ctx);
  if (stores === undefined) {
    const clients: Tallied[] = [];
    tallies.set(ctx, (stores = clients));
    ctx.defer(() => {
      const list = clients.map((c) => c.faulty);
      const sum = (f: (s: FaultyStore) => number) => list.reduce((n, s) => n + f(s), 0);
      const writesAfter = sum(
        (s) => s.log.filter((e) => e.kind === 'after' && ROW_WRITES.includes(e.call.operation)).length,
      );
      ctx.note(
        `faults injected: ${sum((s) => s.stats.failedBefore)} before, ${sum((s) => s.stats.failedAfter)} after ` +
          `(ambiguous; ${writesAfter} of them writes), ${sum((s) => s.stats.delayed)} delayed, over ${sum((s) => s.stats.calls)} calls`,
      );
      // A case "with random faults" whose writes all got through proved nothing about them.
      const writes = clients.reduce((n, c) => n + c.writes, 0);
      check(
        writes === 0 || writesAfter > 0,
        `none of the ${writes} writes of this case's faulty clients lost its reply: its faults never reached a write`,
      );
    });
  }
  return stores;
}

/** The outcome of a transaction as a history records it. */
export type Outcome = 'ok' | 'fail' | 'info';

/**
 * Sorts an error from a transaction into failed (certainly not committed) or unknown
 * (may have committed). Anything unexpected is a failure of the suite's case.
 */
export function outcomeOf(error: unknown): Exclude<Outcome, 'ok'> {
  if (error instanceof CommitUnknownError) return 'info';
  if (error instanceof ClientCrash) return 'info';
  if (error instanceof StoreError) return error.applied === 'no' ? 'fail' : 'info';
  if (error instanceof ConflictError || error instanceof LockNotResolvedError) return 'fail';
  if (error instanceof SnapshotTooOldError) return 'fail';
  throw new ConformanceFailure(`unexpected error from a transaction: ${errorText(error)}`, { cause: error });
}

/**
 * Runs a read-only check until it gets through (retryable errors and injected faults are
 * retried), bounded.
 */
export async function settled<T>(
  db: Percolator,
  fn: (tx: Transaction) => Promise<T>,
  what: string,
  options: { readonly readOnly?: boolean } = {},
): Promise<T> {
  let last: unknown;
  // Bounded in attempts and in time, so a broken store fails the case instead of hanging it.
  const deadline = Date.now() + 15_000;
  for (let attempt = 0; attempt < 30 && Date.now() < deadline; attempt++) {
    try {
      return await db.transact(fn, { maxAttempts: 10, ...options });
    } catch (error) {
      outcomeOf(error);
      last = error;
      await new Promise((r) => setTimeout(r, 5));
    }
  }
  throw new ConformanceFailure(`${what} kept failing: ${errorText(last)}`);
}

/** Cases that also run with faults: the 'faults' part holds the faulty variant. */
export function partFor(mode: FaultMode): Part {
  return mode === 'faulty' ? 'faults' : 'protocol';
}

export function faultSuffix(mode: FaultMode): string {
  return mode === 'faulty' ? ' (with random store faults)' : '';
}

/** Picks fault settings for a mode. */
export function faultsFor(mode: FaultMode): RandomFaults | undefined {
  return mode === 'faulty' ? DEFAULT_RANDOM_FAULTS : undefined;
}
