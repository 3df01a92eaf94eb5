import { Percolator } from '@percolator/core';
import type { CountingStore } from './counting-store.js';
import { decodeValue, encodeValue } from './dataset.js';
import { type Engine, type LogicalTable, nativeKey, TxFailure } from './engines/engine.js';
import { COLUMN, PercolatorEngine } from './engines/percolator.js';
import { RAW_TABLE, RawEngine } from './engines/raw.js';
import { LatencyHistogram } from './histogram.js';
import { Ledger } from './ledger.js';
import { perSecond, round } from './metrics.js';
import { randomInt, seededRandom } from './random.js';
import type { CheckOutcome, HistoryRows } from './types.js';
import type {
  PrepareContext,
  Prepared,
  Step,
  Workload,
  WorkloadPrepare,
  WorkloadSession,
} from './workload.js';

/**
 * The history workload: hot cells carrying long histories, next to cells written once.
 *
 * Before its cells run, each backend gets `cells` fresh cells (one write of a 1 KB value
 * each) and `cells` long-history cells (`versions` single-row updates of 1 KB values each,
 * written by up to 8 clients at once, one per cell). The head row of each, the row every
 * protocol step reads and check-and-sets, is then read with `store.read(table, row)`: its
 * size is the figure, whatever the core keeps elsewhere. Then, as cells of their own:
 *
 * - `history-read-fresh` / `history-read-long`: a read transaction at a current snapshot of
 *   one fresh / long-history cell; raw: `store.read` of the same head row, no protocol.
 * - `history-write-long`: a blind write transaction of a new 1 KB value to one
 *   long-history cell (hot: a few cells, every client); raw: a check-and-set of a 1 KB
 *   value to a plain row per cell (raw rows hold only the value, whatever their history).
 *
 * Everything goes through the public RowStore and Percolator APIs only, so the figures
 * hold for any row layout.
 */

/** Values of the history cells: 1 KB, as in the figures. */
export const HISTORY_VALUE_BYTES = 1024;
/** Clients writing the long histories (one cell each at a time). */
export const HISTORY_SETUP_CONCURRENCY = 8;
export const HISTORY_DEFAULT_CELLS = 8;
export const HISTORY_DEFAULT_VERSIONS = 1000;
/** The target: a long history's head row is at most 1.5 × a fresh one + 512 bytes. */
export const HISTORY_LIMIT = { factor: 1.5, slackBytes: 512 } as const;
/** The target for reads: a long history's read at most 1.5 × a fresh cell's time. */
export const HISTORY_READ_LIMIT = 1.5;
/** Paired reads after the setup: at most this many pairs, for at most this long. */
export const HISTORY_PAIRS = { pairs: 400, warmup: 20, maxMs: 3000 } as const;

/**
 * Fresh and long-history cell i have the same row key in two tables, so a store that
 * places rows by key (a sharded CompositeStore) puts each pair on the same store, and the
 * two kinds are read from the same stores.
 */
export const FRESH_TABLE: LogicalTable = 'hist_fresh';
export const LONG_TABLE: LogicalTable = 'hist_long';

export function cellKey(i: number): string {
  return `cell${String(i).padStart(4, '0')}`;
}

/** What the history cells hold, shared by the cells of one backend. */
export interface HistoryData extends Prepared {
  /** Row keys, the same in FRESH_TABLE and LONG_TABLE. */
  readonly keys: readonly string[];
  /** The committed value of every Percolator cell (by `table/key`), kept current by the write cells' checks. */
  readonly latest: Map<string, string>;
  /** The committed value of every raw row (long cells, by `table/key`), likewise. */
  readonly rawLatest: Map<string, string>;
  readonly history: HistoryRows;
  /** The last number used in a written value (values are unique). */
  seq: number;
}

/** Runs `task(i)` for i in [0, n) with at most `parallel` at once; stops early on `signal`. */
async function pool(
  n: number,
  parallel: number,
  signal: AbortSignal | undefined,
  task: (i: number) => Promise<void>,
): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < n) {
      if (signal?.aborted) throw new Error('interrupted');
      await task(next++);
    }
  };
  await Promise.all(Array.from({ length: Math.min(parallel, n) }, worker));
}

const mean = (values: readonly number[]) => values.reduce((a, b) => a + b, 0) / values.length;

/**
 * Read latency of fresh and long-history cells measured in pairs: one client alternates a
 * read of fresh cell i and of long cell i (which goes first swaps every pair), so load
 * that comes and goes on a shared machine weighs on both alike, which separate cells
 * measured seconds apart cannot promise. Each read must return the last committed value.
 */
async function pairedReads(
  engine: PercolatorEngine,
  keys: readonly string[],
  latest: ReadonlyMap<string, string>,
  signal: AbortSignal | undefined,
): Promise<{ pairs: number; freshP50Ms: number; longP50Ms: number }> {
  const histograms = new Map([
    [FRESH_TABLE, new LatencyHistogram()],
    [LONG_TABLE, new LatencyHistogram()],
  ]);
  const deadline = performance.now() + HISTORY_PAIRS.maxMs;
  let pairs = 0;
  for (let n = 0; n < HISTORY_PAIRS.warmup + HISTORY_PAIRS.pairs; n++) {
    if (signal?.aborted) throw new Error('interrupted');
    if (n >= HISTORY_PAIRS.warmup && performance.now() > deadline) break;
    const key = keys[n % keys.length]!;
    for (const table of n % 2 === 0 ? [FRESH_TABLE, LONG_TABLE] : [LONG_TABLE, FRESH_TABLE]) {
      const t0 = performance.now();
      const { value } = await engine.transact((tx) => tx.read(table, [key]), { readOnly: true });
      const ms = performance.now() - t0;
      if (value[0] !== latest.get(`${table}/${key}`)) {
        throw new Error(`history: ${table}/${key} read ${describe(value[0])}, not its last committed value`);
      }
      if (n >= HISTORY_PAIRS.warmup) histograms.get(table)!.record(ms);
    }
    if (n >= HISTORY_PAIRS.warmup) pairs++;
  }
  return {
    pairs,
    freshP50Ms: histograms.get(FRESH_TABLE)!.percentileMs(50),
    longP50Ms: histograms.get(LONG_TABLE)!.percentileMs(50),
  };
}

async function headRowBytes(
  store: CountingStore,
  table: LogicalTable,
  keys: readonly string[],
): Promise<number[]> {
  return Promise.all(
    keys.map(async (key) => {
      const row = await store.read(table, key);
      if (!row) throw new Error(`history: no head row for ${table}/${key} after writing it`);
      return row.state.byteLength;
    }),
  );
}

/** Writes the cells of one backend and measures their head rows (not timed as a cell). */
async function prepareHistory(ctx: PrepareContext): Promise<HistoryData> {
  const cells = ctx.options.historyCells ?? ctx.backend.historyCells ?? HISTORY_DEFAULT_CELLS;
  const versions = ctx.options.historyVersions;
  const percolator = ctx.backend.engines.find((e): e is PercolatorEngine => e instanceof PercolatorEngine);
  const raw = ctx.backend.engines.find((e): e is RawEngine => e instanceof RawEngine);
  const store = (percolator ?? raw)?.store;
  if (!store) throw new Error('history: the backend has no Percolator or raw engine');
  const keys = Array.from({ length: cells }, (_, i) => cellKey(i));
  const latest = new Map<string, string>();
  ctx.info(
    `== ${ctx.backend.name}: history: writing ${cells} fresh cells and ${cells} cells × ${versions} ` +
      `versions of ${HISTORY_VALUE_BYTES} B (${Math.min(cells, HISTORY_SETUP_CONCURRENCY)} clients)`,
  );
  const start = performance.now();
  // A client of its own, so its background work is finished (closed) before anything is measured.
  // With the engine's client options (--inline-history-bytes, --version-block-bytes): the
  // head rows measured are those the options make.
  const db = new Percolator({ ...percolator?.clientOptions, store });
  let transactions = 0;
  try {
    const write = async (table: LogicalTable, key: string, n: number) => {
      const value = encodeValue(n, HISTORY_VALUE_BYTES);
      await db.transact(async (tx) => tx.set(table, key, COLUMN, value), { maxAttempts: 50 });
      latest.set(`${table}/${key}`, value);
      transactions++;
    };
    await pool(cells, HISTORY_SETUP_CONCURRENCY, ctx.signal, (i) => write(FRESH_TABLE, keys[i]!, 1));
    // One client per cell at a time: a cell's updates are sequential (they would conflict).
    await pool(cells, HISTORY_SETUP_CONCURRENCY, ctx.signal, async (i) => {
      for (let v = 1; v <= versions; v++) {
        if (ctx.signal?.aborted) throw new Error('interrupted');
        await write(LONG_TABLE, keys[i]!, v);
      }
    });
  } finally {
    await db.close();
  }
  const setupMs = performance.now() - start;
  const freshRows = await headRowBytes(store, FRESH_TABLE, keys);
  const longRows = await headRowBytes(store, LONG_TABLE, keys);
  const freshRowBytes = Math.max(...freshRows);
  const longRowBytes = Math.max(...longRows);
  const reads = percolator ? await pairedReads(percolator, keys, latest, ctx.signal) : undefined;
  const limitBytes = Math.round(HISTORY_LIMIT.factor * freshRowBytes + HISTORY_LIMIT.slackBytes);
  const rawLatest = new Map<string, string>();
  if (raw) {
    const rows = keys.map((key) => [key, encodeValue(1, HISTORY_VALUE_BYTES)] as const);
    await raw.load(LONG_TABLE, rows);
    for (const [key, value] of rows) rawLatest.set(`${LONG_TABLE}/${key}`, value);
  }
  const history: HistoryRows = {
    backend: ctx.backend.name,
    valueBytes: HISTORY_VALUE_BYTES,
    versions,
    cells,
    freshRowBytes,
    longRowBytes,
    freshRowMeanBytes: Math.round(mean(freshRows)),
    longRowMeanBytes: Math.round(mean(longRows)),
    ratio: round(longRowBytes / freshRowBytes, 2),
    limitBytes,
    withinLimit: longRowBytes <= limitBytes,
    ...(reads && reads.freshP50Ms > 0
      ? {
          reads: {
            pairs: reads.pairs,
            freshP50Ms: round(reads.freshP50Ms),
            longP50Ms: round(reads.longP50Ms),
            ratio: round(reads.longP50Ms / reads.freshP50Ms, 2),
            withinLimit: reads.longP50Ms <= HISTORY_READ_LIMIT * reads.freshP50Ms,
          },
        }
      : {}),
    setupMs: Math.round(setupMs),
    setupTxPerSecond: round(perSecond(transactions, setupMs), 1),
  };
  ctx.info(
    `== ${ctx.backend.name}: history: written in ${(setupMs / 1000).toFixed(1)} s ` +
      `(${history.setupTxPerSecond} tx/s); head row ${freshRowBytes} B after 1 update, ` +
      `${longRowBytes} B after ${versions} (${history.ratio}x; limit ${limitBytes} B: ` +
      `${history.withinLimit ? 'within' : 'OVER'})` +
      (history.reads
        ? `; paired reads p50 ${history.reads.freshP50Ms} ms fresh, ${history.reads.longP50Ms} ms long ` +
          `(${history.reads.ratio}x; ${history.reads.withinLimit ? 'within' : 'OVER'} 1.5x)`
        : ''),
  );
  return { keys, latest, rawLatest, history, seq: versions };
}

const HISTORY_PREPARE: WorkloadPrepare = { key: 'history', run: prepareHistory };

function stepRandom(name: string, engine: Engine, index: number) {
  let h = 2166136261;
  for (const ch of `${name}/${engine.mode}/${index}`) h = Math.imul(h ^ ch.charCodeAt(0), 16777619);
  return seededRandom(h >>> 0);
}

/** Reads of one kind of cell: Percolator read transactions, or raw reads of the same head rows. */
class HistoryReadSession implements WorkloadSession {
  private readonly bad: string[] = [];
  private reads = 0;

  constructor(
    private readonly name: string,
    private readonly engine: Engine,
    private readonly data: HistoryData,
    private readonly table: LogicalTable,
  ) {}

  step(index: number): Step {
    const random = stepRandom(this.name, this.engine, index);
    const { engine, table } = this;
    const keys = this.data.keys;
    if (engine instanceof RawEngine) {
      return async () => {
        const key = keys[randomInt(random, keys.length)]!;
        const row = await engine.store.read(table, key);
        this.reads++;
        if (!row || row.state.byteLength < HISTORY_VALUE_BYTES)
          this.note(`${key}: head row missing or short`);
        return 1;
      };
    }
    return async () => {
      const key = keys[randomInt(random, keys.length)]!;
      const { value, attempts } = await engine.transact((tx) => tx.read(table, [key]), { readOnly: true });
      this.reads++;
      const latest = this.data.latest.get(`${table}/${key}`);
      if (value[0] !== latest) {
        this.note(
          `${table}/${key}: read ${describe(value[0])}, the last committed value is ${describe(latest)}`,
        );
      }
      return attempts;
    };
  }

  private note(text: string): void {
    if (this.bad.length < 3) this.bad.push(text);
  }

  async verify(): Promise<CheckOutcome> {
    if (this.bad.length > 0) return { ok: false, detail: `bad reads: ${this.bad.join('; ')}` };
    const what =
      this.engine instanceof RawEngine ? 'head rows read raw' : 'reads returned the last committed value';
    return { ok: true, detail: `${this.reads} ${what}` };
  }

  async close(): Promise<void> {}
}

function describe(value: string | undefined): string {
  if (value === undefined) return 'nothing';
  const n = decodeValue(value);
  return n === undefined ? JSON.stringify(value.slice(0, 20)) : `#${n} (${value.length} B)`;
}

/** Blind writes of new values to the long-history cells (raw: CAS to a plain row per cell). */
class HistoryWriteSession implements WorkloadSession {
  /**
   * Per cell: the committed writes that may still be its last (the blind-write rule of the
   * `write` workload, ledger.ts), and values whose commit outcome is unknown.
   */
  private readonly ledger = new Ledger(0);
  private readonly unknown = new Map<string, Set<string>>();

  constructor(
    private readonly name: string,
    private readonly engine: Engine,
    private readonly data: HistoryData,
  ) {}

  private get latest(): Map<string, string> {
    return this.engine instanceof RawEngine ? this.data.rawLatest : this.data.latest;
  }

  step(index: number): Step {
    const random = stepRandom(this.name, this.engine, index);
    const keys = this.data.keys;
    return async () => {
      const key = keys[randomInt(random, keys.length)]!;
      const value = encodeValue(++this.data.seq, HISTORY_VALUE_BYTES);
      const invoke = performance.now();
      try {
        const { attempts } = await this.engine.transact(async (tx) => tx.write(LONG_TABLE, [[key, value]]));
        this.ledger.addWrite(key, value, invoke, performance.now());
        return attempts;
      } catch (error) {
        if (error instanceof TxFailure && error.kind === 'unknown') add(this.unknown, key, value);
        throw error;
      }
    };
  }

  /**
   * Every cell holds the value of its last committed write, or of one concurrent with it (a
   * write begun after another completed comes after it), or one whose outcome is unknown;
   * if none committed, its value before. Any value once committed to it is not enough: a
   * store that kept only a cell's first write would pass that.
   */
  async verify(): Promise<CheckOutcome> {
    const keys = this.data.keys;
    const current = await this.readAll(keys);
    for (const [i, key] of keys.entries()) {
      const now = current[i];
      const latest = this.ledger.written.get(key) ?? [];
      const allowed = new Set([...latest.map((w) => w.value), ...(this.unknown.get(key) ?? [])]);
      if (latest.length === 0) allowed.add(this.latest.get(`${LONG_TABLE}/${key}`)!);
      if (now === undefined || !allowed.has(now)) {
        return {
          ok: false,
          detail: `${key} holds ${describe(now)}, not its last committed value (nor one written concurrently with it)`,
        };
      }
      this.latest.set(`${LONG_TABLE}/${key}`, now);
    }
    return {
      ok: true,
      detail: `${this.ledger.writes} writes; every cell holds its last committed value (or one concurrent with it)`,
    };
  }

  private async readAll(keys: readonly string[]): Promise<(string | undefined)[]> {
    const { engine } = this;
    if (engine instanceof RawEngine) {
      const decoder = new TextDecoder();
      return Promise.all(
        keys.map(async (key) => {
          const row = await engine.store.read(RAW_TABLE, nativeKey(LONG_TABLE, key));
          return row ? decoder.decode(row.state) : undefined;
        }),
      );
    }
    return (await engine.transact((tx) => tx.read(LONG_TABLE, keys), { readOnly: true })).value;
  }

  async close(): Promise<void> {}
}

function add(map: Map<string, Set<string>>, key: string, value: string): void {
  let set = map.get(key);
  if (!set) map.set(key, (set = new Set()));
  set.add(value);
}

function historyWorkload(kind: 'read-fresh' | 'read-long' | 'write-long'): Workload {
  const name = `history-${kind}`;
  const description = {
    'read-fresh': 'read transaction of one cell written once (1 KB); raw: store.read of the same head row',
    'read-long': `read transaction of one cell updated ${HISTORY_DEFAULT_VERSIONS} times (1 KB values); raw: store.read of the same head row`,
    'write-long':
      'blind write transaction of a 1 KB value to one hot cell with a long history; raw: CAS of a 1 KB value',
  }[kind];
  return {
    name,
    description,
    modes: ['percolator', 'raw'],
    check: 'session',
    rowsPerTxn: () => 1,
    prepare: HISTORY_PREPARE,
    worker() {
      throw new Error('the history workload runs through its session');
    },
    async session(engine, { prepared }) {
      const data = prepared as HistoryData | undefined;
      if (!data) throw new Error(`${name}: the history cells were not prepared`);
      if (kind === 'write-long') return new HistoryWriteSession(name, engine, data);
      return new HistoryReadSession(name, engine, data, kind === 'read-fresh' ? FRESH_TABLE : LONG_TABLE);
    },
  };
}

export const HISTORY_WORKLOADS: readonly Workload[] = [
  historyWorkload('read-fresh'),
  historyWorkload('read-long'),
  historyWorkload('write-long'),
];
