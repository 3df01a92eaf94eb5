import { InvalidArgumentError, MemoryStore, Percolator, type PercolatorOptions } from '@percolator/core';
import { describe, expect, it } from 'vitest';

/** Node's timers keep at most this many ms; a longer delay fires after 1 ms. */
const MAX_TIMER_MS = 2 ** 31 - 1;

describe('client options: every one checked at construction, the error names it', () => {
  const store = new MemoryStore({ maxStateBytes: 1024 * 1024 });
  const bad: Array<[string, Record<string, unknown>]> = [
    ['lockWaitMs', { lockWaitMs: -5 }],
    ['lockWaitMs', { lockWaitMs: 'abc' }],
    ['lockWaitMs', { lockWaitMs: Number.NaN }],
    ['lockWaitMs', { lockWaitMs: 1.5 }],
    ['lockWaitMs', { lockWaitMs: MAX_TIMER_MS + 1 }],
    ['lockTtlMs', { lockTtlMs: 2 ** 40 }],
    ['lockTtlMs', { lockTtlMs: 1e300 }],
    ['lockTtlMs', { lockTtlMs: MAX_TIMER_MS + 1 }],
    ['clock', { clock: 'x' }],
    ['clock', { clock: 42 }],
    ['clock', { clock: null }],
    ['hooks', { hooks: 5 }],
    ['hooks', { hooks: null }],
    ['hooks.onCommitStep', { hooks: { onCommitStep: 1 } }],
    ['onCommitstep', { hooks: { onCommitstep: () => undefined } }],
    ['gc.retentionMs', { gc: { retentionMs: '5' } }],
    ['gc.retentionMs', { gc: { retentionMs: Number.NaN } }],
    ['gc.retentionMs', { gc: { retentionMs: -1 } }],
    ['gc.retentionMs', { gc: { retentionMs: 1.5 } }],
    ['gc.maxVersionsPerCell', { gc: { maxVersionsPerCell: 0 } }],
    ['gc.maxVersionsPerCell', { gc: { maxVersionsPerCell: 2.5 } }],
    ['gc.inlineHistoryBytes', { gc: { inlineHistoryBytes: -1 } }],
    ['gc.versionBlockBytes', { gc: { versionBlockBytes: 1e12 } }],
    ['gc.versionBlockBytes', { gc: { versionBlockBytes: 1024 * 1024 + 1 } }],
    ['rowCacheBytes', { rowCacheBytes: '8' }],
    ['onePhaseMaxRows', { onePhaseMaxRows: 0 }],
    ['observedColumns', { observedColumns: {} }],
    ['observedColumns', { observedColumns: 'ab' }],
    ['observedColumns[0]', { observedColumns: [null] }],
    ['observedColumns[1]', { observedColumns: [{ table: 't', column: 'c' }, { table: 't' }] }],
    ['observedColumns[0]', { observedColumns: [{ table: 't', colum: 'd' }] }],
    ['observedColumns[0]', { observedColumns: [{ table: 'bad table', column: 'c' }] }],
  ];
  for (const [name, options] of bad) {
    it(`${JSON.stringify(options)}: InvalidArgumentError naming ${name}`, () => {
      let failure: unknown;
      try {
        new Percolator({ store, ...options } as unknown as PercolatorOptions);
      } catch (error) {
        failure = error;
      }
      expect(failure).toBeInstanceOf(InvalidArgumentError);
      expect((failure as Error).message).toContain(name);
    });
  }

  it('the bounds themselves, and the documented special values, are accepted', async () => {
    const good: Partial<PercolatorOptions>[] = [
      { lockTtlMs: MAX_TIMER_MS }, // its default lockWaitMs (2 x lockTtlMs) is capped at the timers' range
      { lockWaitMs: 0 },
      { lockWaitMs: MAX_TIMER_MS },
      { gc: { retentionMs: Number.POSITIVE_INFINITY, maxVersionsPerCell: Number.MAX_SAFE_INTEGER } },
      { gc: { versionBlockBytes: 0, inlineHistoryBytes: 0 } },
      { gc: { versionBlockBytes: 1024 * 1024 } },
      { clock: () => Date.now(), hooks: {} },
      { hooks: { onCommitStep: () => undefined }, observedColumns: [] },
    ];
    for (const options of good) {
      const db = new Percolator({ store, ...options });
      await db.transact(async (tx) => tx.set('t', 'r', 'c', 'v'));
      await db.close();
    }
  });
});
