// Twin of the MySQL adapter's test of the same name: both check what each adapter does
// with its own driver (statements, failure mapping, timeouts, schema); the contract is the
// conformance suite's. Their setup and test shapes match on purpose (`duplicates` pairs them).
import { randomBytes } from 'node:crypto';
import { recordFailures, transactOnce } from '@percolator/conformance';
import { CounterOracle, Percolator, StoreError } from '@percolator/core';
import { assertPostgresReachable, createPostgresStore, type PostgresStore } from '@percolator/postgres';
import { ensurePostgres, type TestServer } from '@percolator/testkit/postgres';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

/**
 * Authentication and authorization failures are StoreErrors that are not retryable, so
 * `db.transact` gives up at once instead of retrying a wrong password ten times.
 * The local server trusts every password, so a role that does not exist (28000) or may
 * not log in stands in for a wrong password (28P01 where passwords are checked).
 */

let server: TestServer | undefined;
let url: string;
let admin: pg.Pool;
const role = `perc_auth_${randomBytes(4).toString('hex')}`;
const namespace = `t_${randomBytes(6).toString('hex')}`;

function asUser(user: string): string {
  const parsed = new URL(url);
  parsed.username = user;
  return parsed.toString();
}

beforeAll(async () => {
  server = await ensurePostgres();
  url = server.url;
  admin = new pg.Pool({ connectionString: url, max: 2 });
  admin.on('error', () => {});
});

afterAll(async () => {
  const owner = await createPostgresStore({ connectionString: url, namespace }).catch(() => undefined);
  await owner?.dropNamespace();
  await owner?.close();
  await admin?.query(`DROP ROLE IF EXISTS "${role}"`).catch(() => {});
  await admin?.end();
  await server?.stop();
});

function expectNotRetryable(error: unknown, sqlStates: string[]): void {
  expect(error).toBeInstanceOf(StoreError);
  const storeError = error as StoreError;
  expect(storeError.retryable).toBe(false);
  expect(storeError.applied).toBe('no');
  expect(storeError.code).toBe('STORE_UNAVAILABLE');
  expect(sqlStates).toContain((storeError.cause as { code?: string }).code);
}

describe('postgres: authentication and authorization failures are not retryable', () => {
  it('a role that does not exist: createPostgresStore fails with a non-retryable StoreError (28000)', async () => {
    const error = await createPostgresStore({
      connectionString: asUser(`no_such_role_${randomBytes(4).toString('hex')}`),
      namespace,
    }).catch((e: unknown) => e);
    expectNotRetryable(error, ['28000', '28P01']);
    expect((error as Error).message).toMatch(/could not get a connection: .*(does not exist|authentication)/);
  });

  it('assertPostgresReachable says the same', async () => {
    const error = await assertPostgresReachable(asUser('no_such_role_either')).catch((e: unknown) => e);
    expectNotRetryable(error, ['28000', '28P01']);
  });

  it('a refused connection stays retryable', async () => {
    const error = await createPostgresStore({
      connectionString: 'postgres://postgres@127.0.0.1:1/test',
      namespace,
    }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).retryable).toBe(true);
  });

  it('db.transact makes one attempt when the role may no longer log in', async () => {
    // The namespace, made by the owner; a role that may use it logs in and opens a store.
    const owner = await createPostgresStore({ connectionString: url, namespace });
    await owner.close();
    await admin.query(`CREATE ROLE "${role}" LOGIN`);
    // Without privileges on the tables: 42501, an authorization failure, not retryable either.
    const denied = await createPostgresStore({
      connectionString: asUser(role),
      namespace,
      createSchema: false,
    })
      .then(async (s) => {
        await s.close();
        return 'opened';
      })
      .catch((e: unknown) => e);
    expectNotRetryable(denied, ['42501']);
    await admin.query(
      `GRANT SELECT, INSERT, UPDATE, DELETE ON "${namespace}_rows", "${namespace}_counters" TO "${role}"`,
    );
    await admin.query(`GRANT USAGE, SELECT, UPDATE ON SEQUENCE "${namespace}_version_seq" TO "${role}"`);
    const pool = new pg.Pool({ connectionString: asUser(role), max: 2 });
    pool.on('error', () => {});
    let store: PostgresStore | undefined;
    try {
      store = await createPostgresStore({ pool, namespace, createSchema: false });
      // Counts the store calls that fail.
      const { store: counted, failed } = recordFailures(store);
      // The oracle given explicitly (the same store counter as the default) keeps the start
      // timestamp out of stamped first reads, whose fallback would add a second call.
      const db = new Percolator({ store: counted, oracle: new CounterOracle(counted) });
      await db.transact(async (tx) => tx.set('t', 'r', 'c', 'before'));

      // Its login is revoked and its sessions ended: every new connection fails with 28000.
      await admin.query(`ALTER ROLE "${role}" NOLOGIN`);
      await admin.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1', [role]);
      for (let i = 0; i < 100 && pool.totalCount > 0; i++) await new Promise((r) => setTimeout(r, 50));
      expect(pool.totalCount).toBe(0);

      const { error, attempts } = await transactOnce(db);
      expectNotRetryable(error, ['28000']);
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
