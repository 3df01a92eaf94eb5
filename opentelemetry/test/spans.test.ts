import {
  AggregationTemporality,
  type DataPoint,
  InMemoryMetricExporter,
  MeterProvider,
  PeriodicExportingMetricReader,
} from '@opentelemetry/sdk-metrics';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  type ReadableSpan,
  SimpleSpanProcessor,
} from '@opentelemetry/sdk-trace-base';
import { MemoryStore, Percolator, StoreError } from '@percolator/core';
import { PercolatorTelemetry } from '@percolator/opentelemetry';
import { describe, expect, it } from 'vitest';
import { LOCK_TTL_MS, runTransfers } from '../../examples/opentelemetry-transfers.mjs';
import { useAsyncContext } from './async-context.js';

useAsyncContext();

/** A span and its children, children in start order. */
interface Node {
  span: ReadableSpan;
  children: Node[];
}

function tree(spans: readonly ReadableSpan[]): Node[] {
  const nodes = new Map(spans.map((s) => [s.spanContext().spanId, { span: s, children: [] as Node[] }]));
  const roots: Node[] = [];
  for (const node of nodes.values()) {
    const parent = node.span.parentSpanContext && nodes.get(node.span.parentSpanContext.spanId);
    (parent ? parent.children : roots).push(node);
  }
  const byStart = (a: Node, b: Node) =>
    a.span.startTime[0] - b.span.startTime[0] || a.span.startTime[1] - b.span.startTime[1];
  for (const node of nodes.values()) node.children.sort(byStart);
  return roots.sort(byStart);
}

const names = (nodes: readonly Node[]) => nodes.map((n) => n.span.name);
const attrs = (node: Node | undefined) => node!.span.attributes;

/** SDK providers that keep what they get: spans as they end, metrics when flushed. */
function providers() {
  const exporter = new InMemorySpanExporter();
  const tracerProvider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  const metricExporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
  const reader = new PeriodicExportingMetricReader({
    exporter: metricExporter,
    exportIntervalMillis: 3_600_000,
  });
  const meterProvider = new MeterProvider({ readers: [reader] });
  return { exporter, tracerProvider, metricExporter, reader, meterProvider };
}

async function traceTransfers(commitSteps?: 'spans' | 'events' | 'attributes') {
  const { exporter, tracerProvider, metricExporter, reader, meterProvider } = providers();
  const telemetry = new PercolatorTelemetry({
    tracerProvider,
    meterProvider,
    attributes: { 'test.run': 'spans' },
    ...(commitSteps ? { commitSteps } : {}),
  });
  const store = new MemoryStore();
  // Two phases, so each step has its span (a one-step commit's span: the test below).
  const db = new Percolator({
    store,
    lockTtlMs: LOCK_TTL_MS,
    onEvent: telemetry.onEvent,
    onePhaseMaxRows: 1,
  });
  const result = await runTransfers({ store, db, tracer: tracerProvider.getTracer('test') });
  await db.close();
  await tracerProvider.forceFlush();
  await reader.forceFlush();
  const points = new Map<string, DataPoint<unknown>[]>();
  for (const rm of metricExporter.getMetrics())
    for (const sm of rm.scopeMetrics)
      for (const m of sm.metrics)
        points.set(m.descriptor.name, [...(points.get(m.descriptor.name) ?? []), ...m.dataPoints]);
  const roots = tree(exporter.getFinishedSpans()); // (shutdown empties the exporter)
  await meterProvider.shutdown();
  await tracerProvider.shutdown();
  return { ...result, roots, points };
}

describe('PercolatorTelemetry spans', () => {
  it('traces a transfer that commits, one that conflicts and retries, and one that waits on a lock', async () => {
    const { roots, balances, stuckStartTs, points } = await traceTransfers();
    expect(balances).toEqual([71, 130]);
    // Only the instrumented client's spans, each transfer a trace of its own.
    expect(names(roots)).toEqual([
      'transfer: commits',
      'transfer: conflicts and retries',
      'transfer: waits on a lock',
    ]);
    const [commits, retried, waited] = roots;
    for (const root of roots) {
      for (const tx of root.children) {
        expect(tx.span.spanContext().traceId).toBe(root.span.spanContext().traceId);
        expect(tx.span.instrumentationScope.name).toBe('@percolator/opentelemetry');
        expect(attrs(tx)).toMatchObject({
          'percolator.store': 'memory',
          'percolator.rows': 2,
          'test.run': 'spans',
        });
      }
    }

    // 1. One transaction: prewrite, the commit point, then the secondaries.
    expect(names(commits!.children)).toEqual(['percolator.transaction']);
    const tx1 = commits!.children[0]!;
    expect(attrs(tx1)).toMatchObject({ 'percolator.outcome': 'committed', 'percolator.attempt': 1 });
    expect(names(tx1.children)).toEqual([
      'percolator.prewrite',
      'percolator.commit_primary',
      'percolator.commit_secondaries',
    ]);
    const startTs = attrs(tx1)['percolator.start_ts'] as number;
    const commitTs = attrs(tx1)['percolator.commit_ts'] as number;
    expect(commitTs).toBeGreaterThan(startTs);
    expect(attrs(tx1.children[0])).toMatchObject({ 'percolator.rows': 2, 'test.run': 'spans' });
    expect(attrs(tx1.children[1])).toMatchObject({ 'percolator.commit_ts': commitTs });
    expect(attrs(tx1.children[2])).toMatchObject({ 'percolator.rows': 1 });

    // 2. Two attempts: a conflict (a failed prewrite, then the rollback), then a commit
    //    linked to the attempt it retries.
    expect(names(retried!.children)).toEqual(['percolator.transaction', 'percolator.transaction']);
    const [failed, retry] = retried!.children;
    expect(attrs(failed)).toMatchObject({ 'percolator.outcome': 'conflict', 'percolator.attempt': 1 });
    expect(failed!.span.status).toMatchObject({ code: 2, message: 'conflict' });
    expect(failed!.span.events.map((e) => e.name)).toEqual(['exception']);
    expect(names(failed!.children)).toEqual(['percolator.prewrite', 'percolator.rollback']);
    expect(failed!.children[0]!.span.status.code).toBe(2);
    expect(attrs(retry)).toMatchObject({ 'percolator.outcome': 'committed', 'percolator.attempt': 2 });
    expect(retry!.span.links.map((l) => l.context.spanId)).toEqual([failed!.span.spanContext().spanId]);
    expect(names(retry!.children)).toEqual([
      'percolator.prewrite',
      'percolator.commit_primary',
      'percolator.commit_secondaries',
    ]);

    // 3. The reads wait on the crashed client's locks (alice is its primary), roll it back,
    //    then the transfer commits.
    expect(names(waited!.children)).toEqual(['percolator.transaction']);
    const tx3 = waited!.children[0]!;
    expect(attrs(tx3)).toMatchObject({ 'percolator.outcome': 'committed' });
    const kids = tx3.children;
    expect(names(kids).slice(-3)).toEqual([
      'percolator.prewrite',
      'percolator.commit_primary',
      'percolator.commit_secondaries',
    ]);
    const waits = kids.filter((k) => k.span.name === 'percolator.lock_wait');
    const resolves = kids.filter((k) => k.span.name === 'percolator.resolve_lock');
    expect(
      waits.map((w) => [w.span.attributes['percolator.row'], w.span.attributes['percolator.outcome']]),
    ).toEqual([
      ['alice', 'resolved'],
      ['bob', 'resolved'],
    ]);
    expect(waits.map((w) => w.span.attributes['percolator.lock.start_ts'])).toEqual([
      stuckStartTs,
      stuckStartTs,
    ]);
    expect(
      resolves.map((r) => [r.span.attributes['percolator.row'], r.span.attributes['percolator.outcome']]),
    ).toEqual([
      ['alice', 'rolledBack'],
      ['bob', 'rolledBack'],
    ]);
    expect(kids).toHaveLength(7);

    // The metrics count the same story.
    const sum = (name: string, match: Record<string, unknown> = {}) =>
      (points.get(name) ?? [])
        .filter((p) => Object.entries(match).every(([k, v]) => p.attributes[k] === v))
        .reduce(
          (n, p) => n + (typeof p.value === 'number' ? p.value : (p.value as { count: number }).count),
          0,
        );
    expect(sum('percolator.transactions', { 'percolator.outcome': 'committed' })).toBe(3);
    expect(sum('percolator.transactions', { 'percolator.outcome': 'conflict' })).toBe(1);
    expect(sum('percolator.retries')).toBe(1);
    expect(sum('percolator.lock.resolutions', { 'percolator.outcome': 'rolledBack' })).toBe(2);
    expect(sum('percolator.transaction.duration')).toBe(4);
    expect(sum('percolator.lock.wait.duration', { 'percolator.outcome': 'resolved' })).toBe(2);
    expect(sum('percolator.commit.step.duration', { 'percolator.step': 'prewrite' })).toBe(4);
  });

  it('with no SDK registered, runs on the API’s no-op tracer and meter', async () => {
    const telemetry = new PercolatorTelemetry();
    const store = new MemoryStore();
    const db = new Percolator({ store, onEvent: telemetry.onEvent });
    await db.transact(async (tx) => {
      tx.set('accounts', 'alice', 'balance', '1');
      tx.set('accounts', 'bob', 'balance', '2');
    });
    expect(await db.transact((tx) => tx.getString('accounts', 'bob', 'balance'))).toBe('2');
    await db.close();
  });

  it("with commitSteps 'events': one span per transaction, its steps as span events; the secondaries, after its end, a child span", async () => {
    const { roots, balances } = await traceTransfers('events');
    expect(balances).toEqual([71, 130]);
    const [commits, retried, waited] = roots;
    const events = (node: Node | undefined) => node!.span.events.map((e) => e.name);

    const tx1 = commits!.children[0]!;
    expect(events(tx1)).toEqual(['percolator.prewrite', 'percolator.commit_primary']);
    const commitTs = attrs(tx1)['percolator.commit_ts'];
    const [prewrite, commitPrimary] = tx1.span.events;
    expect(prewrite!.attributes).toMatchObject({ 'percolator.rows': 2 });
    expect(prewrite!.attributes!['percolator.duration_ms']).toBeGreaterThanOrEqual(0);
    expect(commitPrimary!.attributes).toMatchObject({ 'percolator.commit_ts': commitTs });
    expect(names(tx1.children)).toEqual(['percolator.commit_secondaries']);

    // The failed attempt: its prewrite event names the error, then the rollback, then the
    // exception of the transaction itself (type and message: a conflict has no stack).
    const [failed, retry] = retried!.children;
    expect(events(failed)).toEqual(['percolator.prewrite', 'percolator.rollback', 'exception']);
    expect(failed!.span.events[0]!.attributes).toMatchObject({ 'percolator.error': 'ConflictError' });
    expect(failed!.span.events[2]!.attributes).toMatchObject({ 'exception.type': 'ConflictError' });
    expect(failed!.span.events[2]!.attributes!['exception.stacktrace']).toBeUndefined();
    expect(failed!.children).toEqual([]);
    expect(events(retry)).toEqual(['percolator.prewrite', 'percolator.commit_primary']);

    // Lock waits and resolutions stay child spans.
    const tx3 = waited!.children[0]!;
    expect(
      names(tx3.children)
        .filter((n) => n !== 'percolator.commit_secondaries')
        .sort(),
    ).toEqual([
      'percolator.lock_wait',
      'percolator.lock_wait',
      'percolator.resolve_lock',
      'percolator.resolve_lock',
    ]);
  });

  it("with commitSteps 'attributes': one span per transaction, its steps' durations and errors as its attributes", async () => {
    const { roots, balances } = await traceTransfers('attributes');
    expect(balances).toEqual([71, 130]);
    const [commits, retried, waited] = roots;

    // No child spans: the secondaries succeeded, so they show only in the step histogram.
    const tx1 = commits!.children[0]!;
    expect(tx1.children).toEqual([]);
    expect(tx1.span.events).toEqual([]);
    expect(attrs(tx1)['percolator.prewrite.duration_ms']).toBeGreaterThanOrEqual(0);
    expect(attrs(tx1)['percolator.commit_primary.duration_ms']).toBeGreaterThanOrEqual(0);
    expect(attrs(tx1)['percolator.commit_secondaries.duration_ms']).toBeUndefined();
    expect(attrs(tx1)).toMatchObject({ 'percolator.outcome': 'committed', 'percolator.rows': 2 });

    // The failed attempt: the failed prewrite names its error, the rollback its duration.
    const [failed, retry] = retried!.children;
    expect(failed!.children).toEqual([]);
    expect(attrs(failed)).toMatchObject({
      'percolator.outcome': 'conflict',
      'percolator.prewrite.error': 'ConflictError',
    });
    expect(attrs(failed)['percolator.rollback.duration_ms']).toBeGreaterThanOrEqual(0);
    expect(attrs(failed)['percolator.commit_primary.duration_ms']).toBeUndefined();
    expect(failed!.span.events.map((e) => e.name)).toEqual(['exception']);
    expect(attrs(retry)['percolator.prewrite.error']).toBeUndefined();
    expect(retry!.children).toEqual([]);

    // Lock waits and resolutions stay child spans.
    const tx3 = waited!.children[0]!;
    expect(names(tx3.children).sort()).toEqual([
      'percolator.lock_wait',
      'percolator.lock_wait',
      'percolator.resolve_lock',
      'percolator.resolve_lock',
    ]);
  });

  it('keeps its spans apart from another listener on the same client (both see whole trees)', async () => {
    const exporters = [new InMemorySpanExporter(), new InMemorySpanExporter()];
    const telemetries = exporters.map(
      (exporter) =>
        new PercolatorTelemetry({
          tracerProvider: new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }),
          metrics: false,
        }),
    );
    // A third listener that also uses the slot: the telemetries must not take its value.
    const mine = new Map<number, unknown>();
    const db = new Percolator({
      store: new MemoryStore(),
      onePhaseMaxRows: 1, // two phases: a tree of step spans
      onEvent: (e) => {
        if (e.type === 'transaction.begin') e.transaction.listenerState ??= 'third';
        for (const t of telemetries) t.onEvent(e);
        if (e.type === 'transaction.end') mine.set(e.transaction.id, e.transaction.listenerState);
      },
    });
    for (let i = 0; i < 3; i++)
      await db.transact(async (tx) => {
        tx.set('t', 'a', 'c', String(i));
        tx.set('t', 'b', 'c', String(i));
      });
    await db.close();
    expect([...mine.values()]).toEqual(['third', 'third', 'third']);
    for (const exporter of exporters) {
      const roots = tree(exporter.getFinishedSpans());
      expect(names(roots)).toEqual(Array(3).fill('percolator.transaction'));
      for (const root of roots)
        expect(names(root.children)).toEqual([
          'percolator.prewrite',
          'percolator.commit_primary',
          'percolator.commit_secondaries',
        ]);
    }
  });

  it('traces a one-step commit of several rows as one percolator.one_phase_commit span with its rows and commit timestamp', async () => {
    const exporter = new InMemorySpanExporter();
    const telemetry = new PercolatorTelemetry({
      tracerProvider: new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }),
      metrics: false,
    });
    const db = new Percolator({ store: new MemoryStore(), onEvent: telemetry.onEvent });
    const commitTs = await db.transact(async (tx) => {
      await tx.getString('accounts', 'alice', 'balance');
      tx.set('accounts', 'alice', 'balance', '90');
      tx.set('accounts', 'bob', 'balance', '110');
      tx.set('ledger', 'entry-1', 'amount', '10');
      return tx;
    });
    await db.close();
    const [root] = tree(exporter.getFinishedSpans());
    expect(root!.span.name).toBe('percolator.transaction');
    expect(names(root!.children)).toEqual(['percolator.one_phase_commit']);
    expect(attrs(root!.children[0])).toMatchObject({ 'percolator.rows': 3 });
    expect(attrs(root)).toMatchObject({ 'percolator.outcome': 'committed', 'percolator.rows': 3 });
    expect(commitTs.startTs).toBeGreaterThan(0);
  });

  it('traces a fence (a one-step commit whose request was lost, fenced and sent again) as a percolator.fence span and counts it', async () => {
    const { exporter, tracerProvider, metricExporter, reader, meterProvider } = providers();
    const telemetry = new PercolatorTelemetry({ tracerProvider, meterProvider });
    const memory = new MemoryStore();
    await new Percolator({ store: memory }).transact(async (tx) => {
      tx.set('accounts', 'alice', 'balance', '100');
      tx.set('accounts', 'bob', 'balance', '100');
    });
    // The next one-step commit is lost before it reaches the store, its outcome unknown.
    let lose = true;
    const store = new Proxy(memory, {
      get(target, property) {
        const value = Reflect.get(target, property, target);
        if (property !== 'checkAndSetStampedMany' || typeof value !== 'function') {
          return typeof value === 'function' ? value.bind(target) : value;
        }
        return (...args: unknown[]) => {
          if (!lose) return value.apply(target, args);
          lose = false;
          return Promise.reject(new StoreError('injected: no reply (the request was lost)', 'unknown'));
        };
      },
    });
    const db = new Percolator({ store, onEvent: telemetry.onEvent });
    await db.transact(async (tx) => {
      const alice = Number(await tx.getString('accounts', 'alice', 'balance'));
      const bob = Number(await tx.getString('accounts', 'bob', 'balance'));
      tx.set('accounts', 'alice', 'balance', String(alice - 10));
      tx.set('accounts', 'bob', 'balance', String(bob + 10));
    });
    await db.close();
    await tracerProvider.forceFlush();
    await reader.forceFlush();
    const [root] = tree(exporter.getFinishedSpans());
    expect(attrs(root)).toMatchObject({ 'percolator.outcome': 'committed' });
    expect(names(root!.children).sort()).toEqual(['percolator.fence', 'percolator.one_phase_commit']);
    const fence = root!.children.find((c) => c.span.name === 'percolator.fence');
    expect(attrs(fence)).toMatchObject({
      'percolator.table': 'accounts',
      'percolator.row': 'alice',
      'percolator.outcome': 'fenced',
    });
    const fences = metricExporter
      .getMetrics()
      .flatMap((rm) => rm.scopeMetrics.flatMap((sm) => sm.metrics))
      .filter((m) => m.descriptor.name === 'percolator.commit.fences')
      .flatMap((m) => m.dataPoints);
    expect(fences.map((p) => [p.attributes['percolator.outcome'], p.value])).toEqual([['fenced', 1]]);
    await meterProvider.shutdown();
    await tracerProvider.shutdown();
  });

  it('records tidy passes as metrics, and as spans only when they fail or with tidySpans', async () => {
    async function run(tidySpans: boolean | undefined) {
      const exporter = new InMemorySpanExporter();
      const metricExporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
      const reader = new PeriodicExportingMetricReader({
        exporter: metricExporter,
        exportIntervalMillis: 3_600_000,
      });
      const telemetry = new PercolatorTelemetry({
        tracerProvider: new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }),
        meterProvider: new MeterProvider({ readers: [reader] }),
        ...(tidySpans === undefined ? {} : { tidySpans }),
      });
      // Every superseded value moves out: each commit after the first schedules a tidy pass
      // (onePhaseMaxRows 1: no one-step commit, which would carry its moves itself).
      const db = new Percolator({
        store: new MemoryStore(),
        gc: { inlineHistoryBytes: 0 },
        onePhaseMaxRows: 1,
        onEvent: telemetry.onEvent,
      });
      for (let i = 0; i < 5; i++) await db.transact(async (tx) => tx.set('t', 'a', 'c', 'x'.repeat(100 + i)));
      await db.close();
      await reader.forceFlush();
      let passes = 0;
      for (const rm of metricExporter.getMetrics())
        for (const sm of rm.scopeMetrics)
          for (const m of sm.metrics)
            if (m.descriptor.name === 'percolator.tidy.duration')
              for (const p of m.dataPoints) passes += (p.value as { count: number }).count;
      const spans = exporter.getFinishedSpans().filter((span) => span.name === 'percolator.tidy');
      return { passes, spans: spans.length };
    }
    const quiet = await run(undefined);
    expect(quiet.passes).toBeGreaterThanOrEqual(1);
    expect(quiet.spans).toBe(0);
    const loud = await run(true);
    expect(loud.spans).toBe(loud.passes);
    expect(loud.passes).toBeGreaterThanOrEqual(1);
  });
});
