import { build, type Histogram } from 'hdr-histogram-js';

/**
 * Latencies in an HDR histogram: recorded in microseconds (integers, 3 significant
 * digits, so any percentile is within 0.1% of the true value), reported in milliseconds.
 */
export class LatencyHistogram {
  private readonly histogram: Histogram = build({
    bitBucketSize: 32,
    autoResize: true,
    lowestDiscernibleValue: 1,
    highestTrackableValue: 60_000_000,
    numberOfSignificantValueDigits: 3,
  });

  /** Records one latency given in milliseconds (sub-microsecond values count as 1 µs). */
  record(ms: number): void {
    if (!Number.isFinite(ms) || ms < 0) throw new RangeError(`not a latency: ${ms}`);
    this.histogram.recordValue(Math.max(1, Math.round(ms * 1000)));
  }

  get count(): number {
    return this.histogram.totalCount;
  }

  /** The latency (ms) at or below which `percentile` % of the recorded values fall; 0 if empty. */
  percentileMs(percentile: number): number {
    if (!(percentile >= 0 && percentile <= 100)) throw new RangeError(`not a percentile: ${percentile}`);
    if (this.count === 0) return 0;
    return this.histogram.getValueAtPercentile(percentile) / 1000;
  }

  get meanMs(): number {
    return this.count === 0 ? 0 : this.histogram.mean / 1000;
  }

  get maxMs(): number {
    return this.count === 0 ? 0 : this.histogram.maxValue / 1000;
  }

  reset(): void {
    this.histogram.reset();
  }
}
