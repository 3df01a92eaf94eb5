import { Percolator, type Transaction } from '@percolator/core';
import type { Cluster } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRedisStore } from '../src/index.js';
import { rowKeyName } from '../src/keys.js';
import type { RedisStore } from '../src/store.js';
import { assertClusterReachable, connectCluster, uniqueNamespace } from './helpers.js';

/**
 * Cross-slot transactions on a real 3-master Redis Cluster: money moves between accounts
 * whose rows live on different masters, from several clients at once (each with its own
 * Cluster connection, like separate processes). Snapshot reads must always see the same
 * total, and the end state must add up.
 */
const CLIENTS = 4;
const ACCOUNTS = 9;
const START_BALANCE = 100;
const TRANSFERS_PER_CLIENT = 20;
const TABLE = 'bank';
const COLUMN = 'balance';

const clients: Cluster[] = [];
const stores: RedisStore[] = [];

beforeAll(async () => {
  await assertClusterReachable();
});

afterAll(async () => {
  await stores[0]?.dropNamespace().catch(() => {});
  for (const s of stores) await s.close();
  for (const c of clients) await c.quit();
});

const accountKey = (i: number) => `acct-${i}`;

async function balances(tx: Transaction): Promise<number[]> {
  const values = await Promise.all(
    Array.from({ length: ACCOUNTS }, (_, i) => tx.getString(TABLE, accountKey(i), COLUMN)),
  );
  return values.map((v) => Number(v));
}

describe('cluster: cross-slot transfers with snapshot isolation', () => {
  it('keeps the total under concurrent transfers and every snapshot read sees it', async () => {
    const namespace = uniqueNamespace('bank');
    for (let i = 0; i < CLIENTS + 1; i++) {
      const client = await connectCluster();
      clients.push(client);
      stores.push(await createRedisStore({ client, namespace }));
    }
    const dbs = stores.map((store) => new Percolator({ store, lockTtlMs: 3000 }));

    // The accounts really are spread over every master.
    const slotOwners = new Set<string>();
    const slots = (await clients[0]!.cluster('SLOTS')) as unknown as [number, number, [string, number]][];
    for (let i = 0; i < ACCOUNTS; i++) {
      const slot = (await clients[0]!.cluster(
        'KEYSLOT',
        rowKeyName(namespace, TABLE, accountKey(i)),
      )) as number;
      const [, , [host, port]] = slots.find(([lo, hi]) => slot >= lo && slot <= hi)!;
      slotOwners.add(`${host}:${port}`);
    }
    expect(slotOwners.size).toBe(3);

    // One transaction creates every account, across all masters, atomically.
    await dbs[0]!.transact(async (tx) => {
      for (let i = 0; i < ACCOUNTS; i++) tx.set(TABLE, accountKey(i), COLUMN, String(START_BALANCE));
    });
    const total = ACCOUNTS * START_BALANCE;

    let seed = 12345;
    const random = (n: number) => {
      seed = (seed * 1103515245 + 12345) % 2 ** 31;
      return seed % n;
    };
    let committed = 0;
    const writers = dbs.slice(0, CLIENTS).map(async (db) => {
      for (let t = 0; t < TRANSFERS_PER_CLIENT; t++) {
        const from = random(ACCOUNTS);
        const to = (from + 1 + random(ACCOUNTS - 1)) % ACCOUNTS;
        const wanted = 1 + random(30);
        await db.transact(
          async (tx) => {
            const a = Number(await tx.getString(TABLE, accountKey(from), COLUMN));
            const b = Number(await tx.getString(TABLE, accountKey(to), COLUMN));
            const amount = Math.min(a, wanted);
            tx.set(TABLE, accountKey(from), COLUMN, String(a - amount));
            tx.set(TABLE, accountKey(to), COLUMN, String(b + amount));
          },
          { maxAttempts: 100 },
        );
        committed++;
      }
    });

    // A reader takes snapshots while the writers run: point reads and a scan.
    let done = false;
    const snapshots: number[] = [];
    const reader = (async () => {
      const db = dbs[CLIENTS]!;
      while (!done) {
        await db.transact(
          async (tx) => {
            const point = await balances(tx);
            expect(point.every((b) => Number.isInteger(b) && b >= 0)).toBe(true);
            snapshots.push(point.reduce((x, y) => x + y, 0));
            let scanned = 0;
            let rows = 0;
            for await (const row of tx.scan(TABLE)) {
              scanned += Number(new TextDecoder().decode(row.columns.get(COLUMN)));
              rows++;
            }
            expect(rows).toBe(ACCOUNTS);
            snapshots.push(scanned);
          },
          { maxAttempts: 100 },
        );
      }
    })();

    try {
      await Promise.all(writers);
    } finally {
      done = true;
      await reader;
    }

    expect(committed).toBe(CLIENTS * TRANSFERS_PER_CLIENT);
    expect(snapshots.length).toBeGreaterThan(2);
    expect(snapshots.every((sum) => sum === total)).toBe(true);
    const final = await dbs[0]!.transact((tx) => balances(tx));
    expect(final.reduce((x, y) => x + y, 0)).toBe(total);
    expect(final.every((b) => b >= 0)).toBe(true);
    // Money did move.
    expect(final.some((b) => b !== START_BALANCE)).toBe(true);
    for (const db of dbs) await db.close();
  });
});
