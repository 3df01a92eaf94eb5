import { ClosedError, ORACLE_COUNTER, STAMP_OFFSET, StoreError, writeStamp } from '@percolator/core';
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createRedisClient, createRedisStore, defaultRedisUrl } from '../src/index.js';
import { counterKeyName, notifyIndexName, rowKeyName, scanIndexName } from '../src/keys.js';
import { CAS_LUA, CAS_SCRIPT, runScript } from '../src/scripts.js';
import type { RedisStore } from '../src/store.js';
import { bytes, standaloneStore, uniqueNamespace } from './helpers.js';

/**
 * The stamped CAS on a standalone Redis (Redis at PERCOLATOR_REDIS_URL): the Lua script
 * stamps exact bytes, shares the counter with incrementCounter, and is atomic with it.
 */

const T = 'tbl';
/** Every byte value, so a stamp that shifted or mangled any byte of the state shows. */
const ALL_BYTES = Uint8Array.from({ length: 256 }, (_, i) => i);

/** A format byte, the 8-byte slot (placeholder 0xEE, so an unwritten slot shows), a tail. */
function template(tail: Uint8Array = ALL_BYTES, head = 0x42): Uint8Array {
  const out = new Uint8Array(STAMP_OFFSET + 8 + tail.length);
  out.fill(head, 0, STAMP_OFFSET);
  out.fill(0xee, STAMP_OFFSET, STAMP_OFFSET + 8);
  out.set(tail, STAMP_OFFSET + 8);
  return out;
}

/** The stamp in a stored state, computed with BigInt (independently of the store). */
function stampOf(state: Uint8Array): number {
  return Number(Buffer.from(state).readBigUInt64BE(STAMP_OFFSET));
}

function hex(n: number): string {
  return BigInt(n).toString(16).padStart(16, '0');
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

describe('standalone: stamped check-and-set', () => {
  const stores: RedisStore[] = [];
  async function store(namespace = uniqueNamespace('st')): Promise<RedisStore> {
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

  function stamped(s: RedisStore) {
    const method = s.checkAndSetStamped;
    if (!method) throw new Error('checkAndSetStamped is missing');
    return method;
  }

  it('writes the exact big-endian bytes of large stamps, up to 2^53 - 1, and keeps every other byte', async () => {
    const s = await store();
    const targets = [
      1,
      255,
      256,
      65_535,
      2 ** 32 - 1,
      2 ** 32,
      2 ** 40 + 3,
      0x1e_dc_ba_98_76_54_32, // every byte different
      0x10_00_00_00_00_00_01,
      2 ** 53 - 2,
      Number.MAX_SAFE_INTEGER,
    ];
    for (const [i, target] of targets.entries()) {
      const counter = `big.${i}`;
      if (target > 1) expect(await s.incrementCounter(counter, target - 1)).toBe(target - 1);
      const state = template();
      const r = await stamped(s)({ table: T, key: `k${i}`, expected: null, state }, counter);
      expect(r).toMatchObject({ ok: true, timestamp: target });
      const row = (await s.read(T, `k${i}`))!;
      expect(row.version).toBe((r as { version: string }).version);
      expect(Buffer.from(row.state).equals(Buffer.from(writeStamp(state, target)))).toBe(true);
      expect(
        Buffer.from(row.state)
          .subarray(STAMP_OFFSET, STAMP_OFFSET + 8)
          .toString('hex'),
      ).toBe(hex(target));
      expect(stampOf(row.state)).toBe(target);
      // The caller's template is not changed.
      expect(state[STAMP_OFFSET]).toBe(0xee);
      // The counter moved by exactly one: incrementCounter serves the same counter.
      if (target < Number.MAX_SAFE_INTEGER) expect(await s.incrementCounter(counter, 1)).toBe(target + 1);
    }
  });

  it('refuses to stamp once the counter passed 2^53 - 1, and writes nothing', async () => {
    const s = await store();
    await s.incrementCounter('full', Number.MAX_SAFE_INTEGER);
    const error = await stamped(s)({ table: T, key: 'k', expected: null, state: template() }, 'full').catch(
      (e) => e,
    );
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    // Retrying cannot get past it.
    expect((error as StoreError).retryable).toBe(false);
    expect(await s.read(T, 'k')).toBeNull();
    // A counter set past 2^53 by hand (Lua numbers are doubles) is refused too.
    await client.set(counterKeyName(s.namespace, 'beyond'), '9007199254740993');
    const beyond = await stamped(s)(
      { table: T, key: 'k', expected: null, state: template() },
      'beyond',
    ).catch((e) => e);
    expect(beyond).toBeInstanceOf(StoreError);
    expect(await s.read(T, 'k')).toBeNull();
  });

  it('applies the CAS like checkAndSet: versions, absence, a failed CAS draws nothing', async () => {
    const s = await store();
    const c = ORACLE_COUNTER;
    const first = await stamped(s)({ table: T, key: 'k', expected: null, state: template() }, c);
    expect(first).toMatchObject({ ok: true, timestamp: 1 });
    const v1 = (first as { version: string }).version;

    // Must-be-absent on a present row fails, shows the row, and leaves the counter alone.
    const again = await stamped(s)({ table: T, key: 'k', expected: null, state: template(bytes('x')) }, c);
    expect(again.ok).toBe(false);
    expect(again.timestamp).toBeUndefined();
    const current = (again as { current?: { version: string; state: Uint8Array } }).current!;
    expect(current.version).toBe(v1);
    expect(stampOf(current.state)).toBe(1);
    const wrong = await stamped(s)({ table: T, key: 'k', expected: 'nope', state: template() }, c);
    expect(wrong.ok).toBe(false);
    const absent = await stamped(s)({ table: T, key: 'gone', expected: v1, state: template() }, c);
    expect(absent).toEqual({ ok: false, current: null });
    expect(await s.incrementCounter(c, 1)).toBe(2);

    // An update gets a new version; the old one is stale for plain and stamped CAS alike.
    const second = await stamped(s)({ table: T, key: 'k', expected: v1, state: template(bytes('two')) }, c);
    expect(second).toMatchObject({ ok: true, timestamp: 3 });
    const v2 = (second as { version: string }).version;
    expect(v2).not.toBe(v1);
    expect((await s.checkAndSet({ table: T, key: 'k', expected: v1, state: bytes('x') })).ok).toBe(false);
    // A plain CAS and a plain delete follow a stamped write as usual.
    const plain = await s.checkAndSet({ table: T, key: 'k', expected: v2, state: bytes('plain') });
    expect(plain.ok).toBe(true);
    const deleted = await s.checkAndSet({
      table: T,
      key: 'k',
      expected: (plain as { version: string }).version,
      state: null,
    });
    expect(deleted.ok).toBe(true);
    // Re-created after the delete: a fresh version, never an old one.
    const third = await stamped(s)({ table: T, key: 'k', expected: null, state: template() }, c);
    expect(third).toMatchObject({ ok: true, timestamp: 4 });
    expect([v1, v2]).not.toContain((third as { version: string }).version);
  });

  it('keeps the scan index and the notification index', async () => {
    const s = await store();
    const c = 'idx';
    const keys = ['a', 'b\u0000', '😀'];
    const versions = new Map<string, string>();
    for (const key of keys) {
      const r = await stamped(s)({ table: T, key, expected: null, state: template(), notified: true }, c);
      versions.set(key, (r as { version: string }).version);
    }
    expect((await s.scan(T, { limit: 10 })).map((r) => r.key)).toEqual(['a', 'b\u0000', '😀']);
    expect(await s.scanNotified(T, { limit: 10 })).toEqual(['a', 'b\u0000', '😀']);
    // A stamped write without `notified` clears the flag and its index entry.
    const r = await stamped(s)({ table: T, key: 'a', expected: versions.get('a')!, state: template() }, c);
    expect(r.ok).toBe(true);
    expect(await s.scanNotified(T, { limit: 10 })).toEqual(['b\u0000', '😀']);
    expect(await client.zcard(notifyIndexName(s.namespace, T))).toBe(2);
    // A refused stamped create leaves no index entry behind.
    await stamped(s)({ table: T, key: 'a', expected: null, state: template(), notified: true }, c);
    expect(await client.zcard(scanIndexName(s.namespace, T))).toBe(3);
    expect(await client.zcard(notifyIndexName(s.namespace, T))).toBe(2);
  });

  // Bad input and oversized states are the core's contract check (conformance: bad arguments).
  it('stamps the smallest state (the format byte and the slot), and refuses use after close', async () => {
    const s = await store();
    // The smallest state (just the format byte and the slot) works.
    const r = await stamped(s)(
      { table: T, key: 'k', expected: null, state: new Uint8Array(STAMP_OFFSET + 8) },
      'c',
    );
    expect(r).toMatchObject({ ok: true, timestamp: 1 });
    expect(Buffer.from((await s.read(T, 'k'))!.state).toString('hex')).toBe(`00${hex(1)}`);
    await s.dropNamespace();
    await s.close();
    await expect(
      stamped(s)({ table: T, key: 'k', expected: null, state: template() }, 'c'),
    ).rejects.toBeInstanceOf(ClosedError);
  });

  it('passes user text only as KEYS/ARGV: Lua-looking keys, counters and values are plain data', async () => {
    const s = await store();
    const nasty = "']] .. redis.call('FLUSHALL') .. [['\n--\u0000😀{x}";
    const state = template(bytes(nasty));
    const r = await stamped(s)({ table: T, key: nasty, expected: null, state }, nasty);
    expect(r).toMatchObject({ ok: true, timestamp: 1 });
    expect(Buffer.from((await s.read(T, nasty))!.state).equals(Buffer.from(writeStamp(state, 1)))).toBe(true);
    expect(await s.incrementCounter(nasty, 1)).toBe(2);
    // The script source is a constant: nothing is ever interpolated into it.
    expect(CAS_SCRIPT.source).toBe(CAS_LUA);
  });

  it('the script: a resent stamped put reports its first stamp and draws nothing', async () => {
    const s = await store();
    const row = rowKeyName(s.namespace, T, 'k');
    const counter = counterKeyName(s.namespace, 'resend');
    await client.set(counter, String(2 ** 45 + 7));
    const args = ['absent', '', 'put', 'token.1', Buffer.from(template()), '0', String(STAMP_OFFSET)];
    const first = (await runScript(client, CAS_SCRIPT, [row, counter], args)) as Buffer[];
    const second = (await runScript(client, CAS_SCRIPT, [row, counter], args)) as Buffer[];
    expect(first[0]).toBe(1);
    expect(first[4]!.toString('hex')).toBe(hex(2 ** 45 + 8));
    expect(second[0]).toBe(1);
    expect(second[4]!.toString('hex')).toBe(hex(2 ** 45 + 8));
    expect(await client.get(counter)).toBe(String(2 ** 45 + 8));
    // Without the counter key the same script is the plain CAS (no stamp, no counter).
    const plain = (await runScript(
      client,
      CAS_SCRIPT,
      [rowKeyName(s.namespace, T, 'p')],
      ['absent', '', 'put', 'token.2', Buffer.from(template()), '0'],
    )) as Buffer[];
    expect(plain).toHaveLength(4);
    expect(Buffer.from((await s.read(T, 'p'))!.state).equals(Buffer.from(template()))).toBe(true);
    expect(await client.get(counter)).toBe(String(2 ** 45 + 8));
  });

  it('draws unique, increasing values shared with incrementCounter under concurrency', async () => {
    const ns = uniqueNamespace('st');
    const peers = [await ownStore(ns), await ownStore(ns), await ownStore(ns)];
    const workers = 6;
    const rounds = 60;
    const drawn: number[][] = await Promise.all(
      Array.from({ length: workers }, async (_, w) => {
        const s = peers[w % peers.length]!;
        const seen: number[] = [];
        for (let i = 0; i < rounds; i++) {
          if ((i + w) % 2 === 0) {
            seen.push(await s.incrementCounter(ORACLE_COUNTER, 1));
          } else {
            // Half of them contend on a shared row (some fail), half create their own row.
            const key = i % 3 === 0 ? 'shared' : `w${w}.${i}`;
            const current = key === 'shared' ? await s.read(T, key) : null;
            const r = await stamped(s)(
              { table: T, key, expected: current?.version ?? null, state: template(bytes(`${w}.${i}`)) },
              ORACLE_COUNTER,
            );
            if (r.ok) {
              expect(typeof r.timestamp).toBe('number');
              seen.push(r.timestamp!);
            } else {
              expect(r.timestamp).toBeUndefined();
            }
          }
        }
        return seen;
      }),
    );
    // Each worker saw strictly increasing values (its calls were sequential).
    for (const seen of drawn) {
      for (let i = 1; i < seen.length; i++) expect(seen[i]!).toBeGreaterThan(seen[i - 1]!);
    }
    // No value was handed out twice, and (failed CAS draw nothing) they are exactly 1..n.
    const all = drawn.flat().sort((a, b) => a - b);
    expect(new Set(all).size).toBe(all.length);
    expect(all).toEqual(Array.from({ length: all.length }, (_, i) => i + 1));
    expect(await peers[0]!.incrementCounter(ORACLE_COUNTER, 1)).toBe(all.length + 1);
    // Every applied stamped write stored the stamp it reported.
    for (const { key, row } of await peers[0]!.scan(T, { limit: 1000 })) {
      if (key !== 'shared') expect(all).toContain(stampOf(row.state));
    }
  });
});
