import { baselineName } from '../metrics.js';
import type { BenchReport, BenchResult } from '../types.js';
import { commandLine, deadlockNote, fmtMs, fmtNumber, shortBaseline } from './format.js';
import { HISTORY_LEGEND, historyCellTable, historyRowTable, type Table } from './history.js';

/**
 * The headline: per backend (and concurrency), the transfer workload's throughput through
 * Percolator next to raw single-row CAS and each of the store's native transactions, with
 * Percolator's ratio to each, plus the paper's read and write ratios to raw.
 */
export interface TransferLine {
  readonly backend: string;
  readonly concurrency: number;
  readonly percolator?: BenchResult;
  readonly raw?: BenchResult;
  readonly natives: readonly BenchResult[];
  /** Why there is no native baseline on this backend, if there is none. */
  readonly nativeMissing?: string;
  /** Percolator ÷ raw throughput, single-row read and one-row write transaction. */
  readonly readVsRaw?: number;
  readonly writeVsRaw?: number;
  /** Whether a cell behind `readVsRaw` / `writeVsRaw` failed its check or had errors. */
  readonly readFailed?: boolean;
  readonly writeFailed?: boolean;
}

/**
 * The headline tables show the plain Percolator engine: with `--tracing`, the traced ones
 * (variant 'si+otel', ...) ran beside it on the same backend and concurrency, and rows or
 * figures of theirs would read as the plain engine's. results.md has them all, labelled.
 */
export function untraced(r: Pick<BenchResult, 'mode' | 'variant'>): boolean {
  return r.mode !== 'percolator' || r.variant === undefined || !r.variant.includes('+');
}

/** A cell that failed its check or had errors: its figures are marked where they are shown. */
export function failed(r: BenchResult | undefined): boolean {
  return r !== undefined && (!r.check.ok || r.errors > 0);
}

const marked = (text: string, ...results: (BenchResult | undefined)[]) =>
  results.some(failed) ? `${text} (FAILED)` : text;

/** Percolator's throughput over `base`'s, as recorded in its ratios. */
export function ratioTo(percolator: BenchResult | undefined, base: BenchResult): number | undefined {
  return percolator?.ratios.find((r) => r.baseline === baselineName(base))?.throughput;
}

export function transferLines(report: BenchReport): TransferLine[] {
  const lines: TransferLine[] = [];
  const find = (backend: string, c: number, workload: string, mode: BenchResult['mode']) =>
    report.results.filter(
      (r) =>
        r.backend === backend &&
        r.concurrency === c &&
        r.workload === workload &&
        r.mode === mode &&
        untraced(r),
    );
  const seen = new Set<string>();
  for (const r of report.results) {
    const key = `${r.backend}\u0000${r.concurrency}`;
    if (seen.has(key)) continue;
    seen.add(key);
    const percolator = find(r.backend, r.concurrency, 'transfer', 'percolator')[0];
    const rawRatio = (workload: string) =>
      find(r.backend, r.concurrency, workload, 'percolator')[0]?.ratios.find((x) => x.baseline === 'raw')
        ?.throughput;
    const ratioFailed = (workload: string) =>
      [
        find(r.backend, r.concurrency, workload, 'percolator')[0],
        find(r.backend, r.concurrency, workload, 'raw')[0],
      ].some(failed);
    const line: TransferLine = {
      backend: r.backend,
      concurrency: r.concurrency,
      percolator,
      raw: find(r.backend, r.concurrency, 'transfer', 'raw')[0],
      natives: find(r.backend, r.concurrency, 'transfer', 'native'),
      nativeMissing: report.skipped.find((s) => s.backend === r.backend && s.mode === 'native' && !s.workload)
        ?.reason,
      readVsRaw: rawRatio('read'),
      writeVsRaw: rawRatio('write'),
      readFailed: ratioFailed('read'),
      writeFailed: ratioFailed('write'),
    };
    const any = [line.percolator, line.raw, line.readVsRaw, line.writeVsRaw].some((x) => x !== undefined);
    if (any || line.natives.length > 0) lines.push(line);
  }
  return lines;
}

const NONE = '–';
const ratio = (n: number | undefined) => (n === undefined ? NONE : n.toFixed(2));

/** A Markdown table padded the way the formatter (biome) lays it out, so it pastes unchanged. */
export function mdTable(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const escapePipes = (text: string) => text.replace(/\|/g, '\\|');
  const all = [header, ...rows].map((r) => r.map(escapePipes));
  const widths = header.map((_, i) => Math.max(3, ...all.map((r) => (r[i] ?? '').length)));
  const line = (cells: readonly string[]) =>
    `| ${widths.map((w, i) => (cells[i] ?? '').padEnd(w)).join(' | ')} |`;
  return [line(all[0]!), line(widths.map((w) => '-'.repeat(w))), ...all.slice(1).map(line)].join('\n');
}

/** The one table: transfer tx/s per backend for Percolator, raw and native, with ratios. */
export function transferTable(report: BenchReport): string {
  const lines = transferLines(report);
  const multiC = new Set(lines.map((l) => l.concurrency)).size > 1;
  const rows = lines.map((l) => {
    const native =
      l.natives.length > 0
        ? l.natives
            .map((n) =>
              marked(`${shortBaseline(baselineName(n))} ${fmtNumber(n.throughput)}${deadlockNote(n)}`, n),
            )
            .join(', ')
        : NONE;
    const vsNative =
      l.natives.length > 0
        ? l.natives
            .map((n) =>
              marked(`${ratio(ratioTo(l.percolator, n))} ${shortBaseline(baselineName(n))}`, l.percolator, n),
            )
            .join(', ')
        : NONE;
    return [
      multiC ? `${l.backend} c=${l.concurrency}` : l.backend,
      l.percolator ? marked(fmtNumber(l.percolator.throughput), l.percolator) : NONE,
      l.raw ? marked(fmtNumber(l.raw.throughput), l.raw) : NONE,
      native,
      l.raw ? marked(ratio(ratioTo(l.percolator, l.raw)), l.percolator, l.raw) : NONE,
      vsNative,
      l.readFailed && l.readVsRaw !== undefined ? `${ratio(l.readVsRaw)} (FAILED)` : ratio(l.readVsRaw),
      l.writeFailed && l.writeVsRaw !== undefined ? `${ratio(l.writeVsRaw)} (FAILED)` : ratio(l.writeVsRaw),
    ];
  });
  return mdTable(
    [
      'backend',
      'transfer tx/s: Percolator',
      'raw',
      'native',
      'Percolator ÷ raw',
      'Percolator ÷ native',
      'read ÷ raw',
      'write ÷ raw',
    ],
    rows,
  );
}

export function mdOf(table: Table): string {
  return mdTable(table.header, table.rows);
}

/** The history workload's tables and legend in Markdown, if it ran. */
export function historyMarkdown(report: BenchReport): string | undefined {
  const rows = historyRowTable(report);
  const cells = historyCellTable(report);
  if (!rows && !cells) return undefined;
  const out = [
    'Long histories (`history`): the head row of a cell after one update of a 1 KB value and after many, ' +
      'and transactions on such cells next to raw store calls.',
  ];
  if (rows) out.push('', mdOf(rows));
  if (cells) out.push('', mdOf(cells));
  out.push('', HISTORY_LEGEND);
  return out.join('\n');
}

/** Notification latency and observer throughput per backend, if the run had the observer pipeline. */
export function observerTable(report: BenchReport): string | undefined {
  const rows = report.results
    .filter((r) => r.observer && untraced(r))
    .map((r) => [
      r.backend,
      String(r.concurrency),
      marked(fmtMs(r.p50Ms), r),
      fmtMs(r.p99Ms),
      fmtNumber(r.observer!.runsPerSecond),
    ]);
  if (rows.length === 0) return undefined;
  return mdTable(['backend', 'writers', 'notify p50 ms', 'notify p99 ms', 'observer runs/s'], rows);
}

const ROUND_TRIP_WORKLOADS = ['read', 'write', 'transfer'];

/**
 * Round trips per transaction of the read, write and transfer workloads, per backend and
 * mode: sequential (the waits on the critical path of one transaction run alone) and
 * store calls (everything, under load, background and retries included).
 */
export function roundTripTable(report: BenchReport): string | undefined {
  const rows: string[][] = [];
  const seen = new Set<string>();
  for (const r of report.results) {
    if (!ROUND_TRIP_WORKLOADS.includes(r.workload)) continue;
    const key = `${r.backend}\u0000${r.workload}\u0000${r.concurrency}`;
    if (seen.has(key)) continue;
    seen.add(key);
    const cell = (mode: BenchResult['mode']) => {
      const found = report.results.filter(
        (x) =>
          x.backend === r.backend &&
          x.workload === r.workload &&
          x.concurrency === r.concurrency &&
          x.mode === mode &&
          untraced(x),
      );
      if (found.length === 0) return [NONE, NONE];
      const seq = found.map((x) => (x.criticalPath ? x.criticalPath.roundTrips.toFixed(1) : NONE));
      return [[...new Set(seq)].join(' / '), found.map((x) => x.roundTrips.toFixed(1)).join(' / ')];
    };
    rows.push([r.backend, r.workload, ...cell('percolator'), ...cell('raw'), ...cell('native')]);
  }
  if (rows.length === 0) return undefined;
  return mdTable(
    [
      'backend',
      'workload',
      'Percolator: sequential',
      'calls',
      'raw: sequential',
      'calls',
      'native: sequential',
      'calls',
    ],
    rows,
  );
}

export const ROUND_TRIP_LEGEND =
  'sequential: round trips on the critical path of one transaction run alone (calls that ' +
  'overlap, a batch or a Promise.all, are one; calls the commit leaves to the background are ' +
  'not counted): what a network round trip multiplies. calls: every store call per committed ' +
  'transaction under load, retries, timestamp fetches and background work included (native: ' +
  'statements or requests; several native variants: each, separated by /).';

/** Timestamps per second from the CounterOracle with many waiters, per backend (the oracle workload). */
export function oracleTable(report: BenchReport): string | undefined {
  const rows = report.results
    .filter((r) => r.workload === 'oracle' && r.mode === 'percolator' && untraced(r))
    .map((r) => {
      const raw = report.results.find(
        (x) =>
          x.workload === 'oracle' &&
          x.mode === 'raw' &&
          x.backend === r.backend &&
          x.concurrency === r.concurrency,
      );
      return [
        r.backend,
        String(r.concurrency),
        fmtNumber(r.throughput),
        r.storeCalls ? fmtNumber(r.transactions / r.storeCalls) : NONE,
        fmtMs(r.p50Ms),
        fmtMs(r.p99Ms),
        raw ? fmtNumber(raw.throughput) : NONE,
      ];
    });
  if (rows.length === 0) return undefined;
  return mdTable(
    [
      'backend',
      'waiters',
      'timestamps/s (batched)',
      'timestamps per counter call',
      'p50 ms',
      'p99 ms',
      'unbatched increments/s',
    ],
    rows,
  );
}

export const ORACLE_LEGEND =
  "oracle: every waiter calls the CounterOracle's next() in a loop; requests that arrive " +
  'while a fetch is in flight share the next one (one counter increment for the batch). ' +
  'unbatched: one counter increment per timestamp (the raw mode).';

/** The --rtt line of the summary. */
export function networkLine(network: NonNullable<BenchReport['network']>): string {
  return (
    `Network: \`--rtt ${network.rttMs}\`: every backend round trip goes through a loopback proxy ` +
    `holding each chunk (memory: an in-process wait per call); a round trip through it measured ` +
    `${network.measuredRttMs.toFixed(2)} ms (median), baselines through the same proxies.`
  );
}

export const TABLE_LEGEND =
  'raw: the same reads and writes as single-row check-and-set calls through the adapter, ' +
  'no protocol and not atomic (a transfer is two one-row legs). Native: RC, RR, SER = SQL ' +
  'READ COMMITTED / REPEATABLE READ / SERIALIZABLE; MULTI = Redis WATCH/MULTI/EXEC; TXN = DynamoDB ' +
  "TransactWriteItems (reads: a consistent BatchGetItem). read/write ÷ raw: the paper's Figure 8 figures " +
  '(Bigtable: reads 0.94, one-cell write transactions 0.23). mixed: one CompositeStore, rows ' +
  'sharded by key hash over PostgreSQL, Redis and DynamoDB.';

/**
 * A short Markdown summary to paste into the README: the command, the machine, the date,
 * the one table (and the observer figures when measured).
 */
export function summaryMarkdown(report: BenchReport): string {
  const opts = report.options as { durationMs?: number; warmupMs?: number; concurrency?: number[] };
  const versions = Object.entries(report.versions)
    .map(([backend, v]) => `${backend}: ${v}`)
    .join('; ');
  const out = [
    `Command: \`${commandLine(report.command)}\``,
    '',
    `Machine: ${report.host.cpus} × ${report.host.cpuModel}, ${report.host.platform}, Node ${report.host.node}` +
      (versions ? `; ${versions}` : '') +
      '.',
    '',
    `Date: ${report.startedAt.slice(0, 10)}; ${opts.durationMs} ms per cell after ${opts.warmupMs} ms ` +
      `warm-up, ${(opts.concurrency ?? []).join(', ')} concurrent clients.`,
  ];
  if (report.network) out.push('', networkLine(report.network));
  if (transferLines(report).length > 0) out.push('', transferTable(report), '', TABLE_LEGEND);
  const missing = transferLines(report).filter((l) => l.nativeMissing);
  if (missing.length > 0) {
    out.push(
      '',
      `No native baseline: ${[...new Map(missing.map((l) => [l.backend, l.nativeMissing])).entries()]
        .map(([b, why]) => `${b} (${why})`)
        .join('; ')}.`,
    );
  }
  const trips = roundTripTable(report);
  if (trips) out.push('', 'Round trips per transaction:', '', trips, '', ROUND_TRIP_LEGEND);
  const oracle = oracleTable(report);
  if (oracle) out.push('', 'Timestamp oracle ceiling:', '', oracle, '', ORACLE_LEGEND);
  const observers = observerTable(report);
  if (observers) {
    out.push(
      '',
      "Observer pipeline: notification latency from the writer's commit to the observer's commit.",
      '',
      observers,
    );
  }
  const history = historyMarkdown(report);
  if (history) out.push('', history);
  const unreached = report.skipped.filter((s) => !s.workload && !s.mode);
  if (unreached.length > 0)
    out.push('', `Skipped: ${unreached.map((s) => `${s.backend} (${s.reason})`).join('; ')}.`);
  if (report.failures.length > 0) out.push('', `**${report.failures.length} failure(s)**: see results.md.`);
  return `${out.join('\n')}\n`;
}
