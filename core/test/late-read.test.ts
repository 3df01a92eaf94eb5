import { MemoryStore, Percolator, type StoredRow } from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { decodeRow } from '../src/codec.js';
import { InstrumentedStore } from './support.js';

/** Holds the reply of the next plain read of one row (the row as it was when read). */
class HeldReadStore extends InstrumentedStore {
  held: { table: string; key: string; release: Promise<void>; started: () => void } | undefined;

  override async read(table: string, key: string): Promise<StoredRow | null> {
    const row = await super.read(table, key);
    const held = this.held;
    if (held && held.table === table && held.key === key) {
      this.held = undefined;
      held.started();
      await held.release;
    }
    return row;
  }
}

describe('a read still in flight when commit() starts', () => {
  it.each([
    ['b', 'a secondary: still rolled forward'],
    ['a', 'the primary: its commit is not taken for rolled back'],
  ])('does not replace what the commit knows of row %s (%s)', async (late) => {
    const store = new HeldReadStore(new MemoryStore());
    let releaseRead!: () => void;
    const release = new Promise<void>((r) => {
      releaseRead = r;
    });
    let landed: Promise<void> | undefined;
    const db = new Percolator({
      store,
      hooks: {
        // After the prewrite (both rows locked), the late read's reply arrives: the row as it
        // was before this transaction's prewrite.
        onCommitStep: async (e) => {
          if (e.step !== 'beforeCommitPrimary' || landed === undefined) return;
          releaseRead();
          await landed;
        },
      },
    });
    await db.transact(async (tx) => {
      tx.set('t', 'a', 'v', '1');
      tx.set('t', 'b', 'v', '1');
    });
    const tx = await db.begin();
    expect(await tx.getString('t', 'a', 'v')).toBe('1');
    expect(await tx.getString('t', 'b', 'v')).toBe('1');
    tx.set('t', 'a', 'v', '2');
    tx.set('t', 'b', 'v', '2');
    const started = new Promise<void>((r) => {
      store.held = { table: 't', key: late, release, started: r };
    });
    // A read the caller does not wait for (a race against a timeout, say), of a column this
    // transaction does not write (a written one is answered from its buffer).
    const lateRead = tx.getString('t', late, 'w');
    await started;
    landed = lateRead.then(
      () => undefined,
      () => undefined,
    );
    await tx.commit();
    expect(await lateRead).toBeUndefined();
    await db.close();
    // Both rows (the primary is a) hold the committed value, not a lock. Before, the late
    // read's stale row made the secondaries' step see nothing to roll forward (row b), or
    // the primary's commit see no lock of ours and fail as rolled back (row a).
    for (const key of ['a', 'b']) {
      const row = await store.inner.read('t', key);
      expect(decodeRow(row!.state).cells.get('v')!.lock).toBeUndefined();
    }
    const reader = new Percolator({ store: store.inner });
    expect(
      await reader.transact(async (t) => [
        await t.getString('t', 'a', 'v'),
        await t.getString('t', 'b', 'v'),
      ]),
    ).toEqual(['2', '2']);
    await reader.close();
  });
});
