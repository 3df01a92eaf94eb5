import {
  CommitUnknownError,
  ConflictError,
  inspectHeadRow,
  MemoryStore,
  Percolator,
  type PercolatorEvent,
  RowTooLargeError,
  StoreError,
  type Transaction,
} from '@percolator/core';
import { describe, expect, it } from 'vitest';
import {
  BLOCK_FORMAT,
  BLOCK_FORMAT_STAMPED,
  decodeVersionRow,
  encodeVersionRow,
  VERSION_FORMAT,
} from '../src/codec.js';
import type { CasRequest } from '../src/store.js';
import { versionKey, versionTable } from '../src/versions.js';
import { fakeClock, InstrumentedStore } from './support.js';

/**
 * One-phase commits of several rows (docs/protocol.md 4.5): on a store that writes many
 * rows and draws their commit timestamp in one atomic step, a transaction that fits one
 * such step commits in it, with no lock ever written.
 */

const ONE_STEP = { stampedCheckAndSetMany: true } as const;

/** Every cell of (table, row) as stored: its lock and its records. */
async function cellsOf(store: MemoryStore, table: string, row: string) {
  const stored = await store.read(table, row);
  return stored ? inspectHeadRow(stored.state).cells : [];
}

async function seed(db: Percolator, rows: readonly string[], value: string): Promise<void> {
  await db.transact(async (tx) => {
    for (const row of rows) tx.set('t', row, 'v', value);
  });
  await db.flush(); // its tidy step, so later guesses from the row cache hold
}

/** A transaction that has read each row's counter and set it one higher, not committed yet. */
async function incremented(db: Percolator, rows: readonly string[]): Promise<Transaction> {
  const tx = await db.begin();
  for (const row of rows) tx.set('t', row, 'v', String(Number(await tx.getString('t', row, 'v')) + 1));
  return tx;
}

describe('one-phase commits of several rows', () => {
  it('a tidy pass before the step whose outcome cannot be verified fails the commit as not applied, retryable (not an internal error)', async () => {
    // Found in review: relievePressure's AmbiguousOutcome (a tidy write whose reply was lost,
    // its re-reads failing too) escaped a one-step commit as the internal class, not retryable.
    const inner = new MemoryStore({ maxStateBytes: 8192 });
    const store = new InstrumentedStore(inner, ONE_STEP);
    const gc = { inlineHistoryBytes: 1_000_000, maxVersionsPerCell: 1000, retentionMs: 3_600_000 };
    const db = new Percolator({ store, gc });
    // Old values inline until the head row is past half the limit, a quarter of it history.
    for (let i = 0; i < 6; i++) await seed(db, ['r', 'r2'], `${i}`.repeat(1000));
    expect((await inner.read('t', 'r'))!.state.length).toBeGreaterThan(4096);
    let armed = true;
    const tx = await db.begin();
    await tx.getString('t', 'r', 'v'); // known to this transaction: the pressure check sees it
    const stepsBefore = store.stampedManyCalls;
    // From here every write to row r loses its reply, and once one has, every read of it fails.
    let lost = false;
    store.casFault = (r) => {
      if (!armed || r.table !== 't' || r.key !== 'r') return undefined;
      lost = true;
      return 'fail-before';
    };
    store.readFault = (table, key) => armed && lost && table === 't' && key === 'r';
    tx.set('t', 'r', 'v', 'new');
    tx.set('t', 'r2', 'v', 'new');
    const error = await tx.commit().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    expect((error as StoreError).retryable).toBe(true);
    expect(store.stampedManyCalls - stepsBefore).toBe(0); // the step itself was never sent
    armed = false;
    expect(await db.transact(async (t) => t.getString('t', 'r', 'v'))).toBe('5'.repeat(1000));
    await db.transact(async (t) => {
      t.set('t', 'r', 'v', 'after');
      t.set('t', 'r2', 'v', 'after');
    });
    expect(
      await db.transact(async (t) => [await t.getString('t', 'r', 'v'), await t.getString('t', 'r2', 'v')]),
    ).toEqual(['after', 'after']);
    await db.close();
  });

  it('commit in one checkAndSetStampedMany: no prewrite, no commit point apart, no secondaries, no lock', async () => {
    const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
    const db = new Percolator({ store, peekedWrites: false });
    await seed(db, ['a', 'b', 'c'], '0');
    await db.flush();
    const tx = await incremented(db, ['a', 'b', 'c']);
    const before = { ...store.calls, many: store.stampedManyCalls };
    const { commitTs } = await tx.commit();
    expect(store.stampedManyCalls - before.many).toBe(1);
    // Nothing else on the way: no CAS of any other kind, no timestamp drawn apart.
    expect(store.calls.checkAndSet - before.checkAndSet).toBe(0);
    expect(store.calls.checkAndSetStamped - before.checkAndSetStamped).toBe(0);
    expect(store.calls.incrementCounter - before.incrementCounter).toBe(0);
    expect(commitTs).toBeGreaterThan(tx.startTs);
    for (const row of ['a', 'b', 'c']) {
      const [cell] = await cellsOf(store.inner, 't', row);
      expect(cell!.lock).toBeUndefined();
      // Every row carries the one commit timestamp the store drew, with no secondaries list.
      expect(cell!.writes[0]).toMatchObject({ commitTs, startTs: tx.startTs, kind: 'put' });
      expect(cell!.writes[0]!.secondaries).toBeUndefined();
    }
    const later = await db.begin();
    expect(later.startTs).toBeGreaterThan(commitTs);
    expect(await Promise.all(['a', 'b', 'c'].map((r) => later.getString('t', r, 'v')))).toEqual([
      '1',
      '1',
      '1',
    ]);
    await db.close();
  });

  it('a store with stampedCheckAndSetMany and not stampedCheckAndSet commits several rows in one step, one row in two phases', async () => {
    // The two capabilities are independent (store.ts). Every stamped step goes through one
    // SharedSteps (shared-steps.ts), which must exist for the many-row step alone too.
    const store = new InstrumentedStore(new MemoryStore(), { ...ONE_STEP, stampedCheckAndSet: false });
    const db = new Percolator({ store, peekedWrites: false });
    await seed(db, ['a', 'b'], '0');
    const tx = await incremented(db, ['a', 'b']);
    const before = { ...store.calls, many: store.stampedManyCalls };
    const { commitTs } = await tx.commit();
    expect(store.stampedManyCalls - before.many).toBe(1);
    expect(store.calls.checkAndSet - before.checkAndSet).toBe(0);
    expect(store.calls.checkAndSetStamped - before.checkAndSetStamped).toBe(0);
    expect(commitTs).toBeGreaterThan(tx.startTs);
    // One row: no single-row stamped CAS here, so a prewrite and a commit point apart.
    const one = { ...store.calls, many: store.stampedManyCalls };
    await db.transact(async (t) => t.set('t', 'a', 'v', '7'));
    expect(store.stampedManyCalls - one.many).toBe(0);
    expect(store.calls.checkAndSetStamped - one.checkAndSetStamped).toBe(0);
    expect(store.calls.checkAndSet - one.checkAndSet).toBeGreaterThanOrEqual(2);
    const later = await db.begin();
    expect(await Promise.all(['a', 'b'].map((r) => later.getString('t', r, 'v')))).toEqual(['7', '1']);
    await db.close();
  });

  it('a blind write of several rows draws no start timestamp: the store draws one value for both', async () => {
    const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
    const db = new Percolator({ store, peekedWrites: false });
    // transact draws no start timestamp until the transaction reads (begin() draws one).
    let blind!: Transaction;
    await db.transact(async (tx) => {
      blind = tx;
      tx.set('t', 'a', 'v', 'x');
      tx.set('u', 'b', 'v', 'y');
      tx.delete('t', 'c', 'v');
    });
    expect(store.calls.incrementCounter + store.calls.readStamped + store.calls.readPeeked).toBe(0);
    expect(store.stampedManyCalls).toBe(1);
    const commitTs = blind.startTs;
    const [a] = await cellsOf(store.inner, 't', 'a');
    expect(a!.writes[0]).toMatchObject({ commitTs, startTs: commitTs });
    const reader = await db.begin();
    expect([await reader.getString('t', 'a', 'v'), await reader.getString('u', 'b', 'v')]).toEqual([
      'x',
      'y',
    ]);
    await db.close();
  });

  it('more rows than onePhaseMaxRows take two phases; onePhaseMaxRows 1 keeps every multi-row commit there', async () => {
    const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
    const rows = ['a', 'b', 'c', 'd'];
    const small = new Percolator({ store, peekedWrites: false, onePhaseMaxRows: 3 });
    await seed(small, rows, '1');
    expect(store.stampedManyCalls).toBe(0);
    await seed(small, rows.slice(0, 3), '2');
    expect(store.stampedManyCalls).toBe(1);
    const twoPhase = new Percolator({ store, peekedWrites: false, onePhaseMaxRows: 1 });
    await seed(twoPhase, rows.slice(0, 2), '3');
    expect(store.stampedManyCalls).toBe(1);
    expect(() => new Percolator({ store, peekedWrites: false, onePhaseMaxRows: 0 })).toThrow(
      /onePhaseMaxRows/,
    );
    expect(() => new Percolator({ store, peekedWrites: false, onePhaseMaxRows: 1.5 })).toThrow(
      /onePhaseMaxRows/,
    );
    await small.close();
    await twoPhase.close();
  });

  it('a lost reply (applied, then unknown): the re-read finds its records on every row, and it is not written twice', async () => {
    const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
    const db = new Percolator({ store, peekedWrites: false });
    await seed(db, ['a', 'b'], '0');
    const calls = store.stampedManyCalls;
    let faults = 1;
    store.manyFault = () => (faults-- > 0 ? 'fail-after' : undefined);
    const tx = await db.begin();
    expect(await tx.getString('t', 'a', 'v')).toBe('0');
    tx.set('t', 'a', 'v', '1');
    tx.set('t', 'b', 'v', '1');
    const { commitTs } = await tx.commit();
    expect(store.stampedManyCalls - calls).toBe(1); // the lost one, then none: the re-read settled it
    for (const row of ['a', 'b']) {
      const [cell] = await cellsOf(store.inner, 't', row);
      expect(cell!.writes.filter((w) => w.startTs === tx.startTs)).toHaveLength(1);
      expect(cell!.writes[0]!.commitTs).toBe(commitTs);
    }
    await db.close();
  });

  it('a call that never reached the store (unknown outcome, not applied) is sent again, and commits once', async () => {
    const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
    const db = new Percolator({ store, peekedWrites: false });
    await seed(db, ['a', 'b'], '0');
    const calls = store.stampedManyCalls;
    let faults = 2;
    store.manyFault = () => (faults-- > 0 ? 'fail-before' : undefined);
    const tx = await db.begin();
    await tx.getString('t', 'b', 'v');
    tx.set('t', 'a', 'v', '1');
    tx.set('t', 'b', 'v', '1');
    const { commitTs } = await tx.commit();
    expect(store.stampedManyCalls - calls).toBe(3);
    for (const row of ['a', 'b']) {
      const [cell] = await cellsOf(store.inner, 't', row);
      expect(cell!.writes.map((w) => w.commitTs)).toContain(commitTs);
      expect(cell!.writes.filter((w) => w.startTs === tx.startTs)).toHaveLength(1);
    }
    await db.close();
  });

  it('a blind write whose reply is lost is CommitUnknownError, never a second write; it landed on every row', async () => {
    const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
    const db = new Percolator({ store, peekedWrites: false });
    store.manyFault = () => 'fail-after';
    const blind = db.transact(async (tx) => {
      tx.set('t', 'a', 'v', 'x');
      tx.set('t', 'b', 'v', 'x');
    });
    await expect(blind).rejects.toBeInstanceOf(CommitUnknownError);
    expect(store.stampedManyCalls).toBe(1);
    store.manyFault = () => undefined;
    const reader = await db.begin();
    expect([await reader.getString('t', 'a', 'v'), await reader.getString('t', 'b', 'v')]).toEqual([
      'x',
      'x',
    ]);
    await db.close();
  });

  it('a reader whose start timestamp is drawn between the stamp and the reply sees every row of it', async () => {
    const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
    const db = new Percolator({ store, peekedWrites: false });
    const reader = new Percolator({ store: store.inner });
    await seed(db, ['a', 'b'], 'old');
    let release!: () => void;
    store.manyReplyHold = new Promise<void>((r) => {
      release = r;
    });
    const tx = await db.begin();
    await tx.getString('t', 'a', 'v');
    tx.set('t', 'a', 'v', 'new');
    tx.set('t', 'b', 'v', 'new');
    const sent = store.stampedManyCalls; // the seed's steps
    const committing = tx.commit();
    while (store.stampedManyCalls === sent) await new Promise((r) => setImmediate(r));
    await new Promise((r) => setImmediate(r));
    // Applied, reply held: a reader that starts now is above its stamp and sees all of it.
    const seen = await reader.transact(async (r) => [
      await r.getString('t', 'a', 'v'),
      await r.getString('t', 'b', 'v'),
    ]);
    expect(seen).toEqual(['new', 'new']);
    release();
    store.manyReplyHold = undefined;
    const { commitTs } = await committing;
    const snapshot = await reader.begin();
    expect(snapshot.startTs).toBeGreaterThan(commitTs);
    await db.close();
    await reader.close();
  });

  it('a row changed since it was read refuses the whole step: nothing of the attempt lands, and the retry commits', async () => {
    const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
    const db = new Percolator({ store, peekedWrites: false });
    const other = new Percolator({ store: store.inner });
    await seed(db, ['a', 'b'], '0');
    const events: PercolatorEvent[] = [];
    const watched = new Percolator({ store, peekedWrites: false, onEvent: (e) => events.push(e) });
    let attempts = 0;
    await watched.transact(async (tx) => {
      attempts++;
      const a = Number(await tx.getString('t', 'a', 'v'));
      const b = Number(await tx.getString('t', 'b', 'v'));
      if (attempts === 1) {
        // Another client writes b after this transaction read it.
        await other.transact(async (o) => o.set('t', 'b', 'v', '10'));
        const [cell] = await cellsOf(store.inner, 't', 'a');
        expect(cell!.writes).toHaveLength(1);
      }
      tx.set('t', 'a', 'v', String(a + 1));
      tx.set('t', 'b', 'v', String(b + 1));
    });
    expect(attempts).toBe(2);
    const failed = events.find((e) => e.type === 'commit.step' && e.step === 'onePhase' && e.error);
    expect(failed && failed.type === 'commit.step' ? failed.error : undefined).toBeInstanceOf(ConflictError);
    // a was not written by the refused attempt: one record from the seed, one from the retry.
    const [a] = await cellsOf(store.inner, 't', 'a');
    expect(a!.writes).toHaveLength(2);
    const reader = await db.begin();
    expect([await reader.getString('t', 'a', 'v'), await reader.getString('t', 'b', 'v')]).toEqual([
      '1',
      '11',
    ]);
    await Promise.all([db.close(), other.close(), watched.close()]);
  });

  it('a commit starts from the rows its reads decoded, and after a lost race decides on the rows as they are', async () => {
    const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
    const db = new Percolator({ store, peekedWrites: false });
    const other = new Percolator({ store: store.inner });
    await seed(db, ['a', 'b'], '0');
    let attempts = 0;
    await db.transact(async (tx) => {
      attempts++;
      const a = Number(await tx.getString('t', 'a', 'v'));
      const b = Number(await tx.getString('t', 'b', 'v'));
      // Another client writes another column of a row this transaction read: no conflict,
      // but the CAS that expected the row as read fails, and the retry must keep that write.
      if (attempts === 1) await other.transact(async (o) => o.set('t', 'b', 'w', 'theirs'));
      tx.set('t', 'a', 'v', String(a + 1));
      tx.set('t', 'b', 'v', String(b + 1));
    });
    expect(attempts).toBe(1); // the commit retried its step, not the transaction
    // a/v, b/v and b/w at a new snapshot.
    const cells = async () => {
      const reader = await db.begin();
      return Promise.all([
        reader.getString('t', 'a', 'v'),
        reader.getString('t', 'b', 'v'),
        reader.getString('t', 'b', 'w'),
      ]);
    };
    expect(await cells()).toEqual(['1', '1', 'theirs']);
    // Again, with the rows already cached and read: the same state is never taken twice.
    for (let i = 2; i <= 5; i++) {
      await db.transact(async (tx) => {
        const a = Number(await tx.getString('t', 'a', 'v'));
        tx.set('t', 'a', 'v', String(a + 1));
        tx.set('t', 'b', 'v', String(a + 1));
      });
    }
    expect(await cells()).toEqual(['5', '5', 'theirs']);
    await Promise.all([db.close(), other.close()]);
  });

  it("meets a two-phase commit's locks: an abandoned lock is rolled back first, a live one fails it with ConflictError", async () => {
    const inner = new MemoryStore();
    const store = new InstrumentedStore(inner, ONE_STEP);
    const clock = fakeClock();
    const ttl = 1000;
    const db = new Percolator({ store, peekedWrites: false, clock, lockTtlMs: ttl });
    await seed(db, ['a', 'b'], '0');
    // A two-phase client that stops after its prewrites: its locks stay on a and b.
    const crasher = new Percolator({
      store: inner,
      clock,
      lockTtlMs: ttl,
      onePhaseMaxRows: 1,
      hooks: {
        onCommitStep: (e) => {
          if (e.step === 'beforeCommitPrimary') throw new Error('client stopped');
        },
      },
    });
    const stopped = await crasher.begin();
    stopped.set('t', 'a', 'v', 'lost');
    stopped.set('t', 'b', 'v', 'lost');
    await expect(stopped.commit()).rejects.toThrow('client stopped');
    expect((await cellsOf(inner, 't', 'b'))[0]!.lock).toBeDefined();
    // Live: the paper aborts the newcomer.
    const blind = await db.begin();
    blind.set('t', 'a', 'v', '1');
    blind.set('t', 'b', 'v', '1');
    await expect(blind.commit()).rejects.toBeInstanceOf(ConflictError);
    // Abandoned (its TTL passed): rolled back, and the one-step commit goes through.
    clock.advance(ttl * 3);
    const tx = await db.begin();
    tx.set('t', 'a', 'v', '2');
    tx.set('t', 'b', 'v', '2');
    await tx.commit();
    for (const row of ['a', 'b']) expect((await cellsOf(inner, 't', row))[0]!.lock).toBeUndefined();
    const reader = await db.begin();
    expect([await reader.getString('t', 'a', 'v'), await reader.getString('t', 'b', 'v')]).toEqual([
      '2',
      '2',
    ]);
    await db.close();
  });

  it('rows the store cannot take in one step (RowTooLargeError, nothing sent) commit in two phases instead', async () => {
    const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
    const inner = store.inner;
    // The store refuses the batch as too large for one step, as MySQL does past one packet.
    (store as { checkAndSetStampedMany: unknown }).checkAndSetStampedMany = async () => {
      store.stampedManyCalls++;
      throw new RowTooLargeError('these states together exceed one packet');
    };
    const db = new Percolator({ store, peekedWrites: false });
    for (const blind of [true, false]) {
      let seen!: Transaction;
      await db.transact(async (tx) => {
        seen = tx;
        if (!blind) await tx.getString('t', 'a', 'v');
        tx.set('t', 'a', 'v', `v${blind}`);
        tx.set('t', 'b', 'v', `v${blind}`);
      });
      // Two phases: a start timestamp of its own (the blind one drew it after the refusal).
      const stored = await inner.read('t', 'a');
      const [cell] = inspectHeadRow(stored!.state).cells;
      expect(cell!.writes[0]).toMatchObject({ startTs: seen.startTs });
      expect(cell!.writes[0]!.commitTs).toBeGreaterThan(seen.startTs);
    }
    // One refused attempt per transaction, none again on the two-phase path.
    expect(store.stampedManyCalls).toBe(2);
    const reader = await new Percolator({ store: inner }).begin();
    expect([await reader.getString('t', 'a', 'v'), await reader.getString('t', 'b', 'v')]).toEqual([
      'vfalse',
      'vfalse',
    ]);
    await db.close();
  });

  describe('values the commit moves out of the head row ride in its step', () => {
    // inlineHistoryBytes 0: every superseded value leaves the head row.
    const gc = { inlineHistoryBytes: 0 };
    const text = (s: string) => new TextEncoder().encode(s);
    async function seeded(store: InstrumentedStore) {
      const db = new Percolator({ store, peekedWrites: false, gc });
      const first = await db.begin();
      first.set('t', 'a', 'v', 'v0');
      first.set('t', 'b', 'v', 'v0');
      await first.commit();
      await db.flush();
      return { db, seedTs: first.startTs };
    }
    /** The version row of a's value v0, there already (as a tidy pass that lost its head-row CAS leaves it). */
    function versionRowThere(store: InstrumentedStore, seedTs: number) {
      return store.inner.checkAndSet({
        table: versionTable('t'),
        key: versionKey('a', 'v', seedTs),
        expected: null,
        state: encodeVersionRow(text('v0')),
      });
    }
    async function commitV1(db: Percolator) {
      const tx = await db.begin();
      await tx.getString('t', 'a', 'v');
      tx.set('t', 'a', 'v', 'v1');
      tx.set('t', 'b', 'v', 'v1');
      return tx.commit();
    }

    it('their version rows are created in the same step, the records say moved at once, and no tidy pass is needed', async () => {
      const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
      const { db, seedTs } = await seeded(store);
      const old = await db.begin(); // a snapshot from before the commit
      const sent: CasRequest[][] = [];
      store.manyFault = (requests) => {
        sent.push([...requests]);
        return undefined;
      };
      const before = { ...store.calls };
      await commitV1(db);
      await db.flush();
      expect(sent).toHaveLength(1);
      const vt = versionTable('t');
      expect(sent[0]!.map((r) => [r.table, r.key, r.expected])).toEqual([
        ['t', 'a', expect.any(String)],
        ['t', 'b', expect.any(String)],
        [vt, versionKey('a', 'v', seedTs), null],
        [vt, versionKey('b', 'v', seedTs), null],
      ]);
      // Nothing else wrote: no tidy pass created them or rewrote the head rows.
      expect(store.calls.checkAndSet - before.checkAndSet).toBe(0);
      for (const row of ['a', 'b']) {
        const [cell] = await cellsOf(store.inner, 't', row);
        expect(cell!.writes.find((w) => w.startTs === seedTs)).toMatchObject({ kind: 'put', value: 'moved' });
        const version = await store.inner.read(vt, versionKey(row, 'v', seedTs));
        // Format 19: the slot the step stamped, then the block (of one value here).
        expect(version!.state[0]).toBe(BLOCK_FORMAT_STAMPED);
        expect(decodeVersionRow(version!.state, seedTs)).toEqual(text('v0'));
        expect(await old.getString('t', row, 'v')).toBe('v0');
      }
      await db.close();
    });

    it('a version row already there (a tidy pass that lost its head-row CAS) is not written again: the step marks it moved', async () => {
      const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
      const { db, seedTs } = await seeded(store);
      const old = await db.begin();
      const vt = versionTable('t');
      const created = await versionRowThere(store, seedTs);
      expect(created.ok).toBe(true);
      const calls = store.stampedManyCalls;
      await commitV1(db);
      // Refused once (that row is there), then sent without it.
      expect(store.stampedManyCalls - calls).toBe(2);
      const there = await store.inner.read(vt, versionKey('a', 'v', seedTs));
      expect(there!.state[0]).toBe(VERSION_FORMAT);
      expect(there!.version).toBe(created.ok ? created.version : undefined);
      for (const row of ['a', 'b']) {
        const [cell] = await cellsOf(store.inner, 't', row);
        expect(cell!.writes.find((w) => w.startTs === seedTs)).toMatchObject({ value: 'moved' });
        expect(await old.getString('t', row, 'v')).toBe('v0');
      }
      await db.close();
    });

    it('a store that refuses without the current rows: the version row already there is found by a read', async () => {
      const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
      const { db, seedTs } = await seeded(store);
      const old = await db.begin();
      await versionRowThere(store, seedTs);
      const inner = store.inner;
      const original = inner.checkAndSetStampedMany.bind(inner);
      inner.checkAndSetStampedMany = async (requests, counter) => {
        const result = await original(requests, counter);
        return result.ok ? result : { ok: false }; // `current` is optional
      };
      const calls = store.stampedManyCalls;
      await commitV1(db);
      expect(store.stampedManyCalls - calls).toBe(2);
      for (const row of ['a', 'b']) expect(await old.getString('t', row, 'v')).toBe('v0');
      await db.close();
    });

    it('a refused step whose version rows cannot be read (a lost read reply): the commit stays certain nothing landed', async () => {
      const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
      const { db, seedTs } = await seeded(store);
      const vt = versionTable('t');
      await versionRowThere(store, seedTs);
      // The store refuses without the current rows, so the commit reads its version rows;
      // the first such read loses its reply ('unknown', as a store may say of any lost
      // reply); every later step is refused before it is applied ('no').
      const inner = store.inner;
      const original = inner.checkAndSetStampedMany.bind(inner);
      let steps = 0;
      inner.checkAndSetStampedMany = async (requests, counter) => {
        if (steps++ > 0) throw new StoreError('injected: refused before it was applied', 'no');
        const result = await original(requests, counter);
        return result.ok ? result : { ok: false };
      };
      // Between the refusal and the next step, every read of a version row loses its reply.
      let lostReads = 0;
      const read = store.read.bind(store);
      store.read = async (table, key) => {
        if (table === vt && steps === 1) {
          lostReads++;
          throw new StoreError('injected: read reply lost', 'unknown');
        }
        return read(table, key);
      };
      // Nothing was applied, and the commit knows it: a failure, never CommitUnknownError.
      const error = await commitV1(db).catch((e: unknown) => e);
      expect(lostReads).toBeGreaterThan(0);
      expect(steps).toBeGreaterThan(2);
      expect(error).not.toBeInstanceOf(CommitUnknownError);
      expect(error).toBeInstanceOf(StoreError);
      expect((error as StoreError).applied).toBe('no');
      for (const row of ['a', 'b']) {
        const [cell] = await cellsOf(store.inner, 't', row);
        expect(cell!.writes.map((w) => w.startTs)).toEqual([seedTs]);
      }
      const reader = await new Percolator({ store: store.inner }).begin();
      expect([await reader.getString('t', 'a', 'v'), await reader.getString('t', 'b', 'v')]).toEqual([
        'v0',
        'v0',
      ]);
      await db.close();
    });

    it('a lost reply: the step landed with its version rows, and nothing is written twice', async () => {
      const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
      const { db, seedTs } = await seeded(store);
      const old = await db.begin();
      let faults = 1;
      store.manyFault = () => (faults-- > 0 ? 'fail-after' : undefined);
      const calls = store.stampedManyCalls;
      await commitV1(db);
      expect(store.stampedManyCalls - calls).toBe(1);
      for (const row of ['a', 'b']) {
        expect(await old.getString('t', row, 'v')).toBe('v0');
        const version = await store.inner.read(versionTable('t'), versionKey(row, 'v', seedTs));
        expect(decodeVersionRow(version!.state, seedTs)).toEqual(text('v0'));
      }
      await db.close();
    });

    it('a one-row transaction: the single-row stamped CAS when nothing rides with it, the many-row step when a version row does', async () => {
      const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
      const db = new Percolator({ store, peekedWrites: false, gc });
      const sent: CasRequest[][] = [];
      store.manyFault = (requests) => {
        sent.push([...requests]);
        return undefined;
      };
      const write = async (value: string) => {
        const tx = await db.begin();
        await tx.getString('t', 'a', 'v');
        tx.set('t', 'a', 'v', value);
        await tx.commit();
        return tx.startTs;
      };
      const firstTs = await write('v0'); // nothing superseded yet
      expect(sent).toHaveLength(0);
      expect(store.calls.checkAndSetStamped).toBe(1);
      const old = await db.begin();
      await write('v1');
      expect(store.calls.checkAndSetStamped).toBe(1);
      expect(sent.map((requests) => requests.map((r) => [r.table, r.key]))).toEqual([
        [
          ['t', 'a'],
          [versionTable('t'), versionKey('a', 'v', firstTs)],
        ],
      ]);
      const [cell] = await cellsOf(store.inner, 't', 'a');
      expect(cell!.writes.find((w) => w.startTs === firstTs)).toMatchObject({ value: 'moved' });
      expect(await old.getString('t', 'a', 'v')).toBe('v0');
      await db.close();
      // onePhaseMaxRows 1: no many-row step at all; the tidy step moves the value.
      const twoPhase = new InstrumentedStore(new MemoryStore(), ONE_STEP);
      const plain = new Percolator({ store: twoPhase, gc, onePhaseMaxRows: 1 });
      for (const value of ['v0', 'v1']) await plain.transact(async (tx) => tx.set('t', 'a', 'v', value));
      await plain.flush();
      expect(twoPhase.stampedManyCalls).toBe(0);
      expect(twoPhase.calls.checkAndSetStamped).toBe(2);
      const [moved] = await cellsOf(twoPhase.inner, 't', 'a');
      expect(moved!.writes.map((w) => w.value)).toEqual(['inline', 'moved']);
      await plain.close();
      // A store that does not declare stampedManyForOneRow (MariaDB): one-row commits keep
      // the single-row stamped CAS and leave their moves to the tidy step; commits of
      // several rows still carry theirs.
      const costly = new InstrumentedStore(new MemoryStore(), { ...ONE_STEP, stampedManyForOneRow: false });
      const hinted = new Percolator({ store: costly, gc });
      for (const value of ['v0', 'v1']) await hinted.transact(async (tx) => tx.set('t', 'a', 'v', value));
      expect(costly.stampedManyCalls).toBe(0);
      await hinted.flush();
      const [tidied] = await cellsOf(costly.inner, 't', 'a');
      expect(tidied!.writes.map((w) => w.value)).toEqual(['inline', 'moved']);
      const pairs: CasRequest[][] = [];
      costly.manyFault = (requests) => {
        pairs.push([...requests]);
        return undefined;
      };
      for (const value of ['v2', 'v3'])
        await hinted.transact(async (tx) => {
          tx.set('t', 'a', 'v', value);
          tx.set('t', 'b', 'v', value);
        });
      expect(pairs.at(-1)!.some((r) => r.table === versionTable('t'))).toBe(true);
      await hinted.close();
    });

    it('a step the store refuses as too large is sent again without them, and the tidy step moves them', async () => {
      const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
      const { db, seedTs } = await seeded(store);
      const old = await db.begin();
      const inner = store.inner;
      const original = inner.checkAndSetStampedMany.bind(inner);
      let refused = 0;
      inner.checkAndSetStampedMany = async (requests, counter) => {
        if (requests.length > 2) {
          refused++;
          throw new RowTooLargeError('too many rows for one step (test)');
        }
        return original(requests, counter);
      };
      const calls = store.stampedManyCalls;
      await commitV1(db);
      expect(refused).toBe(1);
      expect(store.stampedManyCalls - calls).toBe(2);
      await db.flush();
      for (const row of ['a', 'b']) {
        const [cell] = await cellsOf(inner, 't', row);
        expect(cell!.writes.find((w) => w.startTs === seedTs)).toMatchObject({ value: 'moved' });
        const version = await inner.read(versionTable('t'), versionKey(row, 'v', seedTs));
        expect(version!.state[0]).toBe(BLOCK_FORMAT); // written by the tidy step
        expect(await old.getString('t', row, 'v')).toBe('v0');
      }
      await db.close();
    });
  });

  it('reports one onePhase step with the rows and the commit timestamp', async () => {
    const events: PercolatorEvent[] = [];
    const db = new Percolator({ store: new MemoryStore(), onEvent: (e) => events.push(e) });
    const { commitTs } = await db.begin().then(async (tx) => {
      await tx.getString('t', 'a', 'v');
      tx.set('t', 'a', 'v', '1');
      tx.set('t', 'b', 'v', '1');
      return tx.commit();
    });
    const steps = events.filter((e) => e.type === 'commit.step');
    expect(steps).toHaveLength(1);
    expect(steps[0]).toMatchObject({ step: 'onePhase', rows: 2, commitTs });
    await db.close();
  });

  it('transfers between many clients keep the total: one-step and two-phase commits on the same rows', async () => {
    const store = new MemoryStore();
    const accounts = ['a', 'b', 'c', 'd', 'e'];
    const setup = new Percolator({ store, peekedWrites: false });
    await seed(setup, accounts, '100');
    const clients = [1, 16, 16, 1].map(
      (onePhaseMaxRows) => new Percolator({ store, peekedWrites: false, onePhaseMaxRows }),
    );
    await Promise.all(
      clients.map(async (db, w) => {
        for (let i = 0; i < 40; i++) {
          const from = accounts[(w + i) % accounts.length]!;
          const to = accounts[(w + i * 3 + 1) % accounts.length]!;
          if (from === to) continue;
          await db.transact(
            async (tx) => {
              const [f, t] = [
                Number(await tx.getString('t', from, 'v')),
                Number(await tx.getString('t', to, 'v')),
              ];
              tx.set('t', from, 'v', String(f - 1));
              tx.set('t', to, 'v', String(t + 1));
            },
            { maxAttempts: 100 },
          );
        }
      }),
    );
    const total = await setup.transact(async (tx) => {
      let sum = 0;
      for (const row of accounts) sum += Number(await tx.getString('t', row, 'v'));
      return sum;
    });
    expect(total).toBe(500);
    await Promise.all([setup, ...clients].map((db) => db.close()));
  });
});
