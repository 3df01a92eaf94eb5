import {
  ClientCrash,
  CommitUnknownError,
  CompositeStore,
  LockNotResolvedError,
  Percolator,
  type StoredRow,
  StoreError,
} from '@percolator/core';
import { createDynamoDbStore, type DynamoDbRowStore } from '@percolator/dynamodb';
import type { PostgresStore } from '@percolator/postgres';
import { createRedisStore, type RedisStore } from '@percolator/redis';
import { type DynamoDbTarget, dynamoDbTarget } from '@percolator/testkit/dynamodb';
import { type PrivateServer as PrivateRedis, startPrivateRedis } from '@percolator/testkit/private';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { postgresPool, postgresStore, postgresUrl, uniqueNamespace } from './support/backends.js';
import { TcpProxy } from './support/tcp-proxy.js';

/**
 * One transaction writes a PostgreSQL row (accounts/alice: the primary, first in table
 * order), a Redis key (carts/c) and a DynamoDB item (wallets/w). One store becomes
 * unreachable in the middle of the commit, for real: Redis is killed (SIGKILL) and started
 * again from its append-only file; PostgreSQL and DynamoDB sit behind a loopback TCP
 * proxy that resets their connections and refuses new ones, or forwards a write and loses
 * its reply. The drivers and adapters see what they would see in production. Readers must
 * see all of the transaction or none of it, never part, and once the store is back they
 * settle it (roll forward or back).
 */
const ROWS = [
  ['accounts', 'alice'],
  ['carts', 'c'],
  ['wallets', 'w'],
] as const;

const pgUrl = await postgresUrl();
const pool = postgresPool(pgUrl);
let dynamo: DynamoDbTarget | undefined;
let redisServer: PrivateRedis | undefined;
const cleanups: Array<() => Promise<void>> = [];

beforeAll(async () => {
  [dynamo, redisServer] = await Promise.all([dynamoDbTarget(), startPrivateRedis()]);
});
afterAll(async () => {
  for (const cleanup of cleanups.reverse()) await cleanup().catch(() => undefined);
  await redisServer?.destroy();
  await dynamo?.stop();
  await pool.end();
});

function fakeClock() {
  let now = 1_700_000_000_000;
  const clock = () => now;
  clock.advance = (ms: number) => {
    now += ms;
  };
  return clock;
}

async function deploy() {
  if (!dynamo || !redisServer) throw new Error('DynamoDB Local or the private redis-server did not start');
  const target = new URL(pgUrl);
  const dynamoTarget = new URL(dynamo.endpoint);
  const [pgProxy, dynProxy] = await Promise.all([
    TcpProxy.start(target.hostname, Number(target.port || 5432)),
    TcpProxy.start(dynamoTarget.hostname, Number(dynamoTarget.port)),
  ]);
  const pgProxyPool = postgresPool(pgProxy.url(pgUrl), 4);
  const [pg, oracle, redis, dyn] = await Promise.all([
    postgresStore(pgProxyPool, 'out'),
    // The oracle in its own namespace, reached directly: these tests cut off the row
    // stores, not the oracle.
    postgresStore(pool, 'oracle'),
    createRedisStore({ url: redisServer.url, namespace: uniqueNamespace('out'), commandTimeoutMs: 2000 }),
    createDynamoDbStore({
      ...dynamo.storeOptions(uniqueNamespace('out')),
      endpoint: dynProxy.url(dynamo.endpoint),
    }),
  ]);
  const store = new CompositeStore({
    routes: [
      { table: 'accounts', store: pg },
      { table: 'carts', store: redis },
      { table: 'wallets', store: dyn },
    ],
    counterStore: oracle,
  });
  cleanups.push(async () => {
    await Promise.all([pgProxy.restore(), dynProxy.restore()]);
    await Promise.all([
      (pg as PostgresStore).dropNamespace(),
      (oracle as PostgresStore).dropNamespace(),
      (dyn as DynamoDbRowStore).dropNamespace(),
      (redis as RedisStore).dropNamespace().catch(() => undefined),
    ]);
    await store.close();
    await pgProxyPool.end();
    await Promise.all([pgProxy.cut(), dynProxy.cut()]);
  });
  const clock = fakeClock();
  const clients: Percolator[] = [];
  const client = (onCommitStep?: (e: { step: string; table?: string }) => void | Promise<void>) => {
    const db = new Percolator({
      store,
      clock,
      // Long enough that no heartbeat CAS runs during a test (the clock is fake: tests advance it).
      lockTtlMs: 30_000,
      lockWaitMs: 300,
      // Two phases with hooks: they stop at one of their steps.
      ...(onCommitStep ? { hooks: { onCommitStep }, onePhaseMaxRows: 1 } : {}),
    });
    clients.push(db);
    return db;
  };
  cleanups.push(async () => {
    await Promise.all(clients.map((c) => c.close()));
  });
  await client().transact(async (tx) => {
    for (const [t, r] of ROWS) tx.set(t, r, 'v', 'old');
  });
  return { pg, pgProxy, dyn, dynProxy, redis, store, clock, client };
}

/** What one snapshot sees of each row: its value, or 'error' when it could not be read. */
async function look(db: Percolator): Promise<string[]> {
  const tx = await db.begin();
  const seen: string[] = [];
  for (const [t, r] of ROWS) {
    try {
      seen.push((await tx.getString(t, r, 'v')) ?? 'absent');
    } catch (error) {
      if (!(error instanceof StoreError || error instanceof LockNotResolvedError)) throw error;
      seen.push('error');
    }
  }
  await tx.rollback();
  return seen;
}

/** Atomic visibility: the rows a reader could read all hold the old value, or all the new one. */
function expectAllOrNothing(seen: readonly string[]): void {
  const values = new Set(seen.filter((v) => v !== 'error'));
  expect(values.size, `a reader saw ${seen.join(', ')}: part of a transaction`).toBeLessThanOrEqual(1);
}

async function eventually<T>(what: string, fn: () => Promise<T>, done: (value: T) => boolean): Promise<T> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const value = await fn().catch((e: unknown) => e as T);
    if (done(value)) return value;
    if (Date.now() > deadline) throw new Error(`${what}: still ${String(value)} after 30 s`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('a store unreachable in the middle of a cross-store commit (PostgreSQL + Redis + DynamoDB)', () => {
  it('Redis killed after the commit point: its lock survives the restart, readers never see part, then roll it forward', async () => {
    const d = await deploy();
    let lockedCart: StoredRow | null = null;
    const writer = d.client(async (e) => {
      if (e.step === 'afterPrewrite') await sleep(40); // give the watching readers time
      if (e.step === 'afterPrewrite' && e.table === 'carts') lockedCart = await d.redis.read('carts', 'c');
      if (e.step === 'afterCommitPrimary') {
        await redisServer!.kill();
        await sleep(40);
      }
    });
    // Readers run all through the commit and the outage, checking every snapshot.
    const watcherDb = d.client();
    let watching = true;
    const snapshots: string[][] = [];
    const watcher = (async () => {
      while (watching) {
        const seen = await look(watcherDb);
        expectAllOrNothing(seen);
        snapshots.push(seen);
      }
    })();

    while (snapshots.length === 0) await sleep(10); // a reader saw the state before the commit
    const tx = await writer.begin();
    for (const [t, r] of ROWS) tx.set(t, r, 'v', 'new');
    await tx.commit(); // committed at the primary; the lost secondary is left to readers
    expect(lockedCart).not.toBeNull();

    const reader = d.client();
    for (let i = 0; i < 3; i++) expect(await look(reader)).toEqual(['new', 'error', 'new']);
    watching = false;
    await watcher;
    expect(snapshots.some((s) => s[0] === 'old')).toBe(true);
    expect(snapshots.some((s) => s[0] === 'new')).toBe(true);

    await redisServer!.restart();
    // The first thing back is the lock, exactly as it was left: nothing touched it meanwhile.
    const back = await eventually(
      'raw read of carts/c after the restart',
      () => d.redis.read('carts', 'c'),
      (row) => row !== null && !(row instanceof Error),
    );
    expect(back?.version).toBe((lockedCart as StoredRow | null)?.version);
    expect(await look(reader)).toEqual(['new', 'new', 'new']);
    expect((await d.redis.read('carts', 'c'))?.version).not.toBe(back?.version); // rolled forward
  });

  it('PostgreSQL (the primary) cut off before the commit point: the commit fails or is unknown, readers never see it', async () => {
    const d = await deploy();
    const writer = d.client((e) => {
      if (e.step === 'beforeCommitPrimary') return d.pgProxy.cut();
    });
    const reader = d.client();
    const tx = await writer.begin();
    for (const [t, r] of ROWS) tx.set(t, r, 'v', 'new');
    const error = await tx.commit().then(
      () => undefined,
      (e: unknown) => e,
    );
    // Refused before sending: StoreError 'no'. Reset with the commit request in flight: the
    // writer cannot know, so CommitUnknownError. Never a success, never a plain failure.
    if (error instanceof StoreError) expect(error.applied).toBe('no');
    else expect(error).toBeInstanceOf(CommitUnknownError);
    const seen = await look(reader);
    expectAllOrNothing(seen);
    // After a certain failure the writer removed its other locks; after an unknown one it
    // must leave them, so their rows cannot be read until the primary is reachable.
    expect(seen).toEqual(error instanceof StoreError ? ['error', 'old', 'old'] : ['error', 'error', 'error']);
    // Back, with the abandoned primary lock: once it expires, readers roll it back.
    await d.pgProxy.restore();
    d.clock.advance(60_000);
    expect(await look(reader)).toEqual(['old', 'old', 'old']);
  });

  it('PostgreSQL drops the reply of the commit CAS: unknown to the writer, all or nothing to readers', async () => {
    const d = await deploy();
    const writer = d.client((e) => {
      if (e.step === 'beforeCommitPrimary') d.pgProxy.dropNextReplies();
    });
    const reader = d.client();
    const tx = await writer.begin();
    for (const [t, r] of ROWS) tx.set(t, r, 'v', 'new');
    await expect(tx.commit()).rejects.toBeInstanceOf(CommitUnknownError);
    // Committed, but the other rows' locks point at a primary no one can reach: nothing is shown.
    for (let i = 0; i < 2; i++) expect(await look(reader)).toEqual(['error', 'error', 'error']);
    await d.pgProxy.restore();
    expect(await look(reader)).toEqual(['new', 'new', 'new']);
  });

  it('DynamoDB lost after its prewrite, and the client dies: readers roll everything back once it returns', async () => {
    const d = await deploy();
    let lockedWallet: StoredRow | null = null;
    const writer = d.client(async (e) => {
      if (e.step === 'afterPrewrite' && e.table === 'wallets') {
        lockedWallet = await d.dyn.read('wallets', 'w');
        await d.dynProxy.cut();
      }
      // The partition that cut DynamoDB off takes the client with it, before its commit point.
      if (e.step === 'beforeCommitPrimary') throw new ClientCrash();
    });
    const reader = d.client();
    const tx = await writer.begin();
    for (const [t, r] of ROWS) tx.set(t, r, 'v', 'new');
    await expect(tx.commit()).rejects.toBeInstanceOf(ClientCrash);
    d.clock.advance(60_000); // the abandoned locks expire
    const seen = await look(reader);
    expectAllOrNothing(seen);
    expect(seen).toEqual(['old', 'old', 'error']);
    // The lock is still in DynamoDB, untouched; once back, a reader rolls it back.
    await d.dynProxy.restore();
    expect((await d.dyn.read('wallets', 'w'))?.version).toBe((lockedWallet as StoredRow | null)?.version);
    expect(await look(reader)).toEqual(['old', 'old', 'old']);
    expect((await d.dyn.read('wallets', 'w'))?.version).not.toBe((lockedWallet as StoredRow | null)?.version);
  });
});
