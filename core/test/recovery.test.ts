import {
  ClientCrash,
  type CommitStepEvent,
  CommitUnknownError,
  ConflictError,
  LockNotResolvedError,
  MemoryStore,
  Percolator,
} from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { decodeRow } from '../src/codec.js';
import { fakeClock, InstrumentedStore } from './support.js';

const ROWS = ['a', 'b', 'c', 'd'];
const TTL = 1000;

async function readAll(db: Percolator) {
  return db.transact(async (tx) => Promise.all(ROWS.map((r) => tx.getString('t', r, 'v'))));
}

/** Seeds four rows at "old", then lets a client crash at `crashWhen` while writing "new" to all four. */
async function crashScenario(crashWhen: (e: CommitStepEvent, seen: CommitStepEvent[]) => boolean) {
  const store = new InstrumentedStore(new MemoryStore(), { stampedCheckAndSet: false });
  const clock = fakeClock();
  const setup = new Percolator({ store, clock, lockTtlMs: TTL });
  await setup.transact(async (tx) => {
    for (const r of ROWS) tx.set('t', r, 'v', 'old');
  });
  const seen: CommitStepEvent[] = [];
  let crashed = false;
  const crasher = new Percolator({
    store,
    clock,
    lockTtlMs: TTL,
    hooks: {
      onCommitStep: (e) => {
        seen.push(e);
        if (!crashed && crashWhen(e, seen)) {
          crashed = true;
          throw new ClientCrash();
        }
      },
    },
  });
  const tx = await crasher.begin();
  for (const r of ROWS) tx.set('t', r, 'v', 'new');
  const outcome = await tx.commit().then(
    () => 'committed',
    (e: unknown) => e,
  );
  // Secondaries are committed in the background: a stop there comes after commit() resolved.
  await crasher.close();
  expect(crashed).toBe(true);
  if (outcome !== 'committed') expect(outcome).toBeInstanceOf(ClientCrash);
  else expect(seen.at(-1)?.step).toBe('afterCommitSecondary');
  await new Promise((r) => setTimeout(r, 5)); // let requests already in flight land, as after a real crash
  return { store, clock, seen };
}

const secondaryPrewrites = (seen: CommitStepEvent[]) =>
  seen.filter((e) => e.step === 'afterPrewrite' && !e.isPrimary).length;

describe('a client that crashes during commit', () => {
  const cases: Array<[string, (e: CommitStepEvent, seen: CommitStepEvent[]) => boolean, 'old' | 'new']> = [
    ['before any prewrite', (e) => e.step === 'beforePrewrite', 'old'],
    ['right after the primary prewrite', (e) => e.step === 'afterPrewrite' && e.isPrimary === true, 'old'],
    [
      'after some secondary prewrites',
      (e, seen) => e.step === 'afterPrewrite' && secondaryPrewrites(seen) === 2,
      'old',
    ],
    ['after every prewrite, before the commit point', (e) => e.step === 'beforeCommitPrimary', 'old'],
    ['right after the commit point', (e) => e.step === 'afterCommitPrimary', 'new'],
    [
      'midway through the secondaries',
      (e, seen) =>
        e.step === 'afterCommitSecondary' &&
        seen.filter((s) => s.step === 'afterCommitSecondary').length === 1,
      'new',
    ],
  ];

  for (const [name, crashWhen, expected] of cases) {
    it(`${name}: readers see all of it or none of it`, async () => {
      const { store, clock } = await crashScenario(crashWhen);
      const reader = new Percolator({ store, clock, lockTtlMs: TTL, lockWaitMs: 30 });
      if (expected === 'old') {
        // Locks of a possibly-live transaction: a reader waits, then gives up with a retryable error.
        const locked = await reader
          .transact(async (tx) => tx.getString('t', 'a', 'v'), { maxAttempts: 1 })
          .catch((e) => e);
        if (locked instanceof Error) expect(locked).toBeInstanceOf(LockNotResolvedError);
      }
      clock.advance(TTL + 1);
      expect(await readAll(reader)).toEqual(ROWS.map(() => expected));
      // Every lock is gone: a writer can now update every row.
      await reader.transact(async (tx) => {
        for (const r of ROWS) tx.set('t', r, 'v', 'after');
      });
      expect(await readAll(reader)).toEqual(ROWS.map(() => 'after'));
    });
  }

  it('after the commit point, readers roll forward at once, without waiting for expiry', async () => {
    const { store, clock } = await crashScenario((e) => e.step === 'afterCommitPrimary');
    const reader = new Percolator({ store, clock, lockTtlMs: TTL, lockWaitMs: 30 });
    expect(await readAll(reader)).toEqual(ROWS.map(() => 'new'));
  });

  it('a commit record stays while its secondaries are locked, however often the primary is rewritten', async () => {
    const { store, clock } = await crashScenario((e) => e.step === 'afterCommitPrimary');
    const writer = new Percolator({
      store,
      clock,
      lockTtlMs: TTL,
      gc: { retentionMs: 0, maxVersionsPerCell: 2 },
    });
    // 'a' is the primary (first in key order); hammering it makes pruning run on every commit.
    for (let i = 0; i < 50; i++) await writer.transact(async (tx) => tx.set('t', 'a', 'v', `a${i}`));
    clock.advance(TTL + 1);
    expect(
      await writer.transact(async (tx) => Promise.all(['b', 'c', 'd'].map((r) => tx.getString('t', r, 'v')))),
    ).toEqual(['new', 'new', 'new']);
  });
});

describe('rollback records', () => {
  // Drawn: the identity is the start timestamp. Peeked on a store with no stamped CAS: an
  // identity drawn beside the peek, below the snapshot (docs/protocol.md 4.10, "Identity
  // ahead"), so its rollback record is below the snapshot too, and the prewrite's conflict
  // check at the snapshot alone would not see it (it did not, before prewrite.ts looked).
  it.each([
    ['a drawn start timestamp', false],
    ['an identity drawn ahead of a peeked snapshot', true],
  ])('make a late prewrite of a rolled-back transaction fail (%s)', async (_, peekedWrites) => {
    const store = new InstrumentedStore(new MemoryStore(), { stampedCheckAndSet: false });
    const clock = fakeClock();
    const db = new Percolator({ store, clock, lockTtlMs: TTL, peekedWrites });
    const slow = await db.begin();
    slow.set('t', 'a', 'v', 'slow'); // 'a' is the primary
    slow.set('t', 'b', 'v', 'slow');
    const release = store.gate('t', 'a'); // the primary prewrite is held in flight
    const committing = slow.commit();
    await new Promise((r) => setTimeout(r, 5));
    const lock = decodeRow((await store.inner.read('t', 'b'))!.state).cells.get('v')!.lock!;
    if (peekedWrites) expect(lock.startTs).toBeLessThan(slow.startTs);
    else expect(lock.startTs).toBe(slow.startTs);
    // A reader meets the secondary lock on 'b'; the primary has neither lock nor record.
    clock.advance(TTL + 1);
    const reader = new Percolator({ store, clock, lockTtlMs: TTL });
    expect(await reader.transact((tx) => tx.getString('t', 'b', 'v'))).toBeUndefined();
    release(); // the late primary prewrite now reaches the store
    await expect(committing).rejects.toBeInstanceOf(ConflictError);
    clock.advance(TTL + 1);
    expect(
      await reader.transact(async (tx) => [
        await tx.getString('t', 'a', 'v'),
        await tx.getString('t', 'b', 'v'),
      ]),
    ).toEqual([undefined, undefined]);
  });

  it('an expired primary is rolled back by a reader, and its owner then fails to commit', async () => {
    const store = new InstrumentedStore(new MemoryStore(), { stampedCheckAndSet: false });
    const clock = fakeClock();
    let stall: (() => void) | undefined;
    const stalled = new Promise<void>((r) => {
      stall = r;
    });
    const owner = new Percolator({
      store,
      clock,
      lockTtlMs: TTL,
      hooks: { onCommitStep: (e) => (e.step === 'beforeCommitPrimary' ? stalled : undefined) },
    });
    const tx = await owner.begin();
    tx.set('t', 'a', 'v', 'x');
    tx.set('t', 'b', 'v', 'x');
    const committing = tx.commit();
    await new Promise((r) => setTimeout(r, 5));
    clock.advance(10 * TTL); // the owner's heartbeat cannot keep up with a clock jump this large
    const reader = new Percolator({ store, clock, lockTtlMs: TTL });
    expect(await reader.transact((t) => t.getString('t', 'a', 'v'))).toBeUndefined();
    stall!();
    await expect(committing).rejects.toBeInstanceOf(ConflictError);
    expect(await reader.transact((t) => t.getString('t', 'b', 'v'))).toBeUndefined();
  });
});

describe('a transaction that conflicts before any prewrite is sent', () => {
  it('writes nothing, so aborted ones do not push the cell past live snapshots (maxVersionsPerCell)', async () => {
    // Found in review: each abort left a rollback record on its primary cell even when its
    // conflict was found in the rows as read, before any prewrite went out; the records
    // counted towards the cell's version cap, and 45 aborts made a reader of a millisecond
    // ago fail as too old, its value still in the head row.
    // Two-phase commits whose prewrites go in one batch (checkAndSetMany), writes counted.
    const inner = new MemoryStore();
    let writes = 0;
    const store = new Proxy(inner, {
      get(target, prop, receiver) {
        if (prop === 'capabilities')
          return { ...target.capabilities, stampedCheckAndSet: false, stampedCheckAndSetMany: false };
        const value = Reflect.get(target, prop, receiver);
        if (prop === 'checkAndSet' || prop === 'checkAndSetMany') {
          return (...args: unknown[]) => {
            writes++;
            return (value as (...a: unknown[]) => unknown).apply(target, args);
          };
        }
        return typeof value === 'function' ? value.bind(target) : value;
      },
    });
    const db = new Percolator({ store });
    await db.transact(async (tx) => {
      tx.set('t', 'r', 'c', 'v1');
      tx.set('t', 's', 'z', '0');
    });
    const reader = await db.begin();
    await reader.getString('t', 's', 'z');
    let aborted = 0;
    for (let i = 0; i < 45; i++) {
      // The newer write is in the row when the loser reads it: the conflict shows there.
      const loser = await db.begin();
      await db.transact(async (tx) => tx.set('t', 's', 'z', String(i)));
      await loser.getString('t', 's', 'z');
      loser.set('t', 'r', 'c', 'never'); // r/c is the primary: the first row in order
      loser.set('t', 's', 'z', 'x');
      const before = writes;
      await expect(loser.commit()).rejects.toBeInstanceOf(ConflictError);
      // Found in the rows as read: no prewrite, and no rollback, reached the store.
      expect(writes).toBe(before);
      aborted++;
    }
    await db.transact(async (tx) => tx.set('t', 'r', 'c', 'v2'));
    expect(aborted).toBe(45);
    expect(await reader.getString('t', 'r', 'c')).toBe('v1');
    const cell = decodeRow((await inner.read('t', 'r'))!.state).cells.get('c')!;
    expect(cell.writes.filter((w) => w.kind === 'rollback')).toHaveLength(0);
    await reader.rollback();
    await db.close();
  });
});

describe('heartbeat', () => {
  it('keeps a slow committer alive: readers wait instead of rolling it back', async () => {
    const store = new InstrumentedStore(new MemoryStore(), { stampedCheckAndSet: false });
    const ttl = 120;
    const owner = new Percolator({
      store,
      lockTtlMs: ttl,
      hooks: {
        onCommitStep: (e) =>
          e.step === 'beforeCommitPrimary' ? new Promise((r) => setTimeout(r, ttl * 5)) : undefined,
      },
    });
    const tx = await owner.begin();
    tx.set('t', 'a', 'v', 'slow');
    tx.set('t', 'b', 'v', 'slow');
    const committing = tx.commit();
    await new Promise((r) => setTimeout(r, 20));
    const reader = new Percolator({ store, lockTtlMs: ttl, lockWaitMs: ttl * 20 });
    // The reader started after the commit timestamp was drawn: it must wait for the
    // outcome and then see the write. Rolling the live owner back would lose it.
    const read = await reader.transact((t) => t.getString('t', 'b', 'v'));
    expect(read).toBe('slow');
    await expect(committing).resolves.toHaveProperty('commitTs');
    expect(await reader.transact((t) => t.getString('t', 'b', 'v'))).toBe('slow');
  });
});

describe('ambiguous store replies on the primary commit', () => {
  async function setup(fault: 'fail-after' | 'fail-before', readsFail: boolean) {
    const store = new InstrumentedStore(new MemoryStore(), { stampedCheckAndSet: false });
    let armed = false;
    let faults = 0;
    store.casFault = (r) => (armed && r.key === 'a' && faults++ === 0 ? fault : undefined);
    store.readFault = (_t, key) => armed && readsFail && key === 'a';
    const db = new Percolator({
      store,
      hooks: {
        onCommitStep: (e) => {
          armed = e.step === 'beforeCommitPrimary';
        },
      },
    });
    const tx = await db.begin();
    tx.set('t', 'a', 'v', 'new');
    tx.set('t', 'b', 'v', 'new');
    const outcome = await tx.commit().then(
      (r) => ({ ok: true as const, commitTs: r.commitTs }),
      (e: unknown) => ({ ok: false as const, error: e }),
    );
    armed = false;
    const reader = new Percolator({ store });
    const seen = await reader.transact(async (t) => [
      await t.getString('t', 'a', 'v'),
      await t.getString('t', 'b', 'v'),
    ]);
    return { outcome, seen };
  }

  it('applied but the reply was lost: verified by re-reading, reported as committed', async () => {
    const { outcome, seen } = await setup('fail-after', false);
    expect(outcome.ok).toBe(true);
    expect(seen).toEqual(['new', 'new']);
  });

  it('not applied and the reply was lost: retried, then committed', async () => {
    const { outcome, seen } = await setup('fail-before', false);
    expect(outcome.ok).toBe(true);
    expect(seen).toEqual(['new', 'new']);
  });

  it('applied, and the outcome cannot be re-read: CommitUnknownError, never a plain failure', async () => {
    const { outcome, seen } = await setup('fail-after', true);
    expect(outcome.ok).toBe(false);
    expect((outcome as { error: unknown }).error).toBeInstanceOf(CommitUnknownError);
    expect(seen).toEqual(['new', 'new']); // it did commit
  });

  it('not applied, and the outcome cannot be re-read: CommitUnknownError, never a silent success', async () => {
    const { outcome, seen } = await setup('fail-before', true);
    expect(outcome.ok).toBe(false);
    expect((outcome as { error: unknown }).error).toBeInstanceOf(CommitUnknownError);
    expect(seen[0]).toBe(seen[1]); // all or nothing once readers resolve it
  });

  it('ambiguous prewrites are re-read and recognised as ours', async () => {
    const store = new InstrumentedStore(new MemoryStore(), { stampedCheckAndSet: false });
    let n = 0;
    store.casFault = () => (n++ % 2 === 0 ? 'fail-after' : undefined);
    const db = new Percolator({ store });
    await db.transact(async (tx) => {
      tx.set('t', 'a', 'v', '1');
      tx.set('t', 'b', 'v', '1');
      tx.set('t', 'c', 'v', '1');
    });
    store.casFault = () => undefined;
    expect(
      await db.transact(async (tx) => Promise.all(['a', 'b', 'c'].map((r) => tx.getString('t', r, 'v')))),
    ).toEqual(['1', '1', '1']);
  });
});
