// The main job on the embedded in-memory store: cross-row transactions, concurrently.
// Run with `pnpm main` (builds first). Swap MemoryStore for any adapter's store.
import { MemoryStore, Percolator } from '@percolator/core';

const store = new MemoryStore();
const clients = [new Percolator({ store }), new Percolator({ store }), new Percolator({ store })];
const db = clients[0];

const accounts = ['alice', 'bob', 'carol', 'dave'];
await db.transact(async (tx) => {
  for (const name of accounts) tx.set('accounts', name, 'balance', '100');
});

const balance = async (tx, name) => Number(await tx.getString('accounts', name, 'balance'));

// 210 transfers from three clients at once on four rows: conflicts are frequent on purpose,
// and retried automatically (with backoff). The default of 10 attempts suits ordinary
// contention; here every transfer races the other two clients for the same four rows, and
// on a busy machine the event loop runs late and the retries line up, so allow more.
let transfers = 0;
await Promise.all(
  clients.map(async (client, c) => {
    for (let i = 0; i < 70; i++) {
      const from = accounts[(i + c) % accounts.length];
      const to = accounts[(i * 7 + c + 1) % accounts.length];
      if (from === to) continue;
      await client.transact(
        async (tx) => {
          const amount = 1 + ((i * 13) % 10);
          tx.set('accounts', from, 'balance', String((await balance(tx, from)) - amount));
          tx.set('accounts', to, 'balance', String((await balance(tx, to)) + amount));
        },
        { maxAttempts: 100 },
      );
      transfers++;
    }
  }),
);

const snapshot = await db.transact(async (tx) => {
  const rows = [];
  for await (const { row, columns } of tx.scan('accounts')) {
    rows.push([row, Number(new TextDecoder().decode(columns.get('balance')))]);
  }
  return rows;
});
const total = snapshot.reduce((sum, [, b]) => sum + b, 0);
console.log(`${transfers} transfers committed across ${accounts.length} rows by ${clients.length} clients`);
console.table(Object.fromEntries(snapshot.map(([name, b]) => [name, { balance: b }])));
console.log(
  `total = ${total} (expected ${accounts.length * 100}): ${total === accounts.length * 100 ? 'OK' : 'BROKEN'}`,
);
await Promise.all(clients.map((c) => c.close()));
if (total !== accounts.length * 100) process.exit(1);
