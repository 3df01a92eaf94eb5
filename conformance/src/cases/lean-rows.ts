/**
 * Lean rows (docs/protocol.md sections 2 and 7): a cell's head row holds what a current
 * snapshot needs, not its history. Old values move to version rows in the background;
 * old snapshots still read them; pruning deletes them; a client that stops mid-move leaves
 * no orphan. Each case would fail on a layout that keeps every version in the head row.
 */
import {
  ClientCrash,
  type CommitStepEvent,
  inspectHeadRow,
  namedVersionRows,
  Percolator,
  type PrunePolicy,
  type RowRef,
  type RowStore,
  type ScannedStoredRow,
  SnapshotTooOldError,
  type StoreCapabilities,
  type StoredRow,
  type Transaction,
  versionRowRef,
  versionRowValue,
  versionTable,
} from '@percolator/core';
import { FaultyStore } from '../faulty-store.js';
import type { CaseContext, ConformanceCase } from '../types.js';
import { bytes, check, errorText, sameBytes, show } from '../util.js';
import { client, DEFAULT_RANDOM_FAULTS, type FaultMode, faultSuffix, partFor } from './harness.js';
import { noise, oracleOption } from './store-helpers.js';

const TABLE = 'lean';

/** The store's head row of (TABLE, row), or fails the case. */
async function headBytes(store: RowStore, row: string, table = TABLE): Promise<Uint8Array> {
  const stored = await store.read(table, row);
  check(stored, `head row ${table}/${row} is missing`);
  return stored.state;
}

/** Every version row of `table` (stores that can scan), as "key" strings. */
async function versionKeys(store: RowStore, table: string): Promise<Set<string>> {
  const keys = new Set<string>();
  let after: string | undefined;
  for (;;) {
    const page: ScannedStoredRow[] = await store.scan!(versionTable(table), { after, limit: 256 });
    for (const r of page) keys.add(r.key);
    if (page.length < 256) return keys;
    after = page[page.length - 1]!.key;
  }
}

/**
 * No orphan and no lost version: every value the head rows name as `moved` is in the
 * version row (block) its record names, and (where the store can list them) every version
 * row that exists is named. Resolves to the number of moved values.
 */
async function checkVersionRows(store: RowStore, rows: readonly string[], table = TABLE): Promise<number> {
  const named = new Set<string>();
  const mustHold: { ref: RowRef; startTs: number }[] = [];
  for (const row of rows) {
    const stored = await store.read(table, row);
    if (!stored) continue;
    const view = inspectHeadRow(stored.state);
    for (const r of namedVersionRows(table, row, view).named) named.add(r.key);
    for (const cell of view.cells) {
      for (const w of cell.writes) {
        if (w.value !== 'moved') continue;
        mustHold.push({
          ref: versionRowRef(table, row, cell.column, w.block ?? w.startTs),
          startTs: w.startTs,
        });
      }
    }
  }
  const blocks = new Map<string, Promise<StoredRow | null>>();
  for (const { ref, startTs } of mustHold) {
    let read = blocks.get(ref.key);
    if (!read) blocks.set(ref.key, (read = store.read(ref.table, ref.key)));
    const block = await read;
    check(block, `version row ${ref.table}/${ref.key} named as moved is missing`);
    check(
      versionRowValue(block!.state, startTs) !== undefined,
      `version row ${ref.table}/${ref.key} does not hold the version at ${startTs} its head row names`,
    );
  }
  if (store.capabilities.orderedScan && store.scan) {
    for (const key of await versionKeys(store, table)) {
      check(named.has(key), `version row ${versionTable(table)}/${key} is an orphan: no head row names it`);
    }
  }
  return mustHold.length;
}

/** A store that declares (and enforces) a smaller row limit, as DynamoDB's 400 KB. */
class LimitedStore extends FaultyStore {
  private readonly limited: StoreCapabilities;
  constructor(inner: RowStore, maxStateBytes: number) {
    super(inner);
    this.limited = {
      ...inner.capabilities,
      maxStateBytes: Math.min(maxStateBytes, inner.capabilities.maxStateBytes),
    };
  }
  override get capabilities(): StoreCapabilities {
    return this.limited;
  }
}

/** A read in an open transaction, retried through injected faults (the snapshot stays the same). */
async function readAt(tx: Transaction, row: string): Promise<Uint8Array | undefined> {
  let last: unknown;
  for (let attempt = 0; attempt < 20; attempt++) {
    try {
      return await tx.get(TABLE, row, 'v');
    } catch (error) {
      if (error instanceof SnapshotTooOldError) throw error;
      last = error;
      await new Promise((r) => setTimeout(r, 5));
    }
  }
  throw new Error(`a snapshot read kept failing: ${errorText(last)}`);
}

/** A snapshot, retried through injected faults on the oracle. */
async function begin(db: Percolator): Promise<Transaction> {
  for (let attempt = 0; ; attempt++) {
    try {
      return await db.begin();
    } catch (error) {
      if (attempt >= 20) throw error;
      await new Promise((r) => setTimeout(r, 5));
    }
  }
}

/** One write transaction, retried through conflicts and faults; an unknown outcome is re-checked by the caller. */
async function write(db: Percolator, row: string, value: Uint8Array): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    try {
      await db.transact(async (tx) => tx.set(TABLE, row, 'v', value), { maxAttempts: 5 });
      return;
    } catch (error) {
      if (attempt >= 10) throw error;
    }
  }
}

function leanHead(mode: FaultMode): ConformanceCase {
  return {
    part: partFor(mode),
    name: `history does not grow the head row: after many 1 KB updates it stays within 1.5x its one-update size + 512 bytes, with no orphan version row${faultSuffix(mode)}`,
    timeoutMs: 180_000,
    async run(ctx: CaseContext) {
      const store = await ctx.createStore();
      const size = Math.min(1024, Math.floor(store.capabilities.maxStateBytes / 16));
      const writer = client(ctx, store, mode === 'faulty' ? { faults: DEFAULT_RANDOM_FAULTS } : {}).db;
      await write(writer, 'hot', noise(size, ctx.random));
      const clean = new Percolator({ store, ...oracleOption(store) });
      await clean.tidy(TABLE, 'hot', { force: true });
      const one = (await headBytes(store, 'hot')).length;
      const updates = ctx.scaled(1000, 80);
      let last: Uint8Array = new Uint8Array();
      for (let i = 0; i < updates; i++) {
        last = noise(size, ctx.random);
        await write(writer, 'hot', last);
      }
      await writer.close();
      // Faults may have left a move half done: the next commit (here, a clean one) finishes it.
      last = noise(size, ctx.random);
      await write(clean, 'hot', last);
      await clean.close();
      const after = (await headBytes(store, 'hot')).length;
      check(
        after <= 1.5 * one + 512,
        `after ${updates + 2} updates of ${size} bytes the head row is ${after} bytes; after one it was ${one} (limit ${Math.floor(1.5 * one + 512)})`,
      );
      const reader = new Percolator({ store, ...oracleOption(store) });
      ctx.defer(() => reader.close());
      const back = await reader.transact((tx) => tx.get(TABLE, 'hot', 'v'));
      check(sameBytes(back, last), `the newest value read back as ${show(back)}`);
      const moved = await checkVersionRows(store, ['hot']);
      ctx.note(
        `head row ${one} -> ${after} bytes after ${updates + 2} updates; ${moved} versions in version rows`,
      );
    },
  };
}

/**
 * How old values leave the head row in a case: one version row per value (`single`), or
 * blocks of several values moved together (`blocks`: values of 600-700 bytes past an
 * inline budget of 1,800 bytes are marked three or four at a time, and split into blocks
 * of two by a block limit of 1,500 bytes; cells.ts, markMoving).
 */
type MoveShape = 'single' | 'blocks';
const MOVE_GC: Record<MoveShape, Partial<PrunePolicy>> = {
  single: { inlineHistoryBytes: 0 },
  blocks: { inlineHistoryBytes: 1800, versionBlockBytes: 1500 },
};
const shapeSuffix = (shape: MoveShape) => (shape === 'blocks' ? ', in blocks of several values' : '');

function oldSnapshots(mode: FaultMode, shape: MoveShape = 'single'): ConformanceCase {
  return {
    part: partFor(mode),
    name: `old snapshots read moved-out versions exactly, while the moves run and after${shapeSuffix(shape)}${faultSuffix(mode)}`,
    timeoutMs: 180_000,
    async run(ctx: CaseContext) {
      const store = await ctx.createStore();
      const gc: Partial<PrunePolicy> = { maxVersionsPerCell: 1000, ...MOVE_GC[shape] };
      const faults = mode === 'faulty' ? { faults: DEFAULT_RANDOM_FAULTS } : {};
      const writer = client(ctx, store, { ...faults, gc }).db;
      const readers = client(ctx, store, { ...faults, gc }).db;
      const versions = ctx.scaled(40, 12);
      const snapshots: { tx: Transaction; expected: Uint8Array | undefined }[] = [];
      let current: Uint8Array | undefined;
      for (let i = 0; i < versions; i++) {
        snapshots.push({ tx: await begin(readers), expected: current });
        current = noise(600 + i, ctx.random);
        await write(writer, 'r', current);
        // Read some old snapshots while moves are still in flight.
        const probe = snapshots[ctx.random.int(snapshots.length)]!;
        const got = await readAt(probe.tx, 'r');
        check(sameBytes(got, probe.expected), `snapshot ${probe.tx.startTs} read ${show(got)} mid-run`);
      }
      await writer.close();
      for (const s of snapshots) {
        const got = await readAt(s.tx, 'r');
        check(
          sameBytes(got, s.expected),
          `snapshot ${s.tx.startTs} read ${show(got)}, expected ${show(s.expected)}`,
        );
      }
      const clean = new Percolator({ store, gc, ...oracleOption(store) });
      await clean.tidy(TABLE, 'r', { force: true });
      await clean.close();
      for (const s of snapshots) {
        const got = await readAt(s.tx, 'r');
        check(sameBytes(got, s.expected), `after every move, snapshot ${s.tx.startTs} read ${show(got)}`);
      }
      const moved = await checkVersionRows(store, ['r']);
      check(moved >= versions - 2, `only ${moved} of ${versions} old values were moved out`);
      const blocks = await movedBlocks(store, 'r');
      if (shape === 'blocks')
        check(blocks < moved, `${moved} values moved to ${blocks} version rows: no block`);
      ctx.note(
        `${versions} snapshots read back exactly; ${moved} versions moved out, to ${blocks} version rows`,
      );
    },
  };
}

const bigValues: ConformanceCase = {
  part: 'protocol',
  name: 'a 50 KB value rewritten many times in a burst fits a 400 KB row limit; a snapshot from before reads its value or SnapshotTooOld',
  timeoutMs: 300_000,
  async run(ctx) {
    const store = new LimitedStore(await ctx.createStore(), 400 * 1024);
    const db = new Percolator({ store, ...oracleOption(store) });
    ctx.defer(() => db.close());
    const size = 50 * 1024;
    const before = noise(size, ctx.random);
    await write(db, 'big', before);
    const old = await db.begin();
    const updates = ctx.scaled(1000, 40);
    let last = before;
    let oldChecked = false;
    for (let i = 0; i < updates; i++) {
      last = noise(size, ctx.random);
      await write(db, 'big', last);
      if (i === 8) {
        const got = await readAt(old, 'big');
        check(sameBytes(got, before), `the snapshot from before the burst read ${show(got)} after 9 updates`);
        oldChecked = true;
      }
    }
    check(oldChecked || updates <= 8, 'the old snapshot was never read mid-burst');
    let end: unknown;
    try {
      end = await readAt(old, 'big');
    } catch (error) {
      end = error;
    }
    check(
      end instanceof SnapshotTooOldError || sameBytes(end as Uint8Array, before),
      `after the burst the old snapshot must read its value or get SnapshotTooOldError, got ${end instanceof Uint8Array ? show(end) : errorText(end)}`,
    );
    const back = await db.transact((tx) => tx.get(TABLE, 'big', 'v'));
    check(sameBytes(back, last), 'the newest 50 KB value did not read back intact');
    await db.close();
    await checkVersionRows(store, ['big']);
    ctx.note(
      `${updates} updates of ${size} bytes under a ${store.capabilities.maxStateBytes}-byte row limit`,
    );
  },
};

/** Distinct version rows the `moved` records of a head row name. */
async function movedBlocks(store: RowStore, row: string, table = TABLE): Promise<number> {
  const view = inspectHeadRow(await headBytes(store, row, table));
  const names = new Set<string>();
  for (const cell of view.cells)
    for (const w of cell.writes) if (w.value === 'moved') names.add(`${cell.column}/${w.block ?? w.startTs}`);
  return names.size;
}

/** What a client stopping mid-move leaves: `moving` marks (creates lost) or `garbage` (deletes lost). */
function crashMidMove(kind: 'before' | 'after', shape: MoveShape = 'single'): ConformanceCase {
  return {
    part: 'faults',
    name: `a client that stops mid-move (version-row writes ${kind === 'before' ? 'never arrive' : 'land but their replies are lost'}) leaves no orphan; the next writer finishes the move${shapeSuffix(shape)}`,
    timeoutMs: 180_000,
    async run(ctx) {
      const store = await ctx.createStore();
      const gc: Partial<PrunePolicy> = { maxVersionsPerCell: 4, ...MOVE_GC[shape] };
      // Two phases: a one-step commit carries its moves in its own atomic step (protocol.md
      // 7.2), so only the tidy step's moves (two-phase commits, stores without one-step
      // commits) can stop midway.
      const crashed = client(ctx, store, { wrap: true, gc, onePhaseMaxRows: 1 });
      const faulty = crashed.faulty!;
      const internal = (call: { table?: string; rows?: readonly RowRef[] }) =>
        (call.table ?? call.rows?.[0]?.table ?? '').startsWith('__');
      // From the first move on, every version-row write of this client fails (or lands unacknowledged).
      faulty.inject({
        kind,
        match: internal,
        operation: ['checkAndSet', 'checkAndSetMany'],
        times: 1_000_000,
      });
      const readers = client(ctx, store, { gc: { maxVersionsPerCell: 1000 } }).db;
      const snapshots: { tx: Transaction; expected: Uint8Array | undefined }[] = [];
      let current: Uint8Array | undefined;
      for (let i = 0; i < 10; i++) {
        snapshots.push({ tx: await begin(readers), expected: current });
        current = noise(700, ctx.random);
        await write(crashed.db, 'r', current);
      }
      await crashed.db.close();
      const view = inspectHeadRow(await headBytes(store, 'r'));
      const pendingWork = view.cells.some(
        (c) => c.garbage.length > 0 || c.writes.some((w) => w.value === 'moving'),
      );
      check(pendingWork, 'the stopped client left no unfinished move: the fault did not hit the tidy step');
      // The snapshots still inside the kept history read right while the move is unfinished.
      for (const s of snapshots.slice(-3)) {
        const got = await readAt(s.tx, 'r');
        check(
          sameBytes(got, s.expected),
          `snapshot ${s.tx.startTs} read ${show(got)} with the move unfinished`,
        );
      }
      const next = new Percolator({ store, gc, onePhaseMaxRows: 1, ...oracleOption(store) });
      current = noise(700, ctx.random);
      await write(next, 'r', current);
      await next.close();
      const after = inspectHeadRow(await headBytes(store, 'r'));
      check(
        after.cells.every((c) => c.garbage.length === 0 && c.writes.every((w) => w.value !== 'moving')),
        () => `the next writer did not finish the move: ${JSON.stringify(after.cells.map((c) => c.writes))}`,
      );
      await checkVersionRows(store, ['r']);
      for (const s of snapshots.slice(-2)) {
        let got: unknown;
        try {
          got = await readAt(s.tx, 'r');
        } catch (error) {
          got = error;
        }
        check(
          got instanceof SnapshotTooOldError || sameBytes(got as Uint8Array | undefined, s.expected),
          `snapshot ${s.tx.startTs} read ${got instanceof Error ? errorText(got) : show(got as Uint8Array)} after the move`,
        );
      }
      ctx.note(
        `faults on version-row writes: ${faulty.stats.failedBefore} before, ${faulty.stats.failedAfter} after`,
      );
    },
  };
}

/**
 * A primary's commit record is the only proof that its secondaries' locks must be rolled
 * forward. Clients stop right after their commit points, leaving secondaries locked; the
 * primary cell is then rewritten far past its version cap. GC must keep those records
 * until it has settled the secondaries itself, so every secondary ends committed.
 */
const heldRecords: ConformanceCase = {
  part: 'protocol',
  name: 'GC keeps a commit record whose secondaries may be locked, settles them in a batch, then prunes it',
  timeoutMs: 120_000,
  async run(ctx) {
    const store = await ctx.createStore();
    const gc: Partial<PrunePolicy> = { maxVersionsPerCell: 2 };
    const stopped = 10;
    for (let i = 0; i < stopped; i++) {
      const onCommitStep = (e: CommitStepEvent) => {
        if (e.step === 'afterCommitPrimary') throw new ClientCrash('client stopped after its commit point');
      };
      const crasher = client(ctx, store, { gc, hooks: { onCommitStep } }).db;
      const tx = await crasher.begin();
      tx.set(TABLE, 'a', 'v', `a${i}`);
      tx.set(TABLE, `s${i}`, 'v', `new${i}`);
      const error = await tx.commit().then(
        () => undefined,
        (e: unknown) => e,
      );
      check(
        error instanceof ClientCrash,
        `the client did not stop after its commit point: ${errorText(error)}`,
      );
    }
    const writer = client(ctx, store, { gc }).db;
    for (let i = 0; i < 20; i++) await write(writer, 'a', bytes(`later${i}`));
    await writer.close();
    // Every secondary is committed already (GC settled it), or its primary record is still kept.
    const primary = inspectHeadRow(await headBytes(store, 'a'));
    const listed = new Set(
      primary.cells.flatMap((c) => c.writes.flatMap((w) => (w.secondaries ?? []).map((r) => r.row))),
    );
    let settledByGc = 0;
    for (let i = 0; i < stopped; i++) {
      const cell = inspectHeadRow(await headBytes(store, `s${i}`)).cells.find((c) => c.column === 'v')!;
      const committed = cell.lock === undefined && cell.writes.some((w) => w.kind === 'put');
      check(committed || listed.has(`s${i}`), `s${i} is still locked and its primary no longer lists it`);
      if (committed) settledByGc++;
    }
    check(settledByGc >= 8, `GC settled only ${settledByGc} of ${stopped} stopped transactions' secondaries`);
    const reader = client(ctx, store, { gc }).db;
    for (let i = 0; i < stopped; i++) {
      const got = await reader.transact((tx) => tx.getString(TABLE, `s${i}`, 'v'));
      check(got === `new${i}`, `s${i} reads ${JSON.stringify(got)}: a committed secondary was lost`);
    }
    check(
      primary.cells.every((c) => c.writes.length <= 2 + 8),
      `the primary cell keeps ${primary.cells.map((c) => c.writes.length)} records`,
    );
    ctx.note(`${settledByGc} of ${stopped} stopped transactions settled by GC before any reader came`);
  },
};

export const leanRowCases: ConformanceCase[] = [
  heldRecords,
  leanHead('clean'),
  oldSnapshots('clean'),
  bigValues,
  leanHead('faulty'),
  oldSnapshots('faulty'),
  oldSnapshots('clean', 'blocks'),
  oldSnapshots('faulty', 'blocks'),
  crashMidMove('before'),
  crashMidMove('after'),
  crashMidMove('before', 'blocks'),
  crashMidMove('after', 'blocks'),
];
