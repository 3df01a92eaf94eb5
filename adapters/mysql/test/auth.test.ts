// Twin of the PostgreSQL adapter's test of the same name: both check what each adapter does
// with its own driver (statements, failure mapping, timeouts, schema); the contract is the
// conformance suite's. Their setup and test shapes match on purpose (`duplicates` pairs them).
import { randomBytes } from 'node:crypto';
import { recordFailures, transactOnce } from '@percolator/conformance';
import { CounterOracle, Percolator, StoreError } from '@percolator/core';
import { assertMySqlReachable, createMySqlStore, type MySqlStore } from '@percolator/mysql';
import { ensureMySql, type TestServer } from '@percolator/testkit/mysql';
import { createPool, type Pool, type RowDataPacket } from 'mysql2/promise';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

/**
 * Authentication and authorization failures are StoreErrors that are not retryable, so
 * `db.transact` gives up at once instead of retrying a wrong password ten times.
 */

let server: TestServer | undefined;
let url: string;
let admin: Pool;
const user = `perc_auth_${randomBytes(4).toString('hex')}`;
const namespace = `t_${randomBytes(6).toString('hex')}`;

function asUser(name: string, password = ''): string {
  const parsed = new URL(url);
  parsed.username = name;
  parsed.password = password;
  return parsed.toString();
}

beforeAll(async () => {
  server = await ensureMySql();
  url = server.url;
  admin = createPool({ uri: url, connectionLimit: 2 });
});

afterAll(async () => {
  const owner = await createMySqlStore({ uri: url, namespace }).catch(() => undefined);
  await owner?.dropNamespace();
  await owner?.close();
  await admin?.query('DROP USER IF EXISTS ?@?', [user, '%']).catch(() => {});
  await admin?.end();
  await server?.stop();
});

function expectNotRetryable(error: unknown, errnos: number[]): void {
  expect(error).toBeInstanceOf(StoreError);
  const storeError = error as StoreError;
  expect(storeError.retryable).toBe(false);
  expect(storeError.applied).toBe('no');
  expect(storeError.code).toBe('STORE_UNAVAILABLE');
  expect(errnos).toContain((storeError.cause as { errno?: number }).errno);
}

describe('mysql: authentication and authorization failures are not retryable', () => {
  it('a user that does not exist: access denied (1045/1698), not retryable', async () => {
    const error = await createMySqlStore({
      uri: asUser(`no_such_user_${randomBytes(4).toString('hex')}`, 'wrong'),
      namespace,
    }).catch((e: unknown) => e);
    expectNotRetryable(error, [1045, 1698]);
    expect((error as Error).message).toMatch(/could not get a connection: Access denied for user/);
    const probe = await assertMySqlReachable(asUser('no_such_user_either')).catch((e: unknown) => e);
    expectNotRetryable(probe, [1045, 1698]);
  });

  it('a refused connection stays retryable', async () => {
    const error = await createMySqlStore({ uri: 'mysql://root@127.0.0.1:1/test', namespace }).catch(
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).retryable).toBe(true);
  });

  it('a user without access to the database (1044); db.transact gives up at once once it is dropped', async () => {
    const owner = await createMySqlStore({ uri: url, namespace });
    await owner.close();
    await admin.query('CREATE USER ?@? IDENTIFIED BY ?', [user, '%', 'secret']);
    const denied = await createMySqlStore({
      uri: asUser(user, 'secret'),
      namespace,
      createSchema: false,
    }).catch((e: unknown) => e);
    expectNotRetryable(denied, [1044]);

    await admin.query('GRANT SELECT, INSERT, UPDATE, DELETE, EXECUTE ON test.* TO ?@?', [user, '%']);
    const pool = createPool({ uri: asUser(user, 'secret'), connectionLimit: 2, multipleStatements: true });
    let store: MySqlStore | undefined;
    try {
      store = await createMySqlStore({ pool, namespace, createSchema: false });
      // Counts the store calls that fail.
      const { store: counted, failed } = recordFailures(store);
      // The oracle given explicitly (the same store counter as the default) keeps the start
      // timestamp out of stamped first reads, whose fallback would add a second call.
      const db = new Percolator({ store: counted, oracle: new CounterOracle(counted) });
      await db.transact(async (tx) => tx.set('t', 'r', 'c', 'before'));

      // The user is dropped and its sessions killed: every new connection is denied (1045, or 1698).
      await admin.query('DROP USER ?@?', [user, '%']);
      const [sessions] = await admin.query<RowDataPacket[]>(
        'SELECT ID AS id FROM information_schema.PROCESSLIST WHERE USER = ?',
        [user],
      );
      for (const { id } of sessions) await admin.query(`KILL CONNECTION ${Number(id)}`);
      const all = () =>
        (pool.pool as unknown as { _allConnections: { length: number } })._allConnections.length;
      for (let i = 0; i < 100 && all() > 0; i++) await new Promise((r) => setTimeout(r, 50));
      expect(all()).toBe(0);

      const { error, attempts } = await transactOnce(db);
      expectNotRetryable(error, [1045, 1698]);
      // Given up at once: one failed call, and the function ran at most once (not at all
      // if the start timestamp is what failed). A retryable error would be tried 10 times.
      expect(failed).toHaveLength(1);
      expect(attempts).toBeLessThanOrEqual(1);
      await db.close();
    } finally {
      await store?.close();
      await pool.end();
    }
  });
});
