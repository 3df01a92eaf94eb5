/**
 * Stopping a client at a named commit step, as if its process died there: an onCommitStep
 * hook that throws ClientCrash. The client then makes no further store call for that
 * transaction; its locks stay until they expire and readers resolve them.
 */
import { ClientCrash, type CommitStep, type CommitStepEvent, type Transaction } from '@percolator/core';

export interface StopPoint {
  readonly step: CommitStep;
  /** For 'afterPrewrite': stop after the primary's (true) or a secondary's (false) prewrite. */
  readonly isPrimary?: boolean;
}

function matches(point: StopPoint, e: CommitStepEvent): boolean {
  return point.step === e.step && (point.isPrimary === undefined || point.isPrimary === e.isPrimary);
}

/**
 * A hook that stops the first transaction reaching `point` (every one, with `once: false`).
 * Pass it as `new Percolator({ hooks: { onCommitStep: stopAt(...) } })`.
 */
export function stopAt(point: StopPoint, options: { once?: boolean } = {}): (e: CommitStepEvent) => void {
  let stopped = false;
  return (e) => {
    if ((stopped && options.once !== false) || !matches(point, e)) return;
    stopped = true;
    throw new ClientCrash(
      `client stopped at ${e.step}${e.isPrimary === undefined ? '' : ` (isPrimary ${e.isPrimary})`}`,
    );
  };
}

/**
 * What a transaction stopped at `point` certainly did: the commit point is the primary's
 * commit, so a stop before it leaves the transaction uncommitted (readers roll it back), a
 * stop after it committed (readers roll its secondaries forward).
 */
export function stopOutcome(point: StopPoint): 'ok' | 'fail' {
  return point.step === 'afterCommitPrimary' || point.step === 'afterCommitSecondary' ? 'ok' : 'fail';
}

/**
 * Stop points chosen per transaction (for randomised workloads), keyed by the transaction
 * itself: not by its start timestamp, which a peeked snapshot shares with others and its
 * commit does not carry (docs/protocol.md 4.10).
 */
export class CrashPlans {
  // Weak: a plan whose stop never comes (a one-step commit has no prewrite) goes with its
  // transaction. Never dropped when commit() resolves: stops among the secondaries fire later.
  private readonly plans = new WeakMap<object, StopPoint>();

  /**
   * Called whenever a planned stop fires. A stop among the secondaries fires after
   * commit() resolved (they are committed in the background), so count stops here.
   */
  constructor(private readonly onStop?: (point: StopPoint) => void) {}

  set(transaction: Transaction, point: StopPoint): void {
    this.plans.set(transaction, point);
  }

  /** The onCommitStep hook to build the client with. */
  readonly hook = (e: CommitStepEvent): void => {
    const plan = this.plans.get(e.transaction);
    if (plan === undefined || !matches(plan, e)) return;
    this.plans.delete(e.transaction);
    this.onStop?.(plan);
    throw new ClientCrash(`planned stop at ${e.step}`);
  };
}
