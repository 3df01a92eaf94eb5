import { MemoryStore, type Observer, Percolator } from '@percolator/core';
import { afterEach, describe, expect, test } from 'vitest';
import { seededRandom } from '../../examples/document-pipeline-lib.mjs';
import { StartPositions } from '../src/observers/positions.js';

const open: Percolator[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((db) => db.close()));
});

const key = (i: number) => `k/${String(i).padStart(5, '0')}`;

describe('start positions', () => {
  test('with nothing seen, a scan starts at the beginning; tables are kept apart', () => {
    const positions = new StartPositions(4, () => 0);
    expect(positions.pick('docs')).toBeUndefined();
    positions.observe('docs', 'a');
    expect(positions.pick('docs')).toBe('a');
    expect(positions.pick('other')).toBeUndefined();
  });

  test('the injected random picks the start: a sampled key, or (its top slot) the beginning', () => {
    let next = 0;
    const positions = new StartPositions(8, () => next);
    for (const k of ['a', 'b', 'c', 'd']) positions.observe('docs', k);
    // Below capacity every key is kept; slot i of 5 (4 keys + the beginning).
    const picks = [0, 0.2, 0.4, 0.6, 0.8].map((r) => {
      next = r;
      return positions.pick('docs');
    });
    expect(picks).toEqual(['a', 'b', 'c', 'd', undefined]);
  });

  test('starts spread over the whole key space, and repeat exactly with the same random', () => {
    const run = (seed: number) => {
      const random = seededRandom(seed);
      const positions = new StartPositions(128, random);
      // Keys seen in order: a sample keeping only the first (or last) ones would fail below.
      for (let i = 0; i < 10_000; i++) positions.observe('docs', key(i));
      return Array.from({ length: 2_000 }, () => positions.pick('docs'));
    };
    const picks = run(42);
    expect(run(42)).toEqual(picks);
    expect(run(43)).not.toEqual(picks);
    // Every tenth of the key space gets a fair share of the starts (about 10% each).
    const tenths = new Array<number>(10).fill(0);
    let beginning = 0;
    for (const p of picks) {
      if (p === undefined) beginning++;
      else tenths[Math.floor(Number(p.slice(2)) / 1_000)]!++;
    }
    for (const n of tenths) expect(n).toBeGreaterThan(2_000 * 0.04);
    expect(Math.max(...tenths)).toBeLessThan(2_000 * 0.2);
    expect(beginning).toBeGreaterThan(0);
    expect(new Set(picks).size).toBeGreaterThan(64);
  });
});

describe('jump on collision', () => {
  test('workers that run into a row another worker holds jump elsewhere, and no row runs twice at once', async () => {
    const store = new MemoryStore();
    const writer = new Percolator({ store, observedColumns: [{ table: 'docs', column: 'body' }] });
    open.push(writer);
    const ROWS = 30;
    const HELD = key(15);
    for (let i = 0; i < ROWS; i += 10) {
      await writer.transact(async (tx) => {
        for (let j = i; j < i + 10; j++) tx.set('docs', key(j), 'body', `v${j}`);
      });
    }
    const running = new Set<string>();
    let overlaps = 0;
    let entered!: () => void;
    const heldEntered = new Promise<void>((r) => (entered = r));
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const copier = (holder: boolean): Observer => ({
      name: 'copy',
      table: 'docs',
      column: 'body',
      handler: async (tx, { table, row, column }) => {
        if (running.has(row)) overlaps++;
        running.add(row);
        try {
          // The holder sits on one row (keeping its lease) until the others have met it.
          if (holder && row === HELD) {
            entered();
            await gate;
          }
          await new Promise((r) => setTimeout(r, 1));
          tx.set(table, row, 'copy', (await tx.getString(table, row, column)) ?? '');
        } finally {
          running.delete(row);
        }
      },
    });
    const worker = (holder: boolean) => {
      const db = new Percolator({ store });
      open.push(db);
      return db.worker({ observers: [copier(holder)], concurrency: 2, idlePollMs: 10 });
    };
    const holder = worker(true);
    const holderDone = holder.runUntilIdle({ timeoutMs: 30_000 });
    await heldEntered;
    const scanners = [worker(false), worker(false)];
    for (const w of scanners) w.start();
    // Their background loops keep meeting the held row; each meeting is a jump.
    const deadline = Date.now() + 20_000;
    while (scanners.some((w) => w.stats.jumps === 0) && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 5));
    for (const w of scanners) {
      expect(w.stats.jumps).toBeGreaterThan(0);
      expect(w.stats.leaseBusy).toBeGreaterThanOrEqual(w.stats.jumps);
    }
    release();
    await holderDone;
    await Promise.all(scanners.map((w) => w.runUntilIdle({ timeoutMs: 30_000 })));
    await Promise.all(scanners.map((w) => w.stop()));

    expect(overlaps).toBe(0);
    // One committed run per row (no write happened meanwhile), spread over the workers.
    const all = [holder, ...scanners];
    expect(all.reduce((n, w) => n + w.stats.runs, 0)).toBe(ROWS);
    expect(scanners.reduce((n, w) => n + w.stats.runs, 0)).toBeGreaterThan(0);
    const copies = await writer.transact(async (tx) => {
      const out = new Map<string, string | undefined>();
      for (let i = 0; i < ROWS; i++) out.set(key(i), await tx.getString('docs', key(i), 'copy'));
      return out;
    });
    for (let i = 0; i < ROWS; i++) expect(copies.get(key(i))).toBe(`v${i}`);
    expect(await store.scanNotified('docs', { limit: 100 })).toEqual([]);
  });
});
