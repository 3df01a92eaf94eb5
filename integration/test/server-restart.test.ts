import { Percolator, type RowStore } from '@percolator/core';
import {
  type PrivateServer,
  startPrivateDynamoDb,
  startPrivateMariaDb,
  startPrivatePostgres,
  startPrivateRedis,
  startPrivateRedisCluster,
} from '@percolator/testkit/private';
import { afterEach, describe, expect, it } from 'vitest';
import {
  compositeOf,
  dropStore,
  type FaultStoreKind,
  faultNamespace,
  openStore,
} from './support/fault-stores.js';
import { clean, FaultWorkload, sleep, summary } from './support/fault-workload.js';

/**
 * The store's server itself dies (SIGKILL to its process group: no shutdown, no flush)
 * and comes back, three times, while three clients (each on a store instance of its own,
 * like separate processes) commit transfers and list-append transactions. Every server is
 * private (own port, own data directory) and configured to be durable. (The composite
 * store, PostgreSQL + Redis with each transaction's rows on both, loses one member's
 * server at a time: Redis, PostgreSQL, Redis.) After the last
 * restart the clients must commit again (they reconnect by themselves), and then: no
 * snapshot-isolation anomaly (the Elle-style checker), every acknowledged commit present,
 * no certainly-failed one present, balances agree with the transfer logs and the total is
 * conserved, and every row is writable by a client whose clock is lockTtlMs + 1 s past.
 *
 * Then the settings that lose acknowledged writes (Redis without an append-only file,
 * DynamoDB Local in memory): the same restart loses acknowledged commits, and the same
 * checks report it.
 */
const LOCK_TTL_MS = 1000;
const RESTARTS = 3;
/** Commits acknowledged between restarts (and after the last one: the clients are back). */
const ACKS_BETWEEN = 15;
/** How long the server stays down (plus its start time): long enough that clients notice. */
const DOWN_MS = 1000;

interface Target {
  readonly name: string;
  /** Starts the private servers; what a restart kills, and how a client opens its store. */
  readonly start: () => Promise<{
    /** Destroyed at the end. */
    servers: readonly PrivateServer[];
    /** Restart i kills victims[i % victims.length]. */
    victims: readonly PrivateServer[];
    open: (namespace: string) => Promise<RowStore>;
  }>;
}

const single =
  (kind: FaultStoreKind, start: () => Promise<PrivateServer>): Target['start'] =>
  async () => {
    const server = await start();
    return {
      servers: [server],
      victims: [server],
      open: (namespace) => openStore(kind, { url: server.url }, namespace),
    };
  };

const DURABLE: readonly Target[] = [
  {
    name: 'PostgreSQL (fsync, synchronous_commit on)',
    start: single('postgres', startPrivatePostgres),
  },
  {
    name: 'MariaDB (innodb_flush_log_at_trx_commit=1)',
    start: single('mariadb', startPrivateMariaDb),
  },
  { name: 'Redis (appendfsync always)', start: single('redis', () => startPrivateRedis('always')) },
  { name: 'DynamoDB Local (-dbPath)', start: single('dynamodb', () => startPrivateDynamoDb(true)) },
  {
    name: 'Redis Cluster (one of 3 masters, appendfsync always)',
    start: async () => {
      const cluster = await startPrivateRedisCluster(3);
      return {
        servers: [cluster],
        victims: [cluster.node(1)],
        open: (namespace) => openStore('redis-cluster', { url: '', nodes: cluster.nodes }, namespace),
      };
    },
  },
  {
    // Each transaction's rows span both members (fault-stores' compositeOf); the oracle is
    // PostgreSQL's counter. The restarts alternate: Redis, PostgreSQL, Redis.
    name: 'a composite store (PostgreSQL + Redis appendfsync always, each restarted in turn)',
    start: async () => {
      const [pg, redis] = await Promise.allSettled([startPrivatePostgres(), startPrivateRedis('always')]);
      if (pg.status === 'rejected' || redis.status === 'rejected') {
        for (const s of [pg, redis]) if (s.status === 'fulfilled') await s.value.destroy();
        throw pg.status === 'rejected' ? pg.reason : (redis as PromiseRejectedResult).reason;
      }
      return {
        servers: [pg.value, redis.value],
        victims: [redis.value, pg.value],
        open: async (namespace) => {
          const first = await openStore('postgres', { url: pg.value.url }, namespace);
          const second = await openStore('redis', { url: redis.value.url }, namespace).catch(
            async (error: unknown) => {
              await first.close();
              throw error;
            },
          );
          return compositeOf(first, second);
        },
      };
    },
  },
];

const LOSSY: readonly Target[] = [
  {
    name: 'Redis without an append-only file',
    start: single('redis', () => startPrivateRedis('none')),
  },
  {
    name: 'DynamoDB Local -inMemory',
    start: single('dynamodb', () => startPrivateDynamoDb(false)),
  },
];

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

async function deploy(target: Target) {
  const { servers, victims, open } = await target.start();
  cleanups.push(async () => {
    await Promise.all(servers.map((s) => s.destroy()));
  });
  const namespace = faultNamespace('restart');
  const stores: RowStore[] = [];
  for (let i = 0; i < 3; i++) stores.push(await open(namespace));
  const clients = stores.map(
    (store) => new Percolator({ store, lockTtlMs: LOCK_TTL_MS, lockWaitMs: LOCK_TTL_MS }),
  );
  cleanups.push(async () => {
    await Promise.all(clients.map((c) => c.close().catch(() => undefined)));
    await dropStore(stores[0]!);
    await Promise.all(stores.slice(1).map((s) => s.close().catch(() => undefined)));
  });
  const workload = new FaultWorkload(
    clients.map((db) => ({ db })),
    7,
  );
  await workload.setUp(clients[0]!);
  const reopen = async () => {
    const store = await open(namespace);
    stores.push(store);
    return store;
  };
  return { victims, stores, workload, reopen };
}

async function restartDuringCommits(target: Target, restarts: number, lossy = false) {
  const started = Date.now();
  const { victims, stores, workload, reopen } = await deploy(target);
  workload.start();
  try {
    for (let i = 0; i < restarts; i++) {
      await workload.waitForAcks(ACKS_BETWEEN, 60_000, `${target.name} before restart ${i + 1}`);
      const victim = victims[i % victims.length]!;
      await victim.kill();
      await sleep(DOWN_MS);
      await victim.restart();
    }
    // The clients reconnect by themselves and commit again. (A server that came back
    // empty has lost the DynamoDB table too: nothing commits until it is created again.)
    if (!lossy) await workload.waitForAcks(ACKS_BETWEEN, 60_000, `${target.name} after the last restart`);
  } finally {
    await workload.stop();
  }
  const verdict = await workload.verify({
    store: lossy ? await reopen() : stores[0]!,
    lockTtlMs: LOCK_TTL_MS,
  });
  console.info(
    `[server-restart] ${target.name}: ${restarts} restarts; ${summary(verdict)}; errors ${JSON.stringify(verdict.stats.errors)}; ${((Date.now() - started) / 1000).toFixed(1)} s`,
  );
  return verdict;
}

describe('the store server is SIGKILLed and restarted during concurrent commits', () => {
  for (const target of DURABLE) {
    it(`${target.name}: ${RESTARTS} restarts, no anomaly, no acknowledged commit lost, rows writable within lockTtlMs + 1 s`, async () => {
      const verdict = await restartDuringCommits(target, RESTARTS);
      expect(clean(verdict), verdict.describe()).toBe(true);
      expect(verdict.stats.ok).toBeGreaterThanOrEqual(ACKS_BETWEEN * (RESTARTS + 1));
      // The outages reached the clients: some store calls failed (not only conflicts).
      const storeErrors = Object.entries(verdict.stats.errors)
        .filter(([k]) => k.startsWith('StoreError') || k === 'CommitUnknownError')
        .reduce((n, [, v]) => n + v, 0);
      expect(storeErrors, JSON.stringify(verdict.stats.errors)).toBeGreaterThan(0);
    }, 240_000);
  }

  for (const target of LOSSY) {
    it(`${target.name}: a restart loses acknowledged commits, and the checks report it`, async () => {
      const verdict = await restartDuringCommits(target, 1, true);
      expect(verdict.lost.length, verdict.describe()).toBeGreaterThan(0);
      expect(clean(verdict)).toBe(false);
    }, 240_000);
  }
});
