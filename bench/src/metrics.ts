import type { TxFailure } from './engines/engine.js';
import { LatencyHistogram } from './histogram.js';
import type { BenchResult, Ratio } from './types.js';

/** Counts of one measured window. */
export class CellStats {
  readonly latency = new LatencyHistogram();
  committed = 0;
  attempts = 0;
  gaveUp = 0;
  unknown = 0;
  errors = 0;
  readonly errorSamples: string[] = [];

  commit(attempts: number, latencyMs: number): void {
    this.committed++;
    this.attempts += attempts;
    this.latency.record(latencyMs);
  }

  fail(failure: TxFailure): void {
    this.attempts += failure.attempts;
    if (failure.kind === 'gave-up') this.gaveUp++;
    else {
      if (failure.kind === 'unknown') this.unknown++;
      else this.errors++;
      if (this.errorSamples.length < 5) this.errorSamples.push(failure.message.slice(0, 300));
    }
  }

  /** Transactions started (committed or not). */
  get transactions(): number {
    return this.committed + this.gaveUp + this.unknown + this.errors;
  }
}

/** Aborted attempts / all attempts (0 when nothing ran). */
export function abortRate(attempts: number, committed: number): number {
  return attempts === 0 ? 0 : (attempts - committed) / attempts;
}

/** Extra attempts per transaction started. */
export function retryRate(attempts: number, transactions: number): number {
  return transactions === 0 ? 0 : (attempts - transactions) / transactions;
}

/** Per second, given a count and a window in milliseconds. */
export function perSecond(count: number, windowMs: number): number {
  return windowMs <= 0 ? 0 : (count * 1000) / windowMs;
}

/** `part / whole`, or 0 when there is no whole (JSON has no NaN or Infinity). */
export function perUnit(part: number, whole: number): number {
  return whole === 0 ? 0 : part / whole;
}

export function round(value: number, digits = 3): number {
  const f = 10 ** digits;
  return Math.round(value * f) / f;
}

export function baselineName(result: Pick<BenchResult, 'mode' | 'variant'>): string {
  if (result.mode === 'percolator') return 'percolator';
  return result.mode === 'raw' ? 'raw' : `native:${result.variant}`;
}

/**
 * Ratios of each Percolator figure to every baseline of the same backend, workload and
 * concurrency measured in the same run (throughput: higher is better for Percolator;
 * p50: lower is better). A ratio against a zero is left out.
 */
export function withRatios(results: readonly BenchResult[]): BenchResult[] {
  return results.map((result) => {
    if (result.mode !== 'percolator') return result;
    const ratios: Ratio[] = [];
    for (const base of results) {
      // Percolator with tracing on (`--tracing otel`) is compared with Percolator without it.
      const plainPercolator = base.mode === 'percolator' && base.variant === 'si' && result.variant !== 'si';
      if (
        (base.mode === 'percolator' && !plainPercolator) ||
        base.backend !== result.backend ||
        base.workload !== result.workload ||
        base.concurrency !== result.concurrency ||
        base.throughput <= 0 ||
        base.p50Ms <= 0
      )
        continue;
      ratios.push({
        baseline: baselineName(base),
        throughput: round(result.throughput / base.throughput),
        p50: round(result.p50Ms / base.p50Ms),
      });
    }
    return { ...result, ratios };
  });
}
