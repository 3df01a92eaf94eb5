import { findRecord } from '../cells.js';
import { cellOf, emptyRow } from '../row-state.js';
import { updateRows } from '../row-update.js';
import { addRollbackRecord, rollBackCells } from '../settle-cells.js';
import { type CommitContext, isPrimaryRow } from './context.js';

/**
 * Before the commit point (docs/protocol.md section 4): remove our locks and leave a
 * rollback record on the primary, so a late prewrite of this transaction fails. All rows
 * in one batch where the store allows it. Best effort: readers do the same.
 *
 * Nothing at all when no prewrite was sent (a conflict found in the rows as read, before
 * the batch went out): no row holds anything of ours, and no prewrite can land late. A
 * rollback record there cost a write, and counted towards the primary cell's version cap
 * (`maxVersionsPerCell`), so that under contention aborted transactions pushed the cell's
 * safe point past live snapshots, which then failed as too old (found in review).
 */
export async function rollbackTransaction(ctx: CommitContext): Promise<void> {
  const { env, startTs, primary } = ctx;
  if (ctx.crashed !== undefined || ctx.prewriteSent === false) return;
  await updateRows(
    env,
    ctx.rows.map((m) => ({
      table: m.table,
      key: m.row,
      known: undefined,
      decide: (state) => {
        const next = state ?? emptyRow();
        const removed = rollBackCells(next, startTs);
        if (!isPrimaryRow(ctx, m)) return removed ? { write: next, result: undefined } : { done: undefined };
        const cell = cellOf(next, primary.column);
        if (findRecord(cell, startTs))
          return removed ? { write: next, result: undefined } : { done: undefined };
        addRollbackRecord(cell, startTs, env.clock());
        return { write: next, result: undefined };
      },
    })),
  );
}
