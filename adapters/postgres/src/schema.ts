import { validateNamespace } from './requests.js';

/**
 * One set of objects per namespace, in the connection's current schema (search_path):
 *   <ns>_rows         the rows: (tbl, key) -> version, state, notified
 *   <ns>_counters     atomic counters (incrementCounter)
 *   <ns>_version_seq  the source of every version token; sequences never hand out a
 *                     value twice, so a version is not reused after delete + re-create;
 *                     it starts at the clock, so not after a namespace is re-created either
 * Identifiers are built only from the validated namespace and fixed suffixes.
 */
export interface PostgresNames {
  readonly namespace: string;
  readonly rows: string;
  readonly counters: string;
  readonly versionSeq: string;
  readonly notifiedIndex: string;
}

export function postgresNames(namespace?: string): PostgresNames {
  const ns = validateNamespace(namespace);
  return {
    namespace: ns,
    rows: `"${ns}_rows"`,
    counters: `"${ns}_counters"`,
    // Inside nextval('...') the name is a string literal holding a quoted identifier.
    versionSeq: `"${ns}_version_seq"`,
    notifiedIndex: `"${ns}_rows_notified"`,
  };
}

/**
 * The schema, one statement per entry. Every statement is idempotent; `createPostgresStore`
 * runs them in one transaction under an advisory lock, because concurrent
 * `CREATE ... IF NOT EXISTS` can still fail on PostgreSQL's catalog unique indexes.
 */
export function postgresSchemaStatements(namespace?: string): string[] {
  const n = postgresNames(namespace);
  return [
    `CREATE SEQUENCE IF NOT EXISTS ${n.versionSeq} AS bigint`,
    // bytea keys: any Unicode including NUL, ordered by UTF-8 bytes (memcmp, then length).
    `CREATE TABLE IF NOT EXISTS ${n.rows} (
  tbl bytea NOT NULL,
  key bytea NOT NULL,
  version bigint NOT NULL,
  state bytea NOT NULL,
  notified boolean NOT NULL DEFAULT false,
  PRIMARY KEY (tbl, key)
)`,
    // Partial index: only rows with a pending notification are indexed (scanNotified).
    `CREATE INDEX IF NOT EXISTS ${n.notifiedIndex} ON ${n.rows} (tbl, key) WHERE notified`,
    `CREATE TABLE IF NOT EXISTS ${n.counters} (
  name bytea PRIMARY KEY,
  value bigint NOT NULL
)`,
    // A new sequence starts at the server's clock in microseconds, not at 1: if the
    // namespace is dropped and re-created while old clients still hold version tokens,
    // the new tokens are larger than any old one (assuming fewer than a million versions
    // per second on average), so an old token never matches a new row. Only a sequence
    // that has never handed out a value is moved, so this is idempotent.
    `SELECT setval('${n.versionSeq}', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)
FROM ${n.versionSeq} WHERE NOT is_called`,
  ];
}

/** The schema as one SQL script, for users who manage schemas themselves. */
export function postgresSchemaSql(namespace?: string): string {
  return `${postgresSchemaStatements(namespace).join(';\n\n')};\n`;
}

export function postgresDropStatements(namespace?: string): string[] {
  const n = postgresNames(namespace);
  return [`DROP TABLE IF EXISTS ${n.rows}, ${n.counters}`, `DROP SEQUENCE IF EXISTS ${n.versionSeq}`];
}

/** Advisory-lock key text (bound as a value) that serializes DDL of one namespace. */
export function schemaLockKey(namespace: string): string {
  return `percolator.schema.${namespace}`;
}
