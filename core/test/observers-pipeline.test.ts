import { MemoryStore, Percolator } from '@percolator/core';
import { afterEach, expect, test } from 'vitest';
// The pipeline the example runs (plain ESM shared with examples/document-pipeline.mjs).
import {
  checkPipeline,
  OBSERVED_COLUMNS,
  pipelineObservers,
  randomDocumentWrites,
} from '../../examples/document-pipeline-lib.mjs';

const open: Percolator[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((db) => db.close()));
});

/**
 * The pipeline's observers with a short pause inside each handler, so runs overlap the
 * writes: a notification lost in the window between reading it and clearing it would
 * leave a document unprocessed.
 */
const slowObservers = pipelineObservers.map((o) => ({
  ...o,
  handler: async (tx: Parameters<typeof o.handler>[0], cell: Parameters<typeof o.handler>[1]) => {
    await o.handler(tx, cell);
    await new Promise((r) => setTimeout(r, 1));
  },
}));

function client(store: MemoryStore, observed = false) {
  const db = new Percolator({ store, ...(observed ? { observedColumns: OBSERVED_COLUMNS } : {}) });
  open.push(db);
  return db;
}

test.each([1, 2, 3])(
  'document pipeline (seed %i): random inserts, updates and deletes with several workers keep every invariant',
  async (seed) => {
    const store = new MemoryStore();
    const writers = [client(store, true), client(store, true), client(store, true)];
    const workers = [0, 1, 2, 3].map(() =>
      client(store).worker({ observers: slowObservers, concurrency: 2, idlePollMs: 5 }),
    );
    // The workers run in the background while the writes happen, then drain what is left.
    for (const w of workers) w.start();
    const committed = await randomDocumentWrites(writers, {
      seed,
      operations: 240,
      urls: 20,
      contents: 5,
      pauseMs: 2,
    });
    expect(committed).toBe(240);
    await Promise.all(workers.map((w) => w.runUntilIdle({ timeoutMs: 30_000 })));
    await Promise.all(workers.map((w) => w.stop()));
    const result = await checkPipeline(writers[0]);
    expect(result.problems).toEqual([]);
    expect(result.groups).toBeGreaterThan(1);
    expect(result.indexEntries).toBeGreaterThan(0);
    for (const table of ['documents', 'dups'])
      expect(await store.scanNotified(table, { limit: 10 })).toEqual([]);
    const runs = workers.reduce((n, w) => n + w.stats.runs, 0);
    // Message collapsing: fewer dedupe+index runs than writes would need one by one.
    expect(runs).toBeGreaterThan(0);
  },
);

test('the invariant checker notices a broken pipeline', async () => {
  const store = new MemoryStore();
  const writer = client(store, true);
  const worker = client(store).worker({ observers: pipelineObservers });
  await randomDocumentWrites([writer], { seed: 7, operations: 30, urls: 6, contents: 3 });
  // No worker ran yet: hashes, groups and the index are all missing.
  expect((await checkPipeline(writer)).problems.length).toBeGreaterThan(0);
  await worker.runUntilIdle({ timeoutMs: 10_000 });
  expect((await checkPipeline(writer)).problems).toEqual([]);
  // Corrupt one derived cell: the checker must see it.
  await writer.transact(async (tx) => {
    for await (const r of tx.scan('word_index', { limit: 1 })) {
      tx.set('word_index', r.row, [...r.columns.keys()][0]!, 'https://example.com/bogus');
    }
  });
  expect((await checkPipeline(writer)).problems.length).toBe(1);
});
