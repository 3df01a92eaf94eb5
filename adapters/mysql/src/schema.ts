import { validateNamespace } from './requests.js';

/**
 * One set of tables per namespace, in the connection's database:
 *   <ns>_rows            the rows: (tbl, row_key) -> version, state, notified
 *   <ns>_counters        atomic counters (incrementCounter)
 *   <ns>_version_blocks  AUTO_INCREMENT source of version blocks; see versions.ts.
 *                        Rows are never deleted, so ids are never handed out twice,
 *                        even on servers that recompute AUTO_INCREMENT from MAX(id);
 *                        ids start at the clock, so not after re-creation either.
 * Identifiers are built only from the validated namespace and fixed suffixes.
 */
export interface MySqlNames {
  readonly namespace: string;
  readonly rows: string;
  readonly counters: string;
  readonly versionBlocks: string;
}

export function mysqlNames(namespace?: string): MySqlNames {
  const ns = validateNamespace(namespace);
  return {
    namespace: ns,
    rows: `\`${ns}_rows\``,
    counters: `\`${ns}_counters\``,
    versionBlocks: `\`${ns}_version_blocks\``,
  };
}

/**
 * The schema, one statement per entry; every statement is idempotent. `createMySqlStore`
 * runs them under GET_LOCK so that many processes starting at once queue up.
 * Plain MySQL 8 / MariaDB syntax only (no RETURNING, no sequences).
 */
export function mysqlSchemaStatements(namespace?: string): string[] {
  const n = mysqlNames(namespace);
  return [
    // VARBINARY keys: any Unicode including NUL, compared byte by byte (= UTF-8 order).
    // Table names are at most 64 ASCII characters (core validateTable).
    `CREATE TABLE IF NOT EXISTS ${n.rows} (
  tbl VARBINARY(64) NOT NULL,
  row_key VARBINARY(1024) NOT NULL,
  version BIGINT UNSIGNED NOT NULL,
  state LONGBLOB NOT NULL,
  notified BOOLEAN NOT NULL DEFAULT FALSE,
  PRIMARY KEY (tbl, row_key),
  KEY \`${n.namespace}_rows_notified\` (tbl, notified, row_key)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC`,
    `CREATE TABLE IF NOT EXISTS ${n.counters} (
  name VARBINARY(1024) NOT NULL,
  value BIGINT UNSIGNED NOT NULL,
  PRIMARY KEY (name)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC`,
    `CREATE TABLE IF NOT EXISTS ${n.versionBlocks} (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  allocated_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
  PRIMARY KEY (id)
) ENGINE=InnoDB`,
    // The first block id is the server's clock in milliseconds, not 1: if the namespace is
    // dropped and re-created while old clients still hold version tokens (or a reserved
    // block), new tokens are larger than every old one (assuming fewer than 1000 blocks
    // per second on average; ids fit until the year 2527). Only an empty table is seeded,
    // so this is idempotent; the seed row stays, like every block row.
    `INSERT INTO ${n.versionBlocks} (id)
SELECT CAST(FLOOR(UNIX_TIMESTAMP(NOW(3)) * 1000) AS UNSIGNED) FROM DUAL
WHERE NOT EXISTS (SELECT 1 FROM ${n.versionBlocks})`,
  ];
}

/** The schema as one SQL script, for users who manage schemas themselves. */
export function mysqlSchemaSql(namespace?: string): string {
  return `${mysqlSchemaStatements(namespace).join(';\n\n')};\n`;
}

export function mysqlDropStatements(namespace?: string): string[] {
  const n = mysqlNames(namespace);
  return [`DROP TABLE IF EXISTS ${n.rows}, ${n.counters}, ${n.versionBlocks}`];
}

/** GET_LOCK name (bound as a value) that serializes DDL of one namespace. */
export function schemaLockName(namespace: string): string {
  return `percolator.schema.${namespace}`;
}
