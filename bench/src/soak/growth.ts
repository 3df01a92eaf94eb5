/**
 * The soak's growth rule: does a metric grow without bound?
 *
 * A run cannot see "without bound" directly, so it looks for sustained growth after the
 * warm-up. Of the samples taken after the warm-up (at least MIN_SAMPLES of them), it
 * compares the median of the last third with the median of the first third; medians, so a
 * single spike (a GC pause, a burst of connections) decides nothing. A metric GROWS when
 *
 *     median(last third) > ratio × median(first third) + slack   and   least-squares slope > 0
 *
 * with a ratio and a slack per metric (GROWTH_BOUNDS). A bounded metric levels off after
 * the warm-up and keeps its medians within the bound; a leak of any steady rate passes it
 * once the run is long enough: in a 1-hour run (45 judged minutes), one leaked connection
 * a minute, or a heap that keeps 1 MiB more a minute on a 20 MiB live set, fails it (the
 * unit tests show both). Too few samples means not judged, never passed
 * silently: the report says so, and the CLI fails a run where nothing could be judged.
 */

export interface Sample {
  /** Ms since the workloads started. */
  readonly t: number;
  readonly value: number;
}

export interface GrowthBound {
  /** Last-third median may be at most this multiple of the first-third median... */
  readonly ratio: number;
  /** ...plus this absolute slack (in the metric's unit). */
  readonly slack: number;
}

export interface GrowthVerdict {
  readonly metric: string;
  /** Samples after the warm-up that were judged (0 when too few). */
  readonly samples: number;
  readonly judged: boolean;
  readonly firstMedian: number;
  readonly lastMedian: number;
  /** ratio × firstMedian + slack. */
  readonly limit: number;
  /** Least-squares slope over the judged samples, per hour. */
  readonly slopePerHour: number;
  readonly grows: boolean;
}

export const MIN_SAMPLES = 6;

/** Per-metric bounds. Byte metrics in bytes. */
export const GROWTH_BOUNDS: Readonly<Record<string, GrowthBound>> = {
  /** V8 heap used, after a full GC when the process runs with --expose-gc. */
  heapUsedBytes: { ratio: 1.25, slack: 8 * 2 ** 20 },
  rssBytes: { ratio: 1.25, slack: 32 * 2 ** 20 },
  /** Pools open connections lazily under bursts: a few more later is not a leak. */
  connections: { ratio: 1.25, slack: 8 },
  /** Active handles other than timers (sockets, file handles, ...). */
  handles: { ratio: 1.25, slack: 16 },
  /** Active timers: backoff sleeps and lease renewals in flight come and go. */
  timers: { ratio: 1.25, slack: 32 },
  /** judgeMetrics uses ratio 1 and the number of observed rows as the slack instead. */
  pendingNotifications: { ratio: 1, slack: 32 },
  historyBytes: { ratio: 1.5, slack: 256 * 1024 },
  historyRows: { ratio: 1.5, slack: 64 },
};

export function median(values: readonly number[]): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

/** Least-squares slope of value over t (per ms); 0 for fewer than two distinct times. */
export function slope(samples: readonly Sample[]): number {
  const n = samples.length;
  if (n < 2) return 0;
  const meanT = samples.reduce((s, x) => s + x.t, 0) / n;
  const meanV = samples.reduce((s, x) => s + x.value, 0) / n;
  let num = 0;
  let den = 0;
  for (const { t, value } of samples) {
    num += (t - meanT) * (value - meanV);
    den += (t - meanT) ** 2;
  }
  return den === 0 ? 0 : num / den;
}

export function judgeGrowth(
  metric: string,
  samples: readonly Sample[],
  warmupMs: number,
  bound: GrowthBound,
): GrowthVerdict {
  const judged = samples.filter((s) => s.t >= warmupMs && Number.isFinite(s.value));
  const n = judged.length;
  if (n < MIN_SAMPLES) {
    return {
      metric,
      samples: 0,
      judged: false,
      firstMedian: Number.NaN,
      lastMedian: Number.NaN,
      limit: Number.NaN,
      slopePerHour: 0,
      grows: false,
    };
  }
  const third = Math.floor(n / 3);
  const firstMedian = median(judged.slice(0, third).map((s) => s.value));
  const lastMedian = median(judged.slice(n - third).map((s) => s.value));
  const limit = bound.ratio * firstMedian + bound.slack;
  const perMs = slope(judged);
  return {
    metric,
    samples: n,
    judged: true,
    firstMedian,
    lastMedian,
    limit,
    slopePerHour: perMs * 3_600_000,
    grows: lastMedian > limit && perMs > 0,
  };
}
