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
import { dropStore, type FaultStoreKind, faultNamespace, openStore } from './support/fault-stores.js';
import { clean, FaultWorkload, sleep, summary } from './support/fault-workload.js';

/**
 * The store's server itself dies (SIGKILL to its process group: no shutdown, no flush)
 * and comes back, three times, while three clients (each on a store instance of its own,
 * like separate processes) commit transfers and list-append transactions. Every server is
 * private (own port, own data directory) and configured to be durable. After the last
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
  readonly kind: FaultStoreKind;
  readonly start: () => Promise<{
    server: PrivateServer;
    victim: PrivateServer;
    address: Parameters<typeof openStore>[1];
  }>;
}

const single =
  (start: () => Promise<PrivateServer>): Target['start'] =>
  async () => {
    const server = await start();
    return { server, victim: server, address: { url: server.url } };
  };

const DURABLE: readonly Target[] = [
  {
    name: 'PostgreSQL (fsync, synchronous_commit on)',
    kind: 'postgres',
    start: single(startPrivatePostgres),
  },
  {
    name: 'MariaDB (innodb_flush_log_at_trx_commit=1)',
    kind: 'mariadb',
    start: single(startPrivateMariaDb),
  },
  { name: 'Redis (appendfsync always)', kind: 'redis', start: single(() => startPrivateRedis('always')) },
  { name: 'DynamoDB Local (-dbPath)', kind: 'dynamodb', start: single(() => startPrivateDynamoDb(true)) },
  {
    name: 'Redis Cluster (one of 3 masters, appendfsync always)',
    kind: 'redis-cluster',
    start: async () => {
      const cluster = await startPrivateRedisCluster(3);
      return { server: cluster, victim: cluster.node(1), address: { url: '', nodes: cluster.nodes } };
    },
  },
];

const LOSSY: readonly Target[] = [
  {
    name: 'Redis without an append-only file',
    kind: 'redis',
    start: single(() => startPrivateRedis('none')),
  },
  { name: 'DynamoDB Local -inMemory', kind: 'dynamodb', start: single(() => startPrivateDynamoDb(false)) },
];

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

async function deploy(target: Target) {
  const { server, victim, address } = await target.start();
  cleanups.push(() => server.destroy());
  const namespace = faultNamespace('restart');
  const stores: RowStore[] = [];
  for (let i = 0; i < 3; i++) stores.push(await openStore(target.kind, address, namespace));
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
    const store = await openStore(target.kind, address, namespace);
    stores.push(store);
    return store;
  };
  return { victim, stores, workload, reopen };
}

async function restartDuringCommits(target: Target, restarts: number, lossy = false) {
  const started = Date.now();
  const { victim, stores, workload, reopen } = await deploy(target);
  workload.start();
  try {
    for (let i = 0; i < restarts; i++) {
      await workload.waitForAcks(ACKS_BETWEEN, 60_000, `${target.name} before restart ${i + 1}`);
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
