import { encodeValue, keyOf } from './dataset.js';
import { type KvTx, TxFailure, type TxHints } from './engines/engine.js';
import { HISTORY_WORKLOADS } from './history.js';
import { BadReadError } from './ledger.js';
import { observerPipeline } from './observers.js';
import {
  distinctChoices,
  type KeyChooser,
  randomInt,
  scrambledZipfianChooser,
  uniformChooser,
} from './random.js';
import type { Mode } from './types.js';
import type { Step, WorkerContext, Workload } from './workload.js';

export type {
  PrepareContext,
  Prepared,
  Step,
  StepOutcome,
  WorkerContext,
  Workload,
  WorkloadPrepare,
  WorkloadSession,
  WorkloadSettings,
} from './workload.js';

const ALL_MODES: readonly Mode[] = ['percolator', 'raw', 'native'];
const TXN_MODES: readonly Mode[] = ['percolator', 'native'];

/** Runs one transaction; on an unknown outcome its keys are marked uncertain for the check. */
async function run<T>(
  ctx: WorkerContext,
  keys: readonly string[],
  fn: (tx: KvTx) => Promise<T>,
  hints?: TxHints,
): Promise<{ value: T; attempts: number }> {
  try {
    return await ctx.engine.transact(fn, hints);
  } catch (error) {
    if (error instanceof TxFailure && error.kind === 'unknown') ctx.ledger.markUncertain(keys);
    throw error;
  }
}

function readInt(ctx: WorkerContext, key: string, value: string | undefined): number {
  const n = ctx.ledger.observeRead(key, value);
  if (n === undefined) throw new BadReadError(key);
  return n;
}

const singleRead: Workload = {
  name: 'read',
  description: 'single-row snapshot read (uniform keys)',
  modes: ALL_MODES,
  table: 'kv',
  check: 'reads',
  rowsPerTxn: () => 1,
  worker(ctx) {
    const keys = uniformChooser(ctx.shape.records, ctx.random);
    return async () => {
      const key = keyOf('kv', keys.next());
      const { value, attempts } = await run(ctx, [key], (tx) => tx.read('kv', [key]), { readOnly: true });
      readInt(ctx, key, value[0]);
      ctx.ledger.noteUnchanging(key, value[0]);
      return attempts;
    };
  },
};

const singleWrite: Workload = {
  name: 'write',
  description: 'single-row write transaction (blind write, uniform keys)',
  modes: ALL_MODES,
  table: 'kv',
  check: 'blind',
  rowsPerTxn: () => 1,
  worker(ctx) {
    const keys = uniformChooser(ctx.shape.records, ctx.random);
    let seq = 0;
    return async () => {
      const key = keyOf('kv', keys.next());
      // Unique per write, so the check can tell which write a row holds.
      const value = encodeValue(ctx.index * 1_000_000_000 + ++seq, ctx.shape.valueBytes);
      const invoke = performance.now();
      const { attempts } = await run(ctx, [key], async (tx) => tx.write('kv', [[key, value]]));
      ctx.ledger.addWrite(key, value, invoke, performance.now());
      return attempts;
    };
  },
};

/** Adds `amount` to one account in a single-row read-modify-write (one leg of a raw transfer). */
async function addToAccount(ctx: WorkerContext, key: string, amount: number): Promise<number> {
  const { attempts } = await run(ctx, [key], async (tx) => {
    const [value] = await tx.read('acct', [key], { forUpdate: true });
    tx.write('acct', [[key, encodeValue(readInt(ctx, key, value) + amount, ctx.shape.valueBytes)]]);
  }).catch((error: unknown) => {
    if (error instanceof TxFailure && error.kind === 'unknown') ctx.ledger.unbalanced = true;
    throw error;
  });
  ctx.ledger.addDelta(key, amount);
  return attempts;
}

/**
 * Moves 1..10 from one account to another: read two rows, write two rows. Engines limited
 * to one row (raw) do the same reads and writes as two single-row check-and-set legs, sent
 * at once: the cost without the protocol, and without atomicity (a crash between the legs
 * would lose money; the end-of-run total check still holds when both legs commit).
 */
function transferStep(ctx: WorkerContext, accounts: KeyChooser): Step {
  return async () => {
    const [a, b] = distinctChoices(accounts, 2).map((i) => keyOf('acct', i)) as [string, string];
    const amount = 1 + randomInt(ctx.random, 10);
    if (ctx.engine.singleRowOnly) {
      // The two legs at once: they are not atomic anyway, and a user would not wait for
      // one before sending the other (as Percolator reads its two rows at once).
      const [first, second] = await Promise.all([
        addToAccount(ctx, a, -amount),
        addToAccount(ctx, b, amount),
      ]);
      return first + second - 1;
    }
    const { attempts } = await run(ctx, [a, b], async (tx) => {
      const [va, vb] = await tx.read('acct', [a, b], { forUpdate: true });
      const balanceA = readInt(ctx, a, va);
      const balanceB = readInt(ctx, b, vb);
      tx.write('acct', [
        [a, encodeValue(balanceA - amount, ctx.shape.valueBytes)],
        [b, encodeValue(balanceB + amount, ctx.shape.valueBytes)],
      ]);
    });
    ctx.ledger.addDelta(a, -amount);
    ctx.ledger.addDelta(b, amount);
    return attempts;
  };
}

const transfer: Workload = {
  name: 'transfer',
  description:
    'read two account rows, write two (uniform); raw: the same as two single-row CAS legs, not atomic; checks the total',
  modes: ALL_MODES,
  table: 'acct',
  check: 'transfer',
  rowsPerTxn: () => 2,
  singleRowLegs: true,
  worker: (ctx) => transferStep(ctx, uniformChooser(ctx.shape.accounts, ctx.random)),
};

/** Reads `keys`, and increments `updates` (a subset) by one, in one transaction. */
async function readAndIncrement(ctx: WorkerContext, reads: string[], updates: string[]): Promise<number> {
  const { attempts } = await run(
    ctx,
    updates,
    async (tx) => {
      const [readValues, updateValues] = await Promise.all([
        reads.length > 0 ? tx.read('kv', reads) : [],
        updates.length > 0 ? tx.read('kv', updates, { forUpdate: true }) : [],
      ]);
      for (const [i, key] of reads.entries()) readInt(ctx, key, readValues[i]);
      tx.write(
        'kv',
        updates.map((key, i) => [
          key,
          encodeValue(readInt(ctx, key, updateValues[i]) + 1, ctx.shape.valueBytes),
        ]),
      );
    },
    { readOnly: updates.length === 0 },
  );
  for (const key of updates) ctx.ledger.addDelta(key, 1);
  return attempts;
}

/** YCSB core workloads A (50% updates) and B (5%), as multi-row transactions. */
function ycsb(letter: 'a' | 'b', distribution: 'uniform' | 'zipf'): Workload {
  const readProportion = letter === 'a' ? 0.5 : 0.95;
  return {
    name: `ycsb-${letter}-${distribution}`,
    description:
      `YCSB ${letter.toUpperCase()} (${Math.round(readProportion * 100)}% reads, the rest read-modify-write) ` +
      `in transactions of N keys, ${distribution === 'zipf' ? 'Zipfian (theta 0.99)' : 'uniform'} keys`,
    modes: TXN_MODES,
    table: 'kv',
    check: 'deltas',
    rowsPerTxn: (ops) => ops,
    worker(ctx) {
      const n = ctx.shape.records;
      const chooser =
        distribution === 'zipf'
          ? scrambledZipfianChooser(n, ctx.random, ctx.seed)
          : uniformChooser(n, ctx.random);
      return () => {
        const keys = distinctChoices(chooser, ctx.opsPerTxn).map((i) => keyOf('kv', i));
        const reads: string[] = [];
        const updates: string[] = [];
        for (const key of keys) (ctx.random() < readProportion ? reads : updates).push(key);
        return readAndIncrement(ctx, reads, updates);
      };
    },
  };
}

/**
 * Read and increment N rows per transaction. Each worker uses its own slice of the keys
 * when N fits in it, so the sweep measures size, not contention.
 */
function rowsSweep(rows: number): Workload {
  return {
    name: `rows-${rows}`,
    description: `read and write ${rows} row(s) per transaction (disjoint per worker when they fit)`,
    modes: TXN_MODES,
    table: 'kv',
    check: 'deltas',
    rowsPerTxn: () => rows,
    unsupported: (_engine, shape) =>
      rows > shape.records ? `needs ${rows} records, the data set has ${shape.records}` : undefined,
    worker(ctx) {
      const slice = Math.floor(ctx.shape.records / ctx.concurrency);
      const own = rows <= slice;
      const chooser = uniformChooser(own ? slice : ctx.shape.records, ctx.random);
      const offset = own ? ctx.index * slice : 0;
      return () => {
        const keys = distinctChoices(chooser, rows).map((i) => keyOf('kv', offset + i));
        return readAndIncrement(ctx, [], keys);
      };
    },
  };
}

/** Transfers among the first `hot` accounts only: the fewer, the more transactions collide. */
function contention(hot: number): Workload {
  return {
    name: `contention-${hot}`,
    description: `transfers among ${hot} hot accounts`,
    modes: TXN_MODES,
    table: 'acct',
    check: 'transfer',
    rowsPerTxn: () => 2,
    unsupported: (_engine, shape) =>
      hot > shape.accounts ? `needs ${hot} accounts, the data set has ${shape.accounts}` : undefined,
    worker: (ctx) => transferStep(ctx, uniformChooser(hot, ctx.random)),
  };
}

const oracle: Workload = {
  name: 'oracle',
  description: 'timestamps per second (percolator: batched oracle; raw: one counter increment each)',
  modes: ['percolator', 'raw'],
  check: 'timestamps',
  rowsPerTxn: () => 0,
  unsupported: (engine) => (engine.nextTimestamp ? undefined : 'no timestamp source'),
  worker(ctx) {
    const mine = ctx.ledger.timestamps[ctx.index]!;
    return async () => {
      mine.push(await ctx.engine.nextTimestamp!());
      return 1;
    };
  },
};

export const ROWS_SWEEP = [1, 4, 16, 64, 256];
export const CONTENTION_SWEEP = [256, 16, 2];

const FIXED: readonly Workload[] = [
  singleRead,
  singleWrite,
  transfer,
  ycsb('a', 'uniform'),
  ycsb('a', 'zipf'),
  ycsb('b', 'uniform'),
  ycsb('b', 'zipf'),
  oracle,
  observerPipeline,
  ...HISTORY_WORKLOADS,
];

/** Named groups accepted by --workloads. */
export const WORKLOAD_GROUPS: Record<string, readonly string[]> = {
  ycsb: ['ycsb-a-uniform', 'ycsb-a-zipf', 'ycsb-b-uniform', 'ycsb-b-zipf'],
  rows: ROWS_SWEEP.map((n) => `rows-${n}`),
  contention: CONTENTION_SWEEP.map((n) => `contention-${n}`),
  history: HISTORY_WORKLOADS.map((w) => w.name),
};

export const DEFAULT_WORKLOADS: readonly string[] = [
  'read',
  'write',
  'transfer',
  'ycsb-a-zipf',
  'ycsb-b-uniform',
  ...WORKLOAD_GROUPS.rows!,
  ...WORKLOAD_GROUPS.contention!,
  'oracle',
  'observers',
];

export const ALL_WORKLOADS: readonly string[] = [
  ...FIXED.filter((w) => w.name !== 'oracle' && w.name !== 'observers' && !w.prepare).map((w) => w.name),
  ...WORKLOAD_GROUPS.rows!,
  ...WORKLOAD_GROUPS.contention!,
  'oracle',
  'observers',
  ...WORKLOAD_GROUPS.history!,
];

/** A workload by name: a fixed one, `rows-<n>` or `contention-<n>`; undefined if unknown. */
export function workloadByName(name: string): Workload | undefined {
  const fixed = FIXED.find((w) => w.name === name);
  if (fixed) return fixed;
  const sweep = /^(rows|contention)-([1-9]\d{0,4})$/.exec(name);
  if (!sweep) return undefined;
  const n = Number(sweep[2]);
  if (sweep[1] === 'rows') return rowsSweep(n);
  return n >= 2 ? contention(n) : undefined;
}
