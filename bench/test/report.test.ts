import { describe, expect, test } from 'vitest';
import { commandLine, shellArgs } from '../src/report/format.js';
import { htmlReport } from '../src/report/html.js';
import { summaryMarkdown } from '../src/report/summary.js';
import {
  type BarGroup,
  barChart,
  linearTicks,
  lineChart,
  logTicks,
  textWidth,
  tickLabels,
} from '../src/report/svg.js';
import type { BenchReport, BenchResult } from '../src/types.js';

/** Every text element of an SVG with where it starts and ends (by the same width estimate). */
function texts(svg: string): { text: string; left: number; right: number }[] {
  const out: { text: string; left: number; right: number }[] = [];
  for (const m of svg.matchAll(/<text ([^>]*)>([^<]*)<\/text>/g)) {
    const attrs = m[1]!;
    if (attrs.includes('rotate(')) continue;
    const attr = (name: string) => new RegExp(`${name}="([^"]*)"`).exec(attrs)?.[1];
    const text = m[2]!
      .replace(/&gt;/g, '>')
      .replace(/&lt;/g, '<')
      .replace(/&quot;/g, '"')
      .replace(/&amp;/g, '&');
    const w = textWidth(text, attr('class') === 'l' ? 12 : 11);
    const x = Number(attr('x'));
    const anchor = attr('text-anchor');
    const left = anchor === 'end' ? x - w : anchor === 'middle' ? x - w / 2 : x;
    out.push({ text, left, right: left + w });
  }
  return out;
}

const svgWidth = (svg: string) => Number(/<svg[^>]* width="([\d.]+)"/.exec(svg)![1]);

function expectAllTextInside(svg: string): void {
  const width = svgWidth(svg);
  const all = texts(svg);
  expect(all.length).toBeGreaterThan(0);
  for (const t of all) {
    expect(t.left, `"${t.text}" starts before the chart`).toBeGreaterThanOrEqual(0);
    expect(t.right, `"${t.text}" is cut off at ${width}`).toBeLessThanOrEqual(width);
  }
}

describe('chart labels are never cut off', () => {
  test('the observer latency label and a long group label fit in the bar chart', () => {
    const groups: BarGroup[] = [
      {
        label: 'observers c=32',
        bars: [
          {
            name: 'percolator (writer commit → observer commit)',
            value: 42.1,
            text: 'p50 13.6 / p99 42.1 ms',
            color: '#000',
          },
        ],
      },
      {
        label: 'history-write-long c=32 and a very long group label',
        bars: [{ name: 'raw:cas', value: 3, text: 'p50 1.00 / p99 3.00 ms', color: '#000' }],
      },
    ];
    expectAllTextInside(barChart(groups, { scale: 'group' }));
    expectAllTextInside(
      barChart(groups, { scale: 'shared', references: [{ value: 40, label: 'paper: reads 0.94' }] }),
    );
  });

  test('line chart legends fit, however long the series names', () => {
    const svg = lineChart(
      [
        {
          name: 'native:repeatable-read c=32',
          color: '#000',
          points: [
            [1, 10],
            [4, 20],
            [16, 30],
          ],
        },
        {
          name: 'native:watch-multi-exec c=128',
          color: '#111',
          points: [
            [1, 12],
            [4, 22],
            [16, 35],
          ],
        },
      ],
      { xLabel: 'rows per transaction', yLabel: 'tx/s (log)', xLog: true, yLog: true },
    );
    expectAllTextInside(svg);
  });
});

describe('axis ticks are distinct', () => {
  const yLabels = (svg: string) =>
    texts(svg)
      .filter((t) => /^-?[\d.]+[kM]?$/.test(t.text))
      .map((t) => t.text);

  test('a narrow range on a log axis (2.15k to 2.26k) gets distinct labels', () => {
    const svg = lineChart(
      [
        {
          name: 'percolator c=4',
          color: '#000',
          points: [
            [2, 2150],
            [16, 2210],
            [256, 2260],
          ],
        },
      ],
      { xLabel: 'hot accounts', yLabel: 'tx/s (log)', xLog: true, yLog: true },
    );
    const labels = yLabels(svg).filter((l) => l.endsWith('k'));
    expect(labels.length).toBeGreaterThanOrEqual(3);
    expect(new Set(labels).size).toBe(labels.length);
  });

  test('linear ticks: nice steps covering the range, distinct labels', () => {
    expect(linearTicks(0, 100)).toEqual([0, 25, 50, 75, 100]);
    expect(linearTicks(0, 7.3)).toEqual([0, 2, 4, 6, 8]);
    const narrow = linearTicks(2150, 2260);
    expect(narrow[0]).toBeLessThanOrEqual(2150);
    expect(narrow[narrow.length - 1]).toBeGreaterThanOrEqual(2260);
    expect(tickLabels(narrow)).toEqual(['2.15k', '2.2k', '2.25k', '2.3k']);
    expect(tickLabels([0, 500, 1000, 1500])).toEqual(['0', '500', '1k', '1.5k']);
    expect(new Set(tickLabels(linearTicks(0.1, 0.13))).size).toBe(linearTicks(0.1, 0.13).length);
    expect(tickLabels([0, 0.25, 0.5, 0.75, 1])).toEqual(['0', '0.25', '0.5', '0.75', '1']);
    expect(linearTicks(5, 5).length).toBeGreaterThanOrEqual(2);
  });

  test('log ticks: 1-2-5 steps over decades, covering the range', () => {
    expect(logTicks(900, 12_000)).toEqual([500, 1000, 2000, 5000, 10_000, 20_000]);
    expect(tickLabels(logTicks(900, 12_000))).toEqual(['500', '1k', '2k', '5k', '10k', '20k']);
    const wide = logTicks(0.5, 2_000_000);
    expect(wide[0]).toBeLessThanOrEqual(0.5);
    expect(wide[wide.length - 1]).toBeGreaterThanOrEqual(2_000_000);
    expect(new Set(tickLabels(wide)).size).toBe(wide.length);
  });
});

function result(over: Partial<BenchResult>): BenchResult {
  return {
    backend: 'postgres',
    workload: 'transfer',
    mode: 'percolator',
    variant: 'si',
    concurrency: 4,
    throughput: 100,
    p50Ms: 1,
    p95Ms: 2,
    p99Ms: 3,
    meanMs: 1,
    maxMs: 4,
    abortRate: 0,
    retryRate: 0,
    roundTrips: 8,
    commands: 8,
    transactions: 100,
    attempts: 100,
    gaveUp: 0,
    errors: 0,
    durationMs: 1000,
    ratios: [],
    check: { ok: true, detail: 'ok' },
    ...over,
  };
}

function report(command: string, results: BenchResult[] = [result({})]): BenchReport {
  return {
    schema: 'percolator-bench/1',
    runId: 'abcd1234',
    startedAt: '2025-01-01T00:00:00.000Z',
    finishedAt: '2025-01-01T00:01:00.000Z',
    command,
    host: { cpus: 2, cpuModel: 'cpu', node: 'v20.0.0', platform: 'linux-x64' },
    versions: {},
    options: { durationMs: 300, warmupMs: 100, concurrency: [4] },
    results,
    skipped: [],
    notes: [],
    failures: [],
  };
}

describe('the command in the report headers', () => {
  test('arguments are rendered as the command one types, with no stray "--"', () => {
    expect(shellArgs(['--', '--backends', 'memory,postgres', '--out', 'my dir'])).toBe(
      "--backends memory,postgres --out 'my dir'",
    );
    expect(commandLine('--backends memory')).toBe('pnpm bench -- --backends memory');
    // Reports written before kept the "--" pnpm passed through.
    expect(commandLine('-- --backends memory')).toBe('pnpm bench -- --backends memory');
    expect(commandLine('')).toBe('pnpm bench');
  });

  test('report.html and summary.md show `pnpm bench -- --backends …`, not `-- --backends …`', () => {
    for (const command of ['-- --backends memory --duration 2s', '--backends memory --duration 2s']) {
      const html = htmlReport(report(command));
      expect(html).toContain('Command: <code>pnpm bench -- --backends memory --duration 2s</code>');
      expect(html).not.toContain('<code>--');
      expect(summaryMarkdown(report(command))).toContain(
        'Command: `pnpm bench -- --backends memory --duration 2s`',
      );
    }
    expect(htmlReport(report(''))).toContain('Command: <code>pnpm bench</code>');
  });
});

test('deadlocks a native baseline waited out are noted next to its figure', () => {
  const rows = [
    result({ mode: 'native', variant: 'repeatable-read', throughput: 50, deadlocks: 3 }),
    result({ ratios: [{ baseline: 'native:repeatable-read', throughput: 2, p50: 1 }] }),
  ];
  expect(summaryMarkdown(report('', rows))).toContain('RR 50.0 (3 deadlocks)');
  expect(htmlReport(report('', rows))).toContain('0.0% (3 deadlocks)');
});

test('sweep lines of one mode at several concurrencies are told apart by their dash', () => {
  const rows = [1, 4].flatMap((c) =>
    [1, 16].map((n) => result({ workload: `rows-${n}`, concurrency: c, throughput: 100 * c + n })),
  );
  const html = htmlReport(report('', rows));
  const legend = [...html.matchAll(/<line [^>]*stroke-width="3"([^>]*)\/>\s*<text[^>]*>(percolator c=\d)</g)];
  const dashes = new Map(legend.map((m) => [m[2], /stroke-dasharray="([^"]+)"/.exec(m[1]!)?.[1] ?? 'solid']));
  expect(dashes.get('percolator c=1')).toBe('solid');
  expect(dashes.get('percolator c=4')).toBe('6 3');
});

test('summary.md shows the plain engine only, where traced engines ran beside it, and marks failed cells', () => {
  // Found in review: with --tracing, the observer, oracle and round-trip tables had a row or
  // a figure per engine and nothing to tell which was which; a failed cell's figures stood
  // in the headline with no mark.
  const rows = [
    result({ throughput: 300, roundTrips: 4 }),
    result({ variant: 'si+otel', throughput: 250, roundTrips: 5 }),
    result({ mode: 'raw', variant: 'cas', throughput: 500, check: { ok: false, detail: 'lost' } }),
    result({ workload: 'oracle', throughput: 9000 }),
    result({ workload: 'oracle', variant: 'si+events', throughput: 8000 }),
    result({
      workload: 'observers',
      p50Ms: 1.5,
      observer: { runsPerSecond: 10, runs: 10, samples: 10 },
    }),
    result({
      workload: 'observers',
      variant: 'si+otel',
      p50Ms: 7.5,
      observer: { runsPerSecond: 20, runs: 20, samples: 20 },
    }),
  ];
  const md = summaryMarkdown(report('', rows));
  expect(md).toContain('300');
  expect(md).not.toMatch(/\b250\b/);
  expect(md).toContain('9,000');
  expect(md).not.toContain('8,000');
  expect(md).toContain('1.50');
  expect(md).not.toContain('7.50');
  expect(md).toMatch(/\| transfer \| – +\| 4\.0 +\| – +\| 8\.0 +\|/); // the plain engine only, no "4.0 / 5.0"
  expect(md).toContain('500 (FAILED)');
});
