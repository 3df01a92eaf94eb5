/**
 * What the tidy step and garbage collection report, and the tidy step's options: plain
 * types, importing nothing, so the modules that share them (env.ts, events.ts, tidy.ts,
 * gc.ts) never import each other for them.
 */

export interface TidyOptions {
  /** Move every superseded inline value and settle every held record, not just past the thresholds. */
  readonly force?: boolean;
  /** Settle every held record (so pruning may drop it), whatever the batch thresholds; moves nothing extra. */
  readonly settleHeld?: boolean;
}

export interface TidyReport {
  /** Values moved to version rows. */
  moved: number;
  /** Bytes of those values. */
  movedBytes: number;
  /** Version rows deleted. */
  deleted: number;
  /** Commit records whose secondaries were settled. */
  settled: number;
}

export interface GcReport {
  /** Head rows examined. */
  rows: number;
  /** Write records (versions, rollback records included) dropped from head rows. */
  versions: number;
  /** Bytes the head rows shrank by. */
  headBytes: number;
  /** Version rows deleted (values that had moved out of their head rows). */
  versionRows: number;
  /** Bytes those version rows held. */
  versionRowBytes: number;
  /**
   * Version rows made by the run: values that were `moving` (left in their head row by a
   * move whose version-row write had failed) moved out by the tidy step. Their bytes left
   * the head row, so `headBytes` counts them, but they were moved, not freed: what the run
   * freed in all is `headBytes + versionRowBytes - versionRowBytesCreated`. A dry run
   * estimates them from the values waiting to move.
   */
  versionRowsCreated: number;
  versionRowBytesCreated: number;
  /**
   * Commit records kept only because they still list secondaries. A real run settles
   * them (rolls their secondaries forward as a reader would) and may then drop them; a
   * dry run counts them and does not say how much settling would free.
   */
  held: number;
}
