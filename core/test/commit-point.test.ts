import { describe, expect, it } from 'vitest';
import {
  type CasRequest,
  CommitUnknownError,
  MemoryStore,
  Percolator,
  RowTooLargeError,
  StoreError,
} from '../src/index.js';

/** A promise and the function that resolves it. */
function gate(): { promise: Promise<void>; open: () => void } {
  let open!: () => void;
  const promise = new Promise<void>((resolve) => (open = resolve));
  return { promise, open };
}

describe('the commit point decides on the primary row as it is', () => {
  it('a heartbeat that read the primary before its lock landed, and heard back after, does not make the commit point see a rollback', async () => {
    // The prewrite batch is held until the heartbeat's read of the primary has run (so that
    // read sees no lock of ours); the read's reply is held until the prewrite has answered.
    const heartbeatRead = gate();
    const prewriteAnswered = gate();
    let prewrites = 0;
    let reads = 0;
    class Interleaving extends MemoryStore {
      override async checkAndSetMany(requests: readonly CasRequest[]) {
        if (prewrites++ === 0) {
          await heartbeatRead.promise;
          const results = await super.checkAndSetMany(requests);
          setTimeout(prewriteAnswered.open, 5);
          return results;
        }
        return super.checkAndSetMany(requests);
      }
      override async read(table: string, key: string) {
        const row = await super.read(table, key);
        if (prewrites === 1 && table === 't' && key === 'a' && reads++ === 0) {
          heartbeatRead.open();
          await prewriteAnswered.promise;
        }
        return row;
      }
    }
    const store = new Interleaving();
    const steps: string[] = [];
    const db = new Percolator({
      store,
      lockTtlMs: 30, // a beat every 10 ms
      onePhaseMaxRows: 1, // two phases: a prewrite, then the commit point
      groupCommit: false,
      onEvent: (e) => {
        if (e.type === 'commit.step') steps.push(`${e.step}${e.error ? ` ${(e.error as Error).name}` : ''}`);
      },
    });
    await db.transact(
      async (tx) => {
        tx.set('t', 'a', 'c', 'x');
        tx.set('t', 'b', 'c', 'y');
      },
      { maxAttempts: 1 },
    );
    expect(reads).toBeGreaterThan(0); // the beat did read the primary during the prewrite
    expect(steps.slice(0, 2)).toEqual(['prewrite', 'commitPrimary']);
    await db.flush();
    expect(
      await db.transact((tx) => Promise.all([tx.getString('t', 'a', 'c'), tx.getString('t', 'b', 'c')]), {
        readOnly: true,
      }),
    ).toEqual(['x', 'y']);
    await db.close();
  });

  it('a retry of the commit point refused as too large, after an attempt whose reply was lost, is an unknown outcome: no rollback, nothing half applied', async () => {
    // The first commit-point CAS is held by "the server" and answered as lost; it lands when
    // the client sends again, and that second send is refused as too large (nothing sent).
    // The first did land, so rolling back now would take the secondaries' locks from under a
    // committed primary.
    let held: (() => Promise<unknown>) | undefined;
    let attempts = 0;
    class LostThenRefused extends MemoryStore {
      override async checkAndSetStamped(
        request: CasRequest & { readonly state: Uint8Array },
        counter: string,
      ) {
        if (request.key === 'a') {
          attempts++;
          if (attempts === 1) {
            held = () => super.checkAndSetStamped(request, counter);
            throw new StoreError('the reply was lost', 'unknown');
          }
          if (attempts === 2) {
            await held!();
            throw new RowTooLargeError('refused as too large');
          }
        }
        return super.checkAndSetStamped(request, counter);
      }
    }
    const store = new LostThenRefused();
    const db = new Percolator({ store, onePhaseMaxRows: 1 });
    const outcome = db.transact(
      async (tx) => {
        tx.set('t', 'a', 'c', 'x');
        tx.set('t', 'b', 'c', 'y');
      },
      { maxAttempts: 1 },
    );
    await expect(outcome).rejects.toBeInstanceOf(CommitUnknownError);
    expect(attempts).toBe(2);
    await db.flush();
    // A reader settles the secondary's lock by the primary, which committed: all of it.
    const reader = new Percolator({ store });
    expect(
      await reader.transact((tx) => Promise.all([tx.getString('t', 'a', 'c'), tx.getString('t', 'b', 'c')]), {
        readOnly: true,
      }),
    ).toEqual(['x', 'y']);
    await reader.close();
    await db.close();
  });
});
