import { updateRows } from '../row-update.js';
import { rollForwardCells } from '../settle-cells.js';
import { type CommitContext, isPrimaryRow, rowId, step } from './context.js';

/**
 * After the commit point (docs/protocol.md section 4): replace each secondary lock with its
 * write record, all in one batch where the store allows it, built from the rows as our
 * prewrites left them. A row that changed since (a reader rolled it forward) or whose
 * outcome is unknown is settled on its own. Failures are left to readers: the primary's
 * commit record keeps the list of secondaries until GC has checked them (section 7), or
 * until this client, having seen them all committed, drops it in a later write of that
 * row. A committed transaction needs no further write of its own.
 */
export async function commitSecondaries(ctx: CommitContext, commitTs: number): Promise<void> {
  const { env, startTs } = ctx;
  const secondaries = ctx.rows.filter((m) => !isPrimaryRow(ctx, m));
  if (secondaries.length === 0) return;
  if (ctx.crashed !== undefined) throw ctx.crashed;
  const results = await updateRows(
    env,
    secondaries.map((m) => ({
      table: m.table,
      key: m.row,
      known: ctx.knownRows.get(rowId(m.table, m.row)) ?? undefined,
      // Every lock of our startTs in this row is one of ours; none left: a reader rolled it forward.
      decide: (state) =>
        state && rollForwardCells(env, state, startTs, commitTs)
          ? { write: state, result: undefined }
          : { done: undefined },
    })),
  );
  for (const m of secondaries) {
    await step(ctx, { step: 'afterCommitSecondary', table: m.table, row: m.row, commitTs });
  }
  // Every secondary is known committed: the primary record's list may go, in whatever
  // write this client makes to that row next (never a write of its own).
  if (results.every((r) => r.status === 'fulfilled')) {
    env.tidier.release(ctx.primary.table, ctx.primary.row, ctx.primary.column, startTs);
  }
}
