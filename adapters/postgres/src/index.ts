export { DEFAULT_NAMESPACE, NAMESPACE_PATTERN } from '@percolator/core/kit';
export {
  assertPostgresReachable,
  DEFAULT_POSTGRES_URL,
  POSTGRES_URL_ENV,
  redactUrl,
  resolvePostgresUrl,
} from './env.js';
export {
  dropPostgresNamespace,
  listPostgresNamespaces,
  type PostgresNamespace,
  type PostgresNamespaceOptions,
} from './namespaces.js';
export type { PgPool, PgPoolClient } from './pg.js';
export {
  type PostgresNames,
  postgresDropStatements,
  postgresNames,
  postgresSchemaSql,
  postgresSchemaStatements,
} from './schema.js';
export {
  createPostgresStore,
  POSTGRES_MAX_STATE_BYTES,
  type PostgresStore,
  type PostgresStoreOptions,
} from './store.js';
