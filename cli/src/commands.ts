/**
 * The operator commands as functions on an open store: what the CLI runs, and what tests
 * (and programs holding an in-process store, such as the memory store) call directly.
 * Each resolves to an exit code (errors.ts), the data (printed with --json) and readable
 * text. The protocol questions are answered by @percolator/core (inspectHeadRow,
 * primaryFate, scanLocks, scanNotifications, resolveLocks, gc); nothing here decides a fate.
 */
import {
  type CellView,
  DEFAULT_PRUNE_POLICY,
  type GcReport,
  inspectHeadRow,
  isReservedColumn,
  type LockedCell,
  type ObserverAck,
  observerAcks,
  type PendingColumn,
  Percolator,
  type PrimaryFate,
  type PrunePolicy,
  primaryFate,
  type ResolvedLock,
  type RowStore,
  scanLocks,
  scanNotifications,
  type TimestampOracle,
  validateColumn,
  validateRowKey,
  validateUserTable,
  versionRowRef,
} from '@percolator/core';
import { EXIT, type ExitCode, IncompleteError, NotFoundError, UsageError } from './errors.js';
import { ago, bytes, table as columns, duration, plural, shown } from './format.js';

export interface CommandResult<T = unknown> {
  readonly code: ExitCode;
  readonly data: T;
  readonly text: string;
  /** The command declined to act (printed on stderr). */
  readonly refused?: boolean;
  /** Said on stderr after the result, text or --json: what the command could not look at. */
  readonly notes?: string;
}

/** Names are checked before the store is asked anything: a bad one is a usage error. */
function checkNames(table: string, row?: string): void {
  try {
    validateUserTable(table);
    if (row !== undefined) validateRowKey(row);
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
}

/** What is said of tables with no stored row at all: most often misspelt names (stores keep no table list). */
function noRows(tables: readonly string[]): string {
  const one = tables.length === 1;
  return `${one ? 'table' : 'tables'} ${tables.map(shown).join(', ')} ${one ? 'holds' : 'hold'} no rows (${one ? 'is the name' : 'are the names'} right? stores keep no table list)`;
}

/** NotFoundError for a table with no stored row at all. */
async function assertTableHasRows(store: RowStore, table: string): Promise<void> {
  if (!store.capabilities.orderedScan || !store.scan) return;
  if ((await store.scan(table, { limit: 1 })).length === 0) throw new NotFoundError(noRows([table]));
}

/**
 * The CLI's client: it never draws a timestamp (resolving and gc need none), so it
 * cannot move the deployment's oracle, and a composite without a counter works too.
 */
const NO_TIMESTAMPS: TimestampOracle = {
  next: () => Promise.reject(new Error('the operator CLI draws no timestamps')),
};

/**
 * What the CLI prunes when it settles a lock or reads (resolve, dump): nothing. A reader of
 * the deployment prunes with the deployment's policy as it rolls a lock forward; the CLI
 * does not know that policy, and pruning with the library's defaults (60 s) took versions
 * a deployment that keeps an hour still promised its snapshots (a review found it). Only
 * `gc` prunes, with the retention it is given.
 */
export const KEEP_EVERY_VERSION: Partial<PrunePolicy> = {
  retentionMs: Number.POSITIVE_INFINITY,
  maxVersionsPerCell: Number.MAX_SAFE_INTEGER,
};

function client(store: RowStore, clock: (() => number) | undefined, gc?: Partial<PrunePolicy>): Percolator {
  return new Percolator({
    store,
    oracle: NO_TIMESTAMPS,
    ...(clock ? { clock } : {}),
    gc: gc ?? KEEP_EVERY_VERSION,
  });
}

/**
 * A transaction's fate as its primary says. For a secondary lock it also says what keeps it
 * live: its primary's lock, which only the owner's heartbeat refreshes (the secondary's own
 * age passes its TTL in any long commit, and says nothing of its owner).
 */
function fateText(f: PrimaryFate, isPrimary: boolean): string {
  switch (f.state) {
    case 'committed':
      return `committed at ${f.commitTs}`;
    case 'rolled-back':
      return 'rolled back';
    case 'pending': {
      const p = f.primaryLock;
      if (isPrimary)
        return f.expired ? 'pending, owner presumed dead (a reader rolls it back)' : 'pending, owner live';
      if (p === undefined)
        return f.expired
          ? 'pending, owner presumed dead (its primary holds no lock of it; a reader rolls it back)'
          : 'pending, owner live (its primary holds no lock of it yet: the prewrite may be in flight)';
      return f.expired
        ? `pending, owner presumed dead (primary lock expired, heartbeat ${ago(p.ageMs)}; a reader rolls it back)`
        : `pending, owner live (primary locked, heartbeat ${ago(p.ageMs)})`;
    }
  }
}

/**
 * What a head row with no cells means, said the same way by every command that addresses
 * one row (inspect, dump --row, resolve, gc --row), and in their --json as `emptyHeadRow`.
 * Head rows are never deleted: a fence after a lost reply or a cleared notification can
 * leave one with nothing in it (docs/protocol.md 4.11 and 8), and an operator who finds
 * one stored must not take it for a row with data.
 */
export const EMPTY_HEAD_ROW =
  'no cells: the row reads as absent at every snapshot (a head row is never deleted; a fence after a lost reply, or a cleared notification, can leave one empty)';

/** EMPTY_HEAD_ROW when the encoded head row `state` holds no cells. */
export function emptyHeadRow(state: Uint8Array): string | undefined {
  return inspectHeadRow(state).cells.length === 0 ? EMPTY_HEAD_ROW : undefined;
}

type CellRef = { readonly table: string; readonly row: string; readonly column: string };

/** Whether `cell` is the primary a lock names. */
function isPrimaryCell(primary: CellRef, cell: CellRef): boolean {
  return primary.table === cell.table && primary.row === cell.row && primary.column === cell.column;
}

/** Expiry as a reader judges it (the lock's `expired`): the primary's lock, or this one's while the primary holds none. */
function expiryText(l: InspectedLock, isPrimary: boolean): string {
  const ttl = `ttl ${duration(l.ttlMs)}`;
  if (l.fate.state !== 'pending') return `${ttl}; its primary has decided its transaction`;
  const p = l.fate.primaryLock;
  if (isPrimary || p === undefined)
    return `${ttl}, ${l.expired ? 'EXPIRED' : `expires in ${duration(l.ttlMs - l.ageMs)}`}`;
  const primary = l.expired ? 'EXPIRED' : `expires in ${duration(p.ttlMs - p.ageMs)}`;
  return `${ttl}; its primary's lock counts: heartbeat ${ago(p.ageMs)}, ${primary}`;
}

function cellRef(r: { table: string; row: string; column?: string }): string {
  return `${r.table}/${shown(r.row)}${r.column === undefined ? '' : `/${shown(r.column)}`}`;
}

// ---------------------------------------------------------------------------------------
// inspect TABLE ROW

type LockView = NonNullable<CellView['lock']>;

export interface InspectedRow {
  readonly table: string;
  readonly row: string;
  /** The store's version token of the head row. */
  readonly version: string;
  /** Size of the encoded head row. */
  readonly stateBytes: number;
  /** Wall clock (ms) ages are measured against. */
  readonly nowMs: number;
  readonly cells: readonly InspectedCell[];
  /** Observer acks kept in the row (reserved cells): which change of which column each observer handled last. */
  readonly acks: readonly ObserverAck[];
  /** EMPTY_HEAD_ROW, when the head row has no cells. */
  readonly emptyHeadRow?: string;
}

export type InspectedLock = LockView & {
  /** nowMs minus the lock's wall time (its prewrite; a primary lock's: or its last heartbeat). */
  readonly ageMs: number;
  /**
   * Its transaction is past its TTL as a reader judges it (as scanLocks' `expired`): by its
   * primary's lock, which the heartbeat refreshes, not by a secondary's own age.
   */
  readonly expired: boolean;
  /** Its transaction's fate, as its primary says (read only); `fate.primaryLock`: the primary's lock. */
  readonly fate: PrimaryFate;
};

export interface InspectedCell extends Omit<CellView, 'lock' | 'writes'> {
  readonly reserved: boolean;
  readonly lock?: InspectedLock;
  readonly writes: readonly (CellView['writes'][number] & {
    /** For a value in a version row (`moving`, `moved`): that row's table and key. */
    readonly versionRow?: { readonly table: string; readonly key: string };
  })[];
}

/** The decoded head row of table/row (plain reads only). NotFoundError when it is not stored. */
export async function inspectRow(
  store: RowStore,
  table: string,
  row: string,
  now: () => number = Date.now,
): Promise<InspectedRow> {
  checkNames(table, row);
  const stored = await store.read(table, row);
  if (stored === null) throw new NotFoundError(`row ${shown(row)} of ${shown(table)} is not stored`);
  const view = inspectHeadRow(stored.state, { table, key: row });
  const nowMs = now();
  const cells: InspectedCell[] = [];
  for (const cell of view.cells) {
    const { lock, writes, ...rest } = cell;
    const fate = lock ? await primaryFate(store, lock, nowMs) : undefined;
    cells.push({
      ...rest,
      reserved: isReservedColumn(cell.column),
      ...(lock && fate
        ? {
            lock: {
              ...lock,
              ageMs: nowMs - lock.wallTimeMs,
              expired: fate.state === 'pending' && fate.expired,
              fate,
            },
          }
        : {}),
      writes: writes.map((w) =>
        w.kind === 'put' && w.value !== 'inline'
          ? { ...w, versionRow: versionRowRef(table, row, cell.column, w.block ?? w.startTs) }
          : w,
      ),
    });
  }
  const acks = observerAcks(stored.state);
  return {
    table,
    row,
    version: stored.version,
    stateBytes: stored.state.length,
    nowMs,
    cells,
    acks,
    ...(cells.length === 0 ? { emptyHeadRow: EMPTY_HEAD_ROW } : {}),
  };
}

export function formatInspected(r: InspectedRow): string {
  const lines = [
    `${cellRef(r)}: head row version ${r.version}, ${bytes(r.stateBytes)}, ${plural(r.cells.length, 'cell')}`,
  ];
  if (r.cells.length === 0) lines.push(`  ${EMPTY_HEAD_ROW}`);
  for (const c of r.cells) {
    const ack = c.reserved
      ? r.acks.find((a) => c.column.endsWith(`\u0000${a.observer}\u0000${a.column}`))
      : undefined;
    lines.push(
      ack
        ? `  ack of observer ${ack.observer} on column ${shown(ack.column)}: last run at startTs ${ack.ackTs}`
        : `  column ${shown(c.column)}${c.reserved ? '  (reserved)' : ''}`,
    );
    if (c.lock) {
      const l = c.lock;
      const isPrimary = isPrimaryCell(l.primary, { table: r.table, row: r.row, column: c.column });
      lines.push(
        `    lock      startTs ${l.startTs}, ${l.kind}, primary ${isPrimary ? 'this cell' : cellRef(l.primary)}`,
        // A primary lock's wall time moves with its owner's heartbeat (found in review: it
        // read "written 14 ms ago" for a transaction 8 s into its commit).
        `              ${isPrimary ? 'written or last refreshed' : 'written'} ${ago(l.ageMs)} (${expiryText(l, isPrimary)})`,
        `              transaction: ${fateText(l.fate, isPrimary)}`,
      );
      if (l.secondaries?.length)
        lines.push(`              secondaries: ${l.secondaries.map((s) => cellRef(s)).join(', ')}`);
    }
    if (c.writes.length === 0) lines.push('    writes    none');
    for (const w of c.writes) {
      let where = '';
      if (w.kind === 'put') {
        where = `, value ${w.value}`;
        if (w.inlineBytes !== undefined) where += ` (${bytes(w.inlineBytes)} in the head row)`;
        if (w.versionRow) where += ` -> version row ${w.versionRow.table} ${shown(w.versionRow.key)}`;
      }
      lines.push(
        `    write     commitTs ${w.commitTs}, startTs ${w.startTs}, ${w.kind}${where}, at ${new Date(w.wallTimeMs).toISOString()}`,
      );
      if (w.secondaries?.length) {
        // Kept until the cell's next write whether or not they are settled (by design): on a
        // healthy commit's primary too, so they must not read as work left (found in review).
        const tables = [...new Set(w.secondaries.map((s) => shown(s.table)))];
        lines.push(
          `              secondaries: ${w.secondaries.map((s) => cellRef(s)).join(', ')}`,
          `                (listed by the commit record until this cell's next write, settled or not: ${tables.map((t) => `\`percolator locks ${t}\``).join(', ')} shows whether any is still locked)`,
        );
      }
    }
    const extra = [`inline ${bytes(c.inlineBytes)}`];
    if (c.prunedThrough > 0) extra.push(`pruned through ${c.prunedThrough}`);
    extra.push(c.notifyTs > 0 ? `notification pending since ts ${c.notifyTs}` : 'no notification');
    if (c.garbage.length > 0) extra.push(`version rows to delete at ${c.garbage.join(', ')}`);
    const acks = Object.entries(c.acks);
    if (acks.length > 0) extra.push(`acks ${acks.map(([o, ts]) => `${o}=${ts}`).join(', ')}`);
    lines.push(`    ${extra.join('; ')}`);
  }
  return lines.join('\n');
}

export async function inspectCommand(
  store: RowStore,
  args: { table: string; row: string; now?: () => number },
): Promise<CommandResult<InspectedRow>> {
  const data = await inspectRow(store, args.table, args.row, args.now);
  return { code: EXIT.ok, data, text: formatInspected(data) };
}

// ---------------------------------------------------------------------------------------
// locks TABLE [--older-than D]

export async function locksCommand(
  store: RowStore,
  args: { table: string; olderThanMs?: number; now?: () => number },
): Promise<CommandResult<LockedCell[]>> {
  checkNames(args.table);
  await assertTableHasRows(store, args.table);
  const found: LockedCell[] = [];
  for await (const l of scanLocks(store, args.table, {
    olderThanMs: args.olderThanMs ?? 0,
    ...(args.now ? { clock: args.now } : {}),
  }))
    found.push(l);
  const older = args.olderThanMs ? ` older than ${duration(args.olderThanMs)}` : '';
  if (found.length === 0)
    return { code: EXIT.ok, data: found, text: `no locks${older} in ${shown(args.table)}` };
  const rows = [['row', 'column', 'startTs', 'age', 'ttl', 'primary', 'transaction']];
  for (const l of found) {
    const isPrimary = isPrimaryCell(l.lock.primary, l);
    rows.push([
      shown(l.row),
      shown(l.column),
      String(l.lock.startTs),
      duration(l.ageMs),
      // EXPIRED as a reader judges it: a secondary by its primary's lock (see fateText).
      `${duration(l.lock.ttlMs)}${l.expired ? ' EXPIRED' : ''}`,
      isPrimary ? '(this cell)' : cellRef(l.lock.primary),
      fateText(l.fate, isPrimary),
    ]);
  }
  return {
    code: EXIT.found,
    data: found,
    text: `${plural(found.length, 'lock')}${older} in ${shown(args.table)}:\n${columns(rows)}`,
  };
}

// ---------------------------------------------------------------------------------------
// resolve TABLE ROW [--wait D]

export async function resolveCommand(
  store: RowStore,
  args: { table: string; row: string; waitMs?: number; now?: () => number },
): Promise<CommandResult<ResolvedLock[]>> {
  checkNames(args.table, args.row);
  const stored = await store.read(args.table, args.row);
  if (stored === null)
    throw new NotFoundError(`row ${shown(args.row)} of ${shown(args.table)} is not stored`);
  const db = client(store, args.now);
  const where = cellRef(args);
  let results: ResolvedLock[];
  const settled: ResolvedLock[] = [];
  try {
    results = await db.resolveLocks(args.table, args.row, {
      waitMs: args.waitMs ?? 0,
      onSettled: (lock) => settled.push(lock),
    });
  } catch (error) {
    // What was settled stays settled: say so, or a rerun's "no locks" would puzzle.
    if (settled.length === 0) throw error;
    throw new IncompleteError(
      `${where}: ${plural(settled.length, 'lock')} settled before the failure\n${settled.map(resolvedLine).join('\n')}`,
      error,
    );
  } finally {
    await db.close();
  }
  if (results.length === 0) {
    // Stored, so not exit 4: that is for a row that is not stored (as inspect exits 0 here).
    const empty = emptyHeadRow(stored.state);
    return { code: EXIT.ok, data: results, text: `no locks in ${where}${empty ? `\n  ${empty}` : ''}` };
  }
  const lines = results.map((r) => resolvedLine(r, args.waitMs));
  const alive = results.filter((r) => r.outcome.action === 'alive').length;
  return {
    code: alive > 0 ? EXIT.found : EXIT.ok,
    data: results,
    text: `${where}: ${plural(results.length - alive, 'lock')} settled${alive > 0 ? `, ${alive} live` : ''}\n${lines.join('\n')}`,
  };
}

function resolvedLine(r: ResolvedLock, waitMs = 0): string {
  const what = `${shown(r.column)} (startTs ${r.startTs}, primary ${r.isPrimary ? 'this cell' : cellRef(r.primary)})`;
  const o = r.outcome;
  if (o.action === 'rolled-forward')
    return `  rolled forward ${what}: its transaction committed at ${o.commitTs}`;
  if (o.action === 'rolled-back') return `  rolled back    ${what}: its transaction did not commit`;
  if (o.action === 'released')
    return `  released       ${what}: settled by its owner (or a reader) while this waited: ${
      o.fate === 'committed'
        ? `its transaction committed at ${o.commitTs}`
        : o.fate === 'rolled-back'
          ? 'its transaction did not commit'
          : 'its record is gone from the row and its primary (pruned): inspect the row for its value'
    }`;
  const expires = `expires in ${duration(o.expiresInMs)} unless its heartbeat refreshes the primary's lock`;
  if (waitMs > 0 && o.refreshed)
    return `  left alone     ${what}: still live after waiting ${duration(waitMs)}, and its owner is alive: its heartbeat refreshed the primary's lock meanwhile (${expires}), so it is still committing; a longer --wait settles it only once the owner finishes or stops: inspect its primary (the stuck-lock runbook in docs/operations.md)`;
  if (waitMs > 0)
    return `  left alone     ${what}: still live after waiting ${duration(waitMs)}, its owner may still be committing (${expires}); run again with a longer --wait (more than ${duration(o.expiresInMs)}), or after its TTL, or inspect its primary if it stays live`;
  return `  left alone     ${what}: its owner may still be committing (${expires}); retry later or pass --wait`;
}

// ---------------------------------------------------------------------------------------
// notifications TABLE... [--observer NAME]

/**
 * A pending column as `notifications --json` prints it: core's PendingColumn, whose
 * `oldest.sinceMs` is the oldest change's wall time (epoch ms), plus `oldest.ageMs`, how
 * long ago that was (what the text shows), when the wall time is known.
 */
export type NotifiedColumn = PendingColumn & {
  readonly oldest: PendingColumn['oldest'] & { readonly ageMs?: number };
};

export async function notificationsCommand(
  store: RowStore,
  args: { tables: readonly string[]; observer?: string; column?: string; now?: () => number },
): Promise<CommandResult<NotifiedColumn[]>> {
  if (args.tables.length === 0) throw new UsageError('name at least one TABLE (stores keep no table list)');
  for (const t of args.tables) checkNames(t);
  if (args.observer !== undefined && !/^[A-Za-z0-9_.-]{1,64}$/.test(args.observer))
    throw new UsageError(`not an observer name: ${JSON.stringify(args.observer)}`);
  if (args.column !== undefined) {
    try {
      validateColumn(args.column);
    } catch (error) {
      throw new UsageError(`not a column name: ${(error as Error).message}`);
    }
  }
  const found: PendingColumn[] = [];
  // A table with no rows (a misspelt name, most often) does not hide the others' backlog
  // (it stopped the command at the first, found by a new user): each is named, exit 4.
  const empty: string[] = [];
  for (const t of args.tables) {
    try {
      await assertTableHasRows(store, t);
    } catch (error) {
      if (!(error instanceof NotFoundError) || args.tables.length === 1) throw error;
      empty.push(t);
      continue;
    }
    found.push(
      ...(await scanNotifications(store, t, {
        ...(args.observer ? { observer: args.observer } : {}),
        ...(args.column !== undefined ? { column: args.column } : {}),
      })),
    );
  }
  const nowMs = (args.now ?? Date.now)();
  // `sinceMs` is a wall time (kept as it was); `ageMs` is what the text shows.
  const data: NotifiedColumn[] = found.map((p) => ({
    ...p,
    oldest: { ...p.oldest, ...(p.oldest.sinceMs === undefined ? {} : { ageMs: nowMs - p.oldest.sinceMs }) },
  }));
  const forWhom = `${args.observer ? ` for observer ${args.observer}` : ''}${args.column !== undefined ? ` in column ${shown(args.column)}` : ''}`;
  if (empty.length === args.tables.length) throw new NotFoundError(noRows(empty));
  const code = empty.length > 0 ? EXIT.notFound : EXIT.ok;
  // On stderr, with --json too (the JSON holds only the backlog; it said nothing of them).
  const notes = empty.length > 0 ? { notes: noRows(empty) } : {};
  const looked = args.tables.filter((t) => !empty.includes(t));
  if (data.length === 0)
    return {
      code,
      data,
      text: `no pending notifications${forWhom} in ${looked.map(shown).join(', ')}`,
      ...notes,
    };
  const rows = [['table', 'column', 'pending', 'oldest row', 'oldest change']];
  for (const p of data)
    rows.push([
      shown(p.table),
      shown(p.column),
      String(p.pending),
      shown(p.oldest.row),
      p.oldest.ageMs === undefined
        ? `notified at ts ${p.oldest.notifyTs}`
        : `${ago(p.oldest.ageMs)} (notified at ts ${p.oldest.notifyTs})`,
    ]);
  const total = data.reduce((n, p) => n + p.pending, 0);
  return {
    code,
    data,
    text: `${plural(total, 'pending notification')}${forWhom}:\n${columns(rows)}`,
    ...notes,
  };
}

// ---------------------------------------------------------------------------------------
// gc TABLE [--dry-run] [--row KEY] [--retention D] [--max-versions N] [--inline-history-bytes N]

export async function gcCommand(
  store: RowStore,
  args: { table: string; row?: string; dryRun?: boolean; policy?: Partial<PrunePolicy>; now?: () => number },
): Promise<CommandResult<GcReport & { dryRun: boolean; emptyHeadRow?: string }>> {
  checkNames(args.table, args.row);
  // As the CLI requires (cli.ts): pruning is for good, so a run that writes prunes by the
  // deployment's stated policy, never by the library's defaults.
  const missing = (['retentionMs', 'maxVersionsPerCell'] as const).filter(
    (k) => args.policy?.[k] === undefined,
  );
  if (args.dryRun !== true && missing.length > 0) {
    throw new UsageError(
      `gcCommand without dryRun needs policy.${missing.join(' and policy.')}: your clients' gc policy (the library's defaults are 60 s and 32 versions); a shorter one deletes history their snapshots still read`,
    );
  }
  let empty: string | undefined;
  if (args.row === undefined) await assertTableHasRows(store, args.table);
  else {
    const stored = await store.read(args.table, args.row);
    if (stored === null)
      throw new NotFoundError(`row ${shown(args.row)} of ${shown(args.table)} is not stored`);
    empty = emptyHeadRow(stored.state);
  }
  const db = client(store, args.now, args.policy ?? {}); // a dry run: the library's policy unless told
  const where = args.row === undefined ? shown(args.table) : cellRef({ table: args.table, row: args.row });
  const verb = args.dryRun ? 'would free' : 'freed';
  const freed = (r: GcReport) => [
    `  ${verb} ${plural(r.versions, 'version')} in head rows (${bytes(r.headBytes)})`,
    `  ${verb} ${plural(r.versionRows, 'version row')} (${bytes(r.versionRowBytes)})`,
    // Values a failed move had left in the head row: moved out, not freed (GcReport).
    ...(r.versionRowsCreated > 0
      ? [
          `  ${args.dryRun ? 'would move' : 'moved'} values waiting to move to ${plural(r.versionRowsCreated, 'new version row')} (${args.dryRun ? 'about ' : ''}${bytes(r.versionRowBytesCreated)}, counted in the head rows' figure)`,
        ]
      : []),
    net(r.headBytes + r.versionRowBytes - r.versionRowBytesCreated),
  ];
  const net = (n: number) =>
    n >= 0
      ? `  total ${bytes(n)}`
      : `  total: none; the store ${args.dryRun ? 'would grow' : 'grew'} by ${bytes(-n)} (the version rows made)`;
  let report: GcReport;
  let progress: { done: GcReport; row: string } | undefined;
  try {
    report = await db.gc(args.table, {
      dryRun: args.dryRun === true,
      ...(args.row === undefined ? {} : { row: args.row }),
      onProgress: (done, row) => {
        progress = { done, row };
      },
    });
  } catch (error) {
    // A real run that failed part way freed what it freed: say how much, and where it got to
    // (rows go in key order, so a rerun redoes nothing that is done).
    if (args.dryRun === true || progress === undefined) throw error;
    throw new IncompleteError(
      [
        `gc ${where}: ${plural(progress.done.rows, 'row')} done before the failure, the last ${shown(progress.row)}`,
        ...freed(progress.done),
      ].join('\n'),
      error,
    );
  } finally {
    await db.close();
  }
  const lines = [
    `gc ${where}${args.dryRun ? ' (dry run: nothing written)' : ''}: ${plural(report.rows, 'row')} examined`,
    ...(empty ? [`  ${empty}`] : []),
    ...freed(report),
  ];
  // A dry run by the library's defaults promised what a run by the clients' policy did not
  // free (found by an operator's walkthrough): say which policy it counted by.
  const defaulted = ['retentionMs', 'maxVersionsPerCell'].filter(
    (k) => args.policy?.[k as 'retentionMs' | 'maxVersionsPerCell'] === undefined,
  );
  if (args.dryRun && defaulted.length > 0)
    lines.push(
      `  (counted by the library's default ${defaulted.map((k) => (k === 'retentionMs' ? `--retention ${DEFAULT_PRUNE_POLICY.retentionMs / 1000}s` : `--max-versions ${DEFAULT_PRUNE_POLICY.maxVersionsPerCell}`)).join(' and ')}: pass your clients' policy for what a run with it frees)`,
    );
  if (report.held > 0)
    lines.push(
      args.dryRun
        ? `  ${plural(report.held, 'commit record')} kept for their secondaries: a real run settles them first and may free more`
        : `  ${plural(report.held, 'commit record')} still kept for their secondaries (a secondary row could not be settled; run again)`,
    );
  return {
    // Records still held after a real run: work left, as for a lock resolve left alone.
    code: report.held > 0 && !args.dryRun ? EXIT.found : EXIT.ok,
    data: { ...report, dryRun: args.dryRun === true, ...(empty ? { emptyHeadRow: empty } : {}) },
    text: lines.join('\n'),
  };
}
