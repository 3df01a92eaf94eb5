import { MemoryStore, Percolator } from '@percolator/core';
import { describe, expect, it } from 'vitest';

describe('MemoryStore and the event loop', () => {
  it('lets timers fire and every client progress while 4 transact loops run for about 1 s', async () => {
    const store = new MemoryStore();
    const clients = [0, 1, 2, 3].map(() => new Percolator({ store }));
    let ticks = 0;
    const timer = setInterval(() => ticks++, 10);
    const counts = clients.map(() => 0);
    // Date.now, not a timer, ends the loops: a starved event loop must not hang the test.
    const until = Date.now() + 1_000;
    try {
      await Promise.all(
        clients.map(async (db, c) => {
          while (Date.now() < until) {
            await db.transact(async (tx) => {
              const n = Number((await tx.getString('yield', `client${c}`, 'n')) ?? '0');
              tx.set('yield', `client${c}`, 'n', String(n + 1));
            });
            counts[c]!++;
          }
        }),
      );
    } finally {
      clearInterval(timer);
    }
    // Loose on purpose: no timing asserts, only that nobody was starved.
    expect(ticks, `timer ticks (clients: ${counts.join(' / ')})`).toBeGreaterThan(10);
    const most = Math.max(...counts);
    for (const count of counts) {
      expect(count, `client counts ${counts.join(' / ')}`).toBeGreaterThan(0);
      expect(count, `client counts ${counts.join(' / ')}`).toBeGreaterThanOrEqual(most / 10);
    }
    // Every committed increment is there.
    const stored = await clients[0]!.transact(async (tx) => {
      return Promise.all(clients.map((_, c) => tx.getString('yield', `client${c}`, 'n')));
    });
    expect(stored.map(Number)).toEqual(counts);
    await Promise.all(clients.map((db) => db.close()));
  });
});
