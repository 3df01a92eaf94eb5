import type { GrowthVerdict } from './growth.js';
import type { SoakReport, SoakSample } from './soak.js';

const MiB = 2 ** 20;

function mib(bytes: number): string {
  return Number.isFinite(bytes) ? `${(bytes / MiB).toFixed(1)} MiB` : '–';
}

function num(n: number, digits = 0): string {
  if (!Number.isFinite(n)) return '–';
  return n.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

function table(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: readonly string[]) =>
    cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ');
  return [line(header), widths.map((w) => '-'.repeat(w)).join('  '), ...rows.map(line)].join('\n');
}

/** One progress line per sample (stderr). */
export function sampleLine(s: SoakSample): string {
  const tx = (s.perSecond.transfers + s.perSecond.lists + s.perSecond.observerWrites).toFixed(1);
  return (
    `t=${Math.round(s.t / 1000)}s tx/s=${tx} (obs runs/s ${s.perSecond.observerRuns.toFixed(1)}) ` +
    `heap=${mib(s.heapUsedBytes)} rss=${mib(s.rssBytes)} conn=${num(s.connections)} sockets=${s.sockets} ` +
    `handles=${s.handles} timers=${s.timers} pending=${num(s.pendingNotifications)} ` +
    `history=${num(s.historyRows)} rows/${num(s.historyBytes / 1024, 1)} KiB`
  );
}

/** The human report: samples over time, checks, growth verdicts, verdict. */
export function soakTable(report: SoakReport): string {
  const out: string[] = [];
  out.push(
    `soak ${report.backend} (${report.target}), ${Math.round(report.ranMs / 1000)} s, seed ${report.seed}` +
      `${report.interrupted ? `, INTERRUPTED (${report.interrupted})` : ''}`,
  );
  out.push('');
  out.push(
    table(
      [
        't (s)',
        'transfers/s',
        'lists/s',
        'obs writes/s',
        'obs runs/s',
        'heap',
        'rss',
        'conn',
        'sockets',
        'handles',
        'timers',
        'pending',
        'history rows',
        'history KiB',
      ],
      report.samples.map((s) => [
        String(Math.round(s.t / 1000)),
        num(s.perSecond.transfers, 1),
        num(s.perSecond.lists, 1),
        num(s.perSecond.observerWrites, 1),
        num(s.perSecond.observerRuns, 1),
        mib(s.heapUsedBytes),
        mib(s.rssBytes),
        num(s.connections),
        String(s.sockets),
        String(s.handles),
        String(s.timers),
        num(s.pendingNotifications),
        num(s.historyRows),
        num(s.historyBytes / 1024, 1),
      ]),
    ),
  );
  const c = report.checks;
  out.push('');
  out.push(
    `transfers: ${c.transfers.commits} committed, ${c.transfers.unknown} unknown, ${c.transfers.gaveUp} gave up; ` +
      `total checked ${c.transfers.conservationChecks} times (${c.transfers.conservationSkipped} skipped), ` +
      `${c.transfers.violations.length === 0 ? 'always conserved' : `VIOLATED: ${c.transfers.violations.join('; ')}`}`,
  );
  out.push(
    `list-append: ${c.lists.windows} windows checked (largest ${c.lists.largestWindow} ops), ` +
      `${c.lists.ok} ok, ${c.lists.failed} failed, ${c.lists.unknown} unknown; ` +
      `${c.lists.anomalies.length === 0 ? 'no anomaly' : `ANOMALIES:\n${c.lists.anomalies.join('\n')}`}` +
      `${c.lists.allowedWindows > 0 ? ` (write skew, allowed, in ${c.lists.allowedWindows} windows)` : ''}`,
  );
  out.push(
    `observers: ${c.observers.writes} counted writes (${c.observers.unknownWrites} unknown), ${c.observers.runs} runs, ` +
      `${c.observers.conflicts} run conflicts, ${c.observers.failures} failed runs; ` +
      `${c.observers.drained ? 'drained' : 'NOT drained'}; ` +
      `${c.observers.problems.length === 0 ? 'every count and copy matches' : `PROBLEMS: ${c.observers.problems.join('; ')}`}`,
  );
  out.push(
    `gc: ${c.gc.passes} passes of db.gc over every row; dropped ${c.gc.versions} versions ` +
      `(${num(c.gc.headBytes / 1024, 1)} KiB of head rows) and ${c.gc.versionRows} version rows ` +
      `(${num(c.gc.versionRowBytes / 1024, 1)} KiB); ${c.gc.errors} errors`,
  );
  if (c.errors.length > 0) out.push(`unexpected errors:\n  ${c.errors.join('\n  ')}`);
  out.push('');
  out.push(
    table(
      ['metric', 'samples judged', 'first-third median', 'last-third median', 'limit', 'slope / h', 'grows'],
      report.growth.map((v) => [
        v.metric,
        String(v.samples),
        num(v.firstMedian),
        num(v.lastMedian),
        num(v.limit),
        num(v.slopePerHour),
        v.judged ? (v.grows ? 'YES' : 'no') : 'not judged',
      ]),
    ),
  );
  out.push('');
  out.push(`connections: ${report.measures.connections}`);
  out.push(`history: ${report.measures.history}`);
  out.push(`heap: ${report.measures.heap}`);
  out.push('');
  out.push(
    report.ok
      ? 'PASS'
      : `FAIL (${report.failures.length}):\n${report.failures.map((f) => `  - ${f}`).join('\n')}`,
  );
  return `${out.join('\n')}\n`;
}

/** Commits per second over every workload that commits on its own (observer runs apart). */
function txPerSecond(s: SoakSample): number {
  return s.perSecond.transfers + s.perSecond.lists + s.perSecond.observerWrites;
}

function duration(ms: number): string {
  const minutes = ms / 60_000;
  return minutes >= 2 ? `${minutes.toFixed(1)} min` : `${Math.round(ms / 1000)} s`;
}

/**
 * The docs/reliability.md table of finished runs, from their JSON reports: one row per run.
 * `rejudged` is the verdict the current growth rule and checks give the same samples.
 */
export function soakSummaryTable(
  runs: readonly { readonly report: SoakReport; readonly rejudged: readonly string[] }[],
): string {
  const header = [
    'store',
    'ran',
    'commits (transfers / list-append / observer writes / observer runs)',
    'tx/s first → last interval',
    'heap: start → warm-up end → end',
    'RSS: start → warm-up end → end',
    'connections: start → warm-up end → end (max)',
    'pending notifications median (max)',
    'history rows / KiB start → end (max)',
    'list-append windows checked',
    'verdict',
  ];
  const rows = runs.map(({ report, rejudged }) => {
    const s = report.samples;
    const first = s[1] ?? s[0]!;
    const last = s[s.length - 1]!;
    const warm = s.find((x) => x.t >= report.options.warmupMs) ?? last;
    const conn = (x: SoakSample) => (Number.isFinite(x.connections) ? x.connections : x.sockets);
    const connections = s.map(conn);
    const label = s.some((x) => Number.isFinite(x.connections)) ? '' : ' sockets';
    const pending = s.map((x) => x.pendingNotifications).filter(Number.isFinite);
    const sorted = [...pending].sort((a, b) => a - b);
    const history = (x: SoakSample) => `${num(x.historyRows)} / ${num(x.historyBytes / 1024, 1)}`;
    const maxHistory = s.reduce((m, x) => (x.historyBytes > m.historyBytes ? x : m), s[0]!);
    const t = report.totals;
    const verdict = report.ok ? 'PASS' : `FAIL: ${report.failures.slice(0, 3).join('; ')}`;
    const again = rejudged.length === 0 ? 'PASS' : `FAIL: ${rejudged.slice(0, 3).join('; ')}`;
    return [
      report.backend === 'mixed' ? 'composite' : report.backend,
      duration(report.ranMs),
      `${num(t.transfers)} / ${num(t.lists)} / ${num(t.observerWrites)} / ${num(t.observerRuns)}`,
      `${num(txPerSecond(first), 1)} → ${num(txPerSecond(last), 1)}`,
      `${mib(s[0]!.heapUsedBytes)} → ${mib(warm.heapUsedBytes)} → ${mib(last.heapUsedBytes)}`,
      `${mib(s[0]!.rssBytes)} → ${mib(warm.rssBytes)} → ${mib(last.rssBytes)}`,
      `${connections[0]} → ${conn(warm)} → ${connections[connections.length - 1]} (${Math.max(...connections)})${label}`,
      `${num(sorted[sorted.length >> 1] ?? Number.NaN)} (${num(sorted[sorted.length - 1] ?? Number.NaN)})`,
      `${history(s[0]!)} → ${history(last)} (${history(maxHistory)})`,
      `${report.checks.lists.windows} (${num(report.checks.lists.ok)} ok txns, ${report.checks.lists.anomalies.length} anomalies)`,
      verdict === again ? verdict : `${verdict} (current rule: ${again})`,
    ];
  });
  const line = (cells: readonly string[]) => `| ${cells.join(' | ')} |`;
  return [line(header), line(header.map(() => '---')), ...rows.map(line)].join('\n');
}

/** Per run, what the growth rule compared: first-third → last-third median (limit) per metric. */
export function soakGrowthTable(
  runs: readonly { readonly report: SoakReport; readonly growth: readonly GrowthVerdict[] }[],
): string {
  const metrics = [
    'heapUsedBytes',
    'rssBytes',
    'connections',
    'sockets',
    'handles',
    'timers',
    'historyBytes',
    'historyRows',
  ];
  const cell = (v: GrowthVerdict | undefined) => {
    if (!v) return '–';
    if (!v.judged) return 'not judged';
    const f = (n: number) =>
      v.metric === 'historyBytes' ? `${num(n / 1024, 1)} KiB` : v.metric.endsWith('Bytes') ? mib(n) : num(n);
    return `${f(v.firstMedian)} → ${f(v.lastMedian)} (${f(v.limit)})${v.grows ? ' GROWS' : ''}`;
  };
  const header = ['store', 'samples judged', ...metrics];
  const line = (cells: readonly string[]) => `| ${cells.join(' | ')} |`;
  return [
    line(header),
    line(header.map(() => '---')),
    ...runs.map(({ report, growth }) =>
      line([
        report.backend === 'mixed' ? 'composite' : report.backend,
        String(growth[0]?.samples ?? 0),
        ...metrics.map((m) => cell(growth.find((v) => v.metric === m))),
      ]),
    ),
  ].join('\n');
}
