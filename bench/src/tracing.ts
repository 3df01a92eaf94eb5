import { InvalidArgumentError, type PercolatorEventListener } from '@percolator/core';
import type { TracingKind } from './options.js';

/**
 * `--tracing otel`: the Percolator engine runs a second time per cell with the
 * OpenTelemetry listener (`@percolator/opentelemetry`) on a real SDK: a tracer provider
 * whose spans go through a batch processor to an exporter that drops them, and a meter
 * provider whose reader collects (and drops) every 10 s. What it costs is the library's
 * events, the adapter and the SDK's span and metric recording; what a real exporter costs
 * (serialising, the network) is left out, as it runs off the batch processor's queue. No
 * context manager is registered: an application that uses one pays for it without
 * Percolator too.
 */
export interface Tracing {
  /** One listener per kind asked for, all on the same SDK providers. */
  readonly listeners: readonly { readonly kind: TracingKind; readonly onEvent: PercolatorEventListener }[];
  /** Spans exported so far (proof that spans are made and exported). */
  exported(): number;
  shutdown(): Promise<void>;
}

/** Each kind's listener options (`PercolatorTelemetryOptions`). */
const KIND_OPTIONS = {
  otel: { commitSteps: 'spans' },
  'otel-events': { commitSteps: 'events' },
  'otel-attributes': { commitSteps: 'attributes' },
  'otel-lean': { commitSteps: 'attributes', stepMetrics: false },
  // Lean, with 1 transaction in 100 traced (the rest: metrics only, no SDK span at all).
  'otel-sampled': { commitSteps: 'attributes', stepMetrics: false, traceRatio: 0.01 },
} as const satisfies Record<
  Exclude<TracingKind, 'events'>,
  { commitSteps: 'spans' | 'events' | 'attributes'; stepMetrics?: boolean; traceRatio?: number }
>;

export async function startOtelTracing(kinds: readonly TracingKind[]): Promise<Tracing> {
  const [{ BasicTracerProvider, BatchSpanProcessor }, sdkMetrics, { PercolatorTelemetry }] =
    await Promise.all([
      import('@opentelemetry/sdk-trace-base'),
      import('@opentelemetry/sdk-metrics'),
      import('@percolator/opentelemetry'),
    ]).catch((error: unknown) => {
      throw new InvalidArgumentError(
        `--tracing otel needs @percolator/opentelemetry, @opentelemetry/api, @opentelemetry/sdk-trace-base and @opentelemetry/sdk-metrics installed (${String(error)})`,
      );
    });
  let spans = 0;
  const tracerProvider = new BasicTracerProvider({
    spanProcessors: [
      new BatchSpanProcessor({
        export(batch, done) {
          spans += batch.length;
          done({ code: 0 });
        },
        async shutdown() {},
      }),
    ],
  });
  const meterProvider = new sdkMetrics.MeterProvider({
    readers: [
      new sdkMetrics.PeriodicExportingMetricReader({
        exporter: {
          export(_metrics, done) {
            done({ code: 0 });
          },
          async forceFlush() {},
          async shutdown() {},
        },
        exportIntervalMillis: 10_000,
      }),
    ],
  });
  const listeners = kinds.map((kind) => ({
    kind,
    onEvent:
      kind === 'events'
        ? // The control: the library's events alone, to a listener that does nothing.
          () => {}
        : new PercolatorTelemetry({
            tracerProvider,
            meterProvider,
            ...KIND_OPTIONS[kind],
          }).onEvent,
  }));
  return {
    listeners,
    exported: () => spans,
    async shutdown() {
      await tracerProvider.forceFlush();
      await tracerProvider.shutdown();
      await meterProvider.shutdown();
    },
  };
}
