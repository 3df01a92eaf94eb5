/** Everything the package exports except the vitest binding. */
export { allCases } from './cases/index.js';
export { CrashPlans, type StopPoint, stopAt, stopOutcome } from './crash.js';
export {
  type CallListener,
  type FaultEvent,
  type FaultKind,
  type FaultRule,
  FaultyStore,
  type FaultyStoreOptions,
  type Hold,
  type RandomFaults,
  type StoreCall,
  type StoreOperation,
  WRITE_OPERATIONS,
} from './faulty-store.js';
export { recordFailures, transactOnce } from './give-up.js';
export {
  type Anomaly,
  type AnomalyType,
  type CheckOptions,
  type CheckResult,
  type CycleStep,
  checkListAppend,
  describeCheck,
  type EdgeKind,
  type ListAppendMop,
  type ListAppendOp,
} from './history/checker.js';
export {
  LIST_COLUMN,
  LIST_TABLES,
  type ListAppendRun,
  type ListAppendWorkload,
  listCell,
  parseList,
  readAllLists,
  runListAppend,
} from './history/workload.js';
export { DEFAULT_SEED, Random } from './random.js';
export { runConformance, selectCases, summarise } from './runner.js';
export {
  appliedStamp,
  type DrawThenRead,
  drawThenReadMany,
  errorOf,
  type StampedRaceOptions,
  type StampedRaceResult,
  type StampedWrite,
  stampedRace,
  stampOf,
  stampTemplate,
} from './stamped-race.js';
export * from './types.js';
