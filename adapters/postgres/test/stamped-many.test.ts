import { errorOf, stampOf } from '@percolator/conformance';
import {
  type CasRequest,
  InvalidArgumentError,
  RowTooLargeError,
  type StampedManyResult,
  type StoredRow,
  StoreError,
  uncheckedStore,
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
import { describe, expect, it, vi } from 'vitest';
import { postgresStatements } from '../src/statements.js';
import { admin, openStore, store, uniqueNamespace, url, usePostgresFixture } from './fixture.js';

/*
 * checkAndSetStampedMany (capability stampedCheckAndSetMany) against a real server: one
 * stamp for every row, versions in request order, all or nothing (a stale request, a
 * create on a present row, a row changed while the call waited), the lock order (rows in
 * (table, key) order, then the counter) and no deadlock under concurrent overlapping calls,
 * the property the core relies on (whoever draws later and then reads sees every row),
 * the schema's function and an older schema without it, failure mapping, and no text
 * spliced into SQL.
 */

type StampedRequest = CasRequest & { readonly state: Uint8Array };

const bytes = (text: string) => new TextEncoder().encode(text);
const text = (data: Uint8Array) => new TextDecoder().decode(data);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A format byte, the 8-byte stamp slot (zeros), then `tail`. */
const template = (tail: string) => Uint8Array.from([2, 0, 0, 0, 0, 0, 0, 0, 0, ...bytes(tail)]);
/** What follows the stamp slot. */
const tailOf = (state: Uint8Array) => text(state.subarray(9));

/** The store's method (the checked store's, so the core's contract check runs too). */
function many(s: PostgresStore, requests: readonly StampedRequest[], counter: string) {
  return s.checkAndSetStampedMany!(requests, counter);
}

function applied(result: StampedManyResult): { versions: readonly string[]; timestamp: number } {
  if (!result.ok) throw new Error(`expected the stamped CAS to apply: ${JSON.stringify(result)}`);
  return result;
}

async function create(s: PostgresStore, table: string, key: string, tail: string): Promise<string> {
  const result = await s.checkAndSet({ table, key, expected: null, state: template(tail) });
  if (!result.ok) throw new Error(`could not create ${table}/${key}`);
  return result.version;
}

/** Every row as it is, for "nothing changed" checks. */
async function snapshot(s: PostgresStore, refs: readonly { table: string; key: string }[]) {
  return s.readMany(refs);
}

/** Waits until `atLeast` backends of `applicationName` wait on a lock. */
async function waitForLockWait(applicationName: string, atLeast = 1): Promise<void> {
  await vi.waitFor(
    async () => {
      const r = await admin.query(
        `SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`,
        [applicationName],
      );
      expect(r.rows[0].n).toBeGreaterThanOrEqual(atLeast);
    },
    { timeout: 10_000, interval: 20 },
  );
}

/** `client` begins a transaction and locks row (table, key) of `rows` until it ends. */
async function holdRow(client: pg.PoolClient, rows: string, table: string, key: string): Promise<void> {
  await client.query('BEGIN');
  await client.query(`SELECT 1 FROM ${rows} WHERE tbl = $1 AND key = $2 FOR UPDATE`, [
    Buffer.from(table),
    Buffer.from(key),
  ]);
}

/** Takes a row lock without waiting, in its own statement: 'free' or the SQLSTATE (55P03: held). */
function tryLock(sql: string, params: unknown[]): Promise<string | undefined> {
  return admin.query(sql, params).then(
    () => 'free',
    (error: { code?: string }) => error.code,
  );
}

/** A pool whose clients record what is sent and the SQLSTATE of every failed statement. */
function recordingPool(max: number, applicationName?: string) {
  const texts: string[] = [];
  const values: unknown[][] = [];
  const errorCodes: string[] = [];
  const pool = new pg.Pool({
    connectionString: url,
    max,
    ...(applicationName ? { application_name: applicationName } : {}),
  });
  pool.on('error', () => {});
  const connect = pool.connect.bind(pool) as () => Promise<PgPoolClient>;
  const wrapped = new WeakSet<PgPoolClient>();
  (pool as unknown as { connect: () => Promise<PgPoolClient> }).connect = async () => {
    const client = await connect();
    if (wrapped.has(client)) return client;
    wrapped.add(client);
    const query = client.query.bind(client) as (config: unknown) => unknown;
    (client as unknown as { query: (config: unknown) => unknown }).query = (config: unknown) => {
      const c = config as {
        text?: string;
        values?: unknown[];
        callback?: (error: unknown, result: unknown) => void;
      };
      texts.push(c.text ?? String(config));
      values.push(c.values ?? []);
      const callback = c.callback;
      if (typeof callback === 'function') {
        c.callback = (error, result) => {
          if (error) errorCodes.push(String((error as { code?: unknown }).code));
          callback(error, result);
        };
      }
      return query(config);
    };
    return client;
  };
  return { pool, texts, values, errorCodes };
}

usePostgresFixture('sm');

describe('postgres checkAndSetStampedMany: the step', () => {
  it('declares stampedCheckAndSetMany', () => {
    expect(store.capabilities.stampedCheckAndSetMany).toBe(true);
    expect(typeof store.checkAndSetStampedMany).toBe('function');
  });

  it('writes every row with one stamp, the value drawn from the counter, versions in request order', async () => {
    const counter = 'sm.one';
    expect(await store.incrementCounter(counter, 41)).toBe(41);
    // Deliberately not in (table, key) order, over two tables.
    const requests: StampedRequest[] = [
      { table: 'one.b', key: 'd', expected: null, state: template('d0'), notified: true },
      { table: 'one.a', key: 'z', expected: null, state: template('z0') },
      { table: 'one.b', key: 'a', expected: null, state: template('a0'), notified: true },
      { table: 'one.a', key: 'c', expected: null, state: template('c0') },
    ];
    const { versions, timestamp } = applied(await many(store, requests, counter));
    expect(timestamp).toBe(42);
    expect(versions).toHaveLength(4);
    expect(new Set(versions).size).toBe(4);
    const rows = await store.readMany(requests);
    requests.forEach((request, i) => {
      expect(rows[i]).toEqual({ version: versions[i], state: writeStamp(request.state, timestamp) });
      expect(stampOf(rows[i]!.state)).toBe(42);
    });
    // The caller's templates are not touched.
    expect(requests[0]!.state).toEqual(template('d0'));
    // The notified flags, per row.
    expect(await store.scanNotified('one.b', { limit: 10 })).toEqual(['a', 'd']);
    expect(await store.scanNotified('one.a', { limit: 10 })).toEqual([]);
    // The next draw is the next value: the call drew exactly one.
    expect(await store.incrementCounter(counter, 1)).toBe(43);
  });

  it('applies creates and updates together', async () => {
    const counter = 'sm.mixed';
    const vb = await create(store, 'mix', 'b', 'b0');
    const vd = await create(store, 'mix', 'd', 'd0');
    const requests: StampedRequest[] = [
      { table: 'mix', key: 'd', expected: vd, state: template('d1') },
      { table: 'mix', key: 'c', expected: null, state: template('c1') },
      { table: 'mix', key: 'b', expected: vb, state: template('b1'), notified: true },
      { table: 'mix', key: 'a', expected: null, state: template('a1') },
    ];
    const { versions, timestamp } = applied(await many(store, requests, counter));
    expect(timestamp).toBe(1);
    const rows = await store.readMany(requests);
    expect(rows.map((row) => row?.version)).toEqual(versions);
    expect(rows.map((row) => tailOf(row!.state))).toEqual(['d1', 'c1', 'b1', 'a1']);
    expect(rows.every((row) => stampOf(row!.state) === timestamp)).toBe(true);
    expect(versions).not.toContain(vb);
    expect(versions).not.toContain(vd);
    // Then an update of all four with the versions just returned.
    const next = applied(
      await many(
        store,
        requests.map((r, i) => ({ ...r, expected: versions[i]!, state: template(`${r.key}2`) })),
        counter,
      ),
    );
    expect(next.timestamp).toBe(2);
    expect((await store.readMany(requests)).map((row) => row?.version)).toEqual(next.versions);
  });

  it('one stale expected among several: ok false with the rows as they are, nothing written, nothing drawn', async () => {
    const counter = 'sm.stale';
    const refs = ['a', 'b', 'c'].map((key) => ({ table: 'stale', key }));
    const v: string[] = [];
    for (const { table, key } of refs) v.push(await create(store, table, key, `${key}0`));
    // b moves on: the caller's version of it is stale.
    const b1 = await store.checkAndSet({ table: 'stale', key: 'b', expected: v[1]!, state: template('b1') });
    expect(b1.ok).toBe(true);
    const before = await snapshot(store, refs);
    const result = await many(
      store,
      [
        { table: 'stale', key: 'c', expected: v[2]!, state: template('c9') },
        { table: 'stale', key: 'b', expected: v[1]!, state: template('b9') },
        { table: 'stale', key: 'a', expected: v[0]!, state: template('a9') },
      ],
      counter,
    );
    expect(result.ok).toBe(false);
    // current in request order, from the same statement (no extra read).
    expect(!result.ok && result.current).toEqual([before[2], before[1], before[0]]);
    expect(await snapshot(store, refs)).toEqual(before);
    // The check failed before the draw: the counter did not move.
    expect(await store.incrementCounter(counter, 1)).toBe(1);
  });

  it('a create on a present row: ok false, nothing written (the absent rows stay absent)', async () => {
    const counter = 'sm.present';
    const vy = await create(store, 'present', 'y', 'y0');
    const vz = await create(store, 'present', 'z', 'z0');
    const refs = ['x', 'y', 'z'].map((key) => ({ table: 'present', key }));
    const before = await snapshot(store, refs);
    expect(before[0]).toBeNull();
    const result = await many(
      store,
      [
        { table: 'present', key: 'x', expected: null, state: template('x1') },
        { table: 'present', key: 'z', expected: vz, state: template('z1') },
        { table: 'present', key: 'y', expected: null, state: template('y1') },
      ],
      counter,
    );
    expect(result).toEqual({ ok: false, current: [null, before[2], before[1]] });
    expect(await snapshot(store, refs)).toEqual(before);
    expect((await store.read('present', 'y'))?.version).toBe(vy);
  });

  it('an update of an absent row, or a version this store never issues: ok false, nothing written', async () => {
    const counter = 'sm.absent';
    const va = await create(store, 'absent', 'a', 'a0');
    const before = await store.read('absent', 'a');
    for (const expected of ['123456', 'not-a-version', '-1', '99999999999999999999']) {
      const result = await many(
        store,
        [
          { table: 'absent', key: 'a', expected: va, state: template('a1') },
          { table: 'absent', key: 'gone', expected, state: template('g1') },
        ],
        counter,
      );
      expect(result).toEqual({ ok: false, current: [before, null] });
    }
    expect(await store.read('absent', 'a')).toEqual(before);
    expect(await store.read('absent', 'gone')).toBeNull();
    expect(await store.incrementCounter(counter, 1)).toBe(1);
  });
});

describe('postgres checkAndSetStampedMany: all or nothing when a row changes while it waits', () => {
  /**
   * Another transaction writes one of the rows (`write`) and stays open, so the call (its
   * snapshot without that write) takes the rows before it in key order and then waits on
   * it, not holding the counter; the commit makes that row not match any more. Returns the
   * call's result.
   */
  async function loseRaceOn(
    s: PostgresStore,
    write: (client: PgPoolClient) => Promise<unknown>,
    requests: StampedRequest[],
    counter: string,
  ): Promise<StampedManyResult> {
    const other = await admin.connect();
    try {
      await other.query('BEGIN');
      await write(other);
      const pending = many(s, requests, counter);
      pending.catch(() => {});
      await waitForLockWait(`percolator:${s.namespace}`);
      // It has not drawn: the counter is free while it waits for that row.
      expect(
        await tryLock(`SELECT 1 FROM "${s.namespace}_counters" WHERE name = $1 FOR UPDATE NOWAIT`, [
          Buffer.from(counter),
        ]),
      ).toBe('free');
      await other.query('COMMIT');
      return await pending;
    } finally {
      await other.query('ROLLBACK').catch(() => {});
      other.release();
    }
  }

  it('an update that waited on a concurrent writer no longer matches: nothing written, nothing drawn, the rows as they are', async () => {
    const s = await openStore({ namespace: uniqueNamespace() });
    const counter = 'sm.race';
    const refs = ['a', 'b', 'c'].map((key) => ({ table: 'race', key }));
    const v: string[] = [];
    for (const { table, key } of refs) v.push(await create(s, table, key, `${key}0`));
    expect(await s.incrementCounter(counter, 10)).toBe(10);
    const before = await snapshot(s, refs);
    const n = postgresNames(s.namespace);
    const result = await loseRaceOn(
      s,
      (client) =>
        client.query(
          `UPDATE ${n.rows} SET version = nextval('${n.versionSeq}'), state = $3 WHERE tbl = $1 AND key = $2`,
          [Buffer.from('race'), Buffer.from('b'), Buffer.from(template('other'))],
        ),
      // In request order c, b, a; locked in key order a, b (waits), c.
      [
        { table: 'race', key: 'c', expected: v[2]!, state: template('c1') },
        { table: 'race', key: 'b', expected: v[1]!, state: template('b1') },
        { table: 'race', key: 'a', expected: v[0]!, state: template('a1') },
      ],
      counter,
    );
    expect(result.ok).toBe(false);
    const after = await snapshot(s, refs);
    // a was locked before the call waited on b, and is left as it was.
    expect(after[0]).toEqual(before[0]);
    expect(after[2]).toEqual(before[2]);
    expect(tailOf(after[1]!.state)).toBe('other');
    // current: the rows as they are now, in request order (from the function's reply).
    expect(!result.ok && result.current).toEqual([after[2], after[1], after[0]]);
    // Nothing was drawn.
    expect(await s.incrementCounter(counter, 1)).toBe(11);
  });

  it('a create that waited on a concurrent insert of its key finds it present: nothing written', async () => {
    const s = await openStore({ namespace: uniqueNamespace() });
    const counter = 'sm.race.create';
    await s.incrementCounter(counter, 1); // the counter row exists (an insert would not block)
    const vz = await create(s, 'rc', 'z', 'z0');
    const n = postgresNames(s.namespace);
    const result = await loseRaceOn(
      s,
      (client) =>
        client.query(
          `INSERT INTO ${n.rows} (tbl, key, version, state) VALUES ($1, $2, nextval('${n.versionSeq}'), $3)`,
          [Buffer.from('rc'), Buffer.from('n'), Buffer.from(template('other'))],
        ),
      [
        { table: 'rc', key: 'z', expected: vz, state: template('z1') },
        { table: 'rc', key: 'n', expected: null, state: template('n1') },
        { table: 'rc', key: 'm', expected: null, state: template('m1') },
      ],
      counter,
    );
    expect(result.ok).toBe(false);
    expect(await s.read('rc', 'm')).toBeNull(); // inserted before the wait, rolled back
    expect(tailOf((await s.read('rc', 'n'))!.state)).toBe('other');
    expect((await s.read('rc', 'z'))?.version).toBe(vz);
    expect(!result.ok && result.current?.map((row) => row && tailOf(row.state))).toEqual([
      'z0',
      'other',
      null,
    ]);
    expect(await s.incrementCounter(counter, 1)).toBe(2);
  });
});

describe('postgres checkAndSetStampedMany: lock order and concurrency', () => {
  it('creates come after the rows it updates: waiting for an existing row, it holds no new key, so a mixed checkAndSetMany cannot close a cycle', async () => {
    // Before, creates went in one key order with updates: [create a, update b] inserted a,
    // then waited for b; a checkAndSetMany [create a, update b] (mixed kinds: it locks b
    // first, creates a last) held b and waited for a. A cycle, broken after deadlock_timeout.
    const s = await openStore({ namespace: uniqueNamespace() });
    const rows = `"${s.namespace}_rows"`;
    const counter = 'sm.creates-last';
    const vb = await create(s, 'd', 'b', 'b0');
    await s.incrementCounter(counter, 1);
    const blocker = await admin.connect();
    const probe = await admin.connect();
    try {
      await holdRow(blocker, rows, 'd', 'b');
      const call = many(
        s,
        [
          { table: 'd', key: 'a', expected: null, state: template('a1') },
          { table: 'd', key: 'b', expected: vb, state: template('b1') },
        ],
        counter,
      );
      await waitForLockWait(`percolator:${s.namespace}`);
      // It waits for b and has not inserted a: another insert of a does not wait for it.
      await probe.query('BEGIN');
      await probe.query("SET LOCAL lock_timeout = '2s'");
      const inserted = await probe
        .query(`INSERT INTO ${rows} (tbl, key, version, state, notified) VALUES ($1, $2, 1, $3, false)`, [
          Buffer.from('d'),
          Buffer.from('a'),
          Buffer.from('probe'),
        ])
        .then(
          () => 'inserted',
          (error: { code?: string }) => error.code,
        );
      await probe.query('ROLLBACK');
      expect(inserted).toBe('inserted');
      await blocker.query('ROLLBACK');
      const { versions, timestamp } = applied(await call);
      expect((await s.read('d', 'a'))?.version).toBe(versions[0]);
      expect((await s.read('d', 'b'))?.version).toBe(versions[1]);
      expect(stampOf((await s.read('d', 'a'))!.state)).toBe(timestamp);
    } finally {
      await blocker.query('ROLLBACK').catch(() => {});
      await probe.query('ROLLBACK').catch(() => {});
      blocker.release();
      probe.release();
    }
  });

  it('takes rows in (table, key) order whatever the request order, then the counter: waiting for a row, it holds no counter', async () => {
    const s = await openStore({ namespace: uniqueNamespace() });
    const rows = `"${s.namespace}_rows"`;
    const counter = 'sm.order';
    const va = await create(s, 'd', 'a', 'a0');
    const vb = await create(s, 'd', 'b', 'b0');
    await s.incrementCounter(counter, 1); // the counter row exists (an insert would not block)
    const blocker = await admin.connect();
    try {
      await holdRow(blocker, rows, 'd', 'b');
      // Requests in the opposite order: b first.
      const call = many(
        s,
        [
          { table: 'd', key: 'b', expected: vb, state: template('b1') },
          { table: 'd', key: 'a', expected: va, state: template('a1') },
        ],
        counter,
      );
      await waitForLockWait(`percolator:${s.namespace}`);
      // It holds a (taken first) while it waits for b, and not the counter.
      expect(
        await tryLock(`SELECT 1 FROM ${rows} WHERE tbl = $1 AND key = $2 FOR UPDATE NOWAIT`, [
          Buffer.from('d'),
          Buffer.from('a'),
        ]),
      ).toBe('55P03'); // lock_not_available
      expect(
        await tryLock(`SELECT 1 FROM "${s.namespace}_counters" WHERE name = $1 FOR UPDATE NOWAIT`, [
          Buffer.from(counter),
        ]),
      ).toBe('free');
      // So draws go on meanwhile: the oracle is not held up by a call waiting for a row.
      const drawn = await s.incrementCounter(counter, 1);
      await blocker.query('ROLLBACK');
      const { versions, timestamp } = applied(await call);
      // Drawn once it held every row, so after the draw above.
      expect(timestamp).toBe(drawn + 1);
      expect((await s.read('d', 'b'))?.version).toBe(versions[0]);
      expect((await s.read('d', 'a'))?.version).toBe(versions[1]);
      expect(stampOf((await s.read('d', 'a'))!.state)).toBe(timestamp);
    } finally {
      await blocker.query('ROLLBACK').catch(() => {});
      blocker.release();
    }
  });

  it('with a checkAndSetMany over the same rows, takes them in one order whatever the plan: no deadlock', async () => {
    // The reviewer's case: row b stored before a, 30 more rows, statistics. A plain batch of
    // two updates then hashed its requests and scanned the table, taking b before a, while
    // the stamped call took a before b (having drawn first): a deadlock, broken after
    // deadlock_timeout (1 s) with the counter held, and the statement sent again.
    // Deterministic: a third session holds a; the stamped call queues for a first, then the
    // batch; both run when a is released.
    const namespace = uniqueNamespace();
    await openStore({ namespace });
    const appName = `dl:${namespace}`;
    const { pool, texts, errorCodes } = recordingPool(4, appName);
    const s = await openStore({ pool, namespace, createSchema: false });
    const rows = `"${namespace}_rows"`;
    const counter = 'sm.plan';
    const vb = await create(s, 'dl', 'b', 'b0');
    for (let i = 0; i < 30; i++) await create(s, 'dl', `f${String(i).padStart(2, '0')}`, 'filler');
    const va = await create(s, 'dl', 'a', 'a0');
    await admin.query(`ANALYZE ${rows}`);
    const blocker = await admin.connect();
    try {
      await holdRow(blocker, rows, 'dl', 'a');
      texts.length = 0;
      const stamped = many(
        s,
        [
          { table: 'dl', key: 'a', expected: va, state: template('a1') },
          { table: 'dl', key: 'b', expected: vb, state: template('b1') },
        ],
        counter,
      );
      await waitForLockWait(appName, 1);
      const batch = s.checkAndSetMany([
        { table: 'dl', key: 'b', expected: vb, state: template('b2') },
        { table: 'dl', key: 'a', expected: va, state: template('a2') },
      ]);
      await waitForLockWait(appName, 2);
      // The batch waits for a holding nothing: b is free.
      expect(
        await tryLock(`SELECT 1 FROM ${rows} WHERE tbl = $1 AND key = $2 FOR UPDATE NOWAIT`, [
          Buffer.from('dl'),
          Buffer.from('b'),
        ]),
      ).toBe('free');
      await blocker.query('ROLLBACK');
      const [one, two] = await Promise.all([stamped, batch]);
      // The stamped call queued first, so it applied; the batch then found both rows changed.
      const { timestamp } = applied(one);
      expect(two.map((r) => r.ok)).toEqual([false, false]);
      expect((await s.readMany([{ table: 'dl', key: 'a' }]))[0]?.state).toEqual(
        writeStamp(template('a1'), timestamp),
      );
      expect(errorCodes).not.toContain('40P01');
      // Each statement sent once (a deadlock victim is sent again).
      const sql = postgresStatements(postgresNames(namespace));
      expect(texts.filter((t) => t === sql.casStampedMany)).toHaveLength(1);
      expect(texts.filter((t) => t === sql.casMany || t === sql.casManyLocking)).toHaveLength(1);
    } finally {
      await blocker.query('ROLLBACK').catch(() => {});
      blocker.release();
      await pool.end();
    }
  });

  it('24 concurrent callers over overlapping rows in random orders: no deadlock, every row a chain of applied writes with rising stamps', async () => {
    // Callers on one counter run their writes one at a time (each holds the counter until
    // it commits), so six counters: calls on different counters hold rows at the same
    // time, and only the (table, key) order keeps them out of a deadlock (this test sees
    // 40P01s in most runs when the function writes in request order instead).
    const namespace = uniqueNamespace();
    await openStore({ namespace });
    const { pool, errorCodes } = recordingPool(24);
    const s = await openStore({ pool, namespace, createSchema: false });
    const counterOf = (w: number) => `sm.cc${w % 6}`;
    const table = 'cc';
    // 6 rows that exist and 3 that the callers create.
    const keys = ['k0', 'k1', 'k2', 'k3', 'k4', 'k5', 'n0', 'n1', 'n2'];
    const initial = new Map<string, string | null>();
    for (const key of keys)
      initial.set(key, key.startsWith('k') ? await create(s, table, key, 'init') : null);

    /** An applied call; `counter` undefined: a plain checkAndSetMany (one entry per applied row). */
    interface Write {
      readonly counter?: string;
      readonly timestamp?: number;
      readonly tail: string;
      readonly rows: Map<string, { expected: string | null; version: string }>;
    }
    const writes: Write[] = [];
    let failures = 0;
    const random = (n: number) => Math.floor(Math.random() * n);
    const worker = async (w: number) => {
      for (let done = 0, attempt = 0; done < 8 && attempt < 60; attempt++) {
        const chosen = [...keys].sort(() => Math.random() - 0.5).slice(0, 2 + random(4));
        const current = await s.readMany(chosen.map((key) => ({ table, key })));
        const tail = `w${w}.${attempt}`;
        const requests: StampedRequest[] = chosen.map((key, i) => ({
          table,
          key,
          expected: current[i]?.version ?? null,
          state: template(tail),
        }));
        const entry = (i: number, version: string) =>
          [chosen[i]!, { expected: requests[i]!.expected, version }] as const;
        if (w % 8 === 7) {
          // Plain batches in random orders on the same rows (they lock in key order too).
          const results = await s.checkAndSetMany(requests);
          results.forEach((result, i) => {
            if (result.ok) writes.push({ tail, rows: new Map([entry(i, result.version)]) });
          });
          if (results.every((result) => result.ok)) done++;
          else failures++;
          continue;
        }
        const result = await many(s, requests, counterOf(w));
        if (!result.ok) {
          failures++;
          continue;
        }
        done++;
        writes.push({
          counter: counterOf(w),
          timestamp: result.timestamp,
          tail,
          rows: new Map(chosen.map((_, i) => entry(i, result.versions[i]!))),
        });
      }
    };
    try {
      await Promise.all(Array.from({ length: 24 }, (_, w) => worker(w)));
    } finally {
      await s.close();
    }
    // No statement failed with a deadlock (40P01) or serialization failure (40001); the
    // store would have sent it again, so look at what the server answered.
    expect(errorCodes.filter((code) => code.startsWith('40'))).toEqual([]);
    const stamped = writes.filter((w) => w.counter !== undefined);
    expect(stamped.length).toBeGreaterThan(24);
    expect(failures).toBeGreaterThan(0); // the rows were really contended
    expect(new Set(stamped.map((w) => `${w.counter}:${w.timestamp}`)).size).toBe(stamped.length);

    // Per row: the applied writes form one chain from its first state (each expected the
    // version the one before produced), the stamps of each counter rise along it (commit
    // order is stamp order), and the row now holds the last one.
    const reader = await openStore({ namespace, createSchema: false });
    for (const key of keys) {
      const onRow = writes.filter((w) => w.rows.has(key));
      const byExpected = new Map(onRow.map((w) => [w.rows.get(key)!.expected, w]));
      expect(byExpected.size).toBe(onRow.length);
      let version = initial.get(key) ?? null;
      const stamps = new Map<string, number>();
      let last: Write | undefined;
      for (let step = 0; step < onRow.length; step++) {
        const next = byExpected.get(version);
        expect(next, `${key}: no applied write follows version ${version}`).toBeDefined();
        if (next!.counter !== undefined) {
          expect(next!.timestamp).toBeGreaterThan(stamps.get(next!.counter) ?? 0);
          stamps.set(next!.counter, next!.timestamp!);
        }
        version = next!.rows.get(key)!.version;
        last = next;
      }
      const row = await reader.read(table, key);
      if (last === undefined) {
        expect(row?.version ?? null).toBe(initial.get(key));
      } else {
        const state = template(last.tail);
        expect(row).toEqual({
          version,
          state: last.timestamp === undefined ? state : writeStamp(state, last.timestamp),
        });
      }
    }
    await pool.end();
  });
});

describe('postgres checkAndSetStampedMany: a later counter value sees every write', () => {
  it('holds the counter until all rows commit: a later draw waits, then sees every row', async () => {
    const s = await openStore({ namespace: uniqueNamespace() });
    // The store's own statement text, run inside an explicit transaction we keep open.
    const sql = postgresStatements(postgresNames(s.namespace));
    const counter = 'sm.hold';
    const before = await s.incrementCounter(counter, 1);
    const vb = await create(s, 'hold', 'b', 'b0');
    const refs = ['c', 'b', 'a'].map((key) => ({ table: 'hold', key }));
    const writer = await admin.connect();
    try {
      await writer.query('BEGIN');
      const r = await writer.query(sql.casStampedMany, [
        Buffer.from(counter),
        refs.map((ref) => Buffer.from(ref.table)),
        refs.map((ref) => Buffer.from(ref.key)),
        [null, vb, null],
        refs.map((ref) => Buffer.from(template(`${ref.key}1`))),
        [false, false, false],
        '10000',
      ]);
      const stamp = before + 1;
      expect(r.rows.find((row: { i: number }) => row.i === 0)?.version).toBe(String(stamp));
      let drawn: number | undefined;
      const later = s.incrementCounter(counter, 1).then((value) => {
        drawn = value;
        return value;
      });
      const stampedRead = s.readStamped(refs, counter);
      await sleep(300);
      expect(drawn).toBeUndefined(); // waiting on the counter row's lock
      // Not committed, so not visible.
      expect(await s.readMany(refs)).toEqual([null, { version: vb, state: template('b0') }, null]);
      await writer.query('COMMIT');
      expect(await later).toBeGreaterThan(stamp);
      const seen = await s.readMany(refs);
      const read = await stampedRead;
      expect(read.timestamp).toBeGreaterThan(stamp);
      for (const rows of [seen, read.rows]) {
        rows.forEach((row, i) => {
          expect(row?.state).toEqual(writeStamp(template(`${refs[i]!.key}1`), stamp));
        });
      }
    } finally {
      await writer.query('ROLLBACK').catch(() => {});
      writer.release();
    }
  });

  it('in a race, no draw above a stamp reads a row without that write', async () => {
    const namespace = uniqueNamespace();
    const writerStore = await openStore({ namespace, maxConnections: 6 });
    const readerStore = await openStore({ namespace, maxConnections: 6, createSchema: false });
    const counter = 'sm.seen';
    const table = 'seen';
    const keys = ['a', 'b', 'c', 'd', 'e', 'f'];
    const refs = keys.map((key) => ({ table, key }));
    const writes: { timestamp: number; keys: string[] }[] = [];
    const reads: { timestamp: number; rows: (StoredRow | null)[] }[] = [];
    let writing = true;
    const writer = async (w: number) => {
      for (let i = 0; i < 25; i++) {
        const chosen = [...keys].sort(() => Math.random() - 0.5).slice(0, 3);
        const current = await writerStore.readMany(chosen.map((key) => ({ table, key })));
        const result = await many(
          writerStore,
          chosen.map((key, j) => ({
            table,
            key,
            expected: current[j]?.version ?? null,
            state: template(`w${w}`),
          })),
          counter,
        );
        if (result.ok) writes.push({ timestamp: result.timestamp, keys: chosen });
      }
    };
    const reader = async (r: number) => {
      while (writing) {
        if (r % 2 === 0) {
          reads.push(await readerStore.readStamped(refs, counter));
        } else {
          // Any draw, then a read: the same rule.
          const timestamp = await readerStore.incrementCounter(counter, 1);
          reads.push({ timestamp, rows: await readerStore.readMany(refs) });
        }
      }
    };
    const readers = Array.from({ length: 4 }, (_, r) => reader(r));
    await Promise.all(Array.from({ length: 4 }, (_, w) => writer(w)));
    writing = false;
    await Promise.all(readers);
    expect(writes.length).toBeGreaterThan(10);
    expect(reads.length).toBeGreaterThan(10);
    const violations: string[] = [];
    for (const read of reads) {
      keys.forEach((key, i) => {
        const below = writes.filter((w) => w.keys.includes(key) && w.timestamp < read.timestamp);
        const needed = Math.max(0, ...below.map((w) => w.timestamp));
        const row = read.rows[i];
        const seen = row ? stampOf(row.state) : 0;
        if (seen < needed) violations.push(`read at ${read.timestamp} saw ${key} at ${seen}, not ${needed}`);
      });
    }
    expect(violations).toEqual([]);
  });
});

describe('postgres checkAndSetStampedMany: input', () => {
  it('refuses duplicate rows, an empty batch, a null or short state, and an oversized state before sending', async () => {
    const counter = 'sm.input';
    const ok = { table: 'in', key: 'a', expected: null, state: template('a') } as const;
    // Through the checked store (the core's contract check) and the adapter's own check.
    for (const target of [store, uncheckedStore(store)]) {
      const call = (requests: unknown) =>
        errorOf(target.checkAndSetStampedMany!(requests as StampedRequest[], counter));
      const duplicate = await call([ok, { ...ok, state: template('b') }]);
      expect(duplicate).toBeInstanceOf(InvalidArgumentError);
      expect((duplicate as Error).message).toMatch(/twice/);
      expect(await call([])).toBeInstanceOf(InvalidArgumentError);
      expect(await call([ok, { ...ok, key: 'n', state: null }])).toBeInstanceOf(InvalidArgumentError);
      expect(await call([ok, { ...ok, key: 's', state: new Uint8Array(8) }])).toBeInstanceOf(
        InvalidArgumentError,
      );
      const big = new Uint8Array(store.capabilities.maxStateBytes + 1);
      expect(await call([ok, { ...ok, key: 'big', state: big }])).toBeInstanceOf(RowTooLargeError);
      // Each state fits, together they pass one statement's budget (pg would send them as
      // one hex string of 300 MB): refused, nothing sent, so the core can go another way.
      const third = new Uint8Array(50 * 1024 * 1024);
      third.set(template('x'));
      const together = await call(['p', 'q', 'r'].map((key) => ({ ...ok, key, state: third })));
      expect(together).toBeInstanceOf(RowTooLargeError);
      expect((together as Error).message).toMatch(/nothing was sent/);
    }
    // Nothing was sent: no row, no draw.
    expect(await store.read('in', 'a')).toBeNull();
    expect(await store.incrementCounter(counter, 1)).toBe(1);
  });
});

describe('postgres checkAndSetMany: statements within budget', () => {
  it('rows that together pass one statement budget go in several statements, each applied', async () => {
    const { pool, texts } = recordingPool(1);
    const s = await openStore({ pool, namespace: store.namespace, createSchema: false });
    try {
      const state = new Uint8Array(50 * 1024 * 1024);
      state.set(template('x'));
      const casMany = postgresStatements(postgresNames(store.namespace)).casMany;
      const before = texts.filter((t) => t === casMany).length;
      const results = await s.checkAndSetMany!(
        ['p', 'q', 'r'].map((key) => ({ table: 'budget', key, expected: null, state })),
      );
      expect(results.map((r) => r.ok)).toEqual([true, true, true]);
      // 150 MB of states: one statement would be a 300 MB hex string; two fit the budget.
      expect(texts.filter((t) => t === casMany).length - before).toBe(2);
      expect((await s.read('budget', 'r'))?.state.length).toBe(state.length);
    } finally {
      await s.close();
      await pool.end();
    }
  });
});

describe('postgres checkAndSetStampedMany: SQL text and schema', () => {
  it('sends one fixed statement: no table, key, counter or state text is spliced in', async () => {
    const { pool, texts, values } = recordingPool(1);
    const s = await openStore({ pool, namespace: store.namespace, createSchema: false });
    try {
      const hostile = [
        {
          tables: ['x.y-z_1', 'x.y-z_2'],
          keys: [`'); DROP TABLE "${s.namespace}_rows"; --`, `\\'\\\\ "q" $$`],
          counter: `c'); SELECT 1; --`,
        },
        {
          tables: ['Zq9.Tbl-X', 'Zq9.Tbl-Y'],
          keys: ['$1 $2 \u0000 "q" \\ 😀', 'é\u{10ffff}$fn$'],
          counter: '$$ \u0000 😀 $body$ \\x00',
        },
      ];
      const sent: string[] = [];
      for (const { tables, keys, counter } of hostile) {
        const refs = tables.map((table, i) => ({ table, key: keys[i]! }));
        texts.length = 0;
        values.length = 0;
        const first = applied(
          await many(
            s,
            refs.map((ref) => ({ ...ref, expected: null, state: template(`'; --${ref.key}`) })),
            counter,
          ),
        );
        expect(texts).toHaveLength(1);
        const second = applied(
          await many(
            s,
            refs.map((ref, i) => ({ ...ref, expected: first.versions[i]!, state: template(ref.key) })),
            counter,
          ),
        );
        expect(second.timestamp).toBe(first.timestamp + 1);
        expect(texts).toHaveLength(2);
        for (const t of texts) {
          for (const fragment of [...tables, ...keys, counter, "'); DROP", '😀', '\u0000']) {
            expect(t).not.toContain(fragment);
          }
        }
        // Everything from the requests travels as bound parameters.
        expect(values[0]![0]).toEqual(Buffer.from(counter));
        expect(values[0]![1]).toEqual(tables.map((t) => Buffer.from(t)));
        expect(values[0]![2]).toEqual(keys.map((k) => Buffer.from(k)));
        sent.push(...texts);
        const rows = await s.readMany(refs);
        rows.forEach((row, i) => {
          expect(row).toEqual({
            version: second.versions[i],
            state: writeStamp(template(keys[i]!), second.timestamp),
          });
        });
      }
      // The text does not depend on the request at all.
      expect(new Set(sent).size).toBe(1);
      // The namespace appears only as the function's fixed, quoted identifier, and the one
      // string literal is the setting's name.
      const names = postgresNames(s.namespace);
      expect(sent[0]).toContain(names.casStampedMany);
      expect(sent[0]!.replaceAll(names.casStampedMany, '')).not.toContain(s.namespace);
      expect(sent[0]!.replaceAll("'lock_timeout'", '')).not.toContain("'");
    } finally {
      await s.close();
      await pool.end();
    }
  });

  it('is in the schema SQL, created once: opening a store again does not redefine it', async () => {
    const names = postgresNames(store.namespace);
    expect(postgresSchemaSql(store.namespace)).toContain(
      `CREATE OR REPLACE FUNCTION ${names.casStampedMany}(`,
    );
    const xmin = async () =>
      (
        await admin.query(
          `SELECT xmin::text AS x, provolatile FROM pg_proc WHERE oid = to_regprocedure($1)`,
          [names.casStampedManySignature],
        )
      ).rows;
    const first = await xmin();
    expect(first).toEqual([{ x: expect.any(String), provolatile: 'v' }]);
    await openStore({ namespace: store.namespace });
    expect(await xmin()).toEqual(first);
  });

  it('a schema without the function: capability false and StoreError no; opening with createSchema adds it', async () => {
    const namespace = uniqueNamespace();
    const names = postgresNames(namespace);
    const s = await openStore({ namespace });
    const va = await create(s, 't', 'a', 'a0');
    // As a namespace created before the stamped multi-row CAS existed.
    await admin.query(`DROP FUNCTION ${names.casStampedManySignature}`);

    const old = await openStore({ namespace, createSchema: false });
    expect(old.capabilities.stampedCheckAndSetMany).toBe(false);
    // The other capabilities stay.
    expect(old.capabilities.stampedRead).toBe(true);
    expect(old.capabilities.stampedCheckAndSet).toBe(true);
    const request = { table: 't', key: 'a', expected: va, state: template('a1') };
    const error = await errorOf(many(old, [request], 'c'));
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    expect((error as StoreError).retryable).toBe(false);
    expect((error as StoreError).message).toMatch(/postgresSchemaSql/);
    expect((await old.read('t', 'a'))?.version).toBe(va);
    // A stamped create of one row still works, with the statement that needs no function.
    const created = await old.checkAndSetStamped(
      { table: 't', key: 'n', expected: null, state: template('n1') },
      'c.single',
    );
    expect(created).toEqual({ ok: true, version: expect.any(String), timestamp: 1 });
    expect(
      await old.checkAndSetStamped(
        { table: 't', key: 'n', expected: null, state: template('n2') },
        'c.single',
      ),
    ).toEqual({ ok: false, current: await old.read('t', 'n') });

    // Both functions missing: both capabilities off (one probe answers both).
    await admin.query(`DROP FUNCTION ${names.readStampedSignature}`);
    const older = await openStore({ namespace, createSchema: false });
    expect(older.capabilities.stampedCheckAndSetMany).toBe(false);
    expect(older.capabilities.stampedRead).toBe(false);

    // Opened with createSchema (the default): the functions are created, data untouched.
    const upgraded = await openStore({ namespace });
    expect(upgraded.capabilities.stampedCheckAndSetMany).toBe(true);
    expect(applied(await many(upgraded, [request], 'c')).timestamp).toBe(1);
    expect((await openStore({ namespace, createSchema: false })).capabilities.stampedCheckAndSetMany).toBe(
      true,
    );

    // dropNamespace drops it with the tables; so does dropPostgresNamespace.
    const gone = async (signature: string) =>
      (await admin.query(`SELECT to_regprocedure($1) IS NULL AS gone`, [signature])).rows[0].gone;
    await s.dropNamespace();
    expect(await gone(names.casStampedManySignature)).toBe(true);
    const other = await openStore({ namespace: uniqueNamespace() });
    const otherNames = postgresNames(other.namespace);
    expect(await gone(otherNames.casStampedManySignature)).toBe(false);
    const dropped = await dropPostgresNamespace(other.namespace, { connectionString: url });
    // Listed among its objects: the drop removes exactly what the list shows.
    expect(dropped?.objects).toContain(`${other.namespace}_cas_stamped_many`);
    expect(await gone(otherNames.casStampedManySignature)).toBe(true);
  });
});

describe('postgres checkAndSetStampedMany: a schema with an older function', () => {
  it('counts as one without it: the older body drew before it locked its rows, which deadlocks with the current statements', async () => {
    const namespace = uniqueNamespace();
    const names = postgresNames(namespace);
    await openStore({ namespace });
    const { prosrc } = (
      await admin.query('SELECT prosrc FROM pg_proc WHERE oid = to_regprocedure($1)', [
        names.casStampedManySignature,
      ])
    ).rows[0];
    // Another body (the same with a line added), as an older postgresSchemaSql() made it.
    await admin.query(`CREATE OR REPLACE FUNCTION ${names.casStampedMany}(counter_name bytea, tbls bytea[],
  keys bytea[], expected bigint[], states bytea[], notified_flags boolean[])
RETURNS TABLE (ordinal bigint, row_version bigint, row_state bytea)
LANGUAGE plpgsql VOLATILE
AS $fn$${prosrc}-- older
$fn$`);
    const old = await openStore({ namespace, createSchema: false });
    expect(old.capabilities.stampedCheckAndSetMany).toBe(false);
    expect(old.capabilities.stampedCheckAndSet).toBe(true);
    // Opened with createSchema, the body is replaced.
    expect((await openStore({ namespace })).capabilities.stampedCheckAndSetMany).toBe(true);
    expect((await openStore({ namespace, createSchema: false })).capabilities.stampedCheckAndSetMany).toBe(
      true,
    );
  });
});

describe('postgres checkAndSetStampedMany: failures', () => {
  /** Holds the counter row's lock from another connection, so the call waits on it. */
  async function holdCounter(s: PostgresStore, counter: string): Promise<PgPoolClient> {
    await s.incrementCounter(counter, 1);
    const blocker = await admin.connect();
    await blocker.query('BEGIN');
    await blocker.query(`SELECT 1 FROM "${s.namespace}_counters" WHERE name = $1 FOR UPDATE`, [
      Buffer.from(counter),
    ]);
    return blocker;
  }

  const two = (tail: string): StampedRequest[] => [
    { table: 'f', key: 'b', expected: null, state: template(tail) },
    { table: 'f', key: 'a', expected: null, state: template(tail) },
  ];

  it('reports a connection killed mid-statement as StoreError applied=unknown', async () => {
    const s = await openStore({ namespace: uniqueNamespace() });
    const blocker = await holdCounter(s, 'sm.kill');
    try {
      const pending = many(s, two('x'), 'sm.kill');
      pending.catch(() => {});
      let killed = false;
      for (let i = 0; i < 100 && !killed; i++) {
        const r = await admin.query(
          `SELECT pg_terminate_backend(pid) AS done FROM pg_stat_activity
           WHERE application_name = $1 AND wait_event_type = 'Lock'`,
          [`percolator:${s.namespace}`],
        );
        killed = r.rows.some((row: { done: boolean }) => row.done === true);
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
    // Killed while it waited for the counter: nothing applied, and the store works again.
    expect(await s.readMany(two('x'))).toEqual([null, null]);
    expect(applied(await many(s, two('y'), 'sm.kill')).timestamp).toBe(2);
  });

  it("a wait for the counter ends before queryTimeoutMs, by the server's lock_timeout: StoreError applied=no", async () => {
    // The statement, its own transaction, is rolled back by the server: not applied.
    const s = await openStore({ namespace: uniqueNamespace(), queryTimeoutMs: 300 });
    const blocker = await holdCounter(s, 'sm.slow');
    let error: unknown;
    try {
      error = await errorOf(many(s, two('x'), 'sm.slow'));
    } finally {
      await blocker.query('ROLLBACK');
      blocker.release();
    }
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    expect((error as StoreError).message).toMatch(/lock timeout/i);
  });

  it('maps a server error to StoreError applied=no (the function gone under a running store)', async () => {
    const namespace = uniqueNamespace();
    const s = await openStore({ namespace });
    await admin.query(`DROP FUNCTION ${postgresNames(namespace).casStampedManySignature}`);
    const error = await errorOf(many(s, two('x'), 'c'));
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    expect((error as StoreError).message).toMatch(/42883|does not exist/);
  });

  it('returns timestamps near 2^53 exactly, and refuses one beyond it', async () => {
    const s = await openStore({ namespace: uniqueNamespace() });
    const counter = 'sm.big';
    await s.incrementCounter(counter, Number.MAX_SAFE_INTEGER - 1);
    expect(applied(await many(s, two('x'), counter)).timestamp).toBe(Number.MAX_SAFE_INTEGER);
    const rows = await s.readMany(two('x'));
    const again = two('y').map((r, i) => ({ ...r, expected: rows[i]!.version }));
    // Applied, but the value cannot be a JS number: 'unknown' (it landed), and no retry helps.
    const error = await errorOf(many(s, again, counter));
    expect(error).toBeInstanceOf(StoreError);
    expect(error).toMatchObject({ applied: 'unknown', retryable: false });
    expect((error as StoreError).message).toMatch(/MAX_SAFE_INTEGER/);
  });
});
