import { backoffMs, sleep } from './backoff.js';
import { addRecord, findRecord, hasWriteAtOrAfter, pruneCell } from './cells.js';
import { decodeRow } from './codec.js';
import { type CommitStepEvent, observedKey, type ProtocolEnv } from './env.js';
import {
  CommitUnknownError,
  ConflictError,
  RowTooLargeError,
  SnapshotTooOldError,
  StoreError,
} from './errors.js';
import { isLockExpired, resolveLock, rollBackCells, rollForwardCells } from './lock-resolver.js';
import { type CellRef, cellOf, emptyRow, type Lock, type RowState, rowHasNotification } from './row-state.js';
import { AmbiguousOutcome, encodeState, readRow, updateRow } from './row-update.js';
import type { CasRequest, CasResult, StoredRow } from './store.js';

/**
 * Two-phase commit (PROTOCOL.md section 4): prewrite every row, take a commit
 * timestamp, commit the primary (the commit point), then commit the secondaries.
 * Each step is a named function below; `commitTransaction` runs them in order.
 */

/** The buffered writes of one row: column -> value, or null for a delete. */
export interface RowMutations {
  readonly table: string;
  readonly row: string;
  readonly cells: ReadonlyMap<string, Uint8Array | null>;
  /** Weak notifications (`tx.notify`) on this row: marked in the prewrite CAS, lock-free. */
  readonly notify?: ReadonlySet<string> | undefined;
}

export interface CommitContext {
  readonly env: ProtocolEnv;
  readonly startTs: number;
  readonly rows: readonly RowMutations[];
  readonly primary: CellRef;
  /** Rows as this transaction last saw them: the expected version for the first CAS. */
  readonly knownRows: Map<string, StoredRow | null>;
  /** Set once a hook simulated a crash: the client makes no further store call. */
  crashed: unknown;
}

export function rowId(table: string, row: string): string {
  return `${table}\u0000${row}`;
}

function isPrimaryRow(ctx: CommitContext, m: RowMutations): boolean {
  return m.table === ctx.primary.table && m.row === ctx.primary.row;
}

/** A lock held by another transaction blocked our prewrite. */
class BlockedByLock extends Error {
  constructor(readonly lock: Lock) {
    super('row is locked by another transaction');
  }
}

async function step(ctx: CommitContext, event: Omit<CommitStepEvent, 'startTs'>): Promise<void> {
  if (ctx.crashed !== undefined) throw ctx.crashed;
  const hook = ctx.env.hooks.onCommitStep;
  if (!hook) return;
  try {
    await hook({ ...event, startTs: ctx.startTs });
  } catch (error) {
    ctx.crashed = error;
    throw error;
  }
}

function alive(ctx: CommitContext): void {
  if (ctx.crashed !== undefined) throw ctx.crashed;
}

/**
 * The prewrite rule for one row, applied to `state` in place: fail on a newer write or a
 * foreign lock, else store data and a lock for each written cell. Returns false if every
 * lock is ours already (an earlier ambiguous attempt landed).
 */
export function applyPrewrite(
  ctx: CommitContext,
  m: RowMutations,
  state: RowState,
  lockAs: 'lock' | 'none',
): boolean {
  const { env, startTs } = ctx;
  let changed = false;
  const now = env.clock();
  for (const [column, value] of m.cells) {
    const cell = cellOf(state, column);
    if (cell.lock?.startTs === startTs) continue;
    if (cell.lock) throw new BlockedByLock(cell.lock);
    if (startTs <= cell.prunedThrough) {
      throw new SnapshotTooOldError(`history of ${m.table}/${column} was pruned past start ${startTs}`);
    }
    if (hasWriteAtOrAfter(cell, startTs)) {
      throw new ConflictError(`write conflict on ${m.table}/${JSON.stringify(m.row)}/${column}`);
    }
    if (value) cell.data.set(startTs, value);
    if (lockAs === 'lock') {
      cell.lock = {
        startTs,
        primary: ctx.primary,
        kind: value ? 'put' : 'delete',
        ttlMs: env.lockTtlMs,
        wallTimeMs: now,
      };
    }
    // Section 8: the notification is written before the commit point.
    if (env.observed.has(observedKey(m.table, column))) cell.notifyTs = startTs;
    changed = true;
  }
  // Weak notifications ride along in the same CAS, outside the conflict check.
  if (changed) {
    for (const column of m.notify ?? []) {
      const cell = cellOf(state, column);
      cell.notifyTs = Math.max(cell.notifyTs, startTs);
    }
  }
  return changed;
}

/**
 * Runs `attemptOnce` (one prewrite-style CAS loop); when a foreign lock blocks it, a live
 * owner wins (the paper aborts the newcomer) and an abandoned lock is resolved first.
 */
async function withLockResolution<T>(
  ctx: CommitContext,
  m: RowMutations,
  attemptOnce: () => Promise<T>,
): Promise<T> {
  const { env } = ctx;
  for (let attempt = 0; ; attempt++) {
    alive(ctx);
    try {
      return await attemptOnce();
    } catch (error) {
      if (!(error instanceof BlockedByLock)) throw error;
      const blocked = () =>
        new ConflictError(
          `${m.table}/${JSON.stringify(m.row)} is locked by transaction ${error.lock.startTs}`,
        );
      if (!isLockExpired(error.lock, env.clock())) throw blocked();
      ctx.knownRows.delete(rowId(m.table, m.row));
      if ((await resolveLock(env, m.table, m.row, error.lock)) === 'alive' || attempt >= 3) throw blocked();
    }
  }
}

/** Prewrite one row: check for conflicts, then store data and a lock per written cell, in one CAS. */
export async function prewrite(ctx: CommitContext, m: RowMutations): Promise<void> {
  const id = rowId(m.table, m.row);
  await withLockResolution(ctx, m, async () => {
    const { stored } = await updateRow(ctx.env, m.table, m.row, ctx.knownRows.get(id), (state) => {
      const next = state ?? { cells: new Map() };
      return applyPrewrite(ctx, m, next, 'lock') ? { write: next, result: undefined } : { done: undefined };
    });
    if (stored !== undefined) ctx.knownRows.set(id, stored);
  });
}

/**
 * A single-row transaction in one CAS: the store draws the commit timestamp from the
 * oracle's own counter inside the same atomic step as the write, so no reader can take a
 * later start timestamp and still miss it. Only used when the store offers that.
 */
export async function commitOnePhase(ctx: CommitContext, counter: string): Promise<number> {
  const { env, startTs } = ctx;
  const m = ctx.rows[0]!;
  const id = rowId(m.table, m.row);
  return withLockResolution(ctx, m, async () => {
    let current = ctx.knownRows.get(id);
    let ambiguous = false;
    for (let attempt = 0; attempt < 64; attempt++) {
      alive(ctx);
      if (current === undefined) current = await readRow(env, m.table, m.row);
      const state = current ? decodeRow(current.state) : { cells: new Map() };
      const primaryCell = cellOf(state, ctx.primary.column);
      const landed = findRecord(primaryCell, startTs);
      if (landed && landed.kind !== 'rollback') return landed.commitTs;
      if (landed) throw new ConflictError(`transaction ${startTs} was rolled back by another client`);
      if (ambiguous && startTs <= primaryCell.prunedThrough) {
        throw new CommitUnknownError('a one-phase commit could not be verified', startTs);
      }
      applyPrewrite(ctx, m, state, 'none');
      const build = (commitTs: number) => {
        const now = env.clock();
        for (const [column, value] of m.cells) {
          const cell = cellOf(state, column);
          addRecord(cell, {
            commitTs,
            startTs,
            kind: value ? 'put' : 'delete',
            wallTimeMs: now,
            secondariesPending: false,
          });
          pruneCell(cell, env.prune, now);
        }
        return encodeState(env, m.table, m.row, state);
      };
      try {
        const outcome = await env.store.checkAndSetStamped!(
          {
            table: m.table,
            key: m.row,
            expected: current?.version ?? null,
            notified: rowHasNotification(state),
          },
          counter,
          build,
        );
        if (outcome.ok && outcome.timestamp !== undefined) return outcome.timestamp;
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

/**
 * The commit point: in one CAS on the primary row, replace our locks with write records.
 * If our lock is gone, a commit record for our startTs means an earlier ambiguous attempt
 * succeeded; otherwise another client rolled us back.
 */
export async function commitPrimary(ctx: CommitContext, commitTs: number): Promise<number> {
  const { env, startTs, primary } = ctx;
  const m = ctx.rows.find((r) => isPrimaryRow(ctx, r))!;
  const hasSecondaries = ctx.rows.length > 1;
  alive(ctx);
  try {
    const { result } = await updateRow<number>(
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
            const pending = hasSecondaries && column === primary.column;
            addRecord(c, {
              commitTs,
              startTs,
              kind: lock.kind,
              wallTimeMs: now,
              secondariesPending: pending,
            });
            pruneCell(c, env.prune, now);
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
    );
    return result;
  } catch (error) {
    if (error instanceof AmbiguousOutcome) {
      throw new CommitUnknownError(`commit of transaction ${startTs} could not be verified`, startTs, {
        cause: error.cause,
      });
    }
    throw error;
  }
}

/** After the commit point: replace each secondary lock with its write record. Failures are left to readers. */
export async function commitSecondary(
  ctx: CommitContext,
  m: RowMutations,
  commitTs: number,
): Promise<boolean> {
  const { env, startTs } = ctx;
  alive(ctx);
  try {
    await updateRow(env, m.table, m.row, ctx.knownRows.get(rowId(m.table, m.row)), (state) =>
      // Every lock of our startTs in this row is one of ours; none left: a reader rolled it forward.
      state && rollForwardCells(env, state, startTs, commitTs)
        ? { write: state, result: undefined }
        : { done: undefined },
    );
    return true;
  } catch (error) {
    if (ctx.crashed !== undefined) throw error;
    return false;
  }
}

/**
 * The first attempt of `prewrite` for every row at once, in one `checkAndSetMany` round
 * trip (and one coalesced read of the rows not read yet). Throws a conflict before
 * sending anything. Returns, per row: 'done', or 'retry': the row goes through
 * `prewrite` on its own, which re-reads it and decides again. That covers a lost race, a
 * lock to resolve, and a batch whose outcome is unknown: `applyPrewrite` recognises a lock
 * of ours that did land, so nothing is written twice.
 */
async function prewriteBatch(ctx: CommitContext): Promise<Map<RowMutations, 'done' | 'retry'>> {
  const { env } = ctx;
  const outcome = new Map<RowMutations, 'done' | 'retry'>();
  let conflict: unknown;
  await Promise.all(
    ctx.rows
      .filter((m) => !ctx.knownRows.has(rowId(m.table, m.row)))
      .map((m) =>
        env.reader.read(m.table, m.row).then(
          (row) => ctx.knownRows.set(rowId(m.table, m.row), row),
          () => undefined, // left unknown: retried on its own
        ),
      ),
  );
  alive(ctx);
  const batch: { m: RowMutations; request: CasRequest }[] = [];
  for (const m of ctx.rows) {
    const known = ctx.knownRows.get(rowId(m.table, m.row));
    if (known === undefined) {
      outcome.set(m, 'retry');
      continue;
    }
    const state = known ? decodeRow(known.state) : emptyRow();
    try {
      if (!applyPrewrite(ctx, m, state, 'lock')) {
        outcome.set(m, 'done');
        continue;
      }
      const bytes = encodeState(env, m.table, m.row, state);
      batch.push({
        m,
        request: {
          table: m.table,
          key: m.row,
          expected: known?.version ?? null,
          state: bytes,
          notified: rowHasNotification(state),
        },
      });
    } catch (error) {
      if (!(error instanceof BlockedByLock)) conflict ??= error;
      outcome.set(m, 'retry');
    }
  }
  // A conflict fails the transaction: send nothing more.
  if (conflict !== undefined) throw conflict;
  if (batch.length === 0) return outcome;
  let results: CasResult[] | undefined;
  try {
    results = await env.store.checkAndSetMany!(batch.map((b) => b.request));
  } catch {
    results = undefined;
  }
  for (const [i, { m, request }] of batch.entries()) {
    const id = rowId(m.table, m.row);
    const result = results?.length === batch.length ? results[i]! : undefined;
    if (result?.ok) {
      ctx.knownRows.set(id, { version: result.version, state: request.state! });
      outcome.set(m, 'done');
    } else {
      if (result?.current !== undefined) ctx.knownRows.set(id, result.current);
      else ctx.knownRows.delete(id);
      outcome.set(m, 'retry');
    }
  }
  return outcome;
}

/** Prewrites every row: batched where the store allows it, each straggler on its own. */
async function prewriteAll(ctx: CommitContext, heartbeat: Heartbeat): Promise<void> {
  const { store } = ctx.env;
  const first =
    ctx.rows.length > 1 && store.capabilities.batchCheckAndSet && store.checkAndSetMany
      ? await prewriteBatch(ctx)
      : new Map<RowMutations, 'done' | 'retry'>();
  const settled = await Promise.allSettled(
    ctx.rows.map(async (m) => {
      if (first.get(m) !== 'done') await prewrite(ctx, m);
      const isPrimary = isPrimaryRow(ctx, m);
      if (isPrimary) heartbeat.start();
      await step(ctx, { step: 'afterPrewrite', table: m.table, row: m.row, isPrimary });
    }),
  );
  alive(ctx);
  const failed = settled.find((s): s is PromiseRejectedResult => s.status === 'rejected');
  if (failed) throw failed.reason;
}

/**
 * Commits the secondaries: in one `checkAndSetMany` where the store allows it, built from
 * the rows as our prewrites left them; a row that changed since (a reader rolled it
 * forward) or a batch whose outcome is unknown goes through `commitSecondary` on its own.
 * Returns whether every secondary is known to be committed.
 */
async function commitSecondaries(ctx: CommitContext, commitTs: number): Promise<boolean> {
  const { env, startTs } = ctx;
  const secondaries = ctx.rows.filter((m) => !isPrimaryRow(ctx, m));
  const done = new Set<RowMutations>();
  if (secondaries.length > 1 && env.store.capabilities.batchCheckAndSet && env.store.checkAndSetMany) {
    alive(ctx);
    const batch: { m: RowMutations; request: CasRequest }[] = [];
    for (const m of secondaries) {
      const known = ctx.knownRows.get(rowId(m.table, m.row));
      if (!known) continue;
      const state = decodeRow(known.state);
      if (!rollForwardCells(env, state, startTs, commitTs)) continue;
      try {
        const bytes = encodeState(env, m.table, m.row, state);
        const request = { table: m.table, key: m.row, expected: known.version, state: bytes };
        batch.push({ m, request: { ...request, notified: rowHasNotification(state) } });
      } catch {
        // Left to commitSecondary, which reports it.
      }
    }
    const results = await env.store.checkAndSetMany!(batch.map((b) => b.request)).catch(() => undefined);
    if (results?.length === batch.length) {
      for (const [i, { m }] of batch.entries()) if (results[i]!.ok) done.add(m);
    }
  }
  const committed = await Promise.all(
    secondaries.map(async (m) => {
      const ok = done.has(m) || (await commitSecondary(ctx, m, commitTs));
      await step(ctx, { step: 'afterCommitSecondary', table: m.table, row: m.row, commitTs });
      return ok;
    }),
  );
  return committed.every(Boolean);
}

/**
 * Once every secondary is committed, the primary's commit record no longer has to
 * outlive pruning: clear its `secondariesPending` flag.
 */
export async function releasePrimaryRecord(ctx: CommitContext): Promise<void> {
  const { env, startTs, primary } = ctx;
  await updateRow(env, primary.table, primary.row, undefined, (state) => {
    const record = state?.cells.get(primary.column)?.writes.find((r) => r.startTs === startTs);
    if (!state || !record?.secondariesPending) return { done: undefined };
    record.secondariesPending = false;
    pruneCell(cellOf(state, primary.column), env.prune, env.clock());
    return { write: state, result: undefined };
  });
}

/**
 * Before the commit point: remove our locks and leave a rollback record on the primary,
 * so a late prewrite of this transaction fails. Best effort: readers do the same.
 */
export async function rollbackTransaction(ctx: CommitContext): Promise<void> {
  const { env, startTs, primary } = ctx;
  if (ctx.crashed !== undefined) return;
  const settle = (m: RowMutations, decide: (state: RowState) => boolean) =>
    updateRow(env, m.table, m.row, undefined, (state) => {
      const next = state ?? { cells: new Map() };
      return decide(next) ? { write: next, result: undefined } : { done: undefined };
    }).catch(() => undefined);
  const primaryRow = ctx.rows.find((r) => isPrimaryRow(ctx, r))!;
  await settle(primaryRow, (state) => {
    const removed = rollBackCells(state, startTs);
    const cell = cellOf(state, primary.column);
    if (findRecord(cell, startTs)) return removed;
    addRecord(cell, {
      commitTs: startTs,
      startTs,
      kind: 'rollback',
      wallTimeMs: env.clock(),
      secondariesPending: false,
    });
    return true;
  });
  await Promise.all(
    ctx.rows.filter((r) => !isPrimaryRow(ctx, r)).map((r) => settle(r, (s) => rollBackCells(s, startTs))),
  );
}

/** Keeps the primary lock fresh while a commit runs long, so readers don't roll back a live transaction. */
export class Heartbeat {
  private timer: NodeJS.Timeout | undefined;
  private beat: Promise<unknown> = Promise.resolve();
  private stopped = false;

  constructor(private readonly ctx: CommitContext) {}

  start(): void {
    const interval = Math.max(1, Math.floor(this.ctx.env.lockTtlMs / 3));
    const tick = () => {
      if (this.stopped || this.ctx.crashed !== undefined) return;
      this.beat = this.refresh()
        .catch(() => undefined)
        .finally(() => {
          if (!this.stopped) this.timer = setTimeout(tick, interval).unref();
        });
    };
    this.timer = setTimeout(tick, interval).unref();
  }

  private async refresh(): Promise<void> {
    const { env, startTs, primary } = this.ctx;
    const { stored } = await updateRow(env, primary.table, primary.row, undefined, (state) => {
      const lock = state?.cells.get(primary.column)?.lock;
      if (!state || lock?.startTs !== startTs) return { done: undefined };
      lock.wallTimeMs = env.clock();
      return { write: state, result: undefined };
    });
    if (stored !== undefined) this.ctx.knownRows.set(rowId(primary.table, primary.row), stored);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.beat;
  }
}

/** Runs the steps in order and returns the commit timestamp. */
export async function commitTransaction(ctx: CommitContext): Promise<number> {
  const commitTs = await reachCommitPoint(ctx);
  await step(ctx, { step: 'afterCommitPrimary', commitTs });
  if (ctx.rows.length > 1 && (await commitSecondaries(ctx, commitTs))) {
    const release = releasePrimaryRecord(ctx).catch(() => undefined);
    ctx.env.background.add(release);
    void release.finally(() => ctx.env.background.delete(release));
  }
  return commitTs;
}

/** Prewrites, the commit timestamp and the primary commit; rolls back on any failure before the commit point. */
async function reachCommitPoint(ctx: CommitContext): Promise<number> {
  const heartbeat = new Heartbeat(ctx);
  try {
    await step(ctx, { step: 'beforePrewrite' });
    await prewriteAll(ctx, heartbeat);
    const commitTs = await ctx.env.oracle.next();
    await step(ctx, { step: 'beforeCommitPrimary', commitTs });
    await heartbeat.stop();
    return await commitPrimary(ctx, commitTs);
  } catch (error) {
    await heartbeat.stop();
    alive(ctx);
    if (error instanceof CommitUnknownError) throw error;
    await rollbackTransaction(ctx);
    if (error instanceof AmbiguousOutcome) {
      throw new StoreError('a prewrite could not be verified; the transaction was rolled back', 'no', {
        cause: error.cause,
      });
    }
    throw error;
  }
}
