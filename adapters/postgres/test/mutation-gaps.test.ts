/**
 * Cases found by mutation testing of the PostgreSQL adapter's failure mapping (errors.ts,
 * and the retries and batches of store.ts that use it): each fails with a small, plausible
 * bug there that the rest of the suite let through. A write's StoreError says 'no' only
 * when the call certainly did not apply; a missing table or function is not retryable.
 */
import { errorOf } from '@percolator/conformance';
import { StoreError } from '@percolator/core';
import { postgresNames } from '@percolator/postgres';
import pg from 'pg';
import { describe, expect, it, vi } from 'vitest';
import type { PgPool } from '../src/pg.js';
import { admin, openStore, uniqueNamespace, url, usePostgresFixture } from './fixture.js';

usePostgresFixture('mg');

const bytes = (text: string) => new TextEncoder().encode(text);
const text = (data: Uint8Array | undefined) => new TextDecoder().decode(data);

/** A stamped state: a format byte, the 8-byte slot, then `tail`. */
const template = (tail: string) => Uint8Array.from([9, 0, 0, 0, 0, 0, 0, 0, 0, ...bytes(tail)]);

function version(result: { ok: boolean; version?: string }): string {
  if (!result.ok || result.version === undefined) throw new Error('the CAS did not apply');
  return result.version;
}

/** A pg pool of the test server's (the caller's: the test ends it). */
function pgPool(config: pg.PoolConfig = {}): pg.Pool {
  const pool = new pg.Pool({ connectionString: url, max: 2, ...config });
  pool.on('error', () => {});
  return pool;
}

describe('postgres store: failures the mapping table does not show', () => {
  it('a checkAndSetMany whose later round trip fails after an earlier one applied is unknown, whatever the error', async () => {
    // The same row twice: two statements, one round trip each. The second is replaced on
    // its way by a statement the server refuses with an ERROR (22012, rolled back: 'no'
    // on its own), after the first has committed.
    const pool = pgPool();
    let casManyCalls = 0;
    let sabotage = false;
    pool.on('acquire', (client: unknown) => {
      const patched = client as unknown as { query: (q: unknown, ...rest: unknown[]) => unknown; mg?: true };
      if (patched.mg) return;
      patched.mg = true;
      const query = patched.query.bind(client);
      patched.query = (q: unknown, ...rest: unknown[]) => {
        const submitted = q as { name?: string; text?: string; values?: unknown[] };
        if (sabotage && /:casMany(Locking)?$/.test(submitted.name ?? '') && ++casManyCalls === 2) {
          submitted.name = undefined;
          submitted.text = 'SELECT 1 / 0';
          submitted.values = [];
        }
        return query(q, ...rest);
      };
    });
    try {
      const s = await openStore({ pool: pool as unknown as PgPool, namespace: uniqueNamespace() });
      const v = version(await s.checkAndSet({ table: 'two', key: 'a', expected: null, state: bytes('a0') }));
      sabotage = true;
      const error = await errorOf(
        s.checkAndSetMany([
          { table: 'two', key: 'a', expected: v, state: bytes('a1') },
          { table: 'two', key: 'a', expected: '1', state: bytes('a2') },
        ]),
      );
      sabotage = false;
      expect(casManyCalls).toBe(2);
      expect(error).toBeInstanceOf(StoreError);
      expect((error as StoreError).applied).toBe('unknown');
      // The first round trip did apply.
      expect(text((await s.read('two', 'a'))?.state)).toBe('a1');
      await s.close();
    } finally {
      await pool.end();
    }
  });

  it('a deadlock victim (40P01) rolled back whole is sent again and applies', async () => {
    // The store's sessions look for a deadlock after 2 s of waiting, the blocker's never:
    // so the store's statement is the victim, whatever the machine's speed.
    const application = `mg-deadlock-${uniqueNamespace()}`;
    const pool = pgPool({ options: '-c deadlock_timeout=2000', application_name: application });
    const blocker = await admin.connect();
    try {
      const s = await openStore({ pool: pool as unknown as PgPool, namespace: uniqueNamespace() });
      const va = version(await s.checkAndSet({ table: 'dl', key: 'a', expected: null, state: bytes('a0') }));
      const vb = version(await s.checkAndSet({ table: 'dl', key: 'b', expected: null, state: bytes('b0') }));
      const rowSql = `SELECT 1 FROM "${s.namespace}_rows" WHERE tbl = $1 AND key = $2 FOR UPDATE`;
      await blocker.query('BEGIN');
      await blocker.query("SET LOCAL deadlock_timeout = '1h'");
      await blocker.query(rowSql, [Buffer.from('dl'), Buffer.from('b')]);
      // Takes a, then waits for b (it locks its rows in (table, key) order).
      const pending = s.checkAndSetMany([
        { table: 'dl', key: 'a', expected: va, state: bytes('a1') },
        { table: 'dl', key: 'b', expected: vb, state: bytes('b1') },
      ]);
      pending.catch(() => {});
      await vi.waitFor(
        async () => {
          const waiting = await admin.query(
            "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
            [application],
          );
          expect(waiting.rows[0].n).toBeGreaterThan(0);
        },
        { timeout: 10_000, interval: 20 },
      );
      // Now the blocker waits for a: a cycle. The store's session breaks it by failing its
      // statement (40P01); a is free, and the store sends the statement again.
      await blocker.query(rowSql, [Buffer.from('dl'), Buffer.from('a')]);
      await blocker.query('ROLLBACK');
      const results = await pending;
      expect(results.map((r) => r.ok)).toEqual([true, true]);
      expect(text((await s.read('dl', 'a'))?.state)).toBe('a1');
      expect(text((await s.read('dl', 'b'))?.state)).toBe('b1');
      await s.close();
    } finally {
      await blocker.query('ROLLBACK').catch(() => {});
      blocker.release();
      await pool.end();
    }
  });

  it('a function of the namespace dropped under a running store (42883): no, and not retryable', async () => {
    const s = await openStore({ namespace: uniqueNamespace() });
    expect(s.capabilities.stampedCheckAndSetMany).toBe(true);
    await admin.query(`DROP FUNCTION ${postgresNames(s.namespace).casStampedManySignature}`);
    const error = await errorOf(
      s.checkAndSetStampedMany!([{ table: 't', key: 'k', expected: null, state: template('x') }], 'c'),
    );
    expect(error).toBeInstanceOf(StoreError);
    expect(((error as StoreError).cause as { code?: string }).code).toBe('42883');
    expect(error).toMatchObject({ applied: 'no', retryable: false });
  });

  it('a schema change that fails inside its transaction does not hand the connection back inside it', async () => {
    // One connection, the caller's. A view on the rows table makes the DROP TABLE of
    // dropNamespace fail (2BP01) after its DROP FUNCTIONs ran, inside one transaction.
    const pool = pgPool({ max: 1 });
    const namespace = uniqueNamespace();
    const view = `"${namespace}_mg_view"`;
    try {
      const s = await openStore({ pool: pool as unknown as PgPool, namespace });
      await s.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('0') });
      await admin.query(`CREATE VIEW ${view} AS SELECT * FROM "${namespace}_rows"`);
      const error = await errorOf(s.dropNamespace());
      expect(error).toBeInstanceOf(StoreError);
      expect(((error as StoreError).cause as { code?: string }).code).toBe('2BP01');
      expect((error as StoreError).applied).toBe('no');
      // The pool's one connection is in no transaction (an aborted one would refuse every
      // statement with 25P02), and the whole change was rolled back.
      expect((await pool.query('SELECT 1 AS one')).rows).toEqual([{ one: 1 }]);
      expect(text((await s.read('t', 'k'))?.state)).toBe('0');
      expect(s.capabilities.stampedCheckAndSetMany).toBe(true);
      const stamped = await s.checkAndSetStampedMany!(
        [{ table: 't', key: 'n', expected: null, state: template('n') }],
        'c',
      );
      expect(stamped.ok).toBe(true);
      await admin.query(`DROP VIEW ${view}`);
      await s.close();
    } finally {
      await admin.query(`DROP VIEW IF EXISTS ${view}`).catch(() => {});
      await pool.end();
    }
  });

  it('a client pg refuses to send on ("not queryable") is no: nothing was sent; retryable', async () => {
    // A pool that hands out, once, a client pg has already closed.
    const real = pgPool();
    const closed = new pg.Client({ connectionString: url });
    await closed.connect();
    await closed.end();
    let handOutClosed = false;
    const pool = {
      connect: async () => {
        if (!handOutClosed) return real.connect();
        handOutClosed = false;
        return {
          query: (...args: unknown[]) => (closed.query as (...a: unknown[]) => unknown)(...args),
          release: () => {},
          on: () => {},
          removeListener: () => {},
        };
      },
      query: real.query.bind(real),
      on: real.on.bind(real),
      end: () => real.end(),
    };
    try {
      const s = await openStore({ pool: pool as unknown as PgPool, namespace: uniqueNamespace() });
      const v = version(await s.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('0') }));
      handOutClosed = true;
      const error = await errorOf(s.checkAndSet({ table: 't', key: 'k', expected: v, state: bytes('1') }));
      expect(error).toBeInstanceOf(StoreError);
      expect((error as Error).message).toMatch(/not queryable/);
      expect(error).toMatchObject({ applied: 'no', retryable: true });
      expect(text((await s.read('t', 'k'))?.state)).toBe('0');
      await s.close();
    } finally {
      await real.end();
    }
  });
});
