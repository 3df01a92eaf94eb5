import { InvalidArgumentError, MemoryStore } from '@percolator/core';
import { describe, expect, test } from 'vitest';
import { CountingStore } from '../src/counting-store.js';
import { DEFAULTS, parseDuration, parseOptions } from '../src/options.js';
import { BACKENDS } from '../src/types.js';
import { DEFAULT_WORKLOADS, WORKLOAD_GROUPS, workloadByName } from '../src/workloads.js';

describe('parseOptions', () => {
  test('no arguments: every backend (skippable), the default workloads and figures', () => {
    const o = parseOptions([]);
    expect(o.backends).toEqual([...BACKENDS]);
    expect(o.explicitBackends).toBe(false);
    expect(o.workloads).toEqual([...DEFAULT_WORKLOADS]);
    expect(o.modes).toEqual(['percolator', 'raw', 'native']);
    expect(o.concurrency).toEqual([...DEFAULTS.concurrency]);
    expect(o.durationMs).toBe(DEFAULTS.durationMs);
    expect(o.startServices).toBe(true);
    // The default run covers the sweeps the issue asks for.
    for (const n of [1, 4, 16, 64, 256]) expect(o.workloads).toContain(`rows-${n}`);
    expect(o.workloads.some((w) => w.startsWith('contention-'))).toBe(true);
  });

  test('named backends, groups, durations and lists; a bare "--" from pnpm is ignored', () => {
    const o = parseOptions([
      '--',
      '--backends',
      'memory,redis',
      '--workloads',
      'ycsb,rows-8,contention-3',
      '--duration',
      '2s',
      '--warmup',
      '0',
      '--concurrency',
      '1,8,8',
      '--no-start',
    ]);
    expect(o.backends).toEqual(['memory', 'redis']);
    expect(o.explicitBackends).toBe(true);
    expect(o.workloads).toEqual([...WORKLOAD_GROUPS.ycsb!, 'rows-8', 'contention-3']);
    expect(o.durationMs).toBe(2000);
    expect(o.warmupMs).toBe(0);
    expect(o.concurrency).toEqual([1, 8]);
    expect(o.startServices).toBe(false);
  });

  test.each([
    [['--backends', 'sqlite']],
    [['--backends', '']],
    [['--workloads', 'rows-0']],
    [['--workloads', 'contention-1']],
    [['--modes', 'fast']],
    [['--duration', '5ms']],
    [['--duration', 'soon']],
    [['--concurrency', '1,x']],
    [['--records', '1']],
    [['--unknown']],
    [['positional']],
    // The history cells are written unprefixed; --tracing prefixes every Percolator engine's tables.
    [['--tracing', 'events', '--workloads', 'transfer,history']],
  ])('%j is an InvalidArgumentError', (args) => {
    expect(() => parseOptions(args)).toThrow(InvalidArgumentError);
  });

  test('the default --ops is at most --records (an explicit one above it is refused)', () => {
    // Found in review: --records 3 ran ycsb cells that could not pick 4 distinct keys.
    expect(parseOptions(['--records', '3']).opsPerTxn).toBe(3);
    expect(parseOptions([]).opsPerTxn).toBeGreaterThan(3);
    expect(() => parseOptions(['--records', '3', '--ops', '4'])).toThrow(InvalidArgumentError);
  });

  test('durations', () => {
    expect(parseDuration('d', '250ms', 0)).toBe(250);
    expect(parseDuration('d', '1.5s', 0)).toBe(1500);
    expect(parseDuration('d', '40', 0)).toBe(40);
    expect(parseDuration('d', undefined, 7)).toBe(7);
  });

  test('sweep workloads are parsed from their names', () => {
    expect(workloadByName('rows-256')?.rowsPerTxn(4)).toBe(256);
    expect(workloadByName('contention-2')?.name).toBe('contention-2');
    expect(workloadByName('rows-abc')).toBeUndefined();
  });
});

describe('CountingStore', () => {
  test('counts every call, exposes exactly the inner store capabilities', async () => {
    const inner = new MemoryStore();
    const store = new CountingStore(inner);
    expect(store.capabilities).toBe(inner.capabilities);
    expect(typeof store.readMany).toBe('function');
    const created = await store.checkAndSet({
      table: 't',
      key: 'k',
      expected: null,
      state: new Uint8Array([1]),
    });
    expect(created.ok).toBe(true);
    await store.read('t', 'k');
    await store.readMany!([
      { table: 't', key: 'k' },
      { table: 't', key: 'j' },
    ]);
    await store.incrementCounter!('c', 1);
    await store.scan!('t', { limit: 10 });
    expect(store.calls).toMatchObject({ checkAndSet: 1, read: 1, readMany: 1, incrementCounter: 1, scan: 1 });
    expect(store.total).toBe(5);
    // A store without optional methods: the proxy does not invent them.
    const bare = new CountingStore({
      name: 'bare',
      capabilities: { ...inner.capabilities, batchRead: false, orderedScan: false },
      read: (t, k) => inner.read(t, k),
      checkAndSet: (r) => inner.checkAndSet(r),
      close: async () => {},
    });
    expect(bare.readMany).toBeUndefined();
    expect(bare.scan).toBeUndefined();
  });
});
