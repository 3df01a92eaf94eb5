export { DEFAULT_NAMESPACE, NAMESPACE_PATTERN, NAMESPACE_PATTERN as NAMESPACE } from '@percolator/core/kit';
export type { RetryPolicy } from './calls.js';
export { DEFAULT_REQUEST_TIMEOUT_MS } from './client.js';
export { DYNAMODB_ITEM_LIMIT, MAX_STATE_BYTES } from './layout.js';
export {
  type DynamoDbNamespace,
  type DynamoDbNamespaceOptions,
  dropDynamoDbNamespace,
  listDynamoDbNamespaces,
} from './namespaces.js';
export {
  createDynamoDbStore,
  DYNAMODB_CAPABILITIES,
  type DynamoDbRowStore,
  type DynamoDbStoreOptions,
} from './store.js';
export { DynamoDbTableNotFoundError } from './table.js';
