import { type CommitStepEvent, Percolator, type RowStore } from '@percolator/core';
import { assertMySqlReachable } from '@percolator/mysql';
import { defaultRedisUrl } from '@percolator/redis';
import {
  clusterInfo,
  type PrivateServer,
  startPrivateDynamoDb,
  startPrivateRedisCluster,
} from '@percolator/testkit/private';
import { afterEach, describe, expect, it } from 'vitest';
import { postgresUrl } from './support/backends.js';
import {
  compositeOf,
  describeClusterClient,
  dropStore,
  type FaultStoreKind,
  faultNamespace,
  openStore,
} from './support/fault-stores.js';
import { clean, FaultWorkload, sleep, summary } from './support/fault-workload.js';
import { TcpProxy } from './support/tcp-proxy.js';

/**
 * Network partitions on every store, through a loopback TCP proxy in front of the real
 * server: the drivers see what they would see in production. Three clients, each on a
 * store instance of its own behind a proxy of its own, commit transfers and list-append
 * transactions. Nine times, at a commit step of one client's transaction, the network is
 * broken in one of three ways:
 * - reset: open connections reset (RST), new ones refused;
 * - refuse: open connections closed (FIN), new ones refused;
 * - drop-reply: requests still reach the server and are applied, their replies are lost,
 *   then the connections are reset;
 * at one of three points: after the primary's prewrite (the secondaries' prewrites meet
 * the fault), just before the commit point (the primary's commit CAS meets it), and just
 * after it (the secondaries' commits meet it). The partition heals 600 ms later, the
 * workload goes on, and the next fault follows. What is cut off:
 * - PostgreSQL, MariaDB, Redis, DynamoDB Local: the faulted client from its store (the
 *   other clients go on and meet its locks);
 * - Redis Cluster: one master, for every client, while the other masters answer;
 * - a composite (PostgreSQL + Redis): the PostgreSQL member, for the faulted client.
 * Then: no snapshot-isolation anomaly (the Elle-style checker), every acknowledged commit
 * present, no certainly-failed one, each unknown outcome (CommitUnknownError) resolved one
 * way for all its rows (transfers land in both accounts or neither), balances agree with
 * the logs, the total is conserved, and every row is writable within lockTtlMs + 1 s of
 * the last heal.
 */
const LOCK_TTL_MS = 1000;
const HOLD_MS = 600;
const KINDS = ['reset', 'refuse', 'drop-reply'] as const;
type FaultKind = (typeof KINDS)[number];
const POINTS = [
  { name: 'prewrite', matches: (e: CommitStepEvent) => e.step === 'afterPrewrite' && e.isPrimary === true },
  { name: 'commit point', matches: (e: CommitStepEvent) => e.step === 'beforeCommitPrimary' },
  { name: 'secondaries', matches: (e: CommitStepEvent) => e.step === 'afterCommitPrimary' },
] as const;

interface Deployment {
  /** One store per client (each behind its own proxies). */
  readonly stores: RowStore[];
  /** The proxies a fault breaks. */
  readonly victims: TcpProxy[];
  /** Which client's commit steps trigger the faults. */
  readonly faultedClient: number;
  readonly cleanup: () => Promise<void>;
  /** The clients' connections, for a failure message (Redis Cluster: each node connection). */
  readonly describe?: () => Promise<string>;
}

interface Target {
  readonly name: string;
  readonly what: string;
  deploy(): Promise<Deployment>;
}

async function proxyTo(url: string): Promise<TcpProxy> {
  const u = new URL(url);
  return TcpProxy.start(u.hostname === 'localhost' ? '127.0.0.1' : u.hostname, Number(u.port));
}

/** N clients of one server kind, each through its own proxy; the first one is faulted. */
function simple(kind: FaultStoreKind, url: () => Promise<{ url: string; server?: PrivateServer }>) {
  return async (): Promise<Deployment> => {
    const { url: target, server } = await url();
    const namespace = faultNamespace('part');
    const proxies: TcpProxy[] = [];
    const stores: RowStore[] = [];
    try {
      for (let i = 0; i < 3; i++) {
        const proxy = await proxyTo(target);
        proxies.push(proxy);
        stores.push(await openStore(kind, { url: proxy.url(target) }, namespace));
      }
    } catch (error) {
      await Promise.all(proxies.map((p) => p.cut()));
      await server?.destroy();
      throw error;
    }
    return {
      stores,
      victims: [proxies[0]!],
      faultedClient: 0,
      cleanup: async () => {
        await Promise.all(proxies.map((p) => p.restore()));
        await dropStore(stores[0]!);
        await Promise.all(stores.slice(1).map((s) => s.close().catch(() => undefined)));
        await Promise.all(proxies.map((p) => p.cut()));
        await server?.destroy();
      },
    };
  };
}

const TARGETS: readonly Target[] = [
  {
    name: 'PostgreSQL',
    what: 'one client cut off from the server',
    deploy: simple('postgres', async () => ({ url: await postgresUrl() })),
  },
  {
    name: 'MariaDB',
    what: 'one client cut off from the server',
    deploy: simple('mariadb', async () => ({ url: await assertMySqlReachable() })),
  },
  {
    name: 'Redis',
    what: 'one client cut off from the server',
    deploy: simple('redis', async () => ({ url: defaultRedisUrl() })),
  },
  {
    name: 'DynamoDB Local',
    what: 'one client cut off from the endpoint',
    deploy: simple('dynamodb', async () => {
      const server = await startPrivateDynamoDb(false);
      return { url: server.url, server };
    }),
  },
  {
    name: 'Redis Cluster',
    what: 'one of 3 masters unreachable from every client while the others answer',
    async deploy() {
      const cluster = await startPrivateRedisCluster(3);
      const namespace = faultNamespace('part');
      // Every client reaches every master through a proxy of its own: the client follows
      // CLUSTER SLOTS addresses, mapped to its proxies (ioredis natMap).
      const proxies: TcpProxy[][] = [];
      const stores: RowStore[] = [];
      try {
        for (let i = 0; i < 3; i++) {
          const own = await Promise.all(cluster.nodes.map((n) => TcpProxy.start(n.host, n.port)));
          proxies.push(own);
          const natMap = Object.fromEntries(
            cluster.nodes.map((n, j) => [`${n.host}:${n.port}`, { host: '127.0.0.1', port: own[j]!.port }]),
          );
          stores.push(
            await openStore(
              'redis-cluster',
              { url: '', nodes: own.map((p) => ({ host: '127.0.0.1', port: p.port })), natMap },
              namespace,
            ),
          );
        }
      } catch (error) {
        await Promise.all(proxies.flat().map((p) => p.cut()));
        await cluster.destroy();
        throw error;
      }
      return {
        stores,
        victims: proxies.map((own) => own[1]!),
        faultedClient: 0,
        describe: async () => {
          const clients = stores.map((s, i) => `client ${i}: ${describeClusterClient(s)}`);
          const nodes = await Promise.all(cluster.nodes.map((n) => clusterState(n.port)));
          return [
            ...clients,
            ...proxies.flatMap((own, i) => own.map((p, j) => `client ${i} to master ${j}: ${p.describe()}`)),
            ...nodes.map((info, i) => `master ${i} (port ${cluster.nodes[i]!.port}): ${info}`),
          ].join('\n');
        },
        cleanup: async () => {
          await Promise.all(proxies.flat().map((p) => p.restore()));
          await dropStore(stores[0]!);
          await Promise.all(stores.slice(1).map((s) => s.close().catch(() => undefined)));
          await Promise.all(proxies.flat().map((p) => p.cut()));
          await cluster.destroy();
        },
      };
    },
  },
  {
    name: 'a composite store (PostgreSQL + Redis)',
    what: 'its PostgreSQL member cut off from one client',
    async deploy() {
      const pgTarget = await postgresUrl();
      const redisTarget = defaultRedisUrl();
      const pgNamespace = faultNamespace('part');
      const redisNamespace = faultNamespace('part');
      const proxies: TcpProxy[] = [];
      const stores: RowStore[] = [];
      const pgProxies: TcpProxy[] = [];
      for (let i = 0; i < 3; i++) {
        const [pgProxy, redisProxy] = await Promise.all([proxyTo(pgTarget), proxyTo(redisTarget)]);
        proxies.push(pgProxy, redisProxy);
        pgProxies.push(pgProxy);
        const pg = await openStore('postgres', { url: pgProxy.url(pgTarget) }, pgNamespace);
        const redis = await openStore('redis', { url: redisProxy.url(redisTarget) }, redisNamespace);
        stores.push(compositeOf(pg, redis));
      }
      return {
        stores,
        victims: [pgProxies[0]!],
        faultedClient: 0,
        cleanup: async () => {
          await Promise.all(proxies.map((p) => p.restore()));
          await dropStore(stores[0]!);
          await Promise.all(stores.slice(1).map((s) => s.close().catch(() => undefined)));
          await Promise.all(proxies.map((p) => p.cut()));
        },
      };
    },
  },
];

/** CLUSTER INFO of one master, straight from it (not through a test proxy), on one line. */
async function clusterState(port: number): Promise<string> {
  return clusterInfo(port).then(
    (info) =>
      info
        .split('\n')
        .filter((l) => /^cluster_(state|slots_ok|slots_pfail|slots_fail|known_nodes)/.test(l))
        .map((l) => l.trim())
        .join(', '),
    (error: unknown) => `unreachable (${error instanceof Error ? error.message : String(error)})`,
  );
}

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

async function inject(victims: readonly TcpProxy[], kind: FaultKind): Promise<void> {
  for (const proxy of victims) {
    if (kind === 'reset') await proxy.cut();
    else if (kind === 'refuse') await proxy.refuse();
    else proxy.dropNextReplies(HOLD_MS / 2);
  }
}

describe('partitions at prewrite, at the commit point and at the secondaries, on every store', () => {
  for (const target of TARGETS) {
    it(`${target.name} (${target.what}): reset, refuse and drop-reply at 3 commit steps, no anomaly, no acknowledged commit lost, rows writable within lockTtlMs + 1 s`, async () => {
      const started = Date.now();
      const d = await target.deploy();
      cleanups.push(d.cleanup);
      // The fault armed next, fired by the faulted client's next transaction reaching its step.
      let armed: { kind: FaultKind; point: (typeof POINTS)[number]; fired: () => void } | undefined;
      const clients = d.stores.map(
        (store, i) =>
          new Percolator({
            store,
            lockTtlMs: LOCK_TTL_MS,
            lockWaitMs: LOCK_TTL_MS,
            ...(i === d.faultedClient
              ? {
                  onePhaseMaxRows: 1, // two phases: the faults are aimed at their steps
                  hooks: {
                    onCommitStep: async (e: CommitStepEvent) => {
                      const fault = armed;
                      if (!fault?.point.matches(e)) return;
                      armed = undefined;
                      await inject(d.victims, fault.kind);
                      fault.fired();
                    },
                  },
                }
              : {}),
          }),
      );
      cleanups.push(async () => {
        await Promise.all(clients.map((c) => c.close().catch(() => undefined)));
      });
      const workload = new FaultWorkload(
        clients.map((db) => ({ db })),
        11,
      );
      await workload.setUp(clients[1]!);
      workload.start();
      let faults = 0;
      // When each fault fired and healed, and when commits resumed (seconds from the start):
      // a slow run's log shows which phase took the time.
      const timeline: string[] = [];
      const at = () => ((Date.now() - started) / 1000).toFixed(1);
      try {
        for (const point of POINTS) {
          for (const kind of KINDS) {
            // The faulted client itself must work again (after the last heal) before its
            // next fault is armed: under load its driver may take a while to reconnect.
            await workload.waitForAcks(5, 60_000, `${target.name} before ${kind} at ${point.name}`);
            await workload.waitForAcks(
              1,
              60_000,
              `${target.name}'s faulted client before ${kind} at ${point.name}`,
              d.faultedClient,
            );
            await new Promise<void>((fired, reject) => {
              const timer = setTimeout(
                () =>
                  reject(
                    new Error(
                      `${kind} at ${point.name} never fired: the faulted client reached no such step`,
                    ),
                  ),
                60_000,
              );
              armed = {
                kind,
                point,
                fired: () => {
                  clearTimeout(timer);
                  fired();
                },
              };
            });
            faults++;
            timeline.push(`${kind}@${point.name} ${at()}`);
            await sleep(HOLD_MS);
            await Promise.all(d.victims.map((p) => p.restore()));
            timeline.push(`healed ${at()}`);
          }
        }
        // Every client commits again after the last heal.
        await workload.waitForAcks(10, 60_000, `${target.name} after the last heal`);
        timeline.push(`resumed ${at()}`);
      } finally {
        armed = undefined;
        await workload.stop();
      }
      const verdict = await workload
        .verify({ store: d.stores[1]!, lockTtlMs: LOCK_TTL_MS })
        .catch(async (error) => {
          // A stuck connection says which one, and how (Redis Cluster's node connections).
          (error as Error).message +=
            `\ntimeline: ${timeline.join(', ')}; verify from ${at()}\nerrors: ${workload.topErrors()}`;
          if (d.describe)
            (error as Error).message += `\n${await d.describe().catch((e: unknown) => String(e))}`;
          throw error;
        });
      console.info(
        `[partition] ${target.name}: ${faults} faults; ${summary(verdict)}; errors ${JSON.stringify(verdict.stats.errors)}; ${((Date.now() - started) / 1000).toFixed(1)} s`,
      );
      console.info(
        `[partition] ${target.name} timeline: ${timeline.join(', ')}; top errors: ${workload.topErrors()}`,
      );
      expect(faults).toBe(KINDS.length * POINTS.length);
      // The faults reached the clients: some store calls failed (not only conflicts).
      const storeErrors = Object.entries(verdict.stats.errors)
        .filter(([k]) => k.startsWith('StoreError') || k === 'CommitUnknownError')
        .reduce((n, [, v]) => n + v, 0);
      expect(storeErrors, JSON.stringify(verdict.stats.errors)).toBeGreaterThan(0);
      expect(clean(verdict), verdict.describe()).toBe(true);
    }, 300_000);
  }
});
