import { InvalidArgumentError, Percolator } from '@percolator/core';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  createRedisClient,
  createRedisClusterClient,
  createRedisStore,
  defaultRedisUrl,
  dropRedisNamespace,
  listRedisNamespaces,
  RedisStore,
} from '../src/index.js';
import { assertClusterReachable, uniqueNamespace } from './helpers.js';

let admin: Redis;
const appKeys: string[] = [];

beforeAll(async () => {
  admin = new Redis(defaultRedisUrl(), { lazyConnect: true });
  await admin.connect();
});

afterAll(async () => {
  if (appKeys.length > 0) await admin.del(...appKeys);
  admin?.disconnect();
});

async function fill(namespace: string, client?: ReturnType<typeof createRedisClusterClient>): Promise<void> {
  const store = await createRedisStore(client ? { client, namespace } : { namespace });
  const db = new Percolator({ store });
  await db.transact(async (tx) => {
    tx.set('accounts', 'alice', 'balance', '10');
    tx.set('audit', 'a1', 'who', 'alice');
  });
  await db.close();
  await store.close();
}

describe('redis namespaces: list and drop', () => {
  it('lists a namespace by key kind, drops only its layout keys, and then it is gone', async () => {
    const ns = uniqueNamespace('ns');
    await fill(ns);
    // Application keys under the same prefix but not of the layout.
    for (const key of [`${ns}:session`, `${ns}:r:nobrace`, `${ns}:x:{y}`]) {
      appKeys.push(key);
      await admin.set(key, 'app');
    }
    const listed = (await listRedisNamespaces()).find((n) => n.namespace === ns);
    expect(listed?.kinds.rows).toBe(2);
    expect(listed?.kinds.scanIndexes).toBe(2);
    expect(listed?.kinds.counters).toBeGreaterThanOrEqual(1);
    expect(listed?.keys).toBe(
      listed!.kinds.rows + listed!.kinds.scanIndexes + listed!.kinds.notifyIndexes + listed!.kinds.counters,
    );

    expect(await dropRedisNamespace(ns)).toEqual({ namespace: ns, keys: listed!.keys });
    expect((await listRedisNamespaces()).map((n) => n.namespace)).not.toContain(ns);
    for (const key of appKeys) expect(await admin.exists(key)).toBe(1);
    expect(await dropRedisNamespace(ns)).toBeUndefined();
  });

  it('on a Redis Cluster: keys on every master', async () => {
    await assertClusterReachable();
    const client = createRedisClusterClient();
    client.on('error', () => {});
    try {
      const ns = uniqueNamespace('ns');
      await fill(ns, client);
      const listed = (await listRedisNamespaces({ client })).find((n) => n.namespace === ns);
      expect(listed?.kinds.rows).toBe(2);
      expect(await dropRedisNamespace(ns, { client })).toEqual({ namespace: ns, keys: listed!.keys });
      expect((await listRedisNamespaces({ client })).map((n) => n.namespace)).not.toContain(ns);
    } finally {
      await client.quit();
    }
  });

  it("store.dropNamespace drops only the namespace's layout keys, never an application's own <ns>:... keys", async () => {
    const ns = uniqueNamespace('ns');
    await fill(ns);
    const mine = `${ns}:session:abc`;
    appKeys.push(mine);
    await admin.set(mine, 'keep me');
    const store = await createRedisStore({ namespace: ns });
    await store.dropNamespace();
    await store.close();
    expect(await admin.get(mine)).toBe('keep me');
    expect(await admin.keys(`${ns}:[rinc]:{*`)).toEqual([]);
  });

  it('the RedisStore class refuses a namespace that is not one (it goes into SCAN patterns)', () => {
    const client = createRedisClient(defaultRedisUrl());
    try {
      for (const bad of ['ns?', 'a*', 'x[ab]', '', 'Upper']) {
        expect(() => new RedisStore(client, bad, false), bad).toThrow(InvalidArgumentError);
      }
    } finally {
      client.disconnect();
    }
  });

  it('rejects names that are not namespaces (no glob or Lua text reaches the server)', async () => {
    for (const bad of ['*', 'a*', 'a?', 'a[b]', 'Upper', 'a:b', '', `a${'b'.repeat(32)}`]) {
      await expect(dropRedisNamespace(bad, { url: 'redis://127.0.0.1:1' })).rejects.toBeInstanceOf(
        InvalidArgumentError,
      );
    }
  });
});

describe('a drop that fails part way', () => {
  it('is never reported as not applied once it has sent an UNLINK', async () => {
    const { dropFailed } = await import('../src/errors.js');
    const { StoreError } = await import('@percolator/core');
    const refused = new StoreError('redis dropNamespace failed: NOPERM', 'no', { retryable: false });
    // Before any UNLINK: nothing was deleted, 'no' stands.
    expect(dropFailed(refused, false)).toBe(refused);
    // After one: some keys are gone.
    const after = dropFailed(refused, true) as InstanceType<typeof StoreError>;
    expect(after).toBeInstanceOf(StoreError);
    expect(after.applied).toBe('unknown');
    expect(after.retryable).toBe(false);
    expect(after.message).toContain('after deleting some of its keys');
    const unknown = new StoreError('lost', 'unknown');
    expect(dropFailed(unknown, true)).toBe(unknown);
  });

  it("a store's dropNamespace whose UNLINKs are refused once it has sent one reports 'unknown', never 'no'", async () => {
    const { createRedisStore } = await import('../src/index.js');
    const { StoreError, uncheckedStore } = await import('@percolator/core');
    const { ReplyError } = await import('ioredis');
    for (const firstRefused of [2, 1]) {
      const store = await createRedisStore({ namespace: uniqueNamespace() });
      try {
        const db = new Percolator({ store });
        await db.transact(async (tx) => {
          for (let i = 0; i < 5; i++) tx.set('t', `r${i}`, 'v', 'x');
        });
        await db.close();
        const client = (uncheckedStore(store) as unknown as { client: Redis }).client;
        const unlink = client.unlink.bind(client);
        let calls = 0;
        // An error reply (as a NOPERM on some keys would be) from the n-th UNLINK on.
        (client as unknown as { unlink: (k: string) => Promise<number> }).unlink = (key: string) =>
          ++calls >= firstRefused ? Promise.reject(new ReplyError('NOPERM no permissions')) : unlink(key);
        const error = (await store.dropNamespace().catch((e: unknown) => e)) as InstanceType<
          typeof StoreError
        >;
        expect(error).toBeInstanceOf(StoreError);
        // Some UNLINK was sent either way (the first call is sent): never 'no'.
        expect(error.applied, `refused from call ${firstRefused}`).toBe('unknown');
        (client as unknown as { unlink: typeof unlink }).unlink = unlink;
      } finally {
        await store.dropNamespace();
        await store.close();
      }
    }
  });
});
