/**
 * The set-up the MariaDB adapter's test files share: the server (started if it is down),
 * an admin pool, one store in a namespace of its own, and the stores and pools a test
 * opens, each dropped and closed after the file. Vitest gives every test file its own copy
 * of this module, so these bindings are that file's.
 */
import { randomBytes } from 'node:crypto';
import { createMySqlStore, type MySqlStore } from '@percolator/mysql';
import { ensureMySql, type TestServer } from '@percolator/testkit/mysql';
import { createPool, type Pool, type PoolConnection } from 'mysql2/promise';
import { afterAll, beforeAll } from 'vitest';

let server: TestServer | undefined;
let prefix = 't';
const opened: MySqlStore[] = [];
const pools: Pool[] = [];
export let url: string;
export let admin: Pool;
/** The file's store, in a namespace of its own (set in beforeAll). */
export let store: MySqlStore;

/** A namespace no other test uses: the file's prefix and 12 random hex digits. */
export const uniqueNamespace = () => `${prefix}_${randomBytes(6).toString('hex')}`;

/** A store on the test server, dropped and closed after the file. */
export async function openStore(options: Parameters<typeof createMySqlStore>[0] = {}): Promise<MySqlStore> {
  // A pool of the caller's brings its own connection settings: no URL beside it.
  const s = await createMySqlStore(options.pool ? options : { uri: url, ...options });
  opened.push(s);
  return s;
}

/** A pool of the test server's, as a user would make one, ended after the file. */
export function userPool(options: Parameters<typeof createPool>[0] & object = {}): Pool {
  const pool = createPool({ uri: url, connectionLimit: 4, ...options });
  pools.push(pool);
  return pool;
}

/**
 * A user pool of one connection whose queries are reported to `seen` (SQL text and bound
 * values) as they are sent: the store sends on the callback connection under the promise
 * wrapper (store.ts, send), so that is where they are caught.
 */
export function recordingPool(
  seen: (query: { sql: string; values: unknown[]; method: 'query' | 'execute' }) => void,
  /** Another server's (a private one's): the pool is then the caller's to end. */
  uri?: string,
): Pool {
  const pool = uri === undefined ? userPool({ connectionLimit: 1 }) : createPool({ uri, connectionLimit: 1 });
  const getConnection = pool.getConnection.bind(pool);
  pool.getConnection = async () => {
    const connection = await getConnection();
    type Send = (...args: unknown[]) => unknown;
    const core = (connection as unknown as { connection: { query: Send; execute: Send; seen?: true } })
      .connection;
    if (core.seen) return connection; // the pool hands out the same connection again
    core.seen = true;
    // Plain queries and prepared statements (the stamped procedures' CALLs) alike.
    for (const method of ['query', 'execute'] as const) {
      const original = core[method].bind(core);
      core[method] = (...args: unknown[]) => {
        const o = args[0] as { sql?: string; values?: unknown[] };
        seen({ sql: o.sql ?? String(args[0]), values: o.values ?? [], method });
        return original(...args);
      };
    }
    return connection;
  };
  return pool;
}

/**
 * A session of the admin pool inside a REPEATABLE READ transaction that has run `sql` (a
 * locking read): it holds those locks until the caller's ROLLBACK, then must be released.
 */
export async function lockingSession(sql: string, values: unknown[]): Promise<PoolConnection> {
  const session = await admin.getConnection();
  try {
    await session.query('SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ');
    await session.query('BEGIN');
    await session.query(sql, values);
    return session;
  } catch (error) {
    await session.query('ROLLBACK').catch(() => {});
    session.release();
    throw error;
  }
}

/** Registers the file's beforeAll / afterAll; namespaces start with `namespacePrefix`. */
export function useMySqlFixture(namespacePrefix: string): void {
  prefix = namespacePrefix;
  beforeAll(async () => {
    server = await ensureMySql();
    url = server.url;
    admin = createPool({ uri: url, connectionLimit: 4 });
    store = await openStore({ namespace: uniqueNamespace() });
  });
  afterAll(async () => {
    for (const s of opened) {
      await s.dropNamespace().catch(() => {});
      await s.close();
    }
    for (const pool of pools) await pool.end();
    await admin?.end();
    await server?.stop();
  });
}
