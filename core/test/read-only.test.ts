import {
  ClientCrash,
  InvalidArgumentError,
  LockNotResolvedError,
  MemoryStore,
  ORACLE_COUNTER,
  Percolator,
  StoreError,
  UnsupportedOperationError,
} from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { InstrumentedStore } from './support.js';

/** Read-only transactions and their peeked snapshots (docs/protocol.md section 3). */
describe('read-only transactions', () => {
  it('take their snapshot with one peeked read that draws nothing, and see what was committed', async () => {
    const store = new InstrumentedStore();
    const db = new Percolator({ store });
    await db.transact(async (tx) => {
      tx.set('t', 'a', 'v', '1');
      tx.set('t', 'b', 'v', '2');
    });
    await db.flush();
    const counter = await store.inner.incrementCounter(ORACLE_COUNTER, 0 + 1);
    const before = { ...store.calls };
    const seen = await db.transact(
      async (tx) => Promise.all([tx.getString('t', 'a', 'v'), tx.getString('t', 'b', 'v')]),
      { readOnly: true },
    );
    expect(seen).toEqual(['1', '2']);
    expect(store.calls.readPeeked - before.readPeeked).toBe(1); // both reads, and the snapshot
    expect(store.calls.readStamped - before.readStamped).toBe(0);
    expect(store.calls.incrementCounter - before.incrementCounter).toBe(0);
    expect(store.calls.read - before.read).toBe(0);
    // The counter did not move: the next draw is the one after the value drawn above.
    expect(await store.inner.incrementCounter(ORACLE_COUNTER, 1)).toBe(counter + 1);
    await db.close();
  });

  it('peek with their first reads under load too: one call, even while the oracle is busy', async () => {
    const store = new InstrumentedStore();
    const db = new Percolator({ store });
    await db.transact(async (tx) => tx.set('t', 'a', 'v', '1'));
    await db.flush();
    // The oracle's next fetch hangs until released: the client is "under load".
    let release!: () => void;
    const gate = new Promise<void>((r) => {
      release = r;
    });
    const increment = store.incrementCounter.bind(store);
    store.incrementCounter = async (name, delta) => {
      await gate;
      return increment(name, delta);
    };
    const drawing = db.begin(); // a fetch in flight
    const before = { ...store.calls };
    expect(await db.transact((tx) => tx.getString('t', 'a', 'v'), { readOnly: true })).toBe('1');
    expect(store.calls.readPeeked - before.readPeeked).toBe(1);
    expect(store.calls.read - before.read).toBe(0);
    release();
    await (await drawing).rollback();
    await db.close();
  });

  it('see every commit acknowledged before they began, one-row, multi-row and from other clients', async () => {
    const store = new MemoryStore();
    const writer = new Percolator({ store });
    const other = new Percolator({ store });
    const reader = new Percolator({ store });
    for (let i = 0; i < 40; i++) {
      const w = i % 2 === 0 ? writer : other;
      if (i % 3 === 0) await w.transact(async (tx) => tx.set('t', 'x', 'v', String(i)));
      else
        await w.transact(async (tx) => {
          tx.set('t', 'x', 'v', String(i));
          tx.set('u', 'y', 'v', String(i));
        });
      const [x, y] = await reader.transact(
        async (tx) => Promise.all([tx.getString('t', 'x', 'v'), tx.getString('u', 'y', 'v')]),
        { readOnly: true },
      );
      expect(x).toBe(String(i));
      if (i % 3 !== 0) expect(y).toBe(String(i));
      const tx = await reader.begin({ readOnly: true });
      expect(await tx.getString('t', 'x', 'v')).toBe(String(i));
      await tx.commit();
    }
    await Promise.all([writer.close(), other.close(), reader.close()]);
  });

  it('refuse writes with a typed error and change nothing', async () => {
    const store = new InstrumentedStore();
    const db = new Percolator({ store, observedColumns: [{ table: 't', column: 'v' }] });
    await db.transact(async (tx) => tx.set('t', 'a', 'v', 'kept'));
    await db.flush();
    const writes = () => store.calls.checkAndSet + store.calls.checkAndSetStamped;
    const before = writes();
    for (const write of [
      (tx: Parameters<Parameters<Percolator['transact']>[0]>[0]) => tx.set('t', 'a', 'v', 'x'),
      (tx: Parameters<Parameters<Percolator['transact']>[0]>[0]) => tx.delete('t', 'a', 'v'),
      (tx: Parameters<Parameters<Percolator['transact']>[0]>[0]) => tx.setJson('t', 'a', 'v', { x: 1 }),
      (tx: Parameters<Parameters<Percolator['transact']>[0]>[0]) => tx.notify('t', 'a', 'v'),
    ]) {
      await expect(
        db.transact(
          async (tx) => {
            await tx.get('t', 'a', 'v');
            write(tx);
          },
          { readOnly: true },
        ),
      ).rejects.toBeInstanceOf(UnsupportedOperationError);
      const tx = await db.begin({ readOnly: true });
      expect(() => write(tx)).toThrow(UnsupportedOperationError);
      await tx.rollback();
    }
    expect(writes()).toBe(before);
    expect(await db.transact((tx) => tx.getString('t', 'a', 'v'))).toBe('kept');
    await expect(
      db.transact(async () => 1, { readOnly: 'yes' as unknown as boolean }),
    ).rejects.toBeInstanceOf(InvalidArgumentError);
    await expect(db.begin({ readOnly: 1 as unknown as boolean })).rejects.toBeInstanceOf(
      InvalidArgumentError,
    );
    await db.close();
  });

  it('do not wait on a lock at exactly their peeked timestamp (drawn after the peek), and do wait on one below it', async () => {
    const store = new MemoryStore();
    const setup = new Percolator({ store });
    await setup.transact(async (tx) => {
      tx.set('t', 'a', 'v', 'old');
      tx.set('t', 'b', 'v', 'old');
    });
    await setup.close();
    const reader = new Percolator({ store, lockWaitMs: 150 });
    const snapshot = await reader.begin({ readOnly: true });
    // A writer draws the next value, which is the reader's peeked timestamp, prewrites, and
    // stops (its locks stay, live for a minute).
    const crasher = new Percolator({
      store,
      lockTtlMs: 60_000,
      // The two-phase steps these hooks stop at (a one-step commit has none).
      onePhaseMaxRows: 1,
      hooks: {
        onCommitStep: (e) => {
          if (e.step === 'beforeCommitPrimary') throw new ClientCrash();
        },
      },
    });
    const stopped = await crasher.begin();
    expect(stopped.startTs).toBe(snapshot.startTs);
    stopped.set('t', 'a', 'v', 'new');
    stopped.set('t', 'b', 'v', 'new');
    await expect(stopped.commit()).rejects.toBeInstanceOf(ClientCrash);
    // Its commit could only come above the snapshot: the lock is not waited on (waited
    // on, this live lock would end the read in LockNotResolvedError).
    expect(await snapshot.getString('t', 'a', 'v')).toBe('old');
    await snapshot.commit();
    // A later snapshot (peeked or drawn) is above the lock: a live lock below it is waited on.
    for (const readOnly of [true, false]) {
      await expect(
        reader.transact((tx) => tx.getString('t', 'b', 'v'), { readOnly, maxAttempts: 1 }),
      ).rejects.toBeInstanceOf(LockNotResolvedError);
    }
    await reader.close();
  });

  it('when the peek fails, take the start timestamp from the oracle instead (ready() and first reads); a failure retrying cannot fix ends them', async () => {
    const store = new InstrumentedStore();
    const db = new Percolator({ store });
    await db.transact(async (tx) => tx.set('t', 'a', 'v', '1'));
    await db.flush();
    let failure: Error | undefined = new StoreError('the peek timed out before reaching the store', 'no');
    const peekOnce = store.readPeeked.bind(store);
    store.readPeeked = async (refs, counter) => {
      if (failure) throw failure;
      return peekOnce(refs, counter);
    };
    // db.begin({ readOnly: true }) (which calls tx.ready()): the snapshot alone, before any read.
    const before = { ...store.calls };
    const tx = await db.begin({ readOnly: true });
    const ts = await tx.ready();
    expect(ts).toBeGreaterThan(0);
    expect(store.calls.incrementCounter - before.incrementCounter).toBe(1);
    expect(await tx.getString('t', 'a', 'v')).toBe('1');
    await tx.commit();
    // The first reads of a read-only transaction.
    expect(await db.transact((t) => t.getString('t', 'a', 'v'), { readOnly: true })).toBe('1');
    // Not a fault the oracle can route around: it reaches the caller, and a later call tries again.
    failure = new UnsupportedOperationError('this store was configured without peeks');
    await expect(db.begin({ readOnly: true })).rejects.toBe(failure);
    await expect(db.transact((t) => t.getString('t', 'a', 'v'), { readOnly: true })).rejects.toBe(failure);
    failure = undefined;
    const draws = store.calls.incrementCounter;
    const again = await db.begin({ readOnly: true });
    expect(await again.ready()).toBeGreaterThanOrEqual(ts);
    expect(store.calls.incrementCounter).toBe(draws); // peeked this time
    await again.commit();
    await db.close();
  });

  it('that begin in the same turn share one peek: each gets its own rows and sees every commit acknowledged before it began', async () => {
    const store = new InstrumentedStore();
    const db = new Percolator({ store });
    const other = new Percolator({ store });
    await db.transact(async (tx) => {
      for (let i = 0; i < 8; i++) tx.set('t', `r${i}`, 'v', `a${i}`);
    });
    await db.flush();
    const readAll = () =>
      Promise.all(
        Array.from({ length: 8 }, (_, i) =>
          // Two of them read the same row, one reads two rows, in its own order.
          db.transact(
            async (tx) =>
              i === 7
                ? (await Promise.all([tx.getString('t', 'r7', 'v'), tx.getString('t', 'r0', 'v')])).join('+')
                : tx.getString('t', `r${i === 6 ? 0 : i}`, 'v'),
            { readOnly: true },
          ),
        ),
      );
    let before = { ...store.calls };
    expect(await readAll()).toEqual(['a0', 'a1', 'a2', 'a3', 'a4', 'a5', 'a0', 'a7+a0']);
    expect(store.calls.readPeeked - before.readPeeked).toBe(1);
    expect(store.calls.incrementCounter - before.incrementCounter).toBe(0);
    // A commit by another client, acknowledged before they begin: every one of them sees it.
    await other.transact(async (tx) => {
      tx.set('t', 'r0', 'v', 'b0');
      tx.set('t', 'r7', 'v', 'b7');
    });
    before = { ...store.calls };
    expect(await readAll()).toEqual(['b0', 'a1', 'a2', 'a3', 'a4', 'a5', 'b0', 'b7+b0']);
    expect(store.calls.readPeeked - before.readPeeked).toBe(1);
    await db.close();
    await other.close();
  });

  it('sharing a peek that fails, each falls back to the oracle on its own and reads the right rows', async () => {
    const store = new InstrumentedStore();
    const db = new Percolator({ store });
    await db.transact(async (tx) => {
      for (let i = 0; i < 4; i++) tx.set('t', `r${i}`, 'v', `a${i}`);
    });
    await db.flush();
    let peeks = 0;
    const peekOnce = store.readPeeked.bind(store);
    store.readPeeked = async (refs, counter) => {
      if (peeks++ === 0) throw new StoreError('the shared peek timed out', 'no');
      return peekOnce(refs, counter);
    };
    const before = { ...store.calls };
    const seen = await Promise.all(
      Array.from({ length: 4 }, (_, i) =>
        db.transact((tx) => tx.getString('t', `r${i}`, 'v'), { readOnly: true }),
      ),
    );
    expect(seen).toEqual(['a0', 'a1', 'a2', 'a3']);
    expect(peeks).toBe(1); // the one that failed, shared
    // Their timestamps came from the oracle (one batched fetch), then plain reads.
    expect(store.calls.incrementCounter - before.incrementCounter).toBeGreaterThanOrEqual(1);
    await db.close();
  });

  it('a store whose peek throws instead of rejecting: each sharing transaction gets the failure, nothing escapes', async () => {
    const store = new InstrumentedStore();
    const db = new Percolator({ store });
    await db.transact(async (tx) => {
      for (let i = 0; i < 3; i++) tx.set('t', `r${i}`, 'v', `a${i}`);
    });
    await db.flush();
    const peekOnce = store.readPeeked.bind(store);
    let thrown: Error | undefined = new StoreError('the peek could not be sent', 'no');
    let throws = 0;
    // Not an async function: it throws synchronously, as a careless adapter might.
    store.readPeeked = (refs, counter) => {
      if (thrown) {
        throws++;
        throw thrown;
      }
      return peekOnce(refs, counter);
    };
    const readAll = () =>
      Promise.allSettled(
        Array.from({ length: 3 }, (_, i) =>
          db.transact((tx) => tx.getString('t', `r${i}`, 'v'), { readOnly: true, maxAttempts: 1 }),
        ),
      );
    // A failure the oracle can route around: each reads through the oracle.
    expect((await readAll()).map((r) => (r.status === 'fulfilled' ? r.value : r.reason))).toEqual([
      'a0',
      'a1',
      'a2',
    ]);
    expect(throws).toBe(1); // one shared peek
    // One it cannot: each transaction gets it.
    thrown = new UnsupportedOperationError('this store was configured without peeks');
    const failed = await readAll();
    expect(failed.map((r) => (r.status === 'rejected' ? r.reason : r.value))).toEqual([
      thrown,
      thrown,
      thrown,
    ]);
    thrown = undefined;
    expect(await db.transact((tx) => tx.getString('t', 'r1', 'v'), { readOnly: true })).toBe('a1');
    await db.close();
  });

  it('ready() while its first reads peek waits for that peek: one snapshot, no draw', async () => {
    const store = new InstrumentedStore();
    const db = new Percolator({ store });
    await db.transact(async (tx) => tx.set('t', 'a', 'v', '1'));
    await db.flush();
    const before = { ...store.calls };
    const out = await db.transact(
      async (tx) => {
        const read = tx.getString('t', 'a', 'v');
        const ts = await tx.ready(); // the peek is in flight (or queued): waits for it
        return { value: await read, ts, startTs: tx.startTs };
      },
      { readOnly: true },
    );
    expect(out.value).toBe('1');
    expect(out.ts).toBe(out.startTs);
    expect(store.calls.readPeeked - before.readPeeked).toBe(1);
    expect(store.calls.incrementCounter - before.incrementCounter).toBe(0);
    await db.close();
  });

  it('a peek or stamped read that answers the wrong number of rows or a bad timestamp fails the transaction: no row is taken for absent, nothing is written', async () => {
    const store = new InstrumentedStore();
    // Read-write transactions draw their start timestamp (a stamped read), not peek it.
    const db = new Percolator({ store, peekedWrites: false });
    await db.transact(async (tx) => {
      tx.set('t', 'a', 'v', '1');
      tx.set('t', 'b', 'v', '2');
    });
    await db.flush();
    const peek = store.readPeeked.bind(store);
    const stamped = store.readStamped.bind(store);
    type Reply = Awaited<ReturnType<typeof peek>>;
    const breakages: [string, (reply: Reply) => Reply][] = [
      ['a row short', (reply) => ({ ...reply, rows: reply.rows.slice(1) })],
      ['a row too many', (reply) => ({ ...reply, rows: [...reply.rows, null] })],
      ['a negative timestamp', (reply) => ({ ...reply, timestamp: -5 })],
      ['no timestamp', (reply) => ({ ...reply, timestamp: Number.NaN })],
    ];
    const both = (tx: { getString(t: string, r: string, c: string): Promise<string | undefined> }) =>
      Promise.all([tx.getString('t', 'a', 'v'), tx.getString('t', 'b', 'v')]);
    const contract = (what: string) =>
      expect.objectContaining({
        name: 'StoreError',
        retryable: false,
        message: expect.stringContaining(`${what} broke the store contract`),
      });
    for (const [what, broken] of breakages) {
      store.readPeeked = async (refs, counter) => broken(await peek(refs, counter));
      store.readStamped = async (refs, counter) => broken(await stamped(refs, counter));
      // Read-only (a peek), then read-write (a stamped read): a broken store, so one
      // attempt each (not retryable), and the reads never resolve with a wrong row.
      await expect(db.transact(both, { readOnly: true }), what).rejects.toEqual(contract('readPeeked'));
      let seen: unknown;
      await expect(
        db.transact(async (tx) => {
          seen = await both(tx);
          tx.set('t', 'c', 'v', what);
        }),
        what,
      ).rejects.toEqual(contract('readStamped'));
      expect(seen, what).toBeUndefined();
      if (what.includes('timestamp')) {
        // ready() alone (a peek of no rows): refused the same way.
        await expect(db.begin({ readOnly: true }), what).rejects.toEqual(contract('readPeeked'));
      }
    }
    store.readPeeked = peek;
    store.readStamped = stamped;
    expect(await db.transact(both, { readOnly: true })).toEqual(['1', '2']);
    expect(await db.transact((tx) => tx.getString('t', 'c', 'v'), { readOnly: true })).toBeUndefined();
    await db.close();
  });

  it('on a store without peekedRead, draw their start timestamp as any transaction does', async () => {
    const store = new InstrumentedStore(new MemoryStore(), { peekedRead: false });
    const db = new Percolator({ store });
    await db.transact(async (tx) => tx.set('t', 'a', 'v', '1'));
    const before = { ...store.calls };
    expect(await db.transact((tx) => tx.getString('t', 'a', 'v'), { readOnly: true })).toBe('1');
    expect(store.calls.readPeeked - before.readPeeked).toBe(0);
    expect(store.calls.readStamped + store.calls.incrementCounter).toBeGreaterThan(
      before.readStamped + before.incrementCounter,
    );
    await db.close();
  });
});
