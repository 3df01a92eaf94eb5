import { type CasRequest, type CasResult, MemoryStore, Percolator, type RowRef } from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { fakeClock } from './support.js';

/**
 * Multi-row commits send their first prewrite attempt, and their secondary commits, as one
 * `checkAndSetMany` on stores that batch (and coalesce reads into `readMany`). A batch is
 * many independent CAS: these tests make parts of it lose, and check that the core settles
 * each such row on its own rather than taking the batch's word for it.
 */
class CountingMemoryStore extends MemoryStore {
  readonly batches: { reads: number[]; writes: number[] } = { reads: [], writes: [] };
  override async readMany(refs: readonly RowRef[]) {
    this.batches.reads.push(refs.length);
    return super.readMany(refs);
  }
  override async readStamped(refs: readonly RowRef[], counter: string) {
    this.batches.reads.push(refs.length);
    return super.readStamped(refs, counter);
  }
  override async readPeeked(refs: readonly RowRef[], counter: string) {
    this.batches.reads.push(refs.length);
    return super.readPeeked(refs, counter);
  }
  override async checkAndSetMany(requests: readonly CasRequest[]): Promise<CasResult[]> {
    this.batches.writes.push(requests.length);
    return super.checkAndSetMany(requests);
  }
}

const ROWS = ['a', 'b', 'c', 'd'];

describe('batched commits', () => {
  it('a transaction over many rows reads and prewrites them in one round trip each', async () => {
    const store = new CountingMemoryStore();
    // The two-phase path (a one-step commit of four rows is one call: one-phase.test.ts).
    const db = new Percolator({ store, onePhaseMaxRows: 1 });
    await db.transact(async (tx) => {
      const values = await Promise.all(ROWS.map((r) => tx.getString('t', r, 'v')));
      expect(values).toEqual(ROWS.map(() => undefined));
      for (const r of ROWS) tx.set('t', r, 'v', 'x');
    });
    // One batch read (a peek, with peekedWrites) for the four reads; one batch of four prewrites; one of three secondaries.
    expect(store.batches).toEqual({ reads: [4], writes: [4, 3] });
    expect(await db.transact((tx) => Promise.all(ROWS.map((r) => tx.getString('t', r, 'v'))))).toEqual(
      ROWS.map(() => 'x'),
    );
  });

  it('a secondary whose batched commit loses a race is committed on its own, and its commit record is kept until then', async () => {
    const store = new MemoryStore();
    const clock = fakeClock();
    const gc = { retentionMs: 0, maxVersionsPerCell: 2 };
    const other = new Percolator({ store, clock, gc });
    await other.transact(async (tx) => {
      for (const r of ROWS) tx.set('t', r, 'v', 'old');
    });
    // Right after the commit point, another client writes a different column of secondary
    // 'b': the row's version moves on, so b's part of the secondaries' batch fails.
    const writer = new Percolator({
      store,
      clock,
      gc,
      // The two-phase steps these hooks stop at (a one-step commit has none).
      onePhaseMaxRows: 1,
      hooks: {
        onCommitStep: async (e) => {
          if (e.step === 'afterCommitPrimary') await other.transact(async (tx) => tx.set('t', 'b', 'w', '1'));
        },
      },
    });
    await writer.transact(async (tx) => {
      for (const r of ROWS) tx.set('t', r, 'v', 'new');
    });
    // Hammer the primary ('a', first in key order) so pruning runs on every commit: a commit
    // record released while 'b' were still locked would be pruned, and 'b' rolled back.
    for (let i = 0; i < 20; i++) await other.transact(async (tx) => tx.set('t', 'a', 'v', `a${i}`));
    clock.advance(60_000);
    const reader = new Percolator({ store, clock, lockWaitMs: 50 });
    expect(
      await reader.transact((tx) => Promise.all(['b', 'c', 'd'].map((r) => tx.getString('t', r, 'v')))),
    ).toEqual(['new', 'new', 'new']);
    expect(await reader.transact((tx) => tx.getString('t', 'b', 'w'))).toBe('1');
  });
});
