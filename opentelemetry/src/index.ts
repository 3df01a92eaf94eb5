import type {
  Attributes,
  Context,
  Counter,
  Histogram,
  Meter,
  MeterProvider,
  Span,
  Tracer,
  TracerProvider,
} from '@opentelemetry/api';
import type {
  CommitStepName,
  PercolatorEvent,
  PercolatorEventListener,
  TransactionEndEvent,
  TransactionRef,
} from '@percolator/core';

/**
 * OpenTelemetry for @percolator/core: turns the client's events (`onEvent`, see
 * docs/operations.md "Metrics and tracing") into spans and metrics through
 * `@opentelemetry/api`. Without an SDK registered the API's no-op tracer and meter are
 * used, and the events cost next to nothing.
 *
 * ```ts
 * const telemetry = new PercolatorTelemetry();
 * const db = new Percolator({ store, onEvent: telemetry.onEvent });
 * ```
 */

export interface PercolatorTelemetryOptions {
  /** Default: the global tracer provider (`trace.getTracerProvider()`), looked up once. */
  readonly tracerProvider?: TracerProvider;
  /** Default: the global meter provider (`metrics.getMeterProvider()`), looked up once. */
  readonly meterProvider?: MeterProvider;
  /** Spans: default true. */
  readonly tracing?: boolean;
  /** Metrics: default true. */
  readonly metrics?: boolean;
  /** Added to every span and every metric point (a service or deployment name, say). */
  readonly attributes?: Attributes;
}

/**
 * `@opentelemetry/api` is an optional peer dependency: loaded here so that importing this
 * package without it gives a clear error when it is used, not a module resolution failure.
 */
type OpenTelemetryApi = typeof import('@opentelemetry/api');
const api: OpenTelemetryApi | undefined = await import('@opentelemetry/api').catch(() => undefined);

const NAME = '@percolator/opentelemetry';
const VERSION = '0.1.0';

/** Span names of the commit steps. */
const STEP_SPANS: Record<CommitStepName, string> = {
  prewrite: 'percolator.prewrite',
  commitPrimary: 'percolator.commit_primary',
  secondaries: 'percolator.commit_secondaries',
  onePhase: 'percolator.one_phase_commit',
  rollback: 'percolator.rollback',
};

/** Durations in seconds (OpenTelemetry's convention), buckets from 0.1 ms to 10 s. */
const DURATION_BUCKETS = [
  0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
];

/** SpanStatusCode.ERROR (a const enum value of the API). */
const ERROR = 2;

/** Epoch milliseconds of a performance.now() reading (what the events carry). */
const epochMs = (t: number): number => performance.timeOrigin + t;

interface Instruments {
  transactions: Counter;
  retries: Counter;
  resolutions: Counter;
  transactionDuration: Histogram;
  stepDuration: Histogram;
  lockWaitDuration: Histogram;
  tidyDuration: Histogram;
  tidyMoved: Counter;
  tidyMovedBytes: Counter;
  tidyDeleted: Counter;
  observerRuns: Counter;
  observerRunDuration: Histogram;
}

function instruments(meter: Meter): Instruments {
  const seconds = (name: string, description: string) =>
    meter.createHistogram(name, {
      description,
      unit: 's',
      advice: { explicitBucketBoundaries: DURATION_BUCKETS },
    });
  return {
    transactions: meter.createCounter('percolator.transactions', {
      description:
        'Transactions ended, by percolator.outcome (committed, conflict, commitUnknown, snapshotTooOld, ...)',
    }),
    retries: meter.createCounter('percolator.retries', {
      description: 'Attempts of db.transact run again after a retryable failure',
    }),
    resolutions: meter.createCounter('percolator.lock.resolutions', {
      description: 'Locks of other transactions settled, by percolator.outcome (rolledForward, rolledBack)',
    }),
    transactionDuration: seconds('percolator.transaction.duration', 'Transaction duration, begin to end'),
    stepDuration: seconds('percolator.commit.step.duration', 'Commit step duration, by percolator.step'),
    lockWaitDuration: seconds('percolator.lock.wait.duration', 'Time a read waited on a lock'),
    tidyDuration: seconds('percolator.tidy.duration', 'Tidy (GC) pass over one head row'),
    tidyMoved: meter.createCounter('percolator.tidy.versions_moved', {
      description: 'Old values moved to version rows',
    }),
    tidyMovedBytes: meter.createCounter('percolator.tidy.bytes_moved', {
      description: 'Bytes of old values moved to version rows',
      unit: 'By',
    }),
    tidyDeleted: meter.createCounter('percolator.tidy.versions_deleted', {
      description: 'Pruned version rows deleted',
    }),
    observerRuns: meter.createCounter('percolator.observer.runs', {
      description: 'Observer runs, by percolator.observer and percolator.outcome (ran, skipped, failed)',
    }),
    observerRunDuration: seconds('percolator.observer.run.duration', 'Observer run duration'),
  };
}

/** A listener for `new Percolator({ onEvent })` that records OpenTelemetry spans and metrics. */
export class PercolatorTelemetry {
  /** Pass this as `onEvent` (it is bound). */
  readonly onEvent: PercolatorEventListener;
  private readonly api: OpenTelemetryApi;
  private readonly tracer: Tracer | undefined;
  private readonly meter: Instruments | undefined;
  private readonly attributes: Attributes;
  /** The open span of each transaction, and the context its child spans go under. */
  private readonly spans = new WeakMap<TransactionRef, { span: Span; context: Context }>();

  constructor(options: PercolatorTelemetryOptions = {}) {
    if (!api) {
      throw new Error(
        'PercolatorTelemetry needs @opentelemetry/api (an optional peer dependency): npm install @opentelemetry/api',
      );
    }
    this.api = api;
    const { metrics, trace } = api;
    this.attributes = { ...options.attributes };
    if (options.tracing !== false) {
      this.tracer = (options.tracerProvider ?? trace.getTracerProvider()).getTracer(NAME, VERSION);
    }
    if (options.metrics !== false) {
      this.meter = instruments((options.meterProvider ?? metrics.getMeterProvider()).getMeter(NAME, VERSION));
    }
    this.onEvent = (event) => this.record(event);
  }

  private record(e: PercolatorEvent): void {
    switch (e.type) {
      case 'transaction.begin': {
        const tracer = this.tracer;
        if (!tracer) return;
        // Under the caller's active span, if any (db.transact inside a request's span, say).
        const parent = this.api.context.active();
        const span = tracer.startSpan(
          'percolator.transaction',
          {
            startTime: epochMs(e.time),
            attributes: {
              ...this.attributes,
              'percolator.store': e.store,
              'percolator.attempt': e.transaction.attempt,
            },
            links: e.retryOf ? linkTo(this.spans.get(e.retryOf)?.span) : undefined,
          },
          parent,
        );
        this.spans.set(e.transaction, { span, context: this.api.trace.setSpan(parent, span) });
        return;
      }
      case 'transaction.end': {
        this.meter?.transactions.add(1, { ...this.attributes, 'percolator.outcome': e.outcome });
        this.meter?.transactionDuration.record(e.durationMs / 1000, {
          ...this.attributes,
          'percolator.outcome': e.outcome,
        });
        const open = this.spans.get(e.transaction);
        if (!open) return;
        const { span } = open;
        span.setAttributes(endAttributes(e));
        if (e.outcome !== 'committed' && e.outcome !== 'rolledBack') {
          span.setStatus({ code: ERROR, message: e.outcome });
          if (e.error instanceof Error) span.recordException(e.error, epochMs(e.time + e.durationMs));
        }
        span.end(epochMs(e.time + e.durationMs));
        return;
      }
      case 'transaction.retry': {
        this.meter?.retries.add(1, this.attributes);
        return;
      }
      case 'commit.step': {
        this.meter?.stepDuration.record(e.durationMs / 1000, {
          ...this.attributes,
          'percolator.step': e.step,
          'percolator.ok': e.error === undefined,
        });
        this.child(e.transaction, STEP_SPANS[e.step], e.time, e.durationMs, e.error, {
          'percolator.rows': e.rows,
          'percolator.start_ts': e.startTs,
          ...(e.commitTs !== undefined ? { 'percolator.commit_ts': e.commitTs } : {}),
        });
        return;
      }
      case 'lock.wait': {
        this.meter?.lockWaitDuration.record(e.durationMs / 1000, {
          ...this.attributes,
          'percolator.outcome': e.outcome,
        });
        this.child(e.transaction, 'percolator.lock_wait', e.time, e.durationMs, undefined, {
          'percolator.table': e.table,
          'percolator.row': e.row,
          'percolator.lock.start_ts': e.lockStartTs,
          'percolator.outcome': e.outcome,
        });
        return;
      }
      case 'lock.resolve': {
        this.meter?.resolutions.add(1, {
          ...this.attributes,
          'percolator.outcome': e.outcome,
          'percolator.by': e.by,
        });
        this.child(e.transaction, 'percolator.resolve_lock', e.time, e.durationMs, undefined, {
          'percolator.table': e.table,
          'percolator.row': e.row,
          'percolator.lock.start_ts': e.lockStartTs,
          'percolator.outcome': e.outcome,
          'percolator.by': e.by,
          ...(e.commitTs !== undefined ? { 'percolator.lock.commit_ts': e.commitTs } : {}),
        });
        return;
      }
      case 'tidy': {
        const attributes = { ...this.attributes, 'percolator.trigger': e.trigger };
        this.meter?.tidyDuration.record(e.durationMs / 1000, attributes);
        if (e.report && this.meter) {
          if (e.report.moved > 0) this.meter.tidyMoved.add(e.report.moved, attributes);
          if (e.report.movedBytes > 0) this.meter.tidyMovedBytes.add(e.report.movedBytes, attributes);
          if (e.report.deleted > 0) this.meter.tidyDeleted.add(e.report.deleted, attributes);
        }
        this.child(undefined, 'percolator.tidy', e.time, e.durationMs, e.error, {
          'percolator.store': e.store,
          'percolator.table': e.table,
          'percolator.row': e.row,
          'percolator.trigger': e.trigger,
          ...(e.report
            ? {
                'percolator.tidy.moved': e.report.moved,
                'percolator.tidy.moved_bytes': e.report.movedBytes,
                'percolator.tidy.deleted': e.report.deleted,
                'percolator.tidy.settled': e.report.settled,
              }
            : {}),
        });
        return;
      }
      case 'observer.run': {
        const attributes = {
          ...this.attributes,
          'percolator.observer': e.observer,
          'percolator.outcome': e.outcome,
        };
        this.meter?.observerRuns.add(1, attributes);
        this.meter?.observerRunDuration.record(e.durationMs / 1000, attributes);
        this.child(undefined, 'percolator.observer_run', e.time, e.durationMs, e.error, {
          'percolator.observer': e.observer,
          'percolator.table': e.table,
          'percolator.row': e.row,
          'percolator.column': e.column,
          'percolator.outcome': e.outcome,
          ...(e.startTs !== undefined ? { 'percolator.start_ts': e.startTs } : {}),
          ...(e.commitTs !== undefined ? { 'percolator.commit_ts': e.commitTs } : {}),
        });
        return;
      }
    }
  }

  /** A finished span under the transaction's span (or the active context), from its event's timing. */
  private child(
    tx: TransactionRef | undefined,
    name: string,
    time: number,
    durationMs: number,
    error: unknown,
    attributes: Attributes,
  ): void {
    const tracer = this.tracer;
    if (!tracer) return;
    const parent = (tx && this.spans.get(tx)?.context) ?? this.api.context.active();
    const span = tracer.startSpan(
      name,
      { startTime: epochMs(time), attributes: { ...this.attributes, ...attributes } },
      parent,
    );
    if (error !== undefined) {
      span.setStatus({
        code: ERROR,
        message: error instanceof Error ? error.message : String(error),
      });
      if (error instanceof Error) span.recordException(error, epochMs(time + durationMs));
    }
    span.end(epochMs(time + durationMs));
  }
}

function linkTo(span: Span | undefined) {
  return span ? [{ context: span.spanContext(), attributes: { 'percolator.link': 'retry_of' } }] : undefined;
}

function endAttributes(e: TransactionEndEvent): Attributes {
  return {
    'percolator.outcome': e.outcome,
    'percolator.rows': e.rows,
    'percolator.tables': e.tables,
    ...(e.startTs !== undefined ? { 'percolator.start_ts': e.startTs } : {}),
    ...(e.commitTs !== undefined ? { 'percolator.commit_ts': e.commitTs } : {}),
  };
}
