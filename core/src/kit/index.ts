/**
 * The adapter kit (`@percolator/core/kit`): what every store adapter shares and no adapter
 * should write again. docs/writing-an-adapter.md says when to use each part. The contract
 * checks themselves are not here: the core applies them to every store (checkedStore);
 * `checkStampedManyRequests` is there for an adapter whose one step relies on that shape.
 */

export { backoffMs, sleep } from '../backoff.js';
export { checkedStore, checkStampedManyRequests } from '../checked-store.js';
export {
  asBuffer,
  type CasPlan,
  canonicalIntegerVersions,
  type EncodedRef,
  encodeRef,
  failedWithCurrent,
  groupsWithDistinctRows,
  packRounds,
  planCas,
  settleBatch,
  toBytes,
  toSafeCounter,
} from './cas-plan.js';
export { resolveUrl, type UrlLookup, unreachableError, urlFromEnv } from './env.js';
export {
  type FailureMapping,
  type FailureRules,
  failureMapping,
  messageOf,
  partlyApplied,
} from './failures.js';
export { DEFAULT_NAMESPACE, NAMESPACE_PATTERN, validateNamespace } from './namespace.js';
export { DEFAULT_QUERY_TIMEOUT_MS, validateQueryTimeout } from './options.js';
export {
  type FullRowStore,
  fullCapabilities,
  type NamespacedStore,
  openPooled,
  POOLED_STORE_OPTION_KEYS,
  type PooledOpening,
  type PooledStoreOptions,
} from './store-shape.js';
