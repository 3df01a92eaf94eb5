import type { MySqlNames } from './schema.js';

/**
 * Every SQL text the store sends. Identifiers come from `MySqlNames` (fixed suffixes on a
 * validated namespace); table names, keys, versions and states are `?` parameters.
 *
 * Versions are compared and stored through CAST(? AS UNSIGNED): a quoted number compared
 * with an integer column would otherwise be compared as a double.
 *
 * Affected rows: mysql2 sets CLIENT_FOUND_ROWS by default, so UPDATE reports MATCHED rows.
 * That is correct here whatever the flags are, because every successful CAS changes the
 * version column (the new token was never issued before), so matched = changed.
 */
export function mysqlStatements(n: MySqlNames) {
  const columns = '(tbl, row_key, version, state, notified)';
  const values = 'VALUES (?, ?, CAST(? AS UNSIGNED), ?, ?)';
  return {
    read: `SELECT CAST(version AS CHAR) AS version, state FROM ${n.rows} WHERE tbl = ? AND row_key = ?`,

    // A plain INSERT: an existing row fails with ER_DUP_ENTRY and nothing else is
    // downgraded (INSERT IGNORE would also turn truncation etc. into warnings).
    create: `INSERT INTO ${n.rows} ${columns} ${values}`,

    /*
     * Inside a multi-statement batch an error would stop the statements after it, so creates
     * there use INSERT IGNORE (0 affected rows = the row existed). That is safe only because
     * every value is validated before: keys <= 1024 bytes, tables <= 64 ASCII characters,
     * states <= maxStateBytes, no NULLs, so the only error IGNORE can downgrade is the
     * duplicate key.
     */
    createIgnore: `INSERT IGNORE INTO ${n.rows} ${columns} ${values}`,

    update: `UPDATE ${n.rows} SET version = CAST(? AS UNSIGNED), state = ?, notified = ?
WHERE tbl = ? AND row_key = ? AND version = CAST(? AS UNSIGNED)`,

    delete: `DELETE FROM ${n.rows} WHERE tbl = ? AND row_key = ? AND version = CAST(? AS UNSIGNED)`,

    // Followed by "(tbl = ? AND row_key IN (?, ...)) OR ..." per table; see MySqlStore.readMany.
    readManyPrefix: `SELECT tbl, row_key, CAST(version AS CHAR) AS version, state FROM ${n.rows} WHERE `,

    /*
     * The peeked read (capability peekedRead): the counter's value (0 if absent) and the
     * rows in ONE SELECT, so one consistent read view; it writes and locks nothing.
     * Followed by the same WHERE as readManyPrefix (or FALSE for no rows). Why the view
     * shows every write stamped at or below the value, and every write acknowledged before
     * a draw that returned at most it: a draw commits with the counter row locked, and
     * InnoDB makes a transaction visible to new read views before it releases its locks;
     * the next draw waits for that lock. So a view that sees value V sees the draw of V,
     * every earlier draw, and each one's writes. A draw in flight is not seen or waited for.
     */
    readPeekedPrefix: `SELECT NULL AS tbl, NULL AS row_key,
  CAST(COALESCE((SELECT value FROM ${n.counters} WHERE name = ?), 0) AS CHAR) AS version, NULL AS state
UNION ALL
SELECT tbl, row_key, CAST(version AS CHAR) AS version, state FROM ${n.rows} WHERE `,

    // Bounds and `after` are appended from fixed fragments; see MySqlStore.scan.
    scanPrefix: `SELECT row_key, CAST(version AS CHAR) AS version, state FROM ${n.rows} WHERE tbl = ?`,
    // Served by the (tbl, notified, row_key) index, already in key order.
    scanNotifiedPrefix: `SELECT row_key FROM ${n.rows} WHERE tbl = ? AND notified = TRUE`,

    // LAST_INSERT_ID(expr) puts the new value in the OK packet's insert id, so the caller
    // reads it from this same statement's reply (the value belongs to this connection).
    increment: `INSERT INTO ${n.counters} (name, value) VALUES (?, LAST_INSERT_ID(?))
ON DUPLICATE KEY UPDATE value = LAST_INSERT_ID(value + ?)`,

    reserveVersionBlock: `INSERT INTO ${n.versionBlocks} () VALUES ()`,

    // The stamped CAS: one CALL of the procedure in schema.ts (see there for why it is
    // atomic). tbl, key, expected (NULL = create), new version, state, notified, counter
    // name, stamp offset. Answers one row (applied, ts, version, state).
    stampedCas: `CALL ${n.stampedCas}(?, ?, CAST(? AS UNSIGNED), CAST(? AS UNSIGNED), ?, ?, ?, ?)`,

    // The stamped read: one CALL of the other procedure in schema.ts (see there for why the
    // read sees every write below the drawn value). Counter name, rows as a JSON array of
    // [table hex, key hex]. Answers (0, drawn value, NULL), then (position, version, state)
    // per requested row that exists.
    stampedRead: `CALL ${n.stampedRead}(?, ?)`,

    // The stamped CAS of many rows: one CALL of the third procedure in schema.ts (see there
    // for why it is atomic, why a later draw sees every row, and why it cannot deadlock).
    // Rows as a JSON array of [table hex, key hex, expected or null, new version, state
    // offset, state length, notified] in (table, key) byte order, the states packed into one
    // blob, counter name, stamp offset. Answers (0, applied, ts) and, on failure, (position
    // in that array, version, state) per requested row that exists.
    stampedCasMany: `CALL ${n.stampedCasMany}(?, ?, ?, ?)`,

    // The stamped CAS of a few rows: one CALL of a fixed-slot procedure in schema.ts (the
    // many-row step with one statement for all rows; see there). By slot count: the number
    // of rows updated, then per slot tbl, key, expected (NULL = create), new version, state,
    // notified (all NULL for an unused slot), counter name, stamp offset. Answers as the
    // many-row CALL does, positions being slot numbers.
    stampedSlots: new Map(
      n.stampedSlots.map(({ slots, name }) => [
        slots,
        `CALL ${name}(?, ${Array.from({ length: slots }, () => '?, ?, CAST(? AS UNSIGNED), CAST(? AS UNSIGNED), ?, ?').join(', ')}, ?, ?)`,
      ]),
    ),

    // At startup: the packet limit, and whether the stamped CAS, stamped read and stamped
    // CAS-of-many procedures exist (they do unless the schema was made by hand from an older
    // script): stampedCheckAndSet, stampedRead, stampedCheckAndSetMany; and how many of the
    // fixed-slot procedures do (all of them, or the many-row procedure takes every step).
    settings: `SELECT @@max_allowed_packet AS p,
  (SELECT COUNT(*) FROM information_schema.ROUTINES
   WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_TYPE = 'PROCEDURE' AND ROUTINE_NAME = ?) AS stamped,
  (SELECT COUNT(*) FROM information_schema.ROUTINES
   WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_TYPE = 'PROCEDURE' AND ROUTINE_NAME = ?) AS stamped_read,
  (SELECT COUNT(*) FROM information_schema.ROUTINES
   WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_TYPE = 'PROCEDURE' AND ROUTINE_NAME = ?) AS stamped_many,
  (SELECT COUNT(*) FROM information_schema.ROUTINES
   WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_TYPE = 'PROCEDURE'
   AND ROUTINE_NAME IN (${n.stampedSlots.map(() => '?').join(', ')})) AS stamped_slots`,
  };
}

export type MySqlStatements = ReturnType<typeof mysqlStatements>;
