import { randomBytes } from 'node:crypto';
import { type Observer, type ObserverWorker, Percolator } from '@percolator/core';
import { encodeValue } from './dataset.js';
import { type Engine, TxFailure } from './engines/engine.js';
import { PercolatorEngine } from './engines/percolator.js';
import type { CheckOutcome } from './types.js';
import type { Step, Workload, WorkloadSession } from './workload.js';

const TABLE = 'docs';
const IN = 'body';
const OUT = 'copy';
/** A change not processed within this long fails its step. */
const STEP_TIMEOUT_MS = 30_000;
/** Latency-tuned polling: an idle worker looks for new notifications every 10 ms at most. */
const IDLE_POLL_MS = 10;

/** Test hooks: where each latency sample starts and ends. */
export interface ObserverHooks {
  /** The writer's commit of `row` has resolved, at `at` (performance.now()): a sample's start. */
  writerCommitted?(row: string, at: number): void | Promise<void>;
  /** One latency sample: `from` is the writer's commit, `to` the observer's commit. */
  sample?(row: string, from: number, to: number): void;
}

/**
 * The observer pipeline, closed loop: each client writes an observed cell (a new row, so
 * no collapsing) and waits until an observer run has copied it. Throughput is changes
 * processed end to end per second; latency is notification latency, from the moment the
 * writer's commit resolved (its commit timestamp known) to the moment the observer's
 * transaction committed (the worker's onRun); 0 when the observer committed before the
 * writer's commit call returned. Observer runs per second are counted separately. Round
 * trips include the writer's transaction, the worker's index scans and leases, and the
 * observer's transaction.
 *
 * (measureObserverLatency, observer-latency.ts, measures the same interval, but as a paced, fixed-count
 * run with no per-cell window, round-trip counts or exactly-once check, so it is not reused.)
 */
export class ObserverSession implements WorkloadSession {
  private readonly writer: Percolator;
  private readonly workerClient: Percolator;
  private readonly worker: ObserverWorker;
  /** Per row being waited for: resolves with the time its observer run committed. */
  private readonly waiting = new Map<string, (observedAt: number) => void>();
  private readonly runs = new Map<string, number>();
  private readonly written = new Map<string, string>();
  private readonly failures: string[] = [];
  private readonly prefix = randomBytes(4).toString('hex');
  /**
   * The engine's own table: with `--rounds`, the cells of every Percolator engine (plain,
   * traced) run side by side on one store, each session's worker running all along. On one
   * shared table each worker took the other's changes, and the other's steps waited in vain.
   */
  private readonly table: string;

  constructor(
    engine: PercolatorEngine,
    concurrency: number,
    private readonly valueBytes: number,
    private readonly hooks: ObserverHooks = {},
  ) {
    const base = { ...engine.clientOptions, store: engine.store };
    const table = engine.tablePrefix + TABLE;
    this.table = table;
    this.writer = new Percolator({ ...base, observedColumns: [{ table, column: IN }] });
    this.workerClient = new Percolator(base);
    const observer: Observer = {
      name: `${engine.tablePrefix}bench-copy`,
      table,
      column: IN,
      handler: async (tx, { row }) => {
        tx.set(table, row, OUT, (await tx.getString(table, row, IN)) ?? '');
      },
    };
    this.worker = this.workerClient.worker({
      observers: [observer],
      concurrency,
      idlePollMs: IDLE_POLL_MS,
      // Called after the run's transaction committed.
      onRun: (event) => {
        const observedAt = performance.now();
        this.runs.set(event.row, (this.runs.get(event.row) ?? 0) + 1);
        this.waiting.get(event.row)?.(observedAt);
      },
      onError: (error) => {
        if (this.failures.length < 5) this.failures.push(String(error));
      },
    });
    this.worker.start();
  }

  observerRuns(): number {
    return this.worker.stats.runs;
  }

  step(index: number): Step {
    let seq = 0;
    return async () => {
      seq++;
      const row = `${this.prefix}/${index}/${seq}`;
      const value = encodeValue(seq, this.valueBytes);
      let timer: NodeJS.Timeout | undefined;
      // Registered before the write: the observer may commit before transact() returns here.
      const processed = new Promise<number | undefined>((resolve) => {
        this.waiting.set(row, resolve);
        timer = setTimeout(() => resolve(undefined), STEP_TIMEOUT_MS);
      });
      let attempts = 0;
      try {
        await this.writer.transact(async (tx) => {
          attempts++;
          tx.set(this.table, row, IN, value);
        });
        const committedAt = performance.now();
        this.written.set(row, value);
        await this.hooks.writerCommitted?.(row, committedAt);
        const observedAt = await processed;
        if (observedAt === undefined) {
          throw new TxFailure(
            'error',
            attempts,
            new Error(`no observer run for ${row} within ${STEP_TIMEOUT_MS} ms`),
          );
        }
        this.hooks.sample?.(row, committedAt, observedAt);
        return { attempts, latencyMs: Math.max(0, observedAt - committedAt) };
      } catch (error) {
        throw error instanceof TxFailure ? error : new TxFailure('error', Math.max(1, attempts), error);
      } finally {
        clearTimeout(timer);
        this.waiting.delete(row);
      }
    };
  }

  /** Every change was processed exactly once and the copy matches the newest value. */
  async verify(): Promise<CheckOutcome> {
    try {
      await this.worker.runUntilIdle({ timeoutMs: STEP_TIMEOUT_MS });
    } catch (error) {
      return { ok: false, detail: `observers did not drain: ${String(error)}` };
    }
    const rows = [...this.written.keys()];
    const copies = await this.writer.transact((tx) =>
      Promise.all(rows.map((row) => tx.getString(this.table, row, OUT))),
    );
    for (const [i, row] of rows.entries()) {
      if (copies[i] !== this.written.get(row))
        return { ok: false, detail: `${row}: copy is ${copies[i]}, expected the body` };
      const runs = this.runs.get(row) ?? 0;
      if (runs !== 1) return { ok: false, detail: `${row}: ${runs} committed observer runs for one change` };
    }
    const stats = this.worker.stats;
    return {
      ok: true,
      detail:
        `${rows.length} changes each processed exactly once (${stats.conflicts} run conflicts, ` +
        `${stats.leaseBusy} lease waits${this.failures.length > 0 ? `, errors: ${this.failures.join('; ')}` : ''})`,
    };
  }

  async close(): Promise<void> {
    await this.worker.stop();
    await this.workerClient.close();
    await this.writer.close();
  }
}

export const observerPipeline: Workload = {
  name: 'observers',
  description:
    'observer pipeline: write an observed cell, wait until an observer run has processed it; ' +
    "latency from the writer's commit to the observer's commit",
  modes: ['percolator'],
  check: 'session',
  rowsPerTxn: () => 1,
  unsupported(engine: Engine) {
    if (!(engine instanceof PercolatorEngine)) return 'observers run through Percolator only';
    return engine.store.capabilities.notificationIndex ? undefined : 'the store has no notification index';
  },
  worker() {
    throw new Error('the observer pipeline runs through its session');
  },
  async session(engine, { concurrency, shape }) {
    return new ObserverSession(engine as PercolatorEngine, concurrency, shape.valueBytes);
  },
};
