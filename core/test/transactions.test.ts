import { spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import {
  ClosedError,
  CommitUnknownError,
  ConflictError,
  InvalidArgumentError,
  inspectHeadRow,
  MemoryStore,
  Percolator,
  type ScanRange,
  StoreError,
  type Transaction,
  UnsupportedOperationError,
} from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { InstrumentedStore, text } from './support.js';

const num = async (tx: Transaction, row: string) => Number(await tx.getString('acct', row, 'bal'));

describe('transactions on the memory store', () => {
  it('reads its own writes, commits atomically across rows and tables', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    const tx = await db.begin();
    expect(await tx.get('t', 'r', 'c')).toBeUndefined();
    tx.set('t', 'r', 'c', 'v1');
    tx.set('other', 'x', 'c', new Uint8Array([0, 1, 2]));
    expect(await tx.getString('t', 'r', 'c')).toBe('v1');
    const { commitTs } = await tx.commit();
    // Not below the snapshot; a peeked one (memory: peekedWrites) may equal it.
    expect(commitTs).toBeGreaterThanOrEqual(tx.startTs);
    const [a, b] = await db.transact(async (t) => [
      await t.getString('t', 'r', 'c'),
      await t.get('other', 'x', 'c'),
    ]);
    expect(a).toBe('v1');
    expect(b).toEqual(new Uint8Array([0, 1, 2]));
    await db.transact(async (t) => t.delete('t', 'r', 'c'));
    expect(await db.transact((t) => t.get('t', 'r', 'c'))).toBeUndefined();
  });

  it('does not let a finished transaction be used again', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    const tx = await db.begin();
    tx.set('t', 'r', 'c', 'v');
    await tx.commit();
    expect(() => tx.set('t', 'r', 'c', 'w')).toThrow(ClosedError);
    await expect(tx.get('t', 'r', 'c')).rejects.toBeInstanceOf(ClosedError);
  });

  it('get hands out a copy: changing it changes neither later reads nor the stored row (getString and getJson read without one)', async () => {
    const store = new MemoryStore();
    const db = new Percolator({ store });
    const value = 'x'.repeat(200); // past V8's on-heap size for typed arrays
    await db.transact(async (tx) => {
      tx.set('t', 'r', 'c', value);
      tx.setJson('t', 'r', 'j', { a: value });
    });
    await db.transact(async (tx) => {
      (await tx.get('t', 'r', 'c'))!.fill(0);
      expect(text(await tx.get('t', 'r', 'c'))).toBe(value);
      expect(await tx.getString('t', 'r', 'c')).toBe(value);
      expect(await tx.getJson('t', 'r', 'j')).toEqual({ a: value });
      // Another column of the same row: its commit starts from the row as this client has it.
      tx.set('t', 'r', 'other', 'y');
    });
    const other = new Percolator({ store });
    expect(await other.transact((tx) => tx.getString('t', 'r', 'c'))).toBe(value);
    expect(await db.transact((tx) => tx.getString('t', 'r', 'c'))).toBe(value);
    await db.transact(async (tx) => {
      tx.set('t', 'r', 'c', 'y');
      expect(await tx.getString('t', 'r', 'c')).toBe('y'); // a buffered write, read back as written
    });
    expect(await other.transact((tx) => tx.getString('t', 'r', 'c'))).toBe('y');
    await db.close();
    await other.close();
  });

  it('a snapshot does not see writes committed after it started (no read skew)', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    await db.transact(async (tx) => {
      tx.set('acct', 'x', 'bal', '50');
      tx.set('acct', 'y', 'bal', '50');
    });
    const reader = await db.begin();
    expect(await num(reader, 'x')).toBe(50);
    await db.transact(async (tx) => {
      tx.set('acct', 'x', 'bal', String((await num(tx, 'x')) - 10));
      tx.set('acct', 'y', 'bal', String((await num(tx, 'y')) + 10));
    });
    expect(await num(reader, 'y')).toBe(50); // 60 would be read skew
    expect(await num(reader, 'x')).toBe(50);
  });

  it('uncommitted and rolled-back writes are never visible (no aborted or intermediate reads)', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    await db.transact(async (tx) => tx.set('t', 'r', 'c', 'committed'));
    const writer = await db.begin();
    writer.set('t', 'r', 'c', 'intermediate');
    writer.set('t', 'r', 'c', 'final-but-aborted');
    await writer.rollback();
    await expect(db.transact(async () => Promise.reject(new Error('user failure')))).rejects.toThrow(
      'user failure',
    );
    expect(await db.transact((tx) => tx.getString('t', 'r', 'c'))).toBe('committed');
  });

  it('prevents lost updates: concurrent increments from many clients all count', async () => {
    const store = new MemoryStore();
    const clients = Array.from({ length: 5 }, () => new Percolator({ store }));
    await clients[0]!.transact(async (tx) => tx.set('acct', 'counter', 'bal', '0'));
    await Promise.all(
      clients.map(async (db) => {
        for (let i = 0; i < 20; i++) {
          await db.transact(
            async (tx) => tx.set('acct', 'counter', 'bal', String((await num(tx, 'counter')) + 1)),
            {
              maxAttempts: 200,
            },
          );
        }
      }),
    );
    expect(await clients[0]!.transact((tx) => num(tx, 'counter'))).toBe(100);
  });

  it('two transactions writing the same cell concurrently: exactly one commits', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    const a = await db.begin();
    const b = await db.begin();
    a.set('t', 'r', 'c', 'a');
    b.set('t', 'r', 'c', 'b');
    const results = await Promise.allSettled([a.commit(), b.commit()]);
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    const failure = results.find((r) => r.status === 'rejected') as PromiseRejectedResult;
    expect(failure.reason).toBeInstanceOf(ConflictError);
  });

  it('allows write skew (snapshot isolation), and a written guard cell prevents it', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    const setup = async () =>
      db.transact(async (tx) => {
        tx.set('oncall', 'alice', 'on', '1');
        tx.set('oncall', 'bob', 'on', '1');
      });
    const goOffCall = async (tx: Transaction, me: string, guard: boolean) => {
      const onCall =
        Number(await tx.getString('oncall', 'alice', 'on')) +
        Number(await tx.getString('oncall', 'bob', 'on'));
      if (onCall < 2) throw new Error('someone must stay on call');
      tx.set('oncall', me, 'on', '0');
      if (guard) tx.set('oncall', 'guard', 'version', String(tx.startTs)); // both write it: they conflict
    };
    await setup();
    const t1 = await db.begin();
    const t2 = await db.begin();
    await goOffCall(t1, 'alice', false);
    await goOffCall(t2, 'bob', false);
    await t1.commit();
    await t2.commit(); // write skew: both commit, nobody is on call
    expect(
      await db.transact(async (tx) => [
        await tx.getString('oncall', 'alice', 'on'),
        await tx.getString('oncall', 'bob', 'on'),
      ]),
    ).toEqual(['0', '0']);

    await setup();
    const g1 = await db.begin();
    const g2 = await db.begin();
    await goOffCall(g1, 'alice', true);
    await goOffCall(g2, 'bob', true);
    await g1.commit();
    await expect(g2.commit()).rejects.toBeInstanceOf(ConflictError);
  });

  it('keeps the total of concurrent transfers constant in every concurrent snapshot', async () => {
    const store = new MemoryStore();
    const accounts = Array.from({ length: 12 }, (_, i) => `a${i}`);
    const clients = Array.from({ length: 6 }, () => new Percolator({ store }));
    await clients[0]!.transact(async (tx) => {
      for (const a of accounts) tx.set('acct', a, 'bal', '100');
    });
    let seed = 7;
    const rand = (n: number) => {
      seed = (seed * 1103515245 + 12345) % 2 ** 31;
      return seed % n;
    };
    let done = false;
    const snapshots: number[] = [];
    const readers = clients.slice(0, 2).map(async (db, i) => {
      while (!done) {
        const total = await db.transact(async (tx) => {
          let sum = 0;
          if (i === 0) for (const a of accounts) sum += await num(tx, a);
          else for await (const r of tx.scan('acct')) sum += Number(text(r.columns.get('bal')));
          return sum;
        });
        snapshots.push(total);
        // The memory store answers in microtasks: yield so writers' backoff timers can fire.
        await new Promise((resolve) => setImmediate(resolve));
      }
    });
    await Promise.all(
      clients.map(async (db) => {
        for (let i = 0; i < 50; i++) {
          const from = accounts[rand(accounts.length)]!;
          let to = accounts[rand(accounts.length)]!;
          if (to === from) to = accounts[(accounts.indexOf(from) + 1) % accounts.length]!;
          const amount = 1 + rand(20);
          await db.transact(
            async (tx) => {
              tx.set('acct', from, 'bal', String((await num(tx, from)) - amount));
              tx.set('acct', to, 'bal', String((await num(tx, to)) + amount));
            },
            { maxAttempts: 100 },
          );
          await new Promise((resolve) => setImmediate(resolve));
        }
      }),
    );
    done = true;
    await Promise.all(readers);
    expect(snapshots.length).toBeGreaterThan(5);
    expect(new Set(snapshots)).toEqual(new Set([1200]));
    expect(
      await clients[0]!.transact(async (tx) => {
        let sum = 0;
        for (const a of accounts) sum += await num(tx, a);
        return sum;
      }),
    ).toBe(1200);
  });

  it('transact reruns the whole function with a new start timestamp on conflict', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    await db.transact(async (tx) => tx.set('t', 'r', 'c', '0'));
    const starts: number[] = [];
    const result = await db.transact(async (tx) => {
      const v = Number(await tx.getString('t', 'r', 'c'));
      starts.push(tx.startTs); // drawn with the first read
      if (starts.length === 1) await db.transact(async (other) => other.set('t', 'r', 'c', '10')); // conflicting commit
      tx.set('t', 'r', 'c', String(v + 1));
      return v + 1;
    });
    expect(starts).toHaveLength(2);
    expect(starts[1]!).toBeGreaterThan(starts[0]!);
    expect(result).toBe(11); // re-read, not re-applied from the first run's buffer
    expect(await db.transact((tx) => tx.getString('t', 'r', 'c'))).toBe('11');
  });

  it('transact gives up with ConflictError after maxAttempts', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    let runs = 0;
    await expect(
      db.transact(
        async (tx) => {
          runs++;
          await tx.get('t', 'r', 'c');
          await db.transact(async (other) => other.set('t', 'r', 'c', String(runs)));
          tx.set('t', 'r', 'c', 'mine');
        },
        { maxAttempts: 3 },
      ),
    ).rejects.toBeInstanceOf(ConflictError);
    expect(runs).toBe(3);
  });

  it('a ConflictError is an outcome: no stack frames, its message names the row, the limit restored', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    const limit = Error.stackTraceLimit;
    const tx = await db.begin();
    await tx.get('t', 'r', 'c');
    await db.transact(async (other) => other.set('t', 'r', 'c', 'theirs'));
    tx.set('t', 'r', 'c', 'mine');
    const failure = await tx.commit().catch((error: unknown) => error);
    expect(failure).toBeInstanceOf(ConflictError);
    const conflict = failure as ConflictError;
    expect(conflict.message).toBe('write conflict on t/r/c');
    expect(conflict.stack).toBe(`ConflictError: ${conflict.message}`);
    expect(conflict.retryable).toBe(true);
    expect(conflict.code).toBe('CONFLICT');
    expect(Error.stackTraceLimit).toBe(limit);
    // Every other error keeps its frames.
    expect(new StoreError('down', 'no').stack).toMatch(/\n\s+at /);
    expect(new ConflictError('x', { cause: conflict }).cause).toBe(conflict);
  });

  it('where Error is frozen (node --frozen-intrinsics), a ConflictError keeps its stack instead of throwing', () => {
    // The built package (`pnpm test` builds first): a child process, since freezing is per process.
    const core = pathToFileURL(join(dirname(fileURLToPath(import.meta.url)), '..', 'dist', 'index.js')).href;
    const code = [
      `const { ConflictError } = await import(${JSON.stringify(core)});`,
      `const e = new ConflictError('write conflict on t/"r"/c');`,
      'console.log(JSON.stringify({ name: e.name, retryable: e.retryable, frames: /\\n\\s+at /.test(e.stack) }));',
    ].join('\n');
    const child = spawnSync(process.execPath, ['--frozen-intrinsics', '--input-type=module', '-e', code], {
      encoding: 'utf8',
    });
    expect(child.status, child.stderr).toBe(0);
    expect(JSON.parse(child.stdout.trim())).toEqual({ name: 'ConflictError', retryable: true, frames: true });
  });

  it('rethrows a user error unchanged and never retries it', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    const mine = new TypeError('mine');
    let runs = 0;
    const failure = await db
      .transact(async (tx) => {
        runs++;
        tx.set('t', 'r', 'c', 'never');
        throw mine;
      })
      .catch((e: unknown) => e);
    expect(failure).toBe(mine);
    expect(runs).toBe(1);
    expect(await db.transact((tx) => tx.get('t', 'r', 'c'))).toBeUndefined();
  });

  it('a function whose own commit ended unknown (it landed) and then throws a retryable error is not run again', async () => {
    const store = new InstrumentedStore();
    const db = new Percolator({ store });
    let armed = false;
    // The commit's write lands and its reply is lost; the re-reads that would settle it fail.
    store.casFault = (r) => (armed && r.key === 'a' ? 'fail-after' : undefined);
    store.readFault = (_t, key) => armed && key === 'a';
    let runs = 0;
    const later = new ConflictError('a later step of the function conflicted');
    const failure = await db
      .transact(
        async (tx) => {
          runs++;
          const n = Number((await tx.getString('t', 'a', 'n')) ?? '0');
          tx.set('t', 'a', 'n', String(n + 1));
          armed = runs === 1;
          try {
            await tx.commit();
          } catch (error) {
            expect(error).toBeInstanceOf(CommitUnknownError);
            armed = false;
            throw later;
          }
          return n + 1;
        },
        { maxAttempts: 3 },
      )
      .catch((e: unknown) => e);
    expect(failure).toBe(later);
    expect(runs).toBe(1);
    // One increment, as the function meant: run again, it would have committed a second.
    expect(await db.transact((tx) => tx.getString('t', 'a', 'n'))).toBe('1');
    await db.close();
  });

  it('a function that starts its own commit, does not await it and throws: transact settles only after that commit', async () => {
    const store = new InstrumentedStore();
    const db = new Percolator({ store });
    const release = store.gate('t', 'a');
    const mine = new Error('thrown while the commit runs');
    let settled = false;
    const done = db
      .transact(async (tx) => {
        tx.set('t', 'a', 'c', 'landed');
        void tx.commit();
        throw mine;
      })
      .catch((e: unknown) => e)
      .finally(() => {
        settled = true;
      });
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(settled).toBe(false);
    release();
    expect(await done).toBe(mine);
    expect(await db.transact((tx) => tx.getString('t', 'a', 'c'))).toBe('landed');
    // Its commit refused (a conflict) is handled: the function's error comes back, and no
    // rejection is left unhandled (vitest fails the file on one).
    const first = await db.begin();
    await first.getString('t', 'a', 'c');
    first.set('t', 'a', 'c', 'first');
    const refused = await db
      .transact(async (tx) => {
        await tx.getString('t', 'a', 'c');
        tx.set('t', 'a', 'c', 'second');
        await first.commit();
        void tx.commit();
        throw mine;
      })
      .catch((e: unknown) => e);
    expect(refused).toBe(mine);
    expect(await db.transact((tx) => tx.getString('t', 'a', 'c'))).toBe('first');
    await db.close();
  });

  it('a function that commits by hand: transact resolves to its result, once (awaited or not), and never runs it again', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    let runs = 0;
    const result = await db.transact(async (tx) => {
      runs++;
      tx.set('t', 'a', 'c', 'awaited');
      const { commitTs } = await tx.commit();
      return commitTs;
    });
    expect(runs).toBe(1);
    expect(result).toBeGreaterThan(0);
    // Not awaited: transact waits for that commit, and reports its outcome.
    const notAwaited = await db.transact(async (tx) => {
      tx.set('t', 'b', 'c', 'not awaited');
      tx.set('t', 'c', 'c', 'not awaited');
      void tx.commit();
      return 'ok';
    });
    expect(notAwaited).toBe('ok');
    // Committed by hand, then a retryable error: rethrown, not run again (its writes would commit twice).
    const retryable = new ConflictError('thrown after the commit');
    runs = 0;
    const failure = await db
      .transact(
        async (tx) => {
          runs++;
          tx.set('t', 'd', 'c', String(runs));
          await tx.commit();
          throw retryable;
        },
        { maxAttempts: 3 },
      )
      .catch((e: unknown) => e);
    expect(failure).toBe(retryable);
    expect(runs).toBe(1);
    expect(
      await db.transact((tx) => Promise.all(['a', 'b', 'c', 'd'].map((r) => tx.getString('t', r, 'c')))),
    ).toEqual(['awaited', 'not awaited', 'not awaited', '1']);
    await db.close();
  });

  it("a function's own commit that fails is transact's failure: a conflict it swallowed is retried", async () => {
    const db = new Percolator({ store: new MemoryStore() });
    let runs = 0;
    const result = await db.transact(async (tx) => {
      runs++;
      await tx.get('t', 'r', 'c');
      if (runs === 1) await db.transact(async (other) => other.set('t', 'r', 'c', 'other'));
      tx.set('t', 'r', 'c', 'mine');
      await tx.commit().catch(() => undefined);
      return runs;
    });
    expect(result).toBe(2);
    expect(await db.transact((tx) => tx.getString('t', 'r', 'c'))).toBe('mine');
    await db.close();
  });

  it('a function that rolls back by hand: transact resolves to its result, writes nothing, runs it once', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    let runs = 0;
    const result = await db.transact(async (tx) => {
      runs++;
      tx.set('t', 'r', 'c', 'discarded');
      await tx.rollback();
      return 'rolled back';
    });
    expect(result).toBe('rolled back');
    expect(runs).toBe(1);
    expect(await db.transact((tx) => tx.get('t', 'r', 'c'))).toBeUndefined();
    await db.close();
  });

  it('never retries a commit whose outcome is unknown', async () => {
    const store = new InstrumentedStore();
    const db = new Percolator({ store });
    await db.transact(async (tx) => {
      tx.set('t', 'a', 'c', '0');
      tx.set('t', 'b', 'c', '0');
    });
    let runs = 0;
    let armed = false;
    store.casFault = (r) => (armed && r.key === 'a' ? 'fail-after' : undefined);
    store.readFault = (_t, key) => armed && key === 'a';
    const hooked = new Percolator({
      store,
      hooks: {
        onCommitStep: (e) => {
          if (e.step === 'beforeCommitPrimary') armed = true;
        },
      },
    });
    await expect(
      hooked.transact(async (tx) => {
        runs++;
        tx.set('t', 'a', 'c', '1');
        tx.set('t', 'b', 'c', '1');
      }),
    ).rejects.toBeInstanceOf(CommitUnknownError);
    expect(runs).toBe(1);
  });

  it('commits a single-row transaction in one CAS when the store can stamp it', async () => {
    const store = new InstrumentedStore();
    const db = new Percolator({ store });
    const tx = await db.begin();
    tx.set('t', 'r', 'a', '1');
    tx.set('t', 'r', 'b', '2');
    const before = { ...store.calls };
    await tx.commit();
    expect(store.calls.checkAndSetStamped - before.checkAndSetStamped).toBe(1);
    expect(store.calls.checkAndSet - before.checkAndSet).toBe(0);
    expect(
      await db.transact(async (t) => [await t.getString('t', 'r', 'a'), await t.getString('t', 'r', 'b')]),
    ).toEqual(['1', '2']);

    // With a custom oracle the stamp would not come from the oracle's order: two-phase instead.
    const twoPhase = new Percolator({
      store,
      oracle: { next: () => store.inner.incrementCounter('percolator.oracle', 1) },
    });
    const before2 = { ...store.calls };
    await twoPhase.transact(async (t) => t.set('t', 'r', 'a', '3'));
    expect(store.calls.checkAndSetStamped - before2.checkAndSetStamped).toBe(0);
    expect(store.calls.checkAndSet - before2.checkAndSet).toBe(2); // prewrite + commit primary
  });

  it('retries a transaction whose start timestamp could not be fetched (a briefly unreachable oracle)', async () => {
    const store = new InstrumentedStore();
    let failures = 2;
    const oracle = {
      next: async () => {
        if (failures-- > 0) throw new StoreError('timestamp store unreachable', 'no');
        return store.inner.incrementCounter('percolator.oracle', 1);
      },
    };
    const db = new Percolator({ store, oracle });
    let runs = 0;
    await db.transact(async (tx) => {
      runs++;
      tx.set('t', 'r', 'v', 'x');
    });
    // The timestamp of a write-only transaction is drawn at commit: each failure reran it.
    expect(runs).toBe(3);
    expect(failures).toBeLessThan(0); // both failures were met, then it went through
    // A failure that is not retryable is not retried.
    const broken = new Percolator({
      store,
      oracle: {
        next: async () => {
          throw new InvalidArgumentError('bad oracle');
        },
      },
    });
    await expect(broken.transact(async () => undefined)).rejects.toBeInstanceOf(InvalidArgumentError);
    await db.close();
  });

  it('commit() resolves at the commit point; the secondaries are committed in the background and close() waits for them', async () => {
    const store = new InstrumentedStore(new MemoryStore(), { batchCheckAndSet: false });
    let release: (() => void) | undefined;
    const db = new Percolator({
      store,
      // From the commit point on, hold the secondary's commit.
      hooks: {
        onCommitStep: (e) => void (e.step === 'afterCommitPrimary' && (release = store.gate('t', 'q'))),
      },
    });
    const tx = await db.begin();
    tx.set('t', 'p', 'v', '1'); // the primary: first in key order
    tx.set('t', 'q', 'v', '1');
    const { commitTs } = await tx.commit(); // resolves although the secondary's commit is held
    expect(commitTs).toBeGreaterThan(tx.startTs);
    expect(release).toBeDefined();
    // A reader meeting the secondary's lock rolls it forward through the committed primary.
    const reader = new Percolator({ store });
    expect(
      await reader.transact(async (t) => [
        await t.getString('t', 'p', 'v'),
        await t.getString('t', 'q', 'v'),
      ]),
    ).toEqual(['1', '1']);
    let closed = false;
    const closing = db.close().then(() => {
      closed = true;
    });
    await new Promise((r) => setTimeout(r, 20));
    expect(closed).toBe(false); // close() waits for the held secondary commit
    release!();
    await closing;
    await reader.close();
  });

  it('close(): a transaction begun before it, or running in transact, gets ClosedError for every later call and writes nothing', async () => {
    const store = new MemoryStore();
    const db = new Percolator({ store });
    const tx = await db.begin();
    tx.set('t', 'manual', 'v', 'x');
    let resume!: () => void;
    const paused = new Promise<void>((r) => {
      resume = r;
    });
    const inFlight = db
      .transact(async (t) => {
        await t.get('t', 'inflight', 'v');
        await paused;
        t.set('t', 'inflight', 'v', 'late');
      })
      .catch((e: unknown) => e);
    await new Promise((r) => setTimeout(r, 5));
    await db.close();
    resume();
    expect(await inFlight).toBeInstanceOf(ClosedError);
    await expect(tx.get('t', 'manual', 'v')).rejects.toBeInstanceOf(ClosedError);
    expect(() => tx.set('t', 'manual', 'v', 'y')).toThrow(ClosedError);
    await expect(tx.commit()).rejects.toBeInstanceOf(ClosedError);
    const unstarted = db.transact(async (t) => t); // no: the client is closed
    await expect(unstarted).rejects.toBeInstanceOf(ClosedError);
    expect(await store.read('t', 'manual')).toBeNull();
    expect(await store.read('t', 'inflight')).toBeNull();
  });

  it('close() waits for a commit in flight, and for its secondaries: then no lock is left for store.close()', async () => {
    const store = new InstrumentedStore(new MemoryStore(), { batchCheckAndSet: false });
    let release!: () => void;
    const held = new Promise<void>((r) => {
      release = r;
    });
    const db = new Percolator({
      store,
      onePhaseMaxRows: 1,
      // The commit waits before its commit point, its locks written, until released.
      hooks: { onCommitStep: (e) => (e.step === 'beforeCommitPrimary' ? held : undefined) },
    });
    const rows = ['a', 'b', 'c', 'd'];
    const tx = await db.begin();
    for (const r of rows) tx.set('t', r, 'v', 'committed');
    const order: string[] = [];
    const committing = tx.commit().then(() => order.push('commit'));
    await new Promise((r) => setTimeout(r, 5));
    const closing = db.close().then(() => order.push('close'));
    await new Promise((r) => setTimeout(r, 20));
    expect(order).toEqual([]); // close() waits for the commit
    release();
    await Promise.all([committing, closing]);
    expect(order).toEqual(['commit', 'close']);
    // Every secondary committed before close() resolved: no lock left in any row.
    for (const r of rows) {
      const row = await store.inner.read('t', r);
      expect(
        inspectHeadRow(row!.state).cells.every((c) => c.lock === undefined),
        r,
      ).toBe(true);
    }
  });

  it('db.transact draws its start timestamp with its first reads, in one round trip', async () => {
    const store = new InstrumentedStore();
    const db = new Percolator({ store, peekedWrites: false });
    await db.transact(async (tx) => {
      tx.set('t', 'a', 'v', '1');
      tx.set('t', 'b', 'v', '2');
    });
    await db.flush();
    const before = { ...store.calls };
    const values = await db.transact(async (tx) => {
      expect(() => tx.startTs).toThrow(/first read/);
      const got = await Promise.all([tx.getString('t', 'a', 'v'), tx.getString('t', 'b', 'v')]);
      expect(tx.startTs).toBeGreaterThan(0);
      return got;
    });
    expect(values).toEqual(['1', '2']);
    expect(store.calls.readStamped - before.readStamped).toBe(1); // both reads and the timestamp in one call
    expect(store.calls.incrementCounter - before.incrementCounter).toBe(0); // no oracle round trip
    expect(store.calls.read - before.read).toBe(0);
    // A snapshot taken that way sees every commit below it, and none above.
    const tx = await db.begin();
    const later = await db.transact(async (t) => {
      const v = await t.getString('t', 'a', 'v');
      return { v, ts: t.startTs };
    });
    expect(later.ts).toBeGreaterThan(tx.startTs);
    expect(later.v).toBe('1');
    await db.close();
  });

  it('a blind one-row write is one stamped CAS where the store stamps: no start timestamp of its own, no read once the row is cached', async () => {
    const store = new InstrumentedStore();
    const db = new Percolator({ store });
    await db.flush();
    const delta = async (fn: () => Promise<unknown>) => {
      const before = { ...store.calls };
      await fn();
      return Object.fromEntries(
        Object.entries(store.calls).map(([k, v]) => [k, v - before[k as keyof typeof before]]),
      );
    };
    const none = {
      read: 0,
      readStamped: 0,
      readPeeked: 0,
      checkAndSet: 0,
      checkAndSetStamped: 0,
      incrementCounter: 0,
      scan: 0,
    };
    // A row this client never saw: read once, then the one CAS.
    expect(await delta(() => db.transact(async (tx) => tx.set('t', 'blind', 'v', '1')))).toEqual({
      ...none,
      read: 1,
      checkAndSetStamped: 1,
    });
    // From then on the row cache's guess: one CAS, one round trip.
    let written: Transaction | undefined;
    expect(
      await delta(() =>
        db.transact(async (tx) => {
          written = tx;
          tx.set('t', 'blind', 'v', '2');
          tx.set('t', 'blind', 'w', '2');
        }),
      ),
    ).toEqual({ ...none, checkAndSetStamped: 1 });
    // Its start timestamp is its commit timestamp: the stamp, drawn inside the CAS.
    const row = inspectHeadRow((await store.read('t', 'blind'))!.state);
    for (const cell of row.cells) {
      expect(cell.writes[0]!.commitTs).toBe(written!.startTs);
      expect(cell.writes[0]!.startTs).toBe(written!.startTs);
      expect(cell.lock).toBeUndefined();
    }
    expect(await db.transact((tx) => tx.getString('t', 'blind', 'w'))).toBe('2');
    // A weak notification needs a timestamp before the write: the start timestamp comes first.
    const notified = await delta(() =>
      db.transact(async (tx) => {
        tx.set('t', 'blind', 'v', '3');
        tx.notify('t', 'blind', 'w');
      }),
    );
    expect(notified.checkAndSetStamped).toBe(1);
    expect(notified.readStamped + notified.incrementCounter).toBe(1);
    await db.close();
  });

  it('a transaction with nothing to write commits on a store with one-step commits of many rows (nothing read; read only)', async () => {
    const store = new MemoryStore();
    expect(store.capabilities.stampedCheckAndSetMany).toBe(true);
    const db = new Percolator({ store });
    expect(await db.transact(async () => 42)).toBe(42);
    expect(await db.transact(async () => 43, { readOnly: true })).toBe(43);
    const tx = await db.begin();
    expect((await tx.commit()).commitTs).toBe(tx.startTs);
    await db.transact(async (t) => t.set('t', 'a', 'v', '1'));
    expect(await db.transact((t) => t.getString('t', 'a', 'v'))).toBe('1');
    await db.close();
  });

  it('ready() on a blind write while it commits is a ClosedError (its start is the stamp its commit draws), and the stamp once committed: never a draw of its own', async () => {
    const store = new InstrumentedStore();
    const db = new Percolator({ store });
    await db.transact(async (tx) => tx.set('t', 'blind', 'v', '0')); // cached: the next write is blind
    await db.flush();
    const release = store.gate('t', 'blind');
    let written: Transaction | undefined;
    const commit = db.transact(async (tx) => {
      written = tx;
      tx.set('t', 'blind', 'v', '1');
    });
    await new Promise((resolve) => setTimeout(resolve, 10)); // its one CAS is held at the gate
    const draws = store.calls.incrementCounter + store.calls.readStamped;
    await expect(written!.ready()).rejects.toBeInstanceOf(ClosedError);
    release();
    await commit;
    expect(await written!.ready()).toBe(written!.startTs);
    expect(store.calls.incrementCounter + store.calls.readStamped).toBe(draws);
    const row = inspectHeadRow((await store.read('t', 'blind'))!.state);
    expect(row.cells[0]!.writes[0]!.startTs).toBe(written!.startTs);
    expect(row.cells[0]!.writes[0]!.commitTs).toBe(written!.startTs);
    // A transaction that drew its start timestamp keeps answering it.
    const tx = await db.begin();
    await tx.commit();
    expect(await tx.ready()).toBe(tx.startTs);
    await db.close();
  });

  it('under load, first reads share the batched oracle instead of drawing a timestamp each', async () => {
    const store = new InstrumentedStore();
    const db = new Percolator({ store, peekedWrites: false });
    await db.transact(async (tx) => tx.set('t', 'r', 'v', '1'));
    await db.flush();
    const before = { ...store.calls };
    const results = await Promise.all(
      Array.from({ length: 20 }, () => db.transact((tx) => tx.getString('t', 'r', 'v'))),
    );
    expect(results).toEqual(Array.from({ length: 20 }, () => '1'));
    const stamped = store.calls.readStamped - before.readStamped;
    const oracle = store.calls.incrementCounter - before.incrementCounter;
    expect(stamped).toBeGreaterThanOrEqual(1); // the first one, alone, saves its round trip
    expect(stamped).toBeLessThan(20); // the others share oracle fetches
    expect(oracle).toBeGreaterThanOrEqual(1);
    expect(oracle).toBeLessThan(20 - stamped);
    await db.close();
  });

  it('a multi-row commit on a store that can stamp draws its commit timestamp inside the primary commit', async () => {
    const store = new InstrumentedStore();
    const db = new Percolator({ store, peekedWrites: false });
    await db.transact(async (tx) => {
      tx.set('t', 'x', 'v', '0');
      tx.set('t', 'y', 'v', '0');
    });
    const tx = await db.begin();
    tx.set('t', 'x', 'v', '1');
    tx.set('t', 'y', 'v', '1');
    const before = { ...store.calls };
    const { commitTs } = await tx.commit();
    expect(store.calls.incrementCounter - before.incrementCounter).toBe(0); // no oracle round trip
    expect(store.calls.checkAndSetStamped - before.checkAndSetStamped).toBe(1); // the commit point
    expect(commitTs).toBeGreaterThan(tx.startTs);
    const later = await db.begin();
    expect(later.startTs).toBeGreaterThan(commitTs);
    expect([await later.getString('t', 'x', 'v'), await later.getString('t', 'y', 'v')]).toEqual(['1', '1']);
    await db.close();
  });

  it('a buffered write read back (get, scan) is a copy: changing it changes neither the write nor what commits', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    const value = 'w'.repeat(200);
    await db.transact(async (tx) => {
      tx.set('t', 'r', 'c', value);
      tx.set('t', 's', 'c', new TextEncoder().encode(value));
      (await tx.get('t', 'r', 'c'))!.fill(0);
      expect(await tx.getString('t', 'r', 'c')).toBe(value);
      for await (const row of tx.scan('t')) row.columns.get('c')!.fill(0);
      expect(await tx.getString('t', 's', 'c')).toBe(value);
    });
    expect(
      await db.transact((tx) => Promise.all([tx.getString('t', 'r', 'c'), tx.getString('t', 's', 'c')])),
    ).toEqual([value, value]);
    await db.close();
  });

  it('a finished transaction lets go of its buffered values and the rows it read (commit, failure, rollback)', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    await db.transact(async (tx) => tx.set('t', 'r', 'c', 'v'.repeat(200)));
    const held = (tx: object) => ({
      mutations: (Reflect.get(tx, 'mutations') as Map<string, unknown>).size,
      known: (Reflect.get(tx, 'knownRows') as Map<string, unknown>).size,
      decoded: Reflect.get(tx, 'decodedRows') as Map<string, unknown> | undefined,
    });
    const committed = await db.begin();
    await committed.getString('t', 'r', 'c');
    committed.set('t', 's', 'c', 'w'.repeat(200));
    expect(held(committed).known).toBe(1);
    expect(held(committed).decoded?.size).toBe(1);
    await committed.commit();
    expect(held(committed)).toEqual({ mutations: 0, known: 0, decoded: undefined });
    const failed = await db.begin();
    await failed.getString('t', 'r', 'c');
    failed.set('t', 'r', 'c', 'mine');
    await db.transact(async (tx) => tx.set('t', 'r', 'c', 'theirs'));
    await expect(failed.commit()).rejects.toBeInstanceOf(ConflictError);
    expect(held(failed)).toEqual({ mutations: 0, known: 0, decoded: undefined });
    const rolledBack = await db.begin();
    rolledBack.set('t', 'x', 'c', 'gone');
    await rolledBack.rollback();
    expect(held(rolledBack).mutations).toBe(0);
    await db.close();
  });

  it('scans rows in key order at the snapshot, with its own writes merged', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    const keys = ['b', 'a', '\u{1F600}', '\uFFFD', 'a\u0000z', 'c'];
    await db.transact(async (tx) => {
      for (const k of keys) tx.set('t', k, 'v', k);
    });
    const tx = await db.begin();
    await db.transact(async (other) => other.set('t', 'zz-late', 'v', 'late'));
    tx.set('t', 'bb', 'v', 'mine');
    tx.delete('t', 'c', 'v');
    const rows: string[] = [];
    for await (const r of tx.scan('t')) rows.push(r.row);
    expect(rows).toEqual(['a', 'a\u0000z', 'b', 'bb', '\uFFFD', '\u{1F600}']);
    const ranged: string[] = [];
    for await (const r of tx.scan('t', { start: 'a\u0000', end: '\uFFFD', limit: 2 })) ranged.push(r.row);
    expect(ranged).toEqual(['a\u0000z', 'b']);
  });

  it("a scan shows the transaction's own writes as they were when it began, not those made while it runs", async () => {
    // Found in review: a write to a stored row made during the scan showed, a new row did
    // not; now neither does (and both show in the next scan).
    const db = new Percolator({ store: new MemoryStore() });
    await db.transact(async (tx) => {
      for (const k of ['a', 'c', 'e']) tx.set('t', k, 'v', `v:${k}`);
    });
    const tx = await db.begin();
    tx.set('t', 'a', 'v', 'mine-a'); // before the scan: shows
    const seen: string[] = [];
    for await (const r of tx.scan('t')) {
      seen.push(`${r.row}=${text(r.columns.get('v'))}`);
      if (r.row === 'a') {
        tx.set('t', 'b', 'v', 'new-b');
        tx.set('t', 'c', 'v', 'new-c');
        tx.set('t', 'd', 'v', 'new-d');
        tx.delete('t', 'e', 'v');
      }
    }
    expect(seen).toEqual(['a=mine-a', 'c=v:c', 'e=v:e']);
    const again: string[] = [];
    for await (const r of tx.scan('t')) again.push(`${r.row}=${text(r.columns.get('v'))}`);
    expect(again).toEqual(['a=mine-a', 'b=new-b', 'c=new-c', 'd=new-d']);
    await tx.rollback();
    await db.close();
  });

  it('scan refuses a misspelt range key and a limit that is not a whole number, before it draws a timestamp', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    await db.transact(async (tx) => {
      for (const k of ['a', 'b', 'c']) tx.set('t', k, 'v', k);
    });
    for (const range of [
      { from: 'b' },
      { limit: '2' },
      { limit: 1.5 },
      { limit: -1 },
      { limit: Number.NaN },
    ]) {
      await db.transact(async (tx) => {
        await expect(tx.scan('t', range as ScanRange).next(), JSON.stringify(range)).rejects.toBeInstanceOf(
          InvalidArgumentError,
        );
        // Nothing drawn: the start timestamp is still to come.
        expect(() => tx.startTs).toThrow(UnsupportedOperationError);
      });
    }
    const rows: string[] = [];
    await db.transact(async (tx) => {
      for await (const r of tx.scan('t', { start: 'b', limit: Number.POSITIVE_INFINITY })) rows.push(r.row);
    });
    expect(rows).toEqual(['b', 'c']);
    await db.close();
  });

  it('scan fails with a typed error on a store that cannot scan in order', async () => {
    const db = new Percolator({ store: new InstrumentedStore(new MemoryStore(), { orderedScan: false }) });
    const tx = await db.begin();
    await expect(tx.scan('t').next()).rejects.toBeInstanceOf(UnsupportedOperationError);
  });
});
