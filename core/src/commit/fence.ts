import { backoffMs, sleep } from '../backoff.js';
import { decodeRow, encodeRow } from '../codec.js';
import type { ProtocolEnv } from '../env.js';
import { StoreError } from '../errors.js';
import type { CommitFenceEvent, TransactionRef } from '../events.js';
import { emptyRow, rowHasNotification } from '../row-state.js';
import type { StoredRow, Version } from '../store.js';

/**
 * The fence (docs/protocol.md 4.11). A one-step commit named by the store's draw (a blind
 * write, 4.5, or a peeked snapshot's commit, 4.10) carries no identity the client knows
 * before the reply, so after a lost reply its re-read cannot find its records. What the
 * re-read can still tell: a row of the step that is still at the version the step expected
 * has not been written by it, and, the step being atomic, neither has any other row of it.
 * But the step may still be on its way (a request delayed, not lost), and land later.
 *
 * The fence closes that door: a CAS of that row from the expected version to the same
 * state (the same bytes, the same notification flag) under a new version. Once it applies,
 * the lost step, which expects the old version of that row, can never apply, and nothing
 * of it was ever there: the outcome is certain (not written) and the commit may be sent
 * again, decided afresh on the rows as they are. Readers see the same row; a writer that
 * read the old version loses one CAS and re-reads, as after any write.
 *
 * A row the step would have created (expected absent) and that is still absent is fenced
 * the same way: a create of the head row with no cells, so the lost step, which expects the
 * row absent, can never apply. A head row with no cells reads as an absent one at every
 * snapshot (no value; scans leave out rows without values, as they leave out a row whose
 * only create was rolled back), and head rows are never deleted, so the row can never be
 * absent again for the step to land on. Only head rows: a version row holds its block's
 * values from its create on (docs/protocol.md 2.2), so the callers never fence one.
 *
 * Returns the row as the fence left it, or undefined where the fence did not apply: the
 * row changed since the re-read (the step may have landed: the outcome stays unknown), or
 * the fence's own outcome is unknown, or it was refused with certainty ('no') on each of
 * its FENCE_ATTEMPTS sends. A fence that landed without its reply is harmless (the same
 * state under another version); the caller then reports unknown.
 */
export async function fence(
  env: ProtocolEnv,
  table: string,
  key: string,
  /** The head row as the re-read found it; null: absent. */
  row: StoredRow | null,
  /** What the lost step expected of it; null: absent (a create). */
  expected: Version | null,
  /** The transaction whose step it fences, for its `commit.fence` event. */
  transaction: TransactionRef | undefined,
): Promise<StoredRow | undefined> {
  if ((row?.version ?? null) !== expected) return undefined;
  let state: Uint8Array;
  let notified: boolean;
  if (row === null) {
    state = encodeRow(emptyRow());
    notified = false;
  } else {
    state = row.state;
    try {
      notified = rowHasNotification(decodeRow(row.state));
    } catch {
      return undefined; // a row we cannot decode is not rewritten
    }
  }
  const events = env.events;
  const time = events ? performance.now() : 0;
  const done = (outcome: CommitFenceEvent['outcome']) =>
    events?.emit({
      type: 'commit.fence',
      transaction,
      table,
      row: key,
      outcome,
      time,
      durationMs: performance.now() - time,
    });
  for (let attempt = 1; ; attempt++) {
    try {
      const outcome = await env.store.checkAndSet({ table, key, expected, state, notified });
      if (!outcome.ok) {
        if (outcome.current !== undefined) env.rowCache?.set(table, key, outcome.current);
        done('refused');
        return undefined;
      }
      const fenced = { version: outcome.version, state };
      env.rowCache?.set(table, key, fenced);
      done('fenced');
      return fenced;
    } catch (error) {
      env.rowCache?.delete(table, key);
      // Certainly not applied: the row may still be as it was, so the fence may go again.
      if (!(error instanceof StoreError && error.applied === 'no') || attempt >= FENCE_ATTEMPTS) {
        done('failed');
        return undefined;
      }
      await sleep(backoffMs(attempt, 5, 100));
    }
  }
}

/** Sends of one fence at most, while the store refuses it with certainty ('no'). */
const FENCE_ATTEMPTS = 3;
