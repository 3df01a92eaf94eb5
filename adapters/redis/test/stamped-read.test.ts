import {
  ClosedError,
  ORACLE_COUNTER,
  type RowRef,
  STAMP_OFFSET,
  type StoredRow,
  StoreError,
} from '@percolator/core';
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createRedisClient, createRedisStore, defaultRedisUrl } from '../src/index.js';
import { counterKeyName } from '../src/keys.js';
import {
  CAS_MANY_SCRIPT,
  CAS_SCRIPT,
  READ_PEEKED_SCRIPT,
  READ_STAMPED_LUA,
  READ_STAMPED_SCRIPT,
} from '../src/scripts.js';
import type { RedisStore } from '../src/store.js';
import {
  bytes,
  namespaceKeys,
  standaloneStore,
  startPrivateRedis,
  text,
  uniqueNamespace,
} from './helpers.js';

/**
 * The stamped read on a standalone Redis (Redis at PERCOLATOR_REDIS_URL): one script draws
 * from the oracle's counter and then reads the rows, so a read sees every write stamped
 * below its timestamp.
 */

const T = 'tbl';

/** A format byte, the 8-byte stamp slot (placeholder 0xEE), then `tail`. */
function template(tail: Uint8Array = bytes('tail')): Uint8Array {
  const out = new Uint8Array(STAMP_OFFSET + 8 + tail.length);
  out.fill(0x42, 0, STAMP_OFFSET);
  out.fill(0xee, STAMP_OFFSET, STAMP_OFFSET + 8);
  out.set(tail, STAMP_OFFSET + 8);
  return out;
}

/** The stamp in a stored state (0 for a state without one). */
function stampOf(state: Uint8Array): number {
  if (state.length < STAMP_OFFSET + 8) return 0;
  return Number(Buffer.from(state).readBigUInt64BE(STAMP_OFFSET));
}

type ReadStamped = (
  rows: readonly RowRef[],
  counter: string,
) => Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }>;

function stampedRead(s: RedisStore): ReadStamped {
  const method = s.readStamped;
  if (!method) throw new Error('readStamped is missing');
  return method;
}

function stampedCas(s: RedisStore) {
  const method = s.checkAndSetStamped;
  if (!method) throw new Error('checkAndSetStamped is missing');
  return method;
}

/** Rows as plain data, so version and state bytes compare exactly. */
function _plain(rows: readonly (StoredRow | null)[]) {
  return rows.map((r) => (r ? { version: r.version, state: Buffer.from(r.state).toString('hex') } : null));
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

describe('standalone: stamped read', () => {
  const stores: RedisStore[] = [];
  async function store(namespace = uniqueNamespace('sr')): Promise<RedisStore> {
    const s = await createRedisStore({ client, namespace });
    stores.push(s);
    return s;
  }
  /** A store with a connection of its own (another client process, as far as Redis can tell). */
  async function _ownStore(namespace: string): Promise<RedisStore> {
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

  it('loads every script it runs when it is created, the peeked read included (a private server, its script cache empty)', async () => {
    const server = await startPrivateRedis();
    try {
      await server.admin.script('FLUSH');
      const s = await createRedisStore({ url: server.url, namespace: uniqueNamespace('sl') });
      try {
        const scripts = [CAS_SCRIPT, CAS_MANY_SCRIPT, READ_STAMPED_SCRIPT, READ_PEEKED_SCRIPT];
        expect(await server.admin.script('EXISTS', ...scripts.map((lua) => lua.sha))).toEqual([1, 1, 1, 1]);
        // So the first peek runs by hash: no EVAL with the script's text reaches the server.
        await server.admin.config('RESETSTAT');
        const peek = s.readPeeked;
        if (!peek) throw new Error('readPeeked is missing');
        await peek([{ table: T, key: 'a' }], ORACLE_COUNTER);
        const stats = (await server.admin.info('commandstats')) as string;
        expect(stats).toMatch(/cmdstat_evalsha:calls=1,/);
        expect(stats).not.toMatch(/cmdstat_eval:/);
      } finally {
        await s.close();
      }
    } finally {
      await server.stop();
    }
  });

  it('writes nothing but the counter', async () => {
    const s = await store();
    const { timestamp, rows } = await stampedRead(s)(
      [
        { table: T, key: 'x' },
        { table: T, key: 'y' },
      ],
      'only.counter',
    );
    expect(timestamp).toBe(1);
    expect(rows).toEqual([null, null]);
    expect(await namespaceKeys(client, s.namespace)).toEqual([counterKeyName(s.namespace, 'only.counter')]);
  });

  it('refuses a counter past 2^53 - 1 (StoreError "no") and reads nothing', async () => {
    const s = await store();
    await s.incrementCounter('full', Number.MAX_SAFE_INTEGER - 1);
    expect((await stampedRead(s)([{ table: T, key: 'k' }], 'full')).timestamp).toBe(Number.MAX_SAFE_INTEGER);
    const error = await stampedRead(s)([{ table: T, key: 'k' }], 'full').catch((e) => e);
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    expect((error as StoreError).retryable).toBe(false);
    expect((error as Error).message).toContain('2^53');
    // Set past 2^53 by hand (Lua numbers are doubles): refused too.
    await client.set(counterKeyName(s.namespace, 'beyond'), '9223372036854775806');
    const beyond = await stampedRead(s)([], 'beyond').catch((e) => e);
    expect(beyond).toBeInstanceOf(StoreError);
    expect((beyond as StoreError).applied).toBe('no');
    // A counter key that holds no integer fails like a read: 'no', retryable.
    await client.set(counterKeyName(s.namespace, 'junk'), 'not a number');
    const junk = await stampedRead(s)([], 'junk').catch((e) => e);
    expect(junk).toBeInstanceOf(StoreError);
    expect((junk as StoreError).applied).toBe('no');
    expect((junk as StoreError).retryable).toBe(true);
  });

  // Bad input is the core's contract check (conformance: bad arguments); this is Redis's close.
  it('refuses use after close', async () => {
    const s = await store();
    const method = stampedRead(s);
    await s.close();
    await expect(method([{ table: T, key: 'k' }], 'c')).rejects.toBeInstanceOf(ClosedError);
  });

  it('passes user text only as KEYS: Lua-looking keys and counter names are plain data', async () => {
    const s = await store();
    const nasty = "']] .. redis.call('FLUSHALL') .. [['\n--\u0000😀{x}";
    await s.checkAndSet({ table: T, key: nasty, expected: null, state: bytes(nasty) });
    const { timestamp, rows } = await stampedRead(s)([{ table: T, key: nasty }], nasty);
    expect(timestamp).toBe(1);
    expect(text(rows[0]!.state)).toBe(nasty);
    expect(await s.incrementCounter(nasty, 1)).toBe(2);
    // The script source is a constant: nothing is ever interpolated into it.
    expect(READ_STAMPED_SCRIPT.source).toBe(READ_STAMPED_LUA);
  });
});

/**
 * Writers each own some rows and update them with stamped CAS (so each row's stamps grow);
 * readers read every row with `read` until the writers stop. For each observation of a row
 * at timestamp ts, the row must show exactly the newest write stamped below ts: older is a
 * stale read (a write that drew its stamp before ts is missing), newer is a read from the
 * future. Every write is recorded only after its reply and checked at the end, so a write
 * whose reply was still on its way when a reader drew a larger timestamp counts too.
 */
async function _visibilityRace(
  writers: readonly RedisStore[],
  readers: readonly ReadStamped[],
  { rowsPerWriter = 4, writesPerWriter = 300 } = {},
) {
  const c = ORACLE_COUNTER;
  const refs: RowRef[] = [];
  /** Per row, its writes in stamp order, with when each reply arrived. */
  const writes = new Map<string, { stamp: number; replied: number }[]>();
  const versions = new Map<string, string>();
  for (const [w, s] of writers.entries()) {
    for (let j = 0; j < rowsPerWriter; j++) {
      const key = `w${w}.r${j}`;
      const r = await stampedCas(s)({ table: T, key, expected: null, state: template() }, c);
      refs.push({ table: T, key });
      writes.set(key, [{ stamp: r.timestamp!, replied: performance.now() }]);
      versions.set(key, (r as { version: string }).version);
    }
  }
  let running = true;
  const observed: { ts: number; sent: number; key: string; stamp: number }[] = [];
  const writing = writers.map(async (s, w) => {
    for (let i = 0; i < writesPerWriter; i++) {
      const key = `w${w}.r${i % rowsPerWriter}`;
      const r = await stampedCas(s)(
        { table: T, key, expected: versions.get(key)!, state: template(bytes(`${w}.${i}`)) },
        c,
      );
      if (!r.ok) throw new Error(`writer ${w} lost its own row ${key}`);
      versions.set(key, r.version);
      writes.get(key)!.push({ stamp: r.timestamp!, replied: performance.now() });
    }
  });
  const reading = readers.map(async (read) => {
    while (running) {
      const sent = performance.now();
      const { timestamp, rows } = await read(refs, c);
      rows.forEach((row, i) => {
        observed.push({ ts: timestamp, sent, key: refs[i]!.key, stamp: stampOf(row!.state) });
      });
    }
  });
  try {
    await Promise.all(writing);
  } finally {
    running = false;
    await Promise.all(reading);
  }
  const stale: string[] = [];
  const future: string[] = [];
  let inFlight = 0;
  for (const { ts, sent, key, stamp } of observed) {
    const below = writes.get(key)!.filter((x) => x.stamp < ts);
    const newest = below.at(-1)!;
    if (stamp < newest.stamp) {
      stale.push(`${key} read at ${ts}: saw the write stamped ${stamp}, missed ${newest.stamp}`);
    }
    if (stamp >= ts) future.push(`${key} read at ${ts}: saw the write stamped ${stamp}`);
    // The read was sent before the writer had the reply of a write stamped below it.
    if (below.some((x) => x.replied > sent)) inFlight++;
  }
  return {
    writes: writers.length * writesPerWriter,
    observations: observed.length,
    inFlight,
    stale: stale.slice(0, 10),
    future: future.slice(0, 10),
  };
}
