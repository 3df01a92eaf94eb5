// Twin of the PostgreSQL adapter's test of the same name: both check what each adapter does
// with its own driver (statements, failure mapping, timeouts, schema); the contract is the
// conformance suite's. Their setup and test shapes match on purpose (`duplicates` pairs them).
/**
 * readStamped (capability stampedRead) on a real server: the same answers as readMany, the
 * timestamp from the counter incrementCounter and checkAndSetStamped use, the schema's
 * procedure, failure mapping, no text spliced into SQL, and the property the core relies
 * on: a read whose timestamp is above a stamp sees the stamped write. That part also runs
 * against a single-transaction version (its read view created before the draw waited) to
 * show that the checks do catch a stale read.
 */

import { randomBytes } from 'node:crypto';
import { errorOf, appliedStamp as stamped, stampedRace } from '@percolator/conformance';
import {
  type CasResult,
  type RowRef,
  STAMP_OFFSET,
  type StoredRow,
  StoreError,
  writeStamp,
} from '@percolator/core';
import {
  dropMySqlNamespace,
  listMySqlNamespaces,
  type MySqlStore,
  mysqlNames,
  mysqlSchemaSql,
  mysqlSchemaStatements,
} from '@percolator/mysql';
import type { Pool, RowDataPacket } from 'mysql2/promise';
import { describe, expect, it, vi } from 'vitest';
import {
  admin,
  lockingSession,
  openStore,
  recordingPool,
  store,
  uniqueNamespace,
  url,
  useMySqlFixture,
  userPool,
} from './fixture.js';

const bytes = (text: string) => new TextEncoder().encode(text);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A stamped state: a format byte, the 8-byte slot (placeholder), then `tail`. */
const template = (tail: string) => Uint8Array.from([9, 0, 0, 0, 0, 0, 0, 0, 0, ...bytes(tail)]);
const _stampOf = (state: Uint8Array) =>
  Number(new DataView(state.buffer, state.byteOffset, state.byteLength).getBigUint64(STAMP_OFFSET));

type StampedRead = (
  rows: readonly RowRef[],
  counter: string,
) => Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }>;

function version(result: CasResult): string {
  if (!result.ok) throw new Error(`expected the CAS to apply: ${JSON.stringify(result)}`);
  return result.version;
}

/** InnoDB transactions that wait for a lock, with the statement they wait in. */
async function lockWaiters(): Promise<{ thread: number; query: string }[]> {
  const [rows] = await admin.query<RowDataPacket[]>(
    `SELECT trx_mysql_thread_id AS thread, COALESCE(trx_query, '') AS query
     FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'`,
  );
  return rows.map((r) => ({ thread: Number(r.thread), query: String(r.query) }));
}

async function untilLockWait(test: (query: string) => boolean): Promise<{ thread: number; query: string }> {
  let found: { thread: number; query: string } | undefined;
  await vi.waitFor(
    async () => {
      found = (await lockWaiters()).find((w) => test(w.query));
      expect(found).toBeDefined();
    },
    // INNODB_TRX is a cache that InnoDB refreshes only when nobody has read it for 100 ms.
    { timeout: 10_000, interval: 250 },
  );
  return found!;
}

/** The counter increment (in either procedure, or the test's variant) waiting on the counter row. */
const waitingOnCounter = (namespace: string) => (query: string) =>
  query.startsWith(`INSERT INTO \`${namespace}_counters\``);

/** Resolves to 'pending' if `promise` has not settled within `ms`. */
async function settledWithin<T>(promise: Promise<T>, ms: number): Promise<T | 'pending'> {
  return Promise.race([promise, sleep(ms).then(() => 'pending' as const)]);
}

/**
 * The WRONG way, kept to prove the checks below can fail: the draw and the read in ONE
 * transaction whose read view is created before the draw (START TRANSACTION WITH
 * CONSISTENT SNAPSHOT, then the increment, then the SELECT; one round trip as a
 * multi-statement query). The increment waits for a stamped CAS holding the counter row
 * and then draws above its stamp, but the SELECT reads from the view made before that
 * CAS committed.
 */
function singleTransactionRead(pool: Pool, namespace: string): StampedRead {
  const n = mysqlNames(namespace);
  const text = `START TRANSACTION WITH CONSISTENT SNAPSHOT;
INSERT INTO ${n.counters} (name, value) VALUES (?, LAST_INSERT_ID(1))
ON DUPLICATE KEY UPDATE value = LAST_INSERT_ID(value + 1);
SELECT 0 AS i, CAST(LAST_INSERT_ID() AS CHAR) AS version, NULL AS state
UNION ALL
SELECT r.i, CAST(t.version AS CHAR), t.state
FROM JSON_TABLE(?, '$[*]' COLUMNS (
  i FOR ORDINALITY, tbl_hex VARCHAR(128) PATH '$[0]', key_hex VARCHAR(2048) PATH '$[1]'
)) AS r
STRAIGHT_JOIN ${n.rows} AS t ON t.tbl = UNHEX(r.tbl_hex) AND t.row_key = UNHEX(r.key_hex);
COMMIT`;
  return async (refs, counter) => {
    const json = JSON.stringify(
      refs.map((r) => [Buffer.from(r.table).toString('hex'), Buffer.from(r.key).toString('hex')]),
    );
    const [results] = await pool.query<RowDataPacket[][]>(text, [Buffer.from(counter), json]);
    let timestamp = 0;
    const rows: (StoredRow | null)[] = refs.map(() => null);
    for (const row of results[2]!) {
      const i = Number(row.i);
      if (i === 0) timestamp = Number(row.version);
      else rows[i - 1] = { version: String(row.version), state: new Uint8Array(row.state as Buffer) };
    }
    return { timestamp, rows };
  };
}

useMySqlFixture('rs');

describe('mysql readStamped: the step', () => {
  it('declares stampedRead', () => {
    expect(store.capabilities.stampedRead).toBe(true);
    expect(typeof store.readStamped).toBe('function');
  });

  it('returns timestamps near 2^53 exactly, and refuses one beyond it', async () => {
    const counter = 'rs.big';
    await store.incrementCounter(counter, Number.MAX_SAFE_INTEGER - 2);
    expect((await store.readStamped([], counter)).timestamp).toBe(Number.MAX_SAFE_INTEGER - 1);
    expect((await store.readStamped([], counter)).timestamp).toBe(Number.MAX_SAFE_INTEGER);
    await expect(store.readStamped([], counter)).rejects.toThrow(/MAX_SAFE_INTEGER/);
  });

  it('leaves the connection in no transaction (a pool with autocommit off is refused: session.test.ts)', async () => {
    const pool = userPool({ connectionLimit: 1 });
    const s = await openStore({ pool, namespace: store.namespace, createSchema: false });
    await store.checkAndSet({ table: 'ac', key: 'k', expected: null, state: bytes('v1') });
    const first = await s.readStamped([{ table: 'ac', key: 'k' }], 'rs.ac');
    expect(first.rows[0]?.state).toEqual(bytes('v1'));
    const [state] = await pool.query<RowDataPacket[]>('SELECT @@in_transaction AS open');
    expect(Number(state[0]!.open)).toBe(0);
    // The draw was committed, and a later write is seen by the next stamped read.
    const [values] = await admin.query<RowDataPacket[]>(
      `SELECT CAST(value AS CHAR) AS value FROM \`${store.namespace}_counters\` WHERE name = ?`,
      [Buffer.from('rs.ac')],
    );
    expect(values.map((v) => v.value)).toEqual([String(first.timestamp)]);
    const row = (await store.read('ac', 'k'))!;
    await store.checkAndSet({ table: 'ac', key: 'k', expected: row.version, state: bytes('v2') });
    const second = await s.readStamped([{ table: 'ac', key: 'k' }], 'rs.ac');
    expect(second.timestamp).toBe(first.timestamp + 1);
    expect(second.rows[0]?.state).toEqual(bytes('v2'));
  });
});

describe('mysql readStamped: SQL text and schema', () => {
  it('sends one fixed CALL: no table, key or counter text is spliced in', async () => {
    const texts: { sql: string; values: unknown[] }[] = [];
    const pool = recordingPool((query) => texts.push(query));
    const s = await openStore({ pool, namespace: store.namespace, createSchema: false });
    const hostile = [
      { table: 'x.y-z_1', key: `'); DROP TABLE x; --`, counter: `c'); SELECT 1; --` },
      { table: 'Zq9.Tbl-X', key: '?? \\" ] [ "\u0000 `q` \\ 😀', counter: '"] , [ ? \u0000 😀' },
    ];
    const sent: string[] = [];
    for (const { table, key, counter } of hostile) {
      await s.checkAndSet({ table, key, expected: null, state: bytes(key) });
      texts.length = 0;
      const r = await s.readStamped([{ table, key }], counter);
      expect(r.rows).toEqual([{ version: expect.any(String), state: bytes(key) }]);
      expect(r.timestamp).toBe(1);
      expect(texts).toHaveLength(1);
      for (const fragment of [table, key, counter, "'); DROP", '😀', '\u0000']) {
        expect(texts[0]!.sql).not.toContain(fragment);
      }
      expect(texts[0]!.values).toEqual([
        Buffer.from(counter),
        JSON.stringify([[Buffer.from(table).toString('hex'), Buffer.from(key).toString('hex')]]),
      ]);
      sent.push(texts[0]!.sql);
    }
    expect(sent[0]).toBe(sent[1]);
    expect(sent[0]).toBe(`CALL ${mysqlNames(store.namespace).stampedRead}(?, ?)`);
  });

  it('is in the schema SQL, created once with the CAS procedure, listed and dropped with the namespace', async () => {
    const names = mysqlNames(store.namespace);
    const sql = mysqlSchemaSql(store.namespace);
    expect(sql).toContain(`CREATE PROCEDURE IF NOT EXISTS ${names.stampedRead}(`);
    const routine = async (name: string) => {
      const [rows] = await admin.query<RowDataPacket[]>(
        `SELECT SECURITY_TYPE AS security, SQL_DATA_ACCESS AS access, CAST(CREATED AS CHAR) AS created
         FROM information_schema.ROUTINES
         WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_TYPE = 'PROCEDURE' AND ROUTINE_NAME = ?`,
        [name],
      );
      return rows.map((r) => ({ ...r }));
    };
    const first = await routine(names.stampedReadRoutine);
    expect(first).toEqual([
      { security: 'INVOKER', access: 'MODIFIES SQL DATA', created: expect.any(String) },
    ]);
    await openStore({ namespace: store.namespace });
    expect(await routine(names.stampedReadRoutine)).toEqual(first);

    const namespace = uniqueNamespace();
    const s = await openStore({ namespace });
    const listed = (await listMySqlNamespaces({ uri: url })).find((n) => n.namespace === namespace);
    expect(listed?.objects).toEqual([
      `${namespace}_cas_slots16_v1`,
      `${namespace}_cas_slots2_v1`,
      `${namespace}_cas_slots4_v1`,
      `${namespace}_cas_slots8_v1`,
      `${namespace}_cas_stamped_many_v6`,
      `${namespace}_counters`,
      `${namespace}_rows`,
      `${namespace}_stamped_cas_v1`,
      `${namespace}_stamped_read_v1`,
      `${namespace}_version_blocks`,
    ]);
    // dropNamespace drops it with the tables.
    await s.dropNamespace();
    expect(await routine(`${namespace}_stamped_read_v1`)).toEqual([]);
    expect(await routine(`${namespace}_stamped_cas_v1`)).toEqual([]);
    // So does the operators' drop.
    const other = await openStore({ namespace: uniqueNamespace() });
    const dropped = await dropMySqlNamespace(other.namespace, { uri: url });
    expect(dropped?.objects).toContain(`${other.namespace}_stamped_read_v1`);
    expect(await routine(`${other.namespace}_stamped_read_v1`)).toEqual([]);
  });

  it('a hand-made schema without the procedure declares no stamped read; readStamped refuses; adding it enables it', async () => {
    const namespace = uniqueNamespace();
    const names = mysqlNames(namespace);
    const statements = mysqlSchemaStatements(namespace);
    const procedure = statements.filter((sql) => sql.includes(names.stampedRead));
    expect(procedure).toHaveLength(1);
    // An older script: everything but the stamped read procedure.
    for (const sql of statements.filter((sql) => !sql.includes(names.stampedRead))) await admin.query(sql);
    const old = await openStore({ namespace, createSchema: false });
    expect(old.capabilities.stampedRead).toBe(false);
    expect(old.capabilities.stampedCheckAndSet).toBe(true);
    await old.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('v') });
    const error = await errorOf(old.readStamped([{ table: 't', key: 'k' }], 'c'));
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    expect((error as StoreError).retryable).toBe(false);
    expect((error as StoreError).message).toMatch(/mysqlSchemaSql/);
    // Opened with createSchema (the default): the procedure is created, data untouched.
    const upgraded = await openStore({ namespace });
    expect(upgraded.capabilities.stampedRead).toBe(true);
    expect((await upgraded.readStamped([{ table: 't', key: 'k' }], 'c')).rows[0]?.state).toEqual(bytes('v'));
    expect((await openStore({ namespace, createSchema: false })).capabilities.stampedRead).toBe(true);
  });
});

describe('mysql readStamped: failures', () => {
  /** Holds the counter row's lock from another connection, so readStamped waits on it. */
  async function holdCounter(s: MySqlStore, counter: string) {
    await s.incrementCounter(counter, 1);
    const blocker = await admin.getConnection();
    await blocker.query('BEGIN');
    await blocker.query(`SELECT 1 FROM \`${s.namespace}_counters\` WHERE name = ? FOR UPDATE`, [
      Buffer.from(counter),
    ]);
    return blocker;
  }

  it('reports a connection killed mid-call as StoreError applied=no, retryable (a read)', async () => {
    const s = await openStore({ namespace: uniqueNamespace() });
    const blocker = await holdCounter(s, 'rs.kill');
    try {
      const pending = s.readStamped([{ table: 'k', key: 'k' }], 'rs.kill');
      pending.catch(() => {});
      const waiter = await untilLockWait(waitingOnCounter(s.namespace));
      await admin.query('KILL ?', [waiter.thread]);
      const error = await errorOf(pending);
      expect(error).toBeInstanceOf(StoreError);
      expect((error as StoreError).applied).toBe('no');
      expect((error as StoreError).retryable).toBe(true);
    } finally {
      await blocker.query('ROLLBACK');
      blocker.release();
    }
    // The store works again; the killed draw did not commit.
    expect((await s.readStamped([], 'rs.kill')).timestamp).toBe(2);
  });

  it('gives up after queryTimeoutMs with StoreError applied=no', async () => {
    const s = await openStore({ namespace: uniqueNamespace(), queryTimeoutMs: 300 });
    const blocker = await holdCounter(s, 'rs.slow');
    let error: unknown;
    try {
      error = await errorOf(s.readStamped([{ table: 'k', key: 'k' }], 'rs.slow'));
    } finally {
      await blocker.query('ROLLBACK');
      blocker.release();
    }
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    expect((error as StoreError).message).toMatch(/timeout/i);
  });

  it('a lock wait timeout on the counter is StoreError no, and the connection is rolled back and reused', async () => {
    const pool = userPool({ connectionLimit: 1 });
    pool.on('connection', (connection) => {
      connection.query('SET SESSION innodb_lock_wait_timeout = 1');
    });
    const s = await openStore({ pool, namespace: store.namespace, createSchema: false });
    const blocker = await holdCounter(s, 'rs.lwt');
    let error: unknown;
    try {
      error = await errorOf(s.readStamped([{ table: 'k', key: 'k' }], 'rs.lwt'));
    } finally {
      await blocker.query('ROLLBACK');
      blocker.release();
    }
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    expect((error as StoreError).message).toMatch(/lock wait timeout/i);
    const [state] = await pool.query<RowDataPacket[]>('SELECT @@in_transaction AS open');
    expect(Number(state[0]!.open)).toBe(0);
    expect((await s.readStamped([], 'rs.lwt')).timestamp).toBe(2);
  });

  it('maps a server error to StoreError applied=no (the procedure gone under a running store)', async () => {
    const namespace = uniqueNamespace();
    const s = await openStore({ namespace });
    await admin.query(`DROP PROCEDURE ${mysqlNames(namespace).stampedRead}`);
    const error = await errorOf(s.readStamped([], 'c'));
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    expect((error as StoreError).message).toMatch(/does not exist/);
  });
});

describe('mysql readStamped: a timestamp above a stamp sees the stamped write', () => {
  /**
   * Deterministic: a real stamped CAS is held after its draw, before its COMMIT (its final
   * row write waits for a locking scan of the `notified` index in another session, as in
   * stamped.test.ts), so it holds the counter row. A stamped read is sent and waits on the
   * counter row; then the CAS is let go. The read draws the value above the stamp, so it
   * must see the write.
   */
  async function readDuringCommit(s: MySqlStore, read: StampedRead, wanted: string, isolation: string) {
    const counter = 'rs.hold';
    const key = `k${randomBytes(3).toString('hex')}`;
    const v = version(await s.checkAndSet({ table: 'hold', key, expected: null, state: template('old') }));
    const base = await s.incrementCounter(counter, 1);
    const blocker = await lockingSession(
      `SELECT row_key FROM \`${s.namespace}_rows\` FORCE INDEX (\`${s.namespace}_rows_notified\`)
       WHERE tbl = ? AND notified = TRUE FOR UPDATE`,
      [Buffer.from('hold')],
    );
    try {
      const cas = s.checkAndSetStamped(
        { table: 'hold', key, expected: v, state: template('new'), notified: true },
        counter,
      );
      cas.catch(() => {});
      await untilLockWait((q) => q.startsWith(`UPDATE \`${s.namespace}_rows\``) && q.includes("'hold'"));
      const pending = read([{ table: 'hold', key }], counter);
      pending.catch(() => {});
      await untilLockWait(waitingOnCounter(s.namespace));
      expect(await settledWithin(pending, 300)).toBe('pending');
      expect(isolation).toBe(wanted);
      await blocker.query('ROLLBACK');
      const w = stamped(await cas);
      expect(w.timestamp).toBe(base + 1);
      const result = await pending;
      expect(result.timestamp).toBe(base + 2);
      return { w, old: v, result };
    } finally {
      await blocker.query('ROLLBACK').catch(() => {});
      blocker.release();
    }
  }

  async function isolation(pool: Pool): Promise<string> {
    const [rows] = await pool.query<RowDataPacket[]>('SELECT @@tx_isolation AS i');
    return String(rows[0]!.i);
  }

  it.each([
    ['REPEATABLE READ', 'REPEATABLE-READ'],
    ['READ COMMITTED', 'READ-COMMITTED'],
    ['SERIALIZABLE', 'SERIALIZABLE'],
  ])(
    'readStamped waits on a stamped CAS holding the counter, then sees its write (%s)',
    async (level, shown) => {
      const pool = userPool({ connectionLimit: 2 });
      pool.on('connection', (connection) => {
        connection.query(`SET SESSION TRANSACTION ISOLATION LEVEL ${level}`);
      });
      const s = await openStore({ pool, namespace: uniqueNamespace() });
      const { w, result } = await readDuringCommit(
        s,
        (rows, c) => s.readStamped(rows, c),
        shown,
        await isolation(pool),
      );
      expect(result.rows).toEqual([{ version: w.version, state: writeStamp(template('new'), w.timestamp) }]);
    },
  );

  it('the single-transaction version draws above the stamp yet misses the write (what the procedure avoids)', async () => {
    const namespace = uniqueNamespace();
    const s = await openStore({ namespace });
    const pool = userPool({ connectionLimit: 2, multipleStatements: true });
    const { old, result } = await readDuringCommit(
      s,
      singleTransactionRead(pool, namespace),
      'REPEATABLE-READ',
      await isolation(pool),
    );
    // Stale: the stamp is below the timestamp, yet the read shows the row before the CAS.
    expect(result.rows).toEqual([{ version: old, state: template('old') }]);
  });

  /**
   * The shared race (@percolator/conformance's stampedRace; the suite runs it on every store
   * with stampedRead): stamped writers on one store race `read`, which draws and then
   * reads every row. Returns the reads above a write's stamp that missed it.
   */
  async function race(read: StampedRead, writerStore: MySqlStore): Promise<string[]> {
    const result = await stampedRace({
      write: (request, counter) => writerStore.checkAndSetStamped(request, counter),
      read,
      counter: 'rs.race',
    });
    expect(result.readsDuringWrites).toBeGreaterThan(0);
    return result.violations;
  }

  it('the same race catches the single-transaction version (proof the race test can fail)', async () => {
    let violations: string[] = [];
    // A stale read needs a reader to start while a writer holds the counter; that happens
    // often under this load, but try a few times rather than flake.
    for (let attempt = 0; attempt < 3 && violations.length === 0; attempt++) {
      const namespace = uniqueNamespace();
      const writerStore = await openStore({ namespace, maxConnections: 6 });
      const pool = userPool({ connectionLimit: 6, multipleStatements: true });
      violations = await race(singleTransactionRead(pool, namespace), writerStore);
    }
    expect(violations.length).toBeGreaterThan(0);
  });
});
