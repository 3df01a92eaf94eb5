export type { PrunePolicy } from './cells.js';
export { checkedStore, uncheckedStore } from './checked-store.js';
export { MAX_TIMESTAMP } from './codec.js';
export {
  CompositeStore,
  type CompositeStoreOptions,
  type Placement,
  shardOf,
  type TableRoute,
} from './composite-store.js';
export type { CommitStep, CommitStepEvent, PercolatorHooks } from './env.js';
export * from './errors.js';
export type {
  CommitFenceEvent,
  CommitStepEndEvent,
  CommitStepName,
  GcEvent,
  LockResolveEvent,
  LockWaitEvent,
  ObserverBeginEvent,
  ObserverRunEvent,
  ObserverRunRef,
  PercolatorEvent,
  PercolatorEventListener,
  TidyEvent,
  TransactionBeginEvent,
  TransactionEndEvent,
  TransactionOutcome,
  TransactionRef,
  TransactionRetryEvent,
} from './events.js';
export type { GcOptions, GcReport } from './gc.js';
export {
  type CellView,
  type HeadRowView,
  inspectHeadRow,
  type LockedCell,
  namedVersionRows,
  type ObserverAck,
  observerAcks,
  type PendingColumn,
  type PrimaryFate,
  primaryFate,
  type ScanLocksOptions,
  type ScanNotificationsOptions,
  scanLocks,
  scanNotifications,
  versionRowRef,
  versionRowValue,
} from './inspect.js';
export type { JsonValue } from './json.js';
export { MemoryStore, type MemoryStoreOptions } from './memory-store.js';
export {
  compareKeys,
  MAX_KEY_BYTES,
  MAX_VALUE_BYTES,
  shownName,
  validateColumn,
  validateRowKey,
  validateTable,
  validateUserTable,
} from './names.js';
export * from './observers/index.js';
export { checkOptionKeys, type OptionKeys } from './options.js';
export { CounterOracle, LocalOracle, type TimestampOracle } from './oracle.js';
export {
  DEFAULT_PRUNE_POLICY,
  Percolator,
  type PercolatorOptions,
  type TransactOptions,
} from './percolator.js';
export { redactUrl } from './redact.js';
export type { ResolvedLock, ResolveOptions } from './resolve.js';
export * from './store.js';
export { ClientCrash } from './testing.js';
export type { TidyOptions, TidyReport } from './tidy.js';
export { type CommitResult, type ScannedRow, type ScanRange, Transaction } from './transaction.js';
export { isVersionTable, versionTable } from './versions.js';
