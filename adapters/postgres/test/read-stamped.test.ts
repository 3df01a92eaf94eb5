// Twin of the MySQL adapter's test of the same name: both check what each adapter does
// with its own driver (statements, failure mapping, timeouts, schema); the contract is the
// conformance suite's. Their test shapes match on purpose (`duplicates` pairs them); their
// setup is ./fixture.ts.
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
  dropPostgresNamespace,
  type PgPoolClient,
  type PostgresStore,
  postgresNames,
  postgresSchemaSql,
} from '@percolator/postgres';
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { postgresStatements } from '../src/statements.js';
import { admin, openStore, store, uniqueNamespace, url, usePostgresFixture } from './fixture.js';

/*
 * readStamped (capability stampedRead) against a real server: the same answers as readMany,
 * the timestamp from the counter incrementCounter and checkAndSetStamped use, the schema's
 * function, failure mapping, no text spliced into SQL, and the property the core relies
 * on: a read whose timestamp is above a stamp sees the stamped write. The last part also
 * runs against a single-CTE version (draw and read in one statement, one snapshot) to show
 * that the checks do catch a stale read.
 */

const bytes = (text: string) => new TextEncoder().encode(text);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A format byte, the 8-byte stamp slot (zeros), then `tail`. */
const template = (tail: string) => Uint8Array.from([2, 0, 0, 0, 0, 0, 0, 0, 0, ...bytes(tail)]);
const _stampOf = (state: Uint8Array) =>
  Number(new DataView(state.buffer, state.byteOffset, state.byteLength).getBigUint64(STAMP_OFFSET));

type StampedRead = (
  rows: readonly RowRef[],
  counter: string,
) => Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }>;

function _version(result: CasResult): string {
  if (!result.ok) throw new Error(`expected the CAS to apply: ${JSON.stringify(result)}`);
  return result.version;
}

/**
 * The WRONG way, kept to prove the checks below can fail: the draw and the read in ONE
 * statement (a data-modifying CTE). Every part of a statement shares the snapshot taken
 * when it started, before the upsert waited on the counter row's lock, so a stamped CAS
 * that commits during that wait is below the drawn value yet not seen.
 */
function singleStatementRead(pool: pg.Pool, namespace: string): StampedRead {
  const n = postgresNames(namespace);
  const text = `WITH c AS (
  INSERT INTO ${n.counters} (name, value) VALUES ($1::bytea, 1)
  ON CONFLICT (name) DO UPDATE SET value = ${n.counters}.value + EXCLUDED.value
  RETURNING value
)
SELECT 0 AS i, value::text AS version, NULL::bytea AS state FROM c
UNION ALL
SELECT r.i::int, t.version::text, t.state
FROM unnest($2::bytea[], $3::bytea[]) WITH ORDINALITY AS r(tbl, key, i)
JOIN ${n.rows} t ON t.tbl = r.tbl AND t.key = r.key`;
  return async (refs, counter) => {
    const result = await pool.query(text, [
      Buffer.from(counter),
      refs.map((r) => Buffer.from(r.table)),
      refs.map((r) => Buffer.from(r.key)),
    ]);
    let timestamp = 0;
    const rows: (StoredRow | null)[] = refs.map(() => null);
    for (const row of result.rows) {
      if (row.i === 0) timestamp = Number(row.version);
      else rows[row.i - 1] = { version: row.version, state: new Uint8Array(row.state) };
    }
    return { timestamp, rows };
  };
}

usePostgresFixture('rs');

describe('postgres readStamped: the step', () => {
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
});

describe('postgres readStamped: SQL text and schema', () => {
  it('sends one fixed statement: no table, key or counter text is spliced in', async () => {
    const texts: string[] = [];
    const values: unknown[][] = [];
    const pool = new pg.Pool({ connectionString: url, max: 1 });
    pool.on('error', () => {});
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
        { table: 'Zq9.Tbl-X', key: '$1 $2 \u0000 "q" \\ 😀', counter: '$$ \u0000 😀 $fn$' },
      ];
      const sent: string[] = [];
      for (const { table, key, counter } of hostile) {
        await s.checkAndSet({ table, key, expected: null, state: bytes(key) });
        texts.length = 0;
        values.length = 0;
        const r = await s.readStamped([{ table, key }], counter);
        expect(r.rows).toEqual([{ version: expect.any(String), state: bytes(key) }]);
        expect(r.timestamp).toBe(1);
        expect(texts).toHaveLength(1);
        for (const fragment of [table, key, counter, "'); DROP", '😀', '\u0000']) {
          expect(texts[0]).not.toContain(fragment);
        }
        expect(values[0]).toEqual([Buffer.from(counter), [Buffer.from(table)], [Buffer.from(key)]]);
        sent.push(...texts);
      }
      expect(sent[0]).toBe(sent[1]);
      // The namespace appears only as the function's fixed, quoted identifier.
      const names = postgresNames(s.namespace);
      expect(sent[0]).toContain(names.readStamped);
      expect(sent[0]!.replaceAll(names.readStamped, '')).not.toContain(s.namespace);
      expect(sent[0]).not.toContain("'");
    } finally {
      await s.close();
      await pool.end();
    }
  });

  it('is in the schema SQL, created once: opening a store again does not redefine it', async () => {
    const names = postgresNames(store.namespace);
    expect(postgresSchemaSql(store.namespace)).toContain(`CREATE OR REPLACE FUNCTION ${names.readStamped}(`);
    const xmin = async () =>
      (
        await admin.query(
          `SELECT xmin::text AS x, provolatile FROM pg_proc WHERE oid = to_regprocedure($1)`,
          [names.readStampedSignature],
        )
      ).rows;
    const first = await xmin();
    expect(first).toEqual([{ x: expect.any(String), provolatile: 'v' }]);
    await openStore({ namespace: store.namespace });
    await openStore({ namespace: store.namespace });
    expect(await xmin()).toEqual(first);
  });

  it('an existing namespace without the function (or with another body) gets it when opened', async () => {
    const namespace = uniqueNamespace();
    const names = postgresNames(namespace);
    const s = await openStore({ namespace });
    await s.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('v') });
    // As a namespace created before stamped reads existed.
    await admin.query(`DROP FUNCTION ${names.readStampedSignature}`);

    // The user manages the schema: the store works, only without stamped reads.
    const old = await openStore({ namespace, createSchema: false });
    expect(old.capabilities.stampedRead).toBe(false);
    expect(old.capabilities.stampedCheckAndSet).toBe(true);
    const error = await errorOf(old.readStamped([{ table: 't', key: 'k' }], 'c'));
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).retryable).toBe(false);
    expect((error as StoreError).message).toMatch(/postgresSchemaSql/);
    expect((await old.read('t', 'k'))?.state).toEqual(bytes('v'));

    // Opened with createSchema (the default): the function is created, data untouched.
    const upgraded = await openStore({ namespace });
    expect(upgraded.capabilities.stampedRead).toBe(true);
    expect((await upgraded.readStamped([{ table: 't', key: 'k' }], 'c')).rows[0]?.state).toEqual(bytes('v'));
    // Now a store on a user-managed schema finds it too.
    expect((await openStore({ namespace, createSchema: false })).capabilities.stampedRead).toBe(true);

    // A different body (an older release, or a hand edit) is replaced when a store opens.
    await admin.query(`CREATE OR REPLACE FUNCTION ${names.readStamped}(counter_name bytea, tbls bytea[], keys bytea[])
RETURNS TABLE (ordinal bigint, row_version bigint, row_state bytea)
LANGUAGE plpgsql VOLATILE AS $fn$ BEGIN ordinal := 0; row_version := -5; RETURN NEXT; END $fn$`);
    // The store runs it; the core's contract check refuses its timestamp of -5.
    await expect(upgraded.readStamped([], 'c')).rejects.toThrow(/broke the store contract/);
    await openStore({ namespace });
    expect((await upgraded.readStamped([], 'c')).timestamp).toBe(2);

    // dropNamespace drops it with the tables.
    const gone = async (signature: string) =>
      (await admin.query(`SELECT to_regprocedure($1) IS NULL AS gone`, [signature])).rows[0].gone;
    await s.dropNamespace();
    expect(await gone(names.readStampedSignature)).toBe(true);

    // So does dropPostgresNamespace (the operators' drop).
    const other = await openStore({ namespace: uniqueNamespace() });
    const otherNames = postgresNames(other.namespace);
    expect(await gone(otherNames.readStampedSignature)).toBe(false);
    const dropped = await dropPostgresNamespace(other.namespace, { connectionString: url });
    // Listed among its objects: the drop removes exactly what the list shows.
    expect(dropped?.objects).toContain(`${other.namespace}_read_stamped`);
    expect(await gone(otherNames.readStampedSignature)).toBe(true);
  });
});

describe('postgres readStamped: failures', () => {
  /** Holds the counter row's lock from another connection, so readStamped waits on it. */
  async function holdCounter(s: PostgresStore, counter: string): Promise<PgPoolClient> {
    await s.incrementCounter(counter, 1);
    const blocker = await admin.connect();
    await blocker.query('BEGIN');
    await blocker.query(`SELECT 1 FROM "${s.namespace}_counters" WHERE name = $1 FOR UPDATE`, [
      Buffer.from(counter),
    ]);
    return blocker;
  }

  it('reports a connection killed mid-statement as StoreError applied=no, retryable (a read)', async () => {
    const s = await openStore({ namespace: uniqueNamespace() });
    const blocker = await holdCounter(s, 'rs.kill');
    try {
      const pending = s.readStamped([{ table: 'k', key: 'k' }], 'rs.kill');
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

  it('maps a server error to StoreError applied=no (the function gone under a running store)', async () => {
    const namespace = uniqueNamespace();
    const s = await openStore({ namespace });
    await admin.query(`DROP FUNCTION ${postgresNames(namespace).readStampedSignature}`);
    const error = await errorOf(s.readStamped([], 'c'));
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    expect((error as StoreError).message).toMatch(/42883|does not exist/);
  });

  it('works under REPEATABLE READ too (a concurrent draw is a 40001, sent again)', async () => {
    const pool = new pg.Pool({
      connectionString: url,
      max: 6,
      options: '-c default_transaction_isolation=repeatable\\ read',
    });
    pool.on('error', () => {});
    const s = await openStore({ pool, namespace: store.namespace, createSchema: false });
    try {
      const check = await pool.query('SHOW transaction_isolation');
      expect(check.rows[0].transaction_isolation).toBe('repeatable read');
      const counter = 'rs.rr';
      const w = stamped(
        await store.checkAndSetStamped(
          { table: 'rr', key: 'k', expected: null, state: template('x') },
          counter,
        ),
      );
      const results = await Promise.allSettled(
        Array.from({ length: 12 }, () => s.readStamped([{ table: 'rr', key: 'k' }], counter)),
      );
      const ok = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
      // Under contention some may run out of attempts; those fail as 'no', retryable.
      for (const r of results) {
        if (r.status === 'rejected') {
          expect(r.reason).toBeInstanceOf(StoreError);
          expect((r.reason as StoreError).applied).toBe('no');
        }
      }
      expect(ok.length).toBeGreaterThan(0);
      for (const r of ok) {
        expect(r.timestamp).toBeGreaterThan(w.timestamp);
        expect(r.rows[0]?.version).toBe(w.version);
      }
      expect(new Set(ok.map((r) => r.timestamp)).size).toBe(ok.length);
    } finally {
      await s.close();
      await pool.end();
    }
  });
});

describe('postgres readStamped: a timestamp above a stamp sees the stamped write', () => {
  /**
   * Deterministic: a stamped CAS runs inside a transaction we keep open (so it holds the
   * counter row), a stamped read is sent and waits on the counter row, then we commit.
   * The read draws a value above the stamp, so it must see the row.
   */
  async function readDuringCommit(read: StampedRead, namespace: string, key: string, appName: string) {
    const sql = postgresStatements(postgresNames(namespace));
    const counter = 'rs.hold';
    const writer = await admin.connect();
    try {
      await writer.query('BEGIN');
      // A stamped create of one row, as checkAndSetStamped sends it.
      const w = await writer.query(sql.casStampedMany, [
        Buffer.from(counter),
        [Buffer.from('hold')],
        [Buffer.from(key)],
        [null],
        [Buffer.from(template('held'))],
        [false],
        '10000',
      ]);
      const stamp = Number(w.rows.find((row: { i: number }) => row.i === 0).version);
      let done = false;
      const pending = read([{ table: 'hold', key }], counter).finally(() => {
        done = true;
      });
      pending.catch(() => {});
      // Wait until the read is blocked on the counter row's lock.
      let waiting = false;
      for (let i = 0; i < 100 && !waiting; i++) {
        const r = await admin.query(
          `SELECT count(*)::int AS n FROM pg_stat_activity
           WHERE application_name = $1 AND wait_event_type = 'Lock'`,
          [appName],
        );
        waiting = r.rows[0].n > 0;
        if (!waiting) await sleep(20);
      }
      expect(waiting).toBe(true);
      expect(done).toBe(false);
      await writer.query('COMMIT');
      const result = await pending;
      expect(result.timestamp).toBe(stamp + 1);
      return { stamp, version: String(w.rows.find((row: { i: number }) => row.i === 1).version), result };
    } finally {
      await writer.query('ROLLBACK').catch(() => {});
      writer.release();
    }
  }

  it('readStamped waits on a stamped CAS holding the counter, then sees its write', async () => {
    const namespace = uniqueNamespace();
    const s = await openStore({ namespace });
    const {
      stamp,
      version: v,
      result,
    } = await readDuringCommit(
      (rows, c) => s.readStamped(rows, c),
      namespace,
      'k',
      `percolator:${namespace}`,
    );
    expect(result.rows).toEqual([{ version: v, state: writeStamp(template('held'), stamp) }]);
  });

  it('the single-statement version draws above the stamp yet misses the write (what the function avoids)', async () => {
    const namespace = uniqueNamespace();
    await openStore({ namespace });
    const appName = `cte:${namespace}`;
    const pool = new pg.Pool({ connectionString: url, max: 2, application_name: appName });
    pool.on('error', () => {});
    try {
      const { result } = await readDuringCommit(
        singleStatementRead(pool, namespace),
        namespace,
        'k',
        appName,
      );
      expect(result.rows).toEqual([null]); // stale: the stamp is below the timestamp
    } finally {
      await pool.end();
    }
  });

  /**
   * The shared race (@percolator/conformance's stampedRace; the suite runs it on every store
   * with stampedRead): stamped writers on one store race `read`, which draws and then
   * reads every row. Returns the reads above a write's stamp that missed it.
   */
  async function race(read: StampedRead, writerStore: PostgresStore): Promise<string[]> {
    const result = await stampedRace({
      write: (request, counter) => writerStore.checkAndSetStamped(request, counter),
      read,
      counter: 'rs.race',
    });
    expect(result.readsDuringWrites).toBeGreaterThan(0);
    return result.violations;
  }

  it('the same race catches the single-statement version (proof the race test can fail)', async () => {
    let violations: string[] = [];
    // A stale read needs a reader to start while a writer holds the counter; that happens
    // all the time under this load, but try a few times rather than flake.
    for (let attempt = 0; attempt < 3 && violations.length === 0; attempt++) {
      const namespace = uniqueNamespace();
      const writerStore = await openStore({ namespace, maxConnections: 6 });
      const pool = new pg.Pool({ connectionString: url, max: 6 });
      pool.on('error', () => {});
      try {
        violations = await race(singleStatementRead(pool, namespace), writerStore);
      } finally {
        await pool.end();
      }
    }
    expect(violations.length).toBeGreaterThan(0);
  });
});
