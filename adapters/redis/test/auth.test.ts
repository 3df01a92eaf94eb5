import { randomBytes } from 'node:crypto';
import { recordFailures, transactOnce } from '@percolator/conformance';
import { CounterOracle, Percolator, StoreError } from '@percolator/core';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { toStoreError } from '../src/errors.js';
import {
  createRedisClient,
  createRedisStore,
  defaultRedisUrl,
  dropRedisNamespace,
  type RedisStore,
} from '../src/index.js';
import { uniqueNamespace } from './helpers.js';

/**
 * Authentication and authorization failures (WRONGPASS, NOAUTH, NOPERM) are StoreErrors
 * that are not retryable, so `db.transact` gives up at once. The local Redis has no
 * password; an ACL user made here stands in for an account whose rights are revoked.
 */

const user = `perc_auth_${randomBytes(4).toString('hex')}`;
const password = randomBytes(8).toString('hex');
let admin: Redis;

function withCredentials(name: string, secret: string): string {
  const parsed = new URL(defaultRedisUrl());
  parsed.username = name;
  parsed.password = secret;
  return parsed.toString();
}

beforeAll(async () => {
  admin = new Redis(defaultRedisUrl(), { lazyConnect: true });
  await admin.connect();
});

afterAll(async () => {
  await admin?.acl('DELUSER', user).catch(() => {});
  admin?.disconnect();
});

function expectNotRetryable(error: unknown, reply: RegExp): void {
  expect(error).toBeInstanceOf(StoreError);
  const storeError = error as StoreError;
  expect(storeError.retryable).toBe(false);
  expect(storeError.applied).toBe('no');
  expect(storeError.code).toBe('STORE_UNAVAILABLE');
  expect(storeError.message).toMatch(reply);
}

describe('redis: authentication and authorization failures are not retryable', () => {
  it('an unknown user: the server answers WRONGPASS, and the StoreError is not retryable', async () => {
    const error = await createRedisStore({
      url: withCredentials(`no_such_user_${randomBytes(4).toString('hex')}`, 'wrong'),
      namespace: uniqueNamespace(),
    }).catch((e: unknown) => e);
    // Without the 'error' event ioredis would only say "Connection is closed.".
    expectNotRetryable(error, /WRONGPASS invalid username-password pair/);
  });

  it('a client passed in with a wrong password fails at once, not after the ready wait', async () => {
    const client = createRedisClient(withCredentials(`no_such_user_${randomBytes(4).toString('hex')}`, 'x'));
    client.on('error', () => {});
    try {
      const error = await createRedisStore({ client, namespace: uniqueNamespace() }).catch((e: unknown) => e);
      // The refusal itself, not the ready wait's timeout (which says it did not connect in
      // time): no duration is asserted, the message tells which.
      expectNotRetryable(error, /WRONGPASS/);
    } finally {
      client.disconnect();
    }
  });

  it('maps a WRONGPASS reply to a non-retryable error, other error replies as before', async () => {
    // Real replies from the server, to map them exactly as the store would.
    const probe = new Redis(defaultRedisUrl(), { lazyConnect: true });
    await probe.connect();
    try {
      const wrongpass = await probe.auth('no_such_user', 'wrong').catch((e: unknown) => e);
      expect((wrongpass as Error).message).toMatch(/^WRONGPASS/);
      const unknownCommand = await probe.call('NO_SUCH_COMMAND').catch((e: unknown) => e);
      for (const effect of ['read', 'write'] as const) {
        expect(toStoreError(wrongpass, 'x', effect).retryable).toBe(false);
        expect(toStoreError(unknownCommand, 'x', effect).retryable).toBe(true);
      }
    } finally {
      probe.disconnect();
    }
  });

  it('db.transact makes one attempt when the user loses its rights (NOPERM)', async () => {
    await admin.acl('SETUSER', user, 'reset', 'on', `>${password}`, '~*', '&*', '+@all');
    let store: RedisStore | undefined;
    const namespace = uniqueNamespace();
    try {
      store = await createRedisStore({ url: withCredentials(user, password), namespace });
      // Counts the store calls that fail.
      const { store: counted, failed } = recordFailures(store);
      // The oracle given explicitly (the same store counter as the default) keeps the start
      // timestamp out of stamped first reads, whose fallback would add a second call.
      const db = new Percolator({ store: counted, oracle: new CounterOracle(counted) });
      await db.transact(async (tx) => tx.set('t', 'r', 'c', 'before'));

      // ACL changes apply to connections already open: every command now gets NOPERM.
      await admin.acl('SETUSER', user, 'nocommands', '+ping', '+quit');
      const { error, attempts } = await transactOnce(db);
      expectNotRetryable(error, /NOPERM/);
      // Given up at once: one failed call, and the function ran at most once (not at all
      // if the start timestamp is what failed). A retryable error would be tried 10 times.
      expect(failed).toHaveLength(1);
      expect(attempts).toBeLessThanOrEqual(1);
      await db.close().catch(() => {});
    } finally {
      await store?.close();
      await dropRedisNamespace(namespace, { client: admin });
    }
  });

  it('a user that may not ZADD (the scan index of a new row) gets a non-retryable error, and nothing is written', async () => {
    await admin.acl('SETUSER', user, 'reset', 'on', `>${password}`, '~*', '&*', '+@all', '-zadd');
    let store: RedisStore | undefined;
    const namespace = uniqueNamespace();
    try {
      store = await createRedisStore({ url: withCredentials(user, password), namespace });
      const error = await store
        .checkAndSet({ table: 't', key: 'new', expected: null, state: new Uint8Array([1, 2, 3]) })
        .then(
          () => undefined,
          (e: unknown) => e,
        );
      expectNotRetryable(error, /NOPERM/);
      expect(await store.read('t', 'new')).toBeNull();
    } finally {
      await store?.close();
      await dropRedisNamespace(namespace, { client: admin });
    }
  });
});
