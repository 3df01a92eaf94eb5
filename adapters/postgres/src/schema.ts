import { validateNamespace } from '@percolator/core/kit';

/**
 * One set of objects per namespace, in the connection's current schema (search_path):
 *   <ns>_rows         the rows: (tbl, key) -> version, state, notified
 *   <ns>_counters     atomic counters (incrementCounter)
 *   <ns>_version_seq  the source of every version token; sequences never hand out a
 *                     value twice, so a version is not reused after delete + re-create;
 *                     it starts at the clock, so not after a namespace is re-created either
 *   <ns>_read_stamped  a PL/pgSQL function: draw from a counter, then read rows with a
 *                     snapshot taken after the draw (readStamped; see readStampedFunctionBody)
 * Identifiers are built only from the validated namespace and fixed suffixes.
 */
export interface PostgresNames {
  readonly namespace: string;
  readonly rows: string;
  readonly counters: string;
  readonly versionSeq: string;
  readonly notifiedIndex: string;
  /** The stamped-read function's quoted name. */
  readonly readStamped: string;
  /** Its name with argument types, as `to_regprocedure` and `DROP FUNCTION` take it. */
  readonly readStampedSignature: string;
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
    readStamped: `"${ns}_read_stamped"`,
    readStampedSignature: `"${ns}_read_stamped"(bytea, bytea[], bytea[])`,
  };
}

/**
 * The body of `<ns>_read_stamped(counter_name, tbls, keys)` (capability stampedRead). It
 * returns one row `(0, drawn value, NULL)`, then `(ordinal, version, state)` for every
 * requested row that exists (ordinals 1-based, in request order; absent rows are omitted).
 *
 * Why the reads see every write made visible before the draw: the function is VOLATILE,
 * and "VOLATILE functions obtain a fresh snapshot at the start of each query they
 * execute" (PostgreSQL docs, Function Volatility Categories); under READ COMMITTED that
 * snapshot is new. The upsert waits for any transaction holding the counter row (a stamped
 * CAS holds it until it commits) and then adds to the committed value; the RETURN QUERY is
 * the next query, so its snapshot is taken after that wait ended, and a transaction is
 * visible before it releases its locks. A single statement (a CTE that upserts and reads)
 * would NOT do: all its parts share the snapshot taken when the statement started, before
 * the wait. Under REPEATABLE READ / SERIALIZABLE the upsert fails with 40001 instead of
 * reading around a counter change committed after the transaction's snapshot.
 *
 * Only the validated namespace is spliced in (the same quoted identifiers as elsewhere);
 * the counter name, tables and keys are the function's arguments.
 */
export function readStampedFunctionBody(n: PostgresNames): string {
  return `
DECLARE
  drawn bigint;
BEGIN
  -- The draw: the same upsert as incrementCounter with delta 1 (created at 1 if absent).
  INSERT INTO ${n.counters} (name, value) VALUES (counter_name, 1)
  ON CONFLICT (name) DO UPDATE SET value = ${n.counters}.value + EXCLUDED.value
  RETURNING value INTO drawn;
  ordinal := 0;
  row_version := drawn;
  row_state := NULL;
  RETURN NEXT;
  -- A new query, so (READ COMMITTED) a new snapshot, taken after the draw above returned.
  RETURN QUERY
    SELECT r.i, t.version, t.state
    FROM unnest(tbls, keys) WITH ORDINALITY AS r(tbl, key, i)
    JOIN ${n.rows} t ON t.tbl = r.tbl AND t.key = r.key;
END
`;
}

function readStampedFunctionSql(n: PostgresNames): string {
  return `CREATE OR REPLACE FUNCTION ${n.readStamped}(counter_name bytea, tbls bytea[], keys bytea[])
RETURNS TABLE (ordinal bigint, row_version bigint, row_state bytea)
LANGUAGE plpgsql VOLATILE
AS $fn$${readStampedFunctionBody(n)}$fn$`;
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
    // (Re)defines the function only when it is missing from the current schema or its body
    // differs, so opening a store changes nothing (and needs no ownership) once it is there.
    // The body is compared and created from the same text: indenting it here would change it.
    `DO $do$
BEGIN
  IF NOT EXISTS (
    SELECT 1 FROM pg_proc
    WHERE oid = to_regprocedure('${n.readStampedSignature}')
      AND pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
      AND prosrc = $body$${readStampedFunctionBody(n)}$body$
  ) THEN
    ${readStampedFunctionSql(n)};
  END IF;
END
$do$`,
  ];
}

/** The schema as one SQL script, for users who manage schemas themselves. */
export function postgresSchemaSql(namespace?: string): string {
  return `${postgresSchemaStatements(namespace).join(';\n\n')};\n`;
}

export function postgresDropStatements(namespace?: string): string[] {
  const n = postgresNames(namespace);
  return [
    `DROP FUNCTION IF EXISTS ${n.readStampedSignature}`,
    `DROP TABLE IF EXISTS ${n.rows}, ${n.counters}`,
    `DROP SEQUENCE IF EXISTS ${n.versionSeq}`,
  ];
}

/** Advisory-lock key text (bound as a value) that serializes DDL of one namespace. */
export function schemaLockKey(namespace: string): string {
  return `percolator.schema.${namespace}`;
}
