// Twin of the MySQL adapter's test of the same name: both check what each adapter does
// with its own driver (statements, failure mapping, timeouts, schema); the contract is the
// conformance suite's. Their test shapes match on purpose (`duplicates` pairs them); their
// setup is ./fixture.ts.
import { readFileSync } from 'node:fs';
import { type CasResult, ClosedError, InvalidArgumentError, Percolator, StoreError } from '@percolator/core';
import { fullCapabilities } from '@percolator/core/kit';
import {
  assertPostgresReachable,
  createPostgresStore,
  type PgPoolClient,
  POSTGRES_URL_ENV,
  type PostgresStore,
  postgresSchemaSql,
  resolvePostgresUrl,
} from '@percolator/postgres';
import pg from 'pg';
import { describe, expect, it, vi } from 'vitest';
import { admin, openStore, store, uniqueNamespace, url, usePostgresFixture } from './fixture.js';

const bytes = (text: string) => new TextEncoder().encode(text);
const text = (data: Uint8Array) => new TextDecoder().decode(data);

/** Resolves once some session of the server waits for a lock. */
/**
 * Until some session waits for a lock `blocker` holds: the batch under test (only it
 * touches the blocker's rows, in a namespace of the test's own). Any lock wait on the
 * server did before, and another client's (a test file or process beside this one) let a
 * check run before the batch had locked anything (seen in CI).
 */
async function untilBlockedBy(probe: pg.PoolClient, blocker: pg.PoolClient): Promise<void> {
  const pid = (await blocker.query('SELECT pg_backend_pid() AS pid')).rows[0].pid as number;
  await vi.waitFor(
    async () => {
      const waiting = await probe.query(
        'SELECT count(*)::int AS n FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))',
        [pid],
      );
      expect(waiting.rows[0].n).toBeGreaterThan(0);
    },
    { timeout: 10_000, interval: 20 },
  );
}

/** Tries to lock one row at once (NOWAIT), in a transaction rolled back at once: 'free' or the SQLSTATE. */
async function lockNow(
  probe: pg.PoolClient,
  rows: string,
  table: string,
  key: string,
): Promise<string | undefined> {
  await probe.query('BEGIN');
  const outcome = await probe
    .query(`SELECT 1 FROM ${rows} WHERE tbl = $1 AND key = $2 FOR UPDATE NOWAIT`, [
      Buffer.from(table),
      Buffer.from(key),
    ])
    .then(
      () => 'free',
      (error: { code?: string }) => error.code,
    );
  await probe.query('ROLLBACK');
  return outcome;
}

async function tablesOf(namespace: string): Promise<string[]> {
  const result = await admin.query(
    `SELECT relname FROM pg_class WHERE relname LIKE $1 || '\\_%' AND relkind IN ('r', 'S') ORDER BY relname`,
    [namespace],
  );
  return result.rows.map((r) => r.relname as string);
}

function version(result: CasResult): string {
  if (!result.ok) throw new Error(`expected the CAS to apply: ${JSON.stringify(result)}`);
  return result.version;
}

usePostgresFixture('t');

describe('postgres store: optional capabilities', () => {
  it('declares what it implements', () => {
    expect(store.name).toBe('postgres');
    // Every capability, with bytea's 64 MiB.
    expect(store.capabilities).toEqual(fullCapabilities(64 * 1024 * 1024, { stampedCheckAndSetMany: true }));
    // test/stamped.test.ts covers checkAndSetStamped, test/read-stamped.test.ts readStamped,
    // test/stamped-many.test.ts checkAndSetStampedMany.
    expect(typeof store.checkAndSetStamped).toBe('function');
    expect(typeof store.checkAndSetStampedMany).toBe('function');
    expect(typeof store.readStamped).toBe('function');
  });

  // What each request of a batch does is the conformance suite's; this is the round trip.
  it('sends checkAndSetMany in one round trip, and the same row twice in request order', async () => {
    const pool = new pg.Pool({ connectionString: url, max: 2 });
    pool.on('error', () => {});
    let acquired = 0;
    pool.on('acquire', () => acquired++);
    const s = await openStore({ pool, namespace: store.namespace, createSchema: false });
    try {
      const vu = version(
        await s.checkAndSet({ table: 'cm', key: 'upd', expected: null, state: bytes('u0') }),
      );
      const vd = version(
        await s.checkAndSet({ table: 'cm', key: 'del', expected: null, state: bytes('d0') }),
      );
      acquired = 0;
      const results = await s.checkAndSetMany([
        { table: 'cm', key: 'new', expected: null, state: bytes('n'), notified: true },
        { table: 'cm', key: 'upd', expected: vu, state: bytes('u1') },
        { table: 'cm', key: 'del', expected: vd, state: null },
        { table: 'cm', key: 'gone', expected: null, state: null },
      ]);
      expect(acquired).toBe(1);
      expect(results.every((r) => r.ok)).toBe(true);
      const versions = results.map(version);
      expect(new Set(versions).size).toBe(4);
      // The same row twice: applied in request order.
      const seq = await s.checkAndSetMany([
        { table: 'cm', key: 'twice', expected: null, state: bytes('1') },
        { table: 'cm', key: 'twice', expected: null, state: bytes('2') },
      ]);
      expect(seq[0]!.ok).toBe(true);
      expect(seq[1]).toEqual({ ok: false, current: { version: version(seq[0]!), state: bytes('1') } });
      expect(await s.checkAndSetMany([])).toEqual([]);
    } finally {
      await s.close();
      await pool.end();
    }
  });

  // The notification index's semantics are the conformance suite's; this is its SQL.
  it('answers scanNotified from its partial index on notified rows', async () => {
    const plan = await admin.query(
      `EXPLAIN SELECT key FROM "${store.namespace}_rows" WHERE tbl = '\\x6e'::bytea AND notified ORDER BY key LIMIT 5`,
    );
    expect(JSON.stringify(plan.rows)).toContain(`${store.namespace}_rows_notified`);
  });
});

describe('postgres store: limits and failures', () => {
  it('reports a connection killed mid-CAS as StoreError applied=unknown', async () => {
    const v = version(
      await store.checkAndSet({ table: 'kill', key: 'k', expected: null, state: bytes('0') }),
    );
    const blocker = await admin.connect();
    try {
      // Hold the row lock so the store's UPDATE waits on it, then kill the store's backend.
      await blocker.query('BEGIN');
      await blocker.query(`SELECT 1 FROM "${store.namespace}_rows" WHERE tbl = $1 AND key = $2 FOR UPDATE`, [
        Buffer.from('kill'),
        Buffer.from('k'),
      ]);
      const pending = store.checkAndSet({ table: 'kill', key: 'k', expected: v, state: bytes('1') });
      pending.catch(() => {});
      let killed = false;
      for (let i = 0; i < 100 && !killed; i++) {
        const r = await admin.query(
          `SELECT pg_terminate_backend(pid) AS done FROM pg_stat_activity
           WHERE application_name = $1 AND wait_event_type = 'Lock'`,
          [`percolator:${store.namespace}`],
        );
        killed = r.rows.some((row) => row.done === true);
        if (!killed) await new Promise((resolve) => setTimeout(resolve, 50));
      }
      expect(killed).toBe(true);
      const error = await pending.then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(StoreError);
      expect((error as StoreError).applied).toBe('unknown');
      expect((error as StoreError).retryable).toBe(false);
    } finally {
      await blocker.query('ROLLBACK');
      blocker.release();
    }
    // The store recovers with a fresh connection.
    expect((await store.read('kill', 'k'))?.version).toBe(v);
  });

  it('prepares each statement once per connection, under its name (scans, whose text varies, are not)', async () => {
    // The store builds pg Query objects itself (pg.ts, submitQuery); this checks that the
    // name still reaches the server, so each statement is parsed and planned once.
    const pool = new pg.Pool({ connectionString: url, max: 1 });
    pool.on('error', () => {});
    try {
      const s = await openStore({ pool, namespace: uniqueNamespace() });
      const v = version(await s.checkAndSet({ table: 'p', key: 'k', expected: null, state: bytes('0') }));
      for (let i = 0; i < 3; i++) expect((await s.read('p', 'k'))?.version).toBe(v);
      expect(await s.scan('p', { limit: 10 })).toHaveLength(1);
      const prepared = await pool.query('SELECT name FROM pg_prepared_statements ORDER BY name');
      const names = prepared.rows.map((row: { name: string }) => row.name);
      expect(names).toContain(`perc:${s.namespace}:read`);
      expect(names).toContain(`perc:${s.namespace}:create`);
      expect(names.some((name: string) => name.includes('scan'))).toBe(false);
    } finally {
      await pool.end();
    }
  });

  it('checkAndSetMany locks its rows in (table, key) order whatever the request order, so opposite batches cannot deadlock', async () => {
    // A deadlock costs deadlock_timeout (1 s by default) before PostgreSQL breaks it: the
    // bench's 16-row transactions showed it as a p99 of 959 ms.
    const s = await openStore({ namespace: uniqueNamespace() });
    const rows = `"${s.namespace}_rows"`;
    const va = version(await s.checkAndSet({ table: 'd', key: 'a', expected: null, state: bytes('a0') }));
    const vb = version(await s.checkAndSet({ table: 'd', key: 'b', expected: null, state: bytes('b0') }));
    const blocker = await admin.connect();
    const probe = await admin.connect();
    try {
      await blocker.query('BEGIN');
      await blocker.query(`SELECT 1 FROM ${rows} WHERE tbl = $1 AND key = $2 FOR UPDATE`, [
        Buffer.from('d'),
        Buffer.from('b'),
      ]);
      // Requests in the opposite order: b first.
      const batch = s.checkAndSetMany([
        { table: 'd', key: 'b', expected: vb, state: bytes('b1') },
        { table: 'd', key: 'a', expected: va, state: bytes('a1') },
      ]);
      await untilBlockedBy(probe, blocker);
      // The batch waits for b holding a: it took a first. In request order it would hold nothing.
      const tryA = await lockNow(probe, rows, 'd', 'a');
      expect(tryA).toBe('55P03'); // lock_not_available
      await blocker.query('ROLLBACK');
      const [rb, ra] = await batch;
      // Each result answers its own request.
      expect((await s.read('d', 'b'))?.version).toBe(version(rb!));
      expect((await s.read('d', 'a'))?.version).toBe(version(ra!));
      expect(text((await s.read('d', 'b'))!.state)).toBe('b1');
    } finally {
      await blocker.query('ROLLBACK').catch(() => {});
      blocker.release();
      probe.release();
    }
  });

  it('checkAndSetMany locks its rows in (table, key) order whatever the plan: b stored before a, statistics, a hash join', async () => {
    // With a few dozen rows and statistics, the planner hashes the requests and scans the
    // table, so an UPDATE joined with them took its rows in heap order: b, then a (found by
    // a review, as a deadlock against a stamped call that takes a, then b).
    const s = await openStore({ namespace: uniqueNamespace() });
    const rows = `"${s.namespace}_rows"`;
    const vb = version(await s.checkAndSet({ table: 'h', key: 'b', expected: null, state: bytes('b0') }));
    for (let i = 0; i < 30; i++) {
      await s.checkAndSet({
        table: 'h',
        key: `f${String(i).padStart(2, '0')}`,
        expected: null,
        state: bytes('f'),
      });
    }
    const va = version(await s.checkAndSet({ table: 'h', key: 'a', expected: null, state: bytes('a0') }));
    await admin.query(`ANALYZE ${rows}`);
    const blocker = await admin.connect();
    const probe = await admin.connect();
    try {
      await blocker.query('BEGIN');
      await blocker.query(`SELECT 1 FROM ${rows} WHERE tbl = $1 AND key = $2 FOR UPDATE`, [
        Buffer.from('h'),
        Buffer.from('a'),
      ]);
      const batch = s.checkAndSetMany([
        { table: 'h', key: 'a', expected: va, state: bytes('a1') },
        { table: 'h', key: 'b', expected: vb, state: bytes('b1') },
      ]);
      await untilBlockedBy(probe, blocker);
      // It waits for a, the first row in key order, holding nothing: b is free.
      expect(await lockNow(probe, rows, 'h', 'b')).toBe('free');
      await blocker.query('ROLLBACK');
      const [ra, rb] = await batch;
      expect((await s.read('h', 'a'))?.version).toBe(version(ra!));
      expect((await s.read('h', 'b'))?.version).toBe(version(rb!));
    } finally {
      await blocker.query('ROLLBACK').catch(() => {});
      blocker.release();
      probe.release();
    }
  });

  it('checkAndSetMany locks every row that exists before it writes any, creates included, so a stale create cannot close a cycle', async () => {
    // The writes take their rows kind by kind (updates, deletes, creates). Without locking
    // first, batch A = [create a (a exists: a stale create), update b, update c] held b and
    // waited for c, and a create of a waits for whoever holds a: batch B = [update a, update
    // b] held a and waited for b. A cycle, broken only after deadlock_timeout (a review saw
    // it in 10 of 10 rounds). Now A holds a and b while it waits for c, so B waits for A.
    const s = await openStore({ namespace: uniqueNamespace() });
    const rows = `"${s.namespace}_rows"`;
    const va = version(await s.checkAndSet({ table: 'd', key: 'a', expected: null, state: bytes('a0') }));
    const vb = version(await s.checkAndSet({ table: 'd', key: 'b', expected: null, state: bytes('b0') }));
    const vc = version(await s.checkAndSet({ table: 'd', key: 'c', expected: null, state: bytes('c0') }));
    const blocker = await admin.connect();
    const probe = await admin.connect();
    try {
      await blocker.query('BEGIN');
      await blocker.query(`SELECT 1 FROM ${rows} WHERE tbl = $1 AND key = $2 FOR UPDATE`, [
        Buffer.from('d'),
        Buffer.from('c'),
      ]);
      const a = s.checkAndSetMany([
        { table: 'd', key: 'a', expected: null, state: bytes('aX') },
        { table: 'd', key: 'b', expected: vb, state: bytes('bX') },
        { table: 'd', key: 'c', expected: vc, state: bytes('cX') },
      ]);
      await untilBlockedBy(probe, blocker);
      // A waits for c holding a, the row its create will find there.
      const tryA = await lockNow(probe, rows, 'd', 'a');
      expect(tryA).toBe('55P03'); // lock_not_available
      const b = s.checkAndSetMany([
        { table: 'd', key: 'a', expected: va, state: bytes('a1') },
        { table: 'd', key: 'b', expected: vb, state: bytes('b1') },
      ]);
      await blocker.query('ROLLBACK');
      const [ra, rb] = await Promise.all([a, b]);
      // A first: its stale create fails, its updates apply; then B: a applies, b was changed.
      expect(ra.map((r) => r.ok)).toEqual([false, true, true]);
      expect(rb.map((r) => r.ok)).toEqual([true, false]);
      expect(text((await s.read('d', 'a'))!.state)).toBe('a1');
      expect(text((await s.read('d', 'b'))!.state)).toBe('bX');
      expect(text((await s.read('d', 'c'))!.state)).toBe('cX');
    } finally {
      await blocker.query('ROLLBACK').catch(() => {});
      blocker.release();
      probe.release();
    }
  });

  it('close() answers the calls still waiting for a connection with ClosedError, at once', async () => {
    // pg-pool's end() leaves its queue unanswered: they waited out connectionTimeoutMillis
    // (10 s) and failed as a retryable timeout.
    const s = await openStore({ namespace: uniqueNamespace(), maxConnections: 1 });
    const v = version(await s.checkAndSet({ table: 'q', key: 'k', expected: null, state: bytes('0') }));
    const blocker = await admin.connect();
    try {
      await blocker.query('BEGIN');
      await blocker.query(`SELECT 1 FROM "${s.namespace}_rows" WHERE tbl = $1 AND key = $2 FOR UPDATE`, [
        Buffer.from('q'),
        Buffer.from('k'),
      ]);
      // The pool's one connection waits on the row lock; the read waits for the connection.
      const holding = s.checkAndSet({ table: 'q', key: 'k', expected: v, state: bytes('1') }).catch((e) => e);
      await new Promise((resolve) => setTimeout(resolve, 100));
      const queued = s.read('q', 'k').then(
        () => 'read',
        (e: unknown) => e,
      );
      await new Promise((resolve) => setTimeout(resolve, 50));
      const closing = s.close();
      const outcome = await Promise.race([
        queued,
        new Promise((resolve) => setTimeout(() => resolve('still waiting after 2 s'), 2000)),
      ]);
      expect(outcome).toBeInstanceOf(ClosedError);
      await blocker.query('ROLLBACK');
      expect(await holding).toMatchObject({ ok: true });
      await closing;
    } finally {
      await blocker.query('ROLLBACK').catch(() => {});
      blocker.release();
    }
  });

  it('gives up on a blocked CAS after queryTimeoutMs: StoreError unknown, and the row stays consistent', async () => {
    // 0, and past the range of Node's timers (a longer timer fires after 1 ms: every
    // statement would time out, every write 'unknown').
    for (const queryTimeoutMs of [0, 2 ** 31]) {
      await expect(openStore({ namespace: uniqueNamespace(), queryTimeoutMs })).rejects.toBeInstanceOf(
        InvalidArgumentError,
      );
    }
    const s = await openStore({ namespace: uniqueNamespace(), queryTimeoutMs: 300 });
    const v = version(await s.checkAndSet({ table: 'slow', key: 'k', expected: null, state: bytes('0') }));
    const blocker = await admin.connect();
    try {
      // The row lock makes the store's UPDATE wait, as a silent network partition would.
      await blocker.query('BEGIN');
      await blocker.query(`SELECT 1 FROM "${s.namespace}_rows" WHERE tbl = $1 AND key = $2 FOR UPDATE`, [
        Buffer.from('slow'),
        Buffer.from('k'),
      ]);
      const error = await s.checkAndSet({ table: 'slow', key: 'k', expected: v, state: bytes('1') }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(StoreError);
      expect((error as StoreError).applied).toBe('unknown');
      expect((error as StoreError).message).toMatch(/timeout/i);
    } finally {
      await blocker.query('ROLLBACK');
      blocker.release();
    }
    // The abandoned UPDATE still runs once the lock is free: that is why the answer was
    // 'unknown'. Wait until the server has finished it, then the row is one of the two
    // states, whole, and a CAS from what is read there succeeds.
    await vi.waitFor(
      async () => {
        const r = await admin.query(
          `SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'`,
          [`percolator:${s.namespace}`],
        );
        expect(r.rows[0].n).toBe(0);
      },
      { timeout: 10_000 },
    );
    const row = await s.read('slow', 'k');
    if (row === null) throw new Error('row vanished');
    if (row.version === v) expect(text(row.state)).toBe('0');
    else expect(text(row.state)).toBe('1');
    version(await s.checkAndSet({ table: 'slow', key: 'k', expected: row.version, state: bytes('2') }));
    expect(text((await s.read('slow', 'k'))?.state ?? new Uint8Array())).toBe('2');
  });

  it('reports a refused connection as StoreError applied=no', async () => {
    const error = await createPostgresStore({
      connectionString: 'postgres://postgres@127.0.0.1:1/test',
      namespace: uniqueNamespace(),
    }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
  });

  it('names the environment variable when the server is unreachable', async () => {
    expect(resolvePostgresUrl({})).toBe('postgres://postgres@127.0.0.1:5432/test');
    expect(resolvePostgresUrl({ [POSTGRES_URL_ENV]: 'postgres://x@h:1/db' })).toBe('postgres://x@h:1/db');
    await expect(assertPostgresReachable('postgres://postgres:secret@127.0.0.1:1/test')).rejects.toThrow(
      /PERCOLATOR_POSTGRES_URL/,
    );
    await expect(assertPostgresReachable('postgres://postgres:secret@127.0.0.1:1/test')).rejects.not.toThrow(
      /secret/,
    );
  });

  // pg-pool drops its own 'error' listener from a client as it hands the client out; an
  // ErrorResponse arriving before the caller can attach one (a server going down in the same
  // network chunk as ReadyForQuery) would be an unhandled 'error' event and crash the process.
  it('keeps an error on a freshly handed-out client of a pool it uses from crashing the process', async () => {
    const pool = new pg.Pool({ connectionString: url, max: 1 });
    pool.on('error', () => {});
    const s = await createPostgresStore({ pool, namespace: store.namespace, createSchema: false });
    try {
      const client = await pool.connect();
      expect(client.listenerCount('error')).toBe(1);
      expect(() => client.emit('error', new Error('terminating connection'))).not.toThrow();
      client.release(true);
      expect(await s.read('t', 'never-written')).toBeNull();
    } finally {
      await s.close();
      await pool.end();
    }
  });
});

describe('postgres store: its own type parsers', () => {
  /** Every way the store decodes a row or a key gives back what was written. */
  async function decodesAsWritten(s: PostgresStore): Promise<void> {
    const state = Uint8Array.from([0, 1, 0x5c, 0x78, 0xff, ...bytes('state')]);
    const v = version(await s.checkAndSet({ table: 'tp', key: 'k', expected: null, state, notified: true }));
    const row = { version: v, state };
    expect(await s.read('tp', 'k')).toEqual(row);
    expect(await s.readMany([{ table: 'tp', key: 'k' }])).toEqual([row]);
    expect(await s.scan('tp', { limit: 10 })).toEqual([{ key: 'k', row }]);
    expect(await s.scanNotified('tp', { limit: 10 })).toEqual(['k']);
    expect((await s.readStamped([{ table: 'tp', key: 'k' }], 'c')).rows).toEqual([row]);
    expect((await s.readPeeked([{ table: 'tp', key: 'k' }], 'c')).rows).toEqual([row]);
    // A failed CAS's current row (the extra read, and ensureAbsent's own reply).
    expect(await s.checkAndSet({ table: 'tp', key: 'k', expected: null, state })).toEqual({
      ok: false,
      current: row,
    });
    expect(await s.checkAndSet({ table: 'tp', key: 'k', expected: null, state: null })).toEqual({
      ok: false,
      current: row,
    });
    expect(await s.incrementCounter('c', 1)).toBe(2);
  }

  it('a pool whose bytea parser returns the text changes nothing the store reads', async () => {
    // Before: states read as 0 bytes and the scanned key as '\x6b'.
    const types = {
      getTypeParser: (oid: number, format?: string) =>
        oid === 17 ? (value: string) => value : pg.types.getTypeParser(oid, format as 'text'),
    };
    const pool = new pg.Pool({ connectionString: url, max: 2, types });
    pool.on('error', () => {});
    try {
      await decodesAsWritten(await openStore({ pool, namespace: uniqueNamespace() }));
    } finally {
      await pool.end();
    }
  });

  it("pg's global parsers changed (pg.types.setTypeParser) change nothing the store reads", async () => {
    const parsers = [17, 16, 23, 20, 25].map((oid) => [oid, pg.types.getTypeParser(oid, 'text')] as const);
    for (const [oid] of parsers) pg.types.setTypeParser(oid, 'text', (value: string) => `parsed:${value}`);
    try {
      await decodesAsWritten(await openStore({ namespace: uniqueNamespace() }));
    } finally {
      for (const [oid, parser] of parsers) pg.types.setTypeParser(oid, 'text', parser);
    }
    expect(pg.types.getTypeParser(17, 'text')('\\x6b')).toEqual(Buffer.from('k'));
  });

  it("a session with bytea_output = 'escape' reads the same bytes", async () => {
    const pool = new pg.Pool({ connectionString: url, max: 2, options: '-c bytea_output=escape' });
    pool.on('error', () => {});
    try {
      expect((await pool.query('SHOW bytea_output')).rows[0].bytea_output).toBe('escape');
      await decodesAsWritten(await openStore({ pool, namespace: uniqueNamespace() }));
    } finally {
      await pool.end();
    }
  });

  it('a state or key that is not bytes is a StoreError, not a row made of the wrong bytes', async () => {
    // Reply rows changed on the way (as a parser other than the store's would leave them).
    const pool = new pg.Pool({ connectionString: url, max: 1 });
    pool.on('error', () => {});
    const connect = pool.connect.bind(pool) as () => Promise<PgPoolClient>;
    let tamper = false;
    const wrapped = new WeakSet<PgPoolClient>();
    (pool as unknown as { connect: () => Promise<PgPoolClient> }).connect = async () => {
      const client = await connect();
      if (wrapped.has(client)) return client;
      wrapped.add(client);
      const query = client.query.bind(client) as (...args: unknown[]) => unknown;
      (client as unknown as { query: (...args: unknown[]) => unknown }).query = (config, ...rest) => {
        const c = config as { callback?: (error: unknown, result: unknown) => void };
        const callback = c.callback;
        if (tamper && typeof callback === 'function') {
          c.callback = (error, result) => {
            for (const row of (result as { rows?: Record<string, unknown>[] } | undefined)?.rows ?? []) {
              for (const column of ['state', 'key']) {
                if (Buffer.isBuffer(row[column])) row[column] = `\\x${row[column].toString('hex')}`;
              }
            }
            callback(error, result);
          };
        }
        return query(config, ...rest);
      };
      return client;
    };
    try {
      const s = await openStore({ pool, namespace: uniqueNamespace() });
      version(
        await s.checkAndSet({ table: 'tp', key: 'k', expected: null, state: bytes('v'), notified: true }),
      );
      tamper = true;
      for (const call of [
        () => s.read('tp', 'k'),
        () => s.readMany([{ table: 'tp', key: 'k' }]),
        () => s.scan('tp', { limit: 10 }),
        () => s.scanNotified('tp', { limit: 10 }),
      ]) {
        const error = await call().then(
          () => undefined,
          (e: unknown) => e,
        );
        expect(error).toBeInstanceOf(StoreError);
        expect(error).toMatchObject({ applied: 'no', retryable: false });
        expect((error as Error).message).toMatch(/not bytes/);
      }
    } finally {
      await pool.end();
    }
  });
});

describe('postgres store: namespaces and lifecycle', () => {
  it('never reissues an old version after the namespace is dropped and re-created under a live client', async () => {
    const namespace = uniqueNamespace();
    const old = await openStore({ namespace });
    const stale = version(
      await old.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('old') }),
    );
    await old.dropNamespace();
    // `old` stays open, as a client elsewhere would; a new store re-creates the namespace.
    const fresh = await openStore({ namespace });
    const current = version(
      await fresh.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('new') }),
    );
    expect(BigInt(current)).toBeGreaterThan(BigInt(stale));
    // The old client's token matches nothing, so its CAS cannot overwrite the new row.
    const attempt = await old.checkAndSet({ table: 't', key: 'k', expected: stale, state: bytes('lost') });
    expect(attempt.ok).toBe(false);
    expect(await fresh.read('t', 'k')).toEqual({ version: current, state: bytes('new') });
    // Schema creation stays idempotent: opening again does not move the counter back.
    await openStore({ namespace });
    const next = version(
      await fresh.checkAndSet({ table: 't', key: 'k', expected: current, state: bytes('n2') }),
    );
    expect(BigInt(next)).toBeGreaterThan(BigInt(current));
  });

  it('rejects a bad namespace with InvalidArgumentError', async () => {
    for (const namespace of ['', 'Upper', '1abc', 'a-b', 'a b', 'x'.repeat(33), 'a;drop', 'ä']) {
      await expect(createPostgresStore({ connectionString: url, namespace })).rejects.toBeInstanceOf(
        InvalidArgumentError,
      );
    }
  });

  it('isolates namespaces and dropNamespace removes only its own data', async () => {
    const [one, two] = await Promise.all([
      openStore({ namespace: uniqueNamespace() }),
      openStore({ namespace: uniqueNamespace() }),
    ]);
    await one!.checkAndSet({ table: 'iso', key: 'k', expected: null, state: bytes('one') });
    expect(await two!.read('iso', 'k')).toBeNull();
    await two!.checkAndSet({ table: 'iso', key: 'k', expected: null, state: bytes('two') });
    expect(text((await one!.read('iso', 'k'))!.state)).toBe('one');
    expect(await one!.incrementCounter('c', 2)).toBe(2);
    expect(await two!.incrementCounter('c', 1)).toBe(1);

    expect(await tablesOf(one!.namespace)).toEqual([
      `${one!.namespace}_counters`,
      `${one!.namespace}_rows`,
      `${one!.namespace}_version_seq`,
    ]);
    await one!.dropNamespace();
    expect(await tablesOf(one!.namespace)).toEqual([]);
    expect(text((await two!.read('iso', 'k'))!.state)).toBe('two');
    // The dropped store now fails with a typed error; the server rejected the statement,
    // so it certainly did not apply ('no').
    const error = await one!.checkAndSet({ table: 'iso', key: 'k', expected: null, state: bytes('x') }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    // Not retryable: the namespace stays missing until an operator acts, so a transaction
    // fails at its first attempt, not after its retries and backoffs (found by a user).
    expect((error as StoreError).retryable).toBe(false);
    const readError = await one!.read('iso', 'k').then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(readError).toBeInstanceOf(StoreError);
    expect((readError as StoreError).retryable).toBe(false);
    const db = new Percolator({ store: one! });
    let attempts = 0;
    const failed = await db
      .transact(async (tx) => {
        attempts++;
        tx.set('iso', 'k', 'v', 'x');
      })
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(failed).toBeInstanceOf(StoreError);
    expect(attempts).toBe(1);
    await db.close();
  });

  it('two store instances on one namespace never issue the same version', async () => {
    const other = await openStore({ namespace: store.namespace, createSchema: false });
    const seen = new Set<string>();
    let current: string | null = null;
    for (let i = 0; i < 10; i++) {
      const writer = i % 2 === 0 ? store : other;
      const result = await writer.checkAndSet({
        table: 'two',
        key: 'k',
        expected: current,
        state: i % 3 === 2 ? null : bytes(`${i}`),
      });
      const v = version(result);
      expect(seen.has(v)).toBe(false);
      seen.add(v);
      current = i % 3 === 2 ? null : v;
    }
  });

  it('creates the schema safely when many stores start at once', async () => {
    const namespace = uniqueNamespace();
    const stores = await Promise.all(
      Array.from({ length: 6 }, () => openStore({ namespace, maxConnections: 2 })),
    );
    await stores[0]!.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('v') });
    expect(text((await stores[5]!.read('t', 'k'))!.state)).toBe('v');
  });

  it('exports the schema SQL for users who manage schemas themselves', async () => {
    const namespace = uniqueNamespace();
    // Without the tables, a store that must not create them fails at once, saying why.
    await expect(openStore({ namespace, createSchema: false })).rejects.toThrow(/postgresSchemaSql/);
    const sql = postgresSchemaSql(namespace);
    expect(sql).toContain(`"${namespace}_rows"`);
    expect(postgresSchemaSql()).toContain('"percolator_rows"');
    await admin.query(sql);
    const s = await openStore({ namespace, createSchema: false });
    // The SQL includes the stamped-read function (test/read-stamped.test.ts covers it).
    expect(s.capabilities.stampedRead).toBe(true);
    await s.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('v') });
    expect(text((await s.read('t', 'k'))!.state)).toBe('v');
    expect((await s.readStamped([{ table: 't', key: 'k' }], 'c')).rows[0]?.state).toEqual(bytes('v'));
  });

  it('documents in its README exactly the schema SQL it runs', () => {
    const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
    expect(readme).toContain(postgresSchemaSql().trim());
  });

  it('close() leaves a pool the user passed open, and the store refuses calls afterwards', async () => {
    const pool = new pg.Pool({ connectionString: url, max: 1 });
    pool.on('error', () => {});
    const s = await createPostgresStore({ pool, namespace: store.namespace });
    await s.read('t', 'k');
    await s.close();
    await s.close();
    expect((await pool.query('SELECT 1 AS one')).rows).toEqual([{ one: 1 }]);
    await expect(s.read('t', 'k')).rejects.toBeInstanceOf(ClosedError);
    await pool.end();
  });

  it('close() ends the pool it opened itself', async () => {
    const namespace = uniqueNamespace();
    const s = await openStore({ namespace });
    const count = async () =>
      Number(
        (
          await admin.query(`SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = $1`, [
            `percolator:${namespace}`,
          ])
        ).rows[0].n,
      );
    expect(await count()).toBeGreaterThan(0);
    await s.dropNamespace();
    await s.close();
    for (let i = 0; i < 50 && (await count()) > 0; i++) await new Promise((r) => setTimeout(r, 20));
    expect(await count()).toBe(0);
  });
});
