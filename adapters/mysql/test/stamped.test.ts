// Twin of the PostgreSQL adapter's test of the same name: both check what each adapter does
// with its own driver (statements, failure mapping, timeouts, schema); the contract is the
// conformance suite's. Their test shapes match on purpose (`duplicates` pairs them); their
// setup is ./fixture.ts.
/**
 * The stamped check-and-set (capability stampedCheckAndSet) on a real server: layout of the
 * stamp, the shared counter, failure mapping, and the guarantee that makes it usable as a
 * commit point: whoever draws a later counter value and then reads sees the write.
 */
import { appliedStamp as applied, errorOf, stampOf } from '@percolator/conformance';
import { StoreError, writeStamp } from '@percolator/core';
import { mysqlSchemaStatements } from '@percolator/mysql';
import { startPrivateMariaDb } from '@percolator/testkit/private';
import { createPool, type Pool, type RowDataPacket } from 'mysql2/promise';
import { describe, expect, it, vi } from 'vitest';
import {
  admin,
  lockingSession,
  openStore,
  recordingPool,
  store,
  uniqueNamespace,
  useMySqlFixture,
  userPool,
} from './fixture.js';

const bytes = (text: string) => new TextEncoder().encode(text);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A stamped state: a format byte, the 8-byte slot (placeholder), then `tail`. */
const template = (tail: Uint8Array | string) =>
  Uint8Array.from([9, 0, 0, 0, 0, 0, 0, 0, 0, ...(typeof tail === 'string' ? bytes(tail) : tail)]);

/** InnoDB transactions of `namespace`'s store connections that wait for a lock. */
async function lockWaiters(): Promise<{ thread: number; query: string }[]> {
  const [rows] = await admin.query<RowDataPacket[]>(
    `SELECT trx_mysql_thread_id AS thread, COALESCE(trx_query, '') AS query
     FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'`,
  );
  return rows.map((r) => ({ thread: Number(r.thread), query: String(r.query) }));
}

/**
 * A statement inside the procedure, as INNODB_TRX shows it while it waits (the server
 * shows parameters as NAME_CONST('p_tbl', _binary'<table>' ...)), for one table.
 */
const waitingIn = (namespace: string, statement: 'SELECT COUNT' | 'UPDATE', table: string) => {
  const start =
    statement === 'UPDATE'
      ? new RegExp(`^UPDATE \`${namespace}_rows\``)
      : new RegExp(`^SELECT COUNT\\(\\*\\) INTO v_ok FROM \`${namespace}_rows\``);
  return { test: (query: string) => start.test(query) && query.includes(`_binary'${table}'`) };
};

async function untilLockWait(what: {
  test(query: string): boolean;
}): Promise<{ thread: number; query: string }> {
  let found: { thread: number; query: string } | undefined;
  await vi.waitFor(
    async () => {
      found = (await lockWaiters()).find((w) => what.test(w.query));
      expect(found).toBeDefined();
    },
    // INNODB_TRX is a cache that InnoDB refreshes only when nobody has read it for 100 ms.
    { timeout: 10_000, interval: 250 },
  );
  return found!;
}

/** Resolves to 'pending' if `promise` has not settled within `ms`. */
async function settledWithin<T>(promise: Promise<T>, ms: number): Promise<T | 'pending'> {
  return Promise.race([promise, sleep(ms).then(() => 'pending' as const)]);
}

useMySqlFixture('s');

describe('mysql stamped check-and-set: the step', () => {
  it('fails like checkAndSet, answers the current row, and does not advance the counter', async () => {
    const counter = 'st.fail';
    const v = applied(
      await store.checkAndSetStamped({ table: 'f', key: 'k', expected: null, state: template('a') }, counter),
    );
    const current = { version: v.version, state: writeStamp(template('a'), v.timestamp) };
    // Create over an existing row, stale version, a version this store never issues.
    expect(
      await store.checkAndSetStamped({ table: 'f', key: 'k', expected: null, state: template('b') }, counter),
    ).toEqual({ ok: false, current });
    const stale = await store.checkAndSetStamped(
      { table: 'f', key: 'k', expected: String(BigInt(v.version) - 1n), state: template('b') },
      counter,
    );
    expect(stale).toEqual({ ok: false, current });
    expect(
      await store.checkAndSetStamped(
        { table: 'f', key: 'k', expected: 'bogus', state: template('b') },
        counter,
      ),
    ).toEqual({ ok: false, current });
    // An update of an absent row.
    expect(
      await store.checkAndSetStamped(
        { table: 'f', key: 'gone', expected: v.version, state: template('b') },
        counter,
      ),
    ).toEqual({ ok: false, current: null });
    expect(await store.read('f', 'k')).toEqual(current);
    // None of the failures drew from the counter.
    expect(await store.incrementCounter(counter, 1)).toBe(v.timestamp + 1);
  });

  it('never splices table, key or counter text into SQL', async () => {
    const nasty = [
      "'); DROP TABLE x; --",
      "\\' OR 1=1 -- ",
      '`; SELECT 1; `',
      'nul\u0000byte',
      '😀 emoji',
      '?',
      '%s $1 :name @v',
    ];
    for (const [i, text] of nasty.entries()) {
      const table = `t.${i}_-`;
      const r = applied(
        await store.checkAndSetStamped({ table, key: text, expected: null, state: template(text) }, text),
      );
      expect(r.timestamp).toBe(1);
      expect(await store.read(table, text)).toEqual({
        version: r.version,
        state: writeStamp(template(text), 1),
      });
      expect(await store.incrementCounter(text, 1)).toBe(2);
    }
    const [counters] = await admin.query<RowDataPacket[]>(
      `SELECT COUNT(*) AS n FROM \`${store.namespace}_counters\` WHERE name IN (?)`,
      [nasty.map((t) => Buffer.from(t, 'utf8'))],
    );
    expect(Number(counters[0]!.n)).toBe(nasty.length);
  });

  it('works on a user pool without CLIENT_FOUND_ROWS and without multipleStatements', async () => {
    const pool = userPool({ flags: ['-FOUND_ROWS'] });
    const s = await openStore({ pool, namespace: store.namespace, createSchema: false });
    expect(s.capabilities.stampedCheckAndSet).toBe(true);
    const counter = 'st.flags';
    const v1 = applied(
      await s.checkAndSetStamped({ table: 'fr', key: 'k', expected: null, state: template('a') }, counter),
    );
    // Same state again: only the version (and the stamp) change.
    const v2 = applied(
      await s.checkAndSetStamped(
        { table: 'fr', key: 'k', expected: v1.version, state: template('a') },
        counter,
      ),
    );
    expect(v2.timestamp).toBe(v1.timestamp + 1);
    expect(
      await s.checkAndSetStamped(
        { table: 'fr', key: 'k', expected: v1.version, state: template('b') },
        counter,
      ),
    ).toEqual({
      ok: false,
      current: { version: v2.version, state: writeStamp(template('a'), v2.timestamp) },
    });
    expect(
      await s.checkAndSetStamped({ table: 'fr', key: 'k', expected: null, state: template('c') }, counter),
    ).toMatchObject({ ok: false });
    expect(await s.incrementCounter(counter, 1)).toBe(v2.timestamp + 1);
  });

  it('lets exactly one of many concurrent stamped CAS win, and never deadlocks on hot rows', async () => {
    const counter = 'st.hot';
    const other = await openStore({ namespace: store.namespace, createSchema: false, maxConnections: 6 });
    for (const key of ['h0', 'h1']) {
      await store.checkAndSetStamped({ table: 'hot', key, expected: null, state: template('0') }, counter);
    }
    const wins = new Map<string, number[]>();
    const worker = async (id: number) => {
      const s = id % 2 === 0 ? store : other;
      const key = `h${id % 2}`;
      for (let i = 0; i < 15; i++) {
        const row = (await s.read('hot', key))!;
        const r = await s.checkAndSetStamped(
          { table: 'hot', key, expected: row.version, state: template(`${id}.${i}`), notified: i % 2 === 0 },
          counter,
        );
        if (r.ok) wins.set(key, [...(wins.get(key) ?? []), r.timestamp!]);
        if (i % 3 === 0) await s.incrementCounter(counter, 1);
      }
    };
    // Any StoreError (a deadlock, a lock wait timeout) fails this.
    await Promise.all(Array.from({ length: 8 }, (_, id) => worker(id)));
    for (const key of ['h0', 'h1']) {
      const stamps = wins.get(key) ?? [];
      expect(stamps.length).toBeGreaterThan(0);
      expect(new Set(stamps).size).toBe(stamps.length);
      expect(stampOf((await store.read('hot', key))!.state)).toBe(Math.max(...stamps));
    }
  });
});

describe('mysql stamped check-and-set: a later counter value implies the write is visible', () => {
  // The race itself (whoever draws later sees the write) is the conformance suite's
  // (store: checkAndSetStamped draws a timestamp ...), run on every store that declares it.
  it('makes a later incrementCounter wait until the stamped write has committed', async () => {
    // White box: the stamped transaction holds the counter row from its increment to its
    // COMMIT. Hold it there by making its final row write wait: a locking scan of the
    // `notified` index (another session) blocks the new index entry notified = TRUE.
    const counter = 'st.wait';
    const base = await store.incrementCounter(counter, 1);
    const v = (await store.checkAndSet({ table: 'wait', key: 'k', expected: null, state: template('old') }))!;
    if (!v.ok) throw new Error('setup failed');
    const other = await openStore({ namespace: store.namespace, createSchema: false });
    const blocker = await lockingSession(
      `SELECT row_key FROM \`${store.namespace}_rows\` FORCE INDEX (\`${store.namespace}_rows_notified\`)
       WHERE tbl = ? AND notified = TRUE FOR UPDATE`,
      [Buffer.from('wait')],
    );
    try {
      const stamped = store.checkAndSetStamped(
        { table: 'wait', key: 'k', expected: v.version, state: template('new'), notified: true },
        counter,
      );
      stamped.catch(() => {});
      await untilLockWait(waitingIn(store.namespace, 'UPDATE', 'wait'));
      // The stamped transaction has drawn base + 1 and holds the counter: a later draw waits.
      const later = other.incrementCounter(counter, 1);
      later.catch(() => {});
      expect(await settledWithin(later, 500)).toBe('pending');
      // Nothing of it is visible yet: neither the row nor the counter value.
      expect(await other.read('wait', 'k')).toEqual({ version: v.version, state: template('old') });
      const [values] = await admin.query<RowDataPacket[]>(
        `SELECT CAST(value AS CHAR) AS value FROM \`${store.namespace}_counters\` WHERE name = ?`,
        [Buffer.from(counter)],
      );
      expect(Number(values[0]!.value)).toBe(base);
      await blocker.query('ROLLBACK');
      const r = applied(await stamped);
      expect(r.timestamp).toBe(base + 1);
      expect(await later).toBe(base + 2);
      // Drawn later, so the read that follows sees the write.
      expect(await other.read('wait', 'k')).toEqual({
        version: r.version,
        state: writeStamp(template('new'), base + 1),
      });
    } finally {
      await blocker.query('ROLLBACK').catch(() => {});
      blocker.release();
    }
  });

  it('a stamped CAS waiting for a busy row does not hold up the counter', async () => {
    const counter = 'st.busy';
    const v = (await store.checkAndSet({ table: 'busy', key: 'k', expected: null, state: template('old') }))!;
    if (!v.ok) throw new Error('setup failed');
    const blocker = await admin.getConnection();
    try {
      await blocker.query('BEGIN');
      await blocker.query(
        `SELECT 1 FROM \`${store.namespace}_rows\` WHERE tbl = ? AND row_key = ? FOR UPDATE`,
        [Buffer.from('busy'), Buffer.from('k')],
      );
      const stamped = store.checkAndSetStamped(
        { table: 'busy', key: 'k', expected: v.version, state: template('new') },
        counter,
      );
      stamped.catch(() => {});
      await untilLockWait(waitingIn(store.namespace, 'SELECT COUNT', 'busy'));
      const drawn = await settledWithin(store.incrementCounter(counter, 1), 2_000);
      expect(typeof drawn).toBe('number');
      await blocker.query('ROLLBACK');
      expect(applied(await stamped).timestamp).toBe((drawn as number) + 1);
    } finally {
      await blocker.query('ROLLBACK').catch(() => {});
      blocker.release();
    }
  });
});

describe('mysql stamped check-and-set: failures', () => {
  it('reports a connection killed mid-call as StoreError unknown; nothing was committed', async () => {
    const counter = 'st.kill';
    const v = (await store.checkAndSet({ table: 'kill', key: 'k', expected: null, state: template('0') }))!;
    if (!v.ok) throw new Error('setup failed');
    const before = await store.incrementCounter(counter, 1);
    const blocker = await admin.getConnection();
    try {
      await blocker.query('BEGIN');
      await blocker.query(
        `SELECT 1 FROM \`${store.namespace}_rows\` WHERE tbl = ? AND row_key = ? FOR UPDATE`,
        [Buffer.from('kill'), Buffer.from('k')],
      );
      const pending = store.checkAndSetStamped(
        { table: 'kill', key: 'k', expected: v.version, state: template('1') },
        counter,
      );
      pending.catch(() => {});
      const waiter = await untilLockWait(waitingIn(store.namespace, 'SELECT COUNT', 'kill'));
      await admin.query('KILL ?', [waiter.thread]);
      const error = await errorOf(pending);
      expect(error).toBeInstanceOf(StoreError);
      expect((error as StoreError).applied).toBe('unknown');
    } finally {
      await blocker.query('ROLLBACK');
      blocker.release();
    }
    // Killed before it drew: the row and the counter are as they were.
    expect(await store.read('kill', 'k')).toEqual({ version: v.version, state: template('0') });
    expect(await store.incrementCounter(counter, 1)).toBe(before + 1);
  });

  it('a call interrupted by max_statement_time is StoreError unknown (the timer may fire during its COMMIT)', async () => {
    // MariaDB answers 1969 whether the interrupted CALL committed or not: a timer that fires
    // during the procedure's COMMIT leaves it committed. Here it fires while the call waits
    // for a row another session holds (nothing drawn, nothing written), which makes the
    // error certain; the answer must still not claim "not applied".
    const pool = userPool({ connectionLimit: 1, multipleStatements: true });
    (
      pool as unknown as { pool: { on(e: string, f: (c: { query(q: string): void }) => void): void } }
    ).pool.on('connection', (connection) => connection.query('SET SESSION max_statement_time = 0.3'));
    const timed = await openStore({ pool, namespace: store.namespace, createSchema: false });
    const v = (await store.checkAndSet({ table: 'timer', key: 'k', expected: null, state: template('0') }))!;
    if (!v.ok) throw new Error('setup failed');
    const counter = 'st.timer';
    const before = await store.incrementCounter(counter, 1);
    const blocker = await lockingSession(
      `SELECT 1 FROM \`${store.namespace}_rows\` WHERE tbl = ? AND row_key = ? FOR UPDATE`,
      [Buffer.from('timer'), Buffer.from('k')],
    );
    try {
      const single = await errorOf(
        timed.checkAndSetStamped(
          { table: 'timer', key: 'k', expected: v.version, state: template('1') },
          counter,
        ),
      );
      const many = await errorOf(
        timed.checkAndSetStampedMany(
          [
            { table: 'timer', key: 'a', expected: null, state: template('a') },
            { table: 'timer', key: 'k', expected: v.version, state: template('2') },
          ],
          counter,
        ),
      );
      for (const error of [single, many]) {
        expect(error).toBeInstanceOf(StoreError);
        expect((error as StoreError).applied).toBe('unknown');
        expect(String((error as StoreError).cause)).toMatch(/max_statement_time/);
      }
    } finally {
      await blocker.query('ROLLBACK');
      blocker.release();
    }
    expect(await store.read('timer', 'k')).toEqual({ version: v.version, state: template('0') });
    expect(await store.read('timer', 'a')).toBeNull();
    expect(await store.incrementCounter(counter, 1)).toBe(before + 1);
  });

  it('an error after the increment rolls everything back and is StoreError no', async () => {
    // A lock wait timeout of 1 s on the store's one connection, and the final row write held
    // up (as in the white-box test above) after the counter was drawn. MariaDB deems that
    // error fatal and skips the procedure's handler: the store must roll back itself.
    const pool = userPool({ connectionLimit: 1 });
    pool.on('connection', (connection) => {
      connection.query('SET SESSION innodb_lock_wait_timeout = 1');
    });
    const s = await openStore({ pool, namespace: store.namespace, createSchema: false });
    const counter = 'st.timeout';
    const v = (await s.checkAndSet({ table: 'lwt', key: 'k', expected: null, state: template('0') }))!;
    if (!v.ok) throw new Error('setup failed');
    const before = await s.incrementCounter(counter, 1);
    const blocker = await lockingSession(
      `SELECT row_key FROM \`${s.namespace}_rows\` FORCE INDEX (\`${s.namespace}_rows_notified\`)
       WHERE tbl = ? AND notified = TRUE FOR UPDATE`,
      [Buffer.from('lwt')],
    );
    try {
      const error = await errorOf(
        s.checkAndSetStamped(
          { table: 'lwt', key: 'k', expected: v.version, state: template('1'), notified: true },
          counter,
        ),
      );
      expect(error).toBeInstanceOf(StoreError);
      expect((error as StoreError).applied).toBe('no');
      expect((error as StoreError).message).toMatch(/lock wait timeout/i);
    } finally {
      await blocker.query('ROLLBACK');
      blocker.release();
    }
    expect(await s.read('lwt', 'k')).toEqual({ version: v.version, state: template('0') });
    // The value it drew was rolled back with the write: the next draw (on the same
    // connection) gets it, and that connection is in no transaction.
    expect(await s.incrementCounter(counter, 1)).toBe(before + 1);
    const [state] = await pool.query<RowDataPacket[]>('SELECT @@in_transaction AS open');
    expect(Number(state[0]!.open)).toBe(0);
  });

  it('gives up after queryTimeoutMs: StoreError unknown (the call may still commit)', async () => {
    const s = await openStore({ namespace: store.namespace, createSchema: false, queryTimeoutMs: 300 });
    const counter = 'st.slow';
    const v = (await s.checkAndSet({ table: 'slow', key: 'k', expected: null, state: template('0') }))!;
    if (!v.ok) throw new Error('setup failed');
    const blocker = await admin.getConnection();
    try {
      await blocker.query('BEGIN');
      await blocker.query(`SELECT 1 FROM \`${s.namespace}_rows\` WHERE tbl = ? AND row_key = ? FOR UPDATE`, [
        Buffer.from('slow'),
        Buffer.from('k'),
      ]);
      const error = await errorOf(
        s.checkAndSetStamped({ table: 'slow', key: 'k', expected: v.version, state: template('1') }, counter),
      );
      expect(error).toBeInstanceOf(StoreError);
      expect((error as StoreError).applied).toBe('unknown');
      expect((error as StoreError).message).toMatch(/timeout/i);
    } finally {
      await blocker.query('ROLLBACK');
      blocker.release();
    }
    // The abandoned call still runs once the lock is free: wait until the server is done.
    await vi.waitFor(
      async () => {
        const [rows] = await admin.query<RowDataPacket[]>(
          'SELECT COUNT(*) AS n FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id <> CONNECTION_ID()' +
            " AND LOCATE(?, COALESCE(trx_query, '')) > 0",
          [`\`${s.namespace}_`],
        );
        expect(Number(rows[0]!.n)).toBe(0);
      },
      { timeout: 10_000, interval: 250 },
    );
    const row = (await s.read('slow', 'k'))!;
    if (row.version === v.version) expect(row.state).toEqual(template('0'));
    else expect(row.state).toEqual(writeStamp(template('1'), stampOf(row.state)));
  });

  it('a dropped namespace is StoreError no; a hand-made schema without the procedure declares no stamped CAS', async () => {
    const namespace = uniqueNamespace();
    const s = await openStore({ namespace });
    await s.dropNamespace();
    const error = await errorOf(
      s.checkAndSetStamped({ table: 't', key: 'k', expected: null, state: template('x') }, 'c'),
    );
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');

    // An older script: the tables without the procedure.
    const statements = mysqlSchemaStatements(namespace);
    const isCas = (sql: string) =>
      sql.startsWith(`CREATE PROCEDURE IF NOT EXISTS \`${namespace}_stamped_cas_`);
    const procedure = statements.filter(isCas);
    expect(procedure).toHaveLength(1);
    for (const sql of statements.filter((sql) => !isCas(sql))) await admin.query(sql);
    const old = await openStore({ namespace, createSchema: false });
    expect(old.capabilities.stampedCheckAndSet).toBe(false);
    // Called anyway: refused before sending, not retryable (as the other stamped methods).
    const refused = await errorOf(
      old.checkAndSetStamped({ table: 't', key: 'k', expected: null, state: template('x') }, 'c'),
    );
    expect(refused).toBeInstanceOf(StoreError);
    expect(refused).toMatchObject({ applied: 'no', retryable: false });
    expect((refused as Error).message).toMatch(/lacks/);
    await admin.query(procedure[0]!);
    const upgraded = await openStore({ namespace, createSchema: false });
    expect(upgraded.capabilities.stampedCheckAndSet).toBe(true);
    applied(
      await upgraded.checkAndSetStamped({ table: 't', key: 'k', expected: null, state: template('x') }, 'c'),
    );
  });
});

describe('mysql stamped procedures: sent as prepared statements', () => {
  /**
   * The PREPAREs of the recording pool's one connection so far (its session's count: the
   * server's global one counts every other client's too).
   */
  const prepares = async (pool: Pool) => {
    const [rows] = await pool.query<RowDataPacket[]>("SHOW SESSION STATUS LIKE 'Com_stmt_prepare'");
    return Number(rows[0]!.Value);
  };

  it('every CALL is a prepared statement, prepared once per connection; reads stay plain queries', async () => {
    const sent: { sql: string; method: string }[] = [];
    const pool = recordingPool(({ sql, method }) => sent.push({ sql, method }));
    const s = await openStore({ pool, namespace: store.namespace, createSchema: false });
    const key = `prepared-${Date.now()}`;
    const round = async (expected: [string | null, string | null, string | null]) => {
      const one = applied(
        await s.checkAndSetStamped(
          { table: 't', key: `${key}-1`, expected: expected[0], state: template('1') },
          'prepared',
        ),
      );
      const many = await s.checkAndSetStampedMany(
        [
          { table: 't', key: `${key}-2`, expected: expected[1], state: template('2') },
          { table: 't', key: `${key}-3`, expected: expected[2], state: template('3') },
        ],
        'prepared',
      );
      if (!many.ok) throw new Error('the stamped step of two rows was refused');
      const read = await s.readStamped!([{ table: 't', key: `${key}-1` }], 'prepared');
      expect(read.rows[0]?.version).toBe(one.version);
      const peeked = await s.readPeeked!([{ table: 't', key: `${key}-2` }], 'prepared');
      expect(peeked.rows[0]?.version).toBe(many.versions[0]);
      return [one.version, many.versions[0]!, many.versions[1]!] as [string, string, string];
    };
    try {
      const before = await prepares(pool);
      const versions = await round([null, null, null]);
      const afterFirst = await prepares(pool);
      // Three procedures (the one-row CAS, the 2-slot step, the stamped read), once each.
      expect(afterFirst - before).toBe(3);
      sent.length = 0;
      await round(versions);
      expect(await prepares(pool)).toBe(afterFirst);
      const calls = sent.filter(({ sql }) => sql.startsWith('CALL '));
      expect(calls).toHaveLength(3);
      for (const call of calls) expect(call.method).toBe('execute');
      const reads = sent.filter(({ sql }) => !sql.startsWith('CALL '));
      expect(reads.length).toBeGreaterThan(0);
      for (const read of reads) expect(read.method).toBe('query');
    } finally {
      await s.close(); // the fixture ends the pool
    }
  });

  it('at the server cap on prepared statements, the CALL goes as a plain query, once, and every later one too', async () => {
    // The cap is a global setting: a server of the test's own, never the shared one.
    const server = await startPrivateMariaDb();
    const sent: { sql: string; method: string }[] = [];
    let s: Awaited<ReturnType<typeof openStore>> | undefined;
    const key = `capped-${Date.now()}`;
    const counter = `capped-${Date.now()}`;
    const own = createPool({ uri: server.url, connectionLimit: 1 });
    const pool = recordingPool(({ sql, method }) => sent.push({ sql, method }), server.url);
    try {
      s = await openStore({ pool, namespace: uniqueNamespace() });
      await own.query('SET GLOBAL max_prepared_stmt_count = 0');
      const first = applied(
        await s.checkAndSetStamped({ table: 't', key, expected: null, state: template('1') }, counter),
      );
      expect(first.timestamp).toBe(1);
      // The refused PREPARE ran nothing: the counter moved once, for the one write.
      expect(sent.filter(({ sql }) => sql.startsWith('CALL ')).map(({ method }) => method)).toEqual([
        'execute',
        'query',
      ]);
      sent.length = 0;
      const second = applied(
        await s.checkAndSetStamped(
          { table: 't', key, expected: first.version, state: template('2') },
          counter,
        ),
      );
      expect(second.timestamp).toBe(2);
      expect(sent.filter(({ sql }) => sql.startsWith('CALL ')).map(({ method }) => method)).toEqual([
        'query',
      ]);
      const row = await s.read('t', key);
      expect(row?.version).toBe(second.version);
      expect(stampOf(row!.state)).toBe(2);
    } finally {
      await s?.close();
      await pool.end();
      await own.end();
      await server.destroy();
    }
  }, 120_000);
});
