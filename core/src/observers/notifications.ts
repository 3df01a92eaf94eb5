import { backoffMs, sleep } from '../backoff.js';
import { keepInBackground, type ProtocolEnv } from '../env.js';
import { cellOf, type RowState } from '../row-state.js';
import { updateRow } from '../row-update.js';

/**
 * The non-transactional side of notifications (docs/protocol.md section 8): `notifyTs` is a
 * hint in the row, set and cleared by plain row CAS, never through a lock.
 */

export interface NotifiedCells {
  readonly table: string;
  readonly row: string;
  readonly columns: Iterable<string>;
}

/** Raises `notifyTs` of each cell to at least `ts` (one CAS per row, rows in parallel). */
export async function markNotifications(
  env: ProtocolEnv,
  rows: readonly NotifiedCells[],
  ts: number,
): Promise<void> {
  await Promise.all(
    rows.map(({ table, row, columns }) =>
      updateRow(env, table, row, undefined, (state) => {
        const next: RowState = state ?? { cells: new Map() };
        let changed = false;
        for (const column of columns) {
          const cell = cellOf(next, column);
          if (cell.notifyTs >= ts) continue;
          cell.notifyTs = ts;
          changed = true;
        }
        return changed ? { write: next, result: undefined } : { done: undefined };
      }),
    ),
  );
}

/** Tries of `raiseMarksLater` before it gives up. */
const MARK_ATTEMPTS = 5;

/**
 * The second marks of weak notifications (raised to `commitTs` after the commit point)
 * when they failed: tried again in the background, with backoff, up to MARK_ATTEMPTS times
 * (`db.flush()` and `db.close()` wait for them, as for the secondaries). The commit stands
 * either way; a mark not raised leaves the loss window of a crash at that point
 * (docs/observers.md), which a review found open on a mere store error before this.
 */
export function raiseMarksLater(env: ProtocolEnv, rows: readonly NotifiedCells[], ts: number): void {
  const job = (async () => {
    for (let attempt = 1; attempt <= MARK_ATTEMPTS; attempt++) {
      await sleep(backoffMs(attempt, 20, 1000));
      try {
        await markNotifications(env, rows, ts);
        return;
      } catch {
        // tried again, up to MARK_ATTEMPTS
      }
    }
  })();
  keepInBackground(env.background, job);
}

/**
 * Clears `notify[column]` unless something newer arrived. `seenNotifyTs` is the value read
 * before the observer runs began; `coveredBelow` the smallest startTs among those runs:
 * every write they are known to have seen committed below it. The flag stays if it changed
 * (a newer write or notification), if the cell is locked (a write in flight), or if the
 * newest committed write is at or above `coveredBelow` (some run may have missed it).
 * Returns whether it was cleared.
 */
export async function clearNotification(
  env: ProtocolEnv,
  table: string,
  row: string,
  column: string,
  seenNotifyTs: number,
  coveredBelow: number,
): Promise<boolean> {
  const { result } = await updateRow<boolean>(env, table, row, undefined, (state) => {
    const cell = state?.cells.get(column);
    if (!state || !cell || cell.notifyTs !== seenNotifyTs || cell.lock) return { done: false };
    // The newest put or delete is always among the recent records (row-state.ts, Cell).
    const newest = cell.recent.find((rec) => rec.kind !== 'rollback');
    if (newest && newest.commitTs >= coveredBelow) return { done: false };
    cell.notifyTs = 0;
    // A row left with nothing in it (it held only this notification, or is a row the fence
    // created, docs/protocol.md 4.11) stays, empty: it reads as absent, and a head row is
    // never deleted, so that a one-step commit still on its way that expects it absent can
    // never land on it after its client was told it did not.
    return { write: state, result: true };
  });
  return result;
}
