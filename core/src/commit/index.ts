import { STAMP } from '../codec.js';
import { CommitUnknownError } from '../errors.js';
import { AmbiguousOutcome, notAppliedAfter } from '../row-update.js';
import { commitPrimary } from './commit-point.js';
import { alive, type CommitContext, isPrimaryRow, notAborted, rowId, step, timed } from './context.js';
import { Heartbeat } from './heartbeat.js';
import { prewriteAll } from './prewrite.js';
import { rollbackTransaction } from './rollback.js';
import { commitSecondaries } from './secondaries.js';

export type { CommitContext, RowMutations } from './context.js';
export { rowId } from './context.js';
/**
 * Two-phase commit (docs/protocol.md section 4), one step per file: prewrite every row,
 * take a commit timestamp (or let the store stamp the commit CAS), commit the primary (the
 * commit point), then commit the secondaries. A failure before the commit point rolls back.
 */
export { commitOnePhase, commitOnePhaseMany } from './one-phase.js';

/**
 * Runs the steps in order and returns the commit timestamp as soon as the commit point is
 * passed: the transaction is committed then, whatever happens next. The secondaries are
 * committed in the background, as in the paper and TiKV (a reader that meets one of their
 * locks first rolls it forward through the primary); `db.close()` waits for them, and their
 * failures never turn a committed transaction into a failed one.
 */
export async function commitTransaction(ctx: CommitContext): Promise<number> {
  // Readers of this client that meet our locks wait for this to finish (local-commits.ts).
  const finished = ctx.env.localCommits.begin(ctx.startTs);
  let handedOff = false;
  try {
    const commitTs = await reachCommitPoint(ctx);
    // Its secondaries may still be locked, until the background step below commits them.
    ctx.env.localCommits.settling(
      ctx.startTs,
      ctx.rows.filter((m) => !isPrimaryRow(ctx, m)).map((m) => rowId(m.table, m.row)),
    );
    await step(ctx, { step: 'afterCommitPrimary', commitTs });
    if (ctx.rows.length > 1) {
      const { background } = ctx.env;
      const job = timed(ctx, 'secondaries', ctx.rows.length - 1, () =>
        commitSecondaries(ctx, commitTs),
      ).catch(() => undefined);
      background.add(job);
      handedOff = true;
      void job.finally(() => {
        background.delete(job);
        finished();
      });
    }
    return commitTs;
  } finally {
    if (!handedOff) finished();
  }
}

/** Prewrites, the commit timestamp and the primary commit; rolls back on any failure before the commit point. */
async function reachCommitPoint(ctx: CommitContext): Promise<number> {
  const heartbeat = new Heartbeat(ctx);
  try {
    await step(ctx, { step: 'beforePrewrite' });
    notAborted(ctx);
    await timed(ctx, 'prewrite', ctx.rows.length, () => prewriteAll(ctx, heartbeat));
    notAborted(ctx);
    return await timed(
      ctx,
      'commitPrimary',
      1,
      async () => {
        // Where the store can stamp the commit CAS, the commit timestamp is drawn inside it.
        const commitTs = ctx.env.stampsOne ? STAMP : await ctx.env.oracle.next();
        await step(ctx, { step: 'beforeCommitPrimary', ...(commitTs === STAMP ? {} : { commitTs }) });
        // A beat in flight may take a while (a store failing under it): the signal is looked
        // at once it is done, just before the CAS.
        await heartbeat.stop();
        notAborted(ctx); // the last moment a signal counts: after this CAS the transaction is committed
        return await commitPrimary(ctx, commitTs);
      },
      (commitTs) => commitTs,
    );
  } catch (error) {
    await heartbeat.stop();
    alive(ctx);
    if (error instanceof CommitUnknownError) throw error;
    ctx.env.localCommits.settling(
      ctx.startTs,
      ctx.rows.map((m) => rowId(m.table, m.row)),
    );
    await timed(ctx, 'rollback', ctx.rows.length, () => rollbackTransaction(ctx));
    if (error instanceof AmbiguousOutcome)
      throw notAppliedAfter(error, 'a prewrite could not be verified; the transaction was rolled back');
    throw error;
  }
}
