import { addRecord, findRecord, tidyCell } from '../cells.js';
import { STAMP } from '../codec.js';
import { CommitUnknownError, ConflictError, RowTooLargeError } from '../errors.js';
import { cellOf, emptyRow, type RowState } from '../row-state.js';
import {
  AmbiguousOutcome,
  type AttemptInfo,
  type Known,
  knownOrGuess,
  type RowDecision,
  updateRow,
} from '../row-update.js';
import { alive, type CommitContext, isPrimaryRow, notAborted, rowId } from './context.js';
import { applyPrewrite, relievePressure, withLockResolution } from './prewrite.js';

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
          const now = env.clock();
          for (const column of m.cells.keys()) {
            const c = cellOf(state, column);
            const lock = c.lock;
            if (lock?.startTs !== startTs) continue;
            c.lock = undefined;
            addRecord(c, {
              commitTs,
              startTs,
              kind: lock.kind,
              wallTimeMs: now,
              value: 'inline',
              secondaries: lock.secondaries,
            });
            tidyCell(c, env.prune, now);
          }
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
      commitTs === STAMP ? env.stampCounter : undefined,
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

/**
 * A single-row transaction in one CAS (1PC): the store draws the commit timestamp from the
 * oracle's own counter inside the same atomic step as the write, so no reader can take a
 * later start timestamp and still miss it. Only used when the store offers that. The
 * usual row loop (`updateRow` with a stamp counter) sends it; after an unknown outcome
 * the decision finds our own record, a rollback record, or nothing it can trust.
 *
 * With `startTs` STAMP (a blind write that never drew a start timestamp): the one drawn
 * value is both its start and its commit timestamp. It read nothing, so its snapshot
 * matters only for the write-write check, and at the instant of the atomic step no record
 * on the row can be newer. Such a record has no identity the client knows before the
 * reply, so a lost reply is CommitUnknownError (never a second write).
 */
export async function commitOnePhase(ctx: CommitContext, counter: string): Promise<number> {
  const { env, startTs } = ctx;
  const stampedStart = startTs === STAMP;
  const m = ctx.rows[0]!;
  const id = rowId(m.table, m.row);
  const reportedStart = stampedStart ? undefined : startTs;
  const decide = (current: RowState | undefined, attempt: AttemptInfo): RowDecision<number> => {
    alive(ctx);
    if (stampedStart && attempt.ambiguous) {
      throw new CommitUnknownError(
        'a one-phase blind write (start and commit timestamp drawn by the store) could not be verified',
        undefined,
      );
    }
    const state = current ?? emptyRow();
    const primaryCell = cellOf(state, ctx.primary.column);
    const landed = findRecord(primaryCell, startTs);
    if (landed && landed.kind !== 'rollback') return { done: landed.commitTs };
    if (landed) throw new ConflictError(`transaction ${startTs} was rolled back by another client`);
    if (attempt.ambiguous && startTs <= primaryCell.prunedThrough) {
      throw new CommitUnknownError('a one-phase commit could not be verified', startTs);
    }
    // Once a stamped CAS may have landed, only its fate counts, not the caller's signal.
    if (!attempt.ambiguous) notAborted(ctx);
    applyPrewrite(ctx, m, state, 'none');
    const now = env.clock();
    for (const [column, value] of m.cells) {
      const cell = cellOf(state, column);
      addRecord(cell, {
        commitTs: STAMP,
        startTs,
        kind: value ? 'put' : 'delete',
        wallTimeMs: now,
        value: 'inline',
      });
      tidyCell(cell, env.prune, now);
    }
    return { write: state, result: STAMP };
  };
  const send = async (known: Known) => {
    const { result, timestamp } = await updateRow(env, m.table, m.row, known, decide, false, counter);
    return timestamp ?? result;
  };
  return withLockResolution(ctx, m, async (attempt) => {
    // A row this transaction never read (a blind write): the client's last sight of it, as
    // a guess. One stamped CAS then commits it, with no read first.
    const known = attempt === 0 ? knownOrGuess(env, m.table, m.row, ctx.knownRows.get(id)) : undefined;
    try {
      return await send(known);
    } catch (error) {
      if (error instanceof AmbiguousOutcome) {
        throw new CommitUnknownError('a one-phase commit could not be verified', reportedStart, {
          cause: error.cause,
        });
      }
      if (!(error instanceof RowTooLargeError)) throw error;
      // Old values still inline: move them out once, then try again (nothing was sent).
      await relievePressure(ctx, m);
      return await send(undefined).catch((again: unknown) => {
        if (again instanceof AmbiguousOutcome) {
          throw new CommitUnknownError('a one-phase commit could not be verified', reportedStart, {
            cause: again.cause,
          });
        }
        throw again;
      });
    }
  });
}
