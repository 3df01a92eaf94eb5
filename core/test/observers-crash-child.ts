// A worker process that is killed mid-run (spawned by observers-crash.test.ts through
// vite-node). It takes the lease of the notified row and starts the observer run, then
// prints {"stuck":{pid, row, at, startTs?}} and blocks forever, for the parent to SIGKILL:
// - mode "handler": inside the handler, before anything is written;
// - mode "prewrite": after every prewrite of the run (its locks, the ack's among them, are
//   in the store), just before its commit point.
// - mode "committed": just after its commit point (the primary is committed, the other
//   row still locked), before the notification is cleared.
// Lease and lock expiry are short, so the survivor does not wait long once it is dead.
import { Percolator } from '@percolator/core';
import { createRedisStore } from '@percolator/redis';
import { crashObserver } from './observers-crash-observer.js';

const [namespace, table, mode, leaseMs] = process.argv.slice(2) as [string, string, string, string];
const store = await createRedisStore({ namespace });
const forever = new Promise<never>(() => undefined);
const stuck = (row: string, at: string, startTs?: number) =>
  console.log(JSON.stringify({ stuck: { pid: process.pid, row, at, startTs } }));

let running = '';
const db = new Percolator({
  store,
  lockTtlMs: Number(leaseMs),
  // The two-phase steps these hooks stop at (a one-step commit has none).
  onePhaseMaxRows: 1,
  hooks: {
    onCommitStep: async (e) => {
      const at: Record<string, string> = { prewrite: 'beforeCommitPrimary', committed: 'afterCommitPrimary' };
      if (e.step === at[mode]) {
        stuck(running, mode, e.startTs);
        await forever;
      }
    },
  },
});
const observer = crashObserver(table, async (row) => {
  running = row;
  if (mode === 'handler') {
    stuck(row, 'handler');
    await forever;
  }
});
const worker = db.worker({ observers: [observer], leaseMs: Number(leaseMs), onError: () => undefined });
await worker.runUntilIdle();
console.log(JSON.stringify({ unexpected: 'the run finished' }));
process.exit(1);
