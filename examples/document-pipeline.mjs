// The paper's document pipeline, run by observer workers on any backend:
//
//   node examples/document-pipeline.mjs [--backend memory|postgres|mysql|redis|
//        redis-cluster|dynamodb] [--url URL] [--workers 3] [--writes 300] [--seed 1]
//
// The store is opened by @percolator/connect (its README lists each backend's URL and
// environment variable), in a fresh namespace dropped at the end.
// (`pnpm pipeline` builds first and runs it on the in-memory store; `pnpm pipeline --
// --backend redis` on another.) Writers insert,
// update and delete documents while several workers (each its own client, as separate
// processes would be) run two observers: `dedupe` (content hash -> duplicate groups and
// their canonical URL) and `index` (words -> canonical URL), the second triggered by the
// first. Once the workers are idle, the derived tables are checked against the documents.

import { parseArgs } from 'node:util';
import { freshNamespace, openStore } from '@percolator/connect';
import { Percolator } from '@percolator/core';
import {
  checkPipeline,
  DOCUMENTS,
  OBSERVED_COLUMNS,
  pipelineObservers,
  randomDocumentWrites,
} from './document-pipeline-lib.mjs';

// --backend and --url as @percolator/connect takes them (default: the backend's variable).
const { values: args } = parseArgs({
  args: process.argv.slice(2).filter((a) => a !== '--'),
  options: {
    backend: { type: 'string', default: 'memory' },
    url: { type: 'string' },
    workers: { type: 'string', default: '3' },
    writes: { type: 'string', default: '300' },
    seed: { type: 'string', default: '1' },
  },
});
const workerCount = Number(args.workers);
const operations = Number(args.writes);
const seed = Number(args.seed);

// A fresh namespace, dropped at the end.
const opened = await openStore(args.backend, { url: args.url, namespace: freshNamespace('ex') });
const { store } = opened;
const close = async () => {
  try {
    await opened.dropNamespace();
  } finally {
    await opened.close();
  }
};
// Every client that writes an observed column must know it: writers list the columns,
// and db.worker() registers its observers' columns on the client it runs on.
const writers = [0, 1].map(() => new Percolator({ store, observedColumns: OBSERVED_COLUMNS }));
const workerClients = Array.from({ length: workerCount }, () => new Percolator({ store }));
const workers = workerClients.map((db) =>
  db.worker({ observers: pipelineObservers, concurrency: 2, idlePollMs: 50 }),
);

let exitCode = 0;
try {
  const started = performance.now();
  for (const w of workers) w.start();
  const committed = await randomDocumentWrites(writers, { seed, operations });
  const wrote = performance.now();
  await Promise.all(workers.map((w) => w.runUntilIdle({ timeoutMs: 120_000 })));
  const idle = performance.now();
  await Promise.all(workers.map((w) => w.stop()));

  const result = await checkPipeline(writers[0]);
  const total = (key) => workers.reduce((sum, w) => sum + w.stats[key], 0);
  console.log(`backend: ${store.name}; ${committed} document writes to "${DOCUMENTS}" by 2 writers`);
  console.log(
    `workers: ${workerCount}; observer runs ${total('runs')} (skipped ${total('skipped')}, ` +
      `ack/write conflicts retried ${total('conflicts')}, runs given up for now and retried later ${total('failures')}), ` +
      `notifications cleared ${total('cleared')}, rows leased by another worker ${total('leaseBusy')}`,
  );
  console.log(
    `runs per worker: ${workers.map((w) => w.stats.runs).join(', ')}; ` +
      `writes took ${Math.round(wrote - started)} ms, idle ${Math.round(idle - wrote)} ms later`,
  );
  console.log(
    `result: ${result.documents} documents, ${result.groups} duplicate groups, ${result.indexEntries} index entries`,
  );
  if (result.problems.length === 0) console.log('invariants: OK');
  else {
    console.log(`invariants: BROKEN (${result.problems.length})`);
    for (const p of result.problems.slice(0, 20)) console.log(`  ${p}`);
    exitCode = 1;
  }
} finally {
  await Promise.all([...writers, ...workerClients].map((db) => db.close()));
  await close();
}
process.exit(exitCode);
