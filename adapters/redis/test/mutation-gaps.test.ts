import { ORACLE_COUNTER, StoreError } from '@percolator/core';
import { Redis } from 'ioredis';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { createRedisStore } from '../src/index.js';
import { counterKeyName, rowKeyName, scanIndexName } from '../src/keys.js';
import type { RedisStore } from '../src/store.js';
import { bytes, type PrivateRedis, startPrivateRedis, text, uniqueNamespace } from './helpers.js';

/**
 * Cases found by mutation testing of the Redis adapter's failure mapping (errors.ts, and
 * the batch outcome of store.ts): each fails with a small, plausible bug there that the
 * rest of the suite let through. A write's StoreError says 'no' only when the command
 * certainly did not run. On a redis-server of our own (pausing, stopping, running a busy
 * script and changing ACLs would disturb other runs on the shared server).
 */

/** A stamped state: a format byte, the 8-byte slot, then `tail`. */
const template = (tail: string) => Uint8Array.from([9, 0, 0, 0, 0, 0, 0, 0, 0, ...bytes(tail)]);

function version(result: { ok: boolean; version?: string }): string {
  if (!result.ok || result.version === undefined) throw new Error('the CAS did not apply');
  return result.version;
}

async function errorOf(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    () => undefined,
    (e: unknown) => e,
  );
}

describe('redis failure mapping (private redis-server)', () => {
  let server: PrivateRedis;
  const stores: RedisStore[] = [];

  beforeEach(async () => {
    server = await startPrivateRedis();
  });
  afterEach(async () => {
    await server.admin.client('UNPAUSE').catch(() => {});
    for (const s of stores.splice(0)) await s.close();
    await server.stop();
  });

  async function open(options: { commandTimeoutMs?: number; url?: string; namespace?: string } = {}) {
    const store = await createRedisStore({
      url: options.url ?? server.url,
      namespace: options.namespace ?? uniqueNamespace(),
      commandTimeoutMs: options.commandTimeoutMs,
    });
    stores.push(store);
    return store;
  }

  it("writes not sent because the connection is down are 'no', retryable: an update (no index step first) and a counter increment", async () => {
    const s = await open();
    const v = version(await s.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('x') }));
    await server.stop();
    await vi.waitFor(() => expect(s.client.status).not.toBe('ready'), { timeout: 5000 });
    for (const call of [
      s.checkAndSet({ table: 't', key: 'k', expected: v, state: bytes('y') }),
      s.incrementCounter('c', 1),
      s.checkAndSetStamped!({ table: 't', key: 'k', expected: v, state: template('y') }, ORACLE_COUNTER),
    ]) {
      const error = await errorOf(call);
      expect(error).toBeInstanceOf(StoreError);
      expect(error).toMatchObject({ applied: 'no', retryable: true });
    }
    // Restarted for afterEach's bookkeeping.
    server = await startPrivateRedis();
  });

  it("a counter increment that timed out is 'unknown', and did land", async () => {
    const s = await open({ commandTimeoutMs: 300 });
    expect(await s.incrementCounter('c', 1)).toBe(1);
    await server.admin.client('PAUSE', 1500, 'WRITE');
    const error = await errorOf(s.incrementCounter('c', 1));
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('unknown');
    expect((error as Error).message).toContain('timed out');
    // After the pause the server runs it.
    await vi.waitFor(async () => expect(await server.admin.get(counterKeyName(s.namespace, 'c'))).toBe('2'), {
      timeout: 5000,
      interval: 100,
    });
  });

  it("an error a script raises after it wrote is 'unknown': the stamped CAS of many rows fails on an index after writing the row", async () => {
    const s = await open();
    // The table's scan index is a string: the script writes the row, then its ZADD fails (WRONGTYPE).
    await server.admin.set(scanIndexName(s.namespace, 't'), 'not a sorted set');
    const error = await errorOf(
      s.checkAndSetStampedMany!([{ table: 't', key: 'k', expected: null, state: template('landed') }], 'c'),
    );
    expect(error).toBeInstanceOf(StoreError);
    expect((error as Error).message).toMatch(/WRONGTYPE.*script/);
    expect((error as StoreError).applied).toBe('unknown');
    // Redis does not roll a script back: the row and the draw are there.
    expect(text((await s.read('t', 'k'))!.state).slice(9)).toBe('landed');
    expect(await server.admin.get(counterKeyName(s.namespace, 'c'))).toBe('1');
  });

  it("BUSY (another client's script is running) rejects a CAS before it runs: 'no', retryable", async () => {
    const s = await open();
    const v = version(await s.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('before') }));
    await server.admin.config('SET', 'busy-reply-threshold', '20');
    const busy = new Redis({
      port: server.port,
      host: '127.0.0.1',
      lazyConnect: true,
      maxRetriesPerRequest: 0,
    });
    busy.on('error', () => {});
    await busy.connect();
    const probe = new Redis({
      port: server.port,
      host: '127.0.0.1',
      lazyConnect: true,
      maxRetriesPerRequest: 0,
    });
    probe.on('error', () => {});
    await probe.connect();
    try {
      // A script that never ends and writes nothing (so SCRIPT KILL can stop it).
      const running = busy.eval('while true do end', 0).catch((e: unknown) => e);
      await vi.waitFor(async () => expect(String(await errorOf(probe.ping()))).toMatch(/^ReplyError: BUSY/), {
        timeout: 5000,
        interval: 20,
      });
      const error = await errorOf(
        s.checkAndSet({ table: 't', key: 'k', expected: v, state: bytes('after') }),
      );
      expect(error).toBeInstanceOf(StoreError);
      expect((error as Error).message).toMatch(/BUSY/);
      expect(error).toMatchObject({ applied: 'no', retryable: true });
      await probe.script('KILL');
      await running;
    } finally {
      busy.disconnect();
      probe.disconnect();
    }
    expect(text((await s.read('t', 'k'))!.state)).toBe('before');
  });

  describe('checkAndSetMany with requests refused by an ACL (NOPERM, not applied) beside others', () => {
    const user = 'mg_limited';
    const password = 'secret';

    /** A store of a user that may touch rows of table "ok" only (and every index and counter). */
    async function limited(namespace: string): Promise<RedisStore> {
      await server.admin.acl(
        'SETUSER',
        user,
        'reset',
        'on',
        `>${password}`,
        `~${namespace}:r:{ok:*`,
        `~${namespace}:i:*`,
        `~${namespace}:n:*`,
        `~${namespace}:c:*`,
        '&*',
        '+@all',
      );
      const url = new URL(server.url);
      url.username = user;
      url.password = password;
      return open({ url: url.toString(), namespace });
    }

    it("one request applied and one refused: 'unknown' (the batch is not 'no')", async () => {
      const namespace = uniqueNamespace();
      const owner = await open({ namespace });
      const a = version(
        await owner.checkAndSet({ table: 'ok', key: 'a', expected: null, state: bytes('a0') }),
      );
      const x = version(
        await owner.checkAndSet({ table: 'no', key: 'x', expected: null, state: bytes('x0') }),
      );
      const s = await limited(namespace);
      const error = await errorOf(
        s.checkAndSetMany([
          { table: 'ok', key: 'a', expected: a, state: bytes('a1') },
          { table: 'no', key: 'x', expected: x, state: bytes('x1') },
        ]),
      );
      expect(error).toBeInstanceOf(StoreError);
      expect((error as Error).message).toMatch(/NOPERM/);
      expect((error as StoreError).applied).toBe('unknown');
      expect(text((await owner.read('ok', 'a'))!.state)).toBe('a1');
      expect(text((await owner.read('no', 'x'))!.state)).toBe('x0');
    });

    it("one request refused and one whose outcome is unknown: 'unknown', whichever failed first", async () => {
      const namespace = uniqueNamespace();
      const owner = await open({ namespace });
      const x = version(
        await owner.checkAndSet({ table: 'no', key: 'x', expected: null, state: bytes('x0') }),
      );
      // Row ok/w is a string: the CAS script fails inside (WRONGTYPE ... script), 'unknown'.
      await server.admin.set(rowKeyName(namespace, 'ok', 'w'), 'not a hash');
      const s = await limited(namespace);
      const error = await errorOf(
        s.checkAndSetMany([
          { table: 'no', key: 'x', expected: x, state: bytes('x1') },
          { table: 'ok', key: 'w', expected: 'v1', state: bytes('w1') },
        ]),
      );
      expect(error).toBeInstanceOf(StoreError);
      expect((error as StoreError).applied).toBe('unknown');
    });
  });
});
