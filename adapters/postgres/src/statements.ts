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

    readMany: `SELECT r.i::int AS i, t.version::text AS version, t.state
FROM unnest($1::bytea[], $2::bytea[]) WITH ORDINALITY AS r(tbl, key, i)
JOIN ${n.rows} t ON t.tbl = r.tbl AND t.key = r.key`,

    /*
     * Many independent CAS in one statement (callers guarantee each row appears once).
     * Each data-modifying CTE touches only its kind of request; the final SELECT reports
     * the request ordinals that applied with their new versions. Rows that do not match
     * are simply not reported (= failed). The statement is atomic as a whole, which is
     * more than the contract asks, and a deadlock rolls all of it back.
     */
    casMany: `WITH req AS (
  SELECT * FROM unnest($1::bytea[], $2::bytea[], $3::bigint[], $4::bytea[], $5::boolean[], $6::text[])
    WITH ORDINALITY AS r(tbl, key, expected, state, notified, kind, i)
),
upd AS (
  UPDATE ${n.rows} t SET version = ${nextVersion}, state = r.state, notified = r.notified
  FROM req r
  WHERE r.kind = 'update' AND t.tbl = r.tbl AND t.key = r.key AND t.version = r.expected
  RETURNING r.i, t.version
),
del AS (
  DELETE FROM ${n.rows} t USING req r
  WHERE r.kind = 'delete' AND t.tbl = r.tbl AND t.key = r.key AND t.version = r.expected
  RETURNING r.i, ${nextVersion} AS version
),
ins AS (
  INSERT INTO ${n.rows} (tbl, key, version, state, notified)
  SELECT r.tbl, r.key, ${nextVersion}, r.state, r.notified FROM req r WHERE r.kind = 'create'
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
WHERE r.kind = 'ensureAbsent' AND NOT EXISTS (SELECT 1 FROM ${n.rows} t WHERE t.tbl = r.tbl AND t.key = r.key)`,

    // Bounds and `after` are appended from fixed fragments; see PostgresStore.scan.
    scanPrefix: `SELECT key, version::text AS version, state FROM ${n.rows} WHERE tbl = $1`,
    // `AND notified` matches the partial index's predicate, so the index is used.
    scanNotifiedPrefix: `SELECT key FROM ${n.rows} WHERE tbl = $1 AND notified`,

    increment: `INSERT INTO ${n.counters} (name, value) VALUES ($1, $2::bigint)
ON CONFLICT (name) DO UPDATE SET value = ${n.counters}.value + EXCLUDED.value
RETURNING value::text AS value`,
  };
}

export type PostgresStatements = ReturnType<typeof postgresStatements>;
