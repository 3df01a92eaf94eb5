import type {
  Attributes,
  Context,
  Histogram,
  Meter,
  MeterProvider,
  Span,
  Tracer,
  TracerProvider,
} from '@opentelemetry/api';
import type {
  CommitStepEndEvent,
  CommitStepName,
  ObserverRunRef,
  PercolatorEvent,
  PercolatorEventListener,
  TransactionEndEvent,
  TransactionRef,
} from '@percolator/core';
import { InvalidArgumentError } from '@percolator/core';

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
  /**
   * How a commit step shows in a trace (default `'spans'`):
   * - `'spans'`: a child span of the transaction per step (prewrite, commit point, ...), a
   *   waterfall in a trace view;
   * - `'events'`: a span event on the transaction's span per step, named like the span
   *   (with `percolator.duration_ms`, `percolator.rows`, `percolator.commit_ts`); the
   *   secondaries, which finish after the transaction's span has ended, stay a child span;
   * - `'attributes'`: the leanest: one span per transaction, each step before its end an
   *   attribute of it (`percolator.prewrite.duration_ms`, ..., and
   *   `percolator.<step>.error` with the error's name if the step failed). The secondaries
   *   get a child span only if they fail (their duration is in the step histogram).
   * Lock waits and lock resolutions are child spans either way. What each costs:
   * docs/operations.md, "What tracing costs".
   */
  readonly commitSteps?: 'spans' | 'events' | 'attributes';
  /**
   * Whether each commit step's duration goes to the `percolator.commit.step.duration`
   * histogram (default true). The SDK hashes the attributes of every measurement: a two-row
   * transaction's steps are three measurements besides its own duration.
   */
  readonly stepMetrics?: boolean;
  /**
   * Whether every tidy pass (the background step that moves old values out of head rows
   * and deletes pruned version rows) is a span (default false: only a pass that fails is).
   * A busy client runs a pass every few commits, each a trace of its own with no parent;
   * the tidy metrics (`percolator.tidy.*`) count them all either way. `db.gc` runs are
   * always spans.
   */
  readonly tidySpans?: boolean;
  /**
   * The share of transactions begun outside any span that get a span (default 1: all of
   * them go to the SDK, whose sampler decides). Drawn here, per transaction, before the SDK
   * is called: a transaction left out costs its metrics and nothing else, where even a span
   * the SDK's sampler drops costs two random IDs and a sampling call. A transaction begun
   * under an active span (a request's, say) always goes to the SDK, whose sampler follows
   * that parent; a retry follows the attempt it retries. Observer runs and (with
   * `tidySpans`) tidy passes that went well, root work too, are drawn the same way. The
   * SDK's sampler still decides for the transactions drawn, so the share traced is this
   * times the SDK's own ratio. What it saves: docs/operations.md, "What tracing costs".
   */
  readonly traceRatio?: number;
  /** For tests: the draw for `traceRatio`, a number in [0, 1) (default `Math.random`). */
  readonly random?: () => number;
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

/** With commitSteps 'attributes': the transaction span's attribute keys per step. */
const STEP_KEYS = Object.fromEntries(
  Object.entries(STEP_SPANS).map(([step, span]) => [
    step,
    { duration: `${span}.duration_ms`, error: `${span}.error` },
  ]),
) as Record<CommitStepName, { duration: string; error: string }>;

/** Durations in seconds (OpenTelemetry's convention), buckets from 0.1 ms to 10 s. */
const DURATION_BUCKETS = [
  0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
];

/** SpanStatusCode.ERROR (a const enum value of the API). */
const ERROR = 2;

/** Epoch milliseconds of a performance.now() reading (what the events carry). */
const TIME_ORIGIN = performance.timeOrigin;
const epochMs = (t: number): number => TIME_ORIGIN + t;

interface Histograms {
  transactionDuration: Histogram;
  stepDuration: Histogram;
  lockWaitDuration: Histogram;
  tidyDuration: Histogram;
  observerRunDuration: Histogram;
}

function histograms(meter: Meter): Histograms {
  const seconds = (name: string, description: string) =>
    meter.createHistogram(name, {
      description,
      unit: 's',
      advice: { explicitBucketBoundaries: DURATION_BUCKETS },
    });
  return {
    transactionDuration: seconds(
      'percolator.transaction.duration',
      'Transaction duration, begin to end, by percolator.outcome',
    ),
    stepDuration: seconds('percolator.commit.step.duration', 'Commit step duration, by percolator.step'),
    lockWaitDuration: seconds('percolator.lock.wait.duration', 'Time a read waited on a lock'),
    tidyDuration: seconds(
      'percolator.tidy.duration',
      'Tidy (GC) pass over one head row; the rows of one background batch each get the whole batch time',
    ),
    observerRunDuration: seconds('percolator.observer.run.duration', 'Observer run duration'),
  };
}

/** Histogram measurements handed to the SDK at most this many at a time (see `Durations`). */
const BATCH = 256;

/**
 * The histograms' measurements, kept here and handed to the SDK in batches: when BATCH
 * are waiting, and whenever the SDK collects. The observable counters' callbacks flush
 * first, and the SDK runs a meter's callbacks before it reads its synchronous instruments,
 * so every collection has every measurement made before it. Why: the SDK's work per
 * measurement (it hashes the attribute set, then finds the bucket) cost about twice as much
 * spread between transactions as back to back, in the profile of a busy client
 * (docs/operations.md, "What tracing costs"). They are recorded in the root context, so no
 * exemplar or context-derived attribute comes from whatever span is active at the flush.
 */
class Durations {
  private readonly histograms: Histogram[] = [];
  private readonly values: number[] = [];
  private readonly attributes: Attributes[] = [];

  constructor(private readonly root: Context) {}

  /** A duration in milliseconds, recorded in seconds (OpenTelemetry's convention). */
  record(histogram: Histogram, ms: number, attributes: Attributes): void {
    this.histograms.push(histogram);
    this.values.push(ms / 1000);
    this.attributes.push(attributes);
    if (this.values.length >= BATCH) this.flush();
  }

  flush(): void {
    const { histograms, values, attributes } = this;
    for (let i = 0; i < values.length; i++) histograms[i]!.record(values[i]!, attributes[i], this.root);
    histograms.length = 0;
    values.length = 0;
    attributes.length = 0;
  }
}

/** The counters: name -> description (and unit). */
const COUNTERS = {
  'percolator.transactions':
    'Transactions ended, by percolator.outcome (committed, conflict, commitUnknown, snapshotTooOld, ...)',
  'percolator.retries': 'Attempts of db.transact run again after a retryable failure',
  'percolator.commit.fences':
    'Rows fenced after a lost reply of a one-step commit (docs/protocol.md 4.11), by percolator.outcome (fenced, refused, failed)',
  'percolator.lock.resolutions':
    'Locks of other transactions settled, by percolator.outcome (rolledForward, rolledBack) and percolator.by',
  'percolator.tidy.versions_moved': 'Old values moved to version rows',
  'percolator.tidy.bytes_moved': 'Bytes of old values moved to version rows',
  'percolator.tidy.versions_deleted': 'Pruned version rows deleted',
  'percolator.observer.runs':
    'Observer runs, by percolator.observer and percolator.outcome (ran, skipped, failed)',
} as const;
type CounterName = keyof typeof COUNTERS;

/**
 * Counters kept here as plain numbers and reported through observable counters when the
 * SDK collects: an event costs an increment, not an SDK call (the SDK hashes the
 * attributes of every synchronous measurement).
 */
class Counts {
  private readonly series = new Map<CounterName, Map<string, { attributes: Attributes; value: number }>>();

  /** `beforeCollect`: runs first in every callback (the histograms' flush). */
  constructor(meter: Meter, beforeCollect: () => void) {
    for (const [name, description] of Object.entries(COUNTERS) as [CounterName, string][]) {
      const values = new Map<string, { attributes: Attributes; value: number }>();
      this.series.set(name, values);
      const counter = meter.createObservableCounter(name, {
        description,
        ...(name === 'percolator.tidy.bytes_moved' ? { unit: 'By' } : {}),
      });
      counter.addCallback((result) => {
        beforeCollect();
        for (const { attributes, value } of values.values()) result.observe(value, attributes);
      });
    }
  }

  add(name: CounterName, key: string, attributes: Attributes, n = 1): void {
    this.entry(name, key, attributes).value += n;
  }

  /** The series of one counter and key, to add to directly (the hot path: transactions by outcome). */
  entry(name: CounterName, key: string, attributes: Attributes): { attributes: Attributes; value: number } {
    const values = this.series.get(name)!;
    let entry = values.get(key);
    if (!entry) values.set(key, (entry = { attributes, value: 0 }));
    return entry;
  }
}

/** A listener for `new Percolator({ onEvent })` that records OpenTelemetry spans and metrics. */
export class PercolatorTelemetry {
  /** Pass this as `onEvent` (it is bound). */
  readonly onEvent: PercolatorEventListener;
  private readonly api: OpenTelemetryApi;
  private readonly tracer: Tracer | undefined;
  private readonly histograms: Histograms | undefined;
  private readonly durations: Durations | undefined;
  private readonly counts: Counts | undefined;
  private readonly attributes: Attributes;
  private readonly hasAttributes: boolean;
  private readonly commitSteps: 'spans' | 'events' | 'attributes';
  private readonly stepMetrics: boolean;
  private readonly tidySpans: boolean;
  private readonly traceRatio: number;
  private readonly random: () => number;
  /** The state of a transaction `traceRatio` left out (one per listener: see `stateOf`). */
  private readonly untraced = new Untraced(this);
  /**
   * Metric attribute sets, built once per distinct value (the options' attributes included):
   * one key's sets by key, then value (plain lookups, no string built per event); sets of
   * two keys, on rarer events, by a joined string.
   */
  private readonly attributeSets = new Map<string, Map<string, Attributes>>();
  private readonly pairSets = new Map<string, Attributes>();
  /** Per outcome, the ended transactions' counter series (its attributes: the histogram's too). */
  private readonly ends = new Map<string, { attributes: Attributes; value: number }>();
  /**
   * Transactions whose `listenerState` another listener holds (two telemetries on one
   * client, say): their spans are kept here instead. Made only when needed.
   */
  private others: WeakMap<Ref, OpenSpan | Untraced> | undefined;

  constructor(options: PercolatorTelemetryOptions = {}) {
    if (!api) {
      throw new Error(
        'PercolatorTelemetry needs @opentelemetry/api (an optional peer dependency): npm install @opentelemetry/api',
      );
    }
    this.api = api;
    const { metrics, trace } = api;
    this.attributes = { ...options.attributes };
    this.hasAttributes = Object.keys(this.attributes).length > 0;
    const commitSteps = options.commitSteps ?? 'spans';
    if (!['spans', 'events', 'attributes'].includes(commitSteps)) {
      throw new InvalidArgumentError(
        `commitSteps must be 'spans', 'events' or 'attributes', got ${JSON.stringify(commitSteps)}`,
      );
    }
    this.commitSteps = commitSteps;
    this.stepMetrics = options.stepMetrics !== false;
    this.tidySpans = options.tidySpans === true;
    const ratio = options.traceRatio ?? 1;
    if (typeof ratio !== 'number' || !(ratio >= 0 && ratio <= 1)) {
      throw new InvalidArgumentError(`traceRatio must be a number from 0 to 1, got ${String(ratio)}`);
    }
    this.traceRatio = ratio;
    if (options.random !== undefined && typeof options.random !== 'function') {
      throw new InvalidArgumentError('random must be a function that returns a number in [0, 1)');
    }
    this.random = options.random ?? Math.random;
    if (options.tracing !== false) {
      this.tracer = (options.tracerProvider ?? trace.getTracerProvider()).getTracer(NAME, VERSION);
    }
    if (options.metrics !== false) {
      const meter = (options.meterProvider ?? metrics.getMeterProvider()).getMeter(NAME, VERSION);
      this.histograms = histograms(meter);
      const durations = new Durations(api.ROOT_CONTEXT);
      this.durations = durations;
      this.counts = new Counts(meter, () => durations.flush());
    }
    this.onEvent = (event) => this.record(event);
  }

  /** The metric attributes `{ ...options.attributes, [k1]: v1, [k2]: v2 }`, built once. */
  private attrs(k1: string, v1: string, k2?: string, v2?: string): Attributes {
    if (k2 === undefined) {
      let byValue = this.attributeSets.get(k1);
      if (!byValue) this.attributeSets.set(k1, (byValue = new Map()));
      let set = byValue.get(v1);
      if (!set) byValue.set(v1, (set = { ...this.attributes, [k1]: v1 }));
      return set;
    }
    const key = `${k1}=${v1}\u0000${k2}=${v2}`;
    let set = this.pairSets.get(key);
    if (!set) this.pairSets.set(key, (set = { ...this.attributes, [k1]: v1, [k2]: v2 }));
    return set;
  }

  private record(e: PercolatorEvent): void {
    switch (e.type) {
      case 'transaction.begin': {
        const tracer = this.tracer;
        if (!tracer) return;
        // An observer run's transaction goes under the run's span, and is traced exactly
        // when the run is (no draw of its own).
        const run = e.observerRun ? this.stateOf(e.observerRun) : undefined;
        // Else under the caller's active span, if any (db.transact inside a request's span, say).
        const parent = run instanceof OpenSpan ? this.contextOf(run) : this.api.context.active();
        // A root transaction not drawn costs no SDK call at all (nor do its lock waits). A
        // retry follows the attempt it retries, so a traced attempt's retry is traced and
        // linked to it.
        const decided = run ?? (e.retryOf ? this.stateOf(e.retryOf) : undefined);
        // An attempt the SDK's sampler dropped (its span not recording): its retry is not
        // traced either, so no trace holds a retry whose first attempt is missing. (One the
        // SDK kept still goes to the SDK, whose sampler decides it anew, found in review:
        // `traceRatio` is what keeps a transaction's attempts together.)
        if (
          decided instanceof Untraced ||
          (decided instanceof OpenSpan && !decided.recording) ||
          (decided === undefined && !this.drawn(parent))
        ) {
          this.keep(e.transaction, this.untraced);
          return;
        }
        const span = tracer.startSpan(
          'percolator.transaction',
          {
            startTime: epochMs(e.time),
            attributes: { 'percolator.store': e.store, 'percolator.attempt': e.transaction.attempt },
            links: e.retryOf ? linkTo(this.openOf(e.retryOf)?.span) : undefined,
          },
          parent,
        );
        if (this.hasAttributes) span.setAttributes(this.attributes);
        this.keep(e.transaction, new OpenSpan(this, span, parent));
        return;
      }
      case 'transaction.end': {
        if (this.histograms) {
          let ends = this.ends.get(e.outcome);
          if (!ends) {
            const attributes = this.attrs('percolator.outcome', e.outcome);
            ends = this.counts!.entry('percolator.transactions', e.outcome, attributes);
            this.ends.set(e.outcome, ends);
          }
          ends.value++;
          this.durations!.record(this.histograms.transactionDuration, e.durationMs, ends.attributes);
        }
        const open = this.openOf(e.transaction);
        if (!open) return;
        const { span } = open;
        open.ended = true;
        span.setAttributes(endAttributes(e));
        if (e.outcome !== 'committed' && e.outcome !== 'rolledBack') {
          span.setStatus({ code: ERROR, message: e.outcome });
          recordError(span, e.error, e.time + e.durationMs, EXPECTED_OUTCOMES.has(e.outcome));
        }
        span.end(epochMs(e.time + e.durationMs));
        return;
      }
      case 'transaction.retry': {
        this.counts?.add('percolator.retries', '', this.attributes);
        return;
      }
      case 'commit.step': {
        if (this.stepMetrics && this.histograms)
          this.durations!.record(
            this.histograms.stepDuration,
            e.durationMs,
            this.attrs('percolator.step', e.step),
          );
        if (this.commitSteps !== 'spans' && this.tracer) {
          const open = this.openOf(e.transaction);
          if (open && !open.ended) {
            if (open.recording) {
              if (this.commitSteps === 'events')
                open.span.addEvent(STEP_SPANS[e.step], stepEventAttributes(e), epochMs(e.time));
              else setStepAttributes(open.span, e);
            }
            return;
          }
          // Attributes: after the transaction's end (the secondaries), only a failure shows.
          if (this.commitSteps === 'attributes' && e.error === undefined) return;
        }
        const parent = this.parentOf(e.transaction);
        if (!parent) return;
        const span = this.child(parent, STEP_SPANS[e.step], e.time, e.durationMs, e.error);
        span.setAttribute('percolator.rows', e.rows);
        if (e.commitTs !== undefined) span.setAttribute('percolator.commit_ts', e.commitTs);
        span.end(epochMs(e.time + e.durationMs));
        return;
      }
      case 'lock.wait': {
        if (this.histograms)
          this.durations!.record(
            this.histograms.lockWaitDuration,
            e.durationMs,
            this.attrs('percolator.outcome', e.outcome),
          );
        this.eventSpan(e, 'percolator.lock_wait', () => ({
          'percolator.table': e.table,
          'percolator.row': e.row,
          'percolator.lock.start_ts': e.lockStartTs,
          'percolator.outcome': e.outcome,
        }));
        return;
      }
      case 'commit.fence': {
        this.counts?.add('percolator.commit.fences', e.outcome, this.attrs('percolator.outcome', e.outcome));
        this.eventSpan(e, 'percolator.fence', () => ({
          'percolator.table': e.table,
          'percolator.row': e.row,
          'percolator.outcome': e.outcome,
        }));
        return;
      }
      case 'lock.resolve': {
        this.counts?.add(
          'percolator.lock.resolutions',
          `${e.outcome}/${e.by}`,
          this.attrs('percolator.outcome', e.outcome, 'percolator.by', e.by),
        );
        this.eventSpan(e, 'percolator.resolve_lock', () => ({
          'percolator.table': e.table,
          'percolator.row': e.row,
          'percolator.lock.start_ts': e.lockStartTs,
          'percolator.outcome': e.outcome,
          'percolator.by': e.by,
          ...(e.commitTs !== undefined ? { 'percolator.lock.commit_ts': e.commitTs } : {}),
        }));
        return;
      }
      case 'tidy':
      case 'gc': {
        if (e.type === 'tidy' && this.histograms) {
          const attributes = this.attrs('percolator.trigger', e.trigger);
          this.durations!.record(this.histograms.tidyDuration, e.durationMs, attributes);
          if (e.report) {
            const counts = this.counts!;
            if (e.report.moved > 0)
              counts.add('percolator.tidy.versions_moved', e.trigger, attributes, e.report.moved);
            if (e.report.movedBytes > 0)
              counts.add('percolator.tidy.bytes_moved', e.trigger, attributes, e.report.movedBytes);
            if (e.report.deleted > 0)
              counts.add('percolator.tidy.versions_deleted', e.trigger, attributes, e.report.deleted);
          }
        }
        if (e.type === 'tidy' && !this.tidySpans && e.error === undefined) return;
        // A tidy pass serves every commit queued, no one caller: a trace of its own, even
        // when it runs (a pressure pass) inside a caller's span. A gc run is the caller's.
        const parent = e.type === 'tidy' ? this.rootParent() : this.parentOf(undefined);
        if (!parent) return;
        // With tidySpans, a pass that went well is root work: drawn like a transaction.
        if (e.type === 'tidy' && e.error === undefined && !this.drawn(parent)) return;
        const span = this.child(parent, `percolator.${e.type}`, e.time, e.durationMs, e.error);
        span.setAttributes({
          'percolator.store': e.store,
          'percolator.table': e.table,
          ...(e.row !== undefined ? { 'percolator.row': e.row } : {}),
          ...(e.type === 'tidy' ? { 'percolator.trigger': e.trigger } : { 'percolator.dry_run': e.dryRun }),
          ...reportAttributes(e.report),
        });
        span.end(epochMs(e.time + e.durationMs));
        return;
      }
      case 'observer.begin': {
        // The run's span opens now, so the transactions it makes go under it.
        const parent = this.parentOf(undefined);
        if (!parent) return;
        // An observer run is root work too: drawn like a transaction begun outside any span.
        if (!this.drawn(parent)) {
          this.keep(e.run, this.untraced);
          return;
        }
        const span = this.tracer!.startSpan(
          'percolator.observer_run',
          {
            startTime: epochMs(e.time),
            attributes: {
              'percolator.store': e.store,
              'percolator.observer': e.observer,
              'percolator.table': e.table,
              'percolator.row': e.row,
              'percolator.column': e.column,
            },
          },
          parent,
        );
        if (this.hasAttributes) span.setAttributes(this.attributes);
        this.keep(e.run, new OpenSpan(this, span, parent));
        return;
      }
      case 'observer.run': {
        if (this.histograms) {
          const attributes = this.attrs('percolator.observer', e.observer, 'percolator.outcome', e.outcome);
          this.counts!.add('percolator.observer.runs', `${e.observer}/${e.outcome}`, attributes);
          this.durations!.record(this.histograms.observerRunDuration, e.durationMs, attributes);
        }
        const open = this.stateOf(e.run);
        if (!(open instanceof OpenSpan)) return;
        const { span } = open;
        open.ended = true;
        span.setAttributes({
          'percolator.outcome': e.outcome,
          ...(e.startTs !== undefined ? { 'percolator.start_ts': e.startTs } : {}),
          ...(e.commitTs !== undefined ? { 'percolator.commit_ts': e.commitTs } : {}),
        });
        if (e.error !== undefined) markFailed(span, e.error, e.time + e.durationMs);
        span.end(epochMs(e.time + e.durationMs));
        return;
      }
    }
  }

  /**
   * Whether root work (a transaction, an observer run) begun in `parent` gets a span: always
   * under an active span (the SDK's sampler follows it), else with probability `traceRatio`.
   */
  private drawn(parent: Context): boolean {
    return (
      this.traceRatio >= 1 || this.api.trace.getSpan(parent) !== undefined || this.random() < this.traceRatio
    );
  }

  /** Keeps a transaction's state in its ref, or here if another listener holds the ref's slot. */
  private keep(tx: Ref, state: OpenSpan | Untraced): void {
    if (tx.listenerState === undefined) tx.listenerState = state;
    else (this.others ??= new WeakMap()).set(tx, state);
  }

  /** What this listener keeps of a transaction it saw begin: its open span, or that it is untraced. */
  private stateOf(tx: Ref): OpenSpan | Untraced | undefined {
    const state = tx.listenerState;
    if ((state instanceof OpenSpan || state instanceof Untraced) && state.owner === this) return state;
    return this.others?.get(tx);
  }

  /** The open span of a transaction this listener began, if any. */
  private openOf(tx: TransactionRef): OpenSpan | undefined {
    const state = this.stateOf(tx);
    return state instanceof OpenSpan ? state : undefined;
  }

  /**
   * Where a child span goes: under its transaction's span, or the active context. Undefined
   * when there is nothing to record: tracing off, or the transaction's span was not sampled
   * (its children would not be either, so they are not even created).
   */
  /**
   * A child span of the event's transaction over the event's time, with its attributes
   * (built only when the span is made); none where the transaction is not traced.
   */
  private eventSpan(
    e: {
      readonly transaction: TransactionRef | undefined;
      readonly time: number;
      readonly durationMs: number;
    },
    name: string,
    attributes: () => Attributes,
  ): void {
    const parent = this.parentOf(e.transaction);
    if (!parent) return;
    const span = this.child(parent, name, e.time, e.durationMs, undefined);
    span.setAttributes(attributes());
    span.end(epochMs(e.time + e.durationMs));
  }

  /** The root context, where tracing is on. */
  private rootParent(): Context | undefined {
    return this.tracer ? this.api.ROOT_CONTEXT : undefined;
  }

  private parentOf(tx: TransactionRef | undefined): Context | undefined {
    if (!this.tracer) return undefined;
    if (!tx) return this.api.context.active();
    const open = this.stateOf(tx);
    if (!open) return this.api.context.active();
    if (!(open instanceof OpenSpan) || !open.recording) return undefined;
    return this.contextOf(open);
  }

  /** The context an open span's children go under, made when the first child needs it. */
  private contextOf(open: OpenSpan): Context {
    open.context ??= this.api.trace.setSpan(open.parent, open.span);
    return open.context;
  }

  /** A span under `parent` that started at `time`; the caller adds attributes and ends it. */
  private child(parent: Context, name: string, time: number, durationMs: number, error: unknown): Span {
    const span = this.tracer!.startSpan(name, { startTime: epochMs(time) }, parent);
    if (this.hasAttributes) span.setAttributes(this.attributes);
    if (error !== undefined) markFailed(span, error, time + durationMs);
    return span;
  }
}

/** A transaction `traceRatio` left out: its children are not made either. */
class Untraced {
  constructor(readonly owner: PercolatorTelemetry) {}
}

/** What a listener keeps its state in: a transaction's ref, or an observer run's. */
type Ref = TransactionRef | ObserverRunRef;

/**
 * A transaction's (or an observer run's) span, kept in its ref's `listenerState`, and the
 * context its child spans go under.
 */
class OpenSpan {
  /** The context child spans go under: made when the first child needs it. */
  context: Context | undefined = undefined;
  /** Asked once: an ended span is not recording, and the secondaries end after it. */
  readonly recording: boolean;
  ended = false;

  constructor(
    readonly owner: PercolatorTelemetry,
    readonly span: Span,
    readonly parent: Context,
  ) {
    this.recording = span.isRecording();
  }
}

/**
 * Outcomes that are part of normal operation under contention: their exception events carry
 * the error's type and message but no stack trace (formatting a stack costs more than the
 * rest of the span; a conflict's stack says nothing an operator can use).
 */
const EXPECTED_OUTCOMES: ReadonlySet<string> = new Set([
  'conflict',
  'snapshotTooOld',
  'lockNotResolved',
  'aborted',
]);

/**
 * Errors of the same kinds, met by a commit step. By class name, not `instanceof`: an
 * application may load a second copy of @percolator/core, whose classes are not ours.
 */
const EXPECTED_ERRORS: ReadonlySet<string> = new Set([
  'ConflictError',
  'SnapshotTooOldError',
  'LockNotResolvedError',
  'AbortedError',
]);

function isExpected(error: unknown): boolean {
  return error instanceof Error && EXPECTED_ERRORS.has(error.name);
}

/** An error status and its `exception` event. */
function markFailed(span: Span, error: unknown, time: number): void {
  span.setStatus({ code: ERROR, message: error instanceof Error ? error.message : String(error) });
  recordError(span, error, time, isExpected(error));
}

/** An `exception` event: the error itself, or for an expected one its type and message only. */
function recordError(span: Span, error: unknown, time: number, expected: boolean): void {
  if (!(error instanceof Error)) return;
  span.recordException(expected ? { name: error.name, message: error.message } : error, epochMs(time));
}

function reportAttributes(report: object | undefined): Attributes {
  const out: Attributes = {};
  for (const [key, value] of Object.entries(report ?? {})) {
    if (typeof value === 'number') out[`percolator.report.${key}`] = value;
  }
  return out;
}

function linkTo(span: Span | undefined) {
  return span ? [{ context: span.spanContext(), attributes: { 'percolator.link': 'retry_of' } }] : undefined;
}

function stepEventAttributes(e: CommitStepEndEvent): Attributes {
  const attributes: Attributes = { 'percolator.duration_ms': e.durationMs, 'percolator.rows': e.rows };
  if (e.commitTs !== undefined) attributes['percolator.commit_ts'] = e.commitTs;
  if (e.error !== undefined) {
    attributes['percolator.error'] = e.error instanceof Error ? e.error.name : String(e.error);
  }
  return attributes;
}

function setStepAttributes(span: Span, e: CommitStepEndEvent): void {
  const keys = STEP_KEYS[e.step];
  span.setAttribute(keys.duration, e.durationMs);
  if (e.error !== undefined) {
    span.setAttribute(keys.error, e.error instanceof Error ? e.error.name : String(e.error));
  }
}

function endAttributes(e: TransactionEndEvent): Attributes {
  const attributes: Attributes = {
    'percolator.outcome': e.outcome,
    'percolator.rows': e.rows,
    'percolator.tables': e.tables,
  };
  if (e.startTs !== undefined) attributes['percolator.start_ts'] = e.startTs;
  if (e.commitTs !== undefined) attributes['percolator.commit_ts'] = e.commitTs;
  if (e.identityTs !== undefined) attributes['percolator.identity_ts'] = e.identityTs;
  return attributes;
}
