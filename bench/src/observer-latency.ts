import { type Observer, Percolator, type RowStore, type TimestampOracle } from '@percolator/core';
import { sleep } from './engines/engine.js';

export interface ObserverLatencyOptions {
  readonly store: RowStore;
  /** Needed only when the store has no atomic counter; shared by every client made here. */
  readonly oracle?: TimestampOracle;
  /** Observed writes in the latency phase, each to a new row (so no collapsing). Default 200. */
  readonly writes?: number;
  /** Target rate of those writes, across all writers. Default 100 per second. */
  readonly writesPerSecond?: number;
  /** Notifications written before the workers start, in the throughput phase. Default 500. */
  readonly backlog?: number;
  /** Worker clients, each with its own worker. Default 2. */
  readonly workers?: number;
  /** Concurrency of each worker. Default 4. */
  readonly concurrency?: number;
  /** Longest idle poll of the background loops (bounds latency when idle). Default 20. */
  readonly idlePollMs?: number;
  /** Table used; rows are left behind (use a fresh store or namespace). Default "observer_latency". */
  readonly table?: string;
}

export interface ObserverLatencyReport {
  readonly store: string;
  /** Latency phase: write committed (commit() returned) to observer run committed, ms. */
  readonly latency: {
    readonly samples: number;
    readonly p50: number;
    readonly p99: number;
    readonly max: number;
    readonly mean: number;
  };
  /** Throughput phase: a backlog processed by `workers` workers with runUntilIdle. */
  readonly throughput: { readonly runs: number; readonly ms: number; readonly runsPerSecond: number };
}

function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
}

const round = (ms: number) => Math.round(ms * 100) / 100;

/**
 * Measures notification latency and observer throughput on a store (for benchmarks and
 * docs/observers.md). Latency phase: workers run in the background while writers commit
 * observed cells at a steady rate; each sample is the time from the writer's commit()
 * returning to the observer's transaction committing. Throughput phase: with the workers
 * stopped, `backlog` notifications are written, then the workers drain them.
 */
export async function measureObserverLatency(
  options: ObserverLatencyOptions,
): Promise<ObserverLatencyReport> {
  const table = options.table ?? 'observer_latency';
  const writes = options.writes ?? 200;
  const rate = options.writesPerSecond ?? 100;
  const backlog = options.backlog ?? 500;
  const workerCount = options.workers ?? 2;
  const observed = [{ table, column: 'in' }];
  const base = { store: options.store, ...(options.oracle ? { oracle: options.oracle } : {}) };
  const writer = new Percolator({ ...base, observedColumns: observed });
  const committedAt = new Map<string, number>();
  const samples: number[] = [];
  let runs = 0;
  const observer: Observer = {
    name: 'latency-probe',
    table,
    column: 'in',
    handler: async (tx, { row }) => {
      tx.set(table, row, 'out', (await tx.getString(table, row, 'in')) ?? '');
    },
  };
  const clients = Array.from({ length: workerCount }, () => new Percolator(base));
  const workers = clients.map((db) =>
    db.worker({
      observers: [observer],
      concurrency: options.concurrency ?? 4,
      idlePollMs: options.idlePollMs ?? 20,
      onRun: (e) => {
        runs++;
        const at = committedAt.get(e.row);
        if (at !== undefined) samples.push(Math.max(0, performance.now() - at));
      },
    }),
  );
  try {
    for (const w of workers) w.start();
    const started = performance.now();
    for (let i = 0; i < writes; i++) {
      // Paced: write i is due at i / rate seconds.
      const due = started + (i * 1000) / rate;
      const wait = due - performance.now();
      if (wait > 0) await sleep(wait);
      const row = `lat/${i}`;
      await writer.transact(async (tx) => tx.set(table, row, 'in', String(i)));
      committedAt.set(row, performance.now());
    }
    await Promise.all(workers.map((w) => w.runUntilIdle()));
    await Promise.all(workers.map((w) => w.stop()));

    for (let i = 0; i < backlog; i += 50) {
      await writer.transact(async (tx) => {
        for (let j = i; j < Math.min(backlog, i + 50); j++) tx.set(table, `tput/${j}`, 'in', String(j));
      });
    }
    const before = runs;
    const t0 = performance.now();
    await Promise.all(workers.map((w) => w.runUntilIdle()));
    const ms = performance.now() - t0;
    const sorted = [...samples].sort((a, b) => a - b);
    return {
      store: options.store.name,
      latency: {
        samples: sorted.length,
        p50: round(percentile(sorted, 50)),
        p99: round(percentile(sorted, 99)),
        max: round(sorted.at(-1) ?? Number.NaN),
        mean: round(sorted.reduce((s, x) => s + x, 0) / Math.max(1, sorted.length)),
      },
      throughput: { runs: runs - before, ms: round(ms), runsPerSecond: round(((runs - before) * 1000) / ms) },
    };
  } finally {
    await Promise.all([writer, ...clients].map((db) => db.close()));
  }
}
