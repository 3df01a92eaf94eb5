/**
 * checkAndSetStampedMany (capability stampedCheckAndSetMany) on a real server: one drawn
 * value stamped into every row, all or nothing, versions in request order, the failure
 * paths (at once, and at a row the call had to wait for), rows locked in (table, key) byte
 * order whatever the request order, no deadlock among concurrent calls over overlapping
 * rows in any order (nor with the other stamped statements), the guarantee the core relies
 * on (whoever draws a later counter value and then reads sees every row), the schema's
 * procedure, failure mapping, and no text spliced into SQL.
 */
import { errorOf, stampOf } from '@percolator/conformance';
import {
  type CasRequest,
  InvalidArgumentError,
  RowTooLargeError,
  type StampedManyResult,
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
import { beforeAll, describe, expect, it, vi } from 'vitest';
import {
  admin,
  store as fileStore,
  lockingSession,
  openStore,
  recordingPool,
  uniqueNamespace,
  url,
  useMySqlFixture,
  userPool,
} from './fixture.js';

const bytes = (text: string) => new TextEncoder().encode(text);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A stamped state: a format byte, the 8-byte slot (placeholder), then `tail`. */
const template = (tail: Uint8Array | string) =>
  Uint8Array.from([9, 0, 0, 0, 0, 0, 0, 0, 0, ...(typeof tail === 'string' ? bytes(tail) : tail)]);

type StampedRequest = CasRequest & { readonly state: Uint8Array };

function applied(result: StampedManyResult): { versions: readonly string[]; timestamp: number } {
  if (!result.ok)
    throw new Error(`expected the stamped CAS of many rows to apply: ${JSON.stringify(result)}`);
  return result;
}

/** Creates `keys` of `table` with plain CAS; their versions, in order. */
async function create(s: MySqlStore, table: string, keys: readonly string[], tail = 'init') {
  const versions: string[] = [];
  for (const key of keys) {
    const r = await s.checkAndSet({ table, key, expected: null, state: template(`${tail}.${key}`) });
    if (!r.ok) throw new Error(`setup: ${table}/${key} exists`);
    versions.push(r.version);
  }
  return versions;
}

/** A write InnoDB rolled back as a deadlock victim (past every resend): not applied, retryable. */
const isDeadlockVictim = (error: unknown) =>
  error instanceof StoreError &&
  error.applied === 'no' &&
  error.retryable &&
  /ER_LOCK_DEADLOCK/.test(error.message);

/** Every row of `keys` left is the whole work of one write that applied: its version, and its stamp. */
async function expectWholeWrites(
  table: string,
  keys: readonly string[],
  applied: ReadonlyMap<string, number>,
) {
  const rows = await store.readMany(keys.map((key) => ({ table, key })));
  for (const row of rows) {
    if (row === null) continue;
    expect(applied.has(row.version)).toBe(true);
    expect(stampOf(row.state)).toBe(applied.get(row.version));
  }
}

/**
 * What the racing tests share: `count` keys, a second store on the same namespace (even
 * workers use `store`, odd ones `other`), the writes that applied (version -> stamp), and
 * `victim`, a catch that counts a deadlock victim (and rethrows anything else).
 */
async function racers(prefix: string, count: number) {
  const keys = Array.from({ length: count }, (_, i) => `${prefix}${i}`);
  const other = await openStore({ namespace: store.namespace, createSchema: false, maxConnections: 10 });
  const applied = new Map<string, number>();
  const tally = { victims: 0 };
  const victim = (error: unknown): undefined => {
    if (!isDeadlockVictim(error)) throw error;
    tally.victims++;
    return undefined;
  };
  return { keys, applied, tally, victim, storeOf: (id: number) => (id % 2 === 0 ? store : other) };
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

/**
 * A statement inside the procedure as INNODB_TRX shows it while it waits (local variables
 * appear as NAME_CONST('v_key', _binary'<key>' ...)), for one key.
 */
const waitingIn = (namespace: string, statement: 'lock' | 'write', key: string) => (query: string) =>
  (statement === 'lock'
    ? query.startsWith(`SELECT COUNT(*) = 1 INTO v_ok FROM \`${namespace}_rows\``)
    : query.startsWith(`UPDATE \`${namespace}_rows\``)) && query.includes(`_binary'${key}'`);

/**
 * The fixed-slot procedures' locking read of the rows a call updates, as INNODB_TRX shows it
 * while it waits: one statement for all of them (every key is in its text).
 */
const waitingInSlotsLock = (namespace: string) => (query: string) =>
  query.startsWith("SELECT COUNT(*) =  NAME_CONST('p_updates',") &&
  query.includes(`FROM \`${namespace}_rows\``);

/** Resolves to 'pending' if `promise` has not settled within `ms`. */
async function settledWithin<T>(promise: Promise<T>, ms: number): Promise<T | 'pending'> {
  return Promise.race([promise, sleep(ms).then(() => 'pending' as const)]);
}

async function counterValue(s: MySqlStore, counter: string): Promise<number | undefined> {
  const [values] = await admin.query<RowDataPacket[]>(
    `SELECT CAST(value AS CHAR) AS value FROM \`${s.namespace}_counters\` WHERE name = ?`,
    [Buffer.from(counter)],
  );
  return values.length === 0 ? undefined : Number(values[0]!.value);
}

async function openTransactions(pool: Pool): Promise<number> {
  const [state] = await pool.query<RowDataPacket[]>('SELECT @@in_transaction AS open');
  return Number(state[0]!.open);
}

function shuffled<T>(items: readonly T[]): T[] {
  const out = [...items];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

useMySqlFixture('sm');

/**
 * A step of up to 16 rows goes to the smallest fixed-slot procedure it fits, a larger one to
 * the many-row procedure (schema.ts). Every test runs against both: `store` is the file's
 * store (its schema has every procedure), or a store on a namespace without the fixed-slot
 * procedures, where the many-row procedure takes every step (a schema from an older script).
 * A test of one procedure's own statements (what it waits in, its SQL text) is defined for
 * that one only.
 */
const VARIANTS = ['fixed slots', 'many-row procedure'] as const;
let store: MySqlStore;

/** A store on a new namespace whose schema lacks the fixed-slot procedures. */
async function manyRowOnly(): Promise<MySqlStore> {
  const namespace = uniqueNamespace();
  await openStore({ namespace });
  for (const { name } of mysqlNames(namespace).stampedSlots) await admin.query(`DROP PROCEDURE ${name}`);
  return openStore({ namespace, createSchema: false });
}

for (const variant of VARIANTS) {
  describe(`mysql stamped check-and-set of many rows (${variant})`, () => {
    const SLOTS: boolean = variant === 'fixed slots';
    const MANY: boolean = variant === 'many-row procedure';
    beforeAll(async () => {
      store = SLOTS ? fileStore : await manyRowOnly();
    });

    describe('mysql stamped check-and-set of many rows: the step', () => {
      it('declares stampedCheckAndSetMany', () => {
        expect(store.capabilities.stampedCheckAndSetMany).toBe(true);
        expect(typeof store.checkAndSetStampedMany).toBe('function');
      });

      it('stamps every row with the one value drawn, versions in request order (not key order)', async () => {
        const counter = 'sm.one';
        const base = await store.incrementCounter(counter, 41);
        const [vz, va] = await create(store, 'one.b', ['z', 'a']);
        // Deliberately out of (table, key) order: tables and keys both descend and interleave.
        const requests: StampedRequest[] = [
          { table: 'one.b', key: 'z', expected: vz!, state: template('z2'), notified: true },
          { table: 'one.a', key: 'm', expected: null, state: template('m1') },
          { table: 'one.b', key: 'a', expected: va!, state: template('a2') },
          { table: 'one.a', key: 'c', expected: null, state: template('c1'), notified: true },
        ];
        const r = applied(await store.checkAndSetStampedMany(requests, counter));
        expect(r.timestamp).toBe(base + 1);
        expect(r.versions).toHaveLength(4);
        expect(new Set(r.versions).size).toBe(4);
        for (const [i, request] of requests.entries()) {
          expect(await store.read(request.table, request.key)).toEqual({
            version: r.versions[i],
            state: writeStamp(request.state, r.timestamp),
          });
          expect(stampOf((await store.read(request.table, request.key))!.state)).toBe(base + 1);
        }
        // The request states were not touched (the core stamps its own copy afterwards).
        expect(requests[0]!.state).toEqual(template('z2'));
        // notified went with each row.
        expect(await store.scanNotified('one.a', { limit: 10 })).toEqual(['c']);
        expect(await store.scanNotified('one.b', { limit: 10 })).toEqual(['z']);
        // One draw for all rows.
        expect(await store.incrementCounter(counter, 1)).toBe(base + 2);
      });

      it('mixes creates and updates, and a single request works too', async () => {
        const counter = 'sm.mixed';
        const [v1] = await create(store, 'mix', ['u1']);
        const r = applied(
          await store.checkAndSetStampedMany(
            [
              { table: 'mix', key: 'n1', expected: null, state: template('n1') },
              { table: 'mix', key: 'u1', expected: v1!, state: template('u1') },
              { table: 'mix', key: 'n0', expected: null, state: template('n0') },
            ],
            counter,
          ),
        );
        expect(r.timestamp).toBe(1);
        const rows = await store.readMany([
          { table: 'mix', key: 'n1' },
          { table: 'mix', key: 'u1' },
          { table: 'mix', key: 'n0' },
        ]);
        expect(rows).toEqual([
          { version: r.versions[0], state: writeStamp(template('n1'), 1) },
          { version: r.versions[1], state: writeStamp(template('u1'), 1) },
          { version: r.versions[2], state: writeStamp(template('n0'), 1) },
        ]);
        const again = applied(
          await store.checkAndSetStampedMany(
            [{ table: 'mix', key: 'n0', expected: r.versions[2]!, state: template('n0.2') }],
            counter,
          ),
        );
        expect(again.timestamp).toBe(2);
        expect(await store.read('mix', 'n0')).toEqual({
          version: again.versions[0],
          state: writeStamp(template('n0.2'), 2),
        });
      });

      it('64 rows (the most a shared step carries), keys and states of many sizes: applied whole with one stamp; with its last row stale, nothing written', async () => {
        // _v4 cuts each entry out of the rows argument by offset: every boundary, the last
        // entry's included, and every slice of the packed states must land on its own row.
        // Keys with brackets and non-ASCII text travel as hex, so none reaches the argument.
        const counter = 'sm.wide';
        const keys = Array.from({ length: 64 }, (_, i) =>
          i % 3 === 0
            ? `[w${i}]`
            : i % 3 === 1
              ? `ключ-${i}-${'k'.repeat(i)}`
              : `w${String(i).padStart(3, '0')}`,
        );
        const updated = keys.filter((_, i) => i % 2 === 0);
        const versions = new Map(
          (await create(store, 'wide', updated)).map((version, i) => [updated[i]!, version] as const),
        );
        const request = (key: string, i: number, round: string): StampedRequest => ({
          table: 'wide',
          key,
          expected: versions.get(key) ?? null,
          state: template(`${round}.${key}.${'s'.repeat(i * 13)}`),
          notified: i % 5 === 0,
        });
        const stale = keys.map((key, i) => request(key, i, 'stale'));
        // The last row in key order names a version it never had: nothing may be written.
        const last = [...keys].sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b))).at(-1)!;
        const at = keys.indexOf(last);
        stale[at] = { ...stale[at]!, expected: '1' };
        const before = await store.readMany(keys.map((key) => ({ table: 'wide', key })));
        expect((await store.checkAndSetStampedMany(stale, counter)).ok).toBe(false);
        expect(await store.readMany(keys.map((key) => ({ table: 'wide', key })))).toEqual(before);

        const requests = keys.map((key, i) => request(key, i, 'r1'));
        const r = applied(await store.checkAndSetStampedMany(requests, counter));
        const rows = await store.readMany(keys.map((key) => ({ table: 'wide', key })));
        expect(rows).toEqual(
          requests.map((q, i) => ({ version: r.versions[i], state: writeStamp(q.state, r.timestamp) })),
        );
        expect(await store.scanNotified('wide', { limit: 100 })).toEqual(
          keys.filter((_, i) => i % 5 === 0).sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b))),
        );
      });

      it('one stale expected among several: ok false, no row changed, every row answered, nothing drawn', async () => {
        const counter = 'sm.stale';
        const keys = ['s1', 's2', 's3', 's4'];
        const versions = await create(store, 'stale', keys);
        const before = await store.readMany(keys.map((key) => ({ table: 'stale', key })));
        const drawn = await store.incrementCounter(counter, 1);
        const requests: StampedRequest[] = keys.map((key, i) => ({
          table: 'stale',
          key,
          // s3's expected version is one it had never had.
          expected: i === 2 ? String(BigInt(versions[i]!) - 1n) : versions[i]!,
          state: template(`new.${key}`),
        }));
        const absent: StampedRequest = { table: 'stale', key: 's0', expected: null, state: template('s0') };
        const result = await store.checkAndSetStampedMany(
          [requests[3]!, absent, ...requests.slice(0, 3)],
          counter,
        );
        expect(result).toEqual({ ok: false, current: [before[3], null, before[0], before[1], before[2]] });
        expect(await store.readMany(keys.map((key) => ({ table: 'stale', key })))).toEqual(before);
        expect(await store.read('stale', 's0')).toBeNull();
        // An update of an absent row fails the same way.
        expect(
          await store.checkAndSetStampedMany(
            [{ table: 'stale', key: 'gone', expected: versions[0]!, state: template('x') }, requests[0]!],
            counter,
          ),
        ).toEqual({ ok: false, current: [null, before[0]] });
        // A version this store never issues: fails without being sent, the rows read instead.
        expect(
          await store.checkAndSetStampedMany(
            [requests[1]!, { table: 'stale', key: 's1', expected: 'bogus', state: template('x') }],
            counter,
          ),
        ).toEqual({ ok: false, current: [before[1], before[0]] });
        expect(await store.readMany(keys.map((key) => ({ table: 'stale', key })))).toEqual(before);
        // No failure drew from the counter.
        expect(await store.incrementCounter(counter, 1)).toBe(drawn + 1);
      });

      it.each([
        ['with FOUND_ROWS (mysql2 default)', [] as string[]],
        ['without FOUND_ROWS', ['-FOUND_ROWS']],
      ])('a create tells inserted from present by its affected rows, %s', async (_, flags) => {
        // The procedure's create is INSERT ... ON DUPLICATE KEY UPDATE version = version ^ 1:
        // 1 row affected = inserted, 2 = the row was there (changed, then rolled back). The
        // client flag FOUND_ROWS changes the count only for a row set to its current values.
        const s = await openStore({
          pool: userPool({ flags }),
          namespace: store.namespace,
          createSchema: false,
        });
        const table = `flags${flags.length}`;
        const counter = `sm.flags${flags.length}`;
        const first = applied(
          await s.checkAndSetStampedMany(
            [
              { table, key: 'a', expected: null, state: template('a') },
              { table, key: 'b', expected: null, state: template('b') },
            ],
            counter,
          ),
        );
        const before = await s.readMany([
          { table, key: 'a' },
          { table, key: 'b' },
        ]);
        expect(before.map((row) => row?.version)).toEqual(first.versions);
        const refused = await s.checkAndSetStampedMany(
          [
            { table, key: 'b', expected: null, state: template('b2') },
            { table, key: 'c', expected: null, state: template('c') },
          ],
          counter,
        );
        expect(refused).toEqual({ ok: false, current: [before[1], null] });
        expect(await s.read(table, 'b')).toEqual(before[1]);
        expect(await s.read(table, 'c')).toBeNull();
        expect(await counterValue(s, counter)).toBe(first.timestamp);
      });

      it('a create of a present row: ok false, and none of the other creates or updates is written', async () => {
        const counter = 'sm.present';
        const [vp, vq] = await create(store, 'present', ['p', 'q']);
        const before = await store.readMany([
          { table: 'present', key: 'p' },
          { table: 'present', key: 'q' },
        ]);
        const result = await store.checkAndSetStampedMany(
          [
            { table: 'present', key: 'a', expected: null, state: template('a') },
            { table: 'present', key: 'q', expected: vq!, state: template('q2') },
            { table: 'present', key: 'p', expected: null, state: template('p2') },
            { table: 'present', key: 'z', expected: null, state: template('z') },
          ],
          counter,
        );
        expect(result).toEqual({ ok: false, current: [null, before[1], before[0], null] });
        expect(await store.read('present', 'a')).toBeNull();
        expect(await store.read('present', 'z')).toBeNull();
        expect(await store.read('present', 'p')).toEqual(before[0]);
        expect(await store.read('present', 'q')).toEqual(before[1]);
        expect(vp).toBe(before[0]!.version);
        expect(await counterValue(store, counter)).toBeUndefined();
      });

      if (MANY)
        it('rows locked in key order; a row changed while the call waits for it: rolled back whole, rows as they are now', async () => {
          const counter = 'sm.race';
          const [va, vb] = await create(store, 'race', ['a', 'b']);
          const blocker = await admin.getConnection();
          try {
            await blocker.query('BEGIN');
            await blocker.query(
              `SELECT 1 FROM \`${store.namespace}_rows\` WHERE tbl = ? AND row_key = ? FOR UPDATE`,
              [Buffer.from('race'), Buffer.from('b')],
            );
            const pending = store.checkAndSetStampedMany(
              [
                { table: 'race', key: 'b', expected: vb!, state: template('b2') },
                { table: 'race', key: 'a', expected: va!, state: template('a2') },
                // Sorts first: INSERTed, then rolled back with the rest.
                { table: 'race', key: '0', expected: null, state: template('02') },
              ],
              counter,
            );
            pending.catch(() => {});
            // Sent in key order ('0', 'a', 'b'), not request order: it created '0', locked 'a',
            // and waits for 'b' while holding both.
            await untilLockWait(waitingIn(store.namespace, 'lock', 'b'));
            for (const key of ['0', 'a']) {
              const held = await errorOf(
                admin.query(
                  `SELECT 1 FROM \`${store.namespace}_rows\` WHERE tbl = ? AND row_key = ? FOR UPDATE NOWAIT`,
                  [Buffer.from('race'), Buffer.from(key)],
                ),
              );
              expect((held as Error).message).toMatch(/lock wait timeout/i);
            }
            await blocker.query(
              `UPDATE \`${store.namespace}_rows\` SET version = version + 1, state = ? WHERE tbl = ? AND row_key = ?`,
              [Buffer.from(template('theirs')), Buffer.from('race'), Buffer.from('b')],
            );
            await blocker.query('COMMIT');
            const result = await pending;
            const b = { version: String(BigInt(vb!) + 1n), state: template('theirs') };
            const a = (await store.read('race', 'a'))!;
            expect(result).toEqual({ ok: false, current: [b, a, null] });
            expect(a.version).toBe(va);
            expect(await store.read('race', '0')).toBeNull();
            expect(await counterValue(store, counter)).toBeUndefined();
          } finally {
            await blocker.query('ROLLBACK').catch(() => {});
            blocker.release();
          }
        });

      if (SLOTS)
        it('fixed slots: the rows it updates are locked first, in one statement, then its creates; a row changed while the call waits: rolled back whole, nothing created or drawn', async () => {
          const counter = 'sm.slots.race';
          const [va, vb] = await create(store, 'slots.race', ['a', 'b']);
          const blocker = await admin.getConnection();
          try {
            await blocker.query('BEGIN');
            await blocker.query(
              `SELECT 1 FROM \`${store.namespace}_rows\` WHERE tbl = ? AND row_key = ? FOR UPDATE`,
              [Buffer.from('slots.race'), Buffer.from('b')],
            );
            const pending = store.checkAndSetStampedMany(
              [
                { table: 'slots.race', key: 'b', expected: vb!, state: template('b2') },
                { table: 'slots.race', key: 'a', expected: va!, state: template('a2') },
                // Sorts first, but a create: locked after the updates, so not yet.
                { table: 'slots.race', key: '0', expected: null, state: template('02') },
              ],
              counter,
            );
            pending.catch(() => {});
            // One locking read of both updated rows, in key order: it holds 'a' and waits for 'b'.
            await untilLockWait(waitingInSlotsLock(store.namespace));
            const held = await errorOf(
              admin.query(
                `SELECT 1 FROM \`${store.namespace}_rows\` WHERE tbl = ? AND row_key = ? FOR UPDATE NOWAIT`,
                [Buffer.from('slots.race'), Buffer.from('a')],
              ),
            );
            expect((held as Error).message).toMatch(/lock wait timeout/i);
            const [created] = await admin.query<RowDataPacket[]>(
              `SELECT COUNT(*) AS n FROM \`${store.namespace}_rows\` WHERE tbl = ? AND row_key = ?`,
              [Buffer.from('slots.race'), Buffer.from('0')],
            );
            expect(Number(created[0]!.n)).toBe(0);
            // Nor is the gap where '0' would go locked yet: another writer creates a key next
            // to it at once (a locked gap made two calls creating keys in one gap, each
            // waiting for a row it updates, deadlock though they shared no row).
            const neighbour = store.checkAndSet({
              table: 'slots.race',
              key: '1',
              expected: null,
              state: template('1'),
            });
            expect(await settledWithin(neighbour, 5_000)).toMatchObject({ ok: true });
            await blocker.query(
              `UPDATE \`${store.namespace}_rows\` SET version = version + 1, state = ? WHERE tbl = ? AND row_key = ?`,
              [Buffer.from(template('theirs')), Buffer.from('slots.race'), Buffer.from('b')],
            );
            await blocker.query('COMMIT');
            const result = await pending;
            const b = { version: String(BigInt(vb!) + 1n), state: template('theirs') };
            const a = (await store.read('slots.race', 'a'))!;
            expect(result).toEqual({ ok: false, current: [b, a, null] });
            expect(a.version).toBe(va);
            expect(await store.read('slots.race', '0')).toBeNull();
            expect(await counterValue(store, counter)).toBeUndefined();
          } finally {
            await blocker.query('ROLLBACK').catch(() => {});
            blocker.release();
          }
        });

      it('refuses bad input before sending anything', async () => {
        const counter = 'sm.bad';
        const row = (key: string): StampedRequest => ({
          table: 'bad',
          key,
          expected: null,
          state: template(key),
        });
        const dup = await errorOf(store.checkAndSetStampedMany([row('x'), row('y'), row('x')], counter));
        expect(dup).toBeInstanceOf(InvalidArgumentError);
        expect((dup as Error).message).toMatch(/twice/);
        const noState = await errorOf(
          store.checkAndSetStampedMany(
            [row('x'), { ...row('y'), state: null as unknown as Uint8Array }],
            counter,
          ),
        );
        expect(noState).toBeInstanceOf(InvalidArgumentError);
        const max = store.capabilities.maxStateBytes;
        const big = await errorOf(
          store.checkAndSetStampedMany([row('x'), { ...row('y'), state: new Uint8Array(max + 1) }], counter),
        );
        expect(big).toBeInstanceOf(RowTooLargeError);
        // Each state fits, together they do not fit one packet.
        const large = (key: string) => ({ ...row(key), state: new Uint8Array(Math.floor(max * 0.6)) });
        const together = await errorOf(store.checkAndSetStampedMany([large('x'), large('y')], counter));
        expect(together).toBeInstanceOf(RowTooLargeError);
        expect((together as Error).message).toMatch(/max_allowed_packet/);
        expect(await store.readMany([row('x'), row('y')])).toEqual([null, null]);
        expect(await counterValue(store, counter)).toBeUndefined();
      });
    });

    describe('mysql stamped check-and-set of many rows: SQL text and connections', () => {
      if (MANY)
        it('sends one fixed CALL: tables, keys, versions and the counter are bound values', async () => {
          const texts: { sql: string; values: unknown[] }[] = [];
          const pool = recordingPool((query) => texts.push(query));
          const s = await openStore({ pool, namespace: store.namespace, createSchema: false });
          const nasty = [
            "'); DROP TABLE x; --",
            "\\' OR 1=1 -- ",
            '`; SELECT 1; `',
            '"] , [ "\\u0000 ?',
            'nul\u0000byte',
            '😀 emoji ünïcødé',
            '%s $1 :name @v',
          ];
          const counter = `c'); SELECT 1; -- "\\ 😀`;
          const first = applied(
            await s.checkAndSetStampedMany(
              nasty.map((key, i) => ({ table: `q.${i}_-`, key, expected: null, state: template(key) })),
              counter,
            ),
          );
          expect(first.timestamp).toBe(1);
          texts.length = 0;
          const second = applied(
            await s.checkAndSetStampedMany(
              nasty.map((key, i) => ({
                table: `q.${i}_-`,
                key,
                expected: first.versions[i]!,
                state: template(`${key}.2`),
              })),
              counter,
            ),
          );
          expect(second.timestamp).toBe(2);
          expect(texts).toHaveLength(1);
          expect(texts[0]!.sql).toBe(`CALL ${mysqlNames(store.namespace).stampedCasMany}(?, ?, ?, ?)`);
          expect(texts[0]!.values[2]).toEqual(Buffer.from(counter));
          for (const [i, key] of nasty.entries()) {
            expect(await s.read(`q.${i}_-`, key)).toEqual({
              version: second.versions[i],
              state: writeStamp(template(`${key}.2`), 2),
            });
          }
          expect(await s.incrementCounter(counter, 1)).toBe(3);
          // All in one table, in no order: the store sorts them as the server compares them
          // (bytes: NUL, multi-byte UTF-8, prefixes), else the procedure would refuse the call.
          const third = applied(
            await s.checkAndSetStampedMany(
              shuffled([...nasty, 'nul', 'nul\u0000', 'n', '\u0000']).map((key) => ({
                table: 'q.one',
                key,
                expected: null,
                state: template(key),
              })),
              counter,
            ),
          );
          expect(third.timestamp).toBe(4);
          const [counters] = await admin.query<RowDataPacket[]>(
            `SELECT COUNT(*) AS n FROM \`${store.namespace}_counters\` WHERE name = ?`,
            [Buffer.from(counter, 'utf8')],
          );
          expect(Number(counters[0]!.n)).toBe(1);
        });

      if (SLOTS)
        it('fixed slots: one CALL of the smallest procedure the step fits (more than 16 rows: the many-row one); tables, keys, versions and the counter are bound values', async () => {
          const texts: { sql: string; values: unknown[] }[] = [];
          const pool = recordingPool((query) => texts.push(query));
          const s = await openStore({ pool, namespace: store.namespace, createSchema: false });
          const names = mysqlNames(store.namespace);
          const counter = `s'); SELECT 1; -- "\\ 😀`;
          const nasty = [
            "'); DROP TABLE x; --",
            "\\' OR 1=1 -- ",
            '`; SELECT 1; `',
            'nul\u0000byte',
            '😀 ünï',
          ];
          for (const [count, procedure] of [
            [1, names.stampedSlots[0]!.name],
            [2, names.stampedSlots[0]!.name],
            [3, names.stampedSlots[1]!.name],
            [5, names.stampedSlots[2]!.name],
            [16, names.stampedSlots[3]!.name],
            [17, names.stampedCasMany],
          ] as const) {
            const keys = Array.from({ length: count }, (_, i) => `${nasty[i % nasty.length]}.${i}`);
            const requests = (expected: readonly (string | null)[], tail: string) =>
              keys.map((key, i) => ({
                table: `q.${count}`,
                key,
                expected: expected[i]!,
                state: template(`${key}${tail}`),
              }));
            const first = applied(
              await s.checkAndSetStampedMany(
                requests(
                  keys.map(() => null),
                  '',
                ),
                counter,
              ),
            );
            texts.length = 0;
            // Half updated, half created (the other half new keys): both kinds in one step.
            const second = applied(
              await s.checkAndSetStampedMany(
                requests(first.versions, '.2')
                  .concat(
                    keys.slice(0, Math.floor(count / 2)).map((key) => ({
                      table: `q.${count}.new`,
                      key,
                      expected: null,
                      state: template(`${key}.new`),
                    })),
                  )
                  .slice(0, Math.max(count, 1)),
                counter,
              ),
            );
            expect(texts).toHaveLength(1);
            expect(texts[0]!.sql.startsWith(`CALL ${procedure}(`)).toBe(true);
            for (const key of keys) expect(texts[0]!.sql).not.toContain(key);
            expect(texts[0]!.values).toContainEqual(Buffer.from(counter));
            for (const [i, key] of keys.entries()) {
              expect(await s.read(`q.${count}`, key)).toEqual({
                version: second.versions[i],
                state: writeStamp(template(`${key}.2`), second.timestamp),
              });
            }
          }
        });

      it('leaves the connection in no transaction (a pool with autocommit off is refused: session.test.ts)', async () => {
        const pool = userPool({ connectionLimit: 1 });
        const s = await openStore({ pool, namespace: store.namespace, createSchema: false });
        const counter = 'sm.ac';
        const r = applied(
          await s.checkAndSetStampedMany(
            [
              { table: 'ac', key: 'k1', expected: null, state: template('1') },
              { table: 'ac', key: 'k2', expected: null, state: template('2') },
            ],
            counter,
          ),
        );
        expect(await openTransactions(pool)).toBe(0);
        // Failing at its first row.
        expect(
          await s.checkAndSetStampedMany(
            [{ table: 'ac', key: 'k1', expected: null, state: template('x') }],
            counter,
          ),
        ).toMatchObject({ ok: false });
        expect(await openTransactions(pool)).toBe(0);
        // Committed: another connection sees the rows, and the counter.
        expect(await store.read('ac', 'k2')).toEqual({
          version: r.versions[1],
          state: writeStamp(template('2'), 1),
        });
        expect(await counterValue(store, counter)).toBe(1);
      });
    });

    describe('mysql stamped check-and-set of many rows: concurrency', () => {
      it('16+ concurrent calls over overlapping rows in random orders: no deadlock, each row a chain of whole calls', async () => {
        const counter = 'sm.hot';
        const table = 'hot';
        const keys = Array.from({ length: 8 }, (_, i) => `h${i}`);
        await create(store, table, keys);
        const other = await openStore({
          namespace: store.namespace,
          createSchema: false,
          maxConnections: 10,
        });
        const wins: {
          ts: number;
          rows: { key: string; expected: string; version: string; tail: string }[];
        }[] = [];
        let failures = 0;
        const worker = async (id: number) => {
          const s = id % 2 === 0 ? store : other;
          for (let i = 0; i < 10; i++) {
            const picked = shuffled(keys).slice(0, 2 + ((id + i) % 4));
            const now = await s.readMany(picked.map((key) => ({ table, key })));
            const requests = picked.map((key, j) => ({
              table,
              key,
              expected: now[j]!.version,
              state: template(`${id}.${i}.${key}`),
              notified: (id + j) % 2 === 0,
            }));
            const r = await s.checkAndSetStampedMany(requests, counter);
            if (r.ok) {
              wins.push({
                ts: r.timestamp,
                rows: requests.map((q, j) => ({
                  key: q.key,
                  expected: q.expected,
                  version: r.versions[j]!,
                  tail: `${id}.${i}.${q.key}`,
                })),
              });
            } else {
              failures++;
              expect(r.current).toHaveLength(requests.length);
            }
            // The other users of the counter and of these rows, in between.
            if (i % 3 === 0) await s.incrementCounter(counter, 1);
            if (i % 4 === 1)
              await s.readStamped!(
                picked.map((key) => ({ table, key })),
                counter,
              );
            if (i % 5 === 2) {
              const key = picked[0]!;
              const row = (await s.read(table, key))!;
              const single = await s.checkAndSetStamped(
                { table, key, expected: row.version, state: template(`${id}.${i}.${key}`) },
                counter,
              );
              if (single.ok) {
                wins.push({
                  ts: single.timestamp!,
                  rows: [{ key, expected: row.version, version: single.version, tail: `${id}.${i}.${key}` }],
                });
              }
            }
          }
        };
        // Any StoreError (a deadlock, a lock wait timeout) fails this.
        await Promise.all(Array.from({ length: 20 }, (_, id) => worker(id)));
        expect(wins.filter((w) => w.rows.length > 1).length).toBeGreaterThan(10);
        // Every call's stamp is unique.
        expect(new Set(wins.map((w) => w.ts)).size).toBe(wins.length);
        // Per row, the applied writes form one chain (each expected the one before) whose stamps
        // increase, and the row ends as the last of them, stamped with its call's value.
        for (const key of keys) {
          const chain = wins
            .flatMap((w) => w.rows.filter((row) => row.key === key).map((row) => ({ ...row, ts: w.ts })))
            .sort((a, b) => a.ts - b.ts);
          for (let j = 1; j < chain.length; j++) expect(chain[j]!.expected).toBe(chain[j - 1]!.version);
          const last = chain[chain.length - 1]!;
          expect(await store.read(table, key)).toEqual({
            version: last.version,
            state: writeStamp(template(last.tail), last.ts),
          });
        }
        expect(failures).toBeGreaterThan(0);
      });

      it('16 concurrent creates of the same rows, each in its own order: exactly one wins, no errors', async () => {
        const counter = 'sm.create';
        const keys = ['c1', 'c2', 'c3', 'c4'];
        const other = await openStore({
          namespace: store.namespace,
          createSchema: false,
          maxConnections: 10,
        });
        const results = await Promise.all(
          Array.from({ length: 16 }, (_, id) =>
            (id % 2 === 0 ? store : other).checkAndSetStampedMany(
              shuffled(keys).map((key) => ({
                table: 'create',
                key,
                expected: null,
                state: template(`${id}.${key}`),
              })),
              counter,
            ),
          ),
        );
        const won = results.filter((r) => r.ok);
        expect(won).toHaveLength(1);
        const rows = await store.readMany(keys.map((key) => ({ table: 'create', key })));
        const ts = stampOf(rows[0]!.state);
        expect(rows.every((row) => row !== null && stampOf(row.state) === ts)).toBe(true);
        for (const r of results) {
          if (!r.ok)
            expect(r.current?.filter((row) => row !== null && row !== undefined)).not.toHaveLength(0);
        }
      });
      it('creates and deletes of the same keys in overlapping sets: each call applies whole or fails as a deadlock victim, not applied', async () => {
        // Creating a key just deleted: _v2's plain INSERT took the duplicate check's lock shared,
        // and two calls deadlocked asking for the exclusive one (in about half of the runs). _v3
        // and later take it exclusive at once. InnoDB's lock inheritance (a purged row's locks become gap
        // locks on the next row) can still make creates in one gap deadlock, single statements
        // too: the store sends the victim again, and past its attempts fails it as not applied
        // (retryable), which the core retries. Every row left must be the whole work of one
        // call that applied: its version and its stamp.
        const counter = 'sm.churn';
        const table = 'churn';
        const { keys, applied, tally, victim, storeOf } = await racers('c', 8);
        const worker = async (id: number) => {
          const s = storeOf(id);
          for (let i = 0; i < 15; i++) {
            const picked = shuffled(keys).slice(0, 2 + ((id + i) % 4));
            const now = await s.readMany(picked.map((key) => ({ table, key })));
            const r = await s
              .checkAndSetStampedMany(
                picked.map((key, j) => ({
                  table,
                  key,
                  expected: now[j]?.version ?? null,
                  state: template(`${id}.${i}`),
                  notified: j % 2 === 0,
                })),
                counter,
              )
              .catch(victim);
            if (r?.ok) for (const version of r.versions) applied.set(version, r.timestamp);
            if (i % 4 === 0) {
              const row = await s.read(table, picked[0]!);
              // A plain single-row delete may itself be InnoDB's deadlock victim: reported as
              // not applied, which the core retries.
              if (row) {
                await s
                  .checkAndSet({ table, key: picked[0]!, expected: row.version, state: null })
                  .catch((error: unknown) => {
                    if (!isDeadlockVictim(error)) throw error;
                  });
              }
            }
          }
        };
        await Promise.all(Array.from({ length: 16 }, (_, id) => worker(id)));
        expect(applied.size).toBeGreaterThan(0);
        // 16 workers x 15 calls: a victim past every resend is rare; many would be a regression.
        expect(tally.victims).toBeLessThan(8);
        await expectWholeWrites(table, keys, applied);
      });

      it('calls, single-row stamped CAS and deletes on the same keys: every write applies whole or fails as a not-applied deadlock victim', async () => {
        // The single-row stamped CAS creates with a plain INSERT (its duplicate check's lock is
        // shared, then exclusive); calls create with INSERT ... ON DUPLICATE KEY (exclusive at
        // once). Both lock their rows before they draw, so whoever holds the counter waits for
        // no row: a cycle can only come from two writers of one row, and InnoDB breaks it.
        // Every row left must be the whole work of one write that applied: its version and stamp.
        const counter = 'sm.mixed';
        const table = 'mixed';
        const { keys, applied, tally, victim, storeOf } = await racers('m', 6);
        const worker = async (id: number) => {
          const s = storeOf(id);
          for (let i = 0; i < 15; i++) {
            const picked = shuffled(keys).slice(0, 1 + ((id + i) % 3));
            const now = await s.readMany(picked.map((key) => ({ table, key })));
            if ((id + i) % 3 === 0) {
              // One row, stamped: a create where the row is absent.
              const r = await s.checkAndSetStamped!(
                { table, key: picked[0]!, expected: now[0]?.version ?? null, state: template(`${id}.${i}`) },
                counter,
              ).catch(victim);
              if (r?.ok) applied.set(r.version, r.timestamp!);
            } else {
              const r = await s
                .checkAndSetStampedMany(
                  picked.map((key, j) => ({
                    table,
                    key,
                    expected: now[j]?.version ?? null,
                    state: template(`${id}.${i}`),
                  })),
                  counter,
                )
                .catch(victim);
              if (r?.ok) for (const version of r.versions) applied.set(version, r.timestamp);
            }
            if (i % 3 === 2) {
              const row = await s.read(table, picked[0]!);
              if (row)
                await s
                  .checkAndSet({ table, key: picked[0]!, expected: row.version, state: null })
                  .catch(victim);
            }
          }
        };
        await Promise.all(Array.from({ length: 12 }, (_, id) => worker(id)));
        expect(applied.size).toBeGreaterThan(0);
        // Deadlocks here are rare; many would be a regression (a wait that closes a cycle).
        expect(tally.victims).toBeLessThan(12);
        await expectWholeWrites(table, keys, applied);
      });

      if (MANY)
        it('a deadlock victim is sent again and applies (white box)', async () => {
          // Another session holds `b`, the call locks `a` and waits for `b`, then that session asks
          // for `a`: a deadlock. That session has written many rows, so InnoDB rolls the call back
          // (the lighter one); the store sends it again, and it applies once `b` is free.
          const counter = 'sm.victim';
          const [va, vb] = await create(store, 'victim', ['a', 'b'], '0');
          await create(
            store,
            'victim.heavy',
            Array.from({ length: 50 }, (_, i) => `h${i}`),
          );
          let calls = 0;
          const pool = recordingPool((query) => {
            if (query.sql.startsWith('CALL ')) calls++;
          });
          const s = await openStore({ pool, namespace: store.namespace, createSchema: false });
          const blocker = await admin.getConnection();
          try {
            await blocker.query('BEGIN');
            await blocker.query(`UPDATE \`${store.namespace}_rows\` SET notified = TRUE WHERE tbl = ?`, [
              Buffer.from('victim.heavy'),
            ]);
            await blocker.query(
              `SELECT 1 FROM \`${store.namespace}_rows\` WHERE tbl = ? AND row_key = ? FOR UPDATE`,
              [Buffer.from('victim'), Buffer.from('b')],
            );
            const pending = s.checkAndSetStampedMany(
              [
                { table: 'victim', key: 'b', expected: vb!, state: template('b1') },
                { table: 'victim', key: 'a', expected: va!, state: template('a1') },
              ],
              counter,
            );
            pending.catch(() => {});
            await untilLockWait(waitingIn(store.namespace, 'lock', 'b'));
            // Closes the cycle; the call is the victim, so this gets `a`.
            await blocker.query(
              `SELECT 1 FROM \`${store.namespace}_rows\` WHERE tbl = ? AND row_key = ? FOR UPDATE`,
              [Buffer.from('victim'), Buffer.from('a')],
            );
            // Sent again: it waits for `a` now.
            await untilLockWait(waitingIn(store.namespace, 'lock', 'a'));
            await blocker.query('ROLLBACK');
            const r = applied(await pending);
            expect(calls).toBe(2);
            expect(
              await store.readMany([
                { table: 'victim', key: 'b' },
                { table: 'victim', key: 'a' },
              ]),
            ).toEqual([
              { version: r.versions[0], state: writeStamp(template('b1'), r.timestamp) },
              { version: r.versions[1], state: writeStamp(template('a1'), r.timestamp) },
            ]);
            expect(r.timestamp).toBe(1);
          } finally {
            await blocker.query('ROLLBACK').catch(() => {});
            blocker.release();
          }
        });
      it('a call waiting for a key it creates holds no counter: every other draw goes on meanwhile', async () => {
        // Whoever holds the counter waits for no row (schema.ts): a create locks its key
        // before the draw. So a session holding that key (here a locking read of the absent
        // key, left open) holds up this call alone, never the oracle. (`_v5`, never released,
        // created after the draw and stalled every draw here until the lock wait timed out.)
        const counter = 'sm.nostall';
        const base = await store.incrementCounter(counter, 1);
        const other = await openStore({ namespace: store.namespace, createSchema: false });
        const blocker = await lockingSession(
          `SELECT 1 FROM \`${store.namespace}_rows\` WHERE tbl = ? AND row_key = ? FOR UPDATE`,
          [Buffer.from('nostall'), Buffer.from('k')],
        );
        try {
          const pending = store.checkAndSetStampedMany(
            [{ table: 'nostall', key: 'k', expected: null, state: template('k') }],
            counter,
          );
          pending.catch(() => {});
          await untilLockWait(
            (query) =>
              query.startsWith(`INSERT INTO \`${store.namespace}_rows\``) && query.includes("_binary'k'"),
          );
          // The call waits for 'k' before its draw: other draws and stamped reads go on.
          expect(await settledWithin(other.incrementCounter(counter, 1), 2_000)).toBe(base + 1);
          const read = await settledWithin(
            other.readStamped!([{ table: 'nostall', key: 'k' }], counter),
            2_000,
          );
          expect(read).toEqual({ timestamp: base + 2, rows: [null] });
          await blocker.query('ROLLBACK');
          const r = applied(await pending);
          expect(r.timestamp).toBe(base + 3);
          expect(await store.read('nostall', 'k')).toEqual({
            version: r.versions[0],
            state: writeStamp(template('k'), base + 3),
          });
        } finally {
          await blocker.query('ROLLBACK').catch(() => {});
          blocker.release();
          await other.close();
        }
      });
    });

    describe('mysql stamped check-and-set of many rows: a later counter value implies every row is visible', () => {
      it('a later incrementCounter waits until all rows have committed, then a read sees every one', async () => {
        // White box, as in stamped.test.ts: the call is held after its draw, before its COMMIT
        // (its final write of a row with notified = TRUE waits for a locking scan of the
        // `notified` index in another session), so it holds the counter row. The rows are
        // written from the last in key order to the first, so the held row sorts first: the
        // other two are written before it.
        const counter = 'sm.wait';
        const base = await store.incrementCounter(counter, 1);
        const [v1, v2] = await create(store, 'wait.b', ['k1', 'k2'], 'old');
        // The held row exists (notified FALSE): a create's INSERT would wait for the scan's gap
        // lock before the draw, not after it.
        const [vn] = await create(store, 'wait.a', ['n'], 'old');
        const other = await openStore({ namespace: store.namespace, createSchema: false });
        const blocker = await lockingSession(
          `SELECT row_key FROM \`${store.namespace}_rows\` FORCE INDEX (\`${store.namespace}_rows_notified\`)
       WHERE tbl = ? AND notified = TRUE FOR UPDATE`,
          [Buffer.from('wait.a')],
        );
        try {
          const requests: StampedRequest[] = [
            { table: 'wait.b', key: 'k2', expected: v2!, state: template('k2') },
            { table: 'wait.a', key: 'n', expected: vn!, state: template('n'), notified: true },
            { table: 'wait.b', key: 'k1', expected: v1!, state: template('k1') },
          ];
          const pending = store.checkAndSetStampedMany(requests, counter);
          pending.catch(() => {});
          await untilLockWait(waitingIn(store.namespace, 'write', 'n'));
          const later = other.incrementCounter(counter, 1);
          later.catch(() => {});
          expect(await settledWithin(later, 500)).toBe('pending');
          // Nothing of it is visible yet: the rows written before the held one, nor the counter.
          expect(await other.read('wait.b', 'k1')).toEqual({ version: v1, state: template('old.k1') });
          expect(await other.read('wait.a', 'n')).toEqual({ version: vn, state: template('old.n') });
          expect(await counterValue(store, counter)).toBe(base);
          await blocker.query('ROLLBACK');
          const r = applied(await pending);
          expect(r.timestamp).toBe(base + 1);
          expect(await later).toBe(base + 2);
          expect(await other.readMany(requests)).toEqual(
            requests.map((q, i) => ({ version: r.versions[i], state: writeStamp(q.state, base + 1) })),
          );
        } finally {
          await blocker.query('ROLLBACK').catch(() => {});
          blocker.release();
        }
      });

      it('race: whoever draws above a call and then reads sees every row of it', async () => {
        const counter = 'sm.seen';
        const table = 'seen';
        const keys = Array.from({ length: 12 }, (_, i) => `r${i}`);
        await create(store, table, keys);
        const readers = await openStore({
          namespace: store.namespace,
          createSchema: false,
          maxConnections: 6,
        });
        const writes: { ts: number; keys: string[] }[] = [];
        const samples: { drawn: number; stamps: Map<string, number> }[] = [];
        let done = false;
        const writer = async (id: number) => {
          for (let i = 0; i < 12; i++) {
            const picked = shuffled(keys).slice(0, 3 + (i % 3));
            const now = await store.readMany(picked.map((key) => ({ table, key })));
            const r = await store.checkAndSetStampedMany(
              picked.map((key, j) => ({
                table,
                key,
                expected: now[j]!.version,
                state: template(`${id}.${i}`),
              })),
              counter,
            );
            if (r.ok) writes.push({ ts: r.timestamp, keys: picked });
          }
        };
        const reader = async (id: number) => {
          while (!done) {
            const drawn =
              id % 2 === 0
                ? await readers.incrementCounter(counter, 1)
                : (await readers.readStamped([], counter)).timestamp;
            const rows = await readers.readMany(keys.map((key) => ({ table, key })));
            samples.push({
              drawn,
              stamps: new Map(keys.map((key, i) => [key, stampOf((rows[i] as StoredRow).state)])),
            });
          }
        };
        const running = Array.from({ length: 4 }, (_, id) => reader(id));
        await Promise.all(Array.from({ length: 6 }, (_, id) => writer(id)));
        done = true;
        await Promise.all(running);
        expect(writes.length).toBeGreaterThan(5);
        expect(samples.length).toBeGreaterThan(5);
        let checked = 0;
        for (const sample of samples) {
          for (const write of writes) {
            if (write.ts >= sample.drawn) continue;
            for (const key of write.keys) expect(sample.stamps.get(key)!).toBeGreaterThanOrEqual(write.ts);
            checked++;
          }
        }
        expect(checked).toBeGreaterThan(0);
      });
    });

    describe('mysql stamped check-and-set of many rows: schema and failures', () => {
      it('is in the schema SQL, listed and dropped with the namespace', async () => {
        const names = mysqlNames(store.namespace);
        expect(mysqlSchemaSql(store.namespace)).toContain(
          `CREATE PROCEDURE IF NOT EXISTS ${names.stampedCasMany}(`,
        );
        const routine = async (name: string) => {
          const [rows] = await admin.query<RowDataPacket[]>(
            `SELECT SECURITY_TYPE AS security, SQL_DATA_ACCESS AS access
         FROM information_schema.ROUTINES
         WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_TYPE = 'PROCEDURE' AND ROUTINE_NAME = ?`,
            [name],
          );
          return rows.map((r) => ({ ...r }));
        };
        expect(await routine(names.stampedCasManyRoutine)).toEqual([
          { security: 'INVOKER', access: 'MODIFIES SQL DATA' },
        ]);
        // Version 6: the bodies of version 1 (a read-only precheck, then cursors), version 2 (a
        // plain INSERT for a create), version 3 (each row's UPDATE named every row's states),
        // version 4 (a create read back FOR UPDATE) and version 5 (never released: a create
        // written after the draw) were replaced.
        expect(names.stampedCasManyRoutine).toBe(`${store.namespace}_cas_stamped_many_v6`);
        const namespace = uniqueNamespace();
        const s = await openStore({ namespace });
        // What a namespace created before version 6 may still hold next to it.
        for (const old of ['v1', 'v2', 'v3', 'v4', 'v5']) {
          await admin.query(
            `CREATE PROCEDURE \`${namespace}_cas_stamped_many_${old}\`() COMMENT 'percolator stamped check-and-set of many rows' BEGIN END`,
          );
        }
        const listed = (await listMySqlNamespaces({ uri: url })).find((n) => n.namespace === namespace);
        for (const v of ['v1', 'v2', 'v3', 'v4', 'v5', 'v6'])
          expect(listed?.objects).toContain(`${namespace}_cas_stamped_many_${v}`);
        await s.dropNamespace();
        for (const v of ['v1', 'v2', 'v3', 'v4', 'v5', 'v6'])
          expect(await routine(`${namespace}_cas_stamped_many_${v}`)).toEqual([]);
        const another = await openStore({ namespace: uniqueNamespace() });
        const dropped = await dropMySqlNamespace(another.namespace, { uri: url });
        expect(dropped?.objects).toContain(`${another.namespace}_cas_stamped_many_v6`);
        expect(await routine(`${another.namespace}_cas_stamped_many_v6`)).toEqual([]);
      });

      it("reads the call's packed arguments per row only by offset, in SET, never in a statement (MariaDB escapes those into the statement's text)", async () => {
        // MariaDB rewrites each SQL statement inside a procedure with the values of the
        // variables it names, escaped (for its logs and the process list, with every log off
        // too); a SET is not rewritten. A per-row statement naming p_states or p_rows copies
        // every row's data for each row: _v3's UPDATE did, and 64-row calls ran at half speed.
        const names = mysqlNames(store.namespace);
        const [rows] = await admin.query<RowDataPacket[]>(
          'SELECT ROUTINE_DEFINITION AS body FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME = ?',
          [names.stampedCasManyRoutine],
        );
        const body = String(rows[0]?.body);
        const loops = [
          ...body.matchAll(/(lock_rows|write_rows): (?:WHILE|LOOP)([\s\S]*?)END (?:WHILE|LOOP)/g),
        ];
        expect(loops.map((m) => m[1])).toEqual(['lock_rows', 'write_rows']);
        for (const [, , loop] of loops) {
          const statements = [...loop!.matchAll(/^\s*((?:UPDATE|SELECT|INSERT|DELETE)\b[^;]*);/gm)].map(
            (m) => m[1],
          );
          expect(statements.length).toBeGreaterThan(0);
          for (const t of statements) expect(t).not.toMatch(/\bp_states\b|\bp_rows\b/);
          // Nor a JSON path into p_rows per row: JSON_EXTRACT(p_rows, '$[i]') scans from the
          // start, so _v3's calls cost the square of their rows.
          expect(loop).not.toMatch(/JSON_\w+\(\s*p_rows/);
        }
      });

      it('a hand-made schema without the procedure declares no stampedCheckAndSetMany; the method refuses; adding it enables it', async () => {
        const namespace = uniqueNamespace();
        const names = mysqlNames(namespace);
        const statements = mysqlSchemaStatements(namespace);
        const procedure = statements.filter((sql) => sql.includes(names.stampedCasMany));
        expect(procedure).toHaveLength(1);
        for (const sql of statements.filter((sql) => !sql.includes(names.stampedCasMany)))
          await admin.query(sql);
        const old = await openStore({ namespace, createSchema: false });
        expect(old.capabilities.stampedCheckAndSetMany).toBe(false);
        expect(old.capabilities.stampedCheckAndSet).toBe(true);
        expect(old.capabilities.stampedRead).toBe(true);
        const error = await errorOf(
          old.checkAndSetStampedMany([{ table: 't', key: 'k', expected: null, state: template('x') }], 'c'),
        );
        expect(error).toBeInstanceOf(StoreError);
        expect((error as StoreError).applied).toBe('no');
        expect((error as StoreError).retryable).toBe(false);
        expect((error as StoreError).message).toMatch(/mysqlSchemaSql/);
        expect(await old.read('t', 'k')).toBeNull();
        await admin.query(procedure[0]!);
        const upgraded = await openStore({ namespace, createSchema: false });
        expect(upgraded.capabilities.stampedCheckAndSetMany).toBe(true);
        applied(
          await upgraded.checkAndSetStampedMany(
            [{ table: 't', key: 'k', expected: null, state: template('x') }],
            'c',
          ),
        );
      });

      it('the procedure itself refuses a row named twice, and rows out of key order (an error, nothing written)', async () => {
        const names = mysqlNames(store.namespace);
        // Creates of table 'd' (hex 64), each with its own state slice.
        const row = (key: string, version: string) => [
          '64',
          Buffer.from(key).toString('hex'),
          null,
          version,
          1,
          9,
          0,
        ];
        const call = (rows: unknown[][]) =>
          errorOf(
            admin.query(`CALL ${names.stampedCasMany}(?, ?, ?, ?)`, [
              JSON.stringify(rows),
              Buffer.from(template('')),
              Buffer.from('c'),
              1,
            ]),
          );
        expect(((await call([row('k', '1'), row('k', '1')])) as Error).message).toMatch(/named twice/);
        // 'a' and 'l' are created before 'k' breaks the order; all of it is rolled back.
        expect(((await call([row('a', '2'), row('l', '3'), row('k', '4')])) as Error).message).toMatch(
          /not in \(tbl, row_key\) order/,
        );
        expect(await store.readMany(['k', 'a', 'l'].map((key) => ({ table: 'd', key })))).toEqual([
          null,
          null,
          null,
        ]);
        expect(await counterValue(store, 'c')).toBeUndefined();
      });

      it('reports a connection killed mid-call as StoreError unknown; nothing was committed', async () => {
        const counter = 'sm.kill';
        const [va, vb] = await create(store, 'kill', ['a', 'b'], '0');
        const before = await store.incrementCounter(counter, 1);
        const blocker = await admin.getConnection();
        try {
          await blocker.query('BEGIN');
          await blocker.query(
            `SELECT 1 FROM \`${store.namespace}_rows\` WHERE tbl = ? AND row_key = ? FOR UPDATE`,
            [Buffer.from('kill'), Buffer.from('b')],
          );
          const pending = store.checkAndSetStampedMany(
            [
              { table: 'kill', key: 'b', expected: vb!, state: template('1') },
              { table: 'kill', key: 'a', expected: va!, state: template('1') },
            ],
            counter,
          );
          pending.catch(() => {});
          const waiter = await untilLockWait(
            SLOTS ? waitingInSlotsLock(store.namespace) : waitingIn(store.namespace, 'lock', 'b'),
          );
          await admin.query('KILL ?', [waiter.thread]);
          const error = await errorOf(pending);
          expect(error).toBeInstanceOf(StoreError);
          expect((error as StoreError).applied).toBe('unknown');
        } finally {
          await blocker.query('ROLLBACK');
          blocker.release();
        }
        expect(await store.read('kill', 'a')).toEqual({ version: va, state: template('0.a') });
        expect(await store.read('kill', 'b')).toEqual({ version: vb, state: template('0.b') });
        expect(await store.incrementCounter(counter, 1)).toBe(before + 1);
      });

      it('an error after the increment rolls every row back and is StoreError no; the connection is reused', async () => {
        const pool = userPool({ connectionLimit: 1 });
        pool.on('connection', (connection) => {
          connection.query('SET SESSION innodb_lock_wait_timeout = 1');
        });
        const s = await openStore({ pool, namespace: store.namespace, createSchema: false });
        const counter = 'sm.timeout';
        const [va] = await create(s, 'lwt.a', ['a'], '0');
        const [vn] = await create(s, 'lwt.b', ['n'], '0');
        const before = await s.incrementCounter(counter, 1);
        const blocker = await lockingSession(
          `SELECT row_key FROM \`${s.namespace}_rows\` FORCE INDEX (\`${s.namespace}_rows_notified\`)
       WHERE tbl = ? AND notified = TRUE FOR UPDATE`,
          [Buffer.from('lwt.b')],
        );
        try {
          const error = await errorOf(
            s.checkAndSetStampedMany(
              [
                { table: 'lwt.a', key: 'a', expected: va!, state: template('1') },
                { table: 'lwt.b', key: 'n', expected: vn!, state: template('1'), notified: true },
              ],
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
        expect(await s.read('lwt.a', 'a')).toEqual({ version: va, state: template('0.a') });
        expect(await s.read('lwt.b', 'n')).toEqual({ version: vn, state: template('0.n') });
        // The value it drew was rolled back with the writes; the connection is in no transaction.
        expect(await s.incrementCounter(counter, 1)).toBe(before + 1);
        expect(await openTransactions(pool)).toBe(0);
      });

      it('gives up after queryTimeoutMs: StoreError unknown', async () => {
        const s = await openStore({ namespace: store.namespace, createSchema: false, queryTimeoutMs: 300 });
        const counter = 'sm.slow';
        const [v] = await create(s, 'slow', ['k'], '0');
        const blocker = await admin.getConnection();
        try {
          await blocker.query('BEGIN');
          await blocker.query(
            `SELECT 1 FROM \`${s.namespace}_rows\` WHERE tbl = ? AND row_key = ? FOR UPDATE`,
            [Buffer.from('slow'), Buffer.from('k')],
          );
          const error = await errorOf(
            s.checkAndSetStampedMany(
              [
                { table: 'slow', key: 'k', expected: v!, state: template('1') },
                { table: 'slow', key: 'j', expected: null, state: template('1') },
              ],
              counter,
            ),
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
        // All or nothing either way.
        const [k, j] = await s.readMany([
          { table: 'slow', key: 'k' },
          { table: 'slow', key: 'j' },
        ]);
        if (!j) expect(k).toEqual({ version: v, state: template('0.k') });
        else expect(stampOf(k!.state)).toBe(stampOf(j.state));
      });
    });
  });
}
