import { backoffMs, sleep } from './backoff.js';
import { findRecord } from './cells.js';
import { decodeRowAt } from './codec.js';
import type { ProtocolEnv } from './env.js';
import { primaryFate } from './inspect.js';
import { resolveLock } from './lock-resolver.js';
import type { Cell, Lock, WriteRecord } from './row-state.js';
import { readRow } from './row-update.js';

/**
 * Settling the locks of one row on an operator's request (`percolator resolve`), through
 * the same resolver a reader uses (lock-resolver.ts): the primary decides every fate, and
 * a lock whose owner may still be committing is never broken. A live owner refreshes its
 * primary lock every lockTtlMs/3, so only a dead owner's locks ever expire.
 */

export interface ResolveOptions {
  /**
   * How long to wait for live locks to be settled by their owner or to expire, retrying
   * with backoff as a reader does (a reader waits lockWaitMs). Default 0: report them.
   */
  readonly waitMs?: number;
  /** Stops the wait early (the locks still live are reported). */
  readonly signal?: AbortSignal;
  /**
   * Called as each lock is settled (rolled forward or back, or found released by its owner
   * while the call waited), before the next is looked at:
   * should a later step fail, the caller knows what was already done (the resolver's writes
   * are not undone by a failure after them). Live locks are only in the result. An error
   * it throws ends the call.
   */
  readonly onSettled?: (lock: ResolvedLock) => void;
}

/** What resolveLocks found and did for one lock. */
export interface ResolvedLock {
  readonly column: string;
  readonly startTs: number;
  readonly primary: { readonly table: string; readonly row: string; readonly column: string };
  /** Whether this cell is its transaction's primary. */
  readonly isPrimary: boolean;
  readonly outcome:
    | { readonly action: 'rolled-forward'; readonly commitTs: number }
    | { readonly action: 'rolled-back' }
    /**
     * Live when first seen, and gone while the call waited (`waitMs`): settled by its owner
     * (or a reader). Such a lock was left out of the result, and an operator who waited on
     * a lock read "no locks".
     */
    | {
        readonly action: 'released';
        /** Its transaction's fate, from its record here or on its primary; 'unknown' when neither holds one. */
        readonly fate: 'committed' | 'rolled-back' | 'unknown';
        /** With fate 'committed'. */
        readonly commitTs?: number;
      }
    /**
     * Its owner may still be committing: left alone. `expiresInMs`: until its primary's lock
     * expires (a heartbeat extends it; a secondary lock's own TTL does not count), or the
     * lock found's while the primary holds no lock of the transaction.
     */
    | {
        readonly action: 'alive';
        readonly expiresInMs: number;
        /**
         * Seen refreshed while the call waited: the primary's lock was rewritten by its
         * owner's heartbeat (its wall time grew). Its owner is alive and still committing:
         * waiting longer settles it only once the owner finishes or stops.
         */
        readonly refreshed?: true;
      };
}

export async function resolveRowLocks(
  env: ProtocolEnv,
  table: string,
  row: string,
  options: ResolveOptions = {},
): Promise<ResolvedLock[]> {
  const waitUntil = performance.now() + (options.waitMs ?? 0);
  const done = new Map<string, ResolvedLock>();
  let alive: ResolvedLock[] = [];
  const aliveLocks = new Map<string, Lock>();
  /** The wall time of each live lock's primary lock when first seen. */
  const firstPrimaryWall = new Map<string, number>();
  for (let attempt = 0; ; attempt++) {
    const stored = await readRow(env, table, row);
    const locks: { column: string; lock: Lock }[] = [];
    const cells = stored ? decodeRowAt(stored.state, table, row).cells : undefined;
    if (cells)
      for (const [column, cell] of cells)
        if (cell.lock && !done.has(`${column}\u0000${cell.lock.startTs}`))
          locks.push({ column, lock: cell.lock });
    // Live last round and gone now: its owner (or a reader) settled it meanwhile. Its primary
    // tells which way (a secondary's lock leaves before its primary decides only when its
    // transaction is being rolled back).
    for (const was of alive) {
      const id = `${was.column}\u0000${was.startTs}`;
      if (locks.some((l) => `${l.column}\u0000${l.lock.startTs}` === id)) continue;
      const fate = await releasedFate(env, cells?.get(was.column), aliveLocks.get(id)!);
      const released: ResolvedLock = { ...was, outcome: { action: 'released', ...fate } };
      done.set(id, released);
      options.onSettled?.(released);
    }
    alive = [];
    aliveLocks.clear();
    // Locks of one transaction share a primary: settle them one after another, so the
    // first settles the primary and the rest only read its verdict.
    for (const { column, lock } of locks) {
      const fate = await resolveLock(env, table, row, lock, undefined, 'operator');
      const p = lock.primary;
      const base = {
        column,
        startTs: lock.startTs,
        primary: { ...p },
        isPrimary: p.table === table && p.row === row && p.column === column,
      };
      if (fate === 'alive') {
        const { expiresInMs, primaryWallTimeMs } = await expiresIn(env, lock, base.isPrimary);
        const id = `${column}\u0000${lock.startTs}`;
        // A heartbeat rewrites the primary lock's wall time: seen larger than at first sight,
        // the owner is alive. (Judged by elapsed time, a slow read or a clock step looked like
        // a beat: review.)
        const first = firstPrimaryWall.get(id);
        if (first === undefined && primaryWallTimeMs !== undefined)
          firstPrimaryWall.set(id, primaryWallTimeMs);
        const refreshed = first !== undefined && primaryWallTimeMs !== undefined && primaryWallTimeMs > first;
        alive.push({
          ...base,
          outcome: { action: 'alive', expiresInMs, ...(refreshed ? { refreshed } : {}) },
        });
        aliveLocks.set(id, lock);
      } else {
        const settled: ResolvedLock = {
          ...base,
          outcome: fate.committed
            ? { action: 'rolled-forward', commitTs: fate.commitTs }
            : { action: 'rolled-back' },
        };
        done.set(`${column}\u0000${lock.startTs}`, settled);
        options.onSettled?.(settled);
      }
    }
    if (alive.length === 0 || performance.now() >= waitUntil || options.signal?.aborted) break;
    await sleep(
      Math.min(
        waitUntil - performance.now(),
        Math.max(10, backoffMs(attempt, 5, Math.max(10, env.lockTtlMs / 4))),
      ),
      options.signal,
    );
  }
  return [...done.values(), ...alive];
}

/**
 * How long a live lock has before a reader may roll its transaction back: its primary's
 * lock decides (only it is refreshed by the heartbeat, so a secondary of a long commit is
 * past its own TTL while its owner is alive); one more read of the primary for a secondary.
 */
async function expiresIn(
  env: ProtocolEnv,
  lock: Lock,
  isPrimary: boolean,
): Promise<{ expiresInMs: number; primaryWallTimeMs?: number }> {
  const now = env.clock();
  let decider: { wallTimeMs: number; ttlMs: number } = lock;
  let fromPrimary = isPrimary;
  if (!isPrimary) {
    const fate = await primaryFate(env.store, lock, now);
    if (fate.state === 'pending' && fate.primaryLock) {
      decider = fate.primaryLock;
      fromPrimary = true;
    }
  }
  return {
    expiresInMs: Math.max(0, decider.wallTimeMs + decider.ttlMs - now),
    ...(fromPrimary ? { primaryWallTimeMs: decider.wallTimeMs } : {}),
  };
}

/**
 * The fate of a lock that left this row while the call waited: its record in the row as
 * just read (a commit record of its startTs, or on a primary a rollback record), else its
 * record in the primary's cell; 'unknown' when neither holds one (pruned meanwhile, or the
 * transaction still being rolled back). Never "did not commit" for want of a record: a
 * committed transaction's record may be pruned once its locks are settled (review).
 */
async function releasedFate(
  env: ProtocolEnv,
  cell: Cell | undefined,
  lock: Lock,
): Promise<
  { readonly fate: 'committed'; readonly commitTs: number } | { readonly fate: 'rolled-back' | 'unknown' }
> {
  const verdict = (rec: WriteRecord | undefined) =>
    rec === undefined
      ? undefined
      : rec.kind === 'rollback'
        ? ({ fate: 'rolled-back' } as const)
        : ({ fate: 'committed', commitTs: rec.commitTs } as const);
  const own = verdict(cell ? findRecord(cell, lock.startTs) : undefined);
  if (own) return own;
  const p = lock.primary;
  const primaryRow = await readRow(env, p.table, p.row);
  const primaryCell = primaryRow
    ? decodeRowAt(primaryRow.state, p.table, p.row).cells.get(p.column)
    : undefined;
  return verdict(primaryCell ? findRecord(primaryCell, lock.startTs) : undefined) ?? { fate: 'unknown' };
}
