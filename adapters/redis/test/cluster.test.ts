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

/** Commands the Cluster client has written to each master and awaits replies for. */
function inFlight(): Map<string, number> {
  return new Map(
    cluster
      .nodes('master')
      .map((n) => [
        `${n.options.host}:${n.options.port}`,
        (n as unknown as { commandQueue: { length: number } }).commandQueue.length,
      ]),
  );
}

/**
 * Runs `batch` while every master holds its replies (CLIENT PAUSE ALL: commands are read
 * but not answered until the pause ends), and returns the commands in flight on each master
 * meanwhile. Commands that went out one after another's reply would show one at a time.
 * The pause ends by its timeout: during PAUSE ALL the server holds an UNPAUSE too.
 */
async function inFlightWhilePaused(batch: () => Promise<unknown>): Promise<Map<string, number>> {
  const admins = cluster
    .nodes('master')
    .map((n) => new Redis({ host: n.options.host, port: n.options.port }));
  try {
    await Promise.all(admins.map((a) => a.client('PAUSE', 1500, 'ALL')));
    const settled = batch();
    // Long enough for every command to be written; the replies wait for the pause.
    await sleep(300);
    const seen = inFlight();
    await settled;
    return seen;
  } finally {
    for (const a of admins) a.disconnect();
  }
}

describe('cluster: pipelining', () => {
  it('sends every command of readMany and checkAndSetMany before awaiting any reply', async () => {
    const store = await createRedisStore({ client: cluster, namespace: uniqueNamespace() });
    try {
      const refs = Array.from({ length: 60 }, (_, i) => ({ table: 't', key: `k${i}` }));
      const rowsPerNode = new Map<string, number>();
      for (const r of refs) {
        const node = await nodeOfSlot(await keySlot(rowKeyName(store.namespace, r.table, r.key)));
        rowsPerNode.set(node, (rowsPerNode.get(node) ?? 0) + 1);
      }
      expect(rowsPerNode.size).toBe(3);
      for (const n of rowsPerNode.values()) expect(n).toBeGreaterThanOrEqual(10);

      const created = await store.checkAndSetMany(
        refs.map((r) => ({ ...r, expected: null, state: bytes('0') })),
      );
      const versions = created.map((r) => (r as { version: string }).version);

      // The instrument can tell: reads one after another have one in flight at a time.
      const oneByOne = await inFlightWhilePaused(async () => {
        for (const r of refs) await store.read(r.table, r.key);
      });
      expect([...oneByOne.values()].reduce((a, b) => a + b, 0)).toBe(1);

      const reads = await inFlightWhilePaused(async () =>
        expect((await store.readMany(refs)).every(Boolean)).toBe(true),
      );
      const writes = await inFlightWhilePaused(async () => {
        const results = await store.checkAndSetMany(
          refs.map((r, i) => ({ ...r, expected: versions[i]!, state: bytes('1') })),
        );
        expect(results.every((r) => r.ok)).toBe(true);
      });
      for (const [node, rows] of rowsPerNode) {
        expect(reads.get(node)).toBe(rows);
        expect(writes.get(node)).toBe(rows);
      }
    } finally {
      await store.dropNamespace();
      await store.close();
    }
  });
});

describe('a standalone client on a node of the Cluster', () => {
  it('is refused with a typed error that says to use a Cluster client (it was given one-step scripts every call of which failed)', async () => {
    const node = defaultClusterNodes()[0]!;
    await expect(createRedisStore({ url: `redis://${node.host}:${node.port}` })).rejects.toThrow(
      /is a node of a Redis Cluster: connect with a Cluster client/,
    );
    const own = new Redis({
      host: node.host,
      port: node.port,
      ...clusterOptions().redisOptions,
      lazyConnect: true,
    });
    try {
      const refused = await createRedisStore({ client: own }).catch((e: unknown) => e);
      expect((refused as Error).name).toBe('InvalidArgumentError');
      // A client passed in stays the caller's: still open.
      expect(await own.ping()).toBe('PONG');
    } finally {
      own.disconnect();
    }
  });
});
