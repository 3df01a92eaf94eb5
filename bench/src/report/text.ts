import type { BenchReport, BenchResult, SkippedCell } from '../types.js';
import { COLUMNS, deadlockNote, fmtNumber, fmtPercent, modeLabel, resultRow } from './format.js';
import { historySummaryLines } from './history.js';
import {
  historyMarkdown,
  mdTable,
  networkLine,
  ORACLE_LEGEND,
  observerTable,
  oracleTable,
  ROUND_TRIP_LEGEND,
  roundTripTable,
  TABLE_LEGEND,
  transferLines,
  transferTable,
} from './summary.js';

function pad(cells: readonly string[], widths: readonly number[]): string {
  return cells.map((c, i) => c.padEnd(widths[i]!)).join('  ');
}

/** A plain-text table for the terminal. */
export function terminalTable(report: BenchReport): string {
  const rows = report.results.map(resultRow);
  const widths = COLUMNS.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const lines = [pad(COLUMNS, widths), widths.map((w) => '-'.repeat(w)).join('  ')];
  let last = '';
  for (const [i, row] of rows.entries()) {
    const r = report.results[i]!;
    const group = `${r.backend}/${r.workload}/${r.concurrency}`;
    if (last && group !== last) lines.push('');
    last = group;
    lines.push(pad(row, widths));
  }
  return `${lines.join('\n')}\n${trailer(report)}`;
}

/** "postgres rows-256 native:transact-items", "mixed native", "dynamodb". */
export function skippedLabel(s: SkippedCell): string {
  const mode = s.mode && (s.variant ? modeLabel({ mode: s.mode, variant: s.variant }) : s.mode);
  return [s.backend, s.workload, mode].filter(Boolean).join(' ');
}

function trailer(report: BenchReport): string {
  const out: string[] = [
    'rt/tx: store calls per committed transaction (under load, background work included); ' +
      'seq rt/tx: sequential round trips of one transaction run alone (its critical path)',
    ...historySummaryLines(report),
  ];
  for (const s of report.skipped) out.push(`skipped ${skippedLabel(s)}: ${s.reason}`);
  for (const n of report.notes) out.push(`note: ${n}`);
  for (const f of report.failures) out.push(`FAILURE: ${f}`);
  return out.length > 0 ? `\n${out.join('\n')}\n` : '';
}

const SWEEP = /^(rows|contention)-(\d+)$/;

/**
 * One row per backend, mode and concurrency, one column per sweep point: throughput
 * (and, for contention, the abort rate).
 */
function sweepTable(results: readonly BenchResult[], kind: 'rows' | 'contention'): string | undefined {
  const points = new Set<number>();
  const rows = new Map<string, Map<number, BenchResult>>();
  for (const r of results) {
    const m = SWEEP.exec(r.workload);
    if (!m || m[1] !== kind) continue;
    const point = Number(m[2]);
    points.add(point);
    const key = `${r.backend}\u0000${modeLabel(r)}\u0000${r.concurrency}`;
    if (!rows.has(key)) rows.set(key, new Map());
    rows.get(key)!.set(point, r);
  }
  if (rows.size === 0) return undefined;
  const cols = [...points].sort((a, b) => (kind === 'rows' ? a - b : b - a));
  const cell = (r: BenchResult | undefined) =>
    r === undefined
      ? '–'
      : kind === 'rows'
        ? `${fmtNumber(r.throughput)} (${r.roundTrips.toFixed(0)} rt)`
        : `${fmtNumber(r.throughput)} (${fmtPercent(r.abortRate)})${deadlockNote(r)}`;
  return mdTable(
    ['backend', 'mode', 'c', ...cols.map((c) => (kind === 'rows' ? `${c} rows` : `${c} hot`))],
    [...rows].map(([key, byPoint]) => [...key.split('\u0000'), ...cols.map((c) => cell(byPoint.get(c)))]),
  );
}

/** The summary and the full table in Markdown, for the README. */
export function markdownReport(report: BenchReport): string {
  const opts = report.options as Record<string, unknown>;
  const lines: string[] = [];
  if (report.network) lines.push(networkLine(report.network), '');
  if (transferLines(report).length > 0) {
    lines.push(
      'Transfer throughput per backend through Percolator, next to raw single-row CAS and the ' +
        "store's own transactions, measured in the same run; Percolator's throughput as a fraction of each.",
      '',
      transferTable(report),
      '',
      TABLE_LEGEND,
      '',
    );
  }
  lines.push(
    `Host: ${report.host.cpus} × ${report.host.cpuModel}, Node ${report.host.node}; ${opts.durationMs} ms per cell after ` +
      `${opts.warmupMs} ms warm-up. rt/tx: store calls per committed transaction (counted, under load); seq rt/tx: sequential round trips on the critical path of one transaction run alone. ` +
      "Observer rows: p50/p95/p99 are notification latency, from the writer's commit to the observer's commit.",
  );
  const trips = roundTripTable(report);
  if (trips) lines.push('', 'Round trips per transaction:', '', trips, '', ROUND_TRIP_LEGEND);
  const oracle = oracleTable(report);
  if (oracle) lines.push('', 'Timestamp oracle ceiling:', '', oracle, '', ORACLE_LEGEND);
  const observers = observerTable(report);
  if (observers) lines.push('', observers);
  const history = historyMarkdown(report);
  if (history) lines.push('', history);
  const main = report.results.filter((r) => !SWEEP.test(r.workload));
  if (main.length > 0) lines.push('', mdTable(COLUMNS, main.map(resultRow)));
  const rows = sweepTable(report.results, 'rows');
  if (rows) lines.push('', 'Rows per transaction: tx/s (store round trips per transaction).', '', rows);
  const contention = sweepTable(report.results, 'contention');
  if (contention)
    lines.push('', 'Contention (transfers among N hot accounts): tx/s (aborted attempts).', '', contention);
  if (main.length < report.results.length) {
    lines.push(
      '',
      '<details><summary>All figures</summary>',
      '',
      mdTable(COLUMNS, report.results.map(resultRow)),
      '',
      '</details>',
    );
  }
  if (report.skipped.length > 0) {
    lines.push('', 'Skipped:', '');
    for (const s of report.skipped) lines.push(`- ${skippedLabel(s)}: ${s.reason}`);
  }
  if (report.notes.length > 0) lines.push('', ...report.notes.map((n) => `- ${n}`));
  return `${lines.join('\n')}\n`;
}
