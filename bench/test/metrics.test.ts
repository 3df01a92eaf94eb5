import { describe, expect, test } from 'vitest';
import { LatencyHistogram } from '../src/histogram.js';
import { abortRate, perSecond, perUnit, retryRate, withRatios } from '../src/metrics.js';
import type { BenchResult } from '../src/types.js';

describe('LatencyHistogram', () => {
  test('percentiles of 1..1000 ms are within HDR precision (0.1%)', () => {
    const h = new LatencyHistogram();
    // Shuffled order: percentiles must not depend on arrival order.
    const values = Array.from({ length: 1000 }, (_, i) => i + 1).sort(
      (a, b) => ((a * 7919) % 1000) - ((b * 7919) % 1000),
    );
    for (const v of values) h.record(v);
    expect(h.count).toBe(1000);
    expect(Math.abs(h.percentileMs(50) - 500) / 500).toBeLessThan(0.002);
    expect(Math.abs(h.percentileMs(95) - 950) / 950).toBeLessThan(0.002);
    expect(Math.abs(h.percentileMs(99) - 990) / 990).toBeLessThan(0.002);
    expect(Math.abs(h.percentileMs(100) - 1000) / 1000).toBeLessThan(0.002);
    expect(Math.abs(h.meanMs - 500.5) / 500.5).toBeLessThan(0.002);
  });

  test('sub-millisecond latencies keep microsecond resolution', () => {
    const h = new LatencyHistogram();
    for (let i = 0; i < 99; i++) h.record(0.02);
    h.record(5);
    expect(h.percentileMs(50)).toBeCloseTo(0.02, 3);
    expect(h.percentileMs(99)).toBeCloseTo(0.02, 3);
    expect(h.percentileMs(100)).toBeCloseTo(5, 2);
    expect(h.maxMs).toBeCloseTo(5, 2);
  });

  test('a skewed distribution: p99 sees the tail, p50 does not', () => {
    const h = new LatencyHistogram();
    for (let i = 0; i < 980; i++) h.record(1);
    for (let i = 0; i < 20; i++) h.record(100);
    expect(h.percentileMs(50)).toBeCloseTo(1, 2);
    expect(h.percentileMs(95)).toBeCloseTo(1, 2);
    expect(h.percentileMs(99)).toBeCloseTo(100, 0);
  });

  test('empty histogram reports zeros; bad input is rejected', () => {
    const h = new LatencyHistogram();
    expect(h.percentileMs(99)).toBe(0);
    expect(h.meanMs).toBe(0);
    expect(() => h.record(-1)).toThrow(RangeError);
    expect(() => h.record(Number.NaN)).toThrow(RangeError);
    expect(() => h.percentileMs(101)).toThrow(RangeError);
    h.record(3);
    h.reset();
    expect(h.count).toBe(0);
  });
});

describe('rates', () => {
  test('abort rate is aborted attempts over all attempts', () => {
    expect(abortRate(10, 10)).toBe(0);
    expect(abortRate(10, 4)).toBeCloseTo(0.6);
    expect(abortRate(0, 0)).toBe(0);
  });
  test('retry rate is extra attempts per transaction started', () => {
    expect(retryRate(15, 10)).toBeCloseTo(0.5);
    expect(retryRate(0, 0)).toBe(0);
  });
  test('per second and per unit', () => {
    expect(perSecond(500, 250)).toBe(2000);
    expect(perSecond(5, 0)).toBe(0);
    expect(perUnit(30, 10)).toBe(3);
    expect(perUnit(3, 0)).toBe(0);
  });
});

function result(over: Partial<BenchResult>): BenchResult {
  return {
    backend: 'b',
    workload: 'read',
    mode: 'percolator',
    variant: 'si',
    concurrency: 4,
    throughput: 100,
    p50Ms: 2,
    p95Ms: 3,
    p99Ms: 4,
    meanMs: 2,
    maxMs: 5,
    abortRate: 0,
    retryRate: 0,
    roundTrips: 2,
    commands: 2,
    transactions: 10,
    attempts: 10,
    gaveUp: 0,
    errors: 0,
    durationMs: 100,
    ratios: [],
    check: { ok: true, detail: '' },
    ...over,
  };
}

describe('withRatios', () => {
  test('Percolator figures are divided by each baseline of the same backend, workload and concurrency', () => {
    const results = withRatios([
      result({ throughput: 94, p50Ms: 1.5 }),
      result({ mode: 'raw', variant: 'cas', throughput: 100, p50Ms: 1 }),
      result({ mode: 'native', variant: 'serializable', throughput: 200, p50Ms: 3 }),
      // Different concurrency, backend or workload: never compared.
      result({ mode: 'raw', variant: 'cas', concurrency: 8, throughput: 1 }),
      result({ mode: 'raw', variant: 'cas', backend: 'other', throughput: 1 }),
      result({ mode: 'raw', variant: 'cas', workload: 'write', throughput: 1 }),
    ]);
    expect(results[0]!.ratios).toEqual([
      { baseline: 'raw', throughput: 0.94, p50: 1.5 },
      { baseline: 'native:serializable', throughput: 0.47, p50: 0.5 },
    ]);
    // Baselines carry no ratios of their own.
    for (const r of results.slice(1)) expect(r.ratios).toEqual([]);
  });

  test('a baseline with zero throughput gives no ratio (no Infinity in the JSON)', () => {
    const [p] = withRatios([result({}), result({ mode: 'raw', variant: 'cas', throughput: 0 })]);
    expect(p!.ratios).toEqual([]);
  });
});
