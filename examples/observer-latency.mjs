// Notification latency (write committed -> observer committed, p50/p99) and observer
// throughput on any backend:
//
//   node examples/observer-latency.mjs [--backend memory|postgres|mysql|redis|redis-cluster|dynamodb]
//        [--url URL] [--writes 300] [--rate 100] [--backlog 1000] [--workers 2] [--concurrency 4]
//
// The measurement itself is `measureObserverLatency` from @percolator/bench. The store is
// opened by @percolator/connect (its README lists each backend's URL and variable; for
// dynamodb give a DynamoDB Local endpoint, e.g. from testkit's startDynamoDbLocal).

import { parseArgs } from 'node:util';
import { measureObserverLatency } from '@percolator/bench';
import { freshNamespace, openStore } from '@percolator/connect';

// --backend and --url as @percolator/connect takes them (default: the backend's variable).
const { values: args } = parseArgs({
  args: process.argv.slice(2).filter((a) => a !== '--'),
  options: {
    backend: { type: 'string', default: 'memory' },
    url: { type: 'string' },
    writes: { type: 'string', default: '300' },
    rate: { type: 'string', default: '100' },
    backlog: { type: 'string', default: '1000' },
    workers: { type: 'string', default: '2' },
    concurrency: { type: 'string', default: '4' },
  },
});
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
try {
  const report = await measureObserverLatency({
    store,
    writes: Number(args.writes),
    writesPerSecond: Number(args.rate),
    backlog: Number(args.backlog),
    workers: Number(args.workers),
    concurrency: Number(args.concurrency),
  });
  const { latency, throughput } = report;
  console.log(`backend: ${report.store}`);
  console.log(
    `notification latency over ${latency.samples} writes: p50 ${latency.p50} ms, p99 ${latency.p99} ms, ` +
      `max ${latency.max} ms, mean ${latency.mean} ms`,
  );
  console.log(
    `observer throughput: ${throughput.runs} runs in ${throughput.ms} ms = ${throughput.runsPerSecond} runs/s`,
  );
} finally {
  await close();
}
