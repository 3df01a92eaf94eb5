export { DEFAULT_NAMESPACE, NAMESPACE_PATTERN } from '@percolator/core/kit';
export { assertMySqlReachable, DEFAULT_MYSQL_URL, MYSQL_URL_ENV, redactUrl, resolveMySqlUrl } from './env.js';
export {
  dropMySqlNamespace,
  listMySqlNamespaces,
  type MySqlNamespace,
  type MySqlNamespaceOptions,
} from './namespaces.js';
export {
  type MySqlNames,
  mysqlDropStatements,
  mysqlNames,
  mysqlSchemaSql,
  mysqlSchemaStatements,
} from './schema.js';
export { createMySqlStore, type MySqlStore, type MySqlStoreOptions, maxStateBytesFor } from './store.js';
