import { AbortedError, LockNotResolvedError, Percolator } from '@percolator/core';
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
    return { store, db, release, reached };
  }

  it('a reader waits for the commit to finish, reading nothing meanwhile, then reads on', async () => {
    const { store, db, release, reached } = stalledClient({ lockWaitMs: 30_000 });
    const setup = new Percolator({ store });
    await setup.transact(async (tx) => {
      tx.set('t', 'a', 'v', 'old');
      tx.set('t', 'b', 'v', 'old');
    });
    await setup.close();
    const writer = db.transact(async (tx) => {
      tx.set('t', 'a', 'v', 'new');
      tx.set('t', 'b', 'v', 'new');
    });
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
    const { db, release, reached } = stalledClient({ lockWaitMs: 50 });
    const writer = db.transact(async (tx) => {
      tx.set('t', 'a', 'v', 'new');
      tx.set('t', 'b', 'v', 'new');
    });
    await reached;
    await expect(
      db.transact(async (tx) => tx.getString('t', 'b', 'v'), { maxAttempts: 1 }),
    ).rejects.toBeInstanceOf(LockNotResolvedError);
    release();
    await writer;
    await db.close();
  });

  it('an abort stops the wait at once', async () => {
    const { db, release, reached } = stalledClient({ lockWaitMs: 30_000 });
    const writer = db.transact(async (tx) => {
      tx.set('t', 'a', 'v', 'new');
      tx.set('t', 'b', 'v', 'new');
    });
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
});
