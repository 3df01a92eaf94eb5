import {
  ClosedError,
  InvalidArgumentError,
  ORACLE_COUNTER,
  type RowStore,
  RowTooLargeError,
  STAMP_OFFSET,
  type StampedManyResult,
  type StoredRow,
  StoreError,
  uncheckedStore,
  writeStamp,
} from '@percolator/core';
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { createRedisClient, createRedisStore, defaultRedisUrl } from '../src/index.js';
import { counterKeyName, indexMember, notifyIndexName, rowKeyName, scanIndexName } from '../src/keys.js';
import { CAS_MANY_LUA, CAS_MANY_SCRIPT, runScript } from '../src/scripts.js';
import type { RedisClient, RedisStore } from '../src/store.js';
import {
  assertClusterReachable,
  bytes,
  connectCluster,
  type PrivateRedis,
  standaloneStore,
  startPrivateRedis,
  uniqueNamespace,
} from './helpers.js';

/**
 * The stamped check-and-set of many rows on a standalone Redis (Redis at
 * PERCOLATOR_REDIS_URL): one script checks every row, then draws one value and writes
 * every row with it, or writes nothing.
 */

const T = 'tbl';
const U = 'other.tbl';

type StampedRequest = Parameters<NonNullable<RowStore['checkAndSetStampedMany']>>[0][number];
type Applied = Extract<StampedManyResult, { ok: true }>;
type Refused = Extract<StampedManyResult, { ok: false }>;

/** A format byte, the 8-byte stamp slot (placeholder 0xEE, so an unwritten slot shows), a tail. */
function template(tail: Uint8Array | string = 'tail'): Uint8Array {
  const rest = typeof tail === 'string' ? bytes(tail) : tail;
  const out = new Uint8Array(STAMP_OFFSET + 8 + rest.length);
  out.fill(0x42, 0, STAMP_OFFSET);
  out.fill(0xee, STAMP_OFFSET, STAMP_OFFSET + 8);
  out.set(rest, STAMP_OFFSET + 8);
  return out;
}

/** The stamp in a stored state, computed with BigInt (independently of the store). */
function stampOf(state: Uint8Array): number {
  return Number(Buffer.from(state).readBigUInt64BE(STAMP_OFFSET));
}

/** The tail of a stored state (what follows the stamp slot), as text. */
function tailOf(state: Uint8Array): string {
  return Buffer.from(state)
    .subarray(STAMP_OFFSET + 8)
    .toString('utf8');
}

function same(a: Uint8Array, b: Uint8Array): boolean {
  return Buffer.from(a).equals(Buffer.from(b));
}

function many(s: RowStore) {
  const method = s.checkAndSetStampedMany;
  if (!method) throw new Error('checkAndSetStampedMany is missing');
  return method.bind(s);
}

function applied(result: StampedManyResult): Applied {
  if (!result.ok) throw new Error(`expected the step to apply, got ${JSON.stringify(result)}`);
  return result;
}

function refused(result: StampedManyResult): Refused {
  if (result.ok) throw new Error(`expected the step to be refused, got ${JSON.stringify(result)}`);
  return result;
}

/** Raw row hashes (field -> latin1 text), to compare what the script left behind. */
async function rawRows(client: Redis, s: RedisStore, table: string, keys: readonly string[]) {
  return await Promise.all(keys.map((k) => client.hgetall(rowKeyName(s.namespace, table, k))));
}

let client: Redis;

beforeAll(async () => {
  client = createRedisClient();
  client.on('error', () => {});
  try {
    await client.connect();
  } catch (error) {
    throw new Error(
      `Redis is not reachable at ${defaultRedisUrl()}: set PERCOLATOR_REDIS_URL to a running Redis (${(error as Error).message})`,
    );
  }
});

afterAll(async () => {
  await client?.quit();
});

describe('standalone: stamped check-and-set of many rows', () => {
  const stores: RedisStore[] = [];
  async function store(namespace = uniqueNamespace('sm')): Promise<RedisStore> {
    const s = await createRedisStore({ client, namespace });
    stores.push(s);
    return s;
  }
  /** A store with a connection of its own (another client process, as far as Redis can tell). */
  async function ownStore(namespace: string): Promise<RedisStore> {
    const s = await standaloneStore(namespace);
    stores.push(s);
    return s;
  }
  afterEach(async () => {
    for (const s of stores.splice(0)) {
      await s.dropNamespace().catch(() => {});
      await s.close();
    }
  });

  async function create(s: RedisStore, table: string, key: string, tail: string): Promise<string> {
    const r = await s.checkAndSet({ table, key, expected: null, state: template(tail) });
    if (!r.ok) throw new Error(`could not create ${key}`);
    return r.version;
  }

  it('declares the capability and has the method', async () => {
    const s = await store();
    expect(s.capabilities.stampedCheckAndSetMany).toBe(true);
    expect(typeof s.checkAndSetStampedMany).toBe('function');
    expect(typeof uncheckedStore(s).checkAndSetStampedMany).toBe('function');
  });

  it('writes every row with one stamp, the counter value drawn; versions in request order (not key order)', async () => {
    const s = await store();
    const c = 'c.order';
    expect(await s.incrementCounter(c, 41)).toBe(41);
    const vB = await create(s, T, 'b', 'old b');
    const vY = await create(s, U, 'y', 'old y');
    // Neither key order nor table order: z, b (update), a, y (other table, update), m.
    const requests: StampedRequest[] = [
      { table: T, key: 'z', expected: null, state: template('new z') },
      { table: T, key: 'b', expected: vB, state: template('new b') },
      { table: T, key: 'a', expected: null, state: template('new a') },
      { table: U, key: 'y', expected: vY, state: template('new y') },
      { table: T, key: 'm', expected: null, state: template('new m') },
    ];
    const r = applied(await many(s)(requests, c));
    expect(r.timestamp).toBe(42);
    expect(r.versions).toHaveLength(requests.length);
    expect(new Set(r.versions).size).toBe(requests.length);
    expect(r.versions).not.toContain(vB);
    expect(r.versions).not.toContain(vY);
    const rows = await s.readMany(requests.map(({ table, key }) => ({ table, key })));
    requests.forEach((request, i) => {
      const row = rows[i]!;
      expect(row.version).toBe(r.versions[i]);
      expect(same(row.state, writeStamp(request.state, 42))).toBe(true);
      expect(stampOf(row.state)).toBe(42);
      expect(tailOf(row.state)).toBe(`new ${request.key}`);
      // The caller's templates are not changed.
      expect(request.state[STAMP_OFFSET]).toBe(0xee);
    });
    // One value drawn for all of them: the counter moved by exactly one.
    expect(await s.incrementCounter(c, 1)).toBe(43);
    // The versions are ordinary versions: a single CAS follows them.
    expect((await s.checkAndSet({ table: T, key: 'a', expected: r.versions[2]!, state: null })).ok).toBe(
      true,
    );
    expect((await s.checkAndSet({ table: U, key: 'y', expected: vY, state: null })).ok).toBe(false);
  });

  it('one stale expected among several: refused, every row returned as it is, nothing written or drawn', async () => {
    const s = await store();
    const c = 'c.stale';
    const vA = await create(s, T, 'a', 'a0');
    const vB = await create(s, T, 'b', 'b0');
    const vC = await create(s, T, 'c', 'c0');
    // b moves on; the request still names its old version.
    const b1 = await s.checkAndSet({ table: T, key: 'b', expected: vB, state: template('b1') });
    const vB1 = (b1 as { version: string }).version;
    const before = await rawRows(client, s, T, ['a', 'b', 'c', 'new']);
    const indexes = await Promise.all([
      client.zrange(scanIndexName(s.namespace, T), 0, -1),
      client.zrange(notifyIndexName(s.namespace, T), 0, -1),
    ]);
    const r = refused(
      await many(s)(
        [
          { table: T, key: 'c', expected: vC, state: template('c1'), notified: true },
          { table: T, key: 'new', expected: null, state: template('n1'), notified: true },
          { table: T, key: 'b', expected: vB, state: template('b2'), notified: true },
          { table: T, key: 'a', expected: vA, state: template('a1'), notified: true },
        ],
        c,
      ),
    );
    const current = r.current!;
    expect(current).toHaveLength(4);
    expect(current[0]!.version).toBe(vC);
    expect(tailOf(current[0]!.state)).toBe('c0');
    expect(current[1]).toBeNull();
    expect(current[2]!.version).toBe(vB1);
    expect(tailOf(current[2]!.state)).toBe('b1');
    expect(current[3]!.version).toBe(vA);
    expect(tailOf(current[3]!.state)).toBe('a0');
    // Nothing changed: rows, indexes, and the counter was not drawn from.
    expect(await rawRows(client, s, T, ['a', 'b', 'c', 'new'])).toEqual(before);
    expect(
      await Promise.all([
        client.zrange(scanIndexName(s.namespace, T), 0, -1),
        client.zrange(notifyIndexName(s.namespace, T), 0, -1),
      ]),
    ).toEqual(indexes);
    expect(await client.exists(counterKeyName(s.namespace, c))).toBe(0);
    // An expected version on an absent row is refused the same way.
    const absent = refused(
      await many(s)(
        [
          { table: T, key: 'a', expected: vA, state: template('a1') },
          { table: T, key: 'gone', expected: vA, state: template('g') },
        ],
        c,
      ),
    );
    expect(absent.current![0]!.version).toBe(vA);
    expect(absent.current![1]).toBeNull();
    expect(await s.read(T, 'gone')).toBeNull();
    expect(await s.incrementCounter(c, 1)).toBe(1);
  });

  it('a create on a present row: refused, nothing written, no index entry left behind', async () => {
    const s = await store();
    const c = 'c.create';
    const vP = await create(s, T, 'present', 'p0');
    const scanBefore = await client.zcard(scanIndexName(s.namespace, T));
    const r = refused(
      await many(s)(
        [
          { table: T, key: 'fresh', expected: null, state: template('f'), notified: true },
          { table: T, key: 'present', expected: null, state: template('p1'), notified: true },
        ],
        c,
      ),
    );
    expect(r.current![0]).toBeNull();
    expect(r.current![1]).toMatchObject({ version: vP });
    expect(await s.read(T, 'fresh')).toBeNull();
    expect((await s.read(T, 'present'))!.version).toBe(vP);
    expect(await client.zcard(scanIndexName(s.namespace, T))).toBe(scanBefore);
    expect(await client.zcard(notifyIndexName(s.namespace, T))).toBe(0);
    expect(await s.scanNotified(T, { limit: 10 })).toEqual([]);
    expect((await s.scan(T, { limit: 10 })).map((e) => e.key)).toEqual(['present']);
  });

  it('mixes creates and updates over two tables; scans see the created rows', async () => {
    const s = await store();
    const c = ORACLE_COUNTER;
    const vK1 = await create(s, T, 'k1', 'k1.0');
    const vK2 = await create(s, U, 'k2', 'k2.0');
    const first = applied(
      await many(s)(
        [
          { table: U, key: 'k2', expected: vK2, state: template('k2.1') },
          { table: T, key: 'n1', expected: null, state: template('n1.1') },
          { table: T, key: 'k1', expected: vK1, state: template('k1.1') },
          { table: U, key: 'n2', expected: null, state: template('n2.1') },
        ],
        c,
      ),
    );
    expect(first.timestamp).toBe(1);
    expect((await s.scan(T, { limit: 10 })).map((e) => e.key)).toEqual(['k1', 'n1']);
    expect((await s.scan(U, { limit: 10 })).map((e) => e.key)).toEqual(['k2', 'n2']);
    // Exactly one scan-index entry per row: an update adds none.
    expect(await client.zcard(scanIndexName(s.namespace, T))).toBe(2);
    expect(await client.zcard(scanIndexName(s.namespace, U))).toBe(2);
    // A second step builds on the versions of the first.
    const second = applied(
      await many(s)(
        [
          { table: T, key: 'n1', expected: first.versions[1]!, state: template('n1.2') },
          { table: U, key: 'n2', expected: first.versions[3]!, state: template('n2.2') },
          { table: T, key: 'n3', expected: null, state: template('n3.2') },
        ],
        c,
      ),
    );
    expect(second.timestamp).toBe(2);
    const rows = await s.readMany([
      { table: T, key: 'k1' },
      { table: U, key: 'k2' },
      { table: T, key: 'n1' },
      { table: U, key: 'n2' },
      { table: T, key: 'n3' },
    ]);
    expect(rows.map((row) => [tailOf(row!.state), stampOf(row!.state)])).toEqual([
      ['k1.1', 1],
      ['k2.1', 1],
      ['n1.2', 2],
      ['n2.2', 2],
      ['n3.2', 2],
    ]);
    expect(rows.map((row) => row!.version)).toEqual([
      first.versions[2],
      first.versions[0],
      second.versions[0],
      second.versions[1],
      second.versions[2],
    ]);
  });

  it('keeps the notification index per row exactly as the single stamped CAS does', async () => {
    const keys = ['a', 'b\u0000', '😀', 'd'];
    // The same writes, once through the many-row step and once row by row.
    const viaMany = await store();
    const viaSingle = await store();
    const steps: { key: string; notified: boolean; tail: string }[][] = [
      keys.map((key, i) => ({ key, notified: i !== 3, tail: `${i}.0` })),
      [
        { key: 'a', notified: false, tail: 'a.1' }, // cleared
        { key: '😀', notified: true, tail: 'e.1' }, // set again: its entry is replaced
        { key: 'd', notified: true, tail: 'd.1' }, // newly set
      ],
    ];
    const versions = new Map<string, Map<string, string | null>>([
      ['many', new Map(keys.map((k) => [k, null]))],
      ['single', new Map(keys.map((k) => [k, null]))],
    ]);
    for (const step of steps) {
      const m = versions.get('many')!;
      const r = applied(
        await many(viaMany)(
          step.map(({ key, notified, tail }) => ({
            table: T,
            key,
            expected: m.get(key)!,
            state: template(tail),
            notified,
          })),
          'c',
        ),
      );
      for (const [i, { key }] of step.entries()) m.set(key, r.versions[i]!);
      const one = versions.get('single')!;
      for (const { key, notified, tail } of step) {
        const single = await viaSingle.checkAndSetStamped!(
          { table: T, key, expected: one.get(key)!, state: template(tail), notified },
          'c',
        );
        one.set(key, (single as { version: string }).version);
      }
      // Same notified keys, same number of index entries, same row fields.
      expect(await viaMany.scanNotified(T, { limit: 10 })).toEqual(
        await viaSingle.scanNotified(T, { limit: 10 }),
      );
      for (const index of [notifyIndexName, scanIndexName]) {
        expect(await client.zcard(index(viaMany.namespace, T))).toBe(
          await client.zcard(index(viaSingle.namespace, T)),
        );
      }
      const fields = (rows: Record<string, string>[]) => rows.map((r) => Object.keys(r).sort());
      expect(fields(await rawRows(client, viaMany, T, keys))).toEqual(
        fields(await rawRows(client, viaSingle, T, keys)),
      );
    }
    expect(await viaMany.scanNotified(T, { limit: 10 })).toEqual(['b\u0000', 'd', '😀']);
    // Each notification entry is the one the row points to (its n token).
    const m = versions.get('many')!;
    expect(
      (await client.zrangeBuffer(notifyIndexName(viaMany.namespace, T), 0, -1)).map((b) => b.toString('hex')),
    ).toEqual(['b\u0000', 'd', '😀'].map((k) => indexMember(k, m.get(k)!).toString('hex')));
    // A single CAS clears a flag the many-row step set, and removes its entry.
    const cleared = await viaMany.checkAndSet({
      table: T,
      key: 'd',
      expected: m.get('d')!,
      state: template('d.2'),
    });
    expect(cleared.ok).toBe(true);
    expect(await viaMany.scanNotified(T, { limit: 10 })).toEqual(['b\u0000', '😀']);
    expect(await client.zcard(notifyIndexName(viaMany.namespace, T))).toBe(2);
  });

  it('16+ concurrent calls over overlapping rows all finish; each row ends as its last applied write', async () => {
    const ns = uniqueNamespace('sm');
    const peers = [await ownStore(ns), await ownStore(ns), await ownStore(ns)];
    const keys = ['r0', 'r1', 'r2', 'r3', 'r4', 'r5'];
    const workers = 20;
    const rounds = 8;
    interface Write {
      readonly timestamp: number;
      readonly rows: {
        key: string;
        expected: string | null;
        version: string;
        tail: string;
        notified: boolean;
      }[];
    }
    const writes: Write[] = [];
    let refusals = 0;
    await Promise.all(
      Array.from({ length: workers }, async (_, w) => {
        const s = peers[w % peers.length]!;
        for (let i = 0; i < rounds; i++) {
          // Three of the six rows, overlapping with other workers', in a varying order.
          const chosen = [0, 1, 2].map((j) => keys[(w + i + j * (1 + (w % 2))) % keys.length]!);
          if (i % 2 === 1) chosen.reverse();
          for (let attempt = 0; ; attempt++) {
            const rows = await s.readMany(chosen.map((key) => ({ table: T, key })));
            const requests = chosen.map((key, j) => ({
              table: T,
              key,
              expected: rows[j]?.version ?? null,
              state: template(`${w}.${i}.${attempt}.${key}`),
              notified: (w + j) % 2 === 0,
            }));
            const r = await many(s)(requests, ORACLE_COUNTER);
            if (r.ok) {
              writes.push({
                timestamp: r.timestamp,
                rows: requests.map((q, j) => ({
                  key: q.key,
                  expected: q.expected,
                  version: r.versions[j]!,
                  tail: tailOf(q.state),
                  notified: q.notified,
                })),
              });
              break;
            }
            refusals++;
            expect(r.current).toHaveLength(3);
            if (attempt > 200) throw new Error('a worker made no progress');
          }
        }
      }),
    );
    expect(writes).toHaveLength(workers * rounds);
    expect(refusals).toBeGreaterThan(0);
    // One value per applied step, and refused steps draw nothing: exactly 1..n.
    const stamps = writes.map((w) => w.timestamp).sort((a, b) => a - b);
    expect(stamps).toEqual(Array.from({ length: writes.length }, (_, i) => i + 1));
    expect(await peers[0]!.incrementCounter(ORACLE_COUNTER, 1)).toBe(writes.length + 1);
    // Per row, in stamp order, each applied write expected the version of the one before:
    // the steps are serial, none lost or overlapping.
    const ordered = [...writes].sort((a, b) => a.timestamp - b.timestamp);
    const final = await peers[1]!.readMany(keys.map((key) => ({ table: T, key })));
    keys.forEach((key, k) => {
      let previous: string | null = null;
      let last: { timestamp: number; version: string; tail: string } | undefined;
      for (const write of ordered) {
        const row = write.rows.find((r) => r.key === key);
        if (!row) continue;
        expect(row.expected).toBe(previous);
        previous = row.version;
        last = { timestamp: write.timestamp, version: row.version, tail: row.tail };
      }
      const row = final[k]!;
      expect(row.version).toBe(last!.version);
      expect(stampOf(row.state)).toBe(last!.timestamp);
      expect(tailOf(row.state)).toBe(last!.tail);
    });
    // The indexes: one scan entry per row; notification entries only for rows notified now.
    expect((await peers[0]!.scan(T, { limit: 100 })).map((e) => e.key)).toEqual(keys);
    expect(await client.zcard(scanIndexName(ns, T))).toBe(keys.length);
    const flagged = keys.filter((key) => {
      const last = ordered.findLast((w) => w.rows.some((r) => r.key === key))!;
      return last.rows.find((r) => r.key === key)!.notified;
    });
    const raw = await rawRows(client, peers[0]!, T, keys);
    expect(keys.filter((_, k) => raw[k]!.n !== undefined)).toEqual(flagged);
    expect(await peers[0]!.scanNotified(T, { limit: 100 })).toEqual(flagged);
    expect(await client.zcard(notifyIndexName(ns, T))).toBe(flagged.length);
  });

  it('a reader that draws from the counter after a step returned sees every row of it', async () => {
    const ns = uniqueNamespace('sm');
    const writers = [await ownStore(ns), await ownStore(ns)];
    const readers = [await ownStore(ns), await ownStore(ns)];
    const groups = 4;
    const size = 5;
    const rounds = 25;
    const refs = (g: number) => Array.from({ length: size }, (_, j) => ({ table: T, key: `g${g}.${j}` }));
    /** Every stamp each group's rows were written with (one writer per group, every step applies). */
    const stamps: number[][] = Array.from({ length: groups }, () => []);
    const observed: { g: number; timestamp: number; seen: number }[] = [];
    let writing = groups;
    // Writers: each group's rows always move together, to one stamp.
    const writes = Array.from({ length: groups }, async (_, g) => {
      const s = writers[g % writers.length]!;
      const reader = readers[g % readers.length]!;
      let versions: (string | null)[] = new Array(size).fill(null);
      for (let round = 0; round < rounds; round++) {
        const r = applied(
          await many(s)(
            refs(g).map((ref, j) => ({ ...ref, expected: versions[j]!, state: template(`${g}.${round}`) })),
            ORACLE_COUNTER,
          ),
        );
        stamps[g]!.push(r.timestamp);
        versions = [...r.versions];
        // Once it returned: a later draw, then a read, sees all of its rows.
        expect(await reader.incrementCounter(ORACLE_COUNTER, 1)).toBeGreaterThan(r.timestamp);
        const rows = await reader.readMany(refs(g));
        for (const [j, row] of rows.entries()) {
          expect(row!.version).toBe(r.versions[j]);
          expect(stampOf(row!.state)).toBe(r.timestamp);
        }
      }
      writing--;
    });
    // Meanwhile readers draw and read in one step (readStamped): a group is seen whole, with
    // one stamp, never in part.
    const reads = readers.map(async (reader, i) => {
      for (let n = i; writing > 0; n++) {
        const g = n % groups;
        const { timestamp, rows } = await reader.readStamped!(refs(g), ORACLE_COUNTER);
        const seen = new Set(rows.map((row: StoredRow | null) => (row ? stampOf(row.state) : 0)));
        expect(seen.size).toBe(1);
        observed.push({ g, timestamp, seen: [...seen][0]! });
      }
    });
    await Promise.all([...writes, ...reads]);
    expect(observed.length).toBeGreaterThan(10);
    // Each read saw exactly the group's newest step stamped below its own value: a step that
    // had drawn a smaller value was already written in full.
    for (const { g, timestamp, seen } of observed) {
      const below = stamps[g]!.filter((t) => t < timestamp);
      expect(seen).toBe(below.length === 0 ? 0 : Math.max(...below));
    }
  });

  it('passes user text only as KEYS/ARGV: quotes, backslashes, unicode and Lua-looking keys are plain data', async () => {
    const s = await store();
    const nasty = [
      "']] .. redis.call('FLUSHALL') .. [['",
      '"\\"\\\\',
      '\\',
      "end; return redis.call('DEL', KEYS[1]) --",
      '😀\u0000é{x}[[',
      '\n--[==[',
      'KEYS[1]',
      ' ',
    ];
    const counter = "'); redis.call('FLUSHALL') --\\😀";
    const requests = nasty.map((key, i) => ({
      table: T,
      key,
      expected: null,
      state: template(`${key}|${i}`),
      notified: true,
    }));
    const r = applied(await many(s)(requests, counter));
    expect(r.timestamp).toBe(1);
    for (const [i, request] of requests.entries()) {
      const row = (await s.read(T, request.key))!;
      expect(row.version).toBe(r.versions[i]);
      expect(same(row.state, writeStamp(request.state, 1))).toBe(true);
    }
    const sorted = [...nasty].sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
    expect(await s.scanNotified(T, { limit: 20 })).toEqual(sorted);
    expect((await s.scan(T, { limit: 20 })).map((e) => e.key)).toEqual(sorted);
    expect(await s.incrementCounter(counter, 1)).toBe(2);
    // A refusal hands the same keys back intact, and the shared server still has its keys.
    const again = refused(await many(s)(requests, counter));
    expect(again.current!.map((row) => row!.version)).toEqual(r.versions);
    expect(await client.ping()).toBe('PONG');
    // The script source is a constant: nothing is ever interpolated into it.
    expect(CAS_MANY_SCRIPT.source).toBe(CAS_MANY_LUA);
  });

  it('refuses to stamp once the counter passed 2^53 - 1, and writes nothing', async () => {
    const s = await store();
    await s.incrementCounter('full', Number.MAX_SAFE_INTEGER);
    const requests = [
      { table: T, key: 'a', expected: null, state: template() },
      { table: T, key: 'b', expected: null, state: template(), notified: true },
    ];
    const error = await many(s)(requests, 'full').catch((e) => e);
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    expect((error as StoreError).retryable).toBe(false);
    expect(await s.readMany(requests)).toEqual([null, null]);
    expect(await client.exists(scanIndexName(s.namespace, T), notifyIndexName(s.namespace, T))).toBe(0);
    // The largest value still works.
    await client.set(counterKeyName(s.namespace, 'edge'), String(Number.MAX_SAFE_INTEGER - 1));
    const r = applied(await many(s)(requests, 'edge'));
    expect(r.timestamp).toBe(Number.MAX_SAFE_INTEGER);
    const rows = await s.readMany(requests);
    for (const row of rows) {
      expect(
        Buffer.from(row!.state)
          .subarray(STAMP_OFFSET, STAMP_OFFSET + 8)
          .toString('hex'),
      ).toBe('001fffffffffffff');
    }
  });

  it('the script: a resent request reports the stamp its first run wrote, and writes and draws nothing', async () => {
    const s = await store();
    const counter = counterKeyName(s.namespace, 'resend');
    await client.set(counter, String(2 ** 45 + 7));
    const rows = ['k1', 'k2'].map((k) => rowKeyName(s.namespace, T, k));
    const keys = [
      counter,
      ...rows.flatMap((row) => [row, scanIndexName(s.namespace, T), notifyIndexName(s.namespace, T)]),
    ];
    const args = [
      String(STAMP_OFFSET),
      ...['k1', 'k2'].flatMap((k, i) => [
        'absent',
        '',
        `token.${i}`,
        Buffer.from(template(k)),
        '1',
        indexMember(k, ''),
      ]),
    ];
    const first = (await runScript(client, CAS_MANY_SCRIPT, keys, args)) as [number, Buffer];
    expect(first[0]).toBe(1);
    expect(first[1].toString('hex')).toBe((2 ** 45 + 8).toString(16).padStart(16, '0'));
    // k1 is overwritten by someone else in between: k2 still carries this request's token.
    const k1 = (await s.read(T, 'k1'))!;
    expect(k1.version).toBe('token.0');
    expect(
      (await s.checkAndSet({ table: T, key: 'k1', expected: 'token.0', state: template('other') })).ok,
    ).toBe(true);
    const before = await rawRows(client, s, T, ['k1', 'k2']);
    const second = (await runScript(client, CAS_MANY_SCRIPT, keys, args)) as [number, Buffer];
    expect(second[0]).toBe(1);
    expect(second[1].toString('hex')).toBe(first[1].toString('hex'));
    expect(await client.get(counter)).toBe(String(2 ** 45 + 8));
    expect(await rawRows(client, s, T, ['k1', 'k2'])).toEqual(before);
  });

  it('rejects bad input before sending anything: duplicates, null or short states, oversized states, no rows', async () => {
    const s = await store();
    const c = 'c.bad';
    const ok = { table: T, key: 'a', expected: null, state: template() };
    // Through the factory's store (the core's contract check) and on the bare store alike.
    for (const target of [s, uncheckedStore(s)]) {
      const call = many(target);
      await expect(
        call(
          [ok, { table: T, key: 'b', expected: null, state: template() }, { ...ok, state: template('x') }],
          c,
        ),
      ).rejects.toBeInstanceOf(InvalidArgumentError);
      await expect(
        call([ok, { table: T, key: 'b', expected: null, state: null as unknown as Uint8Array }], c),
      ).rejects.toBeInstanceOf(InvalidArgumentError);
      await expect(
        call([ok, { table: T, key: 'b', expected: null, state: new Uint8Array(STAMP_OFFSET + 7) }], c),
      ).rejects.toBeInstanceOf(InvalidArgumentError);
      await expect(call([], c)).rejects.toBeInstanceOf(InvalidArgumentError);
      const huge = new Uint8Array(s.capabilities.maxStateBytes + 1);
      await expect(call([ok, { table: T, key: 'b', expected: null, state: huge }], c)).rejects.toBeInstanceOf(
        RowTooLargeError,
      );
    }
    expect(
      await s.readMany([
        { table: T, key: 'a' },
        { table: T, key: 'b' },
      ]),
    ).toEqual([null, null]);
    expect(await client.exists(counterKeyName(s.namespace, c))).toBe(0);
    // The single-row stamped CAS checks too on a bare store (found in review: a state
    // shorter than the stamp slot was stored cut to the slot, and reported applied).
    for (const target of [s, uncheckedStore(s)]) {
      for (const state of [new Uint8Array([5, 6, 7]), new Uint8Array(STAMP_OFFSET + 7)])
        await expect(
          target.checkAndSetStamped!({ table: T, key: 'a', expected: null, state }, c),
        ).rejects.toBeInstanceOf(InvalidArgumentError);
    }
    expect(await s.read(T, 'a')).toBeNull();
    expect(await client.exists(counterKeyName(s.namespace, c))).toBe(0);
    // The same key in another table is another row, not a duplicate.
    const r = applied(await many(s)([ok, { ...ok, table: U }], c));
    expect(r.timestamp).toBe(1);
    await s.dropNamespace();
    await s.close();
    await expect(many(s)([ok], c)).rejects.toBeInstanceOf(ClosedError);
  });
});

describe('standalone faults (private redis-server): stamped check-and-set of many rows', () => {
  let server: PrivateRedis | undefined;
  let s: RedisStore | undefined;
  afterEach(async () => {
    await server?.admin.client('UNPAUSE').catch(() => {});
    await s?.close();
    await server?.stop();
    server = undefined;
    s = undefined;
  });

  it('recovers from NOSCRIPT, and a timeout is "unknown" while the whole step still lands later', async () => {
    server = await startPrivateRedis();
    s = await createRedisStore({ url: server.url, namespace: uniqueNamespace('sm'), commandTimeoutMs: 300 });
    await server.admin.script('FLUSH');
    const created = applied(
      await many(s)(
        ['a', 'b', 'c'].map((key) => ({ table: T, key, expected: null, state: template(`${key}.1`) })),
        ORACLE_COUNTER,
      ),
    );
    expect(created.timestamp).toBe(1);
    await server.admin.client('PAUSE', 1500, 'WRITE');
    const error = await many(s)(
      ['c', 'a', 'b'].map((key) => ({
        table: T,
        key,
        expected: created.versions[['a', 'b', 'c'].indexOf(key)]!,
        state: template(`${key}.2`),
      })),
      ORACLE_COUNTER,
    ).catch((e) => e);
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('unknown');
    // After the pause the server runs it: every row then carries the one stamp it drew (2).
    const store = s;
    await vi.waitFor(
      async () => {
        const rows = await store.readMany(['a', 'b', 'c'].map((key) => ({ table: T, key })));
        expect(rows.map((row) => tailOf(row!.state))).toEqual(['a.2', 'b.2', 'c.2']);
        expect(rows.map((row) => stampOf(row!.state))).toEqual([2, 2, 2]);
      },
      { timeout: 5000, interval: 100 },
    );
    expect(await s.incrementCounter(ORACLE_COUNTER, 1)).toBe(3);
  });
});

describe('cluster: no stamped check-and-set of many rows', () => {
  let cluster: RedisClient;
  beforeAll(async () => {
    await assertClusterReachable();
    cluster = await connectCluster();
  });
  afterAll(async () => {
    await cluster?.quit();
  });

  it('declares stampedCheckAndSetMany false and has no method (rows and the counter are in different slots)', async () => {
    const s = await createRedisStore({ client: cluster, namespace: uniqueNamespace('sm') });
    try {
      expect(s.capabilities.stampedCheckAndSetMany).toBe(false);
      expect(s.capabilities.stampedCheckAndSet).toBe(false);
      expect((s as RowStore).checkAndSetStampedMany).toBeUndefined();
      expect('checkAndSetStampedMany' in s).toBe(false);
      expect('checkAndSetStampedMany' in uncheckedStore(s)).toBe(false);
    } finally {
      await s.close();
    }
  });
});
