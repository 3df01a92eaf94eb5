import type { BenchReport, BenchResult } from '../types.js';
import { COLUMNS, commandLine, fmtMs, fmtNumber, modeLabel, resultRow } from './format.js';
import { HISTORY_LEGEND, historyCellTable, historyRowTable, type Table } from './history.js';
import { ratioTo, TABLE_LEGEND, transferLines } from './summary.js';
import { type Bar, type BarGroup, barChart, esc, lineChart, type Series } from './svg.js';
import { skippedLabel } from './text.js';

const COLORS: Record<string, string> = {
  percolator: '#2563eb',
  'raw:cas': '#16a34a',
  'native:read-committed': '#ca8a04',
  'native:repeatable-read': '#d97706',
  'native:serializable': '#dc2626',
  'native:watch-multi-exec': '#9333ea',
  'native:transact-items': '#0891b2',
};
const color = (label: string) => COLORS[label] ?? '#64748b';

const STYLE = `body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#111;max-width:1200px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}h3{font-size:15px}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}
td:nth-child(-n+3),th:nth-child(-n+3){text-align:left}.fail{color:#b91c1c;font-weight:bold}
svg text.v{font-size:11px;fill:#333}svg text.l{font-size:12px;fill:#111}.charts{display:flex;flex-wrap:wrap;gap:24px}
.note{color:#555}`;

function section(title: string, body: string): string {
  return body ? `<h3>${esc(title)}</h3>${body}` : '';
}

/** Throughput per workload, one bar per mode, scaled within each workload. */
function throughputChart(results: readonly BenchResult[], multiC: boolean): string {
  const groups = new Map<string, BarGroup['bars'][number][]>();
  for (const r of results) {
    const key = multiC ? `${r.workload} c=${r.concurrency}` : r.workload;
    const bars = groups.get(key) ?? [];
    bars.push({
      name: modeLabel(r),
      value: r.throughput,
      text: `${fmtNumber(r.throughput)} tx/s`,
      color: color(modeLabel(r)),
    });
    groups.set(key, bars);
  }
  return barChart(
    [...groups].map(([label, bars]) => ({ label, bars })),
    { scale: 'group' },
  );
}

function latencyChart(results: readonly BenchResult[], multiC: boolean): string {
  const groups: BarGroup[] = [];
  for (const r of results) {
    const label = multiC ? `${r.workload} c=${r.concurrency}` : r.workload;
    let group = groups.find((g) => g.label === label);
    if (!group) groups.push((group = { label, bars: [] }));
    (group.bars as Bar[]).push({
      name: r.observer ? `${modeLabel(r)} (writer commit → observer commit)` : modeLabel(r),
      value: r.p99Ms,
      text: `p50 ${fmtMs(r.p50Ms)} / p99 ${fmtMs(r.p99Ms)} ms`,
      color: color(modeLabel(r)),
    });
  }
  return barChart(groups, { scale: 'group' });
}

/** Solid for the lowest concurrency, then dashed, dotted, dash-dotted. */
const DASHES: readonly (string | undefined)[] = [undefined, '6 3', '2 3', '8 3 2 3'];

/** Lines over a sweep (`rows-<n>` or `contention-<n>`), one per mode and concurrency. */
function sweepChart(
  results: readonly BenchResult[],
  prefix: string,
  pick: (r: BenchResult) => number,
  yLabel: string,
  xLabel: string,
  log: boolean,
  yMax?: number,
): string {
  const series = new Map<string, Series>();
  const concurrencies = [...new Set(results.map((r) => r.concurrency))].sort((a, b) => a - b);
  for (const r of results) {
    const m = new RegExp(`^${prefix}-(\\d+)$`).exec(r.workload);
    if (!m) continue;
    const name = `${modeLabel(r)} c=${r.concurrency}`;
    // One color per mode; each concurrency its own dash, so the legend tells them apart.
    const dash = DASHES[concurrencies.indexOf(r.concurrency) % DASHES.length];
    const s = series.get(name) ?? { name, color: color(modeLabel(r)), points: [], ...(dash ? { dash } : {}) };
    (s.points as [number, number][]).push([Number(m[1]), pick(r)]);
    series.set(name, s);
  }
  const usable = [...series.values()].filter((s) => s.points.length >= 2);
  if (usable.length === 0) return '';
  return lineChart(usable, { xLabel, yLabel, xLog: true, yLog: log, yMax });
}

function table(results: readonly BenchResult[]): string {
  const head = `<tr>${COLUMNS.map((c) => `<th>${esc(c)}</th>`).join('')}</tr>`;
  const rows = results.map((r) => {
    const cells = resultRow(r).map((c, i) => {
      const failed = i === COLUMNS.length - 1 && c !== 'ok';
      const title = i === COLUMNS.length - 1 ? ` title="${esc(r.check.detail)}"` : '';
      return `<td${failed ? ' class="fail"' : ''}${title}>${esc(c)}</td>`;
    });
    return `<tr>${cells.join('')}</tr>`;
  });
  return `<table>${head}${rows.join('')}</table>`;
}

/**
 * The headline: per backend, transfer throughput through Percolator next to raw CAS and
 * each native transaction (bars scaled within each backend, since stores differ by orders
 * of magnitude), each baseline labelled with Percolator's ratio to it.
 */
function transferChart(report: BenchReport): string {
  const lines = transferLines(report);
  const multiC = new Set(lines.map((l) => l.concurrency)).size > 1;
  const groups: BarGroup[] = [];
  for (const l of lines) {
    const bars: Bar[] = [];
    const bar = (r: BenchResult, vs: string) =>
      bars.push({
        name: modeLabel(r),
        value: r.throughput,
        text: `${fmtNumber(r.throughput)} tx/s${vs}`,
        color: color(modeLabel(r)),
      });
    if (l.percolator) bar(l.percolator, '');
    for (const base of [...(l.raw ? [l.raw] : []), ...l.natives]) {
      const ratio = ratioTo(l.percolator, base);
      bar(base, ratio === undefined ? '' : ` (Percolator ÷ this: ${ratio.toFixed(2)})`);
    }
    if (l.natives.length === 0 && l.nativeMissing)
      bars.push({ name: 'native', value: 0, text: `none (${l.nativeMissing})`, color: '#cbd5e1' });
    if (bars.length > 0) groups.push({ label: multiC ? `${l.backend} c=${l.concurrency}` : l.backend, bars });
  }
  if (groups.length === 0) return '';
  return barChart(groups, { scale: 'group', width: 1100, textWidth: 440 });
}

/** The paper's Figure 8 figures: Percolator ÷ raw for single-row reads and one-row writes. */
function paperChart(report: BenchReport): string {
  const groups: BarGroup[] = [];
  for (const l of transferLines(report)) {
    const bars: Bar[] = [];
    if (l.readVsRaw !== undefined)
      bars.push({ name: 'read / raw', value: l.readVsRaw, text: l.readVsRaw.toFixed(2), color: '#2563eb' });
    if (l.writeVsRaw !== undefined)
      bars.push({
        name: 'write txn / raw',
        value: l.writeVsRaw,
        text: l.writeVsRaw.toFixed(2),
        color: '#f59e0b',
      });
    if (bars.length > 0) groups.push({ label: `${l.backend} c=${l.concurrency}`, bars });
  }
  if (groups.length === 0) return '';
  return barChart(groups, {
    scale: 'shared',
    references: [
      { value: 0.94, label: 'paper: reads 0.94' },
      { value: 0.23, label: 'paper: writes 0.23' },
    ],
  });
}

function htmlTable(t: Table): string {
  const head = `<tr>${t.header.map((c) => `<th>${esc(c)}</th>`).join('')}</tr>`;
  const rows = t.rows.map((r) => `<tr>${r.map((c) => `<td>${esc(c)}</td>`).join('')}</tr>`);
  return `<table>${head}${rows.join('')}</table>`;
}

/** Head-row bytes per backend (one update next to many), and the history cells' table. */
function historySection(report: BenchReport): string {
  const rows = historyRowTable(report);
  const cells = historyCellTable(report);
  if (!rows && !cells) return '';
  const groups: BarGroup[] = (report.history ?? []).map((h) => ({
    label: h.backend,
    bars: [
      {
        name: '1 update',
        value: h.freshRowBytes,
        text: `${h.freshRowBytes.toLocaleString('en-US')} B`,
        color: '#16a34a',
      },
      {
        name: `${h.versions.toLocaleString('en-US')} updates`,
        value: h.longRowBytes,
        text:
          `${h.longRowBytes.toLocaleString('en-US')} B (${h.ratio.toFixed(2)}x; limit ` +
          `${h.limitBytes.toLocaleString('en-US')} B: ${h.withinLimit ? 'within' : 'over'})`,
        color: h.withinLimit ? '#2563eb' : '#dc2626',
      },
    ],
  }));
  return [
    '<h2>Long histories</h2>',
    section(
      'Head row bytes: a cell written once next to a cell updated many times (1 KB values; one scale)',
      groups.length > 0 ? barChart(groups, { scale: 'shared' }) : '',
    ),
    rows ? htmlTable(rows) : '',
    section('Transactions on those cells, next to raw store calls', cells ? htmlTable(cells) : ''),
    `<p class="note">${esc(HISTORY_LEGEND)}</p>`,
  ].join('\n');
}

/** A self-contained HTML page: summary, per-backend charts, the full table. */
export function htmlReport(report: BenchReport): string {
  const backends = [...new Set(report.results.map((r) => r.backend))];
  const multiC = new Set(report.results.map((r) => r.concurrency)).size > 1;
  const parts: string[] = [
    `<h1>Percolator benchmark</h1>`,
    `<p class="note">${esc(report.startedAt)} – ${esc(report.finishedAt)}; ${report.host.cpus} CPUs, Node ${esc(report.host.node)}, ${esc(report.host.platform)}. Command: <code>${esc(commandLine(report.command))}</code></p>`,
  ];
  if (report.failures.length > 0) {
    parts.push(
      `<h2 class="fail">Failures</h2><ul>${report.failures.map((f) => `<li class="fail">${esc(f)}</li>`).join('')}</ul>`,
    );
  }
  parts.push(
    section(
      "Transfer throughput: Percolator next to raw CAS and each store's native transactions (bars scaled within each backend)",
      transferChart(report),
    ),
  );
  if (transferLines(report).length > 0) parts.push(`<div class="note">${esc(TABLE_LEGEND)}</div>`);
  parts.push(
    section(
      'Percolator / raw throughput (the paper: reads 0.94, one-cell write transactions 0.23)',
      paperChart(report),
    ),
  );
  parts.push(historySection(report));
  for (const backend of backends) {
    const rows = report.results.filter((r) => r.backend === backend);
    const plain = rows.filter((r) => !/^(rows|contention)-/.test(r.workload));
    parts.push(`<h2>${esc(backend)}</h2>`);
    parts.push(section('Throughput (bars scaled within each workload)', throughputChart(plain, multiC)));
    parts.push(section('Latency (bar: p99)', latencyChart(plain, multiC)));
    const sweeps = [
      sweepChart(rows, 'rows', (r) => r.throughput, 'tx/s (log)', 'rows per transaction', true),
      sweepChart(rows, 'rows', (r) => r.p50Ms, 'p50 ms (log)', 'rows per transaction', true),
      sweepChart(rows, 'contention', (r) => r.throughput, 'tx/s (log)', 'hot accounts', true),
      sweepChart(
        rows,
        'contention',
        (r) => r.abortRate * 100,
        'aborted attempts %',
        'hot accounts',
        false,
        100,
      ),
    ].filter(Boolean);
    if (sweeps.length > 0) parts.push(`<h3>Sweeps</h3><div class="charts">${sweeps.join('')}</div>`);
    parts.push(section('All figures', table(rows)));
  }
  if (report.skipped.length > 0) {
    parts.push(
      `<h2>Skipped</h2><ul>${report.skipped
        .map((s) => `<li>${esc(skippedLabel(s))}: ${esc(s.reason)}</li>`)
        .join('')}</ul>`,
    );
  }
  if (report.notes.length > 0)
    parts.push(`<h2>Notes</h2><ul>${report.notes.map((n) => `<li>${esc(n)}</li>`).join('')}</ul>`);
  parts.push(
    `<p class="note">rt/tx: store round trips per committed transaction, counted through a RowStore proxy (Percolator, raw) or per statement / command group (native). Aborts: aborted attempts / all attempts. Absolute numbers on a shared machine are noisy; ratios against baselines measured in the same run are what to compare.</p>`,
  );
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Percolator benchmark</title><style>${STYLE}</style></head><body>${parts.join('\n')}</body></html>\n`;
}
