// Twin of the MySQL adapter's test of the same name: both check what each adapter does
// with its own driver (statements, failure mapping, timeouts, schema); the contract is the
// conformance suite's. Their test shapes match on purpose (`duplicates` pairs them); their
// setup is ./fixture.ts.
import net from 'node:net';
import { appliedStamp as applied, errorOf, stampOf } from '@percolator/conformance';
import { StoreError, writeStamp } from '@percolator/core';
import {
  createPostgresStore,
  type PgPoolClient,
  type PostgresStore,
  postgresNames,
} from '@percolator/postgres';
import pg from 'pg';
import { describe, expect, it, vi } from 'vitest';
import { postgresStatements } from '../src/statements.js';
import { admin, openStore, store, uniqueNamespace, url, usePostgresFixture } from './fixture.js';

/*
 * checkAndSetStamped (capability stampedCheckAndSet) against a real server: the stamp, the
 * CAS rules, failure mapping, no text spliced into SQL, and the property the core relies on:
 * whoever draws a later counter value and then reads the row sees the stamped write.
 */

const bytes = (text: string) => new TextEncoder().encode(text);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A format byte, the 8-byte stamp slot (zeros), then `tail`. */
const template = (tail: Uint8Array | string) =>
  Uint8Array.from([2, 0, 0, 0, 0, 0, 0, 0, 0, ...(typeof tail === 'string' ? bytes(tail) : tail)]);

/** Resolves to 'pending' if `promise` has not settled within `ms`. */
async function settledWithin<T>(promise: Promise<T>, ms: number): Promise<T | 'pending'> {
  return Promise.race([promise, sleep(ms).then(() => 'pending' as const)]);
}

/** How many backends of `s`'s own pool wait for a lock now. */
async function lockWaiters(s: PostgresStore): Promise<number> {
  const r = await admin.query(
    `SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`,
    [`percolator:${s.namespace}`],
  );
  return r.rows[0].n;
}

/** Waits until a backend of `s`'s own pool waits for a lock. */
async function untilLockWait(s: PostgresStore): Promise<void> {
  await vi.waitFor(async () => expect(await lockWaiters(s)).toBeGreaterThan(0), {
    timeout: 10_000,
    interval: 20,
  });
}

/** Another session that holds row (table, key) of `s` FOR UPDATE until it ends. */
async function holdRow(s: PostgresStore, table: string, key: string): Promise<PgPoolClient> {
  const blocker = await admin.connect();
  await blocker.query('BEGIN');
  await blocker.query(`SELECT 1 FROM "${s.namespace}_rows" WHERE tbl = $1 AND key = $2 FOR UPDATE`, [
    Buffer.from(table),
    Buffer.from(key),
  ]);
  return blocker;
}

usePostgresFixture('s');

// The step itself (stamp bytes, counter, failures, notified flag, 2^53) is the conformance
// suite's (store: checkAndSetStamped draws a timestamp ...), run on every stamped store.

describe('postgres checkAndSetStamped: SQL text', () => {
  it('sends one fixed statement per kind: no table, key, counter or state text is spliced in', async () => {
    const texts: string[] = [];
    const values: unknown[][] = [];
    const pool = new pg.Pool({ connectionString: url, max: 1 });
    pool.on('error', () => {});
    // Record what the store sends: every query goes through a client from pool.connect().
    const connect = pool.connect.bind(pool) as () => Promise<PgPoolClient>;
    const wrapped = new WeakSet<PgPoolClient>();
    (pool as unknown as { connect: () => Promise<PgPoolClient> }).connect = async () => {
      const client = await connect();
      if (wrapped.has(client)) return client;
      wrapped.add(client);
      const query = client.query.bind(client) as (config: unknown) => Promise<unknown>;
      (client as unknown as { query: (config: unknown) => Promise<unknown> }).query = (config: unknown) => {
        const c = config as { text?: string; values?: unknown[] };
        texts.push(c.text ?? String(config));
        values.push(c.values ?? []);
        return query(config);
      };
      return client;
    };
    const s = await openStore({ pool, namespace: store.namespace, createSchema: false });
    try {
      const hostile = [
        { table: 'x.y-z_1', key: `'); DROP TABLE "${s.namespace}_rows"; --`, counter: `c'); SELECT 1; --` },
        { table: 'Zq9.Tbl-X', key: '$1 $2 \u0000 "q" \\ 😀', counter: '$$ \u0000 😀' },
      ];
      const sent: string[] = [];
      for (const { table, key, counter } of hostile) {
        texts.length = 0;
        values.length = 0;
        const a = applied(
          await s.checkAndSetStamped({ table, key, expected: null, state: template(`'; --${key}`) }, counter),
        );
        await s.checkAndSetStamped({ table, key, expected: a.version, state: template(key) }, counter);
        expect(texts).toHaveLength(2);
        for (const t of texts) {
          for (const fragment of [table, key, counter, "'); DROP", '😀', '\u0000']) {
            expect(t).not.toContain(fragment);
          }
        }
        // Everything from the request travels as a bound parameter (a create's as the
        // multi-row function's arrays of one).
        for (const sentValues of values) {
          const flat = sentValues.flat();
          expect(flat).toContainEqual(Buffer.from(table));
          expect(flat).toContainEqual(Buffer.from(key));
          expect(flat).toContainEqual(Buffer.from(counter));
        }
        sent.push(...texts);
        const row = await s.read(table, key);
        expect(row?.state).toEqual(writeStamp(template(key), stampOf(row!.state)));
      }
      // The text does not depend on the request at all.
      expect(sent[0]).toBe(sent[2]);
      expect(sent[1]).toBe(sent[3]);
      // The namespace appears only in the adapter's fixed, quoted identifiers, and the one
      // string literal is the setting's name.
      const names = postgresNames(s.namespace);
      for (const t of sent) {
        const stripped = t
          .replaceAll(names.rows, '')
          .replaceAll(names.counters, '')
          .replaceAll(names.casStampedMany, '')
          .replaceAll(`'${names.versionSeq}'`, '')
          .replaceAll("'lock_timeout'", '');
        expect(stripped).not.toContain(s.namespace);
        expect(stripped).not.toContain("'");
      }
    } finally {
      await s.close();
      await pool.end();
    }
  });
});

describe('postgres checkAndSetStamped: a schema without the multi-row function', () => {
  // Such a schema (made by hand from an older postgresSchemaSql()) creates with the
  // statement stampedCreate, which the conformance suite never reaches: the step's bytes,
  // counter and notified flag are checked here.
  it('a stamped create writes the drawn value at STAMP_OFFSET and keeps the notified flag, as with the function', async () => {
    const namespace = uniqueNamespace();
    await openStore({ namespace });
    await admin.query(`DROP FUNCTION ${postgresNames(namespace).casStampedManySignature}`);
    const s = await openStore({ namespace, createSchema: false });
    expect(s.capabilities.stampedCheckAndSetMany).toBe(false);
    expect(await s.incrementCounter('c', 41)).toBe(41);

    const tail = Uint8Array.from([...Array.from({ length: 256 }, (_, i) => i), 0, 0]);
    const a = applied(
      await s.checkAndSetStamped(
        { table: 't', key: 'a', expected: null, state: template(tail), notified: true },
        'c',
      ),
    );
    expect(a.timestamp).toBe(42);
    expect(await s.read('t', 'a')).toEqual({ version: a.version, state: writeStamp(template(tail), 42) });
    const b = applied(
      await s.checkAndSetStamped({ table: 't', key: 'b', expected: null, state: template('b') }, 'c'),
    );
    expect(b.timestamp).toBe(43);
    expect(await s.read('t', 'b')).toEqual({ version: b.version, state: writeStamp(template('b'), 43) });
    expect(await s.scanNotified('t', { limit: 10 })).toEqual(['a']);
    // The next draw comes after both stamps.
    expect(await s.incrementCounter('c', 1)).toBe(44);
  });
});

describe('postgres checkAndSetStamped: failures', () => {
  /** Holds the counter row's lock from another connection, so a stamped statement waits on it. */
  async function holdCounter(s: PostgresStore, counter: string): Promise<PgPoolClient> {
    await s.incrementCounter(counter, 1);
    const blocker = await admin.connect();
    await blocker.query('BEGIN');
    await blocker.query(`SELECT 1 FROM "${s.namespace}_counters" WHERE name = $1 FOR UPDATE`, [
      Buffer.from(counter),
    ]);
    return blocker;
  }

  it('reports a connection killed mid-statement as StoreError applied=unknown', async () => {
    const s = await openStore({ namespace: uniqueNamespace() });
    const blocker = await holdCounter(s, 'st.kill');
    try {
      const pending = s.checkAndSetStamped(
        { table: 'sk', key: 'k', expected: null, state: template('x') },
        'st.kill',
      );
      pending.catch(() => {});
      let killed = false;
      for (let i = 0; i < 100 && !killed; i++) {
        const r = await admin.query(
          `SELECT pg_terminate_backend(pid) AS done FROM pg_stat_activity
           WHERE application_name = $1 AND wait_event_type = 'Lock'`,
          [`percolator:${s.namespace}`],
        );
        killed = r.rows.some((row) => row.done === true);
        if (!killed) await sleep(50);
      }
      expect(killed).toBe(true);
      const error = await errorOf(pending);
      expect(error).toBeInstanceOf(StoreError);
      expect((error as StoreError).applied).toBe('unknown');
    } finally {
      await blocker.query('ROLLBACK');
      blocker.release();
    }
    // Killed before it ran: nothing applied, and the store works again.
    expect(await s.read('sk', 'k')).toBeNull();
    applied(
      await s.checkAndSetStamped({ table: 'sk', key: 'k', expected: null, state: template('y') }, 'st.kill'),
    );
  });

  it("a wait for the counter ends before queryTimeoutMs, by the server's lock_timeout: StoreError applied=no, nothing written", async () => {
    // The statement, its own transaction, is rolled back by the server, so 'no' (retryable).
    // (A client-side timeout, which leaves the statement running, is 'unknown'.)
    const s = await openStore({ namespace: uniqueNamespace(), queryTimeoutMs: 300 });
    const blocker = await holdCounter(s, 'st.slow');
    let error: unknown;
    try {
      error = await errorOf(
        s.checkAndSetStamped({ table: 'ss', key: 'k', expected: null, state: template('x') }, 'st.slow'),
      );
    } finally {
      await blocker.query('ROLLBACK');
      blocker.release();
    }
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    expect((error as StoreError).message).toMatch(/lock timeout/i);
    expect(await s.read('ss', 'k')).toBeNull();
  });

  it('reports a refused connection as StoreError applied=no', async () => {
    // A TCP proxy in front of the server; closing it makes new connections refused.
    const target = new URL(url);
    const sockets = new Set<net.Socket>();
    const proxy = net.createServer((client) => {
      const upstream = net.connect(Number(target.port || 5432), target.hostname);
      sockets.add(client).add(upstream);
      client.pipe(upstream).pipe(client);
      const drop = () => {
        client.destroy();
        upstream.destroy();
      };
      client.on('error', drop).on('close', drop);
      upstream.on('error', drop).on('close', drop);
    });
    await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
    const port = (proxy.address() as net.AddressInfo).port;
    const proxied = new URL(url);
    proxied.hostname = '127.0.0.1';
    proxied.port = String(port);
    // The schema is made directly (and dropped at the end); the proxied store only uses it.
    const direct = await openStore({ namespace: uniqueNamespace() });
    const s = await createPostgresStore({
      connectionString: proxied.toString(),
      namespace: direct.namespace,
      createSchema: false,
    });
    try {
      applied(
        await s.checkAndSetStamped({ table: 'sc', key: 'a', expected: null, state: template('a') }, 'st.c'),
      );
      await new Promise<void>((resolve) => {
        proxy.close(() => resolve());
        for (const socket of sockets) socket.destroy();
      });
      await sleep(100); // let the pool notice its idle connection died
      const error = await errorOf(
        s.checkAndSetStamped({ table: 'sc', key: 'b', expected: null, state: template('b') }, 'st.c'),
      );
      expect(error).toBeInstanceOf(StoreError);
      expect((error as StoreError).applied).toBe('no');
      expect((error as StoreError).message).toMatch(/ECONNREFUSED/);
    } finally {
      await s.close();
    }
    // Nothing was written, and the counter did not move.
    expect(await direct.read('sc', 'b')).toBeNull();
    expect(await direct.incrementCounter('st.c', 1)).toBe(2);
  });
});

describe('postgres checkAndSetStamped: a later counter value sees the write', () => {
  it('holds the counter until the row write commits: a later draw waits, then the read sees the row', async () => {
    // The store's own statement text, run inside an explicit transaction we keep open.
    const sql = postgresStatements(postgresNames(store.namespace));
    const counter = 'st.hold';
    const before = await store.incrementCounter(counter, 1);
    const old = await store.checkAndSet({ table: 'sh', key: 'k', expected: null, state: template('old') });
    if (!old.ok) throw new Error('setup failed');
    const writer = await admin.connect();
    try {
      await writer.query('BEGIN');
      const r = await writer.query(sql.stampedUpdate, [
        Buffer.from('sh'),
        Buffer.from('k'),
        Buffer.from(counter),
        Buffer.from(template('held')),
        false,
        old.version,
        '10000',
      ]);
      expect(r.rows).toEqual([{ version: expect.any(String), ts: String(before + 1) }]);
      let drawn: number | undefined;
      const later = store.incrementCounter(counter, 1).then((value) => {
        drawn = value;
        return value;
      });
      await sleep(300);
      expect(drawn).toBeUndefined(); // waiting on the counter row's lock
      // Not committed, so not visible.
      expect(await store.read('sh', 'k')).toEqual({ version: old.version, state: template('old') });
      await writer.query('COMMIT');
      expect(await later).toBe(before + 2);
      expect(await store.read('sh', 'k')).toEqual({
        version: r.rows[0].version,
        state: writeStamp(template('held'), before + 1),
      });
    } finally {
      await writer.query('ROLLBACK').catch(() => {});
      writer.release();
    }
  });
  // The race itself (whoever draws later sees the write) is the conformance suite's
  // (store: checkAndSetStamped draws a timestamp ...), run on every store that declares it.
});

describe('postgres checkAndSetStamped: a stamped CAS waiting for a busy row does not hold up the counter', () => {
  // Before, the statement drew first and then waited for its row with the counter locked:
  // every draw, stamped read and stamped write of the namespace queued behind one busy row.
  it('an update waits for the row holding nothing: draws and stamped reads go on, and its stamp comes after them', async () => {
    const s = await openStore({ namespace: uniqueNamespace() });
    const counter = 'st.busy';
    const v = applied(
      await s.checkAndSetStamped(
        { table: 'busy', key: 'k', expected: null, state: template('old') },
        counter,
      ),
    );
    await s.checkAndSet({ table: 'busy', key: 'other', expected: null, state: template('other') });
    const blocker = await holdRow(s, 'busy', 'k');
    try {
      const stamped = s.checkAndSetStamped(
        { table: 'busy', key: 'k', expected: v.version, state: template('new') },
        counter,
      );
      stamped.catch(() => {});
      await untilLockWait(s);
      const drawn = await settledWithin(s.incrementCounter(counter, 1), 5_000);
      expect(drawn).toBe(v.timestamp + 1);
      const read = await settledWithin(s.readStamped([{ table: 'busy', key: 'other' }], counter), 5_000);
      expect(read).not.toBe('pending');
      const readTs = (read as { timestamp: number }).timestamp;
      expect(readTs).toBe(v.timestamp + 2);
      await blocker.query('ROLLBACK');
      // Drawn once it held the row: after every draw made while it waited.
      const r = applied(await stamped);
      expect(r.timestamp).toBe(readTs + 1);
      expect(await s.read('busy', 'k')).toEqual({
        version: r.version,
        state: writeStamp(template('new'), r.timestamp),
      });
    } finally {
      await blocker.query('ROLLBACK').catch(() => {});
      blocker.release();
    }
  });

  it('a create waits for a concurrent insert of its key holding nothing, then applies (rolled back) or fails (committed) with the row', async () => {
    const s = await openStore({ namespace: uniqueNamespace() });
    const counter = 'st.busy.create';
    const rows = `"${s.namespace}_rows"`;
    const insertOther = async (key: string): Promise<PgPoolClient> => {
      const other = await admin.connect();
      await other.query('BEGIN');
      await other.query(`INSERT INTO ${rows} (tbl, key, version, state) VALUES ($1, $2, 1, $3)`, [
        Buffer.from('busy'),
        Buffer.from(key),
        Buffer.from(template('other')),
      ]);
      return other;
    };
    for (const end of ['ROLLBACK', 'COMMIT'] as const) {
      const key = `k.${end}`;
      const other = await insertOther(key);
      try {
        const stamped = s.checkAndSetStamped(
          { table: 'busy', key, expected: null, state: template('mine') },
          counter,
        );
        stamped.catch(() => {});
        await untilLockWait(s);
        const drawn = await settledWithin(s.incrementCounter(counter, 1), 5_000);
        expect(typeof drawn).toBe('number');
        await other.query(end);
        const result = await stamped;
        if (end === 'ROLLBACK') {
          expect(applied(result).timestamp).toBe((drawn as number) + 1);
          expect((await s.read('busy', key))?.state).toEqual(
            writeStamp(template('mine'), (drawn as number) + 1),
          );
        } else {
          // The row is the other session's, and the call drew nothing.
          expect(result).toEqual({ ok: false, current: { version: '1', state: template('other') } });
          expect(await s.incrementCounter(counter, 1)).toBe((drawn as number) + 1);
        }
      } finally {
        await other.query('ROLLBACK').catch(() => {});
        other.release();
      }
    }
  });

  it('a backend waiting for a row gives up just before queryTimeoutMs (server lock_timeout): StoreError no, nothing left waiting', async () => {
    // pg's query_timeout only stops the client waiting; the backend, waiting for a lock, does
    // not notice its connection was closed and would wait as long as the row is held.
    const s = await openStore({ namespace: uniqueNamespace(), queryTimeoutMs: 1_500 });
    const counter = 'st.timeout';
    const v = applied(
      await s.checkAndSetStamped({ table: 'to', key: 'k', expected: null, state: template('old') }, counter),
    );
    const blocker = await holdRow(s, 'to', 'k');
    try {
      const error = await errorOf(
        s.checkAndSetStamped({ table: 'to', key: 'k', expected: v.version, state: template('new') }, counter),
      );
      expect(error).toBeInstanceOf(StoreError);
      // The statement, its own transaction, was rolled back by the server: not applied.
      expect((error as StoreError).applied).toBe('no');
      expect((error as StoreError).message).toMatch(/lock timeout/);
      // The server ended the wait: no backend of the store is left waiting for the row.
      expect(await lockWaiters(s)).toBe(0);
      expect(await s.incrementCounter(counter, 1)).toBe(v.timestamp + 1);
    } finally {
      await blocker.query('ROLLBACK').catch(() => {});
      blocker.release();
    }
    expect(await s.read('to', 'k')).toEqual({
      version: v.version,
      state: writeStamp(template('old'), v.timestamp),
    });
  });
});
