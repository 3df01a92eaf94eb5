import {
  type CasRequest,
  type CasResult,
  ClientCrash,
  CommitUnknownError,
  inspectHeadRow,
  MemoryStore,
  Percolator,
  type StoredRow,
  StoreError,
  type Transaction,
} from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { fakeClock, InstrumentedStore } from './support.js';

/**
 * Cases found by mutation testing of the core protocol: each one fails with a small,
 * plausible bug in the protocol that the rest of the suite let through.
 */

/** Sets t/a, t/b and t/c (a the primary) to `value` in `tx`. */
function setRows(tx: Transaction, value: string): void {
  for (const row of ['a', 'b', 'c']) tx.set('t', row, 'v', value);
}

/** Writes the primary cell t/a `times` times, each a transaction of its own. */
async function rewritePrimary(db: Percolator, times: number): Promise<void> {
  for (let i = 0; i < times; i++) await db.transact(async (tx) => tx.set('t', 'a', 'v', `later${i}`));
}

/** t/b and t/c as a new client reads them (settling any lock it meets through its primary). */
async function readSecondaries(
  store: MemoryStore,
  clock: ReturnType<typeof fakeClock>,
  lockTtlMs: number,
  gc: { maxVersionsPerCell: number },
): Promise<(string | undefined)[]> {
  const reader = new Percolator({ store, clock, lockTtlMs, gc });
  try {
    return await reader.transact(async (tx) => [
      await tx.getString('t', 'b', 'v'),
      await tx.getString('t', 'c', 'v'),
    ]);
  } finally {
    await reader.close();
  }
}

/** An InstrumentedStore whose plain CAS of one row can be lost in the network and land later. */
class DelayingStore extends InstrumentedStore {
  /** The next plain CAS of this row fails 'unknown' without being applied, and is kept in `delayed`. */
  delayNext: { table: string; key: string } | undefined;
  readonly delayed: CasRequest[] = [];
  /** Reads of `delayNext`'s row to fail after the CAS was delayed (so the writer cannot re-read it). */
  failReadsAfterDelay = 0;
  private failingReads: { table: string; key: string; left: number } | undefined;
  /** Awaited (once) before the next read reaches the store. */
  beforeNextRead: (() => Promise<void>) | undefined;

  override async checkAndSet(request: CasRequest): Promise<CasResult> {
    const d = this.delayNext;
    if (d && request.table === d.table && request.key === d.key) {
      this.delayNext = undefined;
      this.delayed.push({ ...request, state: request.state?.slice() ?? null });
      this.failingReads = { ...d, left: this.failReadsAfterDelay };
      throw new StoreError('injected: no reply (the request is delayed in the network)', 'unknown');
    }
    return super.checkAndSet(request);
  }

  override async read(table: string, key: string): Promise<StoredRow | null> {
    const before = this.beforeNextRead;
    this.beforeNextRead = undefined;
    if (before) await before();
    const f = this.failingReads;
    if (f && f.table === table && f.key === key && f.left > 0) {
      f.left--;
      throw new StoreError('injected read failure', 'no');
    }
    return super.read(table, key);
  }

  /** Lands the delayed requests now, as a network would, late. */
  async landDelayed(): Promise<CasResult[]> {
    const out: CasResult[] = [];
    for (const request of this.delayed.splice(0)) out.push(await this.inner.checkAndSet(request));
    return out;
  }
}

async function lockOn(store: MemoryStore, table: string, row: string) {
  const stored = await store.read(table, row);
  return stored ? inspectHeadRow(stored.state).cells.map((c) => c.lock) : [];
}

describe('mutation-testing gaps', () => {
  it("a commit's own rollback leaves a rollback record on the primary, so its delayed primary prewrite can never land a lock afterwards", async () => {
    // rollback.ts: without the record, the rollback of a primary row that holds nothing of
    // the transaction writes nothing, and the delayed prewrite CAS (expecting the row as it
    // was) then lands a lock of a transaction whose client already reported it not applied:
    // readers and writers of the row are blocked until the lock expires.
    const inner = new MemoryStore();
    const store = new DelayingStore(inner, { stampedCheckAndSet: false });
    const lockTtlMs = 60_000;
    const db = new Percolator({ store, lockTtlMs, onePhaseMaxRows: 1 });
    await db.transact(async (tx) => {
      tx.set('t', 'a', 'v', 'old');
      tx.set('t', 'b', 'v', 'old');
    });
    await db.flush();

    const tx = await db.begin();
    tx.set('t', 'a', 'v', 'new'); // 'a' is the primary: the first row in (table, key) order
    tx.set('t', 'b', 'v', 'new');
    // The primary prewrite is delayed, and its writer cannot re-read the row to learn its
    // fate (six failed reads: readRow's retries), so the prewrite is ambiguous and the
    // commit rolls back before its commit point.
    store.delayNext = { table: 't', key: 'a' };
    store.failReadsAfterDelay = 6;
    const error = await tx.commit().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(StoreError);
    expect(error).not.toBeInstanceOf(CommitUnknownError);
    expect(store.delayed).toHaveLength(1);

    // The delayed prewrite arrives: the rollback record changed the row, so its CAS fails.
    const [late] = await store.landDelayed();
    expect(late!.ok).toBe(false);
    expect(await lockOn(inner, 't', 'a')).toEqual([undefined]);

    // Another client reads and writes the rows at once, without waiting on a lock.
    const other = new Percolator({ store: inner, lockTtlMs, lockWaitMs: 50 });
    expect(await other.transact((r) => r.getString('t', 'a', 'v'))).toBe('old');
    await other.transact(async (w) => {
      w.set('t', 'a', 'v', 'next');
      w.set('t', 'b', 'v', 'next');
    });
    expect(
      await other.transact(async (r) => [await r.getString('t', 'a', 'v'), await r.getString('t', 'b', 'v')]),
    ).toEqual(['next', 'next']);
    await other.close();
    await db.close();
  });

  it('a one-phase commit whose reply was lost, its record pruned before the re-read, is CommitUnknownError, never a retryable error', async () => {
    // one-phase.ts landedOn: with no record left (pruned by a later commit) the write may
    // have landed; taking that for "not landed" decided the commit afresh, which failed on
    // the pruned history with SnapshotTooOldError, retryable: db.transact would run the
    // transaction again and apply it twice.
    const inner = new MemoryStore();
    const store = new DelayingStore(inner);
    const gc = { maxVersionsPerCell: 1 };
    const db = new Percolator({ store, gc, peekedWrites: false });
    const other = new Percolator({ store: inner, gc, peekedWrites: false });
    await db.transact(async (tx) => {
      tx.set('t', 'a', 'v', '0');
    });
    await db.flush();

    const tx = await db.begin();
    const n = Number(await tx.getString('t', 'a', 'v'));
    tx.set('t', 'a', 'v', String(n + 1));
    // The one stamped CAS lands, its reply is lost; before the writer re-reads the row,
    // another client commits to it twice, and prunes our record (one version per cell).
    let faults = 1;
    store.casFault = () => {
      if (faults-- <= 0) return undefined;
      store.beforeNextRead = async () => {
        // Twice: a commit prunes below its own record only once a later one is stamped.
        for (const value of ['other', 'other again']) {
          await other.transact(async (w) => {
            w.set('t', 'a', 'v', value);
          });
        }
      };
      return 'fail-after';
    };
    const error = await tx.commit().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(store.calls.checkAndSetStamped).toBeGreaterThanOrEqual(1);
    expect(error).toBeInstanceOf(CommitUnknownError);
    expect((error as CommitUnknownError).retryable).toBe(false);
    // The commit did land: the other client's write is the newest, with ours pruned below it.
    expect(await other.transact((r) => r.getString('t', 'a', 'v'))).toBe('other again');
    await other.close();
    await db.close();
  });

  it('a commit whose secondary could not be committed keeps its primary record, however often the primary is rewritten', async () => {
    // secondaries.ts: the primary record's list of secondaries may go only once every
    // secondary is known committed. Released after only some were, the next writes of the
    // primary pruned the record, and a reader then rolled the still-locked secondary back:
    // a committed transaction half lost.
    const inner = new MemoryStore();
    const store = new InstrumentedStore(inner, { stampedCheckAndSet: false });
    const clock = fakeClock();
    const lockTtlMs = 1000;
    const gc = { maxVersionsPerCell: 1 };
    let armed = false;
    const db = new Percolator({
      store,
      clock,
      lockTtlMs,
      gc,
      hooks: {
        onCommitStep: (e) => {
          // Past the commit point, every write of row c is refused (certainly not applied).
          if (armed && e.step === 'afterCommitPrimary')
            store.casFault = (r) => (r.table === 't' && r.key === 'c' ? 'refuse' : undefined);
        },
      },
    });
    await db.transact(async (tx) => setRows(tx, 'old'));
    await db.flush();

    armed = true;
    await db.transact(async (tx) => setRows(tx, 'new'));
    await db.flush(); // the background secondaries step: b committed, c's commit failed
    armed = false;
    store.casFault = () => undefined;
    expect((await lockOn(inner, 't', 'c'))[0]).toBeDefined();
    expect((await lockOn(inner, 't', 'b'))[0]).toBeUndefined();

    // The same client rewrites the primary cell past its version cap.
    await rewritePrimary(db, 4);
    await db.flush();
    clock.advance(10 * lockTtlMs); // c's lock is long expired: a reader settles it through the primary

    expect(await readSecondaries(inner, clock, lockTtlMs, gc)).toEqual(['new', 'new']);
    await db.close();
  });

  it('GC that could not settle one secondary of a held commit record keeps the record', async () => {
    // tidy.ts settleSecondaries: a held record counts as settled only once every one of its
    // rows is. Counted settled with one row failed, GC dropped its list and pruned it, and a
    // reader then rolled the still-locked secondary of a committed transaction back.
    const inner = new MemoryStore();
    const store = new InstrumentedStore(inner, { stampedCheckAndSet: false });
    const clock = fakeClock();
    const lockTtlMs = 1000;
    const gc = { maxVersionsPerCell: 1 };
    const setup = new Percolator({ store, clock, lockTtlMs, gc });
    await setup.transact(async (tx) => setRows(tx, 'old'));
    await setup.close();
    // A client stops right after its commit point: b and c stay locked, a's record lists them.
    const crasher = new Percolator({
      store,
      clock,
      lockTtlMs,
      gc,
      hooks: {
        onCommitStep: (e) => {
          if (e.step === 'afterCommitPrimary') throw new ClientCrash();
        },
      },
    });
    const crashed = await crasher
      .transact(async (tx) => setRows(tx, 'new'))
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(crashed).toBeInstanceOf(ClientCrash);
    await crasher.close();

    const db = new Percolator({ store, clock, lockTtlMs, gc });
    // The primary cell is rewritten past its version cap: the record is held for its list.
    await rewritePrimary(db, 3);
    await db.flush();
    expect((await lockOn(inner, 't', 'c'))[0]).toBeDefined();

    // GC settles the held record's secondaries: b is committed, every write of c is refused.
    store.casFault = (r) => (r.table === 't' && r.key === 'c' ? 'refuse' : undefined);
    await db.gc('t', { row: 'a' });
    await db.flush();
    store.casFault = () => undefined;
    expect((await lockOn(inner, 't', 'b'))[0]).toBeUndefined();
    expect((await lockOn(inner, 't', 'c'))[0]).toBeDefined();
    clock.advance(10 * lockTtlMs);

    expect(await readSecondaries(inner, clock, lockTtlMs, gc)).toEqual(['new', 'new']);
    await db.close();
  });

  it("a reader's roll-forward of a secondary lock writes the primary's commit timestamp: a snapshot between start and commit sees none of it", async () => {
    // lock-resolver.ts settleRow: a secondary rolled forward at any other timestamp (its
    // startTs, say) is visible to a snapshot taken between the transaction's start and its
    // commit, which sees the primary's old value: half a transaction. Only the random-fault
    // history workload of the conformance suite noticed, and only with luck.
    const inner = new MemoryStore();
    const store = new InstrumentedStore(inner, { stampedCheckAndSet: false });
    const clock = fakeClock();
    const lockTtlMs = 60_000;
    const options = { store, clock, lockTtlMs, peekedWrites: false, onePhaseMaxRows: 1 } as const;
    const setup = new Percolator(options);
    await setup.transact(async (tx) => {
      for (const row of ['a', 'b']) tx.set('t', row, 'v', 'old');
    });
    await setup.close();
    const crasher = new Percolator({
      ...options,
      hooks: {
        onCommitStep: (e) => {
          if (e.step === 'afterCommitPrimary') throw new ClientCrash();
        },
      },
    });
    const writer = await crasher.begin();
    for (const row of ['a', 'b']) writer.set('t', row, 'v', 'new');
    const reader = new Percolator(options);
    const between = await reader.begin(); // start < between.startTs < commit
    await writer.commit().catch((e: unknown) => expect(e).toBeInstanceOf(ClientCrash));
    await crasher.close();
    expect(between.startTs).toBeGreaterThan(writer.startTs);
    // b is still locked; the reader settles it through a's commit record (no expiry needed).
    expect((await lockOn(inner, 't', 'b'))[0]).toBeDefined();
    expect([await between.getString('t', 'a', 'v'), await between.getString('t', 'b', 'v')]).toEqual([
      'old',
      'old',
    ]);
    await between.rollback();
    expect(
      await reader.transact(async (tx) => [
        await tx.getString('t', 'a', 'v'),
        await tx.getString('t', 'b', 'v'),
      ]),
    ).toEqual(['new', 'new']);
    await reader.close();
  });

  it('a commit point whose reply was lost, its record pruned before the re-read, is CommitUnknownError, never a retryable error', async () => {
    // commit-point.ts: after an ambiguous commit CAS, no lock and no record of ours means
    // the commit may have landed and been pruned (a one-row transaction's record lists no
    // secondaries). Taken for a rollback by another client, it was ConflictError,
    // retryable: db.transact would run the transaction again and apply it twice.
    const inner = new MemoryStore();
    const store = new DelayingStore(inner, { stampedCheckAndSet: false });
    const gc = { maxVersionsPerCell: 1 };
    const other = new Percolator({ store: inner, gc });
    let armed = false;
    const db = new Percolator({
      store,
      gc,
      hooks: {
        onCommitStep: (e) => {
          if (!armed || e.step !== 'beforeCommitPrimary') return;
          armed = false;
          // The commit CAS lands and its reply is lost; before the writer re-reads the row,
          // another client commits to it twice, pruning our record (one version per cell).
          let faults = 1;
          store.casFault = () => {
            if (faults-- <= 0) return undefined;
            store.beforeNextRead = async () => {
              for (const value of ['other', 'other again']) {
                await other.transact(async (w) => {
                  w.set('t', 'a', 'v', value);
                });
              }
            };
            return 'fail-after';
          };
        },
      },
    });
    await db.transact(async (tx) => {
      tx.set('t', 'a', 'v', '0');
    });
    await db.flush();

    const tx = await db.begin();
    tx.set('t', 'a', 'v', String(Number(await tx.getString('t', 'a', 'v')) + 1));
    armed = true;
    const error = await tx.commit().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(armed).toBe(false);
    expect(error).toBeInstanceOf(CommitUnknownError);
    expect((error as CommitUnknownError).retryable).toBe(false);
    expect(await other.transact((r) => r.getString('t', 'a', 'v'))).toBe('other again');
    await other.close();
    await db.close();
  });
});
