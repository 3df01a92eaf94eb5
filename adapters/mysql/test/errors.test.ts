/**
 * The failure mapping of errors the server raises as fatal: no stored procedure handler
 * runs for them (MariaDB's sp_head::execute skips handlers when is_fatal_error is set),
 * so one that comes after a stamped procedure's COMMIT reaches the client as itself, not as
 * the ER_ERROR_DURING_COMMIT the exit handler would make of it, and the write may be
 * committed. They must read as 'unknown' for a write.
 */
import { StoreError } from '@percolator/core';
import type { PoolConnection, RowDataPacket } from 'mysql2/promise';
import { describe, expect, it } from 'vitest';
import { isConnectionBroken, readError, writeError } from '../src/errors.js';
import { WRITE_EXIT_HANDLER } from '../src/schema.js';
import { admin, uniqueNamespace, useMySqlFixture } from './fixture.js';

useMySqlFixture('te');

/** A server error as mysql2 makes one from an error packet (not `fatal`: the server answered). */
function serverError(errno: number, sqlState: string, code: string): Error {
  return Object.assign(new Error(`${code}: from the server`), { errno, sqlState, code });
}

function outcome(error: unknown): { write: string; read: string; broken: boolean } {
  return {
    write: writeError('a write', error).applied,
    read: readError('a read', error).applied,
    broken: isConnectionBroken(error),
  };
}

/** Raised as fatal by MariaDB (ME_FATAL, or set as the statement's status directly). */
const FATAL = [
  serverError(5, 'HY000', 'EE_OUTOFMEMORY'),
  serverError(1037, 'HY001', 'ER_OUTOFMEMORY'),
  serverError(1038, 'HY001', 'ER_OUT_OF_SORTMEMORY'),
  serverError(1041, 'HY000', 'ER_OUT_OF_RESOURCES'),
  serverError(1436, 'HY000', 'ER_STACK_OVERRUN_NEED_MORE'),
];

/** Ordinary errors: the statement (or the stamped procedure, via its handler) rolled back. */
const ROLLED_BACK = [
  serverError(1062, '23000', 'ER_DUP_ENTRY'),
  serverError(1213, '40001', 'ER_LOCK_DEADLOCK'),
  serverError(1205, 'HY000', 'ER_LOCK_WAIT_TIMEOUT'),
  serverError(1644, '45000', 'ER_SIGNAL_EXCEPTION'),
];

describe('mysql failure mapping: errors no stored procedure handler can catch', () => {
  it.each(FATAL.map((e) => [(e as Error & { code: string }).code, e]))(
    '%s: a write may have committed (unknown), a read failed (no), the connection is dropped',
    (_, error) => {
      expect(outcome(error)).toEqual({ write: 'unknown', read: 'no', broken: true });
    },
  );

  it.each(ROLLED_BACK.map((e) => [(e as Error & { code: string }).code, e]))(
    '%s: still not applied, and the connection is kept',
    (_, error) => {
      expect(outcome(error)).toEqual({ write: 'no', read: 'no', broken: false });
    },
  );

  it('on the server: a procedure that fails with ER_OUT_OF_SORTMEMORY after its COMMIT skips its exit handler, and the row is committed', async () => {
    // The stamped procedures' exit handler (schema.ts, WRITE_EXIT_HANDLER) on a procedure
    // that sorts after its COMMIT; the session's sort buffer is too small for the sort.
    const ns = uniqueNamespace();
    const table = `${ns}_fatal_rows`;
    const procedure = `${ns}_fatal_after_commit`;
    const session: PoolConnection = await admin.getConnection();
    try {
      await session.query(`CREATE TABLE ${table} (k INT PRIMARY KEY)`);
      await session.query(`CREATE PROCEDURE ${procedure}()
BEGIN
  DECLARE v_committing BOOLEAN DEFAULT FALSE;
${WRITE_EXIT_HANDLER}
  START TRANSACTION;
  INSERT INTO ${table} (k) VALUES (1);
  SET v_committing = TRUE;
  COMMIT;
  SELECT n FROM (SELECT 1 AS n UNION ALL SELECT 2) s ORDER BY CONCAT(REPEAT('a', 2000), n);
END`);
      await session.query('SET SESSION sort_buffer_size = 0'); // the server's minimum
      const error = await session.query(`CALL ${procedure}()`).then(
        () => undefined,
        (e: unknown) => e,
      );
      // The handler did not run: not 1180 (which it would have made of any error here).
      expect(error).toMatchObject({ errno: 1038 });
      const [rows] = await session.query<RowDataPacket[]>(`SELECT k FROM ${table}`);
      expect(rows.map((r) => r.k)).toEqual([1]);
      const mapped = writeError('checkAndSetStamped', error);
      expect(mapped).toBeInstanceOf(StoreError);
      expect(mapped.applied).toBe('unknown');
    } finally {
      await session.query(`DROP PROCEDURE IF EXISTS ${procedure}`).catch(() => {});
      await session.query(`DROP TABLE IF EXISTS ${table}`).catch(() => {});
      session.destroy(); // its session settings were changed
    }
  });
});
