/**
 * Part 2, continued: recovery. A client that stops at each commit step leaves all or none
 * of its transaction visible once its locks expire; a rollback record makes a late
 * prewrite fail; a slow committer's heartbeat keeps its lock alive past the TTL.
 */
import {
  ClientCrash,
  type CommitStep,
  type CommitStepEvent,
  ConflictError,
  inspectHeadRow,
  LockNotResolvedError,
  StoreError,
} from '@percolator/core';
import type { CaseContext, ConformanceCase } from '../types.js';
import { check, checkEqual, errorText, format, gate, waitFor, within } from '../util.js';
import {
  applied,
  type Client,
  client,
  FakeClock,
  type FaultMode,
  faultSuffix,
  faultsFor,
  LOCK_TTL_MS,
  partFor,
  readAll,
  settled,
} from './harness.js';

interface CrashPoint {
  readonly label: string;
  readonly step: CommitStep;
  readonly isPrimary?: boolean;
  /** Whether the transaction has passed its commit point when the client stops. */
  readonly committed: boolean;
  /** Stop after one secondary is committed while the others are still locked. */
  readonly midway?: boolean;
}

export const CRASH_POINTS: readonly CrashPoint[] = [
  { label: 'after the primary prewrite', step: 'afterPrewrite', isPrimary: true, committed: false },
  { label: 'after a secondary prewrite', step: 'afterPrewrite', isPrimary: false, committed: false },
  { label: 'before the primary commit', step: 'beforeCommitPrimary', committed: false },
  { label: 'after the primary commit', step: 'afterCommitPrimary', committed: true },
  {
    label: 'midway through the secondary commits',
    step: 'afterCommitSecondary',
    committed: true,
    midway: true,
  },
];

/** Rows of the crash cases; the primary is the first in (table, key) order: p_crash/k0. */
const CRASH_ROWS = [
  ['p_crash', 'k0'],
  ['p_crash', 'k1'],
  ['p_crash', 'k2'],
  ['p_crash', 'k3'],
  ['p_crash_2', 'k4'],
] as const;

async function crashAt(ctx: CaseContext, point: CrashPoint, mode: FaultMode): Promise<void> {
  const store = await ctx.createStore();
  const clock = new FakeClock();
  const lockTtlMs = LOCK_TTL_MS;
  const setup = client(ctx, store, { clock, lockTtlMs }).db;
  await setup.transact(async (tx) => {
    for (const [table, row] of CRASH_ROWS) tx.set(table, row, 'v', 'old');
  });
  // Its secondary commits run in the background: let them end before the crashing client starts.
  await setup.flush();

  let crashedAt: CommitStepEvent | undefined;
  let crasher: Client | undefined;
  let primaryRow: string | undefined;
  // For "midway": the one secondary let through, and the ones held back.
  let freeSecondary: string | undefined;
  const heldSecondaries = new Set<string>();
  let hold: ReturnType<NonNullable<Client['faulty']>['hold']> | undefined;
  const onCommitStep = (e: CommitStepEvent) => {
    if (crashedAt !== undefined) return;
    if (e.step === 'afterPrewrite' && e.isPrimary) primaryRow = e.row;
    if (point.midway && e.step === 'afterCommitPrimary') {
      // Keep every secondary but one from reaching the store (their commits are dropped,
      // alone or as their part of a batch), so the client stops with one secondary
      // committed and the others still locked.
      const secondaries = CRASH_ROWS.map(([, row]) => row).filter((row) => row !== primaryRow);
      freeSecondary = secondaries[0];
      for (const row of secondaries.slice(1)) heldSecondaries.add(row);
      hold = crasher!.faulty!.hold(
        (call) => call.operation === 'checkAndSet' && heldSecondaries.has(call.key ?? ''),
      );
      hold.fail();
    }
    if (e.step !== point.step) return;
    if (point.isPrimary !== undefined && e.isPrimary !== point.isPrimary) return;
    crashedAt = e;
    throw new ClientCrash(`client stopped ${point.label}`);
  };
  crasher = client(ctx, store, { clock, lockTtlMs, wrap: point.midway, hooks: { onCommitStep } });
  // Secondary commits that reached the store after the commit point.
  const landed = new Set<string>();
  crasher.faulty?.onCall((call, outcome) => {
    if (
      call.operation === 'checkAndSet' &&
      applied(outcome) &&
      hold !== undefined &&
      crashedAt === undefined
    ) {
      landed.add(call.key ?? '');
    }
  });
  ctx.defer(() => hold?.fail());

  const tx = await crasher.db.begin();
  for (const [table, row] of CRASH_ROWS) tx.set(table, row, 'v', 'new');
  const error = await tx.commit().then(
    () => undefined,
    (e: unknown) => e,
  );
  if (error === undefined) {
    // commit() resolves at the commit point; the secondaries go on in the background, so a
    // client stopping among them has already reported success. Wait for the stop itself.
    check(
      point.step === 'afterCommitSecondary',
      `commit of a client that stops ${point.label} must fail with the hook's ClientCrash, but it resolved`,
    );
    await waitFor(() => crashedAt !== undefined, 10_000, `the background secondaries to reach ${point.step}`);
  } else {
    check(
      error instanceof ClientCrash,
      `commit() must reject with the hook's ClientCrash, got ${errorText(error)}`,
    );
  }
  check(
    crashedAt !== undefined,
    `the commit never reached the step ${point.step}${point.isPrimary === undefined ? '' : ` (isPrimary ${point.isPrimary})`}`,
  );
  if (point.midway) {
    check(
      freeSecondary !== undefined &&
        landed.has(freeSecondary) &&
        ![...heldSecondaries].some((k) => landed.has(k)),
      `the client did not stop midway: ${[...landed].join(',')}`,
    );
  }

  // The stuck state is there: every stop leaves some lock of the transaction for readers
  // to settle (a stop that fired after the secondaries, say, would leave none, and the
  // reads below would check nothing: found in review).
  let locked = 0;
  for (const [table, row] of CRASH_ROWS) {
    const stored = await store.read(table, row);
    if (stored && inspectHeadRow(stored.state).cells.some((c) => c.lock !== undefined)) locked++;
  }
  check(locked > 0, `a client stopped ${point.label}, yet no row of its transaction holds a lock`);

  const expected = point.committed ? 'new' : 'old';
  const faults = faultsFor(mode);
  if (mode === 'clean') {
    // Before the lock expires, a reader must not roll back a transaction that may be alive.
    const patient = client(ctx, store, { clock, lockTtlMs, lockWaitMs: 40 }).db;
    let blocked = 0;
    for (const [table, row] of CRASH_ROWS) {
      const got = await patient
        .transact((t) => t.getString(table, row, 'v'), { maxAttempts: 1 })
        .then(
          (v) => v,
          (e: unknown) => e,
        );
      if (got instanceof LockNotResolvedError) blocked++;
      else if (got instanceof Error) throw got;
      else
        check(
          got === expected,
          `before the lock expired, ${table}/${row} read ${format(got)}, expected ${expected} or a wait`,
        );
    }
    if (!point.committed)
      check(blocked > 0, 'a reader rolled back a crashed transaction before its lock expired');
    else checkEqual(blocked, 0, 'readers blocked on a transaction whose primary is committed');
  }

  clock.advance(lockTtlMs + 1);
  // Secondaries first, so readers resolve through a secondary's lock.
  const order = [CRASH_ROWS[2], CRASH_ROWS[1], CRASH_ROWS[4], CRASH_ROWS[3], CRASH_ROWS[0]];
  const readers = [0, 1].map(() => client(ctx, store, { clock, lockTtlMs, faults }).db);
  const seen = await Promise.all(
    readers.map((db, i) =>
      settled(
        db,
        (t) => readAll(t, i === 0 ? order : [...order].reverse()),
        `reading after a crash ${point.label}`,
      ),
    ),
  );
  for (const values of seen) {
    checkEqual(
      values,
      order.map(() => expected),
      `after a client stopped ${point.label} and its lock expired, a reader must see all of the transaction or none`,
    );
  }
  if (store.capabilities.orderedScan) {
    const scanned = await settled(
      readers[0]!,
      async (t) => {
        const values: string[] = [];
        for await (const r of t.scan('p_crash')) values.push(new TextDecoder().decode(r.columns.get('v')));
        return values;
      },
      'scanning after a crash',
    );
    checkEqual(
      scanned,
      ['k0', 'k1', 'k2', 'k3'].map(() => expected),
      'a scan after the crash',
    );
  }
  // No lock is left behind: a new transaction writes every row.
  await settled(
    readers[1]!,
    async (t) => {
      for (const [table, row] of CRASH_ROWS) t.set(table, row, 'v', 'later');
    },
    'writing after a crash',
  );
  checkEqual(
    await settled(readers[0]!, (t) => readAll(t, CRASH_ROWS), 'reading the later write'),
    CRASH_ROWS.map(() => 'later'),
    'a transaction after the crash',
  );
}

// ---------------------------------------------------------------------------------------

async function latePrewrite(ctx: CaseContext, mode: FaultMode): Promise<void> {
  const store = await ctx.createStore();
  const clock = new FakeClock();
  // The stopped client's clock stands still, so its lock looks expired to the reader.
  const frozen = new FakeClock(clock.nowMs);
  const T = 'p_late';
  const setup = client(ctx, store, { clock, lockTtlMs: LOCK_TTL_MS }).db;
  await setup.transact(async (tx) => {
    tx.set(T, 'k0', 'v', 'old');
    tx.set(T, 'k1', 'v', 'old');
  });
  // The setup's secondary commit (k1) and tidy steps run in the background: let them end, so
  // the slow client's prewrites race only with the reader.
  await setup.flush();
  // Two phases: a one-step commit writes no lock, so nothing of it can be late.
  const slow = client(ctx, store, { clock: frozen, lockTtlMs: LOCK_TTL_MS, wrap: true, onePhaseMaxRows: 1 });
  const faulty = slow.faulty!;
  const landed = new Set<string>();
  faulty.onCall((call, outcome) => {
    if (call.operation === 'checkAndSet' && applied(outcome)) landed.add(call.key ?? '');
  });
  const primaryHold = faulty.hold((call) => call.operation === 'checkAndSet' && call.key === 'k0');
  const tx = await slow.db.begin();
  tx.set(T, 'k0', 'v', 'new');
  tx.set(T, 'k1', 'v', 'new');
  const commit = tx.commit().then(
    () => undefined,
    (e: unknown) => e,
  );
  await within(primaryHold.reached, 5000, 'the primary prewrite');
  // With faults, the reader's calls (its rollback record too) may fail or be ambiguous; the
  // slow client's are held to order events exactly, so they get none.
  const readerClient = client(ctx, store, {
    clock,
    lockTtlMs: LOCK_TTL_MS,
    faults: faultsFor(mode),
    // Its own lost reply, on the primary's rollback, below.
    forceLostReply: false,
  });
  const reader = readerClient.db;
  // The fault that matters here: the reader's rollback of the primary (k0, whichever row it
  // met first) lands but is reported failed, so the reader must find out it landed.
  if (mode === 'faulty') readerClient.faulty!.failAfter((call) => call.key === 'k0', 'checkAndSet');
  const parallel = await waitFor(() => landed.has('k1'), 3000, 'the secondary prewrite').then(
    () => true,
    () => false,
  );
  let lateHold: ReturnType<typeof faulty.hold> | undefined;
  if (parallel) {
    // k1 is locked, k0's prewrite is in flight. A reader meets k1's lock after it expired,
    // finds neither lock nor record on the primary, and leaves a rollback record there.
    clock.advance(LOCK_TTL_MS + 1);
    checkEqual(
      await settled(reader, (t) => t.getString(T, 'k1', 'v'), 'reading k1'),
      'old',
      'k1 read by the reader',
    );
    primaryHold.release();
  } else {
    // This core prewrites the primary first: hold the secondary's prewrite instead, let the
    // reader roll back the expired primary, then let the late secondary prewrite land.
    ctx.note(
      'prewrites run primary first: tested a late secondary prewrite after the primary was rolled back',
    );
    lateHold = faulty.hold((call) => call.operation === 'checkAndSet' && call.key === 'k1');
    primaryHold.release();
    await within(lateHold.reached, 5000, 'the secondary prewrite');
    clock.advance(LOCK_TTL_MS + 1);
    checkEqual(
      await settled(reader, (t) => t.getString(T, 'k0', 'v'), 'reading k0'),
      'old',
      'k0 read by the reader',
    );
    lateHold.release();
  }
  const outcome = await within(commit, 15_000, 'the commit of the rolled-back transaction');
  check(
    outcome instanceof ConflictError,
    () =>
      `a transaction rolled back by a reader must fail when its late prewrite arrives; commit gave ${outcome === undefined ? 'success' : errorText(outcome)}`,
  );
  checkEqual(
    await settled(
      reader,
      (t) =>
        readAll(t, [
          [T, 'k0'],
          [T, 'k1'],
        ]),
      'reading after the late prewrite',
    ),
    ['old', 'old'],
    'rows after the rolled-back transaction',
  );
  await settled(
    reader,
    async (t) => {
      t.set(T, 'k0', 'v', 'later');
      t.set(T, 'k1', 'v', 'later');
    },
    'writing after the late prewrite',
  );
  if (mode === 'faulty') {
    check(
      readerClient.faulty!.log.some(
        (e) => e.kind === 'after' && e.call.operation === 'checkAndSet' && e.call.key === 'k0',
      ),
      "the reader's rollback of the primary never lost its reply",
    );
  }
}

// ---------------------------------------------------------------------------------------

async function heartbeat(ctx: CaseContext, mode: FaultMode): Promise<void> {
  const store = await ctx.createStore();
  const clock = new FakeClock();
  const ttl = 300;
  const T = 'p_slow';
  const rows = [
    [T, 'k0'],
    [T, 'k1'],
    [T, 'k2'],
  ] as const;
  const setup = client(ctx, store, { clock, lockTtlMs: ttl }).db;
  await setup.transact(async (tx) => {
    for (const [table, row] of rows) tx.set(table, row, 'v', 'old');
  });
  await setup.flush();
  const paused = gate();
  const resume = gate();
  ctx.defer(resume.open);
  const slow = client(ctx, store, {
    clock,
    lockTtlMs: ttl,
    wrap: true,
    hooks: {
      onCommitStep: async (e) => {
        if (e.step !== 'beforeCommitPrimary') return;
        paused.open();
        await resume.promise;
      },
    },
  });
  // With faults: the primary's prewrite and first two heartbeats land but are reported
  // failed (ambiguous); the committer must still keep its lock and commit.
  const ambiguousBeats = mode === 'faulty' ? 3 : 0;
  if (ambiguousBeats > 0)
    slow.faulty!.inject({
      kind: 'after',
      operation: 'checkAndSet',
      match: (call) => call.key === 'k0',
      times: ambiguousBeats,
    });
  let beats = 0;
  slow.faulty!.onCall((call, outcome) => {
    if (call.operation === 'checkAndSet' && call.key === 'k0' && applied(outcome)) beats++;
  });
  const tx = await slow.db.begin();
  for (const [table, row] of rows) tx.set(table, row, 'v', 'new');
  const commit = tx.commit().then(
    (r) => r,
    (e: unknown) => (e instanceof Error ? e : new Error(String(e))),
  );
  await within(paused.promise, 5000, 'the slow committer to reach its commit point');
  // With faults, on the reader only: the committer's calls are counted as heartbeats.
  const reader = client(ctx, store, { clock, lockTtlMs: ttl, lockWaitMs: 30, faults: faultsFor(mode) }).db;
  const rounds = 6;
  const step = Math.floor((ttl * 2) / 3);
  for (let i = 0; i < rounds; i++) {
    clock.advance(step);
    const before = beats;
    await waitFor(() => beats > before, 10 * ttl, `a heartbeat of the slow committer (round ${i})`);
    // The lock is fresh again: a reader must wait for it, not roll the transaction back.
    for (const [table, row] of [rows[1], rows[0]]) {
      let got: unknown;
      // An injected fault (StoreError) is not an answer: ask again.
      for (let attempt = 0; attempt < 10 && (attempt === 0 || got instanceof StoreError); attempt++) {
        got = await reader
          .transact((t) => t.getString(table, row, 'v'), { maxAttempts: 1 })
          .then(
            (v) => v,
            (e: unknown) => e,
          );
      }
      check(
        got instanceof LockNotResolvedError,
        () =>
          `a reader met a heartbeated lock on ${row} and got ${got instanceof Error ? errorText(got) : format(got)}, expected to wait (LockNotResolvedError)`,
      );
    }
  }
  resume.open();
  const result = await within(commit, 15_000, 'the slow commit');
  check(!(result instanceof Error), () => `the slow committer was rolled back: ${errorText(result)}`);
  checkEqual(
    await setup.transact((t) => readAll(t, rows)),
    ['new', 'new', 'new'],
    'rows after the slow commit',
  );
  checkEqual(slow.faulty!.stats.failedAfter, ambiguousBeats, 'ambiguous faults on the primary row');
  ctx.note(
    `paused ${rounds * step} ms of clock time with a ${ttl} ms lock TTL; ${beats} heartbeats kept it alive`,
  );
}

export function recoveryCases(mode: FaultMode): ConformanceCase[] {
  const part = partFor(mode);
  const s = faultSuffix(mode);
  const cases: ConformanceCase[] = [];
  for (const point of CRASH_POINTS) {
    cases.push({
      part,
      name: `a client that stops ${point.label}: readers see ${point.committed ? 'all' : 'none'} of it${s}`,
      run: (ctx) => crashAt(ctx, point, mode),
    });
  }
  cases.push(
    {
      part,
      name: `rollback records make a late prewrite fail${s}`,
      run: (ctx) => latePrewrite(ctx, mode),
    },
    {
      part,
      name: `lock expiry and heartbeat: a slow committer keeps its lock alive and commits${s}`,
      run: (ctx) => heartbeat(ctx, mode),
    },
  );
  return cases;
}
