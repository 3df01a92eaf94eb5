/**
 * How large a shared call may grow: the peeks of read-only transactions (peek-batcher.ts)
 * and the stamped steps of commits (commit/shared-steps.ts) that a client's transactions
 * send in the same turn go to the store as one call (docs/protocol.md 4.1 and 4.5).
 */

/** Rows in one shared call at most (one transaction's own rows are never split). */
export const MAX_SHARED_ROWS = 64;

/**
 * The largest `sharedCallsInFlight` a store may declare or a client ask for: more calls
 * than rows in one call would split turns of up to 64 rows into calls of one row, no
 * sharing at all.
 */
export const MAX_SHARED_CALLS_IN_FLIGHT = 64;

/**
 * The most rows the call now being filled may take, when `outstanding` rows have been
 * asked for and not answered yet (in calls sent, in this one, and the one now asking) and
 * the client keeps `callsInFlight` shared calls at once (`sharedCallsInFlight`: the
 * store's cost hint, or the client's option): a share
 * of what is outstanding. Under steady load that is about `callsInFlight` calls in flight;
 * a burst from idle goes in more, smaller ones (8 one-row peeks with 3: calls of 1, 1, 2,
 * 3 and 1 rows), as the first calls count towards what later ones may take.
 *
 * Why more than one: under load the replies of one shared call wake all its transactions
 * together, and they ask again together, so with one call per turn the client and the
 * store take turns, each idle while the other works. Where the store's calls are cheap
 * next to the client's own work on a transaction (Redis), a client that splits what it
 * has asked into `callsInFlight` calls works on one call's replies while the store answers
 * the next. Where each call costs the store a statement (PostgreSQL, MariaDB), the fewest
 * calls win: 1, one call per turn.
 */
export function sharedCallRows(outstanding: number, callsInFlight: number): number {
  return Math.min(MAX_SHARED_ROWS, Math.ceil(outstanding / callsInFlight));
}
