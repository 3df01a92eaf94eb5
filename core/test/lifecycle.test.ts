import { AbortedError, ClosedError, MemoryStore, Percolator } from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { InstrumentedStore, stoppedBeforeCommitPrimary } from './support.js';

/** Every call the store has had, of any kind. */
const callsOf = (store: InstrumentedStore) =>
  Object.values(store.calls).reduce((n, c) => n + c, 0) + store.stampedManyCalls;

const tick = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('close() and the reads in flight', () => {
  it('a read waiting on a live lock stops with ClosedError, and close() returns only after it did', async () => {
    const store = new InstrumentedStore(new MemoryStore());
    // A client stopped before its commit point leaves a live lock on t/x (lockTtlMs: 60 s).
    const crashed = await stoppedBeforeCommitPrimary(store, 60_000);
    const db = new Percolator({ store, lockTtlMs: 60_000, lockWaitMs: 60_000 });
    const tx = await db.begin();
    const read = tx.getString('t', 'x', 'v').then(
      () => 'read',
      (error: unknown) => error,
    );
    await tick(30); // the read is waiting on the lock, asking its primary again and again
    await db.close();
    // Before, close() returned at once and the read went on calling the store for up to
    // lockWaitMs (here a minute), resolving locks after close.
    expect(await Promise.race([read, tick(0).then(() => 'still pending')])).toBeInstanceOf(ClosedError);
    expect(await read).toBeInstanceOf(ClosedError);
    const after = callsOf(store);
    await tick(100);
    expect(callsOf(store)).toBe(after);
    await crashed.close();
  });

  it("a commit's identity drawn beside its peek is waited for: no store call after close()", async () => {
    // Peeked snapshots and no stamped step (as on DynamoDB): a read-write transaction draws
    // its commit's identity while its first read peeks. One that only read never takes it.
    class SlowCounter extends InstrumentedStore {
      inFlight = 0;
      release: (() => void) | undefined;
      override async incrementCounter(name: string, delta: number): Promise<number> {
        this.inFlight++;
        await new Promise<void>((resolve) => {
          this.release = resolve;
        });
        try {
          return await super.incrementCounter(name, delta);
        } finally {
          this.inFlight--;
        }
      }
    }
    const store = new SlowCounter(new MemoryStore(), { stampedCheckAndSet: false, stampedRead: false });
    const db = new Percolator({ store });
    await db.transact(async (tx) => {
      await tx.getString('t', 'x', 'v');
    });
    expect(store.inFlight).toBe(1); // the identity, still drawing
    let closed = false;
    const closing = db.close().then(() => {
      closed = true;
    });
    await tick(20);
    expect(closed).toBe(false); // waits for the draw
    store.release!();
    await closing;
    expect(store.inFlight).toBe(0);
  });
});

describe('a scan resumed by its caller', () => {
  async function seeded(): Promise<{ db: Percolator; store: InstrumentedStore }> {
    const store = new InstrumentedStore(new MemoryStore());
    const db = new Percolator({ store });
    await db.transact(async (tx) => {
      for (const k of ['a', 'b', 'c']) tx.set('t', k, 'v', `old ${k}`);
    });
    return { db, store };
  }

  it('after its transaction committed: ClosedError, not rows without its own writes', async () => {
    const { db } = await seeded();
    const tx = await db.begin();
    tx.set('t', 'b', 'v', 'new b');
    const rows = tx.scan('t');
    expect((await rows.next()).value?.row).toBe('a');
    await tx.commit();
    // Before, it went on and gave b as 'old b': the transaction's own write had gone.
    await expect(rows.next()).rejects.toBeInstanceOf(ClosedError);
    await db.close();
  });

  it('after the signal fired: AbortedError at the next row, not the rest of the table', async () => {
    const { db } = await seeded();
    const controller = new AbortController();
    const seen: string[] = [];
    const error = await db
      .transact(
        async (tx) => {
          for await (const { row } of tx.scan('t')) {
            seen.push(row);
            controller.abort();
          }
        },
        { signal: controller.signal },
      )
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(AbortedError);
    expect(seen).toEqual(['a']);
    await db.close();
  });

  it('after the client closed: ClosedError, and no further store call', async () => {
    const { db, store } = await seeded();
    const tx = await db.begin();
    const rows = tx.scan('t');
    expect((await rows.next()).value?.row).toBe('a');
    await db.close();
    const before = callsOf(store);
    await expect(rows.next()).rejects.toBeInstanceOf(ClosedError);
    expect(callsOf(store)).toBe(before);
  });
});

describe('rollback() while the commit is in flight', () => {
  it('is a ClosedError (the commit decides), and the commit still commits', async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => {
      release = r;
    });
    const db = new Percolator({
      store: new MemoryStore(),
      onePhaseMaxRows: 1,
      hooks: {
        onCommitStep: async (e) => {
          if (e.step === 'beforeCommitPrimary') await gate;
        },
      },
    });
    const tx = await db.begin();
    tx.set('t', 'a', 'v', '1');
    tx.set('t', 'b', 'v', '1');
    const commit = tx.commit();
    await tick(10);
    // Before, it resolved as if it had rolled back, and the commit then committed.
    await expect(tx.rollback()).rejects.toBeInstanceOf(ClosedError);
    release();
    await expect(commit).resolves.toHaveProperty('commitTs');
    await tx.rollback(); // after the end: nothing to do
    expect(await db.transact((t) => t.getString('t', 'a', 'v'))).toBe('1');
    await db.close();
  });
});

describe('many reads waiting on one lock', () => {
  it('no listener warning, and close() still ends them all', async () => {
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(`${w.name}: ${w.message}`);
    process.on('warning', onWarning);
    try {
      const store = new InstrumentedStore(new MemoryStore());
      const crashed = await stoppedBeforeCommitPrimary(store, 60_000);
      const db = new Percolator({ store, lockTtlMs: 60_000, lockWaitMs: 60_000 });
      // More than Node's default of 10 listeners per signal: each wait once added one to a
      // signal of the client's, and Node warned of a possible leak.
      const txs = await Promise.all(Array.from({ length: 16 }, () => db.begin()));
      const reads = txs.map((tx) =>
        tx.getString('t', 'x', 'v').then(
          () => 'read',
          (error: unknown) => error,
        ),
      );
      await tick(50);
      await db.close();
      for (const read of reads) expect(await read).toBeInstanceOf(ClosedError);
      await new Promise((r) => setImmediate(r));
      expect(warnings.filter((w) => w.includes('MaxListeners'))).toEqual([]);
      await crashed.close();
    } finally {
      process.off('warning', onWarning);
    }
  });
});
