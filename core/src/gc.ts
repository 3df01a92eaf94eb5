import { BLOCK_ENTRY_BYTES, heldRecords, movingBlocks, pruneCell } from './cells.js';
import { decodeRow, decodeRowAt, encodeRow } from './codec.js';
import type { ProtocolEnv } from './env.js';
import { inspectHeadRow, namedVersionRows } from './inspect.js';
import type { GcReport } from './reports.js';
import type { RowState } from './row-state.js';
import { type Decide, readRow, updateRow } from './row-update.js';
import type { RowRef, StoredRow } from './store.js';
import { versionKey, versionTable } from './versions.js';

/**
 * Garbage collection on demand (docs/protocol.md section 7, docs/operations.md): prune one
 * head row as far as the client's retention policy allows, now, instead of at its next
 * commit. It is the same pruning a commit does (pruneCell), then the tidy step with every
 * held record settled (so records kept only for their secondaries list may go too), then
 * one more tidy pass for the version rows that pruning released. Nothing a snapshot
 * younger than the policy's safe point can see is dropped.
 */

export interface GcOptions {
  /** Only report what would go; write nothing. */
  readonly dryRun?: boolean;
  /**
   * Called after each row is done, with the totals so far (a copy) and that row's key. A
   * run that fails part way has done the rows reported before the failure (and may have
   * done part of the next): what an operator's tool prints, so a long run that fails says
   * what it freed. Not called for a row gc found absent. An error it throws ends the run.
   */
  readonly onProgress?: (done: GcReport, row: string) => void;
}

export type { GcReport } from './reports.js';

export function emptyGcReport(): GcReport {
  return {
    rows: 0,
    versions: 0,
    headBytes: 0,
    versionRows: 0,
    versionRowBytes: 0,
    versionRowsCreated: 0,
    versionRowBytesCreated: 0,
    held: 0,
  };
}

export function addGcReports(into: GcReport, add: GcReport): GcReport {
  into.rows += add.rows;
  into.versions += add.versions;
  into.headBytes += add.headBytes;
  into.versionRows += add.versionRows;
  into.versionRowBytes += add.versionRowBytes;
  into.versionRowsCreated += add.versionRowsCreated;
  into.versionRowBytesCreated += add.versionRowBytesCreated;
  into.held += add.held;
  return into;
}

function countRecords(state: RowState): number {
  let n = 0;
  for (const cell of state.cells.values()) n += cell.recordCount;
  return n;
}

function countHeld(env: ProtocolEnv, state: RowState, nowMs: number): number {
  let n = 0;
  for (const cell of state.cells.values()) n += heldRecords(cell, env.prune, nowMs).length;
  return n;
}

/** Prunes every cell of `state` in place; whether anything was dropped. */
function pruneRow(env: ProtocolEnv, state: RowState, nowMs: number): boolean {
  const before = countRecords(state);
  for (const cell of state.cells.values()) pruneCell(cell, env.prune, nowMs);
  return countRecords(state) !== before;
}

/** GC of one head row. */
export async function gcRow(
  env: ProtocolEnv,
  table: string,
  key: string,
  options: GcOptions = {},
): Promise<GcReport> {
  const report = emptyGcReport();
  const first = await readRow(env, table, key);
  if (!first) return report;
  report.rows = 1;
  const before = decodeRowAt(first.state, table, key);
  const recordsBefore = countRecords(before);
  const now = env.clock();
  report.held = countHeld(env, before, now);
  if (options.dryRun) {
    const pruned = decodeRow(first.state);
    pruneRow(env, pruned, now);
    report.versions = recordsBefore - countRecords(pruned);
    // Version rows the tidy step would delete: those already in `garbage` and those the
    // pruning adds to it. Read (never written) to report their size.
    const vt = versionTable(table);
    const refs: RowRef[] = [];
    for (const [column, cell] of pruned.cells)
      for (const ts of cell.garbage) refs.push({ table: vt, key: versionKey(key, column, ts) });
    for (const row of await readAll(env, refs)) {
      if (!row) continue;
      report.versionRows++;
      report.versionRowBytes += row.state.length;
    }
    // Values waiting to move (`moving`): the real run's tidy step writes them to version
    // rows, one per block. About their size: the values and each one's entry.
    for (const cell of pruned.cells.values()) {
      for (const block of movingBlocks(cell)) {
        report.versionRowsCreated++;
        report.versionRowBytesCreated += block.bytes + block.entries.length * BLOCK_ENTRY_BYTES;
      }
    }
    // The head row as the real run leaves it, whose size it reports: the moved values out
    // of it, the deleted version rows' names out of `garbage` (tidy.ts, recordConfirmed).
    // Encoded as pruned only, the estimate came out lower than the run with nothing to
    // settle (1,241 B against 1,326 on a hot cell, found by an operator's walkthrough).
    for (const cell of pruned.cells.values()) {
      for (const rec of cell.writes) {
        if (rec.value !== 'moving') continue;
        rec.value = 'moved';
        cell.dropValue(rec.startTs);
      }
      cell.garbage = [];
    }
    // As the real run reports it: a row re-encoded a few bytes larger frees nothing, never
    // a negative amount.
    report.headBytes = Math.max(0, first.state.length - encodeRow(pruned).length);
    return report;
  }
  // Every version row the head row names now; whichever of them is gone at the end was freed.
  const named = namedVersionRows(table, key, inspectHeadRow(first.state)).named;
  const namedBefore = await readAll(env, named);
  // 1. The pruning a commit would do, now.
  const prune: Decide<undefined> = (state) =>
    state && pruneRow(env, state, env.clock()) ? { write: state, result: undefined } : { done: undefined };
  let stored: StoredRow | null | undefined = (await updateRow(env, table, key, first, prune)).stored;
  // 2. Settle held records, delete released version rows. Settling clears the records'
  // lists of secondaries, but the tidy step prunes after that only when a batch of records
  // is due, so a round that settled some prunes the row again (step 1) and may have
  // released more version rows: one more round for those.
  for (let round = 0; round < 3; round++) {
    const tidied = await env.tidier.tidyRow(table, key, stored, { settleHeld: true });
    stored = undefined;
    if (tidied.settled > 0) {
      const current = await readRow(env, table, key);
      if (current) stored = (await updateRow(env, table, key, current, prune)).stored;
    }
    if (tidied.settled === 0 && tidied.deleted === 0) break;
  }
  // The writes above may have started this client's background tidy step on the row.
  while (env.background.size > 0) await Promise.all([...env.background]);
  const after = await readRow(env, table, key);
  const afterState = after ? decodeRow(after.state) : { cells: new Map() };
  report.versions = Math.max(0, recordsBefore - countRecords(afterState));
  report.headBytes = Math.max(0, first.state.length - (after?.state.length ?? 0));
  report.held = countHeld(env, afterState, env.clock());
  const namedAfter = await readAll(env, named);
  namedBefore.forEach((was, i) => {
    const is = namedAfter[i];
    if (was && !is) {
      report.versionRows++;
      report.versionRowBytes += was.state.length;
    } else if (!was && is) {
      // Named and absent before (a `moving` value's block), there now: made by the run's
      // tidy step. Its bytes left the head row: moved, not freed.
      report.versionRowsCreated++;
      report.versionRowBytesCreated += is.state.length;
    }
  });
  // Version rows the head row names now and did not name before: made by the run too.
  if (after) {
    const namedFirst = new Set(named.map((r) => `${r.table}\u0000${r.key}`));
    const created = namedVersionRows(table, key, inspectHeadRow(after.state)).named.filter(
      (r) => !namedFirst.has(`${r.table}\u0000${r.key}`),
    );
    for (const row of await readAll(env, created)) {
      if (!row) continue;
      report.versionRowsCreated++;
      report.versionRowBytesCreated += row.state.length;
    }
  }
  return report;
}

function readAll(env: ProtocolEnv, refs: readonly RowRef[]): Promise<(StoredRow | null)[]> {
  return Promise.all(refs.map((r) => env.reader.read(r.table, r.key)));
}
