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
 *   <ns>_cas_stamped_many  a PL/pgSQL function: draw from a counter, then apply several
 *                     stamped CAS, all or nothing (checkAndSetStampedMany; see
 *                     casStampedManyFunctionBody)
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
  /** The stamped multi-row CAS function's quoted name. */
  readonly casStampedMany: string;
  /** Its name with argument types. */
  readonly casStampedManySignature: string;
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
    casStampedMany: `"${ns}_cas_stamped_many"`,
    casStampedManySignature: `"${ns}_cas_stamped_many"(bytea, bytea[], bytea[], bigint[], bytea[], boolean[])`,
  };
}

/**
 * The counter draw of the stamped functions, the same upsert as incrementCounter with delta
 * 1 (created at 1 if absent), answered at once as the row (0, drawn, NULL).
 */
function drawAndAnswer(n: PostgresNames): string {
  return `  INSERT INTO ${n.counters} (name, value) VALUES (counter_name, 1)
  ON CONFLICT (name) DO UPDATE SET value = ${n.counters}.value + EXCLUDED.value
  RETURNING value INTO drawn;
  ordinal := 0;
  row_version := drawn;
  row_state := NULL;
  RETURN NEXT;`;
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
${drawAndAnswer(n)}
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
 * SQLSTATE the stamped multi-row CAS raises when a row stopped matching after the draw (a
 * concurrent writer committed first). Class "PC" is none of PostgreSQL's; the adapter
 * recognises it and answers `ok: false`.
 */
export const CAS_MANY_MISMATCH = 'PC409';

/**
 * The body of `<ns>_cas_stamped_many(counter_name, tbls, keys, expected, states,
 * notified_flags)` (capability stampedCheckAndSetMany): several stamped CAS as one atomic
 * step. `expected[i]` NULL means "row i must be absent" (a create), else it is the version
 * row i must have (an update); every state is non-null and at least 9 bytes. Rows are
 * distinct (the adapter checks). It returns one row `(0, drawn value, NULL)` and then
 * `(ordinal, new version, NULL)` for every request (ordinals 1-based, in request order)
 * when everything applied; when the check before the draw fails, it returns no row 0 and
 * `(ordinal, version, state)` for every requested row that exists now (absent ones
 * omitted), having written nothing.
 *
 * Steps, each its own query (so under READ COMMITTED each has a fresh snapshot):
 * 1. Check every row against its `expected`, reading without locks. If one does not match
 *    in this snapshot, answer with the rows as they are and stop: no draw, no write, no
 *    wait on the counter (as the single-row stamped statements do).
 * 2. Draw: the upsert of incrementCounter with delta 1. It locks the counter row until the
 *    transaction commits, and it is the first lock this call takes.
 * 3. Apply the CAS one row at a time, the updates in (tbl, key) byte order (bytea order:
 *    memcmp, then length, the order of Buffer.compare), then the creates in that order
 *    (Deadlock-free, below), each with the drawn value written over bytes
 *    2..9 (int8send: big-endian), a new version from the sequence. A create is
 *    INSERT ... ON CONFLICT DO NOTHING (it waits for a concurrent inserter of the key and
 *    then inserts nothing if that one committed); an update is UPDATE ... WHERE version =
 *    expected (under READ COMMITTED, if it waited on a concurrent writer it re-checks the
 *    newest row and may match nothing). A row that applies nothing means someone else
 *    changed it after step 1: RAISE with SQLSTATE CAS_MANY_MISMATCH. The error aborts the
 *    whole transaction the calling statement runs in (autocommit), so the rows already
 *    written by this call and the draw are rolled back: all or nothing.
 *
 * Atomic: the draw and every row write are one transaction, and the counter row stays
 * locked until it commits. Any later draw from that counter (incrementCounter, readStamped,
 * a stamped CAS) upserts the same row, so it waits for the commit, and PostgreSQL makes a
 * transaction visible before it releases its locks: whoever holds a later value and then
 * reads sees every one of these writes (see stampedUpdate in statements.ts).
 *
 * Lock order: the counter row is taken first, while the call holds nothing; then the rows
 * it updates in ascending (tbl, key) order, then the rows it creates in that order. Every
 * other statement of the store takes at most the counter and then one row (stamped CAS),
 * the counter alone (draws, stamped reads), or rows in ascending order kind by kind
 * (casMany; one of several kinds locks the rows that exist first, then creates; a plain CAS
 * takes one row), and none waits for the counter while it holds a row. So a statement
 * waiting for the counter holds nothing, and one waiting for an existing row k holds
 * existing rows below k. A create waits for whoever holds its key: an uncommitted insert
 * of it, which comes after that statement's existing rows as here, or a delete of it. Only
 * the second can close a cycle: a create whose check went stale (the key was created since)
 * while a casMany of deletes holds the key and waits for a row this call updated, a pair
 * the core has no reason to send (its deletes are of version rows no head row names any
 * more, which no commit creates); PostgreSQL would break it after deadlock_timeout (1 s). The key
 * order for creates and updates together, before, let a call hold a new key a while it
 * waited for row b, and a mixed casMany, which locks b and creates a after, wait for a: a
 * cycle the protocol can produce (a one-step commit and a two-phase prewrite creating the
 * same key), with the counter held all that time (found by a review).
 *
 * Only the validated namespace is spliced in; everything else is an argument.
 */
export function casStampedManyFunctionBody(n: PostgresNames): string {
  return `
DECLARE
  drawn bigint;
  written bigint;
  r record;
BEGIN
  -- 1. The check, without locks: a request that visibly does not match draws nothing.
  IF EXISTS (
    SELECT 1
    FROM unnest(tbls, keys, expected) AS q(tbl, key, exp)
    LEFT JOIN ${n.rows} t ON t.tbl = q.tbl AND t.key = q.key
    WHERE t.version IS DISTINCT FROM q.exp
  ) THEN
    RETURN QUERY
      SELECT q.i, t.version, t.state
      FROM unnest(tbls, keys) WITH ORDINALITY AS q(tbl, key, i)
      JOIN ${n.rows} t ON t.tbl = q.tbl AND t.key = q.key;
    RETURN;
  END IF;
  -- 2. The draw: the same upsert as incrementCounter with delta 1; the counter row stays
  -- locked until this transaction commits, and it is the first lock taken.
${drawAndAnswer(n)}
  -- 3. The writes, one row at a time, each stamped with drawn: the rows that exist (updates)
  -- in (tbl, key) byte order, then the creates in that order, as casMany locks its rows.
  FOR r IN
    SELECT q.tbl, q.key, q.exp, q.state, q.flag, q.i
    FROM unnest(tbls, keys, expected, states, notified_flags) WITH ORDINALITY
      AS q(tbl, key, exp, state, flag, i)
    ORDER BY q.exp IS NULL, q.tbl, q.key
  LOOP
    IF r.exp IS NULL THEN
      INSERT INTO ${n.rows} (tbl, key, version, state, notified)
      VALUES (r.tbl, r.key, nextval('${n.versionSeq}'), overlay(r.state PLACING int8send(drawn) FROM 2 FOR 8), r.flag)
      ON CONFLICT (tbl, key) DO NOTHING
      RETURNING version INTO written;
    ELSE
      UPDATE ${n.rows} t
      SET version = nextval('${n.versionSeq}'), state = overlay(r.state PLACING int8send(drawn) FROM 2 FOR 8), notified = r.flag
      WHERE t.tbl = r.tbl AND t.key = r.key AND t.version = r.exp
      RETURNING t.version INTO written;
    END IF;
    IF NOT FOUND THEN
      -- Changed since the check: abort the whole transaction (every write above, the draw).
      RAISE EXCEPTION 'percolator: stamped check-and-set of % rows: request % no longer matches its row; nothing was written',
        cardinality(tbls), r.i
        USING ERRCODE = '${CAS_MANY_MISMATCH}';
    END IF;
    ordinal := r.i;
    row_version := written;
    row_state := NULL;
    RETURN NEXT;
  END LOOP;
END
`;
}

function casStampedManyFunctionSql(n: PostgresNames): string {
  return `CREATE OR REPLACE FUNCTION ${n.casStampedMany}(counter_name bytea, tbls bytea[], keys bytea[], expected bigint[], states bytea[], notified_flags boolean[])
RETURNS TABLE (ordinal bigint, row_version bigint, row_state bytea)
LANGUAGE plpgsql VOLATILE
AS $fn$${casStampedManyFunctionBody(n)}$fn$`;
}

/**
 * (Re)defines a function only when it is missing from the current schema or its body
 * differs, so opening a store changes nothing (and needs no ownership) once it is there.
 * The body is compared and created from the same text: indenting it here would change it.
 */
function ensureFunctionSql(signature: string, body: string, create: string): string {
  return `DO $do$
BEGIN
  IF NOT EXISTS (
    SELECT 1 FROM pg_proc
    WHERE oid = to_regprocedure('${signature}')
      AND pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())
      AND prosrc = $body$${body}$body$
  ) THEN
    ${create};
  END IF;
END
$do$`;
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
    // The functions: created when missing or different (ensureFunctionSql).
    ensureFunctionSql(n.readStampedSignature, readStampedFunctionBody(n), readStampedFunctionSql(n)),
    ensureFunctionSql(n.casStampedManySignature, casStampedManyFunctionBody(n), casStampedManyFunctionSql(n)),
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
    `DROP FUNCTION IF EXISTS ${n.casStampedManySignature}`,
    `DROP TABLE IF EXISTS ${n.rows}, ${n.counters}`,
    `DROP SEQUENCE IF EXISTS ${n.versionSeq}`,
  ];
}

/** Advisory-lock key text (bound as a value) that serializes DDL of one namespace. */
export function schemaLockKey(namespace: string): string {
  return `percolator.schema.${namespace}`;
}
