export {
  type BackendSettings,
  BackendUnavailable,
  loadData,
  type OpenBackend,
  openBackend,
} from './backends.js';
export { runBench } from './bench.js';
export { type CallCounts, CompositeCountingStore, CountingStore } from './counting-store.js';
export * from './dataset.js';
export * from './engines/engine.js';
export { PercolatorEngine } from './engines/percolator.js';
export { RAW_TABLE, RawEngine } from './engines/raw.js';
export { LatencyHistogram } from './histogram.js';
export { BadReadError, type CheckKind, Ledger, verify } from './ledger.js';
export {
  abortRate,
  baselineName,
  CellStats,
  perSecond,
  perUnit,
  retryRate,
  round,
  withRatios,
} from './metrics.js';
export {
  measureObserverLatency,
  type ObserverLatencyOptions,
  type ObserverLatencyReport,
} from './observer-latency.js';
export { type ObserverHooks, ObserverSession } from './observers.js';
export { type BenchOptions, DEFAULTS, parseDuration, parseOptions, USAGE } from './options.js';
export { type Progress, silentProgress, stderrProgress } from './progress.js';
export * from './random.js';
export { htmlReport } from './report/html.js';
export { summaryMarkdown, transferLines, transferTable } from './report/summary.js';
export { markdownReport, terminalTable } from './report/text.js';
export { writeReports } from './report/write.js';
export { type CellSpec, runCell } from './runner.js';
export { SharedServices } from './services.js';
export * from './types.js';
export {
  ALL_WORKLOADS,
  CONTENTION_SWEEP,
  DEFAULT_WORKLOADS,
  ROWS_SWEEP,
  WORKLOAD_GROUPS,
  type Workload,
  workloadByName,
} from './workloads.js';
