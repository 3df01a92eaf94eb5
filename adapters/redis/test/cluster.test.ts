import { StoreError } from '@percolator/core';
import { Cluster, Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { clusterOptions, createRedisStore, defaultClusterNodes } from '../src/index.js';
import { counterKeyName, notifyIndexName, rowKeyName, scanIndexName } from '../src/keys.js';
import type { RedisStore } from '../src/store.js';
import { describeStoreBehaviour } from './behaviour.js';
import { assertClusterReachable, bytes, connectCluster, sleep, text, uniqueNamespace } from './helpers.js';

let cluster: Cluster;

beforeAll(async () => {
  await assertClusterReachable();
  cluster = await connectCluster();
});

afterAll(async () => {
  await cluster?.quit();
});

describeStoreBehaviour('cluster', {
  newStore: (namespace = uniqueNamespace()) => createRedisStore({ client: cluster, namespace }),
  client: () => cluster,
});

async function keySlot(key: string): Promise<number> {
  return (await cluster.cluster('KEYSLOT', key)) as number;
}

/** host:port of the master serving a slot. */
async function nodeOfSlot(slot: number): Promise<string> {
  const ranges = (await cluster.cluster('SLOTS')) as unknown as [number, number, [string, number]][];
  const range = ranges.find(([lo, hi]) => slot >= lo && slot <= hi)!;
  return `${range[2][0]}:${range[2][1]}`;
}

describe('cluster: key layout', () => {
  it('is named redis-cluster', async () => {
    const store = await createRedisStore({ client: cluster, namespace: uniqueNamespace() });
    expect(store.name).toBe('redis-cluster');
    await store.close();
  });

  it('puts rows in different slots on every master, and user braces never pick the slot', async () => {
    const ns = uniqueNamespace();
    const slots = new Set<number>();
    const nodes = new Set<string>();
    for (let i = 0; i < 30; i++) {
      const slot = await keySlot(rowKeyName(ns, 't', `row${i}`));
      slots.add(slot);
      nodes.add(await nodeOfSlot(slot));
    }
    expect(slots.size).toBeGreaterThan(25);
    expect(nodes.size).toBe(3);
    // A user key that looks like a hash tag: the slot is that of our own tag (table + the
    // base64url of the key), not of "{same}".
    const tricky = ['{same}', 'a{same}', '{same}b', '}{', '{}'];
    const trickySlots = await Promise.all(tricky.map((k) => keySlot(rowKeyName(ns, 't', k))));
    for (const [i, k] of tricky.entries()) {
      const ownTag = `t:${Buffer.from(k).toString('base64url')}`;
      expect(trickySlots[i]).toBe(await keySlot(ownTag));
    }
    expect(new Set(trickySlots).size).toBe(tricky.length);
    // Each table's two indexes share a slot; other tables and namespaces are elsewhere.
    expect(await keySlot(scanIndexName(ns, 't'))).toBe(await keySlot(notifyIndexName(ns, 't')));
    expect(await keySlot(scanIndexName(ns, 't'))).not.toBe(await keySlot(scanIndexName(ns, 'u')));
    expect(await keySlot(scanIndexName(ns, 't'))).not.toBe(
      await keySlot(scanIndexName(uniqueNamespace(), 't')),
    );
    expect(await keySlot(counterKeyName(ns, 'percolator.oracle'))).toBeTypeOf('number');
  });

  it('recovers from NOSCRIPT on every master after SCRIPT FLUSH', async () => {
    const store = await createRedisStore({ client: cluster, namespace: uniqueNamespace() });
    try {
      const keys = Array.from({ length: 20 }, (_, i) => `k${i}`);
      const created = await store.checkAndSetMany(
        keys.map((key) => ({ table: 't', key, expected: null, state: bytes('1') })),
      );
      expect(created.every((r) => r.ok)).toBe(true);
      await Promise.all(cluster.nodes('master').map((n) => n.script('FLUSH')));
      const updated = await store.checkAndSetMany(
        keys.map((key, i) => ({
          table: 't',
          key,
          expected: (created[i] as { version: string }).version,
          state: bytes('2'),
        })),
      );
      expect(updated.every((r) => r.ok)).toBe(true);
      expect(
        (await store.readMany(keys.map((key) => ({ table: 't', key })))).map((r) => text(r!.state)),
      ).toEqual(keys.map(() => '2'));
    } finally {
      await store.dropNamespace();
      await store.close();
    }
  });
});

describe('cluster: ambiguity', () => {
  it('reports StoreError "unknown" when a node connection drops while a CAS is in flight', async () => {
    const name = `percolator_${uniqueNamespace('c')}`;
    const options = clusterOptions();
    const own = new Cluster(defaultClusterNodes(), {
      ...options,
      redisOptions: { ...options.redisOptions, connectionName: name },
    });
    own.on('error', () => {});
    await own.connect();
    const store: RedisStore = await createRedisStore({ client: own, namespace: uniqueNamespace() });
    const key = 'victim';
    const slot = await keySlot(rowKeyName(store.namespace, 't', key));
    const [host, port] = (await nodeOfSlot(slot)).split(':');
    const admin = new Redis({ host, port: Number(port) });
    try {
      const created = await store.checkAndSet({ table: 't', key, expected: null, state: bytes('before') });
      await admin.client('PAUSE', 5000, 'WRITE');
      const settled = store
        .checkAndSet({
          table: 't',
          key,
          expected: (created as { version: string }).version,
          state: bytes('after'),
        })
        .catch((e) => e);
      await sleep(200);
      const list = (await admin.client('LIST')) as string;
      const ids = list
        .split('\n')
        .filter((l) => l.includes(` name=${name} `))
        .map((l) => /\bid=(\d+)/.exec(l)![1]!);
      expect(ids.length).toBeGreaterThan(0);
      for (const id of ids) await admin.client('KILL', 'ID', id);
      const error = await settled;
      expect(error).toBeInstanceOf(StoreError);
      expect((error as StoreError).applied).toBe('unknown');
      // Not resent by the Cluster (retryDelayOnFailover 0).
      expect((error as Error).message).toContain('Connection is closed');
      await admin.client('UNPAUSE');
      // The Cluster client reconnects to the node on the next commands.
      await vi.waitFor(async () => expect(await store.read('t', key)).not.toBeNull(), {
        timeout: 10_000,
        interval: 200,
      });
      // ...and the CAS was not sent again (the killed connection's command never ran).
      await sleep(300);
      expect(text((await store.read('t', key))!.state)).toBe('before');
      await store.dropNamespace();
    } finally {
      await admin.client('UNPAUSE').catch(() => {});
      admin.disconnect();
      await store.close();
      own.disconnect();
    }
  });
});
