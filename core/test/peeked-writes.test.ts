import {
  AbortedError,
  ClientCrash,
  CommitUnknownError,
  ConflictError,
  InvalidArgumentError,
  inspectHeadRow,
  MemoryStore,
  Percolator,
  type PercolatorEvent,
  RowTooLargeError,
  SnapshotTooOldError,
  StoreError,
  type Transaction,
} from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { decodeRow, encodeRow } from '../src/codec.js';
import { type Fault, fakeClock, InstrumentedStore } from './support.js';

/**
 * Peeked snapshots for read-write transactions (docs/protocol.md 4.10): the snapshot comes
 * from the oracle counter's value with the first reads, drawing nothing; a shared snapshot
 * identifies nothing, so the commit takes an identity of its own (the value the store
 * draws in a one-step commit, or one drawn at commit), and its conflict check stays at the
 * snapshot.
 */

const ONE_STEP = { stampedCheckAndSetMany: true } as const;
/**
 * A one-row commit as PostgreSQL and MariaDB send it: the single-row stamped CAS (the
 * one-row loop, `updateRow`), not a step of the many-row kind (the memory store declares
 * `stampedManyForOneRow`).
 */
const ONE_ROW_CAS = { stampedCheckAndSetMany: true, stampedManyForOneRow: false } as const;

async function recordsOf(store: MemoryStore, table: string, row: string) {
  const stored = await store.read(table, row);
  const cell = stored ? inspectHeadRow(stored.state).cells.find((c) => c.column === 'v') : undefined;
  return { lock: cell?.lock, writes: cell?.writes ?? [] };
}

const transfer = async (tx: Transaction) => {
  const a = Number(await tx.getString('t', 'a', 'v'));
  const b = Number(await tx.getString('t', 'b', 'v'));
  tx.set('t', 'a', 'v', String(a - 1));
  tx.set('t', 'b', 'v', String(b + 1));
};

/** A one-step store with rows a and b at 10, and a client on it. */
async function seededPair(
  onEvent?: (e: PercolatorEvent) => void,
  capabilities: { readonly stampedManyForOneRow?: boolean } = ONE_STEP,
) {
  const store = new InstrumentedStore(new MemoryStore(), { ...ONE_STEP, ...capabilities });
  const db = new Percolator({ store, ...(onEvent ? { onEvent } : {}) });
  await db.transact(async (tx) => {
    tx.set('t', 'a', 'v', '10');
    tx.set('t', 'b', 'v', '10');
  });
  return { store, db };
}

/** A fault for the next call only: 'late' (it fails at once and lands when the test runs it). */
function lateOnce(): () => Fault {
  let late = true;
  return () => {
    const f: Fault = late ? 'late' : undefined;
    late = false;
    return f;
  };
}

/** Rows a and b, as one snapshot reads them. */
const balances = (db: Percolator) =>
  db.transact((t) => Promise.all([t.getString('t', 'a', 'v'), t.getString('t', 'b', 'v')]));

describe('peeked snapshots for read-write transactions', () => {
  it('a transfer peeks its snapshot, draws nothing before its one-step commit, and its records carry the drawn value as start and commit', async () => {
    const { store, db } = await seededPair();
    const before = { ...store.calls, many: store.stampedManyCalls };
    const tx = await db.begin();
    await transfer(tx);
    const { commitTs } = await tx.commit();
    expect(store.calls.readPeeked - before.readPeeked).toBe(1);
    expect(store.calls.readStamped - before.readStamped).toBe(0);
    expect(store.calls.incrementCounter - before.incrementCounter).toBe(0);
    expect(store.stampedManyCalls - before.many).toBe(1);
    // The snapshot is at or below the commit; the rows name the commit by the drawn value.
    expect(tx.startTs).toBeLessThanOrEqual(commitTs);
    for (const row of ['a', 'b']) {
      const { lock, writes } = await recordsOf(store.inner, 't', row);
      expect(lock).toBeUndefined();
      expect(writes[0]).toMatchObject({ startTs: commitTs, commitTs, kind: 'put' });
    }
    expect(await balances(db)).toEqual(['9', '11']);
    // The control: with peekedWrites false the snapshot is drawn with the first reads, and
    // the records carry it.
    const drawn = new Percolator({ store, peekedWrites: false });
    const stamped = store.calls.readStamped;
    let other!: Transaction;
    await drawn.transact(async (t) => {
      other = t;
      await transfer(t);
    });
    expect(store.calls.readStamped - stamped).toBe(1);
    expect((await recordsOf(store.inner, 't', 'a')).writes[0]).toMatchObject({ startTs: other.startTs });
    await Promise.all([db.close(), drawn.close()]);
  });

  it('peeked transfers of one turn share one step and one commit timestamp, and conflict where they overlap', async () => {
    const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
    const db = new Percolator({ store });
    await db.transact(async (tx) => {
      for (const row of ['a', 'b', 'c', 'd']) tx.set('t', row, 'v', '10');
    });
    const move = (from: string, to: string) => async (tx: Transaction) => {
      const x = Number(await tx.getString('t', from, 'v'));
      const y = Number(await tx.getString('t', to, 'v'));
      tx.set('t', from, 'v', String(x - 1));
      tx.set('t', to, 'v', String(y + 1));
    };
    const calls = store.stampedManyCalls;
    const peeks = store.calls.readPeeked;
    const [first, second] = await Promise.all([db.begin(), db.begin()]);
    await Promise.all([move('a', 'b')(first), move('c', 'd')(second)]);
    const [one, two] = await Promise.all([first.commit(), second.commit()]);
    expect(one.commitTs).toBe(two.commitTs);
    expect(store.stampedManyCalls - calls).toBe(1);
    expect(store.calls.readPeeked - peeks).toBeLessThanOrEqual(4);
    // Both read a at one snapshot and both write it: one commits, the other conflicts.
    const [x, y] = await Promise.all([db.begin(), db.begin()]);
    await Promise.all([move('a', 'c')(x), move('a', 'd')(y)]);
    const outcomes = await Promise.allSettled([x.commit(), y.commit()]);
    expect(outcomes.map((o) => o.status).sort()).toEqual(['fulfilled', 'rejected']);
    const rejected = outcomes.find((o) => o.status === 'rejected') as PromiseRejectedResult;
    expect(rejected.reason).toBeInstanceOf(ConflictError);
    const values = await db.transact((t) =>
      Promise.all(['a', 'b', 'c', 'd'].map((r) => t.getString('t', r, 'v'))),
    );
    expect(values.map(Number).reduce((n, v) => n + v, 0)).toBe(40);
    expect(values[0]).toBe('8');
    await db.close();
  });

  it('a write committed after the snapshot is a conflict, in one step and in two phases', async () => {
    const store = new MemoryStore();
    const db = new Percolator({ store });
    const writer = new Percolator({ store });
    await db.transact(async (tx) => tx.set('t', 'a', 'v', '0'));
    for (const rows of [1, 2, 17]) {
      const tx = await db.begin();
      expect(await tx.getString('t', 'a', 'v')).toBe('0');
      // Committed after the snapshot, with a commit timestamp above it.
      await writer.transact(async (w) => w.set('t', 'a', 'v', '0'));
      tx.set('t', 'a', 'v', 'lost');
      for (let i = 1; i < rows; i++) tx.set('t', `other${rows}-${i}`, 'v', 'lost');
      // 1 and 2 rows: one step, named by the drawn value; 17 rows (past onePhaseMaxRows):
      // two phases under an identity drawn at commit. Either way the check is at the snapshot.
      await expect(tx.commit(), `${rows} rows`).rejects.toBeInstanceOf(ConflictError);
      expect(await db.transact((t) => t.getString('t', 'a', 'v'))).toBe('0');
      for (let i = 1; i < rows; i++) {
        const row = `other${rows}-${i}`;
        expect(await db.transact((t) => t.getString('t', row, 'v')), `${rows} rows: ${row}`).toBeUndefined();
        expect((await recordsOf(store, 't', row)).lock, `${rows} rows: ${row}`).toBeUndefined();
      }
      expect((await recordsOf(store, 't', 'a')).lock).toBeUndefined();
    }
    await Promise.all([db.close(), writer.close()]);
  });

  it('a commit too wide for one step takes an identity drawn at commit, above the snapshot, and its end event names it', async () => {
    const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
    const ends: PercolatorEvent[] = [];
    const db = new Percolator({ store, onEvent: (e) => void (e.type === 'transaction.end' && ends.push(e)) });
    const tx = await db.begin();
    expect(await tx.getString('t', 'r0', 'v')).toBeUndefined();
    // Another commit draws after the peek, so the identity is above the snapshot.
    await db.transact(async (t) => t.set('t', 'elsewhere', 'v', 'x'));
    const draws = store.calls.incrementCounter;
    for (let i = 0; i < 17; i++) tx.set('t', `r${i}`, 'v', 'x');
    const { commitTs } = await tx.commit();
    const identities = new Set<number>();
    for (let i = 0; i < 17; i++) {
      const { lock, writes } = await recordsOf(store.inner, 't', `r${i}`);
      expect(lock).toBeUndefined();
      identities.add(writes[0]!.startTs);
      expect(writes[0]!.commitTs).toBe(commitTs);
    }
    expect(identities.size).toBe(1);
    const [identity] = identities;
    expect(identity).toBeGreaterThan(tx.startTs);
    expect(identity).toBeLessThan(commitTs);
    // What an operator matches a lock it left against: the end event's identityTs.
    const end = ends.at(-1);
    expect(end).toMatchObject({ type: 'transaction.end', startTs: tx.startTs, commitTs });
    expect(end?.type === 'transaction.end' ? end.identityTs : undefined).toBe(identity);
    // The identity, and the commit timestamp unless the store stamped the primary commit.
    expect(store.calls.incrementCounter - draws).toBeGreaterThanOrEqual(1);
    await db.close();
  });

  it('a one-step commit refused as too large falls back to two phases under a drawn identity, and its end event says which', async () => {
    const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
    // The store refuses every one-step commit as too large (nothing sent).
    store.checkAndSetStampedMany = async () => {
      throw new RowTooLargeError('one step of these rows is too large for this store');
    };
    const ends: PercolatorEvent[] = [];
    const db = new Percolator({ store, onEvent: (e) => void (e.type === 'transaction.end' && ends.push(e)) });
    for (const drawBetween of [false, true]) {
      const tx = await db.begin();
      await tx.getString('t', 'a', 'v');
      // With a draw after the peek, the identity lands above the snapshot; without, on it.
      if (drawBetween) await db.transact(async (t) => t.set('t', 'elsewhere', 'v', 'x'));
      tx.set('t', 'a', 'v', String(drawBetween));
      tx.set('t', 'b', 'v', String(drawBetween));
      const { commitTs } = await tx.commit();
      const identity = (await recordsOf(store.inner, 't', 'a')).writes[0]!.startTs;
      expect(identity, `draw between: ${drawBetween}`).toBeLessThan(commitTs);
      expect(identity === tx.startTs, `draw between: ${drawBetween}`).toBe(!drawBetween);
      const end = ends.at(-1);
      // Absent where the identity is tx.startTs; never the commit timestamp.
      expect(end?.type === 'transaction.end' ? end.identityTs : null, `draw between: ${drawBetween}`).toBe(
        drawBetween ? identity : undefined,
      );
    }
    await db.close();
  });

  it("a lock drawn at exactly the snapshot is another transaction's, never taken for its own", async () => {
    const store = new MemoryStore();
    const clock = fakeClock();
    const db = new Percolator({ store, clock, lockTtlMs: 1000 });
    await db.transact(async (tx) => tx.set('t', 'a', 'v', 'a0'));
    const tx = await db.begin();
    expect(await tx.getString('t', 'a', 'v')).toBe('a0');
    // Another client draws its start timestamp right after the peek: the peeked snapshot
    // itself. It prewrites b and c and dies before its commit point.
    const dies = new Percolator({
      store,
      clock,
      lockTtlMs: 1000,
      peekedWrites: false,
      onePhaseMaxRows: 1,
      hooks: {
        onCommitStep: (e) => {
          if (e.step === 'beforeCommitPrimary') throw new ClientCrash();
        },
      },
    });
    const other = await dies.begin();
    await other.ready();
    expect(other.startTs).toBe(tx.startTs);
    other.set('t', 'b', 'v', 'never');
    other.set('t', 'c', 'v', 'never');
    await expect(other.commit()).rejects.toBeInstanceOf(ClientCrash);
    expect((await recordsOf(store, 't', 'b')).lock?.startTs).toBe(tx.startTs);
    // Its lock has expired: the commit rolls it back. The rollback record, at the snapshot
    // itself, is then a conflict like any record at or after it (a retry commits), and
    // nothing of the dead transaction is ever taken for ours.
    clock.advance(5000);
    tx.set('t', 'b', 'v', 'mine');
    await expect(tx.commit()).rejects.toBeInstanceOf(ConflictError);
    const b = await recordsOf(store, 't', 'b');
    expect(b.lock).toBeUndefined();
    expect(b.writes.map((w) => [w.kind, w.startTs])).toEqual([['rollback', tx.startTs]]);
    expect(
      await db.transact((t) => Promise.all([t.getString('t', 'b', 'v'), t.getString('t', 'c', 'v')])),
    ).toEqual([undefined, undefined]);
    await db.transact(async (t) => {
      await t.getString('t', 'a', 'v');
      t.set('t', 'b', 'v', 'mine');
    });
    expect(await db.transact((t) => t.getString('t', 'b', 'v'))).toBe('mine');
    await Promise.all([db.close(), dies.close()]);
  });

  it('a one-step commit whose reply is lost is CommitUnknownError and is never sent again; a request lost before the store is fenced and sent again', async () => {
    const { store, db } = await seededPair();
    let fault: 'fail-before' | 'fail-after' | undefined = 'fail-after';
    store.manyFault = () => {
      const f = fault;
      fault = undefined;
      return f;
    };
    const calls = store.stampedManyCalls;
    // Applied, reply lost: its rows moved on, so no fence, and db.transact does not run it again.
    await expect(db.transact(transfer)).rejects.toBeInstanceOf(CommitUnknownError);
    expect(store.stampedManyCalls - calls).toBe(1);
    expect(await balances(db)).toEqual(['9', '11']);
    // Lost before it reached the store: the re-read finds the rows as the step expected them,
    // the fence (one plain CAS) makes sure it never lands, and the commit goes again, once.
    fault = 'fail-before';
    const [many, cas] = [store.stampedManyCalls, store.calls.checkAndSet];
    await db.transact(transfer);
    expect(store.stampedManyCalls - many).toBe(2);
    expect(store.calls.checkAndSet - cas).toBe(1);
    expect(await balances(db)).toEqual(['8', '12']);
    // Refused with certainty ('no'): sent again without a fence, committed once.
    const send = store.checkAndSetStampedMany.bind(store);
    let refuse = true;
    store.checkAndSetStampedMany = async (requests, counter) => {
      if (!refuse) return send(requests, counter);
      refuse = false;
      throw new StoreError('refused before it was applied', 'no');
    };
    const sent = [store.stampedManyCalls, store.calls.checkAndSet];
    await db.transact(transfer);
    expect(store.stampedManyCalls - sent[0]!).toBe(1); // the refused call never reached `send`
    expect(store.calls.checkAndSet - sent[1]!).toBe(0);
    expect(await balances(db)).toEqual(['7', '13']);
    await db.close();
  });

  it('the fence: a delayed one-step commit that arrives after the fence never lands; one that lands before it leaves the outcome unknown, never a second commit', async () => {
    const fences: [string, string, string, number | undefined][] = [];
    const { store, db } = await seededPair((e) => {
      if (e.type === 'commit.fence') fences.push([e.table, e.row, e.outcome, e.transaction?.attempt]);
    });
    store.manyFault = lateOnce();
    // The first step is delayed: the client fences row a and commits again.
    await db.transact(transfer);
    expect(store.late).toHaveLength(1);
    expect(await balances(db)).toEqual(['9', '11']);
    // The delayed step arrives: refused (row a moved under the fence), nothing written twice.
    expect((await store.late.shift()!()).ok).toBe(false);
    expect(await balances(db)).toEqual(['9', '11']);
    // The delayed step lands after the client's re-read, before its next write (the fence):
    // the fence is refused, and the client, which cannot tell its step from another
    // writer's, reports unknown (a second send would have lost a race and conflicted).
    store.manyFault = lateOnce();
    store.beforeWrite = async () => {
      if (store.late.length === 0) return; // the delayed step's own call
      store.beforeWrite = undefined;
      expect((await store.late.shift()!()).ok).toBe(true);
    };
    let runs = 0;
    await expect(
      db.transact(async (tx) => {
        runs++;
        await transfer(tx);
      }),
    ).rejects.toBeInstanceOf(CommitUnknownError);
    expect(runs).toBe(1);
    expect(await balances(db)).toEqual(['8', '12']);
    // Each fence is an event of its transaction (docs/operations.md, commit.fence). After a
    // refusal the next row still as the step expected (by the re-read) is tried: refused too.
    expect(fences).toEqual([
      ['t', 'a', 'fenced', 1],
      ['t', 'a', 'refused', 1],
      ['t', 'b', 'refused', 1],
    ]);
    await db.close();
  });

  it('the fence keeps the row as it was: the same bytes under a new version, its pending notification included', async () => {
    const { store, db } = await seededPair();
    await db.transact(async (tx) => {
      await tx.getString('t', 'a', 'v');
      tx.set('t', 'a', 'v', '10');
      tx.notify('t', 'a', 'v');
    });
    const before = (await store.inner.read('t', 'a'))!;
    let fenced: { state: Uint8Array | null; notified?: boolean } | undefined;
    store.beforeCas = async (request) => {
      fenced = request;
    };
    store.manyFault = lateOnce();
    await db.transact(transfer);
    expect(fenced?.state).toEqual(before.state);
    expect(fenced?.notified).toBe(true);
    expect(await balances(db)).toEqual(['9', '11']);
    await db.close();
  });

  it('blind writes and one-row commits are fenced too', async () => {
    const { store, db } = await seededPair(undefined, ONE_ROW_CAS);
    // A blind write of two rows (no read, no start timestamp of its own): its step delayed.
    store.manyFault = lateOnce();
    await db.transact(async (tx) => {
      tx.set('t', 'a', 'v', 'blind-a');
      tx.set('t', 'b', 'v', 'blind-b');
    });
    expect((await store.late.shift()!()).ok).toBe(false);
    expect(await balances(db)).toEqual(['blind-a', 'blind-b']);
    // A one-row read-modify-write of a peeked snapshot (the single-row stamped CAS).
    store.casFault = lateOnce();
    const stamped = store.calls.checkAndSetStamped;
    await db.transact(async (tx) => {
      const a = await tx.getString('t', 'a', 'v');
      tx.set('t', 'a', 'v', `${a}!`);
    });
    expect(store.calls.checkAndSetStamped - stamped).toBe(2);
    expect((await store.late.shift()!()).ok).toBe(false);
    expect(await balances(db)).toEqual(['blind-a!', 'blind-b']);
    await db.close();
  });

  it('a step that only creates rows is fenced by creating a row with no values: the late step is refused, the commit lands once', async () => {
    const { store, db } = await seededPair(undefined, ONE_ROW_CAS);
    const cas = store.calls.checkAndSet;
    // A blind write of two new rows, its step delayed: the fence creates row c (expected
    // absent by the step) with no cells, and the commit goes again against it.
    store.manyFault = lateOnce();
    await db.transact(async (tx) => {
      tx.set('t', 'c', 'v', 'new-c');
      tx.set('t', 'd', 'v', 'new-d');
    });
    expect(store.calls.checkAndSet - cas).toBe(1);
    expect((await store.late.shift()!()).ok).toBe(false);
    // A read-write transaction of a peeked snapshot whose step only creates (row e).
    store.manyFault = lateOnce();
    await db.transact(async (tx) => {
      const a = await tx.getString('t', 'a', 'v');
      tx.set('t', 'e', 'v', `from-${a}`);
      tx.set('t', 'f', 'v', 'new-f');
    });
    expect((await store.late.shift()!()).ok).toBe(false);
    // A one-row create (the single-row stamped CAS, updateRow).
    store.casFault = lateOnce();
    const stamped = store.calls.checkAndSetStamped;
    await db.transact(async (tx) => {
      tx.set('t', 'g', 'v', 'new-g');
    });
    expect(store.calls.checkAndSetStamped - stamped).toBe(2);
    expect((await store.late.shift()!()).ok).toBe(false);
    const values = await db.transact((tx) =>
      Promise.all(['c', 'd', 'e', 'f', 'g'].map((row) => tx.getString('t', row, 'v'))),
    );
    expect(values).toEqual(['new-c', 'new-d', 'from-10', 'new-f', 'new-g']);
    // Each value was written once: one record per cell.
    for (const row of ['c', 'd', 'e', 'f', 'g'])
      expect((await recordsOf(store.inner, 't', row)).writes).toHaveLength(1);
    await db.close();
  });

  it('a late create landing between the re-read and the fence leaves CommitUnknownError, committed once, on one row and on several', async () => {
    const { store, db } = await seededPair(undefined, ONE_ROW_CAS);
    const landBeforeFence = () => {
      store.beforeWrite = async () => {
        if (store.late.length === 0) return; // the late step's own call
        store.beforeWrite = undefined;
        expect((await store.late.shift()!()).ok).toBe(true);
      };
    };
    let runs = 0;
    store.manyFault = lateOnce();
    landBeforeFence();
    await expect(
      db.transact(async (tx) => {
        runs++;
        tx.set('t', 'c', 'v', 'new-c');
        tx.set('t', 'd', 'v', 'new-d');
      }),
    ).rejects.toBeInstanceOf(CommitUnknownError);
    store.casFault = lateOnce();
    landBeforeFence();
    await expect(
      db.transact(async (tx) => {
        runs++;
        tx.set('t', 'g', 'v', 'new-g');
      }),
    ).rejects.toBeInstanceOf(CommitUnknownError);
    expect(runs).toBe(2);
    const values = await db.transact((tx) =>
      Promise.all(['c', 'd', 'g'].map((row) => tx.getString('t', row, 'v'))),
    );
    expect(values).toEqual(['new-c', 'new-d', 'new-g']);
    for (const row of ['c', 'd', 'g'])
      expect((await recordsOf(store.inner, 't', row)).writes).toHaveLength(1);
    await db.close();
  });

  it('a row the fence created and nothing then wrote reads as absent, and stays (a cleared notification keeps it): the late step never lands', async () => {
    const { store, db } = await seededPair();
    // The transaction is aborted after the fence, before its second send: nothing of it lands.
    const abort = new AbortController();
    store.beforeCas = async () => {
      abort.abort();
    };
    store.manyFault = lateOnce();
    await expect(
      db.transact(
        async (tx) => {
          tx.set('t', 'c', 'v', 'new-c');
          tx.set('t', 'd', 'v', 'new-d');
        },
        { signal: abort.signal },
      ),
    ).rejects.toBeInstanceOf(AbortedError);
    store.beforeCas = undefined;
    // The fence's row is there, with no cells.
    const fenced = await store.inner.read('t', 'c');
    expect(fenced).not.toBeNull();
    expect(inspectHeadRow(fenced!.state).cells).toEqual([]);
    expect(await store.inner.read('t', 'd')).toBeNull();
    // A weak notification on it, cleared by a weak observer: the row is left empty, never
    // deleted (a deleted row would be absent again, and the late step would land on it).
    const worker = db.worker({
      observers: [{ name: 'w', table: 't', column: 'dirty', weak: true, handler: async () => {} }],
    });
    await db.transact(async (tx) => tx.notify('t', 'c', 'dirty'));
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    const cleared = await store.inner.read('t', 'c');
    expect(cleared).not.toBeNull();
    expect(cleared!.version).not.toBe(fenced!.version); // the notification came and went
    expect((await store.late.shift()!()).ok).toBe(false);
    const seen = await db.transact(async (tx) => {
      const rows: string[] = [];
      for await (const { row } of tx.scan('t')) rows.push(row);
      return { c: await tx.getString('t', 'c', 'v'), rows };
    });
    expect(seen).toEqual({ c: undefined, rows: ['a', 'b'] });
    // A later create of the row writes over it as over an absent row.
    await db.transact(async (tx) => {
      tx.set('t', 'c', 'v', 'later');
    });
    expect(await db.transact((tx) => tx.getString('t', 'c', 'v'))).toBe('later');
    await db.close();
  });

  it('the fence on one row (updateRow): a late step landing between the re-read and the fence leaves CommitUnknownError, committed once', async () => {
    const { store, db } = await seededPair(undefined, ONE_ROW_CAS);
    store.casFault = lateOnce();
    store.beforeWrite = async () => {
      if (store.late.length === 0) return; // the late step's own call
      store.beforeWrite = undefined;
      expect((await store.late.shift()!()).ok).toBe(true);
    };
    let runs = 0;
    await expect(
      db.transact(async (tx) => {
        runs++;
        const a = await tx.getString('t', 'a', 'v');
        tx.set('t', 'a', 'v', `${a}!`);
      }),
    ).rejects.toBeInstanceOf(CommitUnknownError);
    expect(runs).toBe(1);
    expect(await balances(db)).toEqual(['10!', '10']);
    await db.close();
  });

  it("after a fence the outcome is certain: losing every later race is a retryable failure, not the fenced step's unknown", async () => {
    const { store, db } = await seededPair();
    store.manyFault = lateOnce();
    let runs = 0;
    let fenced = false;
    // After the fence, another writer moves row a (to the same state) before every step of
    // the first run: its loop runs out of attempts.
    store.beforeWrite = async () => {
      if (store.late.length === 0 || runs > 1) return; // the late step itself; the second run
      if (!fenced) {
        fenced = true; // this call is the fence
        return;
      }
      const row = (await store.inner.read('t', 'a'))!;
      await store.inner.checkAndSet({ table: 't', key: 'a', expected: row.version, state: row.state });
    };
    await db.transact(async (tx) => {
      runs++;
      await transfer(tx);
    });
    expect(fenced).toBe(true);
    expect(runs).toBe(2);
    expect((await store.late.shift()!()).ok).toBe(false);
    expect(await balances(db)).toEqual(['9', '11']);
    await db.close();
  });

  it("an error that is not the store's own unknown (it may repeat on every send) is not fenced: CommitUnknownError after one send", async () => {
    const { store, db } = await seededPair();
    const [cas, reads] = [store.calls.checkAndSet, store.calls.read];
    let sends = 0;
    store.checkAndSetStampedMany = async () => {
      sends++;
      throw new Error('a bug that fails every send');
    };
    await expect(db.transact(transfer)).rejects.toBeInstanceOf(CommitUnknownError);
    expect(sends).toBe(1);
    expect(store.calls.checkAndSet - cas).toBe(0);
    expect(store.calls.read - reads).toBeGreaterThan(0); // it did re-read
    await db.close();
  });

  it('two transfers in one late shared step each fence their own rows and commit once', async () => {
    const store = new InstrumentedStore(new MemoryStore(), ONE_STEP);
    const db = new Percolator({ store });
    await db.transact(async (tx) => {
      for (const k of ['a', 'b', 'c', 'd']) tx.set('t', k, 'v', '10');
    });
    const sizes: number[] = [];
    const once = lateOnce();
    store.manyFault = (requests) => {
      sizes.push(requests.length);
      return once();
    };
    const move = (from: string, to: string) => async (tx: Transaction) => {
      const x = Number(await tx.getString('t', from, 'v'));
      const y = Number(await tx.getString('t', to, 'v'));
      tx.set('t', from, 'v', String(x - 1));
      tx.set('t', to, 'v', String(y + 1));
    };
    const cas = store.calls.checkAndSet;
    await Promise.all([db.transact(move('a', 'b')), db.transact(move('c', 'd'))]);
    expect(sizes[0]).toBe(4); // one shared step of both
    expect(store.calls.checkAndSet - cas).toBe(2); // a fence each
    expect((await store.late.shift()!()).ok).toBe(false);
    const all = await db.transact((t) =>
      Promise.all(['a', 'b', 'c', 'd'].map((k) => t.getString('t', k, 'v'))),
    );
    expect(all).toEqual(['9', '11', '9', '11']);
    await db.close();
  });

  it('a fence refused with certainty (nothing applied) is sent again', async () => {
    const { store, db } = await seededPair();
    const faults: ('late' | 'refuse' | undefined)[] = ['late', 'refuse'];
    store.casFault = () => faults.shift();
    const cas = store.calls.checkAndSet;
    await db.transact(async (tx) => {
      const a = await tx.getString('t', 'a', 'v');
      tx.set('t', 'a', 'v', `${a}!`);
    });
    expect(faults).toEqual([]);
    expect(store.calls.checkAndSet - cas).toBe(2); // the fence, refused, then applied
    expect((await store.late.shift()!()).ok).toBe(false);
    expect(await balances(db)).toEqual(['10!', '10']);
    await db.close();
  });

  it('the default follows the store: peeked where a draw costs more than a read, drawn where not; the option is checked', async () => {
    const cheapDraws = new InstrumentedStore(new MemoryStore(), { ...ONE_STEP, stampedReadUnderLoad: true });
    for (const [options, peeked] of [
      [{}, false],
      [{ peekedWrites: true }, true],
    ] as const) {
      const db = new Percolator({ store: cheapDraws, ...options });
      const before = { ...cheapDraws.calls };
      await db.transact(async (tx) => {
        await tx.getString('t', 'a', 'v');
        tx.set('t', 'a', 'v', 'x');
      });
      expect(cheapDraws.calls.readPeeked - before.readPeeked, JSON.stringify(options)).toBe(peeked ? 1 : 0);
      expect(cheapDraws.calls.readStamped - before.readStamped, JSON.stringify(options)).toBe(peeked ? 0 : 1);
      await db.close();
    }
    for (const bad of ['yes', 1, null]) {
      expect(() => new Percolator({ store: new MemoryStore(), peekedWrites: bad as never })).toThrow(
        InvalidArgumentError,
      );
    }
  });
});

/**
 * A store that peeks but has no stamped CAS (DynamoDB's capabilities): every commit takes
 * two phases under a drawn identity, which is drawn beside the peek (docs/protocol.md 4.10,
 * "Identity ahead").
 */
const NO_STAMPS = { stampedCheckAndSet: false, stampedCheckAndSetMany: false } as const;

describe('identity ahead: peeked snapshots on a store with no stamped CAS', () => {
  async function seeded(onEvent?: (e: PercolatorEvent) => void) {
    const store = new InstrumentedStore(new MemoryStore(), NO_STAMPS);
    const db = new Percolator({ store, ...(onEvent ? { onEvent } : {}) });
    await db.transact(async (tx) => {
      tx.set('t', 'a', 'v', '10');
      tx.set('t', 'b', 'v', '10');
    });
    return { store, db };
  }

  /** Stages GC having pruned cell t/`key`/v through `through` (the head row says so). */
  async function stagePruned(store: InstrumentedStore, key: string, through: number): Promise<void> {
    const stored = (await store.inner.read('t', key))!;
    const row = decodeRow(stored.state);
    row.cells.get('v')!.prunedThrough = through;
    const staged = await store.inner.checkAndSet({
      table: 't',
      key,
      expected: stored.version,
      state: encodeRow(row),
    });
    expect(staged.ok).toBe(true);
  }

  /** Holds every readPeeked of `store` until `release`; `asked` counts those sent. */
  function holdPeeks(store: InstrumentedStore): { release: () => void; asked: () => number } {
    const inner = store.readPeeked.bind(store);
    let release!: () => void;
    const held = new Promise<void>((r) => {
      release = r;
    });
    let asked = 0;
    store.readPeeked = async (refs, counter) => {
      asked++;
      await held;
      return inner(refs, counter);
    };
    return { release, asked: () => asked };
  }

  it('the identity is drawn while the peek is in flight, and the transfer commits in two phases under it', async () => {
    const events: PercolatorEvent[] = [];
    const { store, db } = await seeded((e) => events.push(e));
    const peeks = holdPeeks(store);
    const draws = store.calls.incrementCounter;
    const done = db.transact(transfer);
    // The peek is held, and the identity's draw has gone out beside it.
    await new Promise((r) => setTimeout(r, 20));
    expect(peeks.asked()).toBe(1);
    expect(store.calls.incrementCounter - draws).toBe(1);
    peeks.release();
    await done;
    // Then one more draw, the commit timestamp: none after the peek for the identity.
    expect(store.calls.incrementCounter - draws).toBe(2);
    expect(store.calls.checkAndSetStamped).toBe(0);
    const end = events.findLast((e) => e.type === 'transaction.end');
    if (end?.type !== 'transaction.end') throw new Error('no end event');
    expect(end.outcome).toBe('committed');
    const { identityTs, startTs, commitTs } = end;
    // Drawn before the peek read the counter: below the snapshot, and the commit above both.
    expect(identityTs).toBeDefined();
    expect(identityTs!).toBeLessThan(startTs!);
    expect(commitTs!).toBeGreaterThanOrEqual(startTs!);
    for (const row of ['a', 'b']) {
      const { lock, writes } = await recordsOf(store.inner, 't', row);
      expect(lock).toBeUndefined();
      expect(writes.find((w) => w.startTs === identityTs)).toMatchObject({ kind: 'put', commitTs });
    }
    expect(await balances(db)).toEqual(['9', '11']);
    await db.close();
  });

  it('a reader whose snapshot is above the identity waits on its lock, and sees its commit, drawn below that snapshot', async () => {
    const { store, db } = await seeded();
    // The writer prewrites under its identity, then stops before its commit point.
    let stop!: () => void;
    const stopped = new Promise<void>((r) => {
      stop = r;
    });
    let go!: () => void;
    const resume = new Promise<void>((r) => {
      go = r;
    });
    const writer = new Percolator({
      store,
      hooks: {
        onCommitStep: async (e) => {
          if (e.step === 'beforeCommitPrimary') {
            stop();
            await resume;
          }
        },
      },
    });
    const tx = await writer.begin();
    await transfer(tx);
    const committing = tx.commit();
    await stopped;
    const lock = (await recordsOf(store.inner, 't', 'a')).lock;
    expect(lock).toBeDefined();
    expect(lock!.startTs).toBeLessThan(tx.startTs);
    // A reader peeks now: its snapshot is above the lock, so it must wait on it. The
    // writer drew its commit timestamp before stopping, so below this snapshot: once the
    // lock is settled the reader must see the transfer (had it read past the lock, it
    // would have seen the old values: a snapshot missing a commit below it).
    const reader = await db.begin({ readOnly: true });
    expect(reader.startTs).toBeGreaterThan(lock!.startTs);
    const read = Promise.all([reader.getString('t', 'a', 'v'), reader.getString('t', 'b', 'v')]);
    let settled = false;
    void read.then(() => {
      settled = true;
    });
    await new Promise((r) => setTimeout(r, 30));
    expect(settled).toBe(false);
    go();
    const { commitTs } = await committing;
    expect(commitTs).toBeLessThan(reader.startTs);
    expect(await read).toEqual(['9', '11']);
    expect(await balances(db)).toEqual(['9', '11']);
    await Promise.all([db.close(), writer.close()]);
  });

  it('the default peeks where the store peeks and draws cost more than reads; drawn with peekedWrites false', async () => {
    for (const [options, ahead] of [
      [{}, true],
      [{ peekedWrites: false }, false],
    ] as const) {
      const store = new InstrumentedStore(new MemoryStore(), NO_STAMPS);
      const ends: PercolatorEvent[] = [];
      const db = new Percolator({ store, ...options, onEvent: (e) => ends.push(e) });
      await db.transact(async (tx) => {
        await tx.getString('t', 'a', 'v');
        tx.set('t', 'a', 'v', 'x');
      });
      expect(store.calls.readPeeked, JSON.stringify(options)).toBe(ahead ? 1 : 0);
      const end = ends.findLast((e) => e.type === 'transaction.end');
      if (end?.type !== 'transaction.end') throw new Error('no end event');
      // Peeked: an identity apart from the snapshot; drawn: the start timestamp is it.
      expect(end.identityTs !== undefined, JSON.stringify(options)).toBe(ahead);
      await db.close();
    }
  });

  it('a prewrite under an identity at or below pruned history is refused, though its snapshot is above it', async () => {
    const { store, db } = await seeded();
    const tx = await db.begin();
    await transfer(tx);
    // The identity was drawn just before the peek read the counter: one below the snapshot.
    // GC pruned row a through it (staged: the head row says so), so its rollback record could
    // be gone: the prewrite must be refused (a check at the snapshot alone let it through).
    await stagePruned(store, 'a', tx.startTs - 1);
    await expect(tx.commit()).rejects.toBeInstanceOf(SnapshotTooOldError);
    expect((await recordsOf(store.inner, 't', 'a')).lock).toBeUndefined();
    expect((await recordsOf(store.inner, 't', 'b')).lock).toBeUndefined();
    expect(await balances(db)).toEqual(['10', '10']);
    await db.close();
  });

  it('a peek that fails and is sent again draws the identity again, next to the snapshot it gets', async () => {
    const events: PercolatorEvent[] = [];
    const { store, db } = await seeded((e) => events.push(e));
    const inner = store.readPeeked.bind(store);
    let failures = 1;
    store.readPeeked = async (refs, counter) => {
      if (failures-- > 0)
        throw new StoreError('injected: a peek refused for good', 'no', { retryable: false });
      return inner(refs, counter);
    };
    const other = new Percolator({ store, peekedWrites: false });
    let startTs = 0;
    await db.transact(async (tx) => {
      // The first read's peek fails for good; another client commits (the counter moves
      // on); the transaction reads again, in a new peek.
      await expect(tx.getString('t', 'a', 'v')).rejects.toBeInstanceOf(StoreError);
      await other.transact(async (o) => o.set('t', 'c', 'v', 'x'));
      await transfer(tx);
      startTs = tx.startTs;
    });
    const end = events.findLast((e) => e.type === 'transaction.end');
    if (end?.type !== 'transaction.end') throw new Error('no end event');
    expect(end.outcome).toBe('committed');
    // Drawn just before the second peek read the counter (the one drawn beside the first
    // peek is lower, below the other client's commit, and unused).
    expect(end.identityTs).toBe(startTs - 1);
    await Promise.all([db.close(), other.close()]);
  });

  it('history pruned between the identity and the snapshot on a secondary row is no reason to abort', async () => {
    const { store, db } = await seeded();
    const tx = await db.begin();
    await transfer(tx);
    // 'b' is a secondary: its pruned history below the snapshot hides nothing this
    // transaction read, and a late lock there is settled through the primary.
    await stagePruned(store, 'b', tx.startTs - 1);
    await tx.commit();
    expect(await balances(db)).toEqual(['9', '11']);
    await db.close();
  });
});
