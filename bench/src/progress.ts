import type { BenchResult } from './types.js';

/** Progress lines on stderr, so stdout carries only the tables. */
export interface Progress {
  info(message: string): void;
  cellStart(index: number, total: number, label: string): void;
  cellDone(result: BenchResult): void;
  cellSkipped(label: string, reason: string): void;
}

export const silentProgress: Progress = {
  info() {},
  cellStart() {},
  cellDone() {},
  cellSkipped() {},
};

export function stderrProgress(stream: NodeJS.WriteStream = process.stderr): Progress {
  const tty = stream.isTTY === true;
  let open = false;
  const line = (text: string) => {
    if (open) stream.write('\n');
    open = false;
    stream.write(`${text}\n`);
  };
  return {
    info: (message) => line(message),
    cellStart(index, total, label) {
      const text = `[${String(index).padStart(String(total).length)}/${total}] ${label}`;
      if (tty) {
        if (open) stream.write('\n');
        stream.write(`${text} ...`);
        open = true;
      } else line(`${text} ...`);
    },
    cellDone(r) {
      const summary =
        `${r.throughput} tx/s  p50 ${r.p50Ms}ms  p99 ${r.p99Ms}ms  aborts ${(r.abortRate * 100).toFixed(1)}%  ` +
        `${r.roundTrips} rt/tx  ${r.observer ? `observer runs ${r.observer.runsPerSecond}/s  ` : ''}${r.check.ok ? 'ok' : `CHECK FAILED: ${r.check.detail}`}` +
        (r.errors > 0 ? `  ${r.errors} errors` : '');
      if (tty && open) {
        stream.write(` ${summary}\n`);
        open = false;
      } else line(`      ${summary}`);
    },
    cellSkipped: (label, reason) => line(`skip ${label}: ${reason}`),
  };
}
