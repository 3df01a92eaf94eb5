import type { RowStore, StoreCapabilities } from '@percolator/core';
import type { Random } from './random.js';

/** The parts of the suite, in the order they run. */
export type Part = 'store' | 'protocol' | 'history' | 'faults' | 'observers';
export const PARTS: readonly Part[] = ['store', 'protocol', 'history', 'faults', 'observers'];

/**
 * Optional capabilities a case may need: the boolean fields of StoreCapabilities that govern
 * a store method (`stampedReadUnderLoad`, `stampedManyForOneRow` and `sharedCallsInFlight`
 * are cost hints, not ones).
 */
export type Capability = Exclude<
  keyof StoreCapabilities,
  'maxStateBytes' | 'stampedReadUnderLoad' | 'stampedManyForOneRow' | 'sharedCallsInFlight'
>;

export interface ConformanceOptions {
  /** Shown in test names and reports, e.g. "memory" or "postgres". */
  readonly name: string;
  /** Creates a fresh store, isolated from every other store it created (own namespace). */
  readonly createStore: () => Promise<RowStore>;
  /** Removes a store's data and closes it. Default: `store.close()`. */
  readonly destroyStore?: (store: RowStore) => Promise<void>;
  /** Which parts to run (default: all). */
  readonly parts?: readonly Part[];
  /**
   * Multiplies workload sizes (rows, transactions, concurrency rounds). 1 is sized for the
   * memory store; use e.g. 0.1 for a store with millisecond round trips.
   */
  readonly scale?: number;
  /** Seed for every random choice (default: PERCOLATOR_SEED or a fixed value). */
  readonly seed?: number;
  /** Only cases whose "part: name" contains this text (the CLI's --grep). */
  readonly grep?: string;
}

/** What a case gets to work with. */
export interface CaseContext {
  readonly seed: number;
  readonly scale: number;
  /** Seeded per case, so one case's choices do not depend on the others. */
  readonly random: Random;
  /** The capabilities the stores of this run declare. */
  readonly capabilities: StoreCapabilities;
  /** A fresh store from the factory; destroyed after the case. */
  createStore(): Promise<RowStore>;
  /** `n` scaled by the run's scale, at least `min` (default 1). */
  scaled(n: number, min?: number): number;
  /** Adds a line to the case's result (shown by the CLI and in test output). */
  note(message: string): void;
  /** Runs after the case, last registered first, pass or fail. */
  defer(cleanup: () => unknown): void;
}

export interface ConformanceCase {
  readonly part: Part;
  readonly name: string;
  /**
   * The capability the case checks. When the store does not declare it, the case is
   * replaced by a check that the core never calls that capability's method.
   */
  readonly requires?: Capability;
  /** Time limit at scale 1 (default 30 s). */
  readonly timeoutMs?: number;
  run(ctx: CaseContext): Promise<void>;
}

/** 'not declared' is no longer produced (undeclared capabilities get a real check); kept for old callers. */
export type CaseStatus = 'pass' | 'fail' | 'not declared';

export interface CaseResult {
  readonly part: Part;
  readonly name: string;
  readonly status: CaseStatus;
  readonly durationMs: number;
  /** Why it failed (with the seed to repeat it). */
  readonly error?: string;
  readonly notes: readonly string[];
  /** Set when the store does not declare the case's capability and the undeclared check ran. */
  readonly undeclared?: Capability;
}

export interface PartSummary {
  readonly pass: number;
  readonly fail: number;
  /** Cases of capabilities the store does not declare (checked: the core never calls them). */
  readonly notDeclared: number;
  readonly durationMs: number;
}

export interface Report {
  readonly name: string;
  readonly seed: number;
  readonly scale: number;
  /** True when no case failed. */
  readonly ok: boolean;
  readonly durationMs: number;
  readonly results: readonly CaseResult[];
  readonly parts: Partial<Record<Part, PartSummary>>;
}
