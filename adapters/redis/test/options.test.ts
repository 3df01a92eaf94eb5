// Option parsing needs no server: every case here fails before anything connects.
import { InvalidArgumentError, StoreError } from '@percolator/core';
import { Cluster, Redis } from 'ioredis';
import { afterEach, describe, expect, it, vi } from 'vitest';
import {
  clusterOptions,
  createRedisClient,
  createRedisClusterClient,
  createRedisStore,
  parseNodes,
  type RedisStoreOptions,
} from '../src/index.js';

const reject = (options: unknown) => createRedisStore(options as RedisStoreOptions).catch((e) => e);

describe('createRedisStore options', () => {
  afterEach(() => {
    vi.unstubAllEnvs();
  });

  it('rejects a misspelt key, naming it and every accepted key', async () => {
    const error = await reject({ uri: 'redis://127.0.0.1:1' });
    expect(error).toBeInstanceOf(InvalidArgumentError);
    expect(error.message).toContain('unknown option "uri"');
    for (const key of ['client', 'url', 'namespace', 'commandTimeoutMs'])
      expect(error.message).toContain(key);
    const cased = await reject({ URL: 'redis://127.0.0.1:1' });
    expect(cased.message).toContain('did you mean "url"?');
    expect(await reject(null)).toBeInstanceOf(InvalidArgumentError);
  });

  it('refuses a client that is not an ioredis client (null opened a connection of its own; {} or a URL string failed untyped)', async () => {
    for (const client of [null, {}, 'redis://127.0.0.1:6379', 7]) {
      const error = await reject({ client });
      expect(error, String(client)).toBeInstanceOf(InvalidArgumentError);
      expect(error.message).toContain('client must be an ioredis Redis or Cluster client');
    }
  });

  it('refuses a commandTimeoutMs that is not an integer from 1 to 2^31 - 1 (a longer timer fires after 1 ms)', async () => {
    for (const commandTimeoutMs of [0, -5, 1.5, 'abc', 2 ** 31]) {
      const error = await reject({ url: 'redis://127.0.0.1:1', commandTimeoutMs });
      expect(error).toBeInstanceOf(InvalidArgumentError);
      expect(error.message).toContain('commandTimeoutMs must be an integer from 1 to 2147483647');
    }
    // The exported helpers check it too (a Cluster store is made from createRedisClusterClient).
    expect(() => createRedisClient('redis://127.0.0.1:1', 2 ** 31)).toThrow(InvalidArgumentError);
    expect(() => createRedisClusterClient([{ host: '127.0.0.1', port: 1 }], 2 ** 31)).toThrow(
      InvalidArgumentError,
    );
    expect(() => clusterOptions(0)).toThrow(InvalidArgumentError);
  });

  it('rejects a client together with settings only a store-made client would use', async () => {
    const client = createRedisClient('redis://127.0.0.1:1');
    try {
      const error = await reject({ client, commandTimeoutMs: 50 });
      expect(error).toBeInstanceOf(InvalidArgumentError);
      expect(error.message).toContain('not both');
    } finally {
      client.disconnect();
    }
  });

  it('names the url option, not PERCOLATOR_REDIS_URL, when the given URL is unreachable', async () => {
    vi.stubEnv('PERCOLATOR_REDIS_URL', 'redis://127.0.0.1:2');
    const error = await reject({ url: 'redis://:secret@127.0.0.1:1', namespace: 'x' });
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).applied).toBe('no');
    expect(error.message).toContain('127.0.0.1:1');
    expect(error.message).toContain('the url option');
    expect(error.message).not.toContain('PERCOLATOR_REDIS_URL');
    expect(error.message).not.toContain('secret');
  });

  it('names PERCOLATOR_REDIS_URL when the URL came from it', async () => {
    vi.stubEnv('PERCOLATOR_REDIS_URL', 'redis://127.0.0.1:1');
    const error = await reject({ namespace: 'x' });
    expect(error).toBeInstanceOf(StoreError);
    expect(error.message).toContain('$PERCOLATOR_REDIS_URL');
  });

  it('names the nodes of a client passed in that cannot connect', async () => {
    const cluster = createRedisClusterClient([{ host: '127.0.0.1', port: 1 }]);
    cluster.on('error', () => {});
    try {
      const error = await reject({ client: cluster, namespace: 'x' });
      expect(error).toBeInstanceOf(StoreError);
      expect(error.message).toContain('Redis Cluster at 127.0.0.1:1');
    } finally {
      cluster.disconnect();
    }
  });

  it("refuses a client that would send a command again after its reply was lost, read from replicas (ioredis's defaults), or auto-pipeline on a Cluster", async () => {
    const clients = [
      {
        client: new Redis('redis://127.0.0.1:1', { lazyConnect: true }),
        wants: 'autoResendUnfulfilledCommands: false',
      },
      {
        // No resend, but ioredis's maxRetriesPerRequest (20) and no command timeout: a
        // command in flight at a dropped connection is dropped unanswered at the reconnect.
        client: new Redis('redis://127.0.0.1:1', { lazyConnect: true, autoResendUnfulfilledCommands: false }),
        wants: 'maxRetriesPerRequest: 0 or a commandTimeout',
      },
      {
        client: new Cluster([{ host: '127.0.0.1', port: 1 }], {
          ...clusterOptions(),
          redisOptions: { autoResendUnfulfilledCommands: false },
        }),
        wants: 'maxRetriesPerRequest: 0 or a commandTimeout (in redisOptions)',
      },
      {
        client: new Cluster([{ host: '127.0.0.1', port: 1 }], { lazyConnect: true }),
        wants:
          'autoResendUnfulfilledCommands: false (in redisOptions), maxRetriesPerRequest: 0 or a commandTimeout (in redisOptions), retryDelayOnFailover: 0',
      },
      {
        client: new Cluster([{ host: '127.0.0.1', port: 1 }], { ...clusterOptions(), scaleReads: 'slave' }),
        wants: "scaleReads: 'master'",
      },
      {
        client: new Cluster([{ host: '127.0.0.1', port: 1 }], {
          ...clusterOptions(),
          enableAutoPipelining: true,
        }),
        wants: 'enableAutoPipelining: false',
      },
    ];
    for (const { client, wants } of clients) {
      try {
        const error = await reject({ client, namespace: 'x' });
        expect(error).toBeInstanceOf(InvalidArgumentError);
        expect(error.message).toContain(wants);
        expect(error.message).toMatch(/createRedis(Cluster)?Client\(\)/);
      } finally {
        client.disconnect();
      }
    }
  });

  it('takes a client with resending off and either maxRetriesPerRequest 0 or a command timeout', async () => {
    for (const extra of [{ maxRetriesPerRequest: 0 }, { commandTimeout: 5000 }]) {
      const client = new Redis('redis://127.0.0.1:1', {
        lazyConnect: true,
        autoResendUnfulfilledCommands: false,
        ...extra,
      });
      client.on('error', () => {});
      try {
        // It gets past the check, to the connection (nothing listens on port 1).
        const error = await reject({ client, namespace: 'x' });
        expect(error).not.toBeInstanceOf(InvalidArgumentError);
        expect(error).toBeInstanceOf(StoreError);
      } finally {
        client.disconnect();
      }
    }
  });

  it('parseNodes names where a bad node list came from', () => {
    expect(() => parseNodes('nope', '--url')).toThrow(/\(--url\)/);
    expect(() => parseNodes('nope', '--url')).not.toThrow(/PERCOLATOR_REDIS_CLUSTER_NODES/);
    expect(() => parseNodes('nope')).toThrow(/PERCOLATOR_REDIS_CLUSTER_NODES/);
  });
});
