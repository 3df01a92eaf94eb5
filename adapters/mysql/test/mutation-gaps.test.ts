/**
 * Cases found by mutation testing of the MariaDB adapter's failure mapping (errors.ts and the
 * connection handling in store.ts): each fails with a small, plausible bug there that the
 * rest of the suite let through. A write's StoreError says 'no' only when the call
 * certainly did not apply; authentication, authorization and a missing table or routine
 * are not retryable.
 */
import { randomBytes } from 'node:crypto';
import { errorOf } from '@percolator/conformance';
import { StoreError } from '@percolator/core';
import { createMySqlStore, type MySqlStore, mysqlNames } from '@percolator/mysql';
import { createConnection, type PoolConnection, type RowDataPacket } from 'mysql2/promise';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { isConnectionBroken, readError, writeError } from '../src/errors.js';
import { WRITE_EXIT_HANDLER } from '../src/schema.js';
import {
  admin,
  lockingSession,
  openStore,
  uniqueNamespace,
  url,
  useMySqlFixture,
  userPool,
} from './fixture.js';

useMySqlFixture('mg');

const bytes = (text: string) => new TextEncoder().encode(text);
const text = (data: Uint8Array | undefined) => new TextDecoder().decode(data);

/** A stamped state: a format byte, the 8-byte slot, then `tail`. */
const template = (tail: string) => Uint8Array.from([9, 0, 0, 0, 0, 0, 0, 0, 0, ...bytes(tail)]);

/** A server error as mysql2 makes one from an error packet (not `fatal`: the server answered). */
function serverError(errno: number, sqlState: string, code: string): Error {
  return Object.assign(new Error(`${code}: from the server`), { errno, sqlState, code });
}

function version(result: { ok: boolean; version?: string }): string {
  if (!result.ok || result.version === undefined) throw new Error('the CAS did not apply');
  return result.version;
}

/** The thread ids of InnoDB transactions waiting for a lock. */
async function lockWaiters(): Promise<number[]> {
  const [rows] = await admin.query<RowDataPacket[]>(
    "SELECT trx_mysql_thread_id AS thread FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'",
  );
  return rows.map((r) => Number(r.thread));
}

/** A session holding the row lock of `table`/`key` of `namespace` (ROLLBACK and release it after). */
function lockRow(namespace: string, table: string, key: string): Promise<PoolConnection> {
  return lockingSession(`SELECT 1 FROM \`${namespace}_rows\` WHERE tbl = ? AND row_key = ? FOR UPDATE`, [
    Buffer.from(table),
    Buffer.from(key),
  ]);
}

async function unlock(session: PoolConnection): Promise<void> {
  await session.query('ROLLBACK').catch(() => {});
  session.release();
}

describe('mysql failure mapping: every errno that may follow a commit is unknown for a write', () => {
  // Each may arrive after the statement (or a stamped CALL's COMMIT) took effect.
  const AMBIGUOUS = [
    serverError(1053, '08S01', 'ER_SERVER_SHUTDOWN'),
    serverError(1152, '08S01', 'ER_ABORTING_CONNECTION'),
    serverError(1180, 'HY000', 'ER_ERROR_DURING_COMMIT'),
    serverError(1317, '70100', 'ER_QUERY_INTERRUPTED'),
    serverError(1927, '70100', 'ER_CONNECTION_KILLED'),
    serverError(1969, '70100', 'ER_STATEMENT_TIMEOUT'),
    serverError(4031, 'HY000', 'ER_CLIENT_INTERACTION_TIMEOUT'),
  ];

  it.each(AMBIGUOUS.map((e) => [(e as Error & { code: string }).code, e]))(
    '%s: a write is unknown (not retried blindly), a read is no, and the connection is dropped',
    (_, error) => {
      expect(writeError('a write', error).applied).toBe('unknown');
      expect(readError('a read', error).applied).toBe('no');
      expect(isConnectionBroken(error)).toBe(true);
    },
  );

  // Running the transaction again cannot fix them.
  const AUTH = [
    serverError(1044, '42000', 'ER_DBACCESS_DENIED_ERROR'),
    serverError(1045, '28000', 'ER_ACCESS_DENIED_ERROR'),
    serverError(1142, '42000', 'ER_TABLEACCESS_DENIED_ERROR'),
    serverError(1143, '42000', 'ER_COLUMNACCESS_DENIED_ERROR'),
    serverError(1227, '42000', 'ER_SPECIFIC_ACCESS_DENIED_ERROR'),
    serverError(1370, '42000', 'ER_PROCACCESS_DENIED_ERROR'),
    serverError(1698, '28000', 'ER_ACCESS_DENIED_NO_PASSWORD_ERROR'),
    serverError(1862, 'HY000', 'ER_MUST_CHANGE_PASSWORD_LOGIN'),
  ];

  it.each(AUTH.map((e) => [(e as Error & { code: string }).code, e]))(
    '%s: not applied and not retryable, for a read and a write',
    (_, error) => {
      for (const mapped of [writeError('a write', error), readError('a read', error)]) {
        expect(mapped).toMatchObject({ applied: 'no', retryable: false });
      }
    },
  );

  it("a stamped CALL killed (KILL QUERY) after its COMMIT: the server answers 1180, the row is committed, and the write is 'unknown'", async () => {
    // The stamped procedures' exit handler (schema.ts, WRITE_EXIT_HANDLER) on a procedure
    // that commits its row and then waits for a lock another session holds.
    const ns = uniqueNamespace();
    const table = `${ns}_killed_rows`;
    const lock = `${ns}_killed_lock`;
    const procedure = `${ns}_killed_after_commit`;
    await admin.query(`CREATE TABLE ${table} (k INT PRIMARY KEY)`);
    await admin.query(`CREATE TABLE ${lock} (k INT PRIMARY KEY)`);
    await admin.query(`INSERT INTO ${lock} VALUES (1)`);
    await admin.query(`CREATE PROCEDURE ${procedure}()
BEGIN
  DECLARE v_committing BOOLEAN DEFAULT FALSE;
  DECLARE v INT;
${WRITE_EXIT_HANDLER}
  START TRANSACTION;
  INSERT INTO ${table} (k) VALUES (1);
  SET v_committing = TRUE;
  COMMIT;
  SELECT k INTO v FROM ${lock} WHERE k = 1 FOR UPDATE;
END`);
    const blocker = await lockingSession(`SELECT k FROM ${lock} WHERE k = 1 FOR UPDATE`, []);
    const session = await admin.getConnection();
    try {
      const thread = (session as unknown as { connection: { threadId: number } }).connection.threadId;
      const call = errorOf(session.query(`CALL ${procedure}()`));
      await vi.waitFor(async () => expect(await lockWaiters()).toContain(thread), {
        timeout: 10_000,
        interval: 250,
      });
      await admin.query('KILL QUERY ?', [thread]);
      const error = await call;
      expect(error).toMatchObject({ errno: 1180 });
      const [rows] = await admin.query<RowDataPacket[]>(`SELECT k FROM ${table}`);
      expect(rows.map((r) => r.k)).toEqual([1]);
      const mapped = writeError('checkAndSetStamped', error);
      expect(mapped).toBeInstanceOf(StoreError);
      expect(mapped.applied).toBe('unknown');
    } finally {
      await unlock(blocker);
      session.release();
      await admin.query(`DROP PROCEDURE IF EXISTS ${procedure}`).catch(() => {});
      await admin.query(`DROP TABLE IF EXISTS ${table}, ${lock}`).catch(() => {});
    }
  });

  it("mysql2's refusal to send on a closed connection is 'no' (nothing was sent), retryable", async () => {
    const connection = await createConnection(url);
    await connection.end();
    const error = await errorOf(connection.query('SELECT 1'));
    expect((error as Error).message).toMatch(/closed state/);
    expect(writeError('a write', error)).toMatchObject({ applied: 'no', retryable: true });
  });
});

describe('mysql store: failures the mapping alone does not show', () => {
  it("a multi-statement checkAndSetMany whose second statement fails after the first applied is 'unknown'", async () => {
    // A user pool with multi-statement batches, whose sessions wait 1 s for a row lock.
    const pool = userPool({ connectionLimit: 2, multipleStatements: true });
    pool.on('connection', (connection) => {
      connection.query('SET SESSION innodb_lock_wait_timeout = 1');
    });
    const namespace = uniqueNamespace();
    const s = await openStore({ pool, namespace });
    const a = version(await s.checkAndSet({ table: 'batch', key: 'a', expected: null, state: bytes('a0') }));
    const b = version(await s.checkAndSet({ table: 'batch', key: 'b', expected: null, state: bytes('b0') }));
    const blocker = await lockRow(namespace, 'batch', 'b');
    try {
      // One round trip: the UPDATE of a commits, the UPDATE of b waits 1 s and fails (1205).
      const error = await errorOf(
        s.checkAndSetMany([
          { table: 'batch', key: 'a', expected: a, state: bytes('a1') },
          { table: 'batch', key: 'b', expected: b, state: bytes('b1') },
        ]),
      );
      expect(error).toBeInstanceOf(StoreError);
      expect((error as StoreError).applied).toBe('unknown');
      expect(((error as StoreError).cause as { errno?: number }).errno).toBe(1205);
    } finally {
      await unlock(blocker);
    }
    expect(text((await s.read('batch', 'a'))?.state)).toBe('a1');
    expect(text((await s.read('batch', 'b'))?.state)).toBe('b0');
  });

  it('a statement that timed out is not left on a pooled connection: the next call gets a fresh one at once', async () => {
    // One connection: a timed-out statement still runs on the server, so the connection
    // it was sent on must be destroyed, not handed to the next call to wait behind it.
    const namespace = uniqueNamespace();
    const s = await openStore({ namespace, maxConnections: 1, queryTimeoutMs: 700 });
    const v = version(await s.checkAndSet({ table: 'slow', key: 'k', expected: null, state: bytes('0') }));
    await s.checkAndSet({ table: 'slow', key: 'other', expected: null, state: bytes('x') });
    const blocker = await lockRow(namespace, 'slow', 'k');
    try {
      const error = await errorOf(s.checkAndSet({ table: 'slow', key: 'k', expected: v, state: bytes('1') }));
      expect(error).toBeInstanceOf(StoreError);
      expect((error as StoreError).applied).toBe('unknown');
      // The row lock is still held, and the timed-out UPDATE still waits for it (for
      // innodb_lock_wait_timeout, 50 s): the read is answered on another connection, while it
      // waits. Sent behind it on the same connection, it would be answered only after it.
      expect(text((await s.read('slow', 'other'))?.state)).toBe('x');
      expect(await lockWaiters()).not.toEqual([]);
    } finally {
      await unlock(blocker);
    }
  });

  it('a stamped CAS whose procedure was dropped under a running store: no, and not retryable', async () => {
    const namespace = uniqueNamespace();
    const s = await openStore({ namespace });
    expect(s.capabilities.stampedCheckAndSet).toBe(true);
    await admin.query(`DROP PROCEDURE \`${mysqlNames(namespace).stampedCasRoutine}\``);
    const error = await errorOf(
      s.checkAndSetStamped!({ table: 't', key: 'k', expected: null, state: template('x') }, 'c'),
    );
    expect(error).toBeInstanceOf(StoreError);
    expect(((error as StoreError).cause as { errno?: number }).errno).toBe(1305);
    expect(error).toMatchObject({ applied: 'no', retryable: false });
  });
});

describe('mysql store: a user whose rights are cut after the store opened', () => {
  const user = `perc_mg_${randomBytes(4).toString('hex')}`;
  afterAll(async () => {
    await admin?.query('DROP USER IF EXISTS ?@?', [user, '%']).catch(() => {});
  });

  it('loses INSERT (1142) and EXECUTE (1370): each call fails at once, not retryable', async () => {
    const namespace = uniqueNamespace();
    await openStore({ namespace }); // the schema, made by the owner
    await admin.query('CREATE USER ?@? IDENTIFIED BY ?', [user, '%', 'secret']);
    await admin.query('GRANT SELECT, INSERT, UPDATE, DELETE, EXECUTE ON test.* TO ?@?', [user, '%']);
    const uri = new URL(url);
    uri.username = user;
    uri.password = 'secret';
    const pool = userPool({ uri: uri.toString(), connectionLimit: 2, multipleStatements: true });
    let s: MySqlStore | undefined;
    try {
      s = await createMySqlStore({ pool, namespace, createSchema: false });
      expect(s.capabilities.stampedCheckAndSet).toBe(true);
      await s.checkAndSet({ table: 't', key: 'before', expected: null, state: bytes('x') });

      // Database privileges are read when a session starts: cut them, end the user's sessions.
      await admin.query('REVOKE INSERT, UPDATE, DELETE, EXECUTE ON test.* FROM ?@?', [user, '%']);
      const [sessions] = await admin.query<RowDataPacket[]>(
        'SELECT ID AS id FROM information_schema.PROCESSLIST WHERE USER = ?',
        [user],
      );
      for (const { id } of sessions) await admin.query(`KILL CONNECTION ${Number(id)}`);
      const all = () =>
        (pool.pool as unknown as { _allConnections: { length: number } })._allConnections.length;
      await vi.waitFor(() => expect(all()).toBe(0), { timeout: 5000, interval: 50 });

      const insert = await errorOf(
        s.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('y') }),
      );
      expect(insert).toBeInstanceOf(StoreError);
      expect(((insert as StoreError).cause as { errno?: number }).errno).toBe(1142);
      expect(insert).toMatchObject({ applied: 'no', retryable: false });

      const call = await errorOf(
        s.checkAndSetStamped!({ table: 't', key: 'k', expected: null, state: template('y') }, 'c'),
      );
      expect(call).toBeInstanceOf(StoreError);
      expect(((call as StoreError).cause as { errno?: number }).errno).toBe(1370);
      expect(call).toMatchObject({ applied: 'no', retryable: false });
      expect(await s.read('t', 'k')).toBeNull();
    } finally {
      await s?.close();
    }
  });
});
