/**
 * The stamped procedures' CALLs go as prepared statements (store.ts, callProcedure). On a
 * pool the caller passes in, the connections outlive the store, and each statement left
 * prepared on them counts against the server's max_prepared_stmt_count, which every client
 * of the server shares: close() and dropNamespace() must close what the store prepared, on
 * every connection, idle or busy.
 *
 * Counted with the server's global Prepared_stmt_count, on a server of this file's own
 * (other test files prepare statements on the shared one).
 */
import { appliedStamp as applied } from '@percolator/conformance';
import { createMySqlStore, type MySqlStore } from '@percolator/mysql';
import { type PrivateServer, startPrivateMariaDb } from '@percolator/testkit/private';
import { createPool, type Pool, type RowDataPacket } from 'mysql2/promise';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';

let server: PrivateServer;
/** The test's own connection: it never prepares anything. */
let own: Pool;
const pools: Pool[] = [];
let counter = 0;
const namespace = () => `p_${process.pid}_${++counter}`;

beforeAll(async () => {
  server = await startPrivateMariaDb();
  own = createPool({ uri: server.url, connectionLimit: 1 });
});

/**
 * Each test starts from a server with nothing prepared: the previous test's pool is ended
 * (which frees whatever it left), and the server has finished closing its sessions.
 */
beforeEach(async () => {
  for (const pool of pools.splice(0)) await pool.end().catch(() => {});
  for (let waited = 0; (await preparedOnServer()) !== 0; waited += 50) {
    if (waited > 5000) throw new Error('statements are still prepared on the private server');
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
});

afterAll(async () => {
  for (const pool of pools) await pool.end().catch(() => {});
  await own?.end();
  await server?.destroy();
});

/** A pool of the caller's, as a user would make one; ended before the next test. */
function userPool(connections: number): Pool {
  const pool = createPool({ uri: server.url, connectionLimit: connections });
  pools.push(pool);
  return pool;
}

/** Statements prepared on the server now, by every connection. */
async function preparedOnServer(): Promise<number> {
  const [rows] = await own.query<RowDataPacket[]>("SHOW GLOBAL STATUS LIKE 'Prepared_stmt_count'");
  return Number(rows[0]!.Value);
}

/**
 * One round trip on each of the pool's `connections` connections (all held at once, so
 * each is a different one): a close of a statement queued on one is sent before it.
 */
async function settle(pool: Pool, connections: number): Promise<void> {
  const held = await Promise.all(Array.from({ length: connections }, () => pool.getConnection()));
  await Promise.all(held.map((connection) => connection.query('DO 1')));
  for (const connection of held) connection.release();
}

const bytes = (text: string) => new TextEncoder().encode(text);
/** A stamped state: a format byte, the 8-byte slot (placeholder), then `tail`. */
const template = (tail: string) => Uint8Array.from([9, 0, 0, 0, 0, 0, 0, 0, 0, ...bytes(tail)]);

/** Stamped CALLs at once, enough to run on every connection of a small pool. */
async function stampedWork(store: MySqlStore, calls: number): Promise<void> {
  await Promise.all(
    Array.from({ length: calls }, async (_, i) => {
      applied(
        await store.checkAndSetStamped(
          { table: 't', key: `k${i}`, expected: null, state: template('x') },
          'c',
        ),
      );
      await store.readStamped!([{ table: 't', key: `k${i}` }], 'c');
    }),
  );
}

describe('mysql prepared CALLs on a pool passed in', () => {
  it('five stores in turn on one pool of 4, each dropped and closed, leave no statement prepared', async () => {
    const pool = userPool(4);
    for (let round = 0; round < 5; round++) {
      const store = await createMySqlStore({ pool, namespace: namespace() });
      await stampedWork(store, 16);
      // The stamped CAS and the stamped read, on each connection that ran them.
      expect(await preparedOnServer()).toBeGreaterThan(0);
      await store.dropNamespace();
      await settle(pool, 4);
      expect(await preparedOnServer()).toBe(0);
      await store.close();
      await settle(pool, 4);
      expect(await preparedOnServer()).toBe(0);
    }
  });

  it('close() reaches a connection someone else holds and is using, without waiting for it', async () => {
    const pool = userPool(1);
    const store = await createMySqlStore({ pool, namespace: namespace() });
    await stampedWork(store, 1);
    expect(await preparedOnServer()).toBe(2);
    const connection = await pool.getConnection();
    const sleeping = connection.query('SELECT SLEEP(1)');
    const started = Date.now();
    await store.close();
    expect(Date.now() - started).toBeLessThan(500);
    await sleeping;
    await connection.query('DO 1');
    expect(await preparedOnServer()).toBe(0);
    connection.release();
  });

  it('a CALL whose PREPARE was still out when close() ran closes its statement when it ends', async () => {
    const pool = userPool(1);
    const store = await createMySqlStore({ pool, namespace: namespace() });
    // Hold the CALL's first command (PREPARE, then EXECUTE) on the one connection until
    // close() has run, as if the PREPARE's reply were slow.
    const held = await pool.getConnection();
    type Execute = (...args: unknown[]) => unknown;
    const core = (held as unknown as { connection: { execute: Execute } }).connection;
    held.release();
    const execute = core.execute.bind(core);
    let sent!: () => void;
    const reached = new Promise<void>((resolve) => {
      sent = resolve;
    });
    let open!: () => void;
    const gate = new Promise<void>((resolve) => {
      open = resolve;
    });
    core.execute = (...args: unknown[]) => {
      sent();
      void gate.then(() => execute(...args));
      return undefined;
    };
    const call = store.checkAndSetStamped(
      { table: 't', key: 'k', expected: null, state: template('x') },
      'c',
    );
    await reached;
    await store.close();
    open();
    applied(await call);
    await settle(pool, 1);
    expect(await preparedOnServer()).toBe(0);
  });

  it('a CALL still waiting for a connection when close() ran closes its statement when it ends', async () => {
    // Found in review: the CALL read close()'s count after its wait for a connection, so a
    // close() during that wait went unseen and the statement stayed prepared.
    const pool = userPool(1);
    const store = await createMySqlStore({ pool, namespace: namespace() });
    const held = await pool.getConnection(); // the application holds the only connection
    const call = store.checkAndSetStamped(
      { table: 't', key: 'k', expected: null, state: template('x') },
      'c',
    );
    await new Promise((resolve) => setTimeout(resolve, 50)); // the CALL waits for the pool
    await store.close();
    held.release();
    await call.catch(() => undefined);
    await settle(pool, 1);
    expect(await preparedOnServer()).toBe(0);
  });

  it('two stores of one namespace share a statement: when one closes, the other prepares it again', async () => {
    const pool = userPool(1);
    const ns = namespace();
    const first = await createMySqlStore({ pool, namespace: ns });
    const second = await createMySqlStore({ pool, namespace: ns, createSchema: false });
    applied(
      await first.checkAndSetStamped({ table: 't', key: 'a', expected: null, state: template('a') }, 'c'),
    );
    applied(
      await second.checkAndSetStamped({ table: 't', key: 'b', expected: null, state: template('b') }, 'c'),
    );
    // mysql2 keeps one statement per text on a connection: both stores use it.
    expect(await preparedOnServer()).toBe(1);
    await first.close();
    await settle(pool, 1);
    expect(await preparedOnServer()).toBe(0);
    applied(
      await second.checkAndSetStamped({ table: 't', key: 'c', expected: null, state: template('c') }, 'c'),
    );
    expect(await preparedOnServer()).toBe(1);
    await second.dropNamespace();
    await second.close();
    await settle(pool, 1);
    expect(await preparedOnServer()).toBe(0);
  });
});
