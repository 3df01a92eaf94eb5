export { redactUrl } from '@percolator/core';
export { ADAPTER_PACKAGES, BACKEND_ENV, BACKENDS, type BackendName, isBackendName } from './backends.js';
export {
  type CompositeConfig,
  type ConnectedComposite,
  type OpenCompositeOptions,
  openComposite,
  parseCompositeConfig,
  type RouteConfig,
  readCompositeConfig,
  type StoreConfig,
} from './composite.js';
export { freshNamespace, type StoreFactory, type StoreFactoryOptions, storeFactory } from './factory.js';
export { loadAdapter } from './load.js';
export {
  type ConnectedStore,
  type ConnectOptions,
  configuredUrl,
  DEFAULT_DYNAMODB_REGION,
  DEFAULT_DYNAMODB_TABLE,
  describeTarget,
  isLoopbackUrl,
  type ListedNamespace,
  LOCAL_DYNAMODB_CREDENTIALS,
  type NamespaceAdmin,
  openNamespaceAdmin,
  openStore,
  usesLocalDynamoDbCredentials,
} from './open.js';
