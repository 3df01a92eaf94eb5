import { findRecord } from '../cells.js';
import { STAMP } from '../codec.js';
import { CommitUnknownError, ConflictError } from '../errors.js';
import { AmbiguousOutcome, updateRow } from '../row-update.js';
import { rollForwardCells } from '../settle-cells.js';
import { alive, type CommitContext, isPrimaryRow, rowId } from './context.js';

/**
 * The commit point (docs/protocol.md section 4): the one CAS after which the transaction
 * is committed, whatever happens to its client.
 */

/**
 * In one CAS on the primary row, replace our locks with write records. If our lock is
 * gone, a commit record for our startTs means an earlier ambiguous attempt succeeded;
 * otherwise another client rolled us back. With `commitTs` STAMP the store draws the
 * commit timestamp in the same atomic step (stores with `stampedCheckAndSet`): no round
 * trip to the oracle first.
 */
export async function commitPrimary(ctx: CommitContext, commitTs: number): Promise<number> {
  const { env, startTs, primary } = ctx;
  const m = ctx.rows.find((r) => isPrimaryRow(ctx, r))!;
  alive(ctx);
  try {
    const { result, timestamp } = await updateRow<number>(
      env,
      primary.table,
      primary.row,
      ctx.knownRows.get(rowId(m.table, m.row)),
      (state, attempt) => {
        const cell = state?.cells.get(primary.column);
        if (state && cell?.lock?.startTs === startTs) {
          // Every lock of ours in the row; the commit record keeps its list of secondaries.
          rollForwardCells(env, state, startTs, commitTs, true);
          return { write: state, result: commitTs };
        }
        const record = cell ? findRecord(cell, startTs) : undefined;
        if (record && record.kind !== 'rollback') return { done: record.commitTs };
        if (!record && attempt.ambiguous) {
          throw new CommitUnknownError(
            'primary lock is gone and no record remains after an ambiguous commit',
            startTs,
          );
        }
        throw new ConflictError(
          `transaction ${startTs} was rolled back by another client before its commit point`,
        );
      },
      false,
      commitTs === STAMP,
    );
    return timestamp ?? result;
  } catch (error) {
    if (error instanceof AmbiguousOutcome) {
      throw new CommitUnknownError(`commit of transaction ${startTs} could not be verified`, startTs, {
        cause: error.cause,
      });
    }
    throw error;
  }
}
