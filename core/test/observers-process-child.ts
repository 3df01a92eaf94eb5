// One observer worker in its own process (spawned by observers-processes.test.ts through
// vite-node, so it runs the TypeScript sources). Protocol on stdio, one JSON per line:
// it prints {"ready":true} once its worker runs in the background, drains when it reads
// "drain", then prints {"done":true, stats, runs} and exits. Each handler run is reported
// as {"run":[row, startMs, endMs]} so the parent can check no row ran in two places at once.
import { createInterface } from 'node:readline';
import { Percolator } from '@percolator/core';
import { createRedisStore } from '@percolator/redis';

const [namespace, table] = process.argv.slice(2) as [string, string];
const store = await createRedisStore({ namespace });
const db = new Percolator({ store });
const worker = db.worker({
  observers: [
    {
      name: 'copy',
      table,
      column: 'in',
      handler: async (tx, { row }) => {
        const start = Date.now();
        const value = await tx.getString(table, row, 'in');
        await new Promise((r) => setTimeout(r, 5));
        tx.set(table, row, 'out', value ?? '');
        console.log(JSON.stringify({ run: [row, start, Date.now()] }));
      },
    },
  ],
  concurrency: 2,
  idlePollMs: 20,
  onError: () => undefined,
});
worker.start();
console.log(JSON.stringify({ ready: true }));
for await (const line of createInterface({ input: process.stdin })) {
  if (line.trim() !== 'drain') continue;
  await worker.runUntilIdle({ timeoutMs: 60_000 });
  await worker.stop();
  console.log(JSON.stringify({ done: true, stats: worker.stats }));
  break;
}
await db.close();
await store.close();
process.exit(0);
