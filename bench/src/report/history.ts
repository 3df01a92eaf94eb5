import type { BenchReport, BenchResult, HistoryRows, IoFigures } from '../types.js';
import { fmtMs, fmtNumber } from './format.js';

/** A table as text cells, rendered as Markdown or HTML by the caller. */
export interface Table {
  readonly header: readonly string[];
  readonly rows: readonly (readonly string[])[];
}

const NONE = '–';

const bytes = (n: number) => `${Math.round(n).toLocaleString('en-US')} B`;

/** "1,000" */
const count = (n: number) => n.toLocaleString('en-US');

export const HISTORY_LEGEND =
  "Head row: the row every protocol step reads and check-and-sets, as `store.read(table, row)` returns it (the largest of the cells; the mean when it differs); the target is at most 1.5x a fresh cell's plus 512 bytes. " +
  'Read p50: read transactions measured in pairs by one client after the setup (a fresh cell, then a long one, alternately first), so passing load weighs on both alike; the target is at most 1.5x. ' +
  'Transactions: reads at a current snapshot, or blind writes of a new 1 KB value, on one cell. ' +
  'raw: reads: `store.read` of the same head rows, no protocol; writes: one check-and-set of a 1 KB value to a plain row. ' +
  'B/tx: row state bytes read + written through the store per committed transaction; calls/tx: store reads + writes ' +
  '(a batch is one call), the oracle and background work included.';

/** One row per backend: head-row bytes after one update and after many, and the target. */
export function historyRowTable(report: BenchReport): Table | undefined {
  const history = report.history ?? [];
  if (history.length === 0) return undefined;
  const versions = new Set(history.map((h) => h.versions));
  const many = versions.size === 1 ? `${count([...versions][0]!)} updates` : 'n updates';
  return {
    header: [
      'backend',
      'head row: 1 update',
      many,
      'ratio',
      'within 1.5x + 512 B',
      'read p50 ms: fresh, long',
      'read long ÷ fresh',
      'setup',
    ],
    rows: history.map((h: HistoryRows) => [
      versions.size === 1 ? h.backend : `${h.backend} (n = ${count(h.versions)})`,
      sizeText(h.freshRowBytes, h.freshRowMeanBytes),
      sizeText(h.longRowBytes, h.longRowMeanBytes),
      `${h.ratio.toFixed(2)}x`,
      h.withinLimit ? `yes (≤ ${bytes(h.limitBytes)})` : `NO (> ${bytes(h.limitBytes)})`,
      h.reads ? `${fmtMs(h.reads.freshP50Ms)}, ${fmtMs(h.reads.longP50Ms)}` : NONE,
      h.reads ? `${h.reads.ratio.toFixed(2)}x (${h.reads.withinLimit ? 'within' : 'OVER'} 1.5x)` : NONE,
      `${h.cells} + ${h.cells} cells, ${(h.setupMs / 1000).toFixed(1)} s`,
    ]),
  };
}

/** The largest head row, and the mean when they differ: "2,212 B (mean 1,310 B)". */
function sizeText(max: number, meanBytes: number | undefined): string {
  return meanBytes === undefined || meanBytes === max
    ? bytes(max)
    : `${bytes(max)} (mean ${bytes(meanBytes)})`;
}

function ioText(io: IoFigures | undefined): { bytes: string; calls: string } {
  if (!io) return { bytes: NONE, calls: NONE };
  return {
    bytes: `${count(Math.round(io.bytesRead))} + ${count(Math.round(io.bytesWritten))}`,
    calls: `${io.reads.toFixed(2)} + ${io.writes.toFixed(2)}`,
  };
}

const CELLS: readonly [string, string][] = [
  ['history-read-fresh', 'read, fresh cell'],
  ['history-read-long', 'read, long history'],
  ['history-write-long', 'write, long history'],
];

/** The history cells of one backend and concurrency, by workload. */
export interface HistoryLine {
  readonly backend: string;
  readonly concurrency: number;
  readonly workload: string;
  readonly label: string;
  readonly percolator?: BenchResult;
  readonly raw?: BenchResult;
  /** Percolator on long-history cells ÷ on fresh cells (reads only): throughput and p50. */
  readonly longVsFresh?: { readonly throughput: number; readonly p50: number };
}

export function historyLines(report: BenchReport): HistoryLine[] {
  const lines: HistoryLine[] = [];
  const find = (backend: string, c: number, workload: string, mode: BenchResult['mode']) =>
    report.results.find(
      (r) => r.backend === backend && r.concurrency === c && r.workload === workload && r.mode === mode,
    );
  const seen = new Set<string>();
  for (const r of report.results) {
    const key = `${r.backend}\u0000${r.concurrency}`;
    if (!r.workload.startsWith('history-') || seen.has(key)) continue;
    seen.add(key);
    const freshRead = find(r.backend, r.concurrency, 'history-read-fresh', 'percolator');
    for (const [workload, label] of CELLS) {
      const percolator = find(r.backend, r.concurrency, workload, 'percolator');
      const raw = find(r.backend, r.concurrency, workload, 'raw');
      if (!percolator && !raw) continue;
      const longVsFresh =
        workload === 'history-read-long' && percolator && freshRead && freshRead.throughput > 0
          ? {
              throughput: percolator.throughput / freshRead.throughput,
              p50: freshRead.p50Ms > 0 ? percolator.p50Ms / freshRead.p50Ms : 0,
            }
          : undefined;
      lines.push({
        backend: r.backend,
        concurrency: r.concurrency,
        workload,
        label,
        percolator,
        raw,
        longVsFresh,
      });
    }
  }
  return lines;
}

/** One row per backend and transaction kind: Percolator next to raw, bytes and calls per transaction. */
export function historyCellTable(report: BenchReport): Table | undefined {
  const lines = historyLines(report);
  if (lines.length === 0) return undefined;
  const multiC = new Set(lines.map((l) => l.concurrency)).size > 1;
  return {
    header: [
      'backend',
      'transaction',
      'Percolator tx/s',
      'p50 ms',
      'long ÷ fresh',
      'raw tx/s',
      'Percolator ÷ raw',
      'B/tx read + written',
      'raw B/tx',
      'calls/tx read + write',
      'raw calls/tx',
    ],
    rows: lines.map((l) => {
      const p = ioText(l.percolator?.io);
      const raw = ioText(l.raw?.io);
      const vsRaw = l.percolator?.ratios.find((x) => x.baseline === 'raw')?.throughput;
      return [
        multiC ? `${l.backend} c=${l.concurrency}` : l.backend,
        l.label,
        l.percolator ? fmtNumber(l.percolator.throughput) : NONE,
        l.percolator ? fmtMs(l.percolator.p50Ms) : NONE,
        l.longVsFresh
          ? `${l.longVsFresh.throughput.toFixed(2)}x tx/s, ${l.longVsFresh.p50.toFixed(2)}x p50`
          : NONE,
        l.raw ? fmtNumber(l.raw.throughput) : NONE,
        vsRaw === undefined ? NONE : vsRaw.toFixed(2),
        p.bytes,
        raw.bytes,
        p.calls,
        raw.calls,
      ];
    }),
  };
}

/** A terminal line per backend with head-row figures. */
export function historySummaryLines(report: BenchReport): string[] {
  return (report.history ?? []).map(
    (h) =>
      `history ${h.backend}: head row ${bytes(h.freshRowBytes)} after 1 update, ${bytes(h.longRowBytes)} after ` +
      `${count(h.versions)} (${h.ratio.toFixed(2)}x; limit ${bytes(h.limitBytes)}: ${h.withinLimit ? 'within' : 'OVER'})`,
  );
}
