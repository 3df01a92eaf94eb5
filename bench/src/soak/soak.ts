/**
 * The soak run (issue 16): against one backend, for a long time and at a modest rate,
 * concurrently
 *
 * - transfers between accounts, with the total checked at every sample (conservation);
 * - list-append transactions (the conformance suite's workload), checked with its
 *   snapshot-isolation history checker one window at a time: a window is `windowTxns`
 *   transactions, then a read of every list, the check, and one transaction that empties
 *   every list. So the checker's input and the lists stay bounded however long the run;
 *   the next window's reads must start from the emptied lists (anything else is an
 *   anomaly), and values stay unique across windows;
 * - an observer with a worker: writers count up an observed cell, the observer copies the
 *   count and counts its own runs; at the end every row's copy must equal its count, the
 *   count the writers' committed increments, and runs at most one per change;
 * - gc: every client prunes with `gc.retentionMs`, and every `gcIntervalMs` a pass runs
 *   `db.gc` (prune to that policy now, then tidy) on every row the soak writes;
 *
 * and samples metrics every `intervalMs`. It fails when a check fails, an unexpected error
 * is thrown, a workload stops committing, or a metric grows without bound (growth.ts).
 */
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  type CheckResult,
  checkListAppend,
  describeCheck,
  LIST_COLUMN,
  type ListAppendMop,
  type ListAppendOp,
  listCell,
  parseList,
  Random,
  readAllLists,
  runListAppend,
} from '@percolator/conformance';
import {
  CommitUnknownError,
  ConflictError,
  isRetryable,
  LockNotResolvedError,
  type ObserverWorker,
  Percolator,
  type RowRef,
  type RowStore,
  SnapshotTooOldError,
  StoreError,
} from '@percolator/core';
import { type OpenBackend, openBackend } from '../backends.js';
import { PercolatorEngine } from '../engines/percolator.js';
import { clusterLease, SharedServices } from '../services.js';
import { GROWTH_BOUNDS, type GrowthVerdict, judgeGrowth } from './growth.js';
import type { SoakOptions } from './options.js';
import {
  activeResources,
  type ConnectionProbe,
  historyMethod,
  historySize,
  mysqlAdmin,
  mysqlConnections,
  pendingNotifications,
  postgresConnections,
  redisConnections,
  sumProbes,
} from './probes.js';

const ACCOUNTS = 'soak_accounts';
const BALANCE = 'balance';
const INITIAL_BALANCE = 1000;
const OBSERVED = 'soak_obs';
const COUNT = 'n';
const SEEN = 'seen';
const RUNS = 'runs';
/** List-append transactions read or append to 1..MAX_OPS lists. */
const MAX_OPS = 4;
/** How long the observers get to drain at the end. */
const DRAIN_TIMEOUT_MS = 120_000;
/** Anomaly descriptions kept for the report. */
const MAX_KEPT = 10;

export type WorkloadName = 'transfers' | 'lists' | 'observerWrites' | 'observerRuns';
export const WORKLOADS: readonly WorkloadName[] = ['transfers', 'lists', 'observerWrites', 'observerRuns'];

export interface SoakSample {
  /** Ms since the workloads started. */
  readonly t: number;
  /** Commits in this interval, per workload. */
  readonly commits: Record<WorkloadName, number>;
  /** Commits per second in this interval, per workload. */
  readonly perSecond: Record<WorkloadName, number>;
  readonly heapUsedBytes: number;
  readonly rssBytes: number;
  /** Server-side connections of the soak's store clients (NaN where not measurable). */
  readonly connections: number;
  /** This process's open TCP connections. */
  readonly sockets: number;
  readonly handles: number;
  readonly timers: number;
  readonly resources: Record<string, number>;
  readonly pendingNotifications: number;
  readonly historyRows: number;
  readonly historyBytes: number;
  readonly headRows: number;
  readonly headBytes: number;
  readonly versionRows: number;
  readonly versionBytes: number;
  /** Total of the accounts at this sample (must never change). */
  readonly total?: number;
  /** Ms this sample took to take (its reads go to the store like any client's). */
  readonly sampleMs: number;
}

export interface SoakReport {
  readonly backend: string;
  readonly target: string;
  readonly namespace: string;
  readonly seed: number;
  readonly options: Omit<SoakOptions, 'help' | 'json' | 'out'>;
  readonly startedAt: string;
  readonly finishedAt: string;
  /** Wall ms the workloads ran. */
  readonly ranMs: number;
  readonly interrupted?: string;
  readonly measures: { readonly connections: string; readonly history: string; readonly heap: string };
  readonly totals: Record<WorkloadName, number>;
  readonly samples: readonly SoakSample[];
  readonly checks: {
    readonly transfers: {
      readonly commits: number;
      readonly unknown: number;
      readonly gaveUp: number;
      readonly conservationChecks: number;
      readonly conservationSkipped: number;
      readonly violations: readonly string[];
    };
    readonly lists: {
      readonly windows: number;
      readonly ok: number;
      readonly failed: number;
      readonly unknown: number;
      readonly anomalies: readonly string[];
      /** Write skew (G2-item) found: allowed under snapshot isolation, information only. */
      readonly allowedWindows: number;
      readonly largestWindow: number;
    };
    readonly observers: {
      readonly writes: number;
      readonly unknownWrites: number;
      readonly runs: number;
      readonly conflicts: number;
      readonly failures: number;
      readonly drained: boolean;
      readonly problems: readonly string[];
    };
    readonly gc: {
      /** Whole passes over every row, and rows collected (a pass cut short by the end counts its rows). */
      readonly passes: number;
      readonly rows: number;
      /** Write records dropped from head rows, version rows deleted, and their bytes (db.gc). */
      readonly versions: number;
      readonly headBytes: number;
      readonly versionRows: number;
      readonly versionRowBytes: number;
      readonly errors: number;
    };
    readonly errors: readonly string[];
  };
  readonly growth: readonly GrowthVerdict[];
  readonly failures: readonly string[];
  readonly ok: boolean;
}

export interface SoakDeps {
  /** Stops the run early (SIGINT/SIGTERM): the final checks still run. */
  readonly signal?: AbortSignal;
  /** Told after every sample (progress lines). */
  readonly onSample?: (sample: SoakSample, report: { elapsedMs: number }) => void;
  readonly log?: (line: string) => void;
}

/** Paces starts to `perSecond` over all callers; stops pacing once released. */
class Pacer {
  private next = 0;
  private released = false;

  constructor(private readonly perSecond: number) {}

  async take(): Promise<void> {
    if (this.perSecond <= 0 || this.released) return;
    const now = performance.now();
    const at = Math.max(now, this.next);
    this.next = at + 1000 / this.perSecond;
    if (at > now) await sleep(at - now);
  }

  release(): void {
    this.released = true;
  }
}

const message = (error: unknown) =>
  error instanceof Error ? `${error.name}: ${error.message}` : String(error);

/** Sorts a failed transaction's error, as the conformance suite does; undefined: not expected at all. */
function outcomeOf(error: unknown): 'fail' | 'info' | undefined {
  if (error instanceof CommitUnknownError) return 'info';
  if (error instanceof StoreError) return error.applied === 'no' ? 'fail' : 'info';
  if (error instanceof ConflictError || error instanceof LockNotResolvedError) return 'fail';
  if (error instanceof SnapshotTooOldError) return 'fail';
  return undefined;
}

interface Store {
  readonly backend: OpenBackend;
  readonly store: RowStore;
  readonly namespace: string;
  readonly connections?: ConnectionProbe;
  readonly close: () => Promise<void>;
}

/**
 * Opens the backend through the bench's backend list, with its connections made
 * countable: PostgreSQL's by the adapter's application_name, MySQL's by running in a
 * database of its own, Redis's by a connection name in the URL.
 */
async function openSoakStore(options: SoakOptions, services: SharedServices): Promise<Store> {
  const runId = randomBytes(4).toString('hex');
  const name = options.backend;
  const restore: [string, string | undefined][] = [];
  const setEnv = (key: string, value: string) => {
    restore.push([key, process.env[key]]);
    process.env[key] = value;
  };
  const cleanups: (() => Promise<void>)[] = [];
  const probes: ConnectionProbe[] = [];
  let mysqlDatabase: string | undefined;
  let mysqlUrl: string | undefined;
  try {
    if (name === 'mysql') {
      const my = await import('@percolator/mysql');
      mysqlUrl = my.resolveMySqlUrl();
      mysqlDatabase = `soak_${runId}`;
      await mysqlAdmin(mysqlUrl, [`CREATE DATABASE \`${mysqlDatabase}\``]);
      const url = new URL(mysqlUrl);
      url.pathname = `/${mysqlDatabase}`;
      setEnv('PERCOLATOR_MYSQL_URL', url.href);
    }
    if (name === 'redis-cluster' && !process.env.PERCOLATOR_REDIS_CLUSTER_NODES) {
      // The local cluster is shared with test runs: hold a lease so none stops it under us.
      await clusterLease('acquire');
      cleanups.push(() => clusterLease('release'));
    }
    const redisName = `soak_${runId}`;
    let redisUrl: string | undefined;
    if (name === 'redis' || name === 'mixed') {
      const redis = await import('@percolator/redis');
      redisUrl = redis.defaultRedisUrl();
      const url = new URL(redisUrl);
      url.searchParams.set('connectionName', redisName);
      setEnv('PERCOLATOR_REDIS_URL', url.href);
    }
    const backend = await openBackend(name, {
      runId,
      maxConcurrency: options.concurrency * 3,
      maxAttempts: 10,
      startServices: true,
      services,
    });
    const namespace = name === 'mixed' ? `bench_${runId}_mixed` : `bench_${runId}`;
    cleanups.push(() => backend.close());
    if (name === 'postgres' || name === 'mixed') {
      const pg = await import('@percolator/postgres');
      probes.push(await postgresConnections(pg.resolvePostgresUrl(), namespace));
    }
    if (name === 'mysql') probes.push(await mysqlConnections(mysqlUrl!, mysqlDatabase!));
    if (redisUrl !== undefined) probes.push(await redisConnections(redisUrl, redisName));
    const engine = backend.engines.find((e): e is PercolatorEngine => e instanceof PercolatorEngine);
    if (!engine) throw new Error(`${name}: the backend opened no Percolator engine`);
    const connections =
      probes.length === 0 ? undefined : probes.length === 1 ? probes[0]! : sumProbes(probes);
    return {
      backend,
      store: engine.store,
      namespace,
      ...(connections ? { connections } : {}),
      close: async () => {
        const failures: string[] = [];
        for (const step of [
          () => connections?.close() ?? Promise.resolve(),
          ...cleanups.reverse(),
          async () => {
            if (mysqlDatabase) await mysqlAdmin(mysqlUrl!, [`DROP DATABASE IF EXISTS \`${mysqlDatabase}\``]);
          },
        ]) {
          try {
            await step();
          } catch (error) {
            failures.push(message(error));
          }
        }
        if (failures.length > 0) throw new Error(`cleanup failed: ${failures.join('; ')}`);
      },
    };
  } catch (error) {
    for (const p of probes) await p.close().catch(() => {});
    for (const step of cleanups.reverse()) await step().catch(() => {});
    if (mysqlDatabase)
      await mysqlAdmin(mysqlUrl!, [`DROP DATABASE IF EXISTS \`${mysqlDatabase}\``]).catch(() => {});
    throw error;
  } finally {
    for (const [key, value] of restore.reverse()) {
      if (value === undefined) delete process.env[key];
      else process.env[key] = value;
    }
  }
}

/** Full GC (when the process runs with --expose-gc), then heap used: the live set. */
function heapUsed(): number {
  (globalThis as { gc?: () => void }).gc?.();
  return process.memoryUsage().heapUsed;
}

export async function runSoak(options: SoakOptions, deps: SoakDeps = {}): Promise<SoakReport> {
  const log = deps.log ?? (() => {});
  const services = new SharedServices();
  const startedAt = new Date();
  let opened: Store;
  try {
    opened = await openSoakStore(options, services);
  } catch (error) {
    await services.stop().catch(() => {});
    throw error;
  }
  const { store } = opened;
  log(
    `soak: ${options.backend} at ${opened.backend.target}, namespace ${opened.namespace}, seed ${options.seed}`,
  );
  const random = new Random(options.seed);
  const gc = { retentionMs: options.retentionMs };
  const client = (extra: Partial<ConstructorParameters<typeof Percolator>[0]> = {}) =>
    new Percolator({ store, gc, ...extra });
  const transferDb = client();
  const listDb = client();
  const writerDb = client({ observedColumns: [{ table: OBSERVED, column: COUNT }] });
  const workerDb = client();
  const checkDb = client();
  const clients = [transferDb, listDb, writerDb, workerDb, checkDb];

  const accounts = Array.from({ length: options.accounts }, (_, i) => `a${i}`);
  const observedRows = Array.from({ length: options.observedRows }, (_, i) => `o${i}`);
  const listKeys = Array.from({ length: options.lists }, (_, i) => `k${i}`);
  const allRows: RowRef[] = [
    ...accounts.map((key) => ({ table: ACCOUNTS, key })),
    ...listKeys.map((k) => {
      const [table, key] = listCell(k);
      return { table, key };
    }),
    ...observedRows.map((key) => ({ table: OBSERVED, key })),
  ];

  const totals: Record<WorkloadName, number> = { transfers: 0, lists: 0, observerWrites: 0, observerRuns: 0 };
  const errors: string[] = [];
  const unexpected = (where: string, error: unknown) => {
    if (errors.length < MAX_KEPT) errors.push(`${where}: ${message(error)}`);
    else if (errors.length === MAX_KEPT) errors.push('(more errors not kept)');
  };
  const transfers = {
    commits: 0,
    unknown: 0,
    gaveUp: 0,
    conservationChecks: 0,
    conservationSkipped: 0,
    violations: [] as string[],
  };
  const lists = {
    windows: 0,
    ok: 0,
    failed: 0,
    unknown: 0,
    anomalies: [] as string[],
    allowedWindows: 0,
    largestWindow: 0,
  };
  const observers = {
    writes: 0,
    unknownWrites: 0,
    runs: 0,
    conflicts: 0,
    failures: 0,
    drained: false,
    problems: [] as string[],
  };
  const gcStats = {
    passes: 0,
    rows: 0,
    versions: 0,
    headBytes: 0,
    versionRows: 0,
    versionRowBytes: 0,
    errors: 0,
  };
  const samples: SoakSample[] = [];
  let stopping = false;
  let interrupted: string | undefined;
  const pacers = {
    transfers: new Pacer(options.rate),
    lists: new Pacer(options.rate),
    writes: new Pacer(options.rate),
  };

  // Load: every account with the initial balance, every observed row at 0. Nothing else
  // runs yet and the writes are blind, so an attempt whose outcome is unknown is simply
  // made again.
  const load = async (what: string, fn: () => Promise<void>) => {
    for (let attempt = 1; ; attempt++) {
      try {
        return await fn();
      } catch (error) {
        if (attempt >= 10 || (outcomeOf(error) === undefined && !isRetryable(error)))
          throw new Error(`loading ${what}: ${message(error)}`, { cause: error });
        await sleep(500 * attempt);
      }
    }
  };
  await load('the accounts', () =>
    transferDb.transact(async (tx) => {
      for (const a of accounts) tx.set(ACCOUNTS, a, BALANCE, String(INITIAL_BALANCE));
    }),
  );
  await load('the observed rows', () =>
    writerDb.transact(async (tx) => {
      for (const o of observedRows) tx.set(OBSERVED, o, COUNT, '0');
    }),
  );
  const expectedTotal = options.accounts * INITIAL_BALANCE;

  // Transfers.
  const transferWorker = async (w: number) => {
    const r = random.fork(`transfer ${w}`);
    while (!stopping) {
      await pacers.transfers.take();
      if (stopping) break;
      const from = r.int(accounts.length);
      const to = (from + 1 + r.int(accounts.length - 1)) % accounts.length;
      const amount = r.between(1, 10);
      try {
        await transferDb.transact(async (tx) => {
          const [a, b] = await Promise.all([
            tx.getString(ACCOUNTS, accounts[from]!, BALANCE),
            tx.getString(ACCOUNTS, accounts[to]!, BALANCE),
          ]);
          const x = Number(a);
          const y = Number(b);
          if (!Number.isSafeInteger(x) || !Number.isSafeInteger(y) || a === undefined || b === undefined)
            throw new Error(`a balance is not an integer: ${a} / ${b}`);
          tx.set(ACCOUNTS, accounts[from]!, BALANCE, String(x - amount));
          tx.set(ACCOUNTS, accounts[to]!, BALANCE, String(y + amount));
        });
        transfers.commits++;
        totals.transfers++;
      } catch (error) {
        const outcome = outcomeOf(error);
        if (outcome === 'info') transfers.unknown++;
        else if (outcome === 'fail' || isRetryable(error)) transfers.gaveUp++;
        else unexpected('transfer', error);
      }
    }
  };

  /** The accounts' total in one snapshot, or undefined when the read could not get through. */
  const readTotal = async (): Promise<number | undefined> => {
    try {
      const tx = await checkDb.begin();
      try {
        const values = await Promise.all(accounts.map((a) => tx.getString(ACCOUNTS, a, BALANCE)));
        let sum = 0;
        for (const [i, v] of values.entries()) {
          const n = Number(v);
          if (v === undefined || !Number.isSafeInteger(n)) {
            transfers.violations.push(`${accounts[i]} holds ${JSON.stringify(v)}`);
            return Number.NaN;
          }
          sum += n;
        }
        return sum;
      } finally {
        await tx.rollback();
      }
    } catch (error) {
      if (outcomeOf(error) === undefined && !isRetryable(error)) unexpected('conservation check', error);
      return undefined;
    }
  };
  const checkConservation = async (): Promise<number | undefined> => {
    const total = await readTotal();
    if (total === undefined) {
      transfers.conservationSkipped++;
      return undefined;
    }
    transfers.conservationChecks++;
    if (total !== expectedTotal && transfers.violations.length < MAX_KEPT)
      transfers.violations.push(`total ${total}, expected ${expectedTotal}`);
    return total;
  };

  /** Retries a check's read until it gets through (bounded). */
  const settled = async <T>(what: string, fn: () => Promise<T>): Promise<T> => {
    for (let attempt = 1; ; attempt++) {
      try {
        return await fn();
      } catch (error) {
        if (attempt >= 50 || (outcomeOf(error) === undefined && !isRetryable(error))) {
          throw new Error(`${what}: ${message(error)}`, { cause: error });
        }
        await sleep(Math.min(2000, 50 * attempt));
      }
    }
  };

  // List-append, one checked window at a time.
  const listLoop = async () => {
    let nextValue = 1;
    while (!stopping) {
      const windowRandom = random.fork(`window ${lists.windows}`);
      const run = await runListAppend({
        clients: [listDb],
        workers: options.concurrency,
        transactions: options.windowTxns,
        keys: options.lists,
        maxOps: MAX_OPS,
        random: windowRandom,
        firstValue: nextValue,
        pace: () => pacers.lists.take(),
        onRecord: (op) => {
          if (op.type === 'ok') totals.lists++;
        },
        outcomeOf: (error) => {
          const outcome = outcomeOf(error);
          if (outcome !== undefined) return outcome;
          unexpected('list-append', error);
          return 'info';
        },
      });
      const history: ListAppendOp[] = run.history;
      for (const op of history) {
        for (const m of op.txn) if (m.f === 'append' && m.value >= nextValue) nextValue = m.value + 1;
        if (op.type === 'ok') lists.ok++;
        else if (op.type === 'fail') lists.failed++;
        else lists.unknown++;
      }
      // The final state of every list closes the window's history.
      const finalInvoke = performance.now();
      const final = await settled('reading the lists', () =>
        checkDb.transact((tx) => readAllLists(tx, options.lists)),
      );
      const result = checkWindow(history, final, { invoke: finalInvoke, complete: performance.now() });
      lists.windows++;
      lists.largestWindow = Math.max(lists.largestWindow, history.length + 1);
      if (!result.valid && lists.anomalies.length < MAX_KEPT)
        lists.anomalies.push(`window ${lists.windows}: ${describeCheck(result)}`);
      if (result.allowed.length > 0) lists.allowedWindows++;
      // Empty every list for the next window, and make sure they are.
      await settled('emptying the lists', async () => {
        for (;;) {
          await checkDb
            .transact(async (tx) => {
              for (const k of listKeys) {
                const [table, row] = listCell(k);
                tx.set(table, row, LIST_COLUMN, '[]');
              }
            })
            .catch((error) => {
              if (!(error instanceof CommitUnknownError)) throw error;
            });
          const now = await checkDb.transact((tx) =>
            Promise.all(
              listKeys.map((k) => {
                const [table, row] = listCell(k);
                return tx.getString(table, row, LIST_COLUMN);
              }),
            ),
          );
          if (now.every((v) => parseList(v).length === 0)) return;
        }
      });
    }
  };

  // Observers: writers count up; the observer copies the count and counts its runs.
  const committedCounts = new Map<string, number>();
  const uncertainRows = new Set<string>();
  const worker: ObserverWorker = workerDb.worker({
    observers: [
      {
        name: 'soak-count',
        table: OBSERVED,
        column: COUNT,
        handler: async (tx, { row }) => {
          const [n, runs] = await Promise.all([
            tx.getString(OBSERVED, row, COUNT),
            tx.getString(OBSERVED, row, RUNS),
          ]);
          tx.set(OBSERVED, row, SEEN, n ?? '');
          tx.set(OBSERVED, row, RUNS, String(Number(runs ?? '0') + 1));
        },
      },
    ],
    concurrency: options.concurrency,
    onRun: () => {
      totals.observerRuns++;
    },
    onError: (error) => {
      if (outcomeOf(error) === undefined && !isRetryable(error)) unexpected('observer', error);
    },
  });
  worker.start();
  const writerWorker = async (w: number) => {
    const r = random.fork(`writer ${w}`);
    while (!stopping) {
      await pacers.writes.take();
      if (stopping) break;
      const row = r.pick(observedRows);
      try {
        await writerDb.transact(async (tx) => {
          const n = Number(await tx.getString(OBSERVED, row, COUNT));
          if (!Number.isSafeInteger(n)) throw new Error(`${row} holds a count that is not an integer`);
          tx.set(OBSERVED, row, COUNT, String(n + 1));
        });
        committedCounts.set(row, (committedCounts.get(row) ?? 0) + 1);
        observers.writes++;
        totals.observerWrites++;
      } catch (error) {
        const outcome = outcomeOf(error);
        if (outcome === 'info') {
          observers.unknownWrites++;
          uncertainRows.add(row);
        } else if (outcome !== 'fail' && !isRetryable(error)) unexpected('observer write', error);
      }
    }
  };

  // GC: a db.gc pass (prune to the retention policy now, then tidy) over every row the soak writes.
  const gcPass = async () => {
    for (const { table, key } of allRows) {
      if (stopping) return;
      try {
        const report = await checkDb.gc(table, { row: key });
        gcStats.rows++;
        gcStats.versions += report.versions;
        gcStats.headBytes += report.headBytes;
        gcStats.versionRows += report.versionRows;
        gcStats.versionRowBytes += report.versionRowBytes;
      } catch (error) {
        gcStats.errors++;
        if (outcomeOf(error) === undefined && !isRetryable(error)) unexpected('gc', error);
      }
    }
    gcStats.passes++;
  };
  const gcLoop = async () => {
    while (!stopping) {
      await waitOrStop(options.gcIntervalMs);
      if (!stopping) await gcPass();
    }
  };

  let wake: (() => void) | undefined;
  const waitOrStop = (ms: number) =>
    new Promise<void>((resolve) => {
      const timer = setTimeout(() => {
        stopWaiters.delete(done);
        resolve();
      }, ms);
      const done = () => {
        clearTimeout(timer);
        resolve();
      };
      stopWaiters.add(done);
    });
  const stopWaiters = new Set<() => void>();
  const stop = (why?: string) => {
    if (stopping) return;
    stopping = true;
    if (why) interrupted = why;
    for (const p of Object.values(pacers)) p.release();
    for (const w of stopWaiters) w();
    stopWaiters.clear();
    wake?.();
  };
  const onAbort = () => stop(String(deps.signal?.reason ?? 'aborted'));
  if (deps.signal?.aborted) onAbort();
  deps.signal?.addEventListener('abort', onAbort, { once: true });

  // Sampling.
  const t0 = performance.now();
  let last = { ...totals };
  let lastT = 0;
  const sample = async (): Promise<SoakSample> => {
    const t = performance.now() - t0;
    const commits = {} as Record<WorkloadName, number>;
    const perSecond = {} as Record<WorkloadName, number>;
    for (const w of WORKLOADS) {
      commits[w] = totals[w] - last[w];
      perSecond[w] = t > lastT ? (commits[w] * 1000) / (t - lastT) : 0;
    }
    last = { ...totals };
    lastT = t;
    // The store-side figures are read concurrently: on a slow store a sample stays short.
    const [total, connections, storeSide] = await Promise.all([
      checkConservation(),
      (async () => {
        try {
          return opened.connections ? await opened.connections.count() : Number.NaN;
        } catch (error) {
          log(`connection count failed: ${message(error)}`);
          return Number.NaN;
        }
      })(),
      (async () => {
        try {
          const [pending, size] = await Promise.all([
            pendingNotifications(store, OBSERVED),
            historySize(store, allRows),
          ]);
          return { pending, size };
        } catch (error) {
          if (outcomeOf(error) === undefined && !isRetryable(error)) unexpected('sampling', error);
          return undefined;
        }
      })(),
    ]);
    const pending = storeSide?.pending ?? Number.NaN;
    const size = storeSide?.size ?? {
      headRows: Number.NaN,
      headBytes: Number.NaN,
      versionRows: Number.NaN,
      versionBytes: Number.NaN,
    };
    const resources = activeResources();
    const s: SoakSample = {
      t: Math.round(t),
      sampleMs: Math.round(performance.now() - t0 - t),
      commits,
      perSecond,
      heapUsedBytes: heapUsed(),
      rssBytes: process.memoryUsage().rss,
      connections,
      sockets: resources.sockets,
      handles: resources.handles,
      timers: resources.timers,
      resources: resources.byType,
      pendingNotifications: pending,
      historyRows: size.headRows + size.versionRows,
      historyBytes: size.headBytes + size.versionBytes,
      ...size,
      ...(total !== undefined ? { total } : {}),
    };
    samples.push(s);
    deps.onSample?.(s, { elapsedMs: t });
    return s;
  };

  await sample();
  const running = [
    ...Array.from({ length: options.concurrency }, (_, w) => transferWorker(w)),
    ...Array.from({ length: options.concurrency }, (_, w) => writerWorker(w)),
    listLoop(),
    gcLoop(),
  ].map((p) =>
    p.catch((error) => {
      unexpected('workload', error);
    }),
  );
  const deadline = t0 + options.durationMs;
  while (!stopping) {
    const next = t0 + samples.length * options.intervalMs;
    const until = Math.min(next, deadline);
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, Math.max(0, until - performance.now()));
      wake = () => {
        clearTimeout(timer);
        resolve();
      };
    });
    wake = undefined;
    if (stopping) break;
    if (performance.now() >= deadline - 1) {
      stop();
      break;
    }
    await sample();
  }
  const ranMs = performance.now() - t0;
  log(`soak: stopping after ${Math.round(ranMs / 1000)} s; final checks`);
  await Promise.all(running);

  // Final checks: observers drain, counts match; money is conserved.
  try {
    await worker.runUntilIdle({ timeoutMs: DRAIN_TIMEOUT_MS });
    observers.drained = true;
  } catch (error) {
    observers.problems.push(`observers did not drain within ${DRAIN_TIMEOUT_MS} ms: ${message(error)}`);
  }
  await worker.stop();
  Object.assign(observers, {
    runs: worker.stats.runs,
    conflicts: worker.stats.conflicts,
    failures: worker.stats.failures,
  });
  try {
    const rows = await settled('reading the observed rows', () =>
      checkDb.transact((tx) =>
        Promise.all(
          observedRows.map(async (row) => ({
            row,
            n: await tx.getString(OBSERVED, row, COUNT),
            seen: await tx.getString(OBSERVED, row, SEEN),
            runs: await tx.getString(OBSERVED, row, RUNS),
          })),
        ),
      ),
    );
    for (const { row, n, seen, runs } of rows) {
      const problem = (what: string) => {
        if (observers.problems.length < MAX_KEPT) observers.problems.push(`${row}: ${what}`);
      };
      const count = Number(n);
      const runCount = Number(runs ?? '0');
      const committed = committedCounts.get(row) ?? 0;
      if (!uncertainRows.has(row) && count !== committed)
        problem(`count ${n}, but ${committed} increments committed`);
      if (observers.drained && seen !== n) problem(`observer saw ${JSON.stringify(seen)}, count is ${n}`);
      // The load's write of 0 is a change too.
      if (runCount > count + 1) problem(`${runCount} observer runs for ${count + 1} changes`);
      if (observers.drained && runCount < 1) problem('written, but no observer run');
    }
  } catch (error) {
    observers.problems.push(message(error));
  }
  const finalTotal = await settled('reading the accounts', async () => {
    const total = await readTotal();
    if (total === undefined) throw new LockNotResolvedError('retry the final total');
    return total;
  }).catch((error) => {
    unexpected('final conservation check', error);
    return undefined;
  });
  if (finalTotal !== undefined) {
    transfers.conservationChecks++;
    if (finalTotal !== expectedTotal)
      transfers.violations.push(`final total ${finalTotal}, expected ${expectedTotal}`);
  }
  deps.signal?.removeEventListener('abort', onAbort);

  for (const db of clients) await db.close().catch((error) => unexpected('closing a client', error));
  await opened.close().catch((error) => unexpected('cleanup', error));
  await services.stop().catch((error) => unexpected('stopping services', error));

  const growth = judgeMetrics(samples, options.warmupMs, options.observedRows);
  const checks = { transfers, lists, observers, gc: gcStats, errors };
  const failures = soakFailures({
    checks,
    growth,
    samples,
    ranMs,
    totals,
    ...(interrupted ? { interrupted } : {}),
  });

  const { help: _h, json: _j, out: _o, ...shown } = options;
  return {
    backend: options.backend,
    target: opened.backend.target,
    namespace: opened.namespace,
    seed: options.seed,
    options: shown,
    startedAt: startedAt.toISOString(),
    finishedAt: new Date().toISOString(),
    ranMs: Math.round(ranMs),
    ...(interrupted ? { interrupted } : {}),
    measures: {
      connections: opened.connections
        ? `${opened.connections.describe}; sockets: this process's TCPSocketWrap/TLSWrap handles`
        : "no server-side count for this store: this process's TCPSocketWrap/TLSWrap handles (sockets)",
      history: historyMethod(store),
      heap: (globalThis as { gc?: unknown }).gc
        ? 'heapUsed after a full GC (node --expose-gc)'
        : 'heapUsed (no --expose-gc: includes garbage not yet collected)',
    },
    totals,
    samples,
    checks,
    growth,
    failures,
    ok: failures.length === 0,
  };
}

/** The metrics the growth rule judges; connections only where the server can count them. */
export function judgeMetrics(
  samples: readonly SoakSample[],
  warmupMs: number,
  observedRows: number,
): GrowthVerdict[] {
  const metrics: (keyof SoakSample & keyof typeof GROWTH_BOUNDS)[] = [
    'heapUsedBytes',
    'rssBytes',
    'connections',
    'handles',
    'timers',
    'pendingNotifications',
    'historyBytes',
    'historyRows',
  ];
  const verdicts: GrowthVerdict[] = [];
  for (const metric of metrics) {
    const series = samples.map((s) => ({ t: s.t, value: s[metric] as number }));
    if (metric === 'connections' && series.every((s) => Number.isNaN(s.value))) continue;
    // The observed rows are a fixed set: an exact index lists at most that many, however
    // far the observer lags, so the slack is their number (the drain at the end is the
    // check that notifications are processed at all).
    const bound =
      metric === 'pendingNotifications' ? { ratio: 1, slack: observedRows } : GROWTH_BOUNDS[metric]!;
    verdicts.push(judgeGrowth(metric, series, warmupMs, bound));
  }
  verdicts.push(
    judgeGrowth(
      'sockets',
      samples.map((s) => ({ t: s.t, value: s.sockets })),
      warmupMs,
      GROWTH_BOUNDS.connections!,
    ),
  );
  return verdicts;
}

function fmt(n: number): string {
  if (!Number.isFinite(n)) return String(n);
  return Math.abs(n) >= 1000 ? Math.round(n).toLocaleString('en-US') : String(Math.round(n * 100) / 100);
}

/**
 * One list-append window's check: its history, closed by a read of every list, through the
 * conformance suite's checker. The window starts from emptied lists, so a value left from
 * an earlier window (an emptying that was lost) is a read of a value nobody appended here.
 * The final read must keep every committed append and everything a committed read saw
 * (finalRead); with its times, it must also see every commit acknowledged before it.
 */
export function checkWindow(
  history: readonly ListAppendOp[],
  finalRead: readonly ListAppendMop[],
  times: { readonly invoke?: number; readonly complete?: number } = {},
): CheckResult {
  return checkListAppend(
    [...history, { id: history.length, process: -1, type: 'ok', txn: finalRead, ...times }],
    { finalRead: true },
  );
}

export interface VerdictInput {
  readonly checks: SoakReport['checks'];
  readonly growth: readonly GrowthVerdict[];
  readonly samples: readonly SoakSample[];
  readonly ranMs: number;
  readonly totals: Record<WorkloadName, number>;
  readonly interrupted?: string;
}

/** Every reason the run fails; none means it passed. */
export function soakFailures({
  checks,
  growth,
  samples,
  ranMs,
  totals,
  interrupted,
}: VerdictInput): string[] {
  const { transfers, lists, observers, errors } = checks;
  const failures: string[] = [];
  for (const v of transfers.violations) failures.push(`conservation: ${v}`);
  for (const a of lists.anomalies) failures.push(`list-append: ${a}`);
  for (const p of observers.problems) failures.push(`observers: ${p}`);
  for (const e of errors) failures.push(`unexpected error: ${e}`);
  for (const v of growth) {
    if (v.grows)
      failures.push(
        `${v.metric} grows: last-third median ${fmt(v.lastMedian)} > limit ${fmt(v.limit)} ` +
          `(first-third median ${fmt(v.firstMedian)}), slope ${fmt(v.slopePerHour)}/h`,
      );
  }
  if (growth.every((v) => !v.judged))
    failures.push('no metric could be judged: too few samples after the warm-up');
  else {
    // Every metric is sampled together, so one left unjudged while others were had its
    // samples fail (NaN): a store-side figure that never sampled would pass unchecked.
    for (const v of growth) {
      if (!v.judged)
        failures.push(`${v.metric} could not be judged: too few of its samples succeeded after the warm-up`);
    }
  }
  if (transfers.conservationChecks === 0) failures.push('conservation was never checked');
  if (lists.windows === 0) failures.push('no list-append window was checked');
  // Liveness: every workload kept committing in the last third of the run.
  const lastThird = samples.filter((s) => s.t >= (ranMs * 2) / 3);
  if (!interrupted && lastThird.length > 0) {
    for (const w of WORKLOADS) {
      if (lastThird.reduce((sum, s) => sum + s.commits[w], 0) === 0)
        failures.push(`${w}: no commits in the last third of the run`);
    }
  }
  if (WORKLOADS.some((w) => totals[w] === 0))
    failures.push(`a workload committed nothing: ${JSON.stringify(totals)}`);
  return failures;
}
