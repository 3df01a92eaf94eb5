// OpenTelemetry for percolator: spans and metrics printed by the console exporters, for a
// transfer that commits, one that conflicts and is retried, and one that waits on a lock.
// Run with `pnpm example:otel` (builds first). In production register your SDK (for example
// @opentelemetry/sdk-node with an OTLP exporter) instead; the listener stays the same.
import { context, metrics, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import {
  AggregationTemporality,
  ConsoleMetricExporter,
  MeterProvider,
  PeriodicExportingMetricReader,
} from '@opentelemetry/sdk-metrics';
import { BasicTracerProvider, ConsoleSpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { MemoryStore, Percolator } from '@percolator/core';
import { PercolatorTelemetry } from '@percolator/opentelemetry';
import { LOCK_TTL_MS, runTransfers } from './opentelemetry-transfers.mjs';

// The SDK: spans to the console as they end, metrics to the console at shutdown. The
// context manager lets spans started inside `db.transact` find the caller's active span.
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
const tracerProvider = new BasicTracerProvider({
  spanProcessors: [new SimpleSpanProcessor(new ConsoleSpanExporter())],
});
trace.setGlobalTracerProvider(tracerProvider);
const meterProvider = new MeterProvider({
  readers: [
    new PeriodicExportingMetricReader({
      exporter: new ConsoleMetricExporter({ temporalitySelector: () => AggregationTemporality.CUMULATIVE }),
      exportIntervalMillis: 60_000,
    }),
  ],
});
metrics.setGlobalMeterProvider(meterProvider);

// The library: one listener per client (or shared by many).
const store = new MemoryStore();
const telemetry = new PercolatorTelemetry({ attributes: { 'deployment.environment.name': 'example' } });
const db = new Percolator({
  store,
  lockTtlMs: LOCK_TTL_MS,
  onEvent: telemetry.onEvent,
  // Two phases for every transfer, so the trace shows each commit step (prewrite, commit
  // point, secondaries) as the test of this example asserts; by default a transfer of two
  // rows on this store is one step, a single percolator.one_phase_commit span.
  onePhaseMaxRows: 1,
});

const { balances } = await runTransfers({ store, db, tracer: trace.getTracer('transfer-example') });
console.log(`balances after three transfers: alice ${balances[0]}, bob ${balances[1]}`);

await db.close();
await store.close();
await tracerProvider.shutdown();
await meterProvider.shutdown(); // prints the metrics
