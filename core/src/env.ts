import type { PrunePolicy } from './cells.js';
import type { EventSink, TidyEvent } from './events.js';
import type { LocalCommits } from './local-commits.js';
import type { TimestampOracle } from './oracle.js';
import type { TidyOptions, TidyReport } from './reports.js';
import type { RowCache } from './row-cache.js';
import type { RowReader } from './row-reader.js';
import type { RowState } from './row-state.js';
import type { RowStore, StoredRow } from './store.js';

export type CommitStep =
  | 'beforePrewrite'
  | 'afterPrewrite'
  | 'beforeCommitPrimary'
  | 'afterCommitPrimary'
  | 'afterCommitSecondary';

export interface CommitStepEvent {
  readonly step: CommitStep;
  readonly startTs: number;
  readonly table?: string;
  readonly row?: string;
  readonly isPrimary?: boolean;
  readonly commitTs?: number;
}

export interface PercolatorHooks {
  /**
   * Called at each named commit step. It may await (to delay the client there). If it
   * throws, the transaction's client behaves as if it crashed at that point: it makes no
   * further store call for that transaction, and commit() rejects with the thrown error.
   */
  onCommitStep?(event: CommitStepEvent): void | Promise<void>;
}

/** What every protocol step needs: one object, built once per client. */
export interface ProtocolEnv {
  readonly store: RowStore;
  /** Snapshot reads, coalesced into batches where the store can read many rows at once. */
  readonly reader: RowReader;
  readonly oracle: TimestampOracle;
  readonly clock: () => number;
  readonly lockTtlMs: number;
  /** How long (real ms) a reader waits on a live lock before LockNotResolvedError. */
  readonly lockWaitMs: number;
  readonly prune: PrunePolicy;
  readonly hooks: PercolatorHooks;
  /** The `onEvent` listener's sink; undefined without one (then no event is built). */
  readonly events: EventSink | undefined;
  /**
   * The oracle's counter, when the store can stamp a CAS from it: single-row transactions
   * then commit in one CAS, and primary commits draw their commitTs in the same step.
   */
  readonly stampCounter: string | undefined;
  /** The oracle's counter, when the store can draw a start timestamp and read in one step. */
  readonly stampedReadCounter: string | undefined;
  /**
   * The oracle's counter, when the store can read it and rows as one snapshot, writing
   * nothing (`readPeeked`): read-only transactions then take their snapshot that way.
   */
  readonly peekCounter: string | undefined;
  /** How this client chooses between a stamped first read and the batched oracle. */
  readonly stampedReads: StampedReadGauge;
  /** (table, column) pairs that carry observers: writes to them set a notification. */
  readonly observed: ReadonlySet<string>;
  /** Commits of this client holding locks: a reader that meets one waits for it (local-commits.ts). */
  readonly localCommits: LocalCommits;
  /** Work that outlives a commit (the tidy step); awaited by close(). */
  readonly background: Set<Promise<unknown>>;
  /** Moves old values out of head rows, deletes pruned version rows, settles held records. */
  readonly tidier: RowTidier;
  /** Head rows as this client last saw them: guesses for a CAS's expected version (row-cache.ts). */
  readonly rowCache: RowCache | undefined;
}

/**
 * What the protocol asks of the tidy step; `Tidier` (tidy.ts) implements it. Declared here,
 * not imported from tidy.ts, so this file of shared types depends on no protocol module.
 */
export interface RowTidier {
  /** Every secondary of the transaction at `startTs` is committed: its primary record may drop its list. */
  release(table: string, key: string, column: string, startTs: number): void;
  /** Called on every head-row state about to be written. */
  beforeWrite(table: string, key: string, state: RowState): void;
  /** Called after every head-row write. */
  afterWrite(table: string, key: string, state: RowState | null, stored: StoredRow | null | undefined): void;
  tidyRow(
    table: string,
    key: string,
    known?: StoredRow | null,
    options?: TidyOptions,
    trigger?: TidyEvent['trigger'],
  ): Promise<TidyReport>;
}

/**
 * A stamped read draws a timestamp of its own: one round trip less for the transaction, but
 * one counter write per transaction for the store. The batched oracle shares one counter
 * write among every transaction that asks while a fetch is in flight. So a client uses a
 * stamped read only while it is otherwise idle: no oracle fetch in flight or waiting, and
 * no other stamped read in flight. Under load, transactions share oracle batches; a lone
 * transaction saves its round trip. A store that declares `stampedReadUnderLoad` (its
 * stamped read writes nothing durable: Redis) gets stamped reads under load too.
 */
export class StampedReadGauge {
  inFlight = 0;
  constructor(
    private readonly oracleBusy: () => boolean,
    /** The store's `stampedReadUnderLoad`: a stamped read is as cheap as a read, so always use one. */
    private readonly underLoad = false,
  ) {}
  preferOracle(): boolean {
    return !this.underLoad && (this.inFlight > 0 || this.oracleBusy());
  }
}

export function observedKey(table: string, column: string): string {
  return `${table}\u0000${column}`;
}
