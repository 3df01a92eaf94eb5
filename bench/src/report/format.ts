import { label } from '../engines/engine.js';
import type { BenchResult, Ratio } from '../types.js';

/** Short names for baselines in tables. */
const SHORT: Record<string, string> = {
  raw: 'raw',
  'native:read-committed': 'RC',
  'native:repeatable-read': 'RR',
  'native:serializable': 'SER',
  'native:watch-multi-exec': 'MULTI',
  'native:transact-items': 'TXN',
};

export function shortBaseline(name: string): string {
  return SHORT[name] ?? name;
}

export function modeLabel(r: Pick<BenchResult, 'mode' | 'variant'>): string {
  return label(r);
}

export function fmtNumber(n: number): string {
  if (n >= 100) return Math.round(n).toLocaleString('en-US');
  if (n >= 10) return n.toFixed(1);
  return n.toFixed(2);
}

export function fmtMs(ms: number): string {
  if (ms >= 100) return ms.toFixed(0);
  if (ms >= 10) return ms.toFixed(1);
  if (ms >= 1) return ms.toFixed(2);
  return ms.toFixed(3);
}

export function fmtPercent(fraction: number): string {
  return `${(fraction * 100).toFixed(1)}%`;
}

export function fmtRatios(ratios: readonly Ratio[]): string {
  return ratios.map((r) => `${r.throughput.toFixed(2)}× ${shortBaseline(r.baseline)}`).join(', ');
}

export const COLUMNS = [
  'backend',
  'workload',
  'mode',
  'c',
  'tx/s',
  'p50 ms',
  'p95 ms',
  'p99 ms',
  'aborts',
  'rt/tx',
  'seq rt/tx',
  'tx/s vs baseline',
  'check',
] as const;

/**
 * " (2 deadlocks)" when the store aborted attempts as deadlocks: each waited out the
 * server's deadlock timeout first, so the figure measures that wait too.
 */
export function deadlockNote(r: Pick<BenchResult, 'deadlocks'>): string {
  return r.deadlocks ? ` (${r.deadlocks} deadlock${r.deadlocks === 1 ? '' : 's'})` : '';
}

/** One table row per result, as text cells in COLUMNS order. */
export function resultRow(r: BenchResult): string[] {
  return [
    r.backend,
    r.workload,
    modeLabel(r),
    String(r.concurrency),
    fmtNumber(r.throughput),
    fmtMs(r.p50Ms),
    fmtMs(r.p95Ms),
    fmtMs(r.p99Ms),
    `${fmtPercent(r.abortRate)}${deadlockNote(r)}`,
    r.roundTrips.toFixed(2),
    r.criticalPath ? r.criticalPath.roundTrips.toFixed(2) : '–',
    r.observer ? `observer runs ${fmtNumber(r.observer.runsPerSecond)}/s` : fmtRatios(r.ratios),
    r.check.ok ? (r.errors > 0 ? `errors: ${r.errors}` : 'ok') : 'FAILED',
  ];
}

/** Arguments as a shell would need them typed: plain words as they are, anything else single-quoted. */
export function shellArgs(args: readonly string[]): string {
  return args
    .filter((a) => a !== '--')
    .map((a) => (/^[\w.,:=/@%+-]+$/.test(a) ? a : `'${a.replace(/'/g, `'\\''`)}'`))
    .join(' ');
}

/**
 * The command a report's `command` (its arguments) stands for, as one types it:
 * `pnpm bench -- --backends memory`, or `pnpm bench` with none. A `--` that pnpm passed
 * through (older reports kept it) is not an argument and is dropped.
 */
export function commandLine(command: string): string {
  const args = command
    .trim()
    .split(/\s+/)
    .filter((a) => a !== '' && a !== '--')
    .join(' ');
  return args ? `pnpm bench -- ${args}` : 'pnpm bench';
}
