import { measureObserverLatency } from '@percolator/bench';
import { MemoryStore } from '@percolator/core';
import { expect, test } from 'vitest';

test('measureObserverLatency reports latency samples and drains its backlog', async () => {
  const report = await measureObserverLatency({
    store: new MemoryStore(),
    writes: 20,
    writesPerSecond: 500,
    backlog: 60,
  });
  expect(report.store).toBe('memory');
  expect(report.latency.samples).toBe(20);
  expect(report.latency.p50).toBeGreaterThanOrEqual(0);
  expect(report.latency.p99).toBeGreaterThanOrEqual(report.latency.p50);
  expect(report.throughput.runs).toBe(60);
  expect(report.throughput.runsPerSecond).toBeGreaterThan(0);
});
