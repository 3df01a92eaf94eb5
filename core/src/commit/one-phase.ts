import { backoffMs, sleep } from '../backoff.js';
import { addRecord, findRecord, movingBlocks, tidyCell } from '../cells.js';
import { encodeVersionBlock, STAMP } from '../codec.js';
import {
  CommitUnknownError,
  ConflictError,
  PercolatorError,
  RowTooLargeError,
  StoreError,
} from '../errors.js';
import { cellOf, emptyRow, type RowState, rowHasNotification } from '../row-state.js';
import {
  AmbiguousOutcome,
  type AttemptInfo,
  encodeReserving,
  Guess,
  type Known,
  knownOrGuess,
  notAppliedAfter,
  type RowDecision,
  updateRow,
} from '../row-update.js';
import type { CasRequest, RowRef, StoredRow } from '../store.js';
import { writeStampInPlace } from '../store.js';
import { versionKey, versionTable } from '../versions.js';
import {
  alive,
  BlockedByLock,
  type CommitContext,
  decodeKnown,
  notAborted,
  type RowMutations,
  reserveFor,
  rowId,
} from './context.js';
import { fence } from './fence.js';
import {
  applyPrewrite,
  relievePressure,
  settleBlockingLock,
  underPressure,
  withLockResolution,
} from './prewrite.js';

/**
 * One-phase commit (docs/protocol.md 4.5): where the store draws the commit timestamp
 * inside the atomic write itself, a transaction whose rows fit one such write commits in
 * that one step, with no locks: no prewrite, no commit point apart from it, no
 * secondaries. A reader that draws a later timestamp sees every row of it, because the
 * store made the draw and the writes one atomic step.
 */

/**
 * The rows of a one-phase commit as written: our records, stamped STAMP, and the data.
 * The conflict check is the prewrite's (a newer write, a foreign lock), without a lock.
 */
function applyOnePhase(ctx: CommitContext, m: RowMutations, state: RowState): void {
  applyPrewrite(ctx, m, state, 'none');
  const now = ctx.env.clock();
  for (const [column, value] of m.cells) {
    const cell = cellOf(state, column);
    addRecord(cell, {
      commitTs: STAMP,
      startTs: ctx.startTs,
      kind: value ? 'put' : 'delete',
      wallTimeMs: now,
      value: 'inline',
    });
    tidyCell(cell, ctx.env.prune, now);
  }
}

/** Most version rows (blocks) one step carries; values past it stay `moving`, for the tidy step. */
export const MAX_CARRIED_VERSIONS = 32;

/**
 * Values this commit marked `moving` (cells.ts, markMoving) leave the head row in the same
 * one-step write: their version rows (one per block) go with it, created with `expected:
 * null` (format 19, with the stamp slot every row of the step gets), and their records say
 * `moved` already.
 * The step is atomic, so the head row never names a version row that is not there, and no
 * tidy pass, with its read and its head-row CAS racing the next commit, is needed for them.
 * A version row `present` (created by a tidy pass that then lost its head-row CAS, or that
 * crashed) holds every value the head row still names in that block, since its name is
 * unique to the block and a block only loses records (cells.ts, markMoving): they are
 * marked `moved` without it being written again.
 */
function carryMoves(
  table: string,
  key: string,
  state: RowState,
  present: ReadonlySet<string>,
  out: (CasRequest & { readonly state: Uint8Array })[],
): void {
  const vt = versionTable(table);
  for (const [column, cell] of state.cells) {
    for (const { block, entries } of movingBlocks(cell)) {
      const vkey = versionKey(key, column, block);
      if (!present.has(rowId(vt, vkey))) {
        if (out.length >= MAX_CARRIED_VERSIONS) return;
        const values = entries.map(({ rec, value }) => ({ startTs: rec.startTs, value }));
        out.push({ table: vt, key: vkey, expected: null, state: encodeVersionBlock(values, true) });
      }
      for (const { rec } of entries) {
        rec.value = 'moved';
        cell.dropValue(rec.startTs);
      }
    }
  }
}

/**
 * After a write whose outcome is unknown, the row `state` (undefined: absent) says whether
 * this transaction landed: its commit timestamp if it did, undefined if nothing of it is
 * there (the write was not applied). Throws where that cannot be told.
 */
function landedOn(ctx: CommitContext, state: RowState | undefined, column: string): number | undefined {
  const { startTs } = ctx;
  if (startTs === STAMP) {
    // Its records have no identity the client knows before the reply: never a second write
    // (the callers fence a row still as the write expected it first, fence.ts).
    throw new CommitUnknownError(
      ctx.snapshotTs === undefined
        ? 'a one-phase blind write (start and commit timestamp drawn by the store) could not be verified'
        : 'a one-phase commit of a peeked snapshot (its rows name it by the timestamp the store drew) could not be verified',
      undefined,
    );
  }
  const cell = state?.cells.get(column);
  const landed = cell ? findRecord(cell, startTs) : undefined;
  if (landed && landed.kind !== 'rollback') return landed.commitTs;
  if (landed) throw new ConflictError(`transaction ${startTs} was rolled back by another client`);
  if (cell && startTs <= cell.prunedThrough) {
    throw new CommitUnknownError('a one-phase commit could not be verified', startTs);
  }
  return undefined;
}

/**
 * A single-row transaction in one stamped CAS. The usual row loop (`updateRow`, stamped)
 * sends it; after an unknown outcome the decision finds our own record, a
 * rollback record, or nothing it can trust.
 *
 * With `startTs` STAMP (a blind write that never drew a start timestamp): the one drawn
 * value is both its start and its commit timestamp. It read nothing, so its snapshot
 * matters only for the write-write check, and at the instant of the atomic step no record
 * on the row can be newer. Such a record has no identity the client knows before the
 * reply, so a lost reply is CommitUnknownError (never a second write), unless the row is
 * still at the version the write expected: then it is fenced (fence.ts) and sent again. A peeked
 * snapshot's commit (docs/protocol.md 4.10) is the same, with its conflict check at the
 * snapshot (`ctx.snapshotTs`).
 */
export async function commitOnePhase(ctx: CommitContext): Promise<number> {
  const { env, startTs } = ctx;
  const m = ctx.rows[0]!;
  const id = rowId(m.table, m.row);
  const reportedStart = startTs === STAMP ? undefined : startTs;
  const decide = (current: RowState | undefined, attempt: AttemptInfo): RowDecision<number> => {
    alive(ctx);
    if (attempt.ambiguous) {
      const landed = landedOn(ctx, current, ctx.primary.column);
      if (landed !== undefined) return { done: landed };
    } else {
      const record = current ? findRecord(cellOf(current, ctx.primary.column), startTs) : undefined;
      if (record && record.kind !== 'rollback') return { done: record.commitTs };
      if (record) throw new ConflictError(`transaction ${startTs} was rolled back by another client`);
      // Once a stamped CAS may have landed, only its fate counts, not the caller's signal.
      notAborted(ctx);
    }
    const state = current ?? emptyRow();
    applyOnePhase(ctx, m, state);
    return { write: state, result: STAMP, reserve: reserveFor(m) };
  };
  const send = async (known: Known) => {
    // Fenced after a lost reply where its records carry no identity we know (fence.ts).
    const fenceLost = startTs === STAMP ? { transaction: ctx.trace } : undefined;
    const { result, timestamp } = await updateRow(env, m.table, m.row, known, decide, false, true, fenceLost);
    return timestamp ?? result;
  };
  const unknown = (error: AmbiguousOutcome) =>
    new CommitUnknownError('a one-phase commit could not be verified', reportedStart, {
      cause: error.cause,
    });
  return withLockResolution(ctx, m, async (attempt) => {
    // A row this transaction never read (a blind write): the client's last sight of it, as
    // a guess. One stamped CAS then commits it, with no read first.
    const known = attempt === 0 ? knownOrGuess(env, m.table, m.row, ctx.knownRows.get(id)) : undefined;
    try {
      return await send(known);
    } catch (error) {
      if (error instanceof AmbiguousOutcome) throw unknown(error);
      if (!(error instanceof RowTooLargeError)) throw error;
      // Old values still inline: move them out once, then try again (nothing was sent).
      await relieve(ctx, m, false);
      return await send(undefined).catch((again: unknown) => {
        throw again instanceof AmbiguousOutcome ? unknown(again) : again;
      });
    }
  });
}

/**
 * relievePressure before a one-step commit is sent (again): its tidy pass is not the
 * commit, so a tidy write whose outcome it could not verify (the internal AmbiguousOutcome)
 * fails the commit as not applied, retryable, as the two-phase path does; or as unknown
 * where an earlier send of this commit was (`ambiguous`). Found in review: it escaped as
 * the internal error, not retryable.
 */
async function relieve(ctx: CommitContext, m: RowMutations, ambiguous: boolean): Promise<void> {
  try {
    await relievePressure(ctx, m);
  } catch (error) {
    if (!(error instanceof AmbiguousOutcome)) throw error;
    if (ambiguous)
      throw new CommitUnknownError(
        'a one-phase commit could not be verified',
        ctx.startTs === STAMP ? undefined : ctx.startTs,
        { cause: error.cause },
      );
    throw notAppliedAfter(
      error,
      'moving old values out before a one-step commit could not be verified; nothing was committed',
    );
  }
}

/** Notes which carried version rows a refused step found there (read where not returned). */
async function notePresent(
  env: CommitContext['env'],
  carried: readonly CasRequest[],
  current: readonly (StoredRow | null | undefined)[] | undefined,
  present: Set<string>,
): Promise<void> {
  const unread: RowRef[] = [];
  for (const [j, v] of carried.entries()) {
    const row = current?.[j];
    if (row) present.add(rowId(v.table, v.key));
    else if (row === undefined) unread.push({ table: v.table, key: v.key });
  }
  if (unread.length === 0) return;
  const rows = await Promise.all(unread.map((ref) => env.reader.read(ref.table, ref.key)));
  for (const [j, ref] of unread.entries()) if (rows[j]) present.add(rowId(ref.table, ref.key));
}

/**
 * A failure after a refused step (reading its carried version rows): the step wrote
 * nothing, whatever the read's error says, so it fails as nothing applied ('no'). A store
 * that reports a lost read reply as 'unknown' would otherwise make the commit uncertain of
 * a step it knows was refused: a fence or a CommitUnknownError for nothing, and the
 * caller's abort signal ignored on the next attempt.
 */
function refusedThen(error: unknown): unknown {
  if (error instanceof StoreError && error.applied === 'no') return error;
  return new StoreError(
    `reading version rows after a refused step failed: ${error instanceof Error ? error.message : String(error)}`,
    'no',
    { cause: error, retryable: error instanceof PercolatorError && error.retryable },
  );
}

/** The retry budgets of the many-row loop, as `updateRow`'s. */
const MAX_ATTEMPTS = 64;
const MAX_STORE_FAILURES = 8;

/**
 * A multi-row transaction in one `checkAndSetStampedMany`: every row decided as a
 * one-phase commit (conflict check, records stamped STAMP), then written all at once or
 * not at all. A lost race (some row changed since it was read) re-reads and decides every
 * row again; a foreign lock is settled as a prewrite settles it; after an unknown outcome
 * the primary row tells whether the write landed, since it landed on every row or none.
 * Resolves to undefined, having written nothing, when the store says the rows are too
 * large for one step: the caller commits them in two phases.
 */
export async function commitOnePhaseMany(ctx: CommitContext): Promise<number | undefined> {
  const { env, startTs } = ctx;
  const { rows } = ctx;
  const cache = env.rowCache;
  const reportedStart = startTs === STAMP ? undefined : startTs;
  // Index loops throughout: this runs on every commit, and `entries()` allocates per row.
  const ids: string[] = [];
  for (const m of rows) ids.push(rowId(m.table, m.row));
  for (let i = 0; i < rows.length; i++) {
    const m = rows[i]!;
    if (underPressure(ctx, ctx.knownRows.get(ids[i]!))) await relieve(ctx, m, false);
  }
  // What is known of each row: as this transaction read it, else the client's last sight of
  // it (a guess: a decision on it that is not a write is made again on the row as read).
  const known: (StoredRow | null | undefined)[] = [];
  const guessed: boolean[] = [];
  for (let i = 0; i < rows.length; i++) {
    const m = rows[i]!;
    const k = knownOrGuess(env, m.table, m.row, ctx.knownRows.get(ids[i]!));
    known.push(k instanceof Guess ? k.row : k);
    guessed.push(k instanceof Guess);
  }
  let ambiguous = false;
  let failures = 0;
  let lockRounds = 0;
  let relieved = false;
  let carry = true;
  const present = new Set<string>();
  let lastError: unknown;
  /** What the last step whose outcome is unknown expected of each row (for the fence). */
  let lost: readonly (string | null)[] | undefined;
  // After an unknown outcome, only an error that says it landed or did not is certain.
  const unknown = (cause: unknown) =>
    cause instanceof CommitUnknownError
      ? cause
      : new CommitUnknownError('a one-phase commit could not be verified', reportedStart, { cause });
  for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
    alive(ctx);
    const missing: number[] = [];
    for (let i = 0; i < rows.length; i++) if (known[i] === undefined) missing.push(i);
    if (missing.length > 0) {
      try {
        const read = await Promise.all(missing.map((i) => env.reader.read(rows[i]!.table, rows[i]!.row)));
        for (const [j, i] of missing.entries()) {
          known[i] = read[j]!;
          guessed[i] = false;
          cache?.set(rows[i]!.table, rows[i]!.row, read[j]!);
        }
      } catch (error) {
        throw ambiguous ? unknown(error) : error;
      }
    }
    const states: (RowState | undefined)[] = [];
    for (let i = 0; i < rows.length; i++) {
      states.push(known[i] ? decodeKnown(ctx, ids[i]!, known[i]!) : undefined);
    }
    const sentBefore = lost;
    if (ambiguous && sentBefore) {
      // Named by the store's draw: no record of it can be recognised, but a row still as the
      // lost step expected it can be fenced, and then it never lands (fence.ts).
      for (let i = 0; i < rows.length && ambiguous; i++) {
        const expected = sentBefore[i];
        const row = known[i];
        // A row still as the step expected it: at that version, or absent for a create.
        if (expected === undefined || row === undefined || (row?.version ?? null) !== expected) continue;
        const fenced = await fence(env, rows[i]!.table, rows[i]!.row, row, expected, ctx.trace);
        if (fenced) {
          known[i] = fenced;
          states[i] = decodeKnown(ctx, ids[i]!, fenced);
          ambiguous = false;
          lost = undefined;
          lastError = undefined;
        }
      }
    }
    if (ambiguous) {
      // It landed on every row or on none: any row that carries our record tells.
      for (let i = 0; i < rows.length; i++) {
        const landed = landedOn(ctx, states[i], rows[i]!.cells.keys().next().value!);
        if (landed !== undefined) return landed;
      }
    } else {
      notAborted(ctx); // the last moment a signal counts: the write below commits
    }
    let again = false;
    for (let i = 0; i < rows.length; i++) {
      const m = rows[i]!;
      try {
        alive(ctx);
        states[i] ??= emptyRow();
        applyOnePhase(ctx, m, states[i]!);
      } catch (error) {
        if (guessed[i]) {
          // Decided on a guess: the row as it is decides.
          known[i] = undefined;
          again = true;
          break;
        }
        if (!(error instanceof BlockedByLock)) throw ambiguous ? unknown(error) : error;
        await settleBlockingLock(ctx, m, error.lock, lockRounds++);
        known[i] = undefined;
        again = true;
        break;
      }
    }
    if (again) continue;
    const requests: (CasRequest & { readonly state: Uint8Array })[] = [];
    const carried: (CasRequest & { readonly state: Uint8Array })[] = [];
    for (let i = 0; i < rows.length; i++) {
      const m = rows[i]!;
      const state = states[i]!;
      env.tidier.beforeWrite(m.table, m.row, state);
      if (carry) carryMoves(m.table, m.row, state, present, carried);
      try {
        requests.push({
          table: m.table,
          key: m.row,
          expected: known[i]?.version ?? null,
          state: encodeReserving(env, m.table, m.row, state, reserveFor(m)),
          notified: rowHasNotification(state),
        });
      } catch (error) {
        if (!(error instanceof RowTooLargeError) || relieved) throw ambiguous ? unknown(error) : error;
        // Old values still inline: move them out once, then try again (nothing was sent).
        relieved = true;
        await relieve(ctx, m, ambiguous);
        known[i] = undefined;
        again = true;
        break;
      }
    }
    if (again) continue;
    try {
      // The one step (shared with this turn's other steps where the store can: shared-steps.ts).
      const outcome = await env.steps!.send(carried.length > 0 ? requests.concat(carried) : requests);
      if (outcome.ok) {
        for (let j = 0; j < carried.length; j++) {
          env.tidier.created(carried[j]!.table, carried[j]!.key, outcome.versions[rows.length + j]!);
        }
        for (let i = 0; i < rows.length; i++) {
          const m = rows[i]!;
          // The states are this step's own encodings, and the store is done with them.
          const stored = {
            version: outcome.versions[i]!,
            state: writeStampInPlace(requests[i]!.state, outcome.timestamp),
          };
          cache?.set(m.table, m.row, stored);
          env.tidier.afterWrite(m.table, m.row, states[i]!, stored);
        }
        return outcome.timestamp;
      }
      // Lost a race: decide again on the rows as they are now (read where not returned).
      for (let i = 0; i < rows.length; i++) {
        const m = rows[i]!;
        const current = outcome.current?.[i];
        known[i] = current;
        guessed[i] = false;
        if (current !== undefined) cache?.set(m.table, m.row, current);
      }
      // A carried version row that is there already is not written again (carryMoves).
      if (carried.length > 0) {
        await notePresent(env, carried, outcome.current?.slice(rows.length), present).catch(
          (error: unknown) => {
            throw ambiguous ? unknown(error) : refusedThen(error);
          },
        );
      }
    } catch (error) {
      // The rows do not fit one step of this store (its message limit, say): nothing was
      // sent. Without carried version rows, then with none, two phases take them.
      if (error instanceof RowTooLargeError && !ambiguous) {
        if (carried.length === 0) return undefined;
        carry = false;
        for (const [i] of rows.entries()) known[i] = undefined;
        continue;
      }
      lastError = error;
      if (!(error instanceof StoreError && error.applied === 'no')) {
        ambiguous = true;
        // Only the store's own 'unknown' is fenced (as in updateRow).
        lost = startTs === STAMP && error instanceof StoreError ? requests.map((r) => r.expected) : undefined;
      }
      for (const [i, m] of rows.entries()) {
        known[i] = undefined;
        cache?.delete(m.table, m.row);
      }
      if (++failures >= MAX_STORE_FAILURES) break;
      await sleep(backoffMs(failures, 5, 500));
    }
  }
  if (ambiguous) throw unknown(lastError);
  throw (
    lastError ??
    new StoreError(
      `the rows of transaction ${startTs} changed on every one of ${MAX_ATTEMPTS} attempts`,
      'no',
    )
  );
}
