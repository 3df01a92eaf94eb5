/**
 * Session settings the store cannot work with (src/session.ts says what each breaks) are
 * refused on every connection the store gets, with a StoreError that names the setting and
 * what it needs, before anything is written. Each pool sets its sessions the way a caller
 * would (SET SESSION in its 'connection' handler, or on a connection made before the store
 * existed); nothing here changes the server's global settings.
 */
import { errorOf } from '@percolator/conformance';
import { StoreError } from '@percolator/core';
import type { PoolConnection, RowDataPacket } from 'mysql2/promise';
import { describe, expect, it } from 'vitest';
import { admin, openStore, store, uniqueNamespace, useMySqlFixture, userPool } from './fixture.js';

useMySqlFixture('ses');

const bytes = (text: string) => new TextEncoder().encode(text);

/** A pool of the caller's whose every new connection first runs `statement`. */
function poolWith(statement: string, connectionLimit = 2) {
  const pool = userPool({ connectionLimit, multipleStatements: true });
  pool.on('connection', (connection) => {
    connection.query(statement);
  });
  return pool;
}

/** How many tables of `namespace` exist: a refused store must not have made its schema. */
async function tablesOf(namespace: string): Promise<number> {
  const [rows] = await admin.query<RowDataPacket[]>(
    'SELECT COUNT(*) AS n FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE ?',
    [`${namespace}\\_%`],
  );
  return Number(rows[0]!.n);
}

function expectRefused(error: unknown, setting: RegExp, fix: RegExp): void {
  expect(error).toBeInstanceOf(StoreError);
  const storeError = error as StoreError;
  expect(storeError.applied).toBe('no');
  expect(storeError.retryable).toBe(false);
  expect(storeError.message).toMatch(setting);
  expect(storeError.message).toMatch(fix);
}

describe('mysql: session settings that break the store are refused at startup', () => {
  it.each([
    ["SET SESSION completion_type = 'CHAIN'", /completion_type is CHAIN/, /completion_type = 'NO_CHAIN'/],
    ["SET SESSION completion_type = 'RELEASE'", /completion_type is RELEASE/, /completion_type = 'NO_CHAIN'/],
    [
      "SET SESSION sql_mode = CONCAT(@@sql_mode, ',NO_BACKSLASH_ESCAPES')",
      /sql_mode has NO_BACKSLASH_ESCAPES/,
      /sql_mode without it/,
    ],
    ['SET SESSION autocommit = 0', /autocommit is OFF/, /autocommit = 1/],
    [
      'SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED',
      /isolation level is READ-UNCOMMITTED/,
      /REPEATABLE READ/,
    ],
    ['SET SESSION sql_select_limit = 1000', /sql_select_limit is 1000/, /sql_select_limit = DEFAULT/],
  ])('%s: refused, naming the setting and the fix; nothing written', async (statement, setting, fix) => {
    const namespace = uniqueNamespace();
    const error = await errorOf(openStore({ pool: poolWith(statement), namespace }));
    expectRefused(error, setting, fix);
    expect(await tablesOf(namespace)).toBe(0);
  });

  it('several wrong settings are named together', async () => {
    const pool = poolWith("SET SESSION autocommit = 0, completion_type = 'CHAIN'");
    const error = await errorOf(openStore({ pool, namespace: uniqueNamespace() }));
    expectRefused(error, /autocommit is OFF.*completion_type is CHAIN/, /NO_CHAIN/);
  });

  it('a connection the pool made before the store existed is checked too', async () => {
    const pool = userPool({ connectionLimit: 1 });
    const early = await pool.getConnection();
    await early.query("SET SESSION completion_type = 'CHAIN'");
    early.release();
    const namespace = uniqueNamespace();
    const error = await errorOf(openStore({ pool, namespace }));
    expectRefused(error, /completion_type is CHAIN/, /NO_CHAIN/);
    expect(await tablesOf(namespace)).toBe(0);
  });
});

describe('mysql: every connection is checked, not only the first', () => {
  it('a later connection with a wrong session fails the call (StoreError no, not retryable), writing nothing', async () => {
    const pool = userPool({ connectionLimit: 2 });
    let made = 0;
    pool.on('connection', (connection) => {
      made += 1;
      // The store's first connection is sound; the pool's second one is not.
      if (made > 1) connection.query('SET SESSION autocommit = 0');
    });
    const s = await openStore({ pool, namespace: store.namespace, createSchema: false });
    // The caller holds the sound connection, so the store's next call gets the second one.
    const held: PoolConnection = await pool.getConnection();
    try {
      const error = await errorOf(
        s.checkAndSet({ table: 'late', key: 'k', expected: null, state: bytes('v') }),
      );
      expectRefused(error, /autocommit is OFF/, /autocommit = 1/);
      const stamped = await errorOf(
        s.checkAndSetStamped({ table: 'late', key: 's', expected: null, state: new Uint8Array(32) }, 'ses.c'),
      );
      expectRefused(stamped, /autocommit is OFF/, /autocommit = 1/);
    } finally {
      held.release();
    }
    expect(made).toBe(2);
    expect(await store.read('late', 'k')).toBeNull();
    expect(await store.read('late', 's')).toBeNull();
  });
});

describe('mysql: sessions the store can work with', () => {
  it('an ordinary pool, and one with SERIALIZABLE and a non-strict sql_mode, open and write', async () => {
    for (const [pool, isolation, mode] of [
      [userPool(), 'REPEATABLE-READ', /STRICT_TRANS_TABLES/],
      [
        poolWith("SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE; SET SESSION sql_mode = ''"),
        'SERIALIZABLE',
        /^$/,
      ],
    ] as const) {
      const s = await openStore({ pool, namespace: store.namespace, createSchema: false });
      const [session] = await pool.query<RowDataPacket[]>('SELECT @@tx_isolation AS i, @@sql_mode AS m');
      expect(session[0]!.i).toBe(isolation);
      expect(session[0]!.m).toMatch(mode);
      const key = `ok${Math.random().toString(16).slice(2)}`;
      const written = await s.checkAndSet({ table: 'ok', key, expected: null, state: bytes('v') });
      expect(written.ok).toBe(true);
      const stamped = await s.checkAndSetStamped(
        { table: 'ok', key: `${key}.s`, expected: null, state: new Uint8Array(32) },
        'ses.ok',
      );
      expect(stamped.ok).toBe(true);
      const read = await s.readStamped([{ table: 'ok', key }], 'ses.ok');
      expect(read.rows[0]?.state).toEqual(bytes('v'));
      expect(await store.read('ok', key)).toEqual(read.rows[0]);
    }
  });
});
