// Notification latency (write committed -> observer committed, p50/p99) and observer
// throughput on any backend:
//
//   node examples/observer-latency.mjs [--backend memory|postgres|mysql|redis|dynamodb]
//        [--writes 300] [--rate 100] [--backlog 1000] [--workers 2] [--concurrency 4]
//
// The measurement itself is `measureObserverLatency` from @percolator/core (the
// benchmark package can call it directly).
import { measureObserverLatency } from '@percolator/core';
import { argument, openStore } from './backends.mjs';

const backend = argument('backend', 'memory');
const { store, close } = await openStore(backend);
try {
  const report = await measureObserverLatency({
    store,
    writes: Number(argument('writes', '300')),
    writesPerSecond: Number(argument('rate', '100')),
    backlog: Number(argument('backlog', '1000')),
    workers: Number(argument('workers', '2')),
    concurrency: Number(argument('concurrency', '4')),
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
