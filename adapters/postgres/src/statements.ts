import type { PostgresNames } from './schema.js';

/**
 * Every SQL text the store sends. Identifiers come from `PostgresNames` (fixed suffixes on
 * a validated namespace); every table name, key, version and state is a bound parameter.
 * Each single-row operation is ONE statement, so a CAS is one round trip when it succeeds.
 */
export function postgresStatements(n: PostgresNames) {
  const nextVersion = `nextval('${n.versionSeq}')`;
  return {
    // Touches every object the store uses, to check a schema created by the user.
    probe: `SELECT ${nextVersion} - ${nextVersion} AS zero FROM ${n.rows}, ${n.counters} LIMIT 0`,

    read: `SELECT version::text AS version, state FROM ${n.rows} WHERE tbl = $1 AND key = $2`,

    // ON CONFLICT DO NOTHING: an existing row makes this a no-op that returns no row.
    create: `INSERT INTO ${n.rows} (tbl, key, version, state, notified)
VALUES ($1, $2, ${nextVersion}, $3, $4)
ON CONFLICT (tbl, key) DO NOTHING
RETURNING version::text AS version`,

    // Under READ COMMITTED a concurrent writer makes this wait, then re-check
    // `version = $3` against the row it committed: exactly one of two racers wins.
    update: `UPDATE ${n.rows} SET version = ${nextVersion}, state = $4, notified = $5
WHERE tbl = $1 AND key = $2 AND version = $3::bigint
RETURNING version::text AS version`,

    // A delete still answers with a fresh token, so a success always carries an unused version.
    delete: `DELETE FROM ${n.rows} WHERE tbl = $1 AND key = $2 AND version = $3::bigint
RETURNING ${nextVersion}::text AS version`,

    // "Must be absent, leave it absent": one snapshot decides; the row is returned if present.
    ensureAbsent: `SELECT version::text AS version, state, false AS ok FROM ${n.rows} WHERE tbl = $1 AND key = $2
UNION ALL
SELECT ${nextVersion}::text, NULL, true
WHERE NOT EXISTS (SELECT 1 FROM ${n.rows} WHERE tbl = $1 AND key = $2)`,

    // Which of the schema's functions exist (a schema the user created may predate them).
    // The multi-row CAS counts only with the body this version defines ($1): an older one
    // drew from the counter before it locked its rows, and would close deadlock cycles with
    // stampedUpdate, which takes its row first.
    hasFunctions: `SELECT to_regprocedure('${n.readStampedSignature}') IS NOT NULL AS read_stamped,
  EXISTS (SELECT 1 FROM pg_proc WHERE oid = to_regprocedure('${n.casStampedManySignature}') AND prosrc = $1::text)
    AS cas_stamped_many`,

    /*
     * Stamped read (capability stampedRead): one statement calling the function the schema
     * defines (schema.ts, readStampedFunctionBody). Inside it the counter upsert and the
     * reads are two queries, so the reads get a snapshot taken after the upsert returned.
     * Row (0, drawn value, NULL) carries the timestamp; the others are found rows.
     * $1 counter name, $2 tables, $3 keys.
     */
    readStamped: `SELECT ordinal::int AS i, row_version::text AS version, row_state AS state
FROM ${n.readStamped}($1::bytea, $2::bytea[], $3::bytea[])`,

    /*
     * Peeked read (capability peekedRead): the counter's value (0 if absent) and the rows,
     * in ONE statement, so one snapshot; it writes and locks nothing. Why that snapshot
     * shows every write stamped at or below the value (and every write acknowledged before
     * a draw that returned at most it): a draw commits with the counter row locked, and
     * releases that lock only after its commit is visible; the next draw waits for it. So a
     * snapshot that sees value V sees the transaction that drew V, every earlier draw, and
     * each one's own writes (they commit together). A draw in flight is not seen and not
     * waited for. Row (0, value, NULL) carries the value. $1 counter name, $2 tables, $3 keys.
     */
    readPeeked: `SELECT 0 AS i, COALESCE((SELECT value FROM ${n.counters} WHERE name = $1::bytea), 0)::text AS version, NULL::bytea AS state
UNION ALL
SELECT r.i::int, t.version::text, t.state
FROM unnest($2::bytea[], $3::bytea[]) WITH ORDINALITY AS r(tbl, key, i)
JOIN ${n.rows} t ON t.tbl = r.tbl AND t.key = r.key`,
    // The same for one row (most first reads), without arrays: about as cheap as `read`.
    // $1 counter name, $2 table, $3 key.
    readPeekedOne: `SELECT 0 AS i, COALESCE((SELECT value FROM ${n.counters} WHERE name = $1::bytea), 0)::text AS version, NULL::bytea AS state
UNION ALL
SELECT 1, t.version::text, t.state FROM ${n.rows} t WHERE t.tbl = $2 AND t.key = $3`,

    readMany: `SELECT r.i::int AS i, t.version::text AS version, t.state
FROM unnest($1::bytea[], $2::bytea[]) WITH ORDINALITY AS r(tbl, key, i)
JOIN ${n.rows} t ON t.tbl = r.tbl AND t.key = r.key`,

    /*
     * Many independent CAS in one statement (callers guarantee each row appears once).
     * Each data-modifying CTE touches only its kind of request; the final SELECT reports
     * the request ordinals that applied with their new versions. Rows that do not match
     * are simply not reported (= failed). The statement is atomic as a whole, which is
     * more than the contract asks, and a deadlock rolls all of it back.
     *
     * Lock order: (tbl, key), whatever the plan. An UPDATE or DELETE joined with the
     * requests takes its rows in the order the join yields them, which is the plan's: with
     * a few dozen rows in the table and statistics, PostgreSQL hashes the requests and
     * scans the table, so rows are taken in heap order, and two batches over rows a and b
     * (b stored first) deadlocked against a stamped call taking a then b (found by a
     * review; PostgreSQL breaks it only after deadlock_timeout, 1 s by default, with the
     * counter held when the other side was the old stamped function). So every batch that
     * updates or deletes more than one row, or mixes kinds, runs `casManyLocking`, whose
     * first CTE `lk` locks every requested row that exists with ORDER BY ... FOR UPDATE
     * (LockRows runs above the Sort, so in (tbl, key) order in any plan) before anything is
     * written (`q`, which the writes read, waits for all of `lk`: its InitPlan counts it).
     * The writes then touch only rows the statement holds. It also keeps a batch of several
     * kinds from holding its updated rows while a create of a row that exists (a stale
     * create) or a delete waits, the cycle an earlier review found. Locking first costs a
     * second write of each row's tuple (a row lock marks the tuple): 64-row two-phase
     * transactions ran about a fifth slower with it. `casMany` is left for a batch that
     * locks at most one existing row, or only creates: an INSERT ... SELECT ... ORDER BY
     * inserts in the Sort's order. Creates of absent keys come last in either, and wait
     * only for a concurrent creator (or deleter) of the same key.
     */
    casMany: casManySql(n, nextVersion, false),
    casManyLocking: casManySql(n, nextVersion, true),

    // Bounds and `after` are appended from fixed fragments; see PostgresStore.scan.
    scanPrefix: `SELECT key, version::text AS version, state FROM ${n.rows} WHERE tbl = $1`,
    // `AND notified` matches the partial index's predicate, so the index is used.
    scanNotifiedPrefix: `SELECT key FROM ${n.rows} WHERE tbl = $1 AND notified`,

    increment: `INSERT INTO ${n.counters} (name, value) VALUES ($1, $2::bigint)
ON CONFLICT (name) DO UPDATE SET value = ${n.counters}.value + EXCLUDED.value
RETURNING value::text AS value`,

    /*
     * Stamped check-and-set of an existing row (capability stampedCheckAndSet): ONE
     * statement, so one round trip and, in autocommit, one transaction. CTE `lk` locks the
     * row at the expected version; `c` then adds 1 to the counter exactly as `increment`
     * does (same table, same upsert); `w` applies the CAS with the drawn value written over
     * bytes 2..9 (1-based; STAMP_OFFSET = 1) of the state as a big-endian int8
     * (`int8send`). All commit together or not at all. (A create goes through the
     * multi-row function, casStampedMany, which can insert the row before it draws.)
     *
     * Why a later counter value implies the write is visible (READ COMMITTED, the default):
     * the upsert in `c` leaves the counter row locked until this statement's transaction
     * commits. Any other draw from that counter (`increment` or another stamped statement)
     * is an upsert of the same row, so it waits for that lock and only then adds to the
     * value this transaction committed. PostgreSQL marks a transaction committed (clog,
     * then ProcArray) before it releases its locks, so by the time a later value exists,
     * this write is committed and every snapshot taken afterwards (the reader's next
     * statement) contains it. If this transaction aborts, its value is never handed out
     * as a success: the next draw reuses it. And every record already on the row was
     * written with a value drawn before this one: the row is held from before the draw.
     *
     * Lock order: the row first, the counter second, as the MariaDB procedure does. A
     * statement that holds the counter then waits for nothing (the row is its own already),
     * so the counter is never in a deadlock cycle, and a call that waits for a busy row (a
     * concurrent writer of it, a session holding it, a backend its client gave up on)
     * holds nothing meanwhile: draws, stamped reads and stamped writes of other rows go on.
     * Before, the counter came first, and one such wait stalled every draw of the namespace.
     *
     * `lk` filters the row at its expected version with FOR UPDATE: a row that does not
     * match in the statement's snapshot is not locked and not waited for; one being written
     * by another transaction is waited for and then re-checked at its newest version
     * (READ COMMITTED), so a lost race draws nothing. `c` draws only once `lk` holds the
     * row (its EXISTS reads `lk`), and `w` finds the very row `lk` locked (versions are
     * never reused, and a lock leaves the row as it was), so it waits for nothing either.
     *
     * `set_config('lock_timeout', $7, true)`: before `lk` locks the row, the transaction
     * (this statement) gets a lock timeout a little below the client's queryTimeoutMs, so a
     * backend whose client gave up does not wait for the row (or the counter) for ever.
     * It is a filter of `lk`'s scan, evaluated on the row before LockRows locks it; no row,
     * no lock, no wait. PostgreSQL reads lock_timeout at each lock wait. (`lk` is not
     * MATERIALIZED, a keyword of PostgreSQL 12: a CTE with a volatile function is never
     * inlined, and inlined, its FOR UPDATE would lock all the same.)
     *
     * $1 tbl, $2 key, $3 counter name, $4 state template, $5 notified, $6 expected,
     * $7 lock timeout (ms, as text).
     */
    stampedUpdate: `WITH lk AS (
  SELECT 1 FROM ${n.rows}
  WHERE tbl = $1::bytea AND key = $2::bytea AND version = $6::bigint
    AND set_config('lock_timeout', $7::text, true) IS NOT NULL
  FOR UPDATE
),
c AS (
  INSERT INTO ${n.counters} (name, value)
  SELECT $3::bytea, 1::bigint
  WHERE EXISTS (SELECT 1 FROM lk)
  ON CONFLICT (name) DO UPDATE SET value = ${n.counters}.value + EXCLUDED.value
  RETURNING value
),
w AS (
  UPDATE ${n.rows} t
  SET version = ${nextVersion}, state = overlay($4::bytea PLACING int8send(c.value) FROM 2 FOR 8), notified = $5::boolean
  FROM c
  WHERE t.tbl = $1::bytea AND t.key = $2::bytea AND t.version = $6::bigint
  RETURNING t.version, c.value
)
SELECT version::text AS version, value::text AS ts FROM w`,

    /*
     * The stamped create of one row for a schema without the multi-row function (made by
     * hand from an older postgresSchemaSql()), the only statement left that draws before it
     * takes its row: one statement cannot insert the row, draw, and then write the stamp
     * into the row it inserted. Its insert waits only for a concurrent insert or delete of
     * the same key, and its lock waits end after the lock timeout (as in stampedUpdate).
     * $1 tbl, $2 key, $3 counter name, $4 state template, $5 notified, $6 lock timeout.
     */
    stampedCreate: `WITH c AS (
  INSERT INTO ${n.counters} (name, value)
  SELECT $3::bytea, 1::bigint
  WHERE NOT EXISTS (SELECT 1 FROM ${n.rows} WHERE tbl = $1::bytea AND key = $2::bytea)
    AND set_config('lock_timeout', $6::text, true) IS NOT NULL
  ON CONFLICT (name) DO UPDATE SET value = ${n.counters}.value + EXCLUDED.value
  RETURNING value
),
w AS (
  INSERT INTO ${n.rows} (tbl, key, version, state, notified)
  SELECT $1::bytea, $2::bytea, ${nextVersion}, overlay($4::bytea PLACING int8send(c.value) FROM 2 FOR 8), $5::boolean
  FROM c
  ON CONFLICT (tbl, key) DO NOTHING
  RETURNING version
)
SELECT w.version::text AS version, c.value::text AS ts FROM w CROSS JOIN c`,

    /*
     * Stamped multi-row check-and-set (capability stampedCheckAndSetMany), and the stamped
     * create of one row: one statement calling the function the schema defines (schema.ts,
     * casStampedManyFunctionBody), which locks every row (the updates' rows in (tbl, key)
     * order, then inserts the creates in that order), draws, and writes every row, all or
     * nothing. Row (0, drawn value, NULL) means applied, then (ordinal, new version, NULL)
     * per request; no row 0 means a request did not match, and the rows are the present
     * rows as they are. A create whose key appeared while the call waited raises
     * CAS_MANY_MISMATCH (all rolled back).
     *
     * The first argument sets the transaction's lock_timeout (as stampedUpdate does) before
     * the function runs: a function's arguments are evaluated before its body, and the
     * setting lasts to the end of the transaction, so every lock wait inside is bounded.
     * $1 counter name, $2 tables, $3 keys, $4 expected versions (NULL: must be absent),
     * $5 state templates, $6 notified flags, $7 lock timeout (ms, as text).
     */
    casStampedMany: `SELECT ordinal::int AS i, row_version::text AS version, row_state AS state
FROM ${n.casStampedMany}(
  CASE WHEN set_config('lock_timeout', $7::text, true) IS NOT NULL THEN $1::bytea END,
  $2::bytea[], $3::bytea[], $4::bigint[], $5::bytea[], $6::boolean[])`,
  };
}

export type PostgresStatements = ReturnType<typeof postgresStatements>;

/**
 * The casMany statement (see `casMany` above). With `lockFirst`, a first CTE locks every
 * requested row that exists, in (tbl, key) order, before anything is written; without, the
 * updates and deletes take their rows in whatever order the plan meets them (the creates in
 * key order), which cannot deadlock only when at most one existing row is written.
 */
function casManySql(n: PostgresNames, nextVersion: string, lockFirst: boolean): string {
  // What the writes read: the requests, or (lockFirst) the requests once every row is locked.
  const src = lockFirst ? 'q' : 'req';
  return `WITH req AS (
  SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bigint[], $4::bytea[], $5::boolean[], $6::text[])
    WITH ORDINALITY AS r(tbl, key, expected, state, notified, kind, i)
),
${
  lockFirst
    ? `lk AS MATERIALIZED (
  SELECT t.tbl, t.key FROM ${n.rows} t JOIN req r ON t.tbl = r.tbl AND t.key = r.key
  ORDER BY t.tbl, t.key
  FOR UPDATE OF t
),
q AS MATERIALIZED (
  SELECT r.* FROM req r WHERE (SELECT count(*) FROM lk) >= 0
),`
    : ''
}
upd AS (
  UPDATE ${n.rows} t SET version = ${nextVersion}, state = r.state, notified = r.notified
  FROM ${src} r
  WHERE r.kind = 'update' AND t.tbl = r.tbl AND t.key = r.key AND t.version = r.expected
  RETURNING r.i, t.version
),
del AS (
  DELETE FROM ${n.rows} t USING ${src} r
  WHERE r.kind = 'delete' AND t.tbl = r.tbl AND t.key = r.key AND t.version = r.expected
  RETURNING r.i, ${nextVersion} AS version
),
ins AS (
  INSERT INTO ${n.rows} (tbl, key, version, state, notified)
  SELECT r.tbl, r.key, ${nextVersion}, r.state, r.notified FROM ${src} r WHERE r.kind = 'create'
  ORDER BY r.tbl, r.key
  ON CONFLICT (tbl, key) DO NOTHING
  RETURNING tbl, key, version
)
SELECT i::int AS i, version::text AS version FROM upd
UNION ALL
SELECT i::int, version::text FROM del
UNION ALL
SELECT r.i::int, ins.version::text FROM ins JOIN req r ON r.kind = 'create' AND r.tbl = ins.tbl AND r.key = ins.key
UNION ALL
SELECT r.i::int, ${nextVersion}::text FROM req r
WHERE r.kind = 'ensureAbsent' AND NOT EXISTS (SELECT 1 FROM ${n.rows} t WHERE t.tbl = r.tbl AND t.key = r.key)`;
}
