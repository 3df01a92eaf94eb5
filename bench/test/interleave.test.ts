import { MemoryStore } from '@percolator/core';
import { describe, expect, test } from 'vitest';
import { interleavedGroups } from '../src/bench.js';
import { CountingStore } from '../src/counting-store.js';
import { initialRows } from '../src/dataset.js';
import type { KvTx, TxHints, TxOutcome } from '../src/engines/engine.js';
import { PercolatorEngine } from '../src/engines/percolator.js';
import { parseOptions } from '../src/options.js';
import { runInterleaved } from '../src/runner.js';
import { workloadByName } from '../src/workloads.js';

/** A Percolator engine that logs which engine each transaction ran on, in order. */
class LoggedEngine extends PercolatorEngine {
  constructor(
    store: MemoryStore,
    prefix: string,
    private readonly log: string[],
  ) {
    super(new CountingStore(store), 20, {}, { tablePrefix: prefix });
  }
  override transact<T>(fn: (tx: KvTx) => Promise<T>, hints?: TxHints): Promise<TxOutcome<T>> {
    this.log.push(this.dataKey);
    return super.transact(fn, hints);
  }
}

/** How often the log changes from one engine to the other. */
const switches = (log: readonly string[]) => log.filter((name, i) => i > 0 && name !== log[i - 1]).length;

async function run(rounds: number, prefixes: readonly [string, string] = ['', 'b_']) {
  const store = new MemoryStore();
  const log: string[] = [];
  const engines = prefixes.map((prefix) => new LoggedEngine(store, prefix, log));
  const shape = { records: 64, accounts: 16, valueBytes: 32 };
  for (const engine of new Map(engines.map((e) => [e.dataKey, e])).values())
    await engine.load('acct', initialRows('acct', shape));
  log.length = 0;
  const workload = workloadByName('transfer')!;
  const specs = engines.map((engine) => ({
    backend: 'memory',
    engine,
    workload,
    concurrency: 2,
    durationMs: 120,
    warmupMs: 10,
    shape,
    seed: 1,
    opsPerTxn: 2,
    probes: 2,
  }));
  const results = await runInterleaved(specs, rounds);
  for (const engine of engines) await engine.close();
  return { results, log };
}

describe('--rounds: cells measured in interleaved slices', () => {
  test('parses: 4 rounds by default, 6 under --tracing', () => {
    expect(parseOptions([]).rounds).toBe(4);
    expect(parseOptions(['--rounds', '1']).rounds).toBe(1);
    expect(parseOptions(['--tracing', 'otel']).rounds).toBe(6);
    expect(parseOptions(['--rounds', '4']).rounds).toBe(4);
    expect(() => parseOptions(['--rounds', '0'])).toThrow(/rounds/);
  });

  test('one round: each cell runs its window alone, one after the other', async () => {
    const { results, log } = await run(1);
    // warm-up and window of A, then of B, then the probes of A and of B
    expect(switches(log)).toBe(3);
    expect(results.map((r) => r.check.ok)).toEqual([true, true]);
  });

  test('six rounds: the slices take turns (A B, B A, ...), and each cell checks its own data', async () => {
    const { results, log } = await run(6);
    // warm-ups A B, slices A B B A A B B A A B B A, probes A B: 9 changes of engine
    expect(switches(log)).toBe(9);
    for (const result of results) {
      expect(result.check.ok).toBe(true);
      expect(result.check.detail).toContain('16 rows match');
      expect(result.transactions).toBeGreaterThan(0);
      // The window is the sum of the slices.
      expect(result.durationMs).toBeGreaterThanOrEqual(110);
    }
  });

  test("a slice's measured time includes the background work its commits left (settle)", async () => {
    const store = new MemoryStore();
    const shape = { records: 16, accounts: 8, valueBytes: 16 };
    class SlowSettle extends PercolatorEngine {
      override async settle(): Promise<void> {
        await super.settle();
        await new Promise((resolve) => setTimeout(resolve, 150));
      }
    }
    const engine = new SlowSettle(new CountingStore(store), 20, {}, {});
    await engine.load('acct', initialRows('acct', shape));
    const [result] = await runInterleaved(
      [
        {
          backend: 'memory',
          engine,
          workload: workloadByName('transfer')!,
          concurrency: 1,
          durationMs: 100,
          warmupMs: 0,
          shape,
          seed: 1,
          opsPerTxn: 2,
          probes: 1,
        },
      ],
      2,
    );
    await engine.close();
    // Two slices of 50 ms, each followed by 150 ms of settling, all of it in the window.
    expect(result!.durationMs).toBeGreaterThanOrEqual(380);
  });

  test('two cells on the same data would fail their checks: why the bench never interleaves them', async () => {
    const { results } = await run(6, ['', '']);
    expect(results.some((r) => !r.check.ok)).toBe(true);
  });
});

describe('interleavedGroups: which cells the bench interleaves', () => {
  const transfer = workloadByName('transfer')!;
  const read = workloadByName('read')!;
  const cell = (workload: typeof transfer, dataKey: string) => [workload, 8, { dataKey }] as const;
  const cells = [
    cell(transfer, 'percolator:memory:'),
    cell(transfer, 'percolator:memory:otel_'),
    cell(transfer, 'raw:memory'),
    cell(transfer, 'native:postgres:s'),
    cell(transfer, 'native:postgres:s'), // a second isolation level on the same schema
    cell(read, 'percolator:memory:'),
  ];
  const keys = (groups: (typeof cells)[number][][]) =>
    groups.map((g) => g.map(([w, , e]) => `${w.name}/${e.dataKey}`));

  test('with rounds above 1: one group per workload and concurrency, never two cells on the same data', () => {
    expect(keys(interleavedGroups(cells, 6))).toEqual([
      [
        'transfer/percolator:memory:',
        'transfer/percolator:memory:otel_',
        'transfer/raw:memory',
        'transfer/native:postgres:s',
      ],
      ['transfer/native:postgres:s'],
      ['read/percolator:memory:'],
    ]);
  });

  test('with 1 round: every cell alone', () => {
    expect(interleavedGroups(cells, 1)).toHaveLength(cells.length);
  });
});
