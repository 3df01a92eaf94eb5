import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import {
  ClientCrash,
  type CommitStep,
  type LockedCell,
  Percolator,
  type RowStore,
  StoreError,
} from '@percolator/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  gcCommand,
  inspectCommand,
  locksCommand,
  notificationsCommand,
  resolveCommand,
} from '../src/commands.js';
import { UsageError } from '../src/errors.js';
import { BACKEND_NAMES, onStore, openTestBackend, type TestBackend } from './backends.js';

/**
 * Every command on every store (the "done when"): memory, PostgreSQL, MariaDB,
 * Redis, Redis Cluster, DynamoDB Local and a composite. A client is stopped at each commit
 * step; `inspect` shows what it left, `locks` lists it, and `resolve` settles it with the
 * fate a reader chooses (a fresh reader then reads exactly that). Clients share a fake
 * clock, so lock expiry is a step of the test, not a wait. The command functions run
 * in-process; a child `percolator` process then reads the same data through its own
 * connection (--url / --namespace / --config).
 */

const BIN = fileURLToPath(new URL('../dist/bin.js', import.meta.url));
const run = promisify(execFile);

async function percolator(...args: string[]): Promise<{ code: number; out: string; err: string }> {
  try {
    const { stdout, stderr } = await run(process.execPath, [BIN, ...args], { timeout: 60_000 });
    return { code: 0, out: stdout, err: stderr };
  } catch (error) {
    const e = error as { code?: number; stdout?: string; stderr?: string };
    if (typeof e.code !== 'number') throw error;
    return { code: e.code, out: e.stdout ?? '', err: e.stderr ?? '' };
  }
}

/** The CLI as the bin runs it (argument parsing, text or --json printing), on an open store. */

const TTL = 2000;
const TABLE = 'accounts';

/** Commit steps to stop at, and what a reader must see afterwards. */
const STOPS: { step: CommitStep; isPrimary?: boolean; label: string; committed: boolean }[] = [
  { step: 'afterPrewrite', isPrimary: true, label: 'p1', committed: false },
  { step: 'afterPrewrite', isPrimary: false, label: 'p2', committed: false },
  { step: 'beforeCommitPrimary', label: 'bc', committed: false },
  { step: 'afterCommitPrimary', label: 'ac', committed: true },
  { step: 'afterCommitSecondary', label: 'as', committed: true },
];
const rowsOf = (label: string) => [`${label}-a`, `${label}-b`, `${label}-c`];

function fakeClock() {
  let now = Date.now();
  const clock = () => now;
  clock.advance = (ms: number) => {
    now += ms;
  };
  return clock;
}

/** Writes "old" to every row, then a client that stops at each step tries to write "new". */
async function stage(store: RowStore, clock: () => number): Promise<void> {
  const db = new Percolator({ store, clock, lockTtlMs: TTL });
  await db.transact(async (tx) => {
    for (const s of STOPS) for (const r of rowsOf(s.label)) tx.set(TABLE, r, 'v', 'old');
  });
  await db.close();
  for (const s of STOPS) {
    let stopped = false;
    const crashing = new Percolator({
      store,
      clock,
      lockTtlMs: TTL,
      onePhaseMaxRows: 1, // two phases: the hooks stop at their steps
      hooks: {
        onCommitStep: (e) => {
          if (stopped || e.step !== s.step || (s.isPrimary !== undefined && e.isPrimary !== s.isPrimary))
            return;
          stopped = true;
          throw new ClientCrash(`stopped at ${s.step}`);
        },
      },
    });
    const tx = await crashing.begin();
    for (const r of rowsOf(s.label)) tx.set(TABLE, r, 'v', 'new');
    await tx.commit().catch((e: unknown) => expect(e).toBeInstanceOf(ClientCrash));
    await crashing.close();
    expect(stopped, `${s.label} stopped`).toBe(true);
  }
  // Requests the stopped clients had in flight land now, as after a real crash.
  await new Promise((r) => setTimeout(r, 20));
}

async function readAll(
  store: RowStore,
  clock: () => number,
  rows: string[],
): Promise<(string | undefined)[]> {
  const reader = new Percolator({ store, clock, lockTtlMs: TTL });
  try {
    return await reader.transact(async (tx) => Promise.all(rows.map((r) => tx.getString(TABLE, r, 'v'))));
  } finally {
    await reader.close();
  }
}

describe.each(BACKEND_NAMES)('percolator commands on %s', (name) => {
  let backend: TestBackend;
  const clock = fakeClock();
  beforeAll(async () => {
    backend = await openTestBackend(name);
    await stage(backend.store, clock);
  }, 120_000);
  afterAll(async () => {
    await backend?.cleanup();
  });

  it('a client stopped at each commit step: inspect shows its locks, locks lists them, resolve settles them as a reader would', async () => {
    const { store } = backend;
    const now = clock;
    const listed = await locksCommand(store, { table: TABLE, now });
    expect(listed.code).toBe(1);
    const locks: LockedCell[] = listed.data;
    // Each stop before the commit point leaves a lock, and its primary's fate is pending.
    for (const s of STOPS.filter((s) => !s.committed)) {
      const mine = locks.filter((l) => l.row.startsWith(`${s.label}-`));
      expect(mine.length, `${s.label} left locks`).toBeGreaterThan(0);
      for (const l of mine) expect(l.fate).toMatchObject({ state: 'pending', expired: false });
    }
    // After the commit point: committed, the primary's record says at which timestamp.
    const ac = locks.filter((l) => l.row.startsWith('ac-'));
    expect(ac.length).toBe(2);
    for (const l of ac) expect(l.fate.state).toBe('committed');
    for (const l of locks) {
      expect(l.expired).toBe(false);
      // inspect shows the same lock, with its age against its TTL and the same fate.
      const inspected = await inspectCommand(store, { table: TABLE, row: l.row, now });
      expect(inspected.code).toBe(0);
      const cell = inspected.data.cells.find((c) => c.column === l.column);
      expect(cell?.lock).toMatchObject({ startTs: l.lock.startTs, ttlMs: TTL, expired: false, fate: l.fate });
      expect(inspected.text).toContain(`lock      startTs ${l.lock.startTs}`);
    }
    expect((await locksCommand(store, { table: TABLE, now, olderThanMs: 60_000 })).code).toBe(0);

    // Before the TTL: a live owner's lock is left alone (exit 1), a committed one rolled forward.
    const live = locks.find((l) => l.row === 'bc-a')!;
    const early = await resolveCommand(store, { table: TABLE, row: live.row, now });
    expect(early.code).toBe(1);
    expect(early.data.map((r) => r.outcome.action)).toEqual(['alive']);
    expect(early.text).toContain('left alone');

    clock.advance(TTL + 1);
    // Past the TTL, locks reports the verdict a reader would apply; nothing is changed yet.
    const expired = (await locksCommand(store, { table: TABLE, now })).data;
    expect(expired.length).toBe(locks.length);
    for (const l of expired.filter((l) => l.row.startsWith('bc-')))
      expect(l.fate).toMatchObject({ state: 'pending', expired: true });

    for (const s of STOPS) {
      const rows = rowsOf(s.label);
      for (const row of rows) {
        const resolved = await resolveCommand(store, { table: TABLE, row, now });
        expect(resolved.code, resolved.text).toBe(0);
        for (const r of resolved.data)
          expect(r.outcome.action).toBe(s.committed ? 'rolled-forward' : 'rolled-back');
      }
      // A fresh reader reads what resolve chose.
      expect(await readAll(store, clock, rows)).toEqual(rows.map(() => (s.committed ? 'new' : 'old')));
    }
    const after = await locksCommand(store, { table: TABLE, now });
    expect(after.code).toBe(0);
    expect(after.text).toContain('no locks');
  });

  it('notifications counts the backlog per observed column; gc frees old versions', async () => {
    const { store } = backend;
    const db = new Percolator({
      store,
      clock,
      lockTtlMs: TTL,
      gc: { retentionMs: 1000 },
      observedColumns: [{ table: 'docs', column: 'body' }],
    });
    try {
      for (const r of ['d1', 'd2', 'd3'])
        await db.transact(async (tx) => tx.set('docs', r, 'body', `text ${r}`));
      const pending = await notificationsCommand(store, { tables: ['docs'], now: clock });
      expect(pending.data).toMatchObject([{ table: 'docs', column: 'body', pending: 3 }]);
      expect(pending.text).toContain('3 pending notifications');
      // --column: that column only (the store does not know an observer's columns).
      expect((await notificationsCommand(store, { tables: ['docs'], column: 'body' })).data).toMatchObject([
        { column: 'body', pending: 3 },
      ]);
      const other = await notificationsCommand(store, {
        tables: ['docs'],
        observer: 'indexer',
        column: 'title',
      });
      expect(other.data).toEqual([]);
      expect(other.text).toBe('no pending notifications for observer indexer in column title in docs');
      await expect(notificationsCommand(store, { tables: ['docs'], column: '' })).rejects.toBeInstanceOf(
        UsageError,
      );
      // A table with no rows among several: the others are still shown, the empty one named, exit 4
      // (it stopped at the first empty table and showed nothing, found by a new user).
      const some = await notificationsCommand(store, { tables: ['nosuch', 'docs'], now: clock });
      expect(some.code).toBe(4);
      expect(some.data).toMatchObject([{ table: 'docs', column: 'body', pending: 3 }]);
      expect(some.text).toContain('3 pending notifications');
      expect(some.notes).toBe('table nosuch holds no rows (is the name right? stores keep no table list)');
      // Through the CLI: the note on stderr, with --json too (whose output stays the backlog).
      const json = await onStore(store, 'notifications', 'nosuch', 'docs', '--json');
      expect(json.code).toBe(4);
      expect(JSON.parse(json.out)).toMatchObject([{ table: 'docs', pending: 3 }]);
      expect(json.err).toBe('table nosuch holds no rows (is the name right? stores keep no table list)\n');
      await expect(notificationsCommand(store, { tables: ['nosuch', 'other'] })).rejects.toThrow(
        'tables nosuch, other hold no rows',
      );
      await expect(notificationsCommand(store, { tables: ['nosuch'] })).rejects.toThrow(
        'table nosuch holds no rows',
      );
      const worker = db.worker({
        observers: [{ name: 'indexer', table: 'docs', column: 'body', handler: async () => {} }],
      });
      const before = await inspectCommand(store, { table: 'docs', row: 'd1' });
      expect(before.data.cells.find((c) => c.column === 'body')?.notifyTs).toBeGreaterThan(0);
      await worker.runUntilIdle();
      expect((await notificationsCommand(store, { tables: ['docs'], observer: 'indexer' })).data).toEqual([]);
      // inspect shows the observer's ack, and no notification left.
      const handled = await inspectCommand(store, { table: 'docs', row: 'd1' });
      expect(handled.data.acks).toEqual([{ observer: 'indexer', column: 'body', ackTs: expect.any(Number) }]);
      expect(handled.data.acks[0]!.ackTs).toBeGreaterThan(0);
      expect(handled.data.cells.find((c) => c.column === 'body')?.notifyTs).toBe(0);
      expect(handled.text).toContain('ack of observer indexer on column body');
      // A weak notification of a row with no data, cleared by a weak observer: the head row
      // stays, with no cells (a head row is never deleted: docs/protocol.md 8), and reads as
      // absent; inspect says so. (A table of its own: the bin test below counts docs' rows.)
      const pinger = db.worker({
        observers: [{ name: 'pinger', table: 'pings', column: 'ping', weak: true, handler: async () => {} }],
      });
      await db.transact(async (tx) => tx.notify('pings', 'w1', 'ping'));
      await pinger.runUntilIdle();
      const empty = await inspectCommand(store, { table: 'pings', row: 'w1' });
      expect(empty.code).toBe(0);
      expect(empty.data.cells).toEqual([]);
      expect(empty.text).toContain('no cells: the row reads as absent');
      expect(await db.transact((tx) => tx.getString('pings', 'w1', 'ping'))).toBeUndefined();
      // Every command on this one row says what inspect says, in text and in --json. They
      // exit 0 as inspect does (the row is stored: nothing to settle or free), but dump exits
      // 4, as for a row that is not stored: it reports what a reader reads.
      const said = empty.text
        .split('\n')
        .find((l) => l.startsWith('  no cells: '))!
        .trim();
      for (const argv of [
        ['resolve', 'pings', 'w1'],
        ['gc', 'pings', '--row', 'w1', '--dry-run'],
        ['gc', 'pings', '--row', 'w1', '--retention', '60s', '--max-versions', '32'],
        ['inspect', 'pings', 'w1'],
      ]) {
        const text = await onStore(store, ...argv);
        expect(text.code, text.err).toBe(0);
        expect(text.out, argv.join(' ')).toContain(`\n  ${said}\n`);
        const json = await onStore(store, ...argv, '--json');
        expect(json.code, json.err).toBe(0);
        if (argv[0] === 'resolve')
          expect(JSON.parse(json.out)).toEqual([]); // an array: no room for a field
        else expect(JSON.parse(json.out), argv.join(' ')).toMatchObject({ emptyHeadRow: said });
      }
      for (const json of [[], ['--json']]) {
        const dumped = await onStore(store, 'dump', 'pings', '--row', 'w1', ...json);
        expect(dumped.code).toBe(4);
        expect(dumped.out).toBe('');
        expect(dumped.err).toContain(`row w1 of pings has no committed values\n  ${said}`);
      }
      // A row with cells says none of it.
      const stored = await onStore(store, 'gc', 'docs', '--row', 'd1', '--dry-run', '--json');
      expect(JSON.parse(stored.out)).not.toHaveProperty('emptyHeadRow');
      expect((await onStore(store, 'resolve', 'docs', 'd1')).out).not.toContain('no cells');
      await db.transact(async (tx) => tx.set('docs', 'd2', 'body', 'edited'));
      expect(
        (await notificationsCommand(store, { tables: ['docs'], observer: 'indexer' })).data,
      ).toMatchObject([{ column: 'body', pending: 1, oldest: { row: 'd2' } }]);

      for (let i = 0; i < 4; i++)
        await db.transact(async (tx) => tx.set('docs', 'big', 'body', `v${i}`.repeat(200)));
      await db.flush();
      clock.advance(5000);
      const policy = { retentionMs: 1000, maxVersionsPerCell: 32 };
      // A run that writes must state the whole policy: the library's defaults would prune
      // by 60 s and 32 versions, whatever the deployment keeps.
      await expect(gcCommand(store, { table: 'docs', policy: { retentionMs: 1000 } })).rejects.toThrow(
        /gcCommand without dryRun needs policy\.maxVersionsPerCell/,
      );
      await expect(gcCommand(store, { table: 'docs' })).rejects.toBeInstanceOf(UsageError);
      const dry = await gcCommand(store, { table: 'docs', row: 'big', dryRun: true, policy, now: clock });
      expect(dry.data.versions).toBe(3);
      expect(dry.text).not.toContain("library's default");
      // Without the policy, the dry run says which defaults it counted by (found by an operator).
      const byDefault = await gcCommand(store, { table: 'docs', row: 'big', dryRun: true, now: clock });
      expect(byDefault.text).toContain(
        "(counted by the library's default --retention 60s and --max-versions 32: pass your clients' policy for what a run with it frees)",
      );
      const half = await gcCommand(store, {
        table: 'docs',
        row: 'big',
        dryRun: true,
        policy: { retentionMs: 1000 },
        now: clock,
      });
      expect(half.text).toContain("(counted by the library's default --max-versions 32:");
      expect(dry.data.headBytes + dry.data.versionRowBytes).toBeGreaterThan(0);
      const done = await gcCommand(store, { table: 'docs', policy, now: clock });
      expect(done.code).toBe(0);
      expect(done.data.versions).toBeGreaterThanOrEqual(3);
      expect(done.data.versionRows).toBe(dry.data.versionRows);
      expect(done.text).toContain('freed');
      expect((await gcCommand(store, { table: 'docs', row: 'big', policy, now: clock })).data.versions).toBe(
        0,
      );
      const value = await db.transact(async (tx) => tx.getString('docs', 'big', 'body'));
      expect(value).toBe('v3'.repeat(200));
    } finally {
      await db.close();
    }
  });

  // The memory store lives in this process: no other process can reach it.
  if (name !== 'memory')
    it('the percolator bin reaches the same data from its own process', async () => {
      expect(existsSync(BIN), 'cli/dist/bin.js is built (pnpm build)').toBe(true);
      const argv = backend.argv!;
      // A transaction stopped right after its commit point, with a TTL no test outlives.
      const db = new Percolator({
        store: backend.store,
        lockTtlMs: 600_000,
        onePhaseMaxRows: 1, // two phases: the hook stops at one of their steps
        hooks: {
          onCommitStep: (e) => {
            if (e.step === 'afterCommitPrimary') throw new ClientCrash();
          },
        },
      });
      const tx = await db.begin();
      tx.set(TABLE, 'x-1', 'v', 'committed');
      tx.set(TABLE, 'x-2', 'v', 'committed');
      await tx.commit().catch(() => undefined);
      await db.close();
      const locks = await percolator('locks', TABLE, ...argv, '--json');
      expect(locks.code, locks.err).toBe(1);
      const listed = JSON.parse(locks.out) as LockedCell[];
      const stuck = listed.find((l) => l.row === 'x-1' || l.row === 'x-2')!;
      expect(stuck.fate.state).toBe('committed');
      const inspect = await percolator('inspect', TABLE, stuck.row, ...argv);
      expect(inspect.code, inspect.err).toBe(0);
      expect(inspect.out).toContain(`startTs ${stuck.lock.startTs}`);
      expect(inspect.out).toContain('transaction: committed at');
      const resolved = await percolator('resolve', TABLE, stuck.row, ...argv);
      expect(resolved.code, resolved.err).toBe(0);
      expect(resolved.out).toContain('rolled forward');
      // Read-only from here: one process each, at once.
      const [none, missing, gc, notes] = await Promise.all([
        percolator('locks', TABLE, ...argv, '--older-than', '1h'),
        percolator('inspect', TABLE, 'no-such-row', ...argv),
        percolator('gc', 'docs', '--dry-run', ...argv, '--json'),
        percolator('notifications', 'docs', ...argv, '--json'),
      ]);
      expect(none.code, none.err).toBe(0);
      expect(missing.code).toBe(4);
      expect(gc.code, gc.err).toBe(0);
      expect(JSON.parse(gc.out)).toMatchObject({ dryRun: true, rows: 4 });
      expect(notes.code, notes.err).toBe(0);
      // d2 (edited after the worker ran) and big (written after it): both unhandled.
      expect(JSON.parse(notes.out)).toMatchObject([{ table: 'docs', column: 'body', pending: 2 }]);
    });
});

describe.each(['memory', 'redis'] as const)('a secondary lock of a live transaction on %s', (name) => {
  it('inspect and locks show it live while the heartbeat keeps its primary fresh past the secondary TTL, expired once the primary lock expires', async () => {
    const backend = await openTestBackend(name);
    const { store } = backend;
    const clock = fakeClock();
    // The heartbeat beats every ttl/3 of real time; lock ages are the fake clock's.
    const ttl = 300;
    let reached!: () => void;
    const atCommitPoint = new Promise<void>((r) => {
      reached = r;
    });
    let stop!: (crash: ClientCrash) => void;
    const held = new Promise<void>((_, reject) => {
      stop = reject;
    });
    const db = new Percolator({
      store,
      clock,
      lockTtlMs: ttl,
      onePhaseMaxRows: 1, // two phases: the hook holds the commit between them
      hooks: {
        onCommitStep: (e) => {
          if (e.step !== 'beforeCommitPrimary') return;
          reached();
          return held; // the owner stays live, heartbeat on, until the test stops it
        },
      },
    });
    try {
      const tx = await db.begin();
      tx.set(TABLE, 'live-a', 'v', 'new');
      tx.set(TABLE, 'live-b', 'v', 'new');
      const commit = tx.commit().catch((e: unknown) => e);
      await atCommitPoint;
      clock.advance(2 * ttl); // every lock's own age is now past its TTL
      const isPrimary = (l: LockedCell) => l.lock.primary.row === l.row;
      let listed = await locksCommand(store, { table: TABLE, now: clock });
      // Until a beat has refreshed the primary lock at the new time.
      for (let i = 0; i < 500 && listed.data.find(isPrimary)!.ageMs > 0; i++) {
        await new Promise((r) => setTimeout(r, 10));
        listed = await locksCommand(store, { table: TABLE, now: clock });
      }
      expect(listed.data.map((l) => l.row).sort()).toEqual(['live-a', 'live-b']);
      const primary = listed.data.find(isPrimary)!;
      const secondary = listed.data.find((l) => !isPrimary(l))!;
      expect(primary).toMatchObject({ ageMs: 0, expired: false });
      expect(secondary.ageMs).toBeGreaterThan(ttl); // its own age: past the TTL, yet live
      expect(secondary.expired).toBe(false);
      expect(secondary.fate).toEqual({
        state: 'pending',
        expired: false,
        primaryLock: { wallTimeMs: clock(), ttlMs: ttl, ageMs: 0 },
      });
      expect(listed.text).not.toContain('EXPIRED');
      expect(listed.text).toContain('pending, owner live (primary locked, heartbeat 0 ms ago)');
      let inspected = await inspectCommand(store, { table: TABLE, row: secondary.row, now: clock });
      expect(inspected.data.cells.find((c) => c.column === 'v')?.lock).toMatchObject({
        expired: false,
        fate: secondary.fate,
      });
      expect(inspected.text).not.toContain('EXPIRED');
      expect(inspected.text).toContain("its primary's lock counts: heartbeat 0 ms ago, expires in 300 ms");
      // resolve leaves it alone, and counts its expiry from the primary's lock too.
      const left = await resolveCommand(store, { table: TABLE, row: secondary.row, now: clock });
      expect(left.code).toBe(1);
      expect(left.data.map((r) => r.outcome)).toEqual([{ action: 'alive', expiresInMs: ttl }]);
      expect(left.text).toContain('expires in 300 ms unless its heartbeat refreshes');

      // The owner dies: no more beats; one TTL later its primary lock, and so the secondary, is expired.
      stop(new ClientCrash('stopped before its commit point'));
      expect(await commit).toBeInstanceOf(ClientCrash);
      clock.advance(ttl + 1);
      listed = await locksCommand(store, { table: TABLE, now: clock });
      const dead = listed.data.find((l) => l.row === secondary.row)!;
      expect(dead.expired).toBe(true);
      expect(dead.fate).toMatchObject({ state: 'pending', expired: true, primaryLock: { ageMs: ttl + 1 } });
      expect(listed.text).toContain('primary lock expired, heartbeat 301 ms ago; a reader rolls it back');
      inspected = await inspectCommand(store, { table: TABLE, row: secondary.row, now: clock });
      expect(inspected.data.cells.find((c) => c.column === 'v')?.lock?.expired).toBe(true);
      expect(inspected.text).toContain("its primary's lock counts: heartbeat 301 ms ago, EXPIRED");
    } finally {
      await db.close();
      await backend.cleanup();
    }
  });
});

describe('resolve prunes nothing (it does not know the deployment retention policy)', () => {
  it('rolling a lock forward keeps every version a deployment that keeps an hour still promises its snapshots', async () => {
    const { MemoryStore, inspectHeadRow } = await import('@percolator/core');
    const store = new MemoryStore();
    const clock = fakeClock();
    const gc = { retentionMs: 3_600_000 };
    const db = new Percolator({ store, clock, lockTtlMs: TTL, gc });
    for (let i = 0; i < 5; i++) {
      await db.transact(async (tx) => {
        tx.set(TABLE, 'h', 'v', `v${i}`);
        tx.set(TABLE, 'h2', 'v', `v${i}`);
      });
      clock.advance(60_000); // a minute apart: all but the newest past the library's 60 s
    }
    await db.close();
    // A client stopped after its commit point: its secondary's lock is left for readers.
    const crashing = new Percolator({
      store,
      clock,
      lockTtlMs: TTL,
      gc,
      onePhaseMaxRows: 1,
      hooks: {
        onCommitStep: (e) => {
          if (e.step === 'afterCommitPrimary') throw new ClientCrash('stopped after the commit point');
        },
      },
    });
    const tx = await crashing.begin();
    tx.set(TABLE, 'h', 'v', 'new');
    tx.set(TABLE, 'h2', 'v', 'new');
    await tx.commit().catch((e: unknown) => expect(e).toBeInstanceOf(ClientCrash));
    await crashing.close();
    await new Promise((r) => setTimeout(r, 20));
    const records = async (row: string) =>
      inspectHeadRow((await store.read(TABLE, row))!.state).cells[0]!.writes.length;
    const secondary = (await store.read(TABLE, 'h'))!.state;
    const lockedRow = inspectHeadRow(secondary).cells[0]!.lock ? 'h' : 'h2';
    const before = await records(lockedRow);
    clock.advance(TTL + 1);
    const resolved = await resolveCommand(store, { table: TABLE, row: lockedRow, now: clock });
    expect(resolved.data.map((r) => r.outcome.action)).toEqual(['rolled-forward']);
    // The rolled-forward record is added; none of the five older versions is pruned.
    expect(await records(lockedRow)).toBe(before + 1);
  });
});

describe('gc and commit records held for their secondaries', () => {
  it('a real run that cannot settle a secondary exits 1 and says to run again; once it can, 0', async () => {
    const { MemoryStore } = await import('@percolator/core');
    const inner = new MemoryStore();
    // A committed two-phase transaction stopped after its commit point: its primary's
    // record lists a secondary whose lock is still there.
    const db = new Percolator({
      store: inner,
      onePhaseMaxRows: 1,
      hooks: {
        onCommitStep: (e) => {
          if (e.step === 'afterCommitPrimary') throw new ClientCrash();
        },
      },
    });
    const tx = await db.begin();
    tx.set('t', 'a', 'v', 'one');
    tx.set('t', 'b', 'v', 'one');
    await tx.commit().catch(() => undefined);
    await db.close();
    // A newer value of a: the record would be pruned, but it still lists b.
    const later = new Percolator({ store: inner });
    await later.transact(async (t) => t.set('t', 'a', 'v', 'two'));
    await later.close();
    // Every write fails: b's lock cannot be rolled forward now.
    let failing = true;
    const refused = () => Promise.reject(new StoreError('injected: refused', 'no'));
    const store: RowStore = Object.assign(Object.create(inner) as RowStore, {
      checkAndSet: (request: Parameters<RowStore['checkAndSet']>[0]) =>
        failing ? refused() : inner.checkAndSet(request),
      checkAndSetMany: (requests: Parameters<NonNullable<RowStore['checkAndSetMany']>>[0]) =>
        failing ? refused() : inner.checkAndSetMany(requests),
    });
    const policy = { retentionMs: 0, maxVersionsPerCell: 1 };
    const held = await gcCommand(store, { table: 't', policy });
    expect(held.data.held).toBeGreaterThan(0);
    expect(held.code).toBe(1);
    expect(held.text).toContain('run again');
    failing = false;
    const settled = await gcCommand(store, { table: 't', policy });
    expect(settled.data.held).toBe(0);
    expect(settled.code).toBe(0);
  });
});

describe('gc --dry-run reports what the real run would free', () => {
  it('never a negative number of bytes (a pruning that marks values to move re-encodes the row larger)', async () => {
    const { MemoryStore } = await import('@percolator/core');
    const store = new MemoryStore();
    const clock = fakeClock();
    const db = new Percolator({
      store,
      clock,
      gc: { retentionMs: 3_600_000, inlineHistoryBytes: 100_000, maxVersionsPerCell: 1000 },
    });
    for (let i = 0; i < 10; i++) {
      await db.transact(async (tx) => {
        tx.set('t', 'x', 'v', `${'x'.repeat(300)}${i}`);
        tx.set('t', 'y', 'v', `y${i}`);
      });
      clock.advance(1000);
    }
    await db.close();
    const dry = await gcCommand(store, {
      table: 't',
      dryRun: true,
      policy: { retentionMs: 3_600_000 },
      now: clock,
    });
    expect(dry.data.headBytes).toBeGreaterThanOrEqual(0);
    expect(dry.text).not.toMatch(/\(-\d/);
  });
});
