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
 *   <ns>_cas_stamped_many  a PL/pgSQL function: lock (or insert) rows, draw from a
 *                     counter, then write the rows stamped, all or nothing
 *                     (checkAndSetStampedMany, stamped creates; see casStampedManyFunctionBody)
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
 * SQLSTATE the stamped multi-row CAS raises when a row it creates appeared while it waited
 * (a concurrent writer committed it first) after it had inserted others. Class "PC" is none
 * of PostgreSQL's; the adapter recognises it and answers `ok: false`.
 */
export const CAS_MANY_MISMATCH = 'PC409';

/**
 * The body of `<ns>_cas_stamped_many(counter_name, tbls, keys, expected, states,
 * notified_flags)` (capability stampedCheckAndSetMany, and the stamped create of one row):
 * several stamped CAS as one atomic step. `expected[i]` NULL means "row i must be absent"
 * (a create), else it is the version row i must have (an update); every state is non-null
 * and at least 9 bytes. Rows are distinct (the adapter checks). It returns one row
 * `(0, drawn value, NULL)` and then `(ordinal, new version, NULL)` for every request
 * (ordinals 1-based, in request order) when everything applied; when a request does not
 * match before the draw, it returns no row 0 and `(ordinal, version, state)` for every
 * requested row that exists now (absent ones omitted), having written nothing.
 *
 * Steps, each its own query (so under READ COMMITTED each has a fresh snapshot):
 * 1. Lock the rows it updates, at their expected versions, in (tbl, key) byte order (bytea
 *    order: memcmp, then length, the order of Buffer.compare): SELECT ... ORDER BY ...
 *    FOR UPDATE, whose LockRows runs above the Sort, so in that order whatever the plan. A
 *    row that does not match in the snapshot is not locked and not waited for; one being
 *    written by another transaction is waited for and then re-checked at its newest
 *    version, and left out if it no longer matches. If one is left out: answer with the
 *    rows as they are and stop (nothing written, nothing drawn).
 * 2. Insert the rows it creates, in that order, with their new versions and flags and an
 *    empty state for now: INSERT ... ON CONFLICT DO NOTHING, which waits only for a
 *    concurrent insert (or delete) of the key and then inserts nothing if that one
 *    committed. None inserted: answer with the rows as they are and stop, as in 1. Some
 *    but not all: RAISE with SQLSTATE CAS_MANY_MISMATCH, which aborts the transaction the
 *    calling statement runs in (autocommit), so the rows inserted here go too.
 * 3. Draw: the upsert of incrementCounter with delta 1. The counter row stays locked
 *    until the transaction commits, and it is the last lock the call takes.
 * 4. Write every row, each a row this transaction holds, so nothing waits: the drawn value
 *    over bytes 2..9 of its state (int8send: big-endian), and a new version from the
 *    sequence for an update (a create keeps the one it was inserted with).
 * The row is taken before the draw because one statement cannot insert a row and then
 * write into it a value drawn after the insert; a create therefore writes its row twice.
 *
 * Atomic: the draw and every row write are one transaction, and the counter row stays
 * locked until it commits. Any later draw from that counter (incrementCounter, readStamped,
 * a stamped CAS) upserts the same row, so it waits for the commit, and PostgreSQL makes a
 * transaction visible before it releases its locks: whoever holds a later value and then
 * reads sees every one of these writes (see stampedUpdate in statements.ts). And every
 * record already on these rows was written with a value drawn before this one: the rows
 * are held from before the draw.
 *
 * Lock order: the rows it updates in ascending (tbl, key) order, then the rows it creates
 * in that order, then the counter, as the MariaDB procedure does. Every other statement of
 * the store takes one row and then the counter (stamped update), the counter alone (draws,
 * stamped reads), one row (a plain CAS), or rows in ascending order (casMany: the rows that
 * exist first, in one ORDER BY ... FOR UPDATE whenever it writes more than one of them or
 * mixes kinds, then its creates), and whoever holds the counter waits for no row. So the
 * counter is never in a deadlock cycle, and a call that waits for a busy row holds only
 * rows, never the counter: draws and stamped calls on other rows go on. Before, the counter
 * came first, and one call waiting for a row (held by a session, or by a backend its client
 * had given up on) stalled every draw of the namespace (found by a review). A call waiting
 * for an existing row k holds existing rows below k. A create waits for whoever holds its
 * key: an uncommitted insert of it, which comes after that statement's existing rows as
 * here, or a delete of it. Only the second can close a cycle: a create of a key that exists
 * now (a stale create) while a casMany of deletes holds the key and waits for a row this
 * call locked, a pair the core has no reason to send (its deletes are of version rows no
 * head row names any more, which no commit creates); PostgreSQL would break it after
 * deadlock_timeout (1 s). Creates come after the rows that exist: a call that inserted a
 * while it waited for row b, against a mixed casMany that locks b and creates a after,
 * was a cycle the protocol can produce (a one-step commit and a two-phase prewrite
 * creating the same key; found by an earlier review).
 *
 * Every lock wait is bounded by the lock_timeout the calling statement sets (statements.ts,
 * casStampedMany). Only the validated namespace is spliced in; everything else is an
 * argument.
 *
 * Plans: the function first sets plan_cache_mode = force_generic_plan for its transaction
 * (PostgreSQL 12 and later; older servers skip it). Otherwise PostgreSQL plans its queries
 * over `unnest` afresh on every call: a custom plan sees the real array length and always
 * looks cheaper than the generic one, which assumes 10 elements. Measured in one
 * transaction on the test machine: 0.14-0.35 ms per one-row create with it, 0.39-0.70 ms
 * without; 16-row calls 0.77-1.47 ms against 1.31-1.87. The generic plans are the ones
 * wanted anyway: index lookups per requested row (the Sort before LockRows fixes the lock
 * order in any plan).
 */
export function casStampedManyFunctionBody(n: PostgresNames): string {
  return `
DECLARE
  drawn bigint;
  creates int := cardinality(array_positions(expected, NULL));
  updates int := cardinality(tbls) - creates;
  done int := 0;
BEGIN
  -- Generic plans for the queries below, for the rest of this transaction (the call).
  IF current_setting('server_version_num')::int >= 120000 THEN
    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
  END IF;
  -- 1. Lock the rows it updates, at their expected versions, in (tbl, key) byte order.
  IF updates > 0 THEN
    SELECT count(*) INTO done FROM (
      SELECT 1
      FROM unnest(tbls, keys, expected) AS q(tbl, key, exp)
      JOIN ${n.rows} t ON t.tbl = q.tbl AND t.key = q.key AND t.version = q.exp
      ORDER BY t.tbl, t.key
      FOR UPDATE OF t
    ) AS locked;
  END IF;
  IF done = updates AND creates > 0 THEN
    -- 2. Insert the rows it creates, in that order; the stamped state is written in 4.
    INSERT INTO ${n.rows} (tbl, key, version, state, notified)
    SELECT q.tbl, q.key, nextval('${n.versionSeq}'), ''::bytea, q.flag
    FROM unnest(tbls, keys, expected, notified_flags) AS q(tbl, key, exp, flag)
    WHERE q.exp IS NULL
    ORDER BY q.tbl, q.key
    ON CONFLICT (tbl, key) DO NOTHING;
    GET DIAGNOSTICS done = ROW_COUNT;
    IF done > 0 AND done < creates THEN
      -- A key appeared while it waited: abort the transaction (the rows inserted above).
      RAISE EXCEPTION 'percolator: stamped check-and-set of % rows: a row it creates exists now; nothing was written',
        cardinality(tbls)
        USING ERRCODE = '${CAS_MANY_MISMATCH}';
    END IF;
    done := done + updates;
  END IF;
  IF done < cardinality(tbls) THEN
    -- A request does not match and nothing was written: the rows as they are now.
    RETURN QUERY
      SELECT q.i, t.version, t.state
      FROM unnest(tbls, keys) WITH ORDINALITY AS q(tbl, key, i)
      JOIN ${n.rows} t ON t.tbl = q.tbl AND t.key = q.key;
    RETURN;
  END IF;
  -- 3. The draw: the same upsert as incrementCounter with delta 1; the counter row stays
  -- locked until this transaction commits, and it is the last lock taken.
${drawAndAnswer(n)}
  -- 4. Write every row, all held by this transaction: stamped with drawn, a new version
  -- for an update.
  RETURN QUERY
    WITH w AS (
      UPDATE ${n.rows} t
      SET version = CASE WHEN q.exp IS NULL THEN t.version ELSE nextval('${n.versionSeq}') END,
        state = overlay(q.state PLACING int8send(drawn) FROM 2 FOR 8),
        notified = q.flag
      FROM unnest(tbls, keys, expected, states, notified_flags) WITH ORDINALITY
        AS q(tbl, key, exp, state, flag, i)
      WHERE t.tbl = q.tbl AND t.key = q.key AND (q.exp IS NULL OR t.version = q.exp)
      RETURNING q.i, t.version
    )
    SELECT w.i, w.version, NULL::bytea FROM w;
  GET DIAGNOSTICS done = ROW_COUNT;
  IF done < cardinality(tbls) THEN
    -- Cannot happen (every row is held); if it did, write nothing rather than part.
    RAISE EXCEPTION 'percolator: stamped check-and-set of % rows: % rows written after the draw; nothing was written',
      cardinality(tbls), done
      USING ERRCODE = '${CAS_MANY_MISMATCH}';
  END IF;
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
