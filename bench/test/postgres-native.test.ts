import { randomBytes } from 'node:crypto';
import { resolvePostgresUrl } from '@percolator/postgres';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { encodeValue, initialRows } from '../src/dataset.js';
import {
  PostgresNativeData,
  PostgresNativeEngine,
  SQL_ISOLATIONS,
  type SqlIsolation,
} from '../src/engines/postgres.js';

/**
 * The PostgreSQL native baseline must not deadlock: a deadlock waits out deadlock_timeout
 * (1 s by default) before PostgreSQL breaks it, and the contention cells would then
 * measure that wait, not the store's transactions (the report once claimed Percolator ran
 * at 17.99x of REPEATABLE READ at 2 hot accounts).
 */
let data: PostgresNativeData;

beforeAll(async () => {
  data = await PostgresNativeData.create(
    resolvePostgresUrl(),
    `bench_${randomBytes(4).toString('hex')}_native`,
    4,
  );
  // The bench's account table, so the statements run on the plans they get in a run.
  await data.load('acct', initialRows('acct', { records: 0, accounts: 256, valueBytes: 16 }));
});

afterAll(() => data?.drop());

/** Waits until `n` statements on the test's schema are waiting for a row lock. */
async function waitForLockWaiters(n: number): Promise<void> {
  const client = await data.pool.connect();
  try {
    for (let i = 0; i < 400; i++) {
      const result = await client.query(
        "SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1",
        [`%${data.schema}%`],
      );
      if (Number(result.rows[0]?.n) >= n) return;
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
    throw new Error(`${n} statements never waited for a lock`);
  } finally {
    client.release();
  }
}

test.each<SqlIsolation>(SQL_ISOLATIONS)(
  '%s: two transfers between the same accounts in opposite directions never deadlock',
  async (variant) => {
    const engine = new PostgresNativeEngine(data, variant, 20);
    const [a, b] = ['acct0000000', 'acct0000001'];
    const before = await data.snapshot('acct');
    const transfer = (from: string, to: string) =>
      engine.transact(async (tx) => {
        const [f, t] = await tx.read('acct', [from, to], { forUpdate: true });
        tx.write('acct', [
          [from, encodeValue(Number.parseInt(f!, 10) - 1, 16)],
          [to, encodeValue(Number.parseInt(t!, 10) + 1, 16)],
        ]);
      });
    // Another session holds row a, so the transfers queue in a known order: a -> b first,
    // then b -> a. Locked by the UPDATE in the order of its arguments, the second would
    // hold b while waiting for a, and the first, once it gets a, would wait for b: a
    // deadlock. Locked while reading, in key order, both wait for a and nothing deadlocks.
    const blocker = await data.pool.connect();
    try {
      await blocker.query('BEGIN');
      await blocker.query(`SELECT v FROM ${data.table} WHERE tbl = 'acct' AND k = $1 FOR UPDATE`, [a]);
      const first = transfer(a, b);
      await waitForLockWaiters(1);
      const second = transfer(b, a);
      await waitForLockWaiters(2);
      await blocker.query('COMMIT');
      await Promise.all([first, second]);
    } finally {
      blocker.release();
    }
    expect(engine.counters().deadlocks).toBe(0);
    // Both transfers committed once each: the balances are back where they were.
    const after = await data.snapshot('acct');
    expect(after.get(a)).toBe(before.get(a));
    expect(after.get(b)).toBe(before.get(b));
  },
);
