import { MemoryStore, type Observer, Percolator } from '@percolator/core';
import { afterEach, expect, test } from 'vitest';
// The pipeline the example runs (plain ESM shared with examples/document-pipeline.mjs).
import {
  checkPipeline,
  DOCUMENTS,
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
const slowObservers: Observer[] = (pipelineObservers as Observer[]).map((o) => ({
  ...o,
  handler: async (tx, cell) => {
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
    let dedupeRuns = 0;
    const workers = [0, 1, 2, 3].map(() =>
      client(store).worker({
        observers: slowObservers,
        concurrency: 2,
        idlePollMs: 5,
        onRun: (e) => {
          if (e.observer === 'dedupe') dedupeRuns++;
        },
      }),
    );
    // A backlog first, with no worker running: many changes per document before any run.
    const URLS = 20;
    const backlog = await randomDocumentWrites(writers, { seed: seed + 100, operations: 120, urls: URLS });
    const notifiedBefore = (await store.scanNotified(DOCUMENTS, { limit: 1000 })).length;
    expect(notifiedBefore).toBeLessThanOrEqual(URLS);
    // Then the workers run in the background while more writes happen, and drain what is left.
    for (const w of workers) w.start();
    const concurrent = await randomDocumentWrites(writers, {
      seed,
      operations: 240,
      urls: URLS,
      contents: 5,
      pauseMs: 2,
    });
    expect([backlog, concurrent]).toEqual([120, 240]);
    await Promise.all(workers.map((w) => w.runUntilIdle({ timeoutMs: 30_000 })));
    await Promise.all(workers.map((w) => w.stop()));
    const result = await checkPipeline(writers[0]);
    expect(result.problems).toEqual([]);
    expect(result.groups).toBeGreaterThan(1);
    expect(result.indexEntries).toBeGreaterThan(0);
    for (const table of [DOCUMENTS, 'dups'])
      expect(await store.scanNotified(table, { limit: 10 })).toEqual([]);
    // Message collapsing: the backlog's changes to one document all committed before any
    // run began, so one run covers them all; each later committed run needs a newer write.
    // Hence at most one dedupe run per backlog document plus one per concurrent write,
    // well below one run per write.
    expect(dedupeRuns).toBeGreaterThan(0);
    expect(dedupeRuns).toBeLessThanOrEqual(notifiedBefore + concurrent);
    expect(dedupeRuns).toBeLessThan(backlog + concurrent);
  },
);

test('changes made before any run collapse: exactly one dedupe run per changed document', async () => {
  const store = new MemoryStore();
  const writer = client(store, true);
  const writes = await randomDocumentWrites([writer], { seed: 9, operations: 60, urls: 6 });
  const changed = await store.scanNotified(DOCUMENTS, { limit: 100 });
  expect(changed.length).toBeGreaterThan(1);
  expect(changed.length).toBeLessThanOrEqual(6);
  const runs: string[] = [];
  const workers = [0, 1].map(() =>
    client(store).worker({
      observers: pipelineObservers,
      onRun: (e) => {
        if (e.observer === 'dedupe') runs.push(e.row);
      },
    }),
  );
  await Promise.all(workers.map((w) => w.runUntilIdle({ timeoutMs: 10_000 })));
  // 60 writes, one committed run per document, which saw its newest content.
  expect(runs.sort()).toEqual([...changed].sort());
  expect(runs.length).toBeLessThan(writes);
  expect((await checkPipeline(writer)).problems).toEqual([]);
});

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
