import { validateNamespace } from '@percolator/core/kit';

/**
 * One set of tables per namespace, in the connection's database:
 *   <ns>_rows            the rows: (tbl, row_key) -> version, state, notified
 *   <ns>_counters        atomic counters (incrementCounter)
 *   <ns>_version_blocks  AUTO_INCREMENT source of version blocks; see versions.ts.
 *                        Rows are never deleted, so ids are never handed out twice,
 *                        even on servers that recompute AUTO_INCREMENT from MAX(id);
 *                        ids start at the clock, so not after re-creation either.
 *   <ns>_stamped_cas_v1  stored procedure: the stamped check-and-set (see below).
 *   <ns>_stamped_read_v1 stored procedure: the stamped read (see below).
 *   <ns>_cas_stamped_many_v6  stored procedure: the stamped check-and-set of many rows.
 *   <ns>_cas_slots<S>_v1 stored procedures (S = 2, 4, 8, 16): the same for up to S rows,
 *                        with a fixed argument list and one statement for all rows.
 * Identifiers are built only from the validated namespace and fixed suffixes.
 */
export interface MySqlNames {
  readonly namespace: string;
  readonly rows: string;
  readonly counters: string;
  readonly versionBlocks: string;
  /** The stamped CAS procedure, quoted. */
  readonly stampedCas: string;
  /** Its bare name (a bound value when looking it up in information_schema). */
  readonly stampedCasRoutine: string;
  /** The stamped read procedure, quoted. */
  readonly stampedRead: string;
  /** Its bare name. */
  readonly stampedReadRoutine: string;
  /** The stamped check-and-set of many rows, quoted. */
  readonly stampedCasMany: string;
  /** Its bare name. */
  readonly stampedCasManyRoutine: string;
  /**
   * The stamped check-and-set of a few rows, one procedure per number of slots
   * (STAMPED_SLOTS, ascending): quoted name and bare name of each.
   */
  readonly stampedSlots: readonly {
    readonly slots: number;
    readonly name: string;
    readonly routine: string;
  }[];
}

/**
 * The procedure's name carries a version: `CREATE PROCEDURE IF NOT EXISTS` never replaces
 * an existing body, so a changed body must get a new name (and the old one stays harmless).
 */
const STAMPED_CAS_SUFFIX = 'stamped_cas_v1';
const STAMPED_READ_SUFFIX = 'stamped_read_v1';
const STAMPED_CAS_MANY_SUFFIX = 'cas_stamped_many_v6';
/** The slot counts of the fixed-slot procedures (see stampedSlotsProcedure). */
export const STAMPED_SLOTS = [2, 4, 8, 16] as const;
const stampedSlotsSuffix = (slots: number) => `cas_slots${slots}_v1`;

export function mysqlNames(namespace?: string): MySqlNames {
  const ns = validateNamespace(namespace);
  return {
    namespace: ns,
    rows: `\`${ns}_rows\``,
    counters: `\`${ns}_counters\``,
    versionBlocks: `\`${ns}_version_blocks\``,
    stampedCas: `\`${ns}_${STAMPED_CAS_SUFFIX}\``,
    stampedCasRoutine: `${ns}_${STAMPED_CAS_SUFFIX}`,
    stampedRead: `\`${ns}_${STAMPED_READ_SUFFIX}\``,
    stampedReadRoutine: `${ns}_${STAMPED_READ_SUFFIX}`,
    stampedCasMany: `\`${ns}_${STAMPED_CAS_MANY_SUFFIX}\``,
    stampedCasManyRoutine: `${ns}_${STAMPED_CAS_MANY_SUFFIX}`,
    stampedSlots: STAMPED_SLOTS.map((slots) => ({
      slots,
      name: `\`${ns}_${stampedSlotsSuffix(slots)}\``,
      routine: `${ns}_${stampedSlotsSuffix(slots)}`,
    })),
  };
}

/**
 * The schema, one statement per entry; every statement is idempotent. `createMySqlStore`
 * runs them under GET_LOCK so that many processes starting at once queue up.
 * Plain MariaDB / MySQL 8.0.29+ syntax only (no RETURNING, no sequences; the procedures
 * need CREATE PROCEDURE IF NOT EXISTS, the stamped read JSON_TABLE: MariaDB 10.6+).
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
    stampedCasProcedure(n),
    stampedReadProcedure(n),
    stampedCasManyProcedure(n),
    ...n.stampedSlots.map(({ slots, name }) => stampedSlotsProcedure(n, name, slots)),
  ];
}

/**
 * The counter draw of every stamped procedure: exactly `incrementCounter`'s statement with
 * delta 1 (statements.ts, `increment`), its value into v_ts. `indent` goes before each line.
 */
function drawCounter(n: MySqlNames, indent: string): string {
  return [
    `INSERT INTO ${n.counters} (name, value) VALUES (p_counter, LAST_INSERT_ID(1))`,
    'ON DUPLICATE KEY UPDATE value = LAST_INSERT_ID(value + 1);',
    'SET v_ts = LAST_INSERT_ID();',
  ]
    .map((line) => indent + line)
    .join('\n');
}

/**
 * The many-row procedure's next entry of p_rows: the text from v_pos (a '[') to the next
 * ']', then v_pos on the '[' after it. The entries hold only hex strings, numbers and null,
 * never a bracket (the store writes them), and p_rows is ASCII, so LOCATE and SUBSTRING
 * start at a byte offset: each entry costs its own length. JSON_EXTRACT(p_rows, '$[i]')
 * scans the array from its start, so a call of n rows cost n squared (41 % of the server's
 * CPU in a call of 64 rows).
 */
function nextRow(indent: string): string {
  return [
    "SET v_end = LOCATE(']', p_rows, v_pos);",
    'IF v_pos = 0 OR v_end = 0 THEN',
    "  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'percolator: p_rows has fewer entries than JSON_LENGTH says';",
    'END IF;',
    'SET v_row = SUBSTRING(p_rows, v_pos, v_end - v_pos + 1);',
    "SET v_pos = LOCATE('[', p_rows, v_end);",
  ]
    .map((line) => indent + line)
    .join('\n');
}

/**
 * The exit handler of the procedures that write rows: roll back, and an error once COMMIT
 * was issued (v_committing) is resignalled as ER_ERROR_DURING_COMMIT (1180), 'unknown'.
 */
export const WRITE_EXIT_HANDLER = `  DECLARE EXIT HANDLER FOR SQLEXCEPTION
  BEGIN
    ROLLBACK;
    IF v_committing THEN
      RESIGNAL SET MYSQL_ERRNO = 1180;
    END IF;
    RESIGNAL;
  END;`;

/**
 * The end of a stamped step that writes rows, after its writes (`IF v_ok THEN` ...): commit
 * and answer (applied, ts); or, refused (`ELSE`), roll back and answer every requested row
 * that exists from a fresh snapshot. `rows`: the SELECT of (position, 0, NULL, version,
 * state) that finds them.
 */
function commitOrAnswer(rows: string): string {
  return `    SET v_committing = TRUE;
    COMMIT;
    SELECT 0 AS i, 1 AS applied, CAST(v_ts AS CHAR) AS ts, NULL AS version, NULL AS state;
  ELSE
    ROLLBACK;
    START TRANSACTION READ ONLY;
    SELECT 0 AS i, 0 AS applied, NULL AS ts, NULL AS version, NULL AS state
    UNION ALL
${rows};
    COMMIT;
  END IF;`;
}

/*
 * The stamped check-and-set (capability stampedCheckAndSet), one CALL = one statement = one
 * round trip. Everything arrives as a parameter (table, key, versions, state, counter name,
 * where the stamp goes); the body names only this namespace's tables.
 *
 * Why a stored procedure. MariaDB has no UPDATE ... RETURNING and neither server can draw
 * from a counter inside the statement that writes the row, so the step needs several
 * statements in one transaction, sent at once. The alternative, a multi-statement query
 * (START TRANSACTION; ...; COMMIT), needs `multipleStatements` on the connection (a user's
 * pool may lack it), cannot branch (it would advance the counter for a CAS that fails), and
 * on an error stops at the failing statement with the transaction still open on a pooled
 * connection, without saying which statement failed. The procedure has the flow control,
 * and a call that fails never commits: its handler rolls back, and after the errors
 * MariaDB deems fatal, which skip handlers and leave the transaction open (a lock wait
 * timeout or a deadlock inside a row write), the store rolls the connection back itself
 * (MySqlRowStore.callProcedure). So a server error answer means "nothing committed" exactly
 * as for one autocommit statement (errors.ts), and no connection goes back to the pool
 * inside a transaction. SQL SECURITY INVOKER: it runs with the caller's privileges on the
 * tables, and keeps working if its creator's account is dropped.
 *
 * Steps, in one InnoDB transaction:
 *   1. Lock the row: INSERT it (expected NULL; a duplicate key = the row exists = the CAS
 *      fails) or SELECT ... FOR UPDATE it at the expected version.
 *   2. Only if that matched: add 1 to the counter with the very statement `increment` uses
 *      (same table, same row, LAST_INSERT_ID), so the counter row stays X-locked until
 *      COMMIT; then write the row once more with the stamp (the value, 8 bytes big endian
 *      from HEX/LPAD/UNHEX) over bytes p_stamp_at+1 .. p_stamp_at+8 (1-based) of the state.
 *   3. COMMIT, then answer (applied, ts). A CAS that does not match answers (0, current
 *      row) read under the lock of step 1 and rolls back: the counter did not move.
 *
 * Why whoever draws a later counter value and then reads sees this write: a later draw
 * (incrementCounter, or this procedure for another row) updates the same counter row, so
 * it waits for the X lock taken in step 2, which InnoDB holds until this transaction
 * commits. InnoDB commits in memory (the transaction leaves the set that new read views
 * treat as active: trx_t::commit_in_memory, deregister_rw) BEFORE it releases its locks,
 * so when any later value is handed out this write is already visible to every read view
 * opened afterwards, i.e. to the drawer's next read. A rolled-back transaction also rolls
 * the counter back, so its value was never handed out by anyone.
 *
 * Lock order: the row first, the counter second; whoever holds the counter (this
 * procedure after step 2, `increment`) waits for no other row, so the counter is never in
 * a deadlock cycle, and a stamped CAS waiting for a busy row does not hold up the oracle.
 * Step 2's write may change the `notified` index entry: only a locking scan of that index
 * (nothing in this library runs one) could make it wait while holding the counter.
 *
 * Errors after COMMIT was issued (in practice none) are resignalled as
 * ER_ERROR_DURING_COMMIT (1180), which errors.ts reports as 'unknown'.
 */
function stampedCasProcedure(n: MySqlNames): string {
  return `CREATE PROCEDURE IF NOT EXISTS ${n.stampedCas}(
  IN p_tbl VARBINARY(64),
  IN p_key VARBINARY(1024),
  IN p_expected BIGINT UNSIGNED,
  IN p_version BIGINT UNSIGNED,
  IN p_state LONGBLOB,
  IN p_notified BOOLEAN,
  IN p_counter VARBINARY(1024),
  IN p_stamp_at INT UNSIGNED
)
MODIFIES SQL DATA
SQL SECURITY INVOKER
COMMENT 'percolator stamped check-and-set, see @percolator/mysql README'
BEGIN
  DECLARE v_ok INT DEFAULT 0;
  DECLARE v_ts BIGINT UNSIGNED;
  DECLARE v_committing BOOLEAN DEFAULT FALSE;
${WRITE_EXIT_HANDLER}
  START TRANSACTION;
  IF p_expected IS NULL THEN
    SET v_ok = 1;
    BEGIN
      DECLARE CONTINUE HANDLER FOR 1062 SET v_ok = 0;
      INSERT INTO ${n.rows} (tbl, row_key, version, state, notified)
      VALUES (p_tbl, p_key, p_version, p_state, p_notified);
    END;
  ELSE
    SELECT COUNT(*) INTO v_ok FROM ${n.rows}
    WHERE tbl = p_tbl AND row_key = p_key AND version = p_expected FOR UPDATE;
  END IF;
  IF v_ok = 1 THEN
${drawCounter(n, '    ')}
    UPDATE ${n.rows}
    SET version = p_version,
      state = INSERT(p_state, p_stamp_at + 1, 8, UNHEX(LPAD(HEX(v_ts), 16, '0'))),
      notified = p_notified
    WHERE tbl = p_tbl AND row_key = p_key;
    SET v_committing = TRUE;
    COMMIT;
    SELECT 1 AS applied, CAST(v_ts AS CHAR) AS ts, NULL AS version, NULL AS state;
  ELSE
    SELECT 0 AS applied, NULL AS ts, CAST(version AS CHAR) AS version, state
    FROM ${n.rows} WHERE tbl = p_tbl AND row_key = p_key;
    ROLLBACK;
  END IF;
END`;
}

/*
 * The stamped read (capability stampedRead), one CALL = one round trip: add 1 to a counter,
 * then read rows with a read view created after that increment.
 *
 * Arguments: the counter name, and the rows as a JSON array of [table hex, key hex] pairs
 * (hex, so keys with any bytes, NUL included, cross JSON unchanged; the array is a bound
 * string, never SQL text). JSON_TABLE turns it into rows with their 1-based position
 * (FOR ORDINALITY), joined to the rows table on its primary key.
 *
 * Steps:
 *   1. START TRANSACTION; add 1 to the counter with the very statement `increment` uses
 *      (same row, LAST_INSERT_ID); COMMIT. The increment waits for any transaction that
 *      holds the counter row: a stamped CAS holds it from its draw until its COMMIT, and
 *      InnoDB makes a transaction visible to new read views before it releases its locks.
 *   2. START TRANSACTION READ ONLY, then one SELECT that answers (0, drawn value, NULL)
 *      and (position, version, state) for every requested row that exists; COMMIT.
 *      The SELECT is the new transaction's first consistent read, so under REPEATABLE READ
 *      (the default) it creates the transaction's read view now, after step 1 committed;
 *      under READ COMMITTED every statement gets a new view anyway. So it sees every write
 *      that was visible before the counter reached the drawn value.
 * Drawing and reading in ONE transaction whose read view was created before the increment
 * waited (e.g. START TRANSACTION WITH CONSISTENT SNAPSHOT, or any read before the draw)
 * would NOT do: that view predates a stamped CAS that commits during the wait, whose stamp
 * is below the drawn value (the tests show such a read missing the write). Committing the
 * draw first also frees the counter row before the read runs.
 *
 * Every error rolls back and is resignalled (a read: nothing but the counter was written,
 * and a drawn value that is never used is just a gap). After the errors MariaDB deems
 * fatal, which skip handlers, the store rolls the connection back itself, as for the
 * stamped CAS.
 */
function stampedReadProcedure(n: MySqlNames): string {
  return `CREATE PROCEDURE IF NOT EXISTS ${n.stampedRead}(
  IN p_counter VARBINARY(1024),
  IN p_rows LONGTEXT
)
MODIFIES SQL DATA
SQL SECURITY INVOKER
COMMENT 'percolator stamped read, see @percolator/mysql README'
BEGIN
  DECLARE v_ts BIGINT UNSIGNED;
  DECLARE EXIT HANDLER FOR SQLEXCEPTION
  BEGIN
    ROLLBACK;
    RESIGNAL;
  END;
  START TRANSACTION;
${drawCounter(n, '  ')}
  COMMIT;
  START TRANSACTION READ ONLY;
  SELECT 0 AS i, CAST(v_ts AS CHAR) AS version, NULL AS state
  UNION ALL
  SELECT r.i, CAST(t.version AS CHAR), t.state
  FROM JSON_TABLE(p_rows, '$[*]' COLUMNS (
    i FOR ORDINALITY,
    tbl_hex VARCHAR(128) PATH '$[0]',
    key_hex VARCHAR(2048) PATH '$[1]'
  )) AS r
  STRAIGHT_JOIN ${n.rows} AS t ON t.tbl = UNHEX(r.tbl_hex) AND t.row_key = UNHEX(r.key_hex);
  COMMIT;
END`;
}

/*
 * The stamped check-and-set of many rows (capability stampedCheckAndSetMany), one CALL = one
 * round trip: the stamped CAS above for several rows as ONE transaction, all or nothing, one
 * drawn value for all.
 *
 * Arguments, all bound values (never SQL text): the rows as a JSON array, one [table hex,
 * key hex, expected version or null, new version, state offset (1-based), state length,
 * notified 0/1] per row (hex, so keys with any bytes cross JSON unchanged), sorted in
 * ascending (tbl, row_key) byte order: the order the locks are taken in. The procedure
 * checks that order as it goes and fails with an error (after a ROLLBACK) at the first
 * row that is not after the one before it, a row named twice included, before locking it.
 * Then the states packed back to back into one LONGBLOB (each row takes its slice with
 * SUBSTRING, so no state is ever hex inside JSON); the counter name; where the stamp goes.
 *
 * Steps, in one InnoDB transaction:
 *   1. Lock the rows one by one, in the array's order: a create INSERTs the row with its new
 *      version and its notified flag, and an empty state for now, ON DUPLICATE KEY UPDATE
 *      the version (XOR 1): one row affected means inserted, two that the row exists, and
 *      the call fails, as in the stamped CAS (its ROLLBACK undoes that change; a row the
 *      call holds is never seen changed by anyone). Two, whatever the client's found-rows
 *      flag: only a row set to its current values counts differently with it. ON DUPLICATE KEY makes InnoDB
 *      take the duplicate check's lock exclusive at once; a plain INSERT takes it shared and
 *      then asks for an exclusive one to write over a deleted (delete-marked, not yet
 *      purged) row, so two calls creating a key just deleted both held the shared lock and
 *      deadlocked asking for the exclusive one (seen about once in every other run of the
 *      churn test). An update SELECTs the row FOR
 *      UPDATE at the expected version (a locking read: the latest committed version, after
 *      waiting for whoever holds the row). At the first row that does not match: ROLLBACK
 *      (nothing was written, nothing drawn), then answer every requested row from a fresh
 *      snapshot (START TRANSACTION READ ONLY, one SELECT, COMMIT).
 *   2. All rows locked and matched: add 1 to the counter with the very statement `increment`
 *      uses (the counter row stays X-locked until COMMIT); write every row, one UPDATE on
 *      its primary key each, in the array's order again (new version,
 *      notified, its state with the value, 8 bytes big endian, over bytes p_stamp_at+1 ..
 *      p_stamp_at+8); COMMIT; answer (applied, ts).
 * The draw is the last statement before the writes, and the writes touch only rows the
 * transaction holds already, so the counter is held for the writes and the COMMIT alone.
 *
 * Why a create costs two statements (`_v6`). `_v4` read each created row back FOR UPDATE
 * to learn whether its INSERT had made it, a third statement; the affected-row count
 * tells as much. Creates are most rows a transfer's one-step commit writes here (the
 * version rows it carries, docs/protocol.md 7.2). `_v5`, never released, went further: a
 * create locked nothing before the draw and was one INSERT after it, which cut the
 * server's CPU per transfer by about a sixth, but then a call waited for row locks while
 * it held the counter, so whoever held a key being created (an idle session's locking
 * read of an absent key, say) stalled every draw on that counter until its lock wait
 * timed out, where here it stalls only that call.
 *
 * Cost. Per row: its entry cut out of p_rows at a byte offset (nextRow), then JSON_VALUE
 * of each field, one statement on the primary key to lock (or create) it and one to write
 * it, so a call costs in proportion to its rows. No statement reads
 * JSON_TABLE on the way to a success: on MariaDB 10.11 a statement over JSON_TABLE builds
 * a temporary table each time it runs and costs as much as several primary-key
 * statements. Measured with one such statement to lock all rows and one to write them,
 * a call of 2 rows took about 1.5 times as long; up to about 8 rows it was no faster and
 * kept the counter longer after the draw; only towards 16 rows (the core's default
 * onePhaseMaxRows) does it win, which is not worth a second way of locking, nor a write
 * whose plan, unlike a primary-key UPDATE, the optimizer could turn into a scan while the
 * counter is held. Nor is there a read-only precheck: a stale expected version fails at
 * its own lock, having locked only the rows sorted before it, which the ROLLBACK releases
 * at once.
 *
 * Each row's state is cut out of p_states by a SET (v_state) and the UPDATE names only
 * v_state. MariaDB rewrites every SQL statement inside a procedure with the values of the
 * variables it names, escaped, into a query string (for its logs and the process list;
 * it does so with every log off too), while a SET is not rewritten. `_v3` named p_states
 * in each row's UPDATE, so each row copied and escaped every row's state: the cost grew
 * with the square of the rows. Measured with 500-byte states, one call after another: 16
 * rows 316-408 -> 461-524 calls a second, 64 rows 45-51 -> 92-104; 2 rows alike. `_v3`
 * also took each entry with JSON_EXTRACT(p_rows, '$[i]'), which scans from the start
 * (nextRow); without that, 64 rows 142-152 calls a second (`_v4`), 2 and 16 rows alike.
 *
 * Atomic: every write is in one InnoDB transaction that commits once, after every check
 * passed under the X locks it still holds; a failure or an error rolls all of it back
 * (the exit handler; after errors MariaDB deems fatal the store rolls the connection back,
 * as for the stamped CAS). No reader sees part of it: consistent reads see a transaction
 * whole or not at all, locking reads wait for its locks.
 *
 * Why whoever draws a later counter value and then reads any of these rows sees every one
 * of these writes: as for the stamped CAS, a later draw (incrementCounter, a stamped CAS,
 * a stamped read, another call of this procedure) updates the same counter row, so it
 * waits for the X lock taken in step 2, held until COMMIT; InnoDB makes the whole
 * transaction visible to new read views before it releases its locks. The counter and the
 * rows commit together, so a value above this one is handed out only after all of the
 * rows are visible.
 *
 * No deadlock with the other statements (under REPEATABLE READ or READ COMMITTED): locks
 * are taken in one global order, rows (in byte order) before the counter. Whoever holds the
 * counter (step 2 here, the stamped CAS after its draw, `increment`, the stamped read's
 * draw) waits for no row: it holds all of its rows already (the final writes touch only
 * them; as for the stamped CAS, only a locking scan of the `notified` index, which nothing
 * in this library runs, could hold up the new index entries of an update that changes the
 * flag; a create's entry was made in step 1). A plain CAS, a statement of checkAndSetMany
 * (autocommit, one row each) and the stamped CAS's row lock hold at most one row, and the
 * stamped CAS then waits only for the counter. This procedure waits for a row only while
 * holding rows that sort before it (the order check comes before each lock); a lookup that
 * does not match (which may leave a gap lock) and a duplicate key (which leaves an exclusive
 * lock on the row that is there) are followed by ROLLBACK, never by a wait. So the
 * wait-for graph of these locks has no cycle. What this ordering cannot rule out is
 * InnoDB's lock inheritance: when a deleted row is purged, the locks on it, waiting ones
 * included, become gap locks on the next row, held by sessions that never asked for them;
 * several sessions then creating a key in that gap can deadlock (single INSERT statements
 * do too; seen in the churn test after the change above, in about 1 run of 8). InnoDB
 * rolls one back whole, and the store sends that CALL again (store.ts,
 * STAMPED_MANY_ATTEMPTS; a test forces one); after that many it fails as not applied,
 * retryable, and the core retries the transaction. Under SERIALIZABLE, plain reads (a stamped read's) take shared locks in
 * request order, which this argument does not cover.
 *
 * Errors after COMMIT was issued (in practice none) are resignalled as
 * ER_ERROR_DURING_COMMIT (1180), which errors.ts reports as 'unknown'.
 */
function stampedCasManyProcedure(n: MySqlNames): string {
  return `CREATE PROCEDURE IF NOT EXISTS ${n.stampedCasMany}(
  IN p_rows LONGTEXT CHARACTER SET ascii,
  IN p_states LONGBLOB,
  IN p_counter VARBINARY(1024),
  IN p_stamp_at INT UNSIGNED
)
MODIFIES SQL DATA
SQL SECURITY INVOKER
COMMENT 'percolator stamped check-and-set of many rows, see @percolator/mysql README'
BEGIN
  DECLARE v_n INT UNSIGNED;
  DECLARE v_i INT UNSIGNED DEFAULT 0;
  DECLARE v_ok BOOLEAN DEFAULT TRUE;
  DECLARE v_ts BIGINT UNSIGNED;
  DECLARE v_stamp VARBINARY(8);
  DECLARE v_committing BOOLEAN DEFAULT FALSE;
  DECLARE v_row TEXT;
  DECLARE v_tbl VARBINARY(64);
  DECLARE v_key VARBINARY(1024);
  DECLARE v_last_tbl VARBINARY(64);
  DECLARE v_last_key VARBINARY(1024);
  DECLARE v_expected BIGINT UNSIGNED;
  DECLARE v_version BIGINT UNSIGNED;
  DECLARE v_at INT UNSIGNED;
  DECLARE v_len INT UNSIGNED;
  DECLARE v_notified BOOLEAN;
  DECLARE v_state LONGBLOB;
  DECLARE v_pos INT UNSIGNED;
  DECLARE v_end INT UNSIGNED;
${WRITE_EXIT_HANDLER}
  SET v_n = JSON_LENGTH(p_rows);
  IF v_n IS NULL OR v_n = 0 THEN
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'percolator: p_rows must be a non-empty JSON array';
  END IF;
  START TRANSACTION;
  SET v_pos = LOCATE('[', p_rows, 2);
  lock_rows: WHILE v_i < v_n DO
${nextRow('    ')}
    SET v_tbl = UNHEX(JSON_VALUE(v_row, '$[0]')),
      v_key = UNHEX(JSON_VALUE(v_row, '$[1]')),
      v_expected = JSON_VALUE(v_row, '$[2]');
    IF v_i > 0 AND (v_tbl, v_key) <= (v_last_tbl, v_last_key) THEN
      SIGNAL SQLSTATE '45000'
      SET MESSAGE_TEXT = 'percolator: a row is named twice, or the rows are not in (tbl, row_key) order';
    END IF;
    IF v_expected IS NULL THEN
      SET v_version = JSON_VALUE(v_row, '$[3]');
      -- 1 row affected: inserted. 2: the row was there, and was changed (so the count
      -- tells, whatever the client's found-rows flag); the ROLLBACK below undoes that.
      INSERT INTO ${n.rows} (tbl, row_key, version, state, notified)
      VALUES (v_tbl, v_key, v_version, '', JSON_VALUE(v_row, '$[6]'))
      ON DUPLICATE KEY UPDATE version = version ^ 1;
      SET v_ok = ROW_COUNT() = 1;
    ELSE
      SELECT COUNT(*) = 1 INTO v_ok FROM ${n.rows}
      WHERE tbl = v_tbl AND row_key = v_key AND version = v_expected FOR UPDATE;
    END IF;
    IF NOT v_ok THEN
      LEAVE lock_rows;
    END IF;
    SET v_last_tbl = v_tbl, v_last_key = v_key, v_i = v_i + 1;
  END WHILE;
  IF v_ok THEN
${drawCounter(n, '    ')}
    SET v_stamp = UNHEX(LPAD(HEX(v_ts), 16, '0'));
    SET v_i = 0, v_pos = LOCATE('[', p_rows, 2);
    write_rows: WHILE v_i < v_n DO
${nextRow('      ')}
      SET v_tbl = UNHEX(JSON_VALUE(v_row, '$[0]')), v_key = UNHEX(JSON_VALUE(v_row, '$[1]')),
        v_version = JSON_VALUE(v_row, '$[3]'),
        v_at = JSON_VALUE(v_row, '$[4]'),
        v_len = JSON_VALUE(v_row, '$[5]'),
        v_notified = JSON_VALUE(v_row, '$[6]');
      SET v_state = INSERT(SUBSTRING(p_states, v_at, v_len), p_stamp_at + 1, 8, v_stamp);
      UPDATE ${n.rows}
      SET version = v_version, state = v_state, notified = v_notified
      WHERE tbl = v_tbl AND row_key = v_key;
      SET v_i = v_i + 1;
    END WHILE;
${commitOrAnswer(`    SELECT r.i, 0, NULL, CAST(t.version AS CHAR), t.state
    FROM JSON_TABLE(p_rows, '$[*]' COLUMNS (
      i FOR ORDINALITY,
      tbl_hex VARCHAR(128) PATH '$[0]',
      key_hex VARCHAR(2048) PATH '$[1]'
    )) AS r
    STRAIGHT_JOIN ${n.rows} AS t FORCE INDEX (PRIMARY)
      ON t.tbl = UNHEX(r.tbl_hex) AND t.row_key = UNHEX(r.key_hex)`)}
END`;
}

/*
 * The stamped check-and-set of a few rows (`_cas_slots<S>_v1`, S in STAMPED_SLOTS): the
 * many-row procedure's step, all or nothing, one drawn value for all, for up to S rows,
 * with a fixed argument list instead of a JSON array, and with one statement for all the
 * rows where the many-row procedure runs one per row. The store sends a step of k rows to
 * the smallest S >= k (up to 16; larger steps go to the many-row procedure).
 *
 * Why. In a `perf` profile of `mariadbd` under the many-row procedure, 75% of the server's
 * CPU went to executing the procedure's instructions (each SQL statement in a procedure is
 * set up again on every run: `reinit_stmt_before_use`, `fix_fields`), and only a few percent
 * to InnoDB's row work. The many-row procedure runs, per row, 2 statements and about 6
 * SET or IF instructions (its JSON parsing included); this one runs, for the whole step, 1
 * statement to lock the rows it updates, 1 per row it creates, and 1 to write every row.
 * Measured outside the bench (8 concurrent callers, 500-byte states, each caller on rows of
 * its own, one call after another): the server's CPU per call of 2 updated rows 0.70 ms
 * against 1.13 ms; calls a second, 2 rows 1,521 against 1,171, 4 rows 1,095 against 768, 8
 * rows 757 against 522. A procedure of 16 slots called with 2 rows was slower than the
 * many-row one (821 against 1,123 a second): unused slots cost (their arguments, their IF
 * and CASE arms), hence a procedure per size.
 *
 * Arguments, all bound values (never SQL text): the number of rows the step updates (its
 * rows with an expected version), then per slot the table, the key, the expected version
 * (NULL: create), the new version, the state and the notified flag, all NULL for an unused
 * slot; the counter name; where the stamp goes. Slots are filled from the first, in
 * ascending (tbl, row_key) byte order, each row once (the store checks both before it sends).
 *
 * Steps, in one InnoDB transaction:
 *   1. Lock the rows it updates, all in one locking read on the primary key (InnoDB locks
 *      them in key order, whatever the order of the OR): the latest committed version of
 *      each, after waiting for whoever holds it; the step goes on only if every one is at
 *      its expected version. Each slot's match starts with `p_e<i> IS NOT NULL`, so the
 *      read looks up only the keys it updates: without it a create's key (version = NULL
 *      is never true, but the lookup happens) was locked too, or for an absent key the gap
 *      where it would go, so two calls creating keys in one gap, each waiting for a row
 *      it updates, deadlocked though they shared no row (found in review). An unused slot
 *      (all NULL) matches nothing.
 *   2. Lock each row it creates, in slot order: INSERT it with its new version, an empty
 *      state and its notified flag, ON DUPLICATE KEY UPDATE the version (XOR 1). One row
 *      affected means inserted, two that the row was there: the step fails (its ROLLBACK
 *      undoes that change). As in the many-row procedure, and for the same reason (a plain
 *      INSERT took the duplicate check's lock shared, then asked for it exclusive over a
 *      row deleted but not yet purged, and two calls deadlocked).
 *   3. At the first check that fails: ROLLBACK (nothing written, nothing drawn), then answer
 *      every requested row from a fresh snapshot, each with its slot number.
 *   4. All rows locked and matched: draw from the counter with the very statement
 *      `increment` uses (the counter row stays X-locked until COMMIT); write every row with
 *      ONE UPDATE on the primary key (new version, notified, its state with the value, 8
 *      bytes big endian, over bytes p_stamp_at+1 .. p_stamp_at+8), which must change
 *      exactly the step's rows (else an error rolls everything back); COMMIT; answer
 *      (applied, ts).
 * The draw is the last statement before the write, and the write touches only rows the
 * transaction holds already, so the counter is held for that one statement and the COMMIT.
 *
 * Why whoever draws a later value and then reads sees every row, and why it is atomic: as
 * for the many-row procedure (one transaction, the counter locked from the draw to the
 * COMMIT, InnoDB making the transaction visible before it releases its locks).
 *
 * Lock order. The rows are locked updates first (in key order), then creates (in key order),
 * where the many-row procedure locks all of them in one key order. Whoever holds the
 * counter still waits for no row (all its rows are locked before the draw), so the counter
 * is never in a deadlock cycle, and a call waiting for a row holds no counter. Between two
 * calls, a cycle needs one of them, while it waits in its locking read, to hold the key (or
 * the gap, for a key that is absent) where the other creates: it holds it as a row it
 * updates, so one of the two expected the row present and the other absent, or its update
 * found the key absent; either way one of them is bound to fail. Beyond that, InnoDB's lock
 * inheritance (a purged row's locks becoming gap locks on the next row, as for the many-row
 * procedure) can still close a cycle. InnoDB breaks a cycle by rolling one call back whole,
 * and the store sends it again, as for the many-row procedure (store.ts,
 * STAMPED_MANY_ATTEMPTS).
 *
 * Errors after COMMIT was issued (in practice none) are resignalled as
 * ER_ERROR_DURING_COMMIT (1180), which errors.ts reports as 'unknown'.
 */
function stampedSlotsProcedure(n: MySqlNames, name: string, slots: number): string {
  const each = (f: (i: number) => string, separator: string) =>
    Array.from({ length: slots }, (_, i) => f(i + 1)).join(separator);
  const params = each(
    (i) =>
      `  IN p_t${i} VARBINARY(64), IN p_k${i} VARBINARY(1024), IN p_e${i} BIGINT UNSIGNED, ` +
      `IN p_v${i} BIGINT UNSIGNED, IN p_s${i} LONGBLOB, IN p_n${i} BOOLEAN`,
    ',\n',
  );
  const row = (i: number) => `(tbl = p_t${i} AND row_key = p_k${i})`;
  const anyRow = each(row, '\n      OR ');
  const byRow = (value: (i: number) => string) =>
    `CASE ${each((i) => `WHEN ${row(i)} THEN ${value(i)}`, ' ')} END`;
  const creates = each(
    (i) => `  IF v_ok AND p_t${i} IS NOT NULL AND p_e${i} IS NULL THEN
    INSERT INTO ${n.rows} (tbl, row_key, version, state, notified) VALUES (p_t${i}, p_k${i}, p_v${i}, '', p_n${i})
    ON DUPLICATE KEY UPDATE version = version ^ 1;
    SET v_ok = ROW_COUNT() = 1, v_rows = v_rows + 1;
  END IF;`,
    '\n',
  );
  return `CREATE PROCEDURE IF NOT EXISTS ${name}(
  IN p_updates INT UNSIGNED,
${params},
  IN p_counter VARBINARY(1024),
  IN p_stamp_at INT UNSIGNED
)
MODIFIES SQL DATA
SQL SECURITY INVOKER
COMMENT 'percolator stamped check-and-set of up to ${slots} rows, see @percolator/mysql README'
BEGIN
  DECLARE v_ok BOOLEAN DEFAULT TRUE;
  DECLARE v_rows INT UNSIGNED DEFAULT p_updates;
  DECLARE v_ts BIGINT UNSIGNED;
  DECLARE v_stamp VARBINARY(8);
  DECLARE v_committing BOOLEAN DEFAULT FALSE;
${WRITE_EXIT_HANDLER}
  START TRANSACTION;
  IF p_updates > 0 THEN
    SELECT COUNT(*) = p_updates INTO v_ok FROM ${n.rows} FORCE INDEX (PRIMARY)
    WHERE ${each((i) => `(p_e${i} IS NOT NULL AND tbl = p_t${i} AND row_key = p_k${i} AND version = p_e${i})`, '\n      OR ')}
    FOR UPDATE;
  END IF;
${creates}
  IF v_ok THEN
${drawCounter(n, '    ')}
    SET v_stamp = UNHEX(LPAD(HEX(v_ts), 16, '0'));
    UPDATE ${n.rows} FORCE INDEX (PRIMARY)
    SET version = ${byRow((i) => `p_v${i}`)},
      state = INSERT(${byRow((i) => `p_s${i}`)}, p_stamp_at + 1, 8, v_stamp),
      notified = ${byRow((i) => `p_n${i}`)}
    WHERE ${anyRow};
    IF ROW_COUNT() <> v_rows THEN
      SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'percolator: the write of a stamped step changed another number of rows than it locked';
    END IF;
${commitOrAnswer(`    SELECT ${byRow((i) => String(i))}, 0, NULL, CAST(version AS CHAR), state
    FROM ${n.rows} FORCE INDEX (PRIMARY)
    WHERE ${anyRow}`)}
END`;
}

/** The schema as one SQL script, for users who manage schemas themselves. */
export function mysqlSchemaSql(namespace?: string): string {
  return `${mysqlSchemaStatements(namespace).join(';\n\n')};\n`;
}

export function mysqlDropStatements(namespace?: string): string[] {
  const n = mysqlNames(namespace);
  return [
    `DROP PROCEDURE IF EXISTS ${n.stampedCas}`,
    `DROP PROCEDURE IF EXISTS ${n.stampedRead}`,
    `DROP PROCEDURE IF EXISTS ${n.stampedCasMany}`,
    ...n.stampedSlots.map(({ name }) => `DROP PROCEDURE IF EXISTS ${name}`),
    // Its previous bodies, which a namespace created before version 6 may still hold.
    `DROP PROCEDURE IF EXISTS \`${n.namespace}_cas_stamped_many_v1\``,
    `DROP PROCEDURE IF EXISTS \`${n.namespace}_cas_stamped_many_v2\``,
    `DROP PROCEDURE IF EXISTS \`${n.namespace}_cas_stamped_many_v3\``,
    `DROP PROCEDURE IF EXISTS \`${n.namespace}_cas_stamped_many_v4\``,
    `DROP PROCEDURE IF EXISTS \`${n.namespace}_cas_stamped_many_v5\``,
    `DROP TABLE IF EXISTS ${n.rows}, ${n.counters}, ${n.versionBlocks}`,
  ];
}

/** GET_LOCK name (bound as a value) that serializes DDL of one namespace. */
export function schemaLockName(namespace: string): string {
  return `percolator.schema.${namespace}`;
}
