/** Text helpers shared by the commands' readable output. */
import { shownName } from '@percolator/core';

/**
 * A name as typed: bare when plain, else a JSON string (NUL, spaces, quotes visible). The
 * library's one rule (core's shownName), which its own messages follow too.
 */
export const shown = shownName;

export function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}

/** A duration in ms, short and readable: 850 ms, 12.3 s, 4.5 min, 2.1 h. */
export function duration(ms: number): string {
  const a = Math.abs(ms);
  if (a < 10_000) return `${Math.round(ms)} ms`;
  if (a < 120_000) return `${(ms / 1000).toFixed(1)} s`;
  if (a < 7_200_000) return `${(ms / 60_000).toFixed(1)} min`;
  return `${(ms / 3_600_000).toFixed(1)} h`;
}

export function ago(ms: number): string {
  return ms < 0 ? `${duration(-ms)} in the future` : `${duration(ms)} ago`;
}

export function bytes(n: number): string {
  if (n < 10_000) return `${n} B`;
  if (n < 10_000_000) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

const UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, min: 60_000, h: 3_600_000, d: 86_400_000 };

/** "30s", "1500ms", "1.5s", "2m", "1h", "1d": a number and its unit. Throws on anything else, a bare number included. */
export function parseDuration(text: string): number {
  // The unit is required: a bare `3600` meant as seconds would otherwise be 3.6 s of
  // retention, and `gc` would prune history the deployment's snapshots still need.
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|min|h|d)$/.exec(text.trim());
  if (!m) {
    const bare = /^\d+(?:\.\d+)?$/.test(text.trim());
    throw new Error(
      bare
        ? `${JSON.stringify(text)} has no unit: write it as ${text.trim()}ms, ${text.trim()}s, ${text.trim()}m, ... (units: ms, s, m, min, h, d)`
        : `not a duration: ${JSON.stringify(text)} (e.g. 30s, 500ms, 5m, 1h)`,
    );
  }
  const ms = Math.round(Number(m[1]) * UNITS[m[2]!]!);
  // Bounded here, so the error names the option, not a library setting it reaches.
  if (ms > MAX_DURATION_MS) throw new Error(`${JSON.stringify(text)} is too long: at most 100 years`);
  return ms;
}

/** The longest duration an option takes (100 years, well inside a safe integer of ms). */
const MAX_DURATION_MS = 100 * 365.25 * 86_400_000;

/** Aligned columns; the first row is the header. */
export function table(rows: readonly (readonly string[])[]): string {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? '').length)));
  return rows
    .map((r) =>
      r
        .map((cell, i) => (i === r.length - 1 ? cell : cell.padEnd(widths[i]!)))
        .join('  ')
        .trimEnd(),
    )
    .join('\n');
}
