// Twin of the PostgreSQL adapter's test of the same name: both check what each adapter does
// with its own driver (statements, failure mapping, timeouts, schema); the contract is the
// conformance suite's. Their test shapes match on purpose (`duplicates` pairs them); their
// setup is ./fixture.ts.
import { readFileSync } from 'node:fs';
import { type AddressInfo, connect, createServer, type Socket } from 'node:net';
import { type CasResult, ClosedError, InvalidArgumentError, Percolator, StoreError } from '@percolator/core';
import { fullCapabilities } from '@percolator/core/kit';
import {
  assertMySqlReachable,
  createMySqlStore,
  MYSQL_URL_ENV,
  maxStateBytesFor,
  mysqlSchemaSql,
  mysqlSchemaStatements,
  resolveMySqlUrl,
} from '@percolator/mysql';
import { createPool, type ResultSetHeader, type RowDataPacket } from 'mysql2/promise';
import { describe, expect, it, vi } from 'vitest';
import { admin, openStore, store, uniqueNamespace, url, useMySqlFixture } from './fixture.js';

const bytes = (text: string) => new TextEncoder().encode(text);
const text = (data: Uint8Array) => new TextDecoder().decode(data);

async function tablesOf(namespace: string): Promise<string[]> {
  const [rows] = await admin.query<RowDataPacket[]>(
    `SELECT TABLE_NAME AS name FROM information_schema.TABLES
     WHERE TABLE_SCHEMA = DATABASE() AND LEFT(TABLE_NAME, ?) = ? ORDER BY TABLE_NAME`,
    [namespace.length + 1, `${namespace}_`],
  );
  return rows.map((r) => r.name as string);
}

async function maxAllowedPacket(): Promise<number> {
  const [rows] = await admin.query<RowDataPacket[]>('SELECT @@max_allowed_packet AS p');
  return Number(rows[0]!.p);
}

function version(result: CasResult): string {
  if (!result.ok) throw new Error(`expected the CAS to apply: ${JSON.stringify(result)}`);
  return result.version;
}

useMySqlFixture('t');

describe('mysql store: optional capabilities', () => {
  it('declares what it implements', async () => {
    expect(store.name).toBe('mysql');
    // Every capability, with what max_allowed_packet leaves for a state.
    expect(store.capabilities).toEqual({
      ...fullCapabilities(maxStateBytesFor(await maxAllowedPacket())),
      stampedCheckAndSetMany: true,
    });
    expect(store.capabilities.maxStateBytes).toBeLessThan((await maxAllowedPacket()) / 2);
    expect(typeof store.checkAndSetStamped).toBe('function');
    expect(typeof store.readStamped).toBe('function');
    expect(typeof store.checkAndSetStampedMany).toBe('function');
  });

  // What each request of a batch does is the conformance suite's; this is the round trip.
  it('sends checkAndSetMany in one round trip, and the same row twice in request order', async () => {
    const pool = createPool({ uri: url, connectionLimit: 2, multipleStatements: true });
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
  it('answers scanNotified from its index on notified rows', async () => {
    const table = 'notes';
    for (const key of ['m', 'b', '😀', 'a\u0000', 'z']) {
      await store.checkAndSet({ table, key, expected: null, state: bytes(key), notified: true });
    }
    await store.checkAndSet({ table, key: 'plain', expected: null, state: bytes('p') });
    expect(await store.scanNotified(table, { limit: 10 })).toEqual(['a\u0000', 'b', 'm', 'z', '😀']);
    const [plan] = await admin.query<RowDataPacket[]>(
      `EXPLAIN SELECT row_key FROM \`${store.namespace}_rows\` WHERE tbl = ? AND notified = TRUE ORDER BY row_key LIMIT 5`,
      [Buffer.from(table)],
    );
    expect(plan[0]!.key).toBe(`${store.namespace}_rows_notified`);
  });
});

describe('mysql store: limits and failures', () => {
  it('stores a state of exactly maxStateBytes, also two of them in one batch', async () => {
    const max = store.capabilities.maxStateBytes;
    const big = new Uint8Array(max).fill(0xab);
    big[0] = 0;
    big[max - 1] = 0xff;
    const v = version(await store.checkAndSet({ table: 'max', key: 'one', expected: null, state: big }));
    const row = await store.read('max', 'one');
    expect(row?.version).toBe(v);
    expect(Buffer.compare(row!.state, big)).toBe(0);
    // Together they exceed max_allowed_packet: the batch is split into round trips that fit.
    const results = await store.checkAndSetMany([
      { table: 'max', key: 'one', expected: v, state: big },
      { table: 'max', key: 'two', expected: null, state: big },
    ]);
    expect(results.map((r) => r.ok)).toEqual([true, true]);
    expect((await store.readMany([{ table: 'max', key: 'two' }]))[0]!.state.length).toBe(max);
  });

  it('reports a connection killed mid-CAS as StoreError applied=unknown', async () => {
    const v = version(
      await store.checkAndSet({ table: 'kill', key: 'k', expected: null, state: bytes('0') }),
    );
    const blocker = await admin.getConnection();
    try {
      // Hold the row lock so the store's UPDATE waits on it, then KILL the store's connection.
      await blocker.query('BEGIN');
      await blocker.query(
        `SELECT 1 FROM \`${store.namespace}_rows\` WHERE tbl = ? AND row_key = ? FOR UPDATE`,
        [Buffer.from('kill'), Buffer.from('k')],
      );
      const pending = store.checkAndSet({ table: 'kill', key: 'k', expected: v, state: bytes('1') });
      pending.catch(() => {});
      let killed = false;
      for (let i = 0; i < 100 && !killed; i++) {
        const [rows] = await admin.query<RowDataPacket[]>(
          'SELECT ID AS id FROM information_schema.PROCESSLIST WHERE INFO LIKE ? AND ID <> CONNECTION_ID()',
          [`UPDATE \`${store.namespace}_rows\`%`],
        );
        for (const row of rows) await admin.query('KILL ?', [Number(row.id)]);
        killed = rows.length > 0;
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

  it('a stamped CALL whose PREPARE gets no answer (a new connection, a silent partition) gives up after queryTimeoutMs', async () => {
    // mysql2 times a prepared statement's EXECUTE only, not the PREPARE that comes first on
    // each connection: without the store's own timer this call waited for TCP to give up.
    let silent = false;
    const sockets = new Set<Socket>();
    const proxy = createServer((client) => {
      const upstream = connect(Number(new URL(url).port || 3306), new URL(url).hostname);
      sockets.add(client).add(upstream);
      client.on('data', (chunk) => {
        if (!silent) upstream.write(chunk);
      });
      upstream.on('data', (chunk) => client.write(chunk));
      const end = () => {
        client.destroy();
        upstream.destroy();
      };
      client.on('error', end).on('close', end);
      upstream.on('error', end).on('close', end);
    });
    await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
    const proxied = new URL(url);
    proxied.hostname = '127.0.0.1';
    proxied.port = String((proxy.address() as AddressInfo).port);
    try {
      const s = await openStore({
        uri: proxied.href,
        namespace: uniqueNamespace(),
        // Room for the setup's and the retry's statements on a busy machine; without the
        // fix the call still waits past the 5 s below.
        queryTimeoutMs: 1500,
        maxConnections: 1,
      });
      const counter = 'c';
      const request = {
        table: 'p',
        key: 'k',
        expected: null,
        state: Uint8Array.from([9, 0, 0, 0, 0, 0, 0, 0, 0, 120]),
      };
      silent = true; // the pool's one connection has prepared nothing yet
      const outcome = await Promise.race([
        s.checkAndSetStamped!(request, counter).then(
          () => 'resolved',
          (e: unknown) => e,
        ),
        new Promise((resolve) => setTimeout(() => resolve('still waiting after 5 s'), 5000)),
      ]);
      expect(outcome).toBeInstanceOf(StoreError);
      expect((outcome as StoreError).applied).toBe('unknown');
      expect((outcome as StoreError).message).toMatch(/timeout/i);
      // The connection was destroyed; a new one (heard again) prepares and runs the CALL.
      silent = false;
      const again = await s.checkAndSetStamped!(request, counter);
      expect(again.ok).toBe(true);
    } finally {
      for (const socket of sockets) socket.destroy();
      await new Promise((resolve) => proxy.close(resolve));
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
    const blocker = await admin.getConnection();
    try {
      // The row lock makes the store's UPDATE wait, as a silent network partition would.
      await blocker.query('BEGIN');
      await blocker.query(`SELECT 1 FROM \`${s.namespace}_rows\` WHERE tbl = ? AND row_key = ? FOR UPDATE`, [
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
        const [rows] = await admin.query<RowDataPacket[]>(
          'SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST WHERE INFO LIKE ?',
          [`UPDATE \`${s.namespace}_rows\`%`],
        );
        expect(Number(rows[0]!.n)).toBe(0);
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
    const error = await createMySqlStore({
      uri: 'mysql://root@127.0.0.1:1/test',
      namespace: uniqueNamespace(),
    }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
  });

  it('names the environment variable when the server is unreachable', async () => {
    expect(resolveMySqlUrl({})).toBe('mysql://root@127.0.0.1:3306/test');
    expect(resolveMySqlUrl({ [MYSQL_URL_ENV]: 'mysql://x@h:1/db' })).toBe('mysql://x@h:1/db');
    await expect(assertMySqlReachable('mysql://root:secret@127.0.0.1:1/test')).rejects.toThrow(
      /PERCOLATOR_MYSQL_URL/,
    );
    await expect(assertMySqlReachable('mysql://root:secret@127.0.0.1:1/test')).rejects.not.toThrow(/secret/);
  });
});

describe('mysql store: namespaces and lifecycle', () => {
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
      await expect(createMySqlStore({ uri: url, namespace })).rejects.toBeInstanceOf(InvalidArgumentError);
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
      `${one!.namespace}_version_blocks`,
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

  it('reads CAS outcomes right on a user pool without CLIENT_FOUND_ROWS (affected = changed rows)', async () => {
    const pool = createPool({
      uri: url,
      connectionLimit: 2,
      multipleStatements: true,
      flags: ['-FOUND_ROWS'],
    });
    const s = await openStore({ pool, namespace: uniqueNamespace() });
    try {
      const v1 = version(await s.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('a') }));
      // The flag is in effect: an UPDATE that matches but changes nothing reports 0 rows.
      const [noop] = await pool.query<ResultSetHeader>(
        `UPDATE \`${s.namespace}_rows\` SET notified = notified WHERE tbl = ? AND row_key = ?`,
        [Buffer.from('t'), Buffer.from('k')],
      );
      expect(noop.affectedRows).toBe(0);

      // Same state, same flag: only the version changes, and that is enough to count.
      const v2 = version(await s.checkAndSet({ table: 't', key: 'k', expected: v1, state: bytes('a') }));
      expect(await s.checkAndSet({ table: 't', key: 'k', expected: v1, state: bytes('b') })).toEqual({
        ok: false,
        current: { version: v2, state: bytes('a') },
      });
      const many = await s.checkAndSetMany([
        { table: 't', key: 'k', expected: v2, state: bytes('a') },
        { table: 't', key: 'other', expected: null, state: bytes('o') },
        { table: 't', key: 'stale', expected: v1, state: bytes('x') },
      ]);
      expect(many.map((r) => r.ok)).toEqual([true, true, false]);
      const v3 = version(many[0]!);
      expect(await s.checkAndSet({ table: 't', key: 'k', expected: v2, state: null })).toMatchObject({
        ok: false,
      });
      version(await s.checkAndSet({ table: 't', key: 'k', expected: v3, state: null }));
      expect(await s.read('t', 'k')).toBeNull();
      expect(text((await s.read('t', 'other'))!.state)).toBe('o');
    } finally {
      await s.dropNamespace();
      await pool.end();
    }
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
    await expect(openStore({ namespace, createSchema: false })).rejects.toThrow(/mysqlSchemaSql/);
    const sql = mysqlSchemaSql(namespace);
    expect(sql).toContain(`\`${namespace}_rows\``);
    expect(mysqlSchemaSql()).toContain('`percolator_rows`');
    const scripted = createPool({ uri: url, connectionLimit: 1, multipleStatements: true });
    await scripted.query(sql);
    await scripted.end();
    const s = await openStore({ namespace, createSchema: false });
    await s.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('v') });
    expect(text((await s.read('t', 'k'))!.state)).toBe('v');
  });

  it('documents in its README exactly the schema SQL it runs (the larger fixed-slot procedures left out, as it says)', () => {
    const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
    const larger = /_cas_slots(4|8|16)_v1`/;
    const statements = mysqlSchemaStatements();
    expect(statements.filter((sql) => larger.test(sql))).toHaveLength(3);
    expect(readme).toContain(`${statements.filter((sql) => !larger.test(sql)).join(';\n\n')};`);
    expect(readme).toContain('procedures of 4, 8 and 16 slots are left out here');
    // The full script is the statements, as a user would run it.
    expect(mysqlSchemaSql()).toBe(`${statements.join(';\n\n')};\n`);
  });

  it('close() leaves a pool the user passed open, and the store refuses calls afterwards', async () => {
    const pool = createPool({ uri: url, connectionLimit: 1 });
    const s = await createMySqlStore({ pool, namespace: store.namespace });
    await s.read('t', 'k');
    await s.close();
    await s.close();
    const [rows] = await pool.query<RowDataPacket[]>('SELECT 1 AS one');
    expect(rows).toEqual([{ one: 1 }]);
    await expect(s.read('t', 'k')).rejects.toBeInstanceOf(ClosedError);
    await pool.end();
  });

  it('works with a user pool without multipleStatements (batch sent one statement at a time)', async () => {
    const pool = createPool({ uri: url, connectionLimit: 2 });
    const s = await createMySqlStore({ pool, namespace: store.namespace, createSchema: false });
    try {
      const results = await s.checkAndSetMany([
        { table: 'single', key: 'a', expected: null, state: bytes('a') },
        { table: 'single', key: 'a', expected: null, state: bytes('b') },
      ]);
      expect(results[0]!.ok).toBe(true);
      expect(results[1]).toEqual({
        ok: false,
        current: { version: version(results[0]!), state: bytes('a') },
      });
    } finally {
      await s.close();
      await pool.end();
    }
  });
});
