// Three transfers on one store, shared by the runnable example (opentelemetry.mjs) and its
// test (opentelemetry/test/spans.test.ts): one that commits, one that conflicts and is
// retried, and one that waits on a lock a crashed client left behind. Each runs inside a
// span of its own ("transfer: ..."), so the library's spans nest under it.
import { ClientCrash, Percolator } from '@percolator/core';

/** Lock time-to-live of every client here: short, so the third transfer's wait is short too. */
export const LOCK_TTL_MS = 300;

const balance = async (tx, name) => Number(await tx.getString('accounts', name, 'balance'));

/**
 * `db` is the instrumented client (its `onEvent` is the telemetry listener); the
 * clients that get in its way are created here, uninstrumented, on the same store.
 */
export async function runTransfers({ store, db, tracer }) {
  const other = new Percolator({ store, lockTtlMs: LOCK_TTL_MS });
  await other.transact(async (tx) => {
    tx.set('accounts', 'alice', 'balance', '100');
    tx.set('accounts', 'bob', 'balance', '100');
  });
  const traced = (name, fn) => tracer.startActiveSpan(name, (span) => fn().finally(() => span.end()));

  // 1. A transfer that commits.
  await traced('transfer: commits', () =>
    db.transact(async (tx) => {
      tx.set('accounts', 'alice', 'balance', String((await balance(tx, 'alice')) - 10));
      tx.set('accounts', 'bob', 'balance', String((await balance(tx, 'bob')) + 10));
    }),
  );

  // 2. A transfer that conflicts: another client writes alice after our snapshot, so our
  //    prewrite fails; db.transact rolls back and runs the function again.
  let attempts = 0;
  await traced('transfer: conflicts and retries', () =>
    db.transact(async (tx) => {
      const from = await balance(tx, 'alice');
      if (++attempts === 1) {
        await other.transact(async (o) => o.set('accounts', 'alice', 'balance', String(from + 1)));
      }
      tx.set('accounts', 'alice', 'balance', String(from - 10));
      tx.set('accounts', 'bob', 'balance', String((await balance(tx, 'bob')) + 10));
    }),
  );

  // 3. A transfer that waits on a lock: a client crashes after its prewrites (before its
  //    commit point), leaving locks on alice and bob. Our read waits until the lock's
  //    time-to-live is over, then rolls that transaction back and goes on.
  const crashing = new Percolator({
    store,
    lockTtlMs: LOCK_TTL_MS,
    onePhaseMaxRows: 1, // two phases, so there is a prewrite to stop after
    hooks: {
      onCommitStep: (e) => {
        if (e.step === 'beforeCommitPrimary') throw new ClientCrash();
      },
    },
  });
  const stuck = await crashing.begin();
  stuck.set('accounts', 'alice', 'balance', '0');
  stuck.set('accounts', 'bob', 'balance', '0');
  await stuck.commit().catch((error) => {
    if (!(error instanceof ClientCrash)) throw error;
  });
  await traced('transfer: waits on a lock', () =>
    db.transact(async (tx) => {
      tx.set('accounts', 'alice', 'balance', String((await balance(tx, 'alice')) - 10));
      tx.set('accounts', 'bob', 'balance', String((await balance(tx, 'bob')) + 10));
    }),
  );

  await db.flush(); // the secondaries are committed in the background
  const balances = await other.transact(async (tx) => [await balance(tx, 'alice'), await balance(tx, 'bob')]);
  await crashing.close();
  await other.close();
  return { balances, stuckStartTs: stuck.startTs };
}
