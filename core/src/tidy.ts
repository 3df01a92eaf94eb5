import { nextTurn } from './backoff.js';
import { BoundedMap } from './bounded-map.js';
import {
  findRecord,
  GARBAGE_BATCH,
  heldRecords,
  heldWorthSettling,
  markMoving,
  movingBlocks,
  pruneCell,
  pruneDue,
  recordsThatMayBeMoving,
  rowNeedsTidy,
} from './cells.js';
import { decodeRow, encodeVersionBlock } from './codec.js';
import { rowId } from './commit/context.js';
import { detached } from './detached.js';
import { keepInBackground, type ProtocolEnv, type RowTidier } from './env.js';
import type { TidyEvent } from './events.js';
import type { TidyOptions, TidyReport } from './reports.js';
import { blockOf, type RowState } from './row-state.js';
import { type RowDecision, readRow, updateRow, updateRows } from './row-update.js';
import { rollForwardCells } from './settle-cells.js';
import type { CasRequest, CasResult, RowRef, StoredRow } from './store.js';
import { versionKey, versionTable } from './versions.js';

/**
 * The tidy step (docs/protocol.md section 7): the work a head row asks for once a commit
 * has marked it, done in the background after the commit, never on its critical path.
 *
 * 1. Create the version rows of `moving` values (create-only, one batch), delete the
 *    version rows named in `garbage` (read, then delete, one batch each), and settle the
 *    secondaries of held commit records (roll forward any lock they still hold, exactly as
 *    a reader would).
 * 2. One CAS on the head row: confirmed moves become `moved` and drop their inline copy,
 *    confirmed deletions leave `garbage`, settled records drop their secondaries list (and
 *    may then be pruned).
 *
 * The head row names a version row (as `moving`) before anyone creates it, and forgets it
 * only once its deletion is confirmed, so a crash at any point leaves a name, never an
 * orphan: the next commit on the row, or `gc`, picks the work up again.
 */

/** Failed rounds in a row after which a row's tidy step is left for the next write, or gc. */
const MAX_FAILED_ROUNDS = 3;

/** An id within a batch of tidy passes: the row's index in the batch, the column, a startTs (a block's anchor, a garbage name, a held record's). */
function part(row: number, column: string, ts: number): string {
  return `${row}\u0000${column}\u0000${ts}`;
}

/** Most rows in one batch of background tidy passes, and most batches in flight per client. */
const MAX_BATCH_ROWS = 64;
const MAX_BATCHES_IN_FLIGHT = 2;
/**
 * How long a batch waits for more rows after the first one asks (docs/protocol.md 7.5).
 * The work a commit leaves is never urgent (`moving` values are still inline, names in
 * `garbage` only cost bytes), and waiting lets the rows of many commits share one batch of
 * calls, and the writes of a hot row share one pass. A full batch starts at once, and
 * `flush()` / `close()` start a waiting one (`hurry`).
 */
export const TIDY_DELAY_MS = 20;

/** A row waiting for, or in, a batch of background tidy passes. */
interface TidyEntry {
  readonly table: string;
  readonly key: string;
  /** The row as its newest write left it, if known: the next pass starts from it. */
  known: StoredRow | undefined;
  /** A write landed during the row's pass and asked for another one. */
  again: boolean;
  /** Passes in a row that failed. */
  failed: number;
}

interface TidyTarget {
  readonly table: string;
  readonly key: string;
  readonly known: StoredRow | null | undefined;
}

/** A confirmed block: the startTs of the values this pass wrote to it, or `present` (found there). */
type Confirmed = ReadonlySet<number> | 'present';

/** `force`: every superseded value still inline is marked `moving`, so the pass moves it. */
function markAllMoving(blockBytes: number): (state: RowState | undefined) => RowDecision<undefined> {
  return (state) => {
    let changed = false;
    for (const cell of state?.cells.values() ?? []) if (markMoving(cell, 'force', blockBytes)) changed = true;
    return changed ? { write: state!, result: undefined } : { done: undefined };
  };
}

/**
 * The head-row CAS of a tidy pass, decided on the row as it is now: confirmed moves become
 * `moved` and drop their inline copy, confirmed deletions leave `garbage`, settled records
 * drop their secondaries list (and may then be pruned). `row` is the row's index in the batch.
 */
function recordConfirmed(
  env: ProtocolEnv,
  current: RowState | undefined,
  row: number,
  created: ReadonlyMap<string, Confirmed>,
  deleted: ReadonlySet<string>,
  /** Settled records, and whether any is this row's (only then is the whole history looked at). */
  settled: ReadonlySet<string>,
  settledHere: boolean,
): RowDecision<undefined> {
  if (!current) return { done: undefined };
  let changed = false;
  const at = env.clock();
  for (const [column, cell] of current.cells) {
    let cellChanged = false;
    const records = settledHere ? cell.writes : recordsThatMayBeMoving(cell);
    for (const rec of records) {
      // A block holds every value its records name (cells.ts, markMoving): once it is
      // found there, every `moving` record naming it is moved; once this pass created it,
      // those whose values it wrote.
      const confirmed = rec.value === 'moving' ? created.get(part(row, column, blockOf(rec))) : undefined;
      if (confirmed && (confirmed === 'present' || confirmed.has(rec.startTs))) {
        rec.value = 'moved';
        cell.dropValue(rec.startTs);
        cellChanged = true;
      }
      if (rec.secondaries && settled.has(part(row, column, rec.startTs))) {
        rec.secondaries = undefined;
        cellChanged = true;
      }
    }
    const left = cell.garbage.filter((ts) => !deleted.has(part(row, column, ts)));
    if (left.length !== cell.garbage.length) {
      cell.garbage = left;
      cellChanged = true;
    }
    if (cellChanged) {
      // Records freed of their secondaries list may go, with the next batch a commit
      // would prune (cells.ts, pruneDue); their version rows then become garbage.
      if (pruneDue(cell, env.prune, at)) pruneCell(cell, env.prune, at);
      changed = true;
    }
  }
  return changed ? { write: current, result: undefined } : { done: undefined };
}

/** Rows whose released commit records this client remembers at most (the oldest are forgotten). */
const MAX_RELEASED_ROWS = 10_000;

/** Version rows whose store version this client remembers at most (the oldest are forgotten). */
const MAX_KNOWN_VERSION_ROWS = 20_000;

export type { TidyOptions, TidyReport } from './reports.js';

export class Tidier implements RowTidier {
  /**
   * Rows that asked for the tidy step and have not finished it: waiting for the next batch
   * (in `queue`) or in one. A write meanwhile updates the entry (afterWrite).
   */
  private readonly running = new Map<string, TidyEntry>();
  /** Rows waiting for the next batch, in the order they asked. */
  private readonly queue = new Map<string, TidyEntry>();
  /** Batches in flight (at most MAX_BATCHES_IN_FLIGHT), and whether a start is already scheduled. */
  private inFlight = 0;
  private startScheduled = false;
  /** A scheduled start still waiting out TIDY_DELAY_MS: its timer, and how to start it now. */
  private delayed: { timer: ReturnType<typeof setTimeout>; start: () => void } | undefined;
  /**
   * Commit records of this client's own transactions whose secondaries it saw committed:
   * row id -> column -> startTs. Their lists are dropped in the next write of that row this
   * client makes anyway, so a committed transaction costs no extra write, and GC has
   * fewer lists to check. Forgetting one is safe: GC then settles that record itself.
   */
  private readonly released = new BoundedMap<string, Map<string, Set<number>>>(MAX_RELEASED_ROWS);
  /**
   * The store version of each version row this client created (row id -> version), so that
   * deleting it once pruned needs no read first: a version row never changes after it is
   * created, and a version token never names another incarnation of a row. Forgetting one
   * only costs that read.
   */
  private readonly createdVersions = new BoundedMap<string, string>(MAX_KNOWN_VERSION_ROWS);

  constructor(private readonly env: ProtocolEnv) {}

  /** Every secondary of the transaction at `startTs` is committed: its primary record may drop its list. */
  release(table: string, key: string, column: string, startTs: number): void {
    const id = rowId(table, key);
    let columns = this.released.get(id);
    if (!columns) {
      columns = new Map();
      this.released.set(id, columns);
    }
    let stamps = columns.get(column);
    if (!stamps) columns.set(column, (stamps = new Set()));
    stamps.add(startTs);
  }

  /** Called on every head-row state about to be written: drops the lists this client released. */
  beforeWrite(table: string, key: string, state: RowState): void {
    if (this.released.empty) return;
    const columns = this.released.get(rowId(table, key));
    if (!columns) return;
    for (const [column, stamps] of columns) {
      const cell = state.cells.get(column);
      if (!cell) continue;
      for (const ts of stamps) {
        const rec = findRecord(cell, ts);
        if (rec?.secondaries) rec.secondaries = undefined;
      }
    }
  }

  created(table: string, key: string, version: string): void {
    this.createdVersions.set(rowId(table, key), version);
  }

  /** Called after every head-row write: forgets applied releases, queues the tidy step if the row asks for it. */
  afterWrite(table: string, key: string, state: RowState | null, stored: StoredRow | null | undefined): void {
    if (!this.released.empty && state) this.forgetApplied(table, key, state);
    const needed = state !== null && rowNeedsTidy(state, this.env.prune, this.env.clock(), GARBAGE_BATCH);
    const id = this.running.size > 0 || needed ? rowId(table, key) : undefined;
    const entry = id !== undefined ? this.running.get(id) : undefined;
    if (entry) {
      // The newest write decides whether another round is needed, and from which state: a
      // round's own head CAS lands on top of every write before it, so when its row asks
      // for nothing more, an earlier write's request is settled. Another round from that
      // earlier state would create the same version rows again (found there) and then lose
      // its head CAS to the newer row.
      entry.again = needed;
      entry.known = needed ? (stored ?? undefined) : undefined;
      // A write that asks counts its rounds afresh: failures before it (lost to the writes
      // of a burst, say) never leave the last write of the burst untidied.
      if (needed) entry.failed = 0;
      if (!needed && this.queue.has(id!)) {
        this.queue.delete(id!);
        this.running.delete(id!);
      }
      return;
    }
    if (needed) this.enqueue(id!, { table, key, known: stored ?? undefined, again: false, failed: 0 });
  }

  private forgetApplied(table: string, key: string, state: RowState): void {
    const id = rowId(table, key);
    const columns = this.released.get(id);
    if (!columns) return;
    for (const [column, stamps] of columns) {
      const cell = state.cells.get(column);
      for (const ts of stamps) {
        const rec = cell && findRecord(cell, ts);
        if (!rec?.secondaries) stamps.delete(ts);
      }
      if (stamps.size === 0) columns.delete(column);
    }
    if (columns.size === 0) this.released.delete(id);
  }

  /**
   * Rows go out in batches: one batch of version-row creates, one of deletes and one of
   * head-row CAS for all of them (`tidyPasses`), instead of a round of store calls per row.
   * A batch starts TIDY_DELAY_MS after its first row asks (at once when full), so the rows
   * of every commit in that window share it (a multi-row commit queues every row it wrote),
   * and while batches are in flight the rows that ask meanwhile wait for the next one, so
   * under load a batch grows with the load and the calls per row shrink.
   */
  private enqueue(id: string, entry: TidyEntry): void {
    this.running.set(id, entry);
    this.queue.set(id, entry);
    if (this.queue.size >= MAX_BATCH_ROWS) this.hurry();
    this.startBatches();
  }

  private startBatches(): void {
    if (this.startScheduled || this.queue.size === 0 || this.inFlight >= MAX_BATCHES_IN_FLIGHT) return;
    this.startScheduled = true;
    // The batches serve every commit queued, in no caller's context (detached.ts).
    detached(() => this.scheduleBatches());
  }

  private scheduleBatches(): void {
    const { background } = this.env;
    const job = new Promise<void>((resolve) => {
      // A full batch goes on the next turn; else it waits TIDY_DELAY_MS for more rows, or
      // until `hurry`. The next turn, not now: every row the current turn's commit writes
      // is queued by then.
      if (this.queue.size >= MAX_BATCH_ROWS) return nextTurn(resolve);
      const start = () => {
        clearTimeout(delayed.timer);
        if (this.delayed === delayed) this.delayed = undefined;
        nextTurn(resolve);
      };
      const delayed = { timer: setTimeout(start, TIDY_DELAY_MS), start };
      this.delayed = delayed;
    }).then(() => {
      this.startScheduled = false;
      const runs: Promise<void>[] = [];
      while (this.queue.size > 0 && this.inFlight < MAX_BATCHES_IN_FLIGHT) runs.push(this.runBatch());
      return Promise.all(runs);
    });
    keepInBackground(background, job);
  }

  /** Starts a batch that is waiting out TIDY_DELAY_MS now (`flush()`, `close()`). */
  hurry(): void {
    this.delayed?.start();
  }

  /** Takes up to MAX_BATCH_ROWS queued rows and runs their passes as one batch. */
  private async runBatch(): Promise<void> {
    const batch: [string, TidyEntry][] = [];
    for (const [id, entry] of this.queue) {
      if (batch.length >= MAX_BATCH_ROWS) break;
      batch.push([id, entry]);
    }
    this.inFlight++;
    const targets = batch.map(([id, entry]) => {
      this.queue.delete(id);
      const target = { table: entry.table, key: entry.key, known: entry.known };
      entry.again = false;
      entry.known = undefined;
      return target;
    });
    try {
      const outcomes = await this.tidyPasses(targets, {}, 'background');
      // Again while writes keep asking, and after a failed round (a lost race, a store
      // failure), up to MAX_FAILED_ROUNDS in a row: a row left alone would keep the last
      // write's marks for a write that may never come. A row whose rounds keep failing is
      // left for the next write, or gc: its marks stay in the head row.
      for (const [i, [id, entry]] of batch.entries()) {
        const ok = outcomes[i]!.status === 'fulfilled';
        entry.failed = ok ? 0 : entry.failed + 1;
        if ((entry.again || !ok) && entry.failed < MAX_FAILED_ROUNDS) {
          entry.again = false;
          this.queue.set(id, entry);
        } else {
          this.running.delete(id);
        }
      }
    } finally {
      this.inFlight--;
      this.startBatches();
    }
  }

  /**
   * One tidy pass over one head row; `gc` and a writer under pressure call it directly.
   * `trigger` names the caller in the `tidy` event.
   */
  async tidyRow(
    table: string,
    key: string,
    known?: StoredRow | null,
    options: TidyOptions = {},
    trigger: TidyEvent['trigger'] = 'gc',
  ): Promise<TidyReport> {
    const [outcome] = await this.tidyPasses([{ table, key, known }], options, trigger);
    if (outcome!.status === 'rejected') throw outcome!.reason;
    return outcome!.value;
  }

  /**
   * Tidy passes over several head rows as one batch (one row for `tidyRow`): the rows not
   * known are read, then one batch creates the version rows of their `moving` values, one
   * deletes the version rows their `garbage` names, one settles held records, and one CAS
   * per head row (one `checkAndSetMany` where the store has it, `updateRows`) records what
   * was confirmed. Each row's pass succeeds or fails on its own, with its own `tidy` event.
   */
  private async tidyPasses(
    targets: readonly TidyTarget[],
    options: TidyOptions,
    trigger: TidyEvent['trigger'],
  ): Promise<PromiseSettledResult<TidyReport>[]> {
    const events = this.env.events;
    if (!events) return this.passes(targets, options, trigger);
    const time = performance.now();
    const outcomes = await this.passes(targets, options, trigger);
    const durationMs = performance.now() - time;
    // Field by field, no spread: a busy client runs a pass every few commits.
    for (let i = 0; i < targets.length; i++) {
      const target = targets[i]!;
      const outcome = outcomes[i]!;
      events.emit({
        type: 'tidy',
        store: events.store,
        table: target.table,
        row: target.key,
        trigger,
        report: outcome.status === 'fulfilled' ? outcome.value : undefined,
        time,
        durationMs,
        error: outcome.status === 'rejected' ? outcome.reason : undefined,
      });
    }
    return outcomes;
  }

  private async passes(
    targets: readonly TidyTarget[],
    options: TidyOptions,
    trigger: TidyEvent['trigger'],
  ): Promise<PromiseSettledResult<TidyReport>[]> {
    const { env } = this;
    const failed: ({ error: unknown } | undefined)[] = targets.map(() => undefined);
    const stored = await Promise.all(
      targets.map(async ({ table, key, known }, i): Promise<StoredRow | null> => {
        try {
          let row: StoredRow | null | undefined =
            known === undefined ? await readRow(env, table, key) : known;
          if (options.force)
            ({ stored: row } = await updateRow(
              env,
              table,
              key,
              row,
              markAllMoving(env.prune.versionBlockBytes ?? 0),
            ));
          return row === undefined ? await readRow(env, table, key) : row;
        } catch (error) {
          failed[i] = { error };
          return null;
        }
      }),
    );
    const now = env.clock();
    const settleAll = options.force === true || options.settleHeld === true;
    // Ids unique across the batch: the row's index, the column, a startTs (a block's anchor,
    // a garbage name, a held record's).
    // A create's id names its block (the anchor); a record's move is confirmed by its block's.
    const creates: { id: string; row: number; bytes: number; values: number[]; request: CasRequest }[] = [];
    const garbage: { id: string; row: number; ref: RowRef }[] = [];
    const held: { id: string; row: number; startTs: number; commitTs: number; rows: readonly RowRef[] }[] =
      [];
    const work: number[] = [];
    for (const [i, { table, key }] of targets.entries()) {
      const row = stored[i];
      if (failed[i] || !row) continue;
      let state: RowState;
      try {
        state = decodeRow(row.state);
      } catch (error) {
        failed[i] = { error };
        continue;
      }
      if (
        !options.force &&
        // In the background, garbage waits for a batch (GARBAGE_BATCH); asked for, it goes now.
        !rowNeedsTidy(state, env.prune, now, trigger === 'background' ? GARBAGE_BATCH : 1) &&
        !(settleAll && [...state.cells.values()].some((c) => heldRecords(c, env.prune, now).length > 0))
      )
        continue;
      work.push(i);
      const vt = versionTable(table);
      for (const [column, cell] of state.cells) {
        for (const { block, entries, bytes } of movingBlocks(cell)) {
          creates.push({
            id: part(i, column, block),
            row: i,
            bytes,
            values: entries.map(({ rec }) => rec.startTs),
            request: {
              table: vt,
              key: versionKey(key, column, block),
              expected: null,
              state: encodeVersionBlock(entries.map(({ rec, value }) => ({ startTs: rec.startTs, value }))),
            },
          });
        }
        for (const ts of cell.garbage)
          garbage.push({
            id: part(i, column, ts),
            row: i,
            ref: { table: vt, key: versionKey(key, column, ts) },
          });
        const past = heldRecords(cell, env.prune, now);
        if (past.length > 0 && (settleAll || heldWorthSettling(past))) {
          for (const rec of past) {
            const rows = (rec.secondaries ?? []).map((r) => ({ table: r.table, key: r.row }));
            held.push({
              id: part(i, column, rec.startTs),
              row: i,
              startTs: rec.startTs,
              commitTs: rec.commitTs,
              rows,
            });
          }
        }
      }
    }
    const reports: TidyReport[] = targets.map(() => ({ moved: 0, movedBytes: 0, deleted: 0, settled: 0 }));
    const [created, deleted, settled] = await Promise.all([
      this.createVersions(creates),
      this.deleteVersions(garbage),
      this.settleSecondaries(held),
    ]);
    for (const c of creates) {
      if (!created.has(c.id)) continue;
      reports[c.row]!.moved += c.values.length;
      reports[c.row]!.movedBytes += c.bytes;
    }
    for (const g of garbage) if (deleted.has(g.id)) reports[g.row]!.deleted++;
    for (const h of held) if (settled.has(h.id)) reports[h.row]!.settled++;
    const heads = work.filter((i) => {
      const r = reports[i]!;
      return r.moved + r.deleted + r.settled > 0;
    });
    const written = await updateRows(
      env,
      heads.map((i) => ({
        table: targets[i]!.table,
        key: targets[i]!.key,
        known: stored[i],
        decide: (current: RowState | undefined): RowDecision<undefined> =>
          recordConfirmed(env, current, i, created, deleted, settled, reports[i]!.settled > 0),
      })),
    );
    for (const [j, outcome] of written.entries()) {
      if (outcome.status === 'rejected') failed[heads[j]!] = { error: outcome.reason };
    }
    return targets.map((_, i) =>
      failed[i]
        ? { status: 'rejected', reason: failed[i]!.error }
        : { status: 'fulfilled', value: reports[i]! },
    );
  }

  /**
   * Create-only writes of blocks: "already there" counts as done, since a block holds every
   * value its records still name (cells.ts, markMoving). Done: the values written, or `present`.
   */
  private async createVersions(
    creates: readonly { id: string; values: readonly number[]; request: CasRequest }[],
  ): Promise<Map<string, Confirmed>> {
    const done = new Map<string, Confirmed>();
    if (creates.length === 0) return done;
    const results = await this.casAll(creates.map((c) => c.request));
    for (const [i, c] of creates.entries()) {
      const r = results[i];
      if (r?.ok) done.set(c.id, new Set(c.values));
      else if (r && r.current !== null) done.set(c.id, 'present');
      const version = r?.ok ? r.version : r?.current?.version;
      if (version !== undefined) this.createdVersions.set(rowId(c.request.table, c.request.key), version);
    }
    return done;
  }

  /**
   * Deletes each named version row with its version: the one this client remembers from
   * creating it, else the one a read finds; absent counts as done. A remembered version
   * that no longer matches (the row was deleted and created again) fails, and the row as
   * the store returned it with the failure is deleted in a second batch.
   */
  private async deleteVersions(garbage: readonly { id: string; ref: RowRef }[]): Promise<Set<string>> {
    const done = new Set<string>();
    if (garbage.length === 0) return done;
    const { env, createdVersions } = this;
    // Taken before any await: another pass may make the map forget meanwhile.
    const remembered = garbage.map((g) => createdVersions.get(rowId(g.ref.table, g.ref.key)));
    const read = await Promise.all(
      garbage.map((g, i) =>
        remembered[i] !== undefined
          ? { version: remembered[i] }
          : env.reader.read(g.ref.table, g.ref.key).catch(() => undefined),
      ),
    );
    let deletes: { id: string; ref: RowRef; version: string }[] = [];
    for (const [i, g] of garbage.entries()) {
      const row = read[i];
      if (row === null) done.add(g.id);
      else if (row) deletes.push({ id: g.id, ref: g.ref, version: row.version });
    }
    for (let round = 0; round < 2 && deletes.length > 0; round++) {
      const results = await this.casAll(
        deletes.map((d) => ({ table: d.ref.table, key: d.ref.key, expected: d.version, state: null })),
      );
      const again: typeof deletes = [];
      for (const [i, d] of deletes.entries()) {
        const r = results[i];
        if (!r) continue; // unknown: the name stays for the next pass, and so does the version
        createdVersions.delete(rowId(d.ref.table, d.ref.key));
        if (r.ok || r.current === null) done.add(d.id);
        else if (r.current) again.push({ ...d, version: r.current.version });
      }
      deletes = again;
    }
    return done;
  }

  /**
   * Rolls forward, in each secondary row, any lock the held records' transactions still
   * hold there: they are committed (their primary's record says so). Grouped by row, one
   * batch. A record is settled once every one of its rows is.
   */
  private async settleSecondaries(
    held: readonly { id: string; startTs: number; commitTs: number; rows: readonly RowRef[] }[],
  ): Promise<Set<string>> {
    const done = new Set<string>();
    if (held.length === 0) return done;
    const { env } = this;
    const byRow = new Map<string, { ref: RowRef; fates: Map<number, number> }>();
    for (const h of held) {
      for (const ref of h.rows) {
        const id = rowId(ref.table, ref.key);
        let entry = byRow.get(id);
        if (!entry) {
          entry = { ref, fates: new Map() };
          byRow.set(id, entry);
        }
        entry.fates.set(h.startTs, h.commitTs);
      }
    }
    const rows = [...byRow.values()];
    const results = await updateRows(
      env,
      rows.map(({ ref, fates }) => ({
        table: ref.table,
        key: ref.key,
        known: undefined,
        decide: (state: RowState | undefined) => {
          let changed = false;
          for (const [startTs, commitTs] of fates) {
            if (state && rollForwardCells(env, state, startTs, commitTs)) changed = true;
          }
          return changed ? { write: state!, result: undefined } : { done: undefined };
        },
      })),
    );
    const failed = new Set<string>();
    for (const [i, r] of results.entries()) {
      if (r.status === 'rejected') failed.add(rowId(rows[i]!.ref.table, rows[i]!.ref.key));
    }
    for (const h of held) {
      if (h.rows.every((ref) => !failed.has(rowId(ref.table, ref.key)))) done.add(h.id);
    }
    return done;
  }

  /** Independent CAS calls: one batch where the store allows it. `undefined` = unknown. */
  private async casAll(requests: readonly CasRequest[]): Promise<(CasResult | undefined)[]> {
    if (requests.length === 0) return [];
    const { store } = this.env;
    if (requests.length > 1 && store.capabilities.batchCheckAndSet && store.checkAndSetMany) {
      const results = await store.checkAndSetMany(requests).catch(() => undefined);
      if (results?.length === requests.length) return results;
      return requests.map(() => undefined);
    }
    return Promise.all(requests.map((r) => store.checkAndSet(r).catch(() => undefined)));
  }
}
