import {
  AbortedError,
  ClientCrash,
  ConflictError,
  LockNotResolvedError,
  MemoryStore,
  Percolator,
  type RowStore,
} from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { InstrumentedStore } from './support.js';

/**
 * A reader that meets a lock of a commit its own client has in flight waits for that
 * commit (docs/protocol.md section 5, "A lock of this client"): no polling of the primary.
 */
describe('locks of this client', () => {
  /** A client whose two-row commits stop before their commit point until `release()`. */
  function stalledClient(options: { lockWaitMs: number }) {
    const store = new InstrumentedStore();
    let release!: () => void;
    const gate = new Promise<void>((r) => {
      release = r;
    });
    let stalled!: () => void;
    const reached = new Promise<void>((r) => {
      stalled = r;
    });
    const db = new Percolator({
      store,
      lockTtlMs: 60_000,
      lockWaitMs: options.lockWaitMs,
      hooks: {
        onCommitStep: async (e) => {
          if (e.step !== 'beforeCommitPrimary') return;
          stalled();
          await gate;
        },
      },
    });
    /** Starts a transaction writing `value` to rows a and b: it stalls before its commit point. */
    const writeBoth = (value: string) =>
      db.transact(async (tx) => {
        tx.set('t', 'a', 'v', value);
        tx.set('t', 'b', 'v', value);
      });
    return { store, db, release, reached, writeBoth };
  }

  it('a reader waits for the commit to finish, reading nothing meanwhile, then reads on', async () => {
    const { store, db, release, reached, writeBoth } = stalledClient({ lockWaitMs: 30_000 });
    const setup = new Percolator({ store });
    await setup.transact(async (tx) => {
      tx.set('t', 'a', 'v', 'old');
      tx.set('t', 'b', 'v', 'old');
    });
    await setup.close();
    const writer = writeBoth('new');
    await reached; // both rows are locked now
    const readsBefore = store.rowReads;
    let readerDone = false;
    const reader = db
      .transact(async (tx) => [await tx.getString('t', 'b', 'v'), await tx.getString('t', 'a', 'v')])
      .finally(() => {
        readerDone = true;
      });
    await new Promise((r) => setTimeout(r, 100));
    // It read the locked row once and is waiting: no reads of the primary, no re-reads.
    expect(readerDone).toBe(false);
    expect(store.rowReads - readsBefore).toBe(1);
    release();
    await writer;
    // Its snapshot predates the commit: it reads the old values, after the locks are gone.
    expect(await reader).toEqual(['old', 'old']);
    expect(await db.transact(async (tx) => tx.getString('t', 'b', 'v'))).toBe('new');
    await db.close();
  });

  it('waits at most lockWaitMs, then resolves as usual (a live lock: LockNotResolvedError)', async () => {
    const { db, release, reached, writeBoth } = stalledClient({ lockWaitMs: 50 });
    const writer = writeBoth('new');
    await reached;
    await expect(
      db.transact(async (tx) => tx.getString('t', 'b', 'v'), { maxAttempts: 1 }),
    ).rejects.toBeInstanceOf(LockNotResolvedError);
    release();
    await writer;
    await db.close();
  });

  it('an abort stops the wait at once', async () => {
    const { db, release, reached, writeBoth } = stalledClient({ lockWaitMs: 30_000 });
    const writer = writeBoth('new');
    await reached;
    const controller = new AbortController();
    const reader = db.transact(async (tx) => tx.getString('t', 'b', 'v'), { signal: controller.signal });
    await new Promise((r) => setTimeout(r, 20));
    controller.abort();
    await expect(reader).rejects.toBeInstanceOf(AbortedError);
    release();
    await writer;
    await db.close();
  });

  /** A memory store (with its batched CAS) that counts head-row reads. */
  function countingStore() {
    const inner = new MemoryStore();
    const counts = { headReads: 0 };
    const store = new Proxy(inner, {
      get(target, name) {
        const value = Reflect.get(target, name);
        if (typeof value !== 'function') return value;
        return (...args: unknown[]) => {
          if (name === 'read' && args[0] === 't') counts.headReads++;
          return value.apply(target, args);
        };
      },
    }) as RowStore;
    return { store, counts };
  }

  it('back to back on the same rows, a prewrite waits for the commit before it to finish its secondaries, and meets none of its locks', async () => {
    const { store, counts } = countingStore();
    let resolutions = 0;
    const db = new Percolator({
      store,
      onEvent: (e) => {
        if (e.type === 'lock.resolve') resolutions++;
      },
    });
    // commit() resolves at the commit point; the secondaries are still being committed
    // when the next transaction, writing the same rows, prewrites (the tidy step moving
    // the 100-byte values out makes that likely on the memory store).
    for (let i = 0; i < 30; i++)
      await db.transact(async (tx) => {
        for (let r = 0; r < 10; r++) tx.set('t', `r${r}`, 'v', `${i}`.padEnd(100, '.'));
      });
    expect(resolutions).toBe(0);
    expect(counts.headReads).toBe(0);
    const values = await db.transact(async (tx) =>
      Promise.all(Array.from({ length: 10 }, (_, r) => tx.getString('t', `r${r}`, 'v'))),
    );
    expect(values).toEqual(Array.from({ length: 10 }, () => '29'.padEnd(100, '.')));
    await db.close();
  });

  it('a prewrite never waits for a commit of this client that is still before its commit point: it conflicts, as in the paper', async () => {
    const { db, release, reached, writeBoth } = stalledClient({ lockWaitMs: 30_000 });
    const writer = writeBoth('first');
    await reached; // both rows locked, the commit point not reached
    // Rejects while the first commit is still stalled: it did not wait for it.
    await expect(
      db.transact(async (tx) => tx.set('t', 'b', 'v', 'second'), { maxAttempts: 1 }),
    ).rejects.toBeInstanceOf(ConflictError);
    release();
    await writer;
    expect(await db.transact(async (tx) => tx.getString('t', 'b', 'v'))).toBe('first');
    await db.close();
  });

  it('a commit that stops after its commit point leaves its locks to the usual resolution: the next prewrite of the same client rolls them forward', async () => {
    const store = new MemoryStore();
    let crash = true;
    const db = new Percolator({
      store,
      hooks: {
        onCommitStep: (e) => {
          if (crash && e.step === 'afterCommitPrimary') {
            crash = false;
            throw new ClientCrash();
          }
        },
      },
    });
    await db
      .transact(async (tx) => {
        for (const row of ['a', 'b', 'c']) tx.set('t', row, 'v', 'crashed-but-committed');
      })
      .catch(() => undefined);
    await db.transact(async (tx) => {
      for (const row of ['b', 'c']) tx.set('t', row, 'v', 'next');
    });
    expect(
      await db.transact(async (tx) => Promise.all(['a', 'b', 'c'].map((row) => tx.getString('t', row, 'v')))),
    ).toEqual(['crashed-but-committed', 'next', 'next']);
    await db.close();
  });
});
