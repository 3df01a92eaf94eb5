import { StoreError } from '@percolator/core';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createRedisClient, createRedisStore, defaultRedisUrl } from '../src/index.js';
import { describeStoreBehaviour } from './behaviour.js';
import { bytes, namespaceKeys, standaloneStore, uniqueNamespace } from './helpers.js';

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

describeStoreBehaviour('standalone', {
  newStore: (namespace = uniqueNamespace()) => createRedisStore({ client, namespace }),
  client: () => client,
});

describe('standalone: a store that makes its own client', () => {
  it('connects from the url, is named "redis", and quits its client on close', async () => {
    const store = await standaloneStore();
    expect(store.name).toBe('redis');
    await store.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('v') });
    expect(await namespaceKeys(client, store.namespace)).toHaveLength(2); // row + scan index
    await store.dropNamespace();
    await store.close();
    // QUIT was answered; the socket closes right after.
    await vi.waitFor(() => expect(store.client.status).toBe('end'));
  });

  it('fails with StoreError "no" naming the URL it was given when Redis is unreachable', async () => {
    const error = await createRedisStore({ url: 'redis://127.0.0.1:1', namespace: 'x' }).catch((e) => e);
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    expect((error as Error).message).toContain('redis://127.0.0.1:1 (from the url option)');
  });

  it('accepts a lazy client that is not connected yet', async () => {
    const lazy = createRedisClient();
    const store = await createRedisStore({ client: lazy, namespace: uniqueNamespace() });
    expect(lazy.status).toBe('ready');
    expect(await store.read('t', 'k')).toBeNull();
    await store.close();
    expect(lazy.status).toBe('ready');
    await lazy.quit();
  });
});
