import { backoffMs, sleep } from '../backoff.js';
import { addRecord, findRecord, tidyCell } from '../cells.js';
import { decodeRow, STAMP } from '../codec.js';
import { CommitUnknownError, ConflictError, RowTooLargeError, StoreError } from '../errors.js';
import { cellOf, emptyRow, rowHasNotification } from '../row-state.js';
import { AmbiguousOutcome, encodeState, readRow, updateRow } from '../row-update.js';
import { writeStamp } from '../store.js';
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
 * later start timestamp and still miss it. Only used when the store offers that.
 */
export async function commitOnePhase(ctx: CommitContext, counter: string): Promise<number> {
  const { env, startTs } = ctx;
  const m = ctx.rows[0]!;
  const id = rowId(m.table, m.row);
  let relieved = false;
  return withLockResolution(ctx, m, async () => {
    let current = ctx.knownRows.get(id);
    let ambiguous = false;
    for (let attempt = 0; attempt < 64; attempt++) {
      alive(ctx);
      if (!ambiguous) notAborted(ctx); // once a stamped CAS may have landed, only its fate counts
      if (current === undefined) {
        try {
          current = await readRow(env, m.table, m.row);
        } catch (error) {
          // After an ambiguous stamped CAS the transaction may be committed: never report
          // a plain (retryable) failure then.
          if (ambiguous) {
            throw new CommitUnknownError('a one-phase commit could not be verified', startTs, {
              cause: error,
            });
          }
          throw error;
        }
      }
      const state = current ? decodeRow(current.state) : emptyRow();
      const primaryCell = cellOf(state, ctx.primary.column);
      const landed = findRecord(primaryCell, startTs);
      if (landed && landed.kind !== 'rollback') return landed.commitTs;
      if (landed) throw new ConflictError(`transaction ${startTs} was rolled back by another client`);
      if (ambiguous && startTs <= primaryCell.prunedThrough) {
        throw new CommitUnknownError('a one-phase commit could not be verified', startTs);
      }
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
      env.tidier.beforeWrite(m.table, m.row, state);
      let bytes: Uint8Array;
      try {
        bytes = encodeState(env, m.table, m.row, state);
      } catch (error) {
        // Old values still inline: move them out once, then try again (nothing was sent).
        if (!(error instanceof RowTooLargeError) || relieved) throw error;
        relieved = true;
        await relievePressure(ctx, m);
        current = undefined;
        continue;
      }
      try {
        const outcome = await env.store.checkAndSetStamped!(
          {
            table: m.table,
            key: m.row,
            expected: current?.version ?? null,
            state: bytes,
            notified: rowHasNotification(state),
          },
          counter,
        );
        if (outcome.ok && outcome.timestamp !== undefined) {
          env.tidier.afterWrite(m.table, m.row, state, {
            version: outcome.version,
            state: writeStamp(bytes, outcome.timestamp),
          });
          return outcome.timestamp;
        }
        if (outcome.ok) ambiguous = true; // applied without a timestamp: re-read to find it
        current = outcome.ok ? undefined : outcome.current;
      } catch (error) {
        if (error instanceof RowTooLargeError) throw error;
        if (!(error instanceof StoreError && error.applied === 'no')) ambiguous = true;
        current = undefined;
        await sleep(backoffMs(attempt));
      }
    }
    if (ambiguous) throw new CommitUnknownError('a one-phase commit could not be verified', startTs);
    throw new StoreError(`row ${m.table}/${m.row} kept changing during a one-phase commit`, 'no');
  });
}
