export { LEASE_TABLE } from './lease.js';
export { isReservedColumn, RESERVED_COLUMN_PREFIX } from './reserved.js';
export type {
  NotifiedCell,
  Observer,
  RunEvent,
  RunFailure,
  RunUntilIdleOptions,
  WorkerOptions,
  WorkerStats,
} from './types.js';
export { ObserversDifferError, ObserversNotIdleError, ObserverWorker } from './worker.js';
