import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { main } from '../src/cli.js';
import type { Engine, KvTx } from '../src/engines/engine.js';
import {
  cellKey,
  HISTORY_VALUE_BYTES,
  HISTORY_WORKLOADS,
  type HistoryData,
  LONG_TABLE,
} from '../src/history.js';
import type { BenchReport, BenchResult } from '../src/types.js';

const CELLS = ['history-read-fresh', 'history-read-long', 'history-write-long'];

/**
 * The history workload, briefly, on the memory store: the figures are present and
 * consistent with each other. No timing is asserted, and nothing about the row layout
 * (the head row may or may not grow with history): only what any layout must give.
 */
describe('the history workload on the memory store', () => {
  let dir: string;
  let code: number;
  let report: BenchReport;
  let stderrText = '';

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'bench-history-'));
    const stdout = new PassThrough();
    stdout.resume();
    const stderr = Object.assign(new PassThrough(), { isTTY: false }) as unknown as NodeJS.WriteStream;
    stderr.on('data', (c: Buffer) => {
      stderrText += c.toString();
    });
    code = await main(
      [
        '--backends',
        'memory',
        '--workloads',
        'history',
        '--history-cells',
        '3',
        '--history-versions',
        '60',
      ].concat(['--duration', '80ms', '--warmup', '20ms', '--concurrency', '2', '--out', dir]),
      { stdout, stderr },
    );
    report = JSON.parse(await readFile(join(dir, 'results.json'), 'utf8')) as BenchReport;
  });

  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  const cell = (workload: string, mode: string): BenchResult => {
    const found = report.results.find((r) => r.workload === workload && r.mode === mode);
    expect(found, `${workload} ${mode}`).toBeDefined();
    return found!;
  };

  test('runs every history cell in percolator and raw mode, every check passing', () => {
    expect(report.failures).toEqual([]);
    expect(code).toBe(0);
    expect(report.results.map((r) => `${r.workload}/${r.mode}`).sort()).toEqual(
      CELLS.flatMap((w) => [`${w}/percolator`, `${w}/raw`]).sort(),
    );
    for (const r of report.results) {
      expect(r.check.ok, `${r.workload} ${r.mode}: ${r.check.detail}`).toBe(true);
      expect(r.transactions).toBeGreaterThan(0);
      expect(r.errors).toBe(0);
    }
    expect(cell('history-read-long', 'percolator').check.detail).toMatch(
      /reads returned the last committed value/,
    );
    expect(cell('history-write-long', 'percolator').check.detail).toMatch(
      /every cell holds its last committed value/,
    );
  });

  test('reports the head row after one update and after many, with the 1.5x + 512 B target', () => {
    expect(report.history).toHaveLength(1);
    const h = report.history![0]!;
    expect(h).toMatchObject({ backend: 'memory', valueBytes: HISTORY_VALUE_BYTES, versions: 60, cells: 3 });
    // Whatever the layout, the head row holds at least the current value.
    expect(h.freshRowBytes).toBeGreaterThanOrEqual(HISTORY_VALUE_BYTES);
    expect(h.longRowBytes).toBeGreaterThanOrEqual(HISTORY_VALUE_BYTES);
    expect(h.ratio).toBeCloseTo(h.longRowBytes / h.freshRowBytes, 2);
    expect(h.limitBytes).toBe(Math.round(1.5 * h.freshRowBytes + 512));
    expect(h.withinLimit).toBe(h.longRowBytes <= h.limitBytes);
    // Lean rows: a long history does not grow the head row (the size, not a timing).
    expect(h.withinLimit).toBe(true);
    expect(h.freshRowMeanBytes).toBeLessThanOrEqual(h.freshRowBytes);
    expect(h.longRowMeanBytes).toBeLessThanOrEqual(h.longRowBytes);
    expect(h.longRowMeanBytes).toBeGreaterThanOrEqual(HISTORY_VALUE_BYTES);
    // Reads of both kinds measured in pairs by one client, and their ratio.
    expect(h.reads).toBeDefined();
    const reads = h.reads!;
    expect(reads.pairs).toBeGreaterThan(0);
    expect(reads.freshP50Ms).toBeGreaterThan(0);
    expect(reads.longP50Ms).toBeGreaterThan(0);
    expect(reads.ratio).toBeCloseTo(reads.longP50Ms / reads.freshP50Ms, 1);
    expect(reads.withinLimit).toBe(reads.longP50Ms <= 1.5 * reads.freshP50Ms);
    expect(h.setupMs).toBeGreaterThan(0);
    expect(h.setupTxPerSecond).toBeGreaterThan(0);
    expect(stderrText).toMatch(/memory: history: writing 3 fresh cells and 3 cells × 60 versions/);
  });

  test('counts bytes and store calls per transaction, by direction', () => {
    for (const r of report.results) {
      expect(r.io, `${r.workload} ${r.mode}`).toBeDefined();
      for (const value of Object.values(r.io!)) {
        expect(Number.isFinite(value)).toBe(true);
        expect(value).toBeGreaterThanOrEqual(0);
      }
    }
    const h = report.history![0]!;
    // A raw read is one store.read of the head row, nothing else.
    const rawFresh = cell('history-read-fresh', 'raw').io!;
    expect(rawFresh).toMatchObject({ reads: 1, writes: 0, rowsRead: 1, rowsWritten: 0, bytesWritten: 0 });
    // (Rows of one kind may differ by a few bytes, timestamps being of different lengths.)
    expect(rawFresh.bytesRead).toBeGreaterThanOrEqual(HISTORY_VALUE_BYTES);
    expect(rawFresh.bytesRead).toBeLessThanOrEqual(h.freshRowBytes);
    const rawLong = cell('history-read-long', 'raw').io!;
    expect(rawLong.bytesRead).toBeGreaterThanOrEqual(HISTORY_VALUE_BYTES);
    expect(rawLong.bytesRead).toBeLessThanOrEqual(h.longRowBytes);
    // A Percolator read moves at least the head row, and writes no row.
    for (const workload of ['history-read-fresh', 'history-read-long']) {
      const io = cell(workload, 'percolator').io!;
      expect(io.bytesRead, workload).toBeGreaterThanOrEqual(HISTORY_VALUE_BYTES);
      expect(io.rowsWritten, workload).toBe(0);
    }
    // A write transaction writes at least its 1 KB value, in write calls it may share with
    // the other transactions of its client (group commit: fewer calls than transactions).
    const write = cell('history-write-long', 'percolator').io!;
    expect(write.writes).toBeGreaterThan(0);
    expect(write.rowsWritten).toBeGreaterThanOrEqual(1);
    expect(write.bytesWritten).toBeGreaterThanOrEqual(HISTORY_VALUE_BYTES);
    const rawWrite = cell('history-write-long', 'raw').io!;
    expect(rawWrite.writes).toBeGreaterThanOrEqual(1);
    expect(rawWrite.bytesWritten).toBeGreaterThanOrEqual(HISTORY_VALUE_BYTES);
    // Percolator results carry their ratio to raw, as every workload's do.
    expect(cell('history-read-long', 'percolator').ratios.map((r) => r.baseline)).toEqual(['raw']);
  });

  test('summary.md, results.md and report.html show the history tables', async () => {
    const summary = await readFile(join(dir, 'summary.md'), 'utf8');
    const h = report.history![0]!;
    const row = (...cells: string[]) => new RegExp(`\\| ${cells.join(' +\\| ')} +\\|`);
    expect(summary).toMatch(
      row('backend', 'head row: 1 update', '60 updates', 'ratio', 'within 1.5x \\+ 512 B'),
    );
    const size = (max: number) => `${max.toLocaleString('en-US')} B( \\(mean [\\d,]+ B\\))?`;
    expect(summary).toMatch(
      row('memory', size(h.freshRowBytes), size(h.longRowBytes), `${h.ratio.toFixed(2)}x`),
    );
    expect(summary).toMatch(
      row('memory', '.*', '.*', '.*', '.*', '[\\d.]+, [\\d.]+', '[\\d.]+x \\((within|OVER) 1.5x\\)'),
    );
    expect(summary).toMatch(
      row('backend', 'transaction', 'Percolator tx/s', 'p50 ms', 'long ÷ fresh', 'raw tx/s'),
    );
    expect(summary).toMatch(
      row('memory', 'read, long history', '[\\d,.]+', '[\\d.]+', '[\\d.]+x tx/s, [\\d.]+x p50'),
    );
    expect(summary).toMatch(row('memory', 'write, long history'));
    // No transfer ran: no empty transfer table.
    expect(summary).not.toContain('transfer tx/s');
    const md = await readFile(join(dir, 'results.md'), 'utf8');
    expect(md).toContain('Long histories (`history`)');
    const html = await readFile(join(dir, 'report.html'), 'utf8');
    expect(html).toContain('<h2>Long histories</h2>');
    // No transfer ran: no transfer legend.
    expect(html).not.toContain('a transfer is two one-row legs');
    expect(html).toContain(`${h.longRowBytes.toLocaleString('en-US')} B (${h.ratio.toFixed(2)}x; limit`);
  });
});

/** Runs `--workloads history-read-long` briefly on the memory store, with `extra` options. */
async function historyRun(extra: string[]): Promise<BenchReport> {
  const dir = await mkdtemp(join(tmpdir(), 'bench-history-opts-'));
  try {
    const stdout = new PassThrough();
    stdout.resume();
    const stderr = Object.assign(new PassThrough(), { isTTY: false }) as unknown as NodeJS.WriteStream;
    stderr.resume();
    const args = ['--backends', 'memory', '--workloads', 'history-read-long', '--modes', 'percolator'];
    args.push('--history-cells', '2', '--history-versions', '40', '--duration', '40ms', '--warmup', '0ms');
    const code = await main([...args, ...extra, '--out', dir], { stdout, stderr });
    expect(code).toBe(0);
    return JSON.parse(await readFile(join(dir, 'results.json'), 'utf8')) as BenchReport;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

describe('the history workload and its options', () => {
  test('the long-history cells are written with the client options asked for (--inline-history-bytes)', async () => {
    // The setup wrote with a default client, so the head row measured was the default's
    // whatever the option said (found in review).
    const lean = (await historyRun(['--inline-history-bytes', '0'])).history[0]!;
    const inline = (await historyRun(['--inline-history-bytes', '1048576'])).history[0]!;
    // 40 versions of 1 KiB kept in the head row against none.
    expect(inline.longRowBytes).toBeGreaterThan(lean.longRowBytes + 30 * HISTORY_VALUE_BYTES);
  });

  test('history-write-long fails when a store kept an earlier write than the last committed one', async () => {
    // A store that keeps only the first value written to each cell: every value it holds
    // was committed to that cell once, which the old check took as enough (found in review).
    const kept = new Map<string, string>();
    const engine = {
      mode: 'percolator',
      variant: 'si',
      async transact<T>(fn: (tx: KvTx) => Promise<T>) {
        const writes: (readonly [string, string])[] = [];
        const tx = {
          read: async (_t: string, keys: readonly string[]) => keys.map((k) => kept.get(k)),
          write: (_t: string, entries: ReadonlyArray<readonly [string, string]>) => writes.push(...entries),
        } as unknown as KvTx;
        const value = await fn(tx);
        for (const [k, v] of writes) if (!kept.has(k)) kept.set(k, v);
        return { value, attempts: 1 };
      },
    } as unknown as Engine;
    const workload = HISTORY_WORKLOADS.find((w) => w.name === 'history-write-long')!;
    const prepared = {
      keys: [cellKey(0)],
      latest: new Map([[`${LONG_TABLE}/${cellKey(0)}`, 'old']]),
      rawLatest: new Map(),
      seq: 0,
    } as unknown as HistoryData;
    const session = await workload.session!(engine, {
      concurrency: 1,
      shape: { records: 1, accounts: 1, valueBytes: 8 },
      prepared,
    });
    const step = session.step(0);
    for (let i = 0; i < 5; i++) await step();
    const lost = await session.verify();
    expect(lost.ok).toBe(false);
    expect(lost.detail).toMatch(/not its last committed value/);
    // A store that keeps the last write passes.
    kept.clear();
    const honest = {
      ...engine,
      async transact<T>(fn: (tx: KvTx) => Promise<T>) {
        const tx = {
          read: async (_t: string, keys: readonly string[]) => keys.map((k) => kept.get(k)),
          write: (_t: string, entries: ReadonlyArray<readonly [string, string]>) => {
            for (const [k, v] of entries) kept.set(k, v);
          },
        } as unknown as KvTx;
        return { value: await fn(tx), attempts: 1 };
      },
    } as unknown as Engine;
    const fair = await workload.session!(honest, {
      concurrency: 1,
      shape: { records: 1, accounts: 1, valueBytes: 8 },
      prepared,
    });
    const fairStep = fair.step(0);
    for (let i = 0; i < 5; i++) await fairStep();
    const ok = await fair.verify();
    expect(ok, ok.detail).toMatchObject({ ok: true });
  });
});
