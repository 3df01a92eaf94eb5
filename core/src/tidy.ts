import { BoundedMap } from './bounded-map.js';
import {
  findRecord,
  GARBAGE_BATCH,
  heldRecords,
  heldWorthSettling,
  markMoving,
  pruneCell,
  pruneDue,
  recordsThatMayBeMoving,
  rowNeedsTidy,
} from './cells.js';
import { decodeRow, encodeVersionRow } from './codec.js';
import { rowId } from './commit/context.js';
import type { ProtocolEnv, RowTidier } from './env.js';
import type { TidyEvent } from './events.js';
import { rollForwardCells } from './lock-resolver.js';
import type { TidyOptions, TidyReport } from './reports.js';
import type { RowState } from './row-state.js';
import { readRow, updateRow, updateRows } from './row-update.js';
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

function part(column: string, ts: number): string {
  return `${column}\u0000${ts}`;
}

/** Rows whose released commit records this client remembers at most (the oldest are forgotten). */
const MAX_RELEASED_ROWS = 10_000;

/** Version rows whose store version this client remembers at most (the oldest are forgotten). */
const MAX_KNOWN_VERSION_ROWS = 20_000;

export type { TidyOptions, TidyReport } from './reports.js';

export class Tidier implements RowTidier {
  /** Rows being tidied by this client: a write meanwhile asks for another round. */
  private readonly running = new Map<string, { again: boolean; known: StoredRow | undefined }>();
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

  /** Called after every head-row write: forgets applied releases, schedules the tidy step if the row asks for it. */
  afterWrite(table: string, key: string, state: RowState | null, stored: StoredRow | null | undefined): void {
    if (!this.released.empty && state) this.forgetApplied(table, key, state);
    const needed = state !== null && rowNeedsTidy(state, this.env.prune, this.env.clock(), GARBAGE_BATCH);
    const running = this.running.size > 0 ? this.running.get(rowId(table, key)) : undefined;
    if (running) {
      // The newest write decides whether another round is needed, and from which state: a
      // round's own head CAS lands on top of every write before it, so when its row asks
      // for nothing more, an earlier write's request is settled. Another round from that
      // earlier state would create the same version rows again (found there) and then lose
      // its head CAS to the newer row.
      running.again = needed;
      running.known = needed ? (stored ?? undefined) : undefined;
      return;
    }
    if (needed) this.schedule(table, key, stored ?? undefined);
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

  private schedule(table: string, key: string, known: StoredRow | undefined): void {
    const id = rowId(table, key);
    const entry = { again: false, known };
    this.running.set(id, entry);
    const job = (async () => {
      // Round after round while writes keep asking: a round that stopped early would leave
      // the last write's marks for a write that may never come. A store that keeps failing
      // ends the loop; the marks stay in the row for the next write, or gc.
      let failed = 0;
      for (;;) {
        const from = entry.known;
        entry.again = false;
        entry.known = undefined;
        const ok = await this.tidyRow(table, key, from, {}, 'background').then(
          () => true,
          () => false,
        );
        failed = ok ? 0 : failed + 1;
        if (!entry.again || failed >= MAX_FAILED_ROUNDS) break;
      }
    })().finally(() => this.running.delete(id));
    const { background } = this.env;
    background.add(job);
    void job.finally(() => background.delete(job));
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
    const events = this.env.events;
    if (!events) return this.tidyPass(table, key, known, options, trigger);
    const time = performance.now();
    let report: TidyReport | undefined;
    let failure: unknown;
    try {
      report = await this.tidyPass(table, key, known, options, trigger);
      return report;
    } catch (error) {
      failure = error;
      throw error;
    } finally {
      events.emit({
        type: 'tidy',
        store: events.store,
        table,
        row: key,
        trigger,
        report,
        time,
        durationMs: performance.now() - time,
        ...(failure !== undefined ? { error: failure } : {}),
      });
    }
  }

  private async tidyPass(
    table: string,
    key: string,
    known: StoredRow | null | undefined,
    options: TidyOptions,
    trigger: TidyEvent['trigger'],
  ): Promise<TidyReport> {
    const { env } = this;
    const report: TidyReport = { moved: 0, movedBytes: 0, deleted: 0, settled: 0 };
    let stored: StoredRow | null | undefined = known === undefined ? await readRow(env, table, key) : known;
    if (options.force) {
      ({ stored } = await updateRow(env, table, key, stored, (state) => {
        let changed = false;
        for (const cell of state?.cells.values() ?? []) if (markMoving(cell, 'force')) changed = true;
        return changed ? { write: state!, result: undefined } : { done: undefined };
      }));
    }
    if (stored === undefined) stored = await readRow(env, table, key);
    if (!stored) return report;
    const state = decodeRow(stored.state);
    const now = env.clock();
    const settleAll = options.force === true || options.settleHeld === true;
    if (
      !options.force &&
      // In the background, garbage waits for a batch (GARBAGE_BATCH); asked for, it goes now.
      !rowNeedsTidy(state, env.prune, now, trigger === 'background' ? GARBAGE_BATCH : 1) &&
      !(settleAll && [...state.cells.values()].some((c) => heldRecords(c, env.prune, now).length > 0))
    )
      return report;

    const vt = versionTable(table);
    const creates: { id: string; bytes: number; request: CasRequest }[] = [];
    const garbage: { id: string; ref: RowRef }[] = [];
    const held: { id: string; startTs: number; commitTs: number; rows: readonly RowRef[] }[] = [];
    for (const [column, cell] of state.cells) {
      for (const rec of recordsThatMayBeMoving(cell)) {
        if (rec.value !== 'moving') continue;
        const value = cell.valueAt(rec.startTs);
        if (!value) continue;
        creates.push({
          id: part(column, rec.startTs),
          bytes: value.length,
          request: {
            table: vt,
            key: versionKey(key, column, rec.startTs),
            expected: null,
            state: encodeVersionRow(value),
          },
        });
      }
      for (const ts of cell.garbage)
        garbage.push({ id: part(column, ts), ref: { table: vt, key: versionKey(key, column, ts) } });
      const past = heldRecords(cell, env.prune, now);
      if (past.length > 0 && (settleAll || heldWorthSettling(past))) {
        for (const rec of past) {
          const rows = (rec.secondaries ?? []).map((r) => ({ table: r.table, key: r.row }));
          held.push({ id: part(column, rec.startTs), startTs: rec.startTs, commitTs: rec.commitTs, rows });
        }
      }
    }
    const [created, deleted, settled] = await Promise.all([
      this.createVersions(creates),
      this.deleteVersions(garbage),
      this.settleSecondaries(held),
    ]);
    if (created.size + deleted.size + settled.size === 0) return report;
    await updateRow(env, table, key, stored, (current) => {
      if (!current) return { done: undefined };
      let changed = false;
      const at = env.clock();
      for (const [column, cell] of current.cells) {
        let cellChanged = false;
        const records = settled.size > 0 ? cell.writes : recordsThatMayBeMoving(cell);
        for (const rec of records) {
          const id = part(column, rec.startTs);
          if (rec.value === 'moving' && created.has(id)) {
            rec.value = 'moved';
            cell.dropValue(rec.startTs);
            cellChanged = true;
          }
          if (rec.secondaries && settled.has(id)) {
            rec.secondaries = undefined;
            cellChanged = true;
          }
        }
        const left = cell.garbage.filter((ts) => !deleted.has(part(column, ts)));
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
    });
    report.moved = created.size;
    for (const c of creates) if (created.has(c.id)) report.movedBytes += c.bytes;
    report.deleted = deleted.size;
    report.settled = settled.size;
    return report;
  }

  /** Create-only writes: "already there" counts as done, since a version row's content is unique to its name. */
  private async createVersions(
    creates: readonly { id: string; request: CasRequest }[],
  ): Promise<Set<string>> {
    const done = new Set<string>();
    if (creates.length === 0) return done;
    const results = await this.casAll(creates.map((c) => c.request));
    for (const [i, c] of creates.entries()) {
      const r = results[i];
      if (r && (r.ok || r.current !== null)) done.add(c.id);
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
      const results = await this.casAll(deletes.map((d) => ({ ...d.ref, expected: d.version, state: null })));
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
