import { MemoryStore } from '@percolator/core';
import { describe, expect, test } from 'vitest';
import { CountingStore } from '../src/counting-store.js';
import { PercolatorEngine } from '../src/engines/percolator.js';
import { oracleTable } from '../src/report/summary.js';
import { runCell } from '../src/runner.js';
import type { BenchReport } from '../src/types.js';
import { workloadByName } from '../src/workloads.js';

describe('the oracle ceiling', () => {
  test('4,096 waiters on the memory store: it runs, checks the timestamps and reports them', async () => {
    const engine = new PercolatorEngine(new CountingStore(new MemoryStore()), 5);
    const result = await runCell({
      backend: 'memory',
      engine,
      workload: workloadByName('oracle')!,
      concurrency: 4096,
      durationMs: 150,
      warmupMs: 0,
      shape: { records: 2, accounts: 2, valueBytes: 16 },
      seed: 1,
      opsPerTxn: 1,
    });
    await engine.close();
    expect(result.check.ok, result.check.detail).toBe(true);
    expect(result.concurrency).toBe(4096);
    expect(result.transactions).toBeGreaterThan(4096);
    // Batched: far fewer counter increments than timestamps.
    expect(result.storeCalls).toBeGreaterThan(0);
    expect(result.storeCalls!).toBeLessThan(result.transactions);
    const table = oracleTable({ results: [{ ...result, ratios: [] }] } as unknown as BenchReport)!;
    expect(table).toMatch(/\| memory +\| 4096 +\|/);
  });
});
