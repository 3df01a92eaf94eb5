import { ORACLE_COUNTER, STAMP_OFFSET, StoreError } from '@percolator/core';
import type { Redis } from 'ioredis';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { createRedisStore } from '../src/index.js';
import { counterKeyName } from '../src/keys.js';
import type { RedisStore } from '../src/store.js';
import { bytes, type PrivateRedis, sleep, startPrivateRedis, text, uniqueNamespace } from './helpers.js';

/**
 * Faults on a redis-server of our own (pausing, killing connections and flushing scripts on
 * the shared server would disturb other test runs).
 */
describe('standalone faults (private redis-server)', () => {
  let server: PrivateRedis;
  let store: RedisStore;

  beforeEach(async () => {
    server = await startPrivateRedis();
  });
  afterEach(async () => {
    await server.admin.client('UNPAUSE').catch(() => {});
    await store?.close();
    await server.stop();
  });

  async function open(commandTimeoutMs?: number): Promise<RedisStore> {
    store = await createRedisStore({ url: server.url, namespace: uniqueNamespace(), commandTimeoutMs });
    return store;
  }

  it('runs CAS by EVALSHA and recovers from NOSCRIPT after SCRIPT FLUSH', async () => {
    const s = await open();
    await server.admin.config('RESETSTAT');
    const created = await s.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('1') });
    expect(created.ok).toBe(true);
    expect(await commandCalls(server.admin)).toEqual({ evalsha: 1, eval: 0 });

    await server.admin.script('FLUSH');
    const updated = await s.checkAndSet({
      table: 't',
      key: 'k',
      expected: (created as { version: string }).version,
      state: bytes('2'),
    });
    expect(updated.ok).toBe(true);
    expect(text((await s.read('t', 'k'))!.state)).toBe('2');
    // One EVALSHA answered NOSCRIPT, then one EVAL re-sent (and re-cached) the script...
    expect(await commandCalls(server.admin)).toEqual({ evalsha: 2, eval: 1 });
    // ...so the next CAS is by hash again.
    await s.checkAndSet({ table: 't', key: 'k2', expected: null, state: bytes('3') });
    expect(await commandCalls(server.admin)).toEqual({ evalsha: 3, eval: 1 });
  });

  it('reports StoreError "unknown" when the connection drops while a CAS is in flight', async () => {
    const s = await open();
    const created = await s.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('before') });
    const id = await storeConnectionId(server.admin);
    // Hold writes at the server, so our EVALSHA is sent but not answered, then cut it off.
    await server.admin.client('PAUSE', 5000, 'WRITE');
    const pending = s.checkAndSet({
      table: 't',
      key: 'k',
      expected: (created as { version: string }).version,
      state: bytes('after'),
    });
    const settled = pending.catch((e) => e);
    await sleep(200);
    await server.admin.client('KILL', 'ID', id);
    const error = await settled;
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('unknown');
    expect((error as StoreError).retryable).toBe(false);
    // ioredis fails in-flight commands at once (maxRetriesPerRequest 0), without resending.
    expect((error as Error).message).toContain('max retries per request');
    await server.admin.client('UNPAUSE');
    // The store reconnects by itself, and did not send the CAS again (the killed
    // connection's command never ran, so the row is unchanged).
    await vi.waitFor(async () => expect(await s.read('t', 'k')).not.toBeNull(), {
      timeout: 5000,
      interval: 100,
    });
    await sleep(200);
    expect(text((await s.read('t', 'k'))!.state)).toBe('before');
  });

  it('reports StoreError "unknown" on a timeout, and the write may still land', async () => {
    const s = await open(300);
    const created = await s.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('before') });
    const expected = (created as { version: string }).version;
    await server.admin.client('PAUSE', 1500, 'WRITE');
    const error = await s
      .checkAndSet({ table: 't', key: 'k', expected, state: bytes('late') })
      .catch((e) => e);
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('unknown');
    expect((error as Error).message).toContain('timed out');
    // After the pause the server runs the command we gave up on: this is why it is 'unknown'.
    await vi.waitFor(async () => expect(text((await s.read('t', 'k'))!.state)).toBe('late'), {
      timeout: 5000,
      interval: 100,
    });
  });

  it('a stamped CAS: recovers from NOSCRIPT, and a timeout is "unknown" while the stamped write still lands', async () => {
    const s = await open(300);
    const state = (tag: number) => Uint8Array.from([9, ...new Array(8).fill(0), tag]);
    const stamp = (data: Uint8Array) => Number(Buffer.from(data).readBigUInt64BE(STAMP_OFFSET));
    await server.admin.script('FLUSH');
    const created = await s.checkAndSetStamped!(
      { table: 't', key: 'k', expected: null, state: state(1) },
      ORACLE_COUNTER,
    );
    expect(created).toMatchObject({ ok: true, timestamp: 1 });
    expect(await commandCalls(server.admin)).toMatchObject({ eval: 1 });

    await server.admin.client('PAUSE', 1500, 'WRITE');
    const error = await s.checkAndSetStamped!(
      { table: 't', key: 'k', expected: (created as { version: string }).version, state: state(2) },
      ORACLE_COUNTER,
    ).catch((e) => e);
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('unknown');
    // After the pause the server runs it: the row then carries the stamp it drew (2).
    await vi.waitFor(async () => expect((await s.read('t', 'k'))!.state[STAMP_OFFSET + 8]).toBe(2), {
      timeout: 5000,
      interval: 100,
    });
    expect(stamp((await s.read('t', 'k'))!.state)).toBe(2);
    expect(await s.incrementCounter(ORACLE_COUNTER, 1)).toBe(3);
  });

  it('a stamped read: recovers from NOSCRIPT, fails like a read ("no", retryable) on a timeout or a dropped connection', async () => {
    const s = await open(300);
    const ref = [{ table: 't', key: 'k' }];
    await s.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('x') });
    // Loaded when the store was created: the first call already goes by hash.
    await server.admin.config('RESETSTAT');
    expect((await s.readStamped!(ref, ORACLE_COUNTER)).timestamp).toBe(1);
    expect(await commandCalls(server.admin)).toEqual({ evalsha: 1, eval: 0 });
    await server.admin.script('FLUSH');
    await server.admin.config('RESETSTAT');
    const first = await s.readStamped!(ref, ORACLE_COUNTER);
    expect(first.timestamp).toBe(2);
    expect(text(first.rows[0]!.state)).toBe('x');
    // One EVALSHA answered NOSCRIPT, one EVAL ran (and cached) it; the next goes by hash.
    expect(await commandCalls(server.admin)).toEqual({ evalsha: 1, eval: 1 });
    expect((await s.readStamped!(ref, ORACLE_COUNTER)).timestamp).toBe(3);
    expect(await commandCalls(server.admin)).toEqual({ evalsha: 2, eval: 1 });

    // A timeout: 'no' and retryable, though the server runs the script after the pause. The
    // counter then has advanced without anyone getting the value: a gap, which is harmless.
    await server.admin.client('PAUSE', 1000, 'WRITE');
    const timedOut = await s.readStamped!(ref, ORACLE_COUNTER).catch((e) => e);
    expect(timedOut).toBeInstanceOf(StoreError);
    expect((timedOut as StoreError).applied).toBe('no');
    expect((timedOut as StoreError).retryable).toBe(true);
    expect((timedOut as Error).message).toContain('timed out');
    await vi.waitFor(async () => expect(await server.admin.get(counterKey(s))).toBe('4'), {
      timeout: 5000,
      interval: 100,
    });
    expect((await s.readStamped!(ref, ORACLE_COUNTER)).timestamp).toBe(5);

    // The connection dropped while the script was in flight: 'no' as well.
    const id = await storeConnectionId(server.admin);
    await server.admin.client('PAUSE', 5000, 'WRITE');
    const pending = s.readStamped!(ref, ORACLE_COUNTER).catch((e) => e);
    await sleep(100);
    await server.admin.client('KILL', 'ID', id);
    const dropped = await pending;
    expect(dropped).toBeInstanceOf(StoreError);
    expect((dropped as StoreError).applied).toBe('no');
    expect((dropped as StoreError).retryable).toBe(true);
    await server.admin.client('UNPAUSE');
  });

  it('reports StoreError "no" when the index step before a create times out (the CAS is not sent)', async () => {
    const s = await open(300);
    await server.admin.client('PAUSE', 1000, 'WRITE');
    const error = await s
      .checkAndSet({ table: 't', key: 'new', expected: null, state: bytes('x') })
      .catch((e) => e);
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    await server.admin.client('UNPAUSE');
    await sleep(100);
    expect(await s.read('t', 'new')).toBeNull();
  });

  it('reports StoreError "no" for a CAS not sent because the connection is down', async () => {
    const s = await open();
    await s.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('x') });
    await server.stop();
    await vi.waitFor(() => expect(s.client.status).not.toBe('ready'), { timeout: 5000 });
    const error = await s
      .checkAndSet({ table: 't', key: 'k2', expected: null, state: bytes('y') })
      .catch((e) => e);
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    expect((error as StoreError).retryable).toBe(true);
    const readError = await s.read('t', 'k').catch((e) => e);
    expect(readError).toBeInstanceOf(StoreError);
    // A stamped read that was never sent: 'no', retryable.
    const stampedError = await s.readStamped!([{ table: 't', key: 'k' }], ORACLE_COUNTER).catch((e) => e);
    expect(stampedError).toBeInstanceOf(StoreError);
    expect((stampedError as StoreError).applied).toBe('no');
    expect((stampedError as StoreError).retryable).toBe(true);
    // Restart on the same port for afterEach's bookkeeping.
    server = await startPrivateRedis();
  });
});

async function commandCalls(admin: Redis): Promise<{ evalsha: number; eval: number }> {
  const info = await admin.info('commandstats');
  const calls = (name: string) => Number(new RegExp(`cmdstat_${name}:calls=(\\d+)`).exec(info)?.[1] ?? 0);
  return { evalsha: calls('evalsha'), eval: calls('eval') };
}

/** The id of the store's connection (ioredis names it "percolator"). */
async function storeConnectionId(admin: Redis): Promise<string> {
  const list = (await admin.client('LIST')) as string;
  const line = list.split('\n').find((l) => / name=percolator /.test(l));
  if (!line) throw new Error(`store connection not found in CLIENT LIST:\n${list}`);
  return /\bid=(\d+)/.exec(line)![1]!;
}

function counterKey(s: RedisStore): string {
  return counterKeyName(s.namespace, ORACLE_COUNTER);
}
