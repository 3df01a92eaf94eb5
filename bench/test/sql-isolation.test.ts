import { randomBytes } from 'node:crypto';
import { resolveMySqlUrl } from '@percolator/mysql';
import { resolvePostgresUrl } from '@percolator/postgres';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { initialRows } from '../src/dataset.js';
import { MySqlNativeData, MySqlNativeEngine } from '../src/engines/mysql.js';
import { PostgresNativeData, PostgresNativeEngine, type SqlIsolation } from '../src/engines/postgres.js';

/**
 * Each SQL baseline runs at the level its name says. A ratio against "RC" that ran at
 * REPEATABLE READ (or the reverse) would compare Percolator with the wrong transaction.
 * The check is what the level does, not a setting read back: a second read in the same
 * transaction sees a commit made in between at READ COMMITTED, and does not at
 * REPEATABLE READ or SERIALIZABLE (PostgreSQL). InnoDB's SERIALIZABLE takes a shared lock
 * on every plain read, so there a concurrent locking read of the row fails at once.
 */
const SHAPE = { records: 0, accounts: 4, valueBytes: 16 };
const ROW = 'acct0000000';

/** Reads ROW twice in one transaction of `engine`, with `between` run in between. */
async function readTwice(
  engine: PostgresNativeEngine | MySqlNativeEngine,
  between: () => Promise<void>,
): Promise<[string | undefined, string | undefined]> {
  const outcome = await engine.transact(async (tx) => {
    const [first] = await tx.read('acct', [ROW]);
    await between();
    const [second] = await tx.read('acct', [ROW]);
    return [first, second] as [string | undefined, string | undefined];
  });
  return outcome.value;
}

describe('PostgreSQL', () => {
  let data: PostgresNativeData;
  beforeAll(async () => {
    data = await PostgresNativeData.create(
      resolvePostgresUrl(),
      `bench_${randomBytes(4).toString('hex')}_iso`,
      4,
    );
    await data.load('acct', initialRows('acct', SHAPE));
  });
  afterAll(() => data?.drop());

  let n = 0;
  const commitElsewhere = async () => {
    await data.pool.query(`UPDATE ${data.table} SET v = $1 WHERE tbl = 'acct' AND k = $2`, [
      `${++n}:pg`,
      ROW,
    ]);
  };

  test.each<[SqlIsolation, boolean]>([
    ['read-committed', true],
    ['repeatable-read', false],
    ['serializable', false],
  ])('%s: a second read sees a commit made in between: %s', async (level, sees) => {
    const engine = new PostgresNativeEngine(data, level, 1);
    const [first, second] = await readTwice(engine, commitElsewhere);
    expect(second).toBe(sees ? `${n}:pg` : first);
    expect(first).not.toBe(`${n}:pg`);
  });
});

describe('MariaDB', () => {
  let data: MySqlNativeData;
  beforeAll(async () => {
    data = await MySqlNativeData.create(resolveMySqlUrl(), `bench_${randomBytes(4).toString('hex')}_iso`, 4);
    await data.load('acct', initialRows('acct', SHAPE));
  });
  afterAll(() => data?.drop());

  let n = 0;
  const commitElsewhere = async () => {
    await data.pool.query(`UPDATE ${data.table} SET v = ? WHERE tbl = 'acct' AND k = ?`, [`${++n}:my`, ROW]);
  };

  test.each<[SqlIsolation, boolean]>([
    ['read-committed', true],
    ['repeatable-read', false],
  ])('%s: a second read sees a commit made in between: %s', async (level, sees) => {
    const engine = new MySqlNativeEngine(data, level, 1);
    const [first, second] = await readTwice(engine, commitElsewhere);
    expect(second).toBe(sees ? `${n}:my` : first);
    expect(first).not.toBe(`${n}:my`);
  });

  test('serializable: a plain read holds a shared lock on the row until the end', async () => {
    const engine = new MySqlNativeEngine(data, 'serializable', 1);
    let refused: unknown;
    await readTwice(engine, async () => {
      refused = await data.pool
        .query(`SELECT v FROM ${data.table} WHERE tbl = 'acct' AND k = ? FOR UPDATE NOWAIT`, [ROW])
        .then(
          () => undefined,
          (error: unknown) => error,
        );
    });
    // ER_LOCK_WAIT_TIMEOUT: NOWAIT gave up on the lock the serializable read holds.
    expect((refused as { errno?: number } | undefined)?.errno).toBe(1205);
    // And after the end the row is free again.
    await data.pool.query(`SELECT v FROM ${data.table} WHERE tbl = 'acct' AND k = ? FOR UPDATE NOWAIT`, [
      ROW,
    ]);
  });
});
