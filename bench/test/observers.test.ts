import { MemoryStore, Percolator } from '@percolator/core';
import { afterAll, describe, expect, test } from 'vitest';
import { CountingStore } from '../src/counting-store.js';
import { PercolatorEngine } from '../src/engines/percolator.js';
import { ObserverSession } from '../src/observers.js';
import { runCell, runInterleaved } from '../src/runner.js';
import { workloadByName } from '../src/workloads.js';

/**
 * Notification latency is "write committed to observer committed": each sample must start
 * when the writer's commit has resolved (the write is visible to a new reader by then) and
 * end when the observer's run has committed (its copy is visible).
 */
describe('observer pipeline latency', () => {
  const store = new MemoryStore();
  const engine = new PercolatorEngine(new CountingStore(store), 10);
  const reader = new Percolator({ store });
  afterAll(async () => {
    await reader.close();
    await engine.close();
  });

  const readCell = (row: string, column: string) =>
    reader.transact((tx) => tx.getString('docs', row, column));

  test('each sample runs from the writer-commit hook time to the observer commit', async () => {
    const committed = new Map<string, number>();
    const visibleAtCommit = new Map<string, string | undefined>();
    const samples: { row: string; from: number; to: number }[] = [];
    const session = new ObserverSession(engine, 2, 32, {
      async writerCommitted(row, at) {
        committed.set(row, at);
        // The start of the sample: the write is already committed and visible.
        visibleAtCommit.set(row, await readCell(row, 'body'));
      },
      sample: (row, from, to) => samples.push({ row, from, to }),
    });
    try {
      const step = session.step(0);
      const outcomes = [];
      for (let i = 0; i < 10; i++) outcomes.push(await step());
      expect(samples.map((s) => s.row)).toEqual([...committed.keys()]);
      for (const [i, s] of samples.entries()) {
        expect(s.from, s.row).toBe(committed.get(s.row));
        expect(visibleAtCommit.get(s.row), s.row).toMatch(/^\d+:/);
        // The observer's copy exists once the sample ended.
        expect(await readCell(s.row, 'copy')).toBe(visibleAtCommit.get(s.row));
        // The step reports exactly this interval, not its own wall time.
        expect(outcomes[i]).toEqual({ attempts: 1, latencyMs: Math.max(0, s.to - s.from) });
      }
      expect((await session.verify()).ok).toBe(true);
    } finally {
      await session.close();
    }
  });

  test('a cell reports observer runs per second and one latency sample per processed change', async () => {
    const result = await runCell({
      backend: 'memory',
      engine,
      workload: workloadByName('observers')!,
      concurrency: 2,
      durationMs: 100,
      warmupMs: 0,
      shape: { records: 8, accounts: 4, valueBytes: 32 },
      seed: 1,
      opsPerTxn: 1,
    });
    expect(result.check.ok, result.check.detail).toBe(true);
    expect(result.observer).toBeDefined();
    expect(result.observer!.samples).toBe(result.transactions);
    expect(result.observer!.runs).toBeGreaterThan(0);
    expect(result.observer!.runsPerSecond).toBeGreaterThan(0);
    expect(result.p50Ms).toBeLessThanOrEqual(result.p99Ms);
  });

  test('two engines interleaved on one store each see their own changes processed (--rounds, --tracing)', async () => {
    // The plain engine and a traced one share a store under `--tracing`, each with its own
    // table prefix, and with `--rounds` both sessions' workers run all along. On one shared
    // table each worker took the other's changes, and every step of the other waited 30 s.
    const shared = new CountingStore(new MemoryStore());
    const engines = [
      new PercolatorEngine(shared, 10, {}, { tablePrefix: 't0_' }),
      new PercolatorEngine(shared, 10, {}, { tablePrefix: 't1_', variant: 'si+events' }),
    ];
    try {
      const results = await runInterleaved(
        engines.map((e) => ({
          backend: 'memory',
          engine: e,
          workload: workloadByName('observers')!,
          concurrency: 2,
          durationMs: 400,
          warmupMs: 0,
          shape: { records: 8, accounts: 4, valueBytes: 32 },
          seed: 1,
          opsPerTxn: 1,
        })),
        4,
      );
      for (const result of results) {
        expect(result.check.ok, result.check.detail).toBe(true);
        expect(result.errors).toBe(0);
        expect(result.transactions).toBeGreaterThan(0);
      }
    } finally {
      for (const e of engines) await e.close();
    }
  });
});
