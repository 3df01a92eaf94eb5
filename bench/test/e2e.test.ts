import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { main } from '../src/cli.js';
import type { BenchReport } from '../src/types.js';

const WORKLOADS =
  'read,write,transfer,ycsb-a-zipf,ycsb-b-uniform,rows-1,rows-4,contention-2,oracle,observers';

describe('a tiny end-to-end run on the memory store', () => {
  let dir: string;
  let code: number;
  let stdoutText = '';
  let stderrText = '';
  let report: BenchReport;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'bench-e2e-'));
    const stdout = new PassThrough();
    const stderr = Object.assign(new PassThrough(), { isTTY: false }) as unknown as NodeJS.WriteStream;
    stdout.on('data', (c: Buffer) => {
      stdoutText += c.toString();
    });
    stderr.on('data', (c: Buffer) => {
      stderrText += c.toString();
    });
    code = await main(
      [
        '--',
        '--backends',
        'memory',
        '--workloads',
        WORKLOADS,
        '--duration',
        '60ms',
        '--warmup',
        '20ms',
      ].concat(['--concurrency', '1,3', '--records', '128', '--accounts', '32', '--markdown', '--out', dir]),
      { stdout, stderr },
    );
    report = JSON.parse(await readFile(join(dir, 'results.json'), 'utf8')) as BenchReport;
  });

  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  test('exits 0 with every check passing', () => {
    expect(report.failures).toEqual([]);
    expect(code).toBe(0);
    for (const r of report.results)
      expect(r.check.ok, `${r.workload} ${r.mode}: ${r.check.detail}`).toBe(true);
  });

  test('results.json has one entry per workload, mode and concurrency with the documented fields', () => {
    expect(report.schema).toBe('percolator-bench/1');
    const cells = report.results.map((r) => `${r.workload}/${r.mode}/${r.concurrency}`).sort();
    const expected: string[] = [];
    for (const c of [1, 3]) {
      for (const w of WORKLOADS.split(',')) {
        expected.push(`${w}/percolator/${c}`);
        if (['read', 'write', 'transfer', 'oracle'].includes(w)) expected.push(`${w}/raw/${c}`);
      }
    }
    expect(cells).toEqual(expected.sort());
    for (const r of report.results) {
      expect(r.backend).toBe('memory');
      expect(['percolator', 'raw', 'native']).toContain(r.mode);
      for (const field of [
        'concurrency',
        'throughput',
        'p50Ms',
        'p95Ms',
        'p99Ms',
        'abortRate',
        'roundTrips',
      ] as const) {
        expect(typeof r[field], field).toBe('number');
        expect(Number.isFinite(r[field]), field).toBe(true);
      }
      expect(r.throughput).toBeGreaterThan(0);
      expect(r.p50Ms).toBeLessThanOrEqual(r.p95Ms);
      expect(r.p95Ms).toBeLessThanOrEqual(r.p99Ms);
      expect(r.abortRate).toBeGreaterThanOrEqual(0);
      expect(r.abortRate).toBeLessThan(1);
      expect(Array.isArray(r.ratios)).toBe(true);
    }
  });

  test('round trips are counted: a raw read is exactly one store call, Percolator reads add the oracle', () => {
    const rawRead = report.results.find(
      (r) => r.workload === 'read' && r.mode === 'raw' && r.concurrency === 1,
    )!;
    expect(rawRead.roundTrips).toBe(1);
    const percRead = report.results.find(
      (r) => r.workload === 'read' && r.mode === 'percolator' && r.concurrency === 1,
    )!;
    // A timestamp (a counter increment) and one row read, or both in one stamped read.
    expect(percRead.roundTrips).toBeGreaterThanOrEqual(1);
    expect(percRead.roundTrips).toBeLessThanOrEqual(2);
    expect(percRead.criticalPath!.roundTrips).toBe(percRead.roundTrips);
    const transfer = report.results.find((r) => r.workload === 'transfer' && r.concurrency === 1)!;
    // On the memory store, which reads with its start timestamp and writes several rows in
    // one stamped step: the stamped read of both rows, then the one-step commit (no locks,
    // no secondaries). Background work (the tidy step) may add calls, never sequential ones.
    expect(transfer.criticalPath!.roundTrips).toBe(2);
    expect(transfer.roundTrips).toBeGreaterThanOrEqual(2);
    // Raw: two legs of read + check-and-set, sent at once (they are not atomic anyway):
    // four calls, two of them on the critical path.
    const rawTransfer = report.results.find(
      (r) => r.workload === 'transfer' && r.mode === 'raw' && r.concurrency === 1,
    )!;
    expect(rawTransfer.roundTrips).toBeGreaterThanOrEqual(4);
    expect(rawTransfer.criticalPath!.roundTrips).toBe(2);
    expect(rawRead.criticalPath).toMatchObject({ roundTrips: 1, criticalCalls: 1, backgroundCalls: 0 });
    // Counted store traffic: at least both rows read and written.
    expect(transfer.io!.rowsRead).toBeGreaterThanOrEqual(2);
    expect(transfer.io!.rowsWritten).toBeGreaterThanOrEqual(2);
  });

  test('Percolator results carry ratios to the raw baseline of the same cell', () => {
    for (const c of [1, 3]) {
      for (const w of ['read', 'write', 'oracle']) {
        const p = report.results.find(
          (r) => r.workload === w && r.mode === 'percolator' && r.concurrency === c,
        )!;
        const raw = report.results.find((r) => r.workload === w && r.mode === 'raw' && r.concurrency === c)!;
        const ratio = p.ratios.find((x) => x.baseline === 'raw')!;
        expect(ratio.throughput).toBeCloseTo(p.throughput / raw.throughput, 2);
      }
    }
  });

  test('writes a self-contained HTML report and a markdown table; progress goes to stderr', async () => {
    const html = await readFile(join(dir, 'report.html'), 'utf8');
    expect(html).toMatch(/^<!doctype html>/);
    expect(html).toContain('<svg');
    expect(html).not.toMatch(/<script|<link|<img|src=|href=/i);
    expect(html.match(/https?:\/\/[^"]*/g)?.every((u) => u === 'http://www.w3.org/2000/svg')).toBe(true);
    // The headline chart: transfer per backend, Percolator next to raw (with the ratio) and native.
    expect(html).toContain('Transfer throughput: Percolator next to raw CAS');
    expect(html).toMatch(/memory c=1 raw:cas: [\d,.]+ tx\/s \(Percolator ÷ this: [\d.]+\)/);
    expect(html).toContain('native: none (an in-process map has no transactions of its own)');
    const md = await readFile(join(dir, 'results.md'), 'utf8');
    // Tables are padded as the formatter lays them out.
    const row = (...cells: string[]) => new RegExp(`\\| ${cells.join(' +\\| ')} +\\|`);
    expect(md).toMatch(row('backend', 'workload', 'mode'));
    expect(md).toMatch(row('memory', 'read', 'percolator', '1'));
    // The sweeps as compact tables, the full table folded.
    expect(md).toMatch(row('backend', 'mode', 'c', '1 rows', '4 rows'));
    expect(md).toMatch(row('backend', 'mode', 'c', '2 hot'));
    expect(md).toContain('<details><summary>All figures</summary>');
    const summary = await readFile(join(dir, 'summary.md'), 'utf8');
    expect(summary).toContain('Command: `pnpm bench -- --backends memory --workloads');
    expect(summary).toMatch(/Machine: \d+ × .+, Node v\d+/);
    expect(summary).toMatch(/\| backend +\| transfer tx\/s: Percolator \| raw +\| native \|/);
    expect(summary).toMatch(/\| memory c=1 +\| [\d,.]+ +\| [\d,.]+ +\| – +\| [\d.]+ +\|/);
    expect(summary).toContain(
      'No native baseline: memory (an in-process map has no transactions of its own)',
    );
    expect(summary.split('\n').length).toBeLessThan(60);
    expect(summary).toContain('Percolator: sequential');
    expect(summary).toContain('Timestamp oracle ceiling');
    expect(stdoutText).toMatch(row('backend', 'workload', 'mode'));
    expect(stdoutText).toMatch(/memory\s+read\s+percolator/);
    expect(stderrText).toMatch(/\[\s*1\/\d+\] memory read percolator c=1/);
  });

  test('bad arguments exit 2 with the usage', async () => {
    const sink = new PassThrough();
    let text = '';
    const stderr = Object.assign(new PassThrough(), { isTTY: false }) as unknown as NodeJS.WriteStream;
    stderr.on('data', (c: Buffer) => {
      text += c.toString();
    });
    sink.resume();
    for (const args of [
      ['--backends', 'oracle'],
      ['--workloads', 'nope'],
      ['--duration', '-1'],
      ['--concurrency', '0'],
    ]) {
      text = '';
      expect(await main(args, { stdout: sink, stderr })).toBe(2);
      expect(text).toMatch(/usage: pnpm bench/);
    }
  });
});
