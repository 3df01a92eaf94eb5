import {
  type CasRequest,
  ClientCrash,
  ClosedError,
  CompositeStore,
  InvalidArgumentError,
  inspectHeadRow,
  MemoryStore,
  type Observer,
  ObserversDifferError,
  ObserversNotIdleError,
  Percolator,
  type RowStore,
  StoreError,
  type Transaction,
} from '@percolator/core';
import { afterEach, describe, expect, test, vi } from 'vitest';
import { fakeClock, InstrumentedStore, text } from './support.js';

/** Clients and workers made by a test are closed after it. */
const open: Percolator[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((db) => db.close()));
});

function client(store: RowStore, options: Partial<ConstructorParameters<typeof Percolator>[0]> = {}) {
  const db = new Percolator({ store, ...options });
  open.push(db);
  return db;
}

const quiet = { onError: () => undefined };

/** A gate the first observer run waits at until `open()`; later runs pass at once. */
function firstRunGate() {
  let reached = false;
  let open!: () => void;
  const opened = new Promise<void>((r) => {
    open = r;
  });
  return {
    /** In a handler. */
    async pass(): Promise<void> {
      if (reached) return;
      reached = true;
      await opened;
    },
    /** Resolves once a run waits at the gate. */
    async reached(): Promise<void> {
      while (!reached) await new Promise((r) => setTimeout(r, 5));
    },
    open,
  };
}

/** All keys the notification index lists for `table`. */
async function notified(store: RowStore, table: string): Promise<string[]> {
  return store.scanNotified!(table, { limit: 10_000 });
}

async function read(db: Percolator, table: string, row: string, column: string) {
  return db.transact(async (tx) => tx.getString(table, row, column));
}

/** An observer that copies docs/<row>/body into docs/<row>/copy and records every call. */
function copier(calls: string[], extra: Partial<Observer> = {}): Observer {
  return {
    name: 'copier',
    table: 'docs',
    column: 'body',
    handler: async (tx, { table, row, column }) => {
      const body = await tx.getString(table, row, column);
      calls.push(`${row}=${body}`);
      if (body === undefined) tx.delete(table, row, 'copy');
      else tx.set(table, row, 'copy', body);
    },
    ...extra,
  };
}

describe('observers on a CompositeStore routed as docs/multi-store.md shows', () => {
  test('workers run with routes that name only user tables: leases and version rows route themselves', async () => {
    const docsStore = new MemoryStore();
    const counter = new MemoryStore();
    const store = new CompositeStore({
      routes: [{ table: 'docs', store: docsStore }],
      counterStore: counter,
    });
    const db = client(store, { gc: { inlineHistoryBytes: 0 } });
    const calls: string[] = [];
    const errors: unknown[] = [];
    const worker = db.worker({ observers: [copier(calls)], onError: (e) => errors.push(e) });
    for (const body of ['one', 'two', 'three'])
      await db.transact(async (tx) => tx.set('docs', 'a', 'body', body));
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    expect(errors).toEqual([]);
    expect(await read(db, 'docs', 'a', 'copy')).toBe('three');
    expect(calls.at(-1)).toBe('a=three');
    // The version rows are written by the background tidy step: once it is done, they are in
    // the table's own store (the test ended before, so a mis-routed one failed unseen; review).
    await db.flush();
    expect((await docsStore.scan('__v.docs', { limit: 10 })).length).toBeGreaterThan(0);
    expect(await counter.scan('__v.docs', { limit: 10 })).toEqual([]);
    expect(errors).toEqual([]);
  });
});

describe('observers: strong notifications', () => {
  test('a committed write runs the observer once, writes its ack and clears the notification', async () => {
    const store = new MemoryStore();
    const db = client(store);
    const calls: string[] = [];
    const worker = db.worker({ observers: [copier(calls)] });
    await db.transact(async (tx) => {
      tx.set('docs', 'a', 'body', 'alpha');
      tx.set('docs', 'b 🦄', 'body', 'beta');
      tx.set('docs', 'c', 'title', 'not observed');
    });
    expect((await notified(store, 'docs')).sort()).toEqual(['a', 'b 🦄']);
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    expect(calls.sort()).toEqual(['a=alpha', 'b 🦄=beta']);
    expect(await read(db, 'docs', 'b 🦄', 'copy')).toBe('beta');
    expect(await notified(store, 'docs')).toEqual([]);
    expect(worker.stats).toMatchObject({ runs: 2, cleared: 2, failures: 0 });
    // Nothing new: running again does nothing.
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    expect(calls).toHaveLength(2);
  });

  test('a blind one-row write to an observed column is one stamped CAS whose notification carries the stamp', async () => {
    const store = new InstrumentedStore();
    const db = client(store);
    const calls: string[] = [];
    const worker = db.worker({ observers: [copier(calls)] });
    await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'v1'));
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    await db.flush();
    for (const value of ['v2', 'v3']) {
      const before = { ...store.calls };
      let written: Transaction | undefined;
      await db.transact(async (tx) => {
        written = tx;
        tx.set('docs', 'a', 'body', value);
      });
      // One call: the start and commit timestamp and the notification, all one stamp.
      expect(store.calls.checkAndSetStamped - before.checkAndSetStamped).toBe(1);
      expect(store.calls.readStamped + store.calls.incrementCounter + store.calls.read).toBe(
        before.readStamped + before.incrementCounter + before.read,
      );
      const cell = inspectHeadRow((await store.read('docs', 'a'))!.state).cells.find(
        (c) => c.column === 'body',
      )!;
      expect(cell.notifyTs).toBe(written!.startTs);
      expect(cell.writes[0]).toMatchObject({ startTs: written!.startTs, commitTs: written!.startTs });
      expect(await notified(store, 'docs')).toEqual(['a']);
      await worker.runUntilIdle({ timeoutMs: 10_000 });
      expect(calls.at(-1)).toBe(`a=${value}`);
      expect(await read(db, 'docs', 'a', 'copy')).toBe(value);
      expect(await notified(store, 'docs')).toEqual([]);
      await db.flush();
    }
  });

  test('several changes before a run collapse into one run that sees the newest value', async () => {
    const store = new MemoryStore();
    const db = client(store);
    const calls: string[] = [];
    const worker = db.worker({ observers: [copier(calls)] });
    for (const v of ['v1', 'v2', 'v3']) await db.transact(async (tx) => tx.set('docs', 'a', 'body', v));
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    expect(calls).toEqual(['a=v3']);
    await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'v4'));
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    expect(calls).toEqual(['a=v3', 'a=v4']);
  });

  test('a delete of an observed cell is a change too', async () => {
    const store = new MemoryStore();
    const db = client(store);
    const calls: string[] = [];
    const worker = db.worker({ observers: [copier(calls)] });
    await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'x'));
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    await db.transact(async (tx) => tx.delete('docs', 'a', 'body'));
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    expect(calls).toEqual(['a=x', 'a=undefined']);
    expect(await read(db, 'docs', 'a', 'copy')).toBeUndefined();
  });

  test('a client that does not list the observed column leaves no notification; one that does, does', async () => {
    const store = new MemoryStore();
    const unaware = client(store);
    const aware = client(store, { observedColumns: [{ table: 'docs', column: 'body' }] });
    await unaware.transact(async (tx) => tx.set('docs', 'unaware', 'body', 'x'));
    await aware.transact(async (tx) => tx.set('docs', 'aware', 'body', 'y'));
    expect(await notified(store, 'docs')).toEqual(['aware']);
    // db.worker() registers its observers' columns on its own client.
    const host = client(store);
    host.worker({ observers: [copier([])] });
    await host.transact(async (tx) => tx.set('docs', 'host', 'body', 'z'));
    expect((await notified(store, 'docs')).sort()).toEqual(['aware', 'host']);
  });

  test('two runs of the same change racing: only one commits (they conflict on the ack)', async () => {
    const store = new MemoryStore();
    const clock = fakeClock();
    const db = client(store, { clock, observedColumns: [{ table: 'docs', column: 'body' }] });
    await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'x'));
    let entered!: () => void;
    const firstEntered = new Promise<void>((r) => (entered = r));
    let releaseFirst!: () => void;
    const firstMayFinish = new Promise<void>((r) => (releaseFirst = r));
    let handlerCalls = 0;
    const observer: Observer = {
      name: 'counter',
      table: 'docs',
      column: 'body',
      handler: async (tx: Transaction, { table, row }) => {
        const call = ++handlerCalls;
        const n = Number((await tx.getString(table, row, 'count')) ?? '0');
        tx.set(table, row, 'count', String(n + 1));
        if (call === 1) {
          entered();
          await firstMayFinish;
        }
      },
    };
    // Long leases (their renewal timer never fires in this test); the fake clock expires them.
    const slow = db.worker({ observers: [observer], leaseMs: 60_000, ...quiet });
    const fast = db.worker({ observers: [observer], leaseMs: 60_000, ...quiet });
    const slowDone = slow.runUntilIdle({ timeoutMs: 20_000 });
    await firstEntered;
    // The slow worker looks dead: its lease expires and the other worker takes the row over.
    clock.advance(61_000);
    await fast.runUntilIdle({ timeoutMs: 20_000 });
    expect(await read(db, 'docs', 'a', 'count')).toBe('1');
    releaseFirst();
    await slowDone;
    // The slow run lost on the ack; its retry saw the change was handled and skipped it.
    expect(handlerCalls).toBe(2);
    expect(await read(db, 'docs', 'a', 'count')).toBe('1');
    expect(slow.stats.conflicts).toBeGreaterThanOrEqual(1);
    expect(slow.stats.runs + fast.stats.runs).toBe(1);
    expect(await notified(store, 'docs')).toEqual([]);
  });

  test('stats.conflicts counts the attempt that used up maxRunAttempts too (with 1 attempt it counted none)', async () => {
    const store = new MemoryStore();
    const clock = fakeClock();
    const db = client(store, { clock, observedColumns: [{ table: 'docs', column: 'body' }] });
    await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'x'));
    const gate = firstRunGate();
    let calls = 0;
    const observer: Observer = {
      name: 'counter',
      table: 'docs',
      column: 'body',
      handler: async (tx: Transaction, { table, row }) => {
        tx.set(table, row, 'seen', String(++calls));
        await gate.pass();
      },
    };
    const options = { observers: [observer], leaseMs: 60_000, retry: { baseMs: 1, maxMs: 5 }, ...quiet };
    const slow = db.worker({ ...options, maxRunAttempts: 1 });
    const fast = db.worker(options);
    const slowDone = slow.runUntilIdle({ timeoutMs: 20_000 });
    await gate.reached();
    clock.advance(61_000);
    await fast.runUntilIdle({ timeoutMs: 20_000 });
    gate.open();
    await slowDone;
    // Its one attempt lost on the ack: a conflict, and so a failed run (retried later, skipped).
    expect(slow.stats.conflicts).toBe(1);
    expect(slow.stats.failures).toBe(1);
    expect(slow.stats.runs + fast.stats.runs).toBe(1);
  });

  test('a write that commits after the run started is not lost (the clear compares notifyTs and writes)', async () => {
    const store = new MemoryStore();
    let holdCommit: Promise<void> | undefined;
    let prewritten!: () => void;
    const prewriteDone = new Promise<void>((r) => (prewritten = r));
    const writer = client(store, {
      observedColumns: [{ table: 'docs', column: 'body' }],
      // The two-phase steps these hooks stop at (a one-step commit has none).
      onePhaseMaxRows: 1,
      hooks: {
        onCommitStep: async (e) => {
          // Held before it takes its commit timestamp, so that lands above the worker's snapshot.
          if (e.step === 'afterPrewrite' && e.row === 'a' && holdCommit) {
            prewritten();
            await holdCommit;
          }
        },
      },
    });
    // The worker reads through its own wrapper, so the test sees when its run is under way.
    const workerStore = new InstrumentedStore(store);
    let workerReadsOfA = 0;
    let onWorkerRead = () => {};
    workerStore.readFault = (table, key) => {
      if (table === 'docs' && key === 'a') {
        workerReadsOfA++;
        onWorkerRead();
      }
      return false;
    };
    const db = client(workerStore, { lockWaitMs: 10_000 });
    const calls: string[] = [];
    const worker = db.worker({ observers: [copier(calls)], ...quiet });
    await writer.transact(async (tx) => tx.set('docs', 'a', 'body', 'v1'));
    // v2 is prewritten (its notification is set) but its commit point is held back.
    let release!: () => void;
    holdCommit = new Promise<void>((r) => (release = r));
    // (Two rows, so it takes the two-phase path with its commit-step hooks.)
    const v2 = writer.transact(async (tx) => {
      tx.set('docs', 'a', 'body', 'v2');
      tx.set('other', 'b', 'x', 'y');
    });
    await prewriteDone;
    holdCommit = undefined;
    // The worker reads the row (1), begins its run and reads the cell (2), meeting v2's
    // lock: only then may v2 commit, so its commit timestamp is above the run's snapshot.
    onWorkerRead = () => {
      if (workerReadsOfA >= 2) setTimeout(release, 1);
    };
    await worker.runUntilIdle({ timeoutMs: 20_000 });
    await v2;
    await worker.runUntilIdle({ timeoutMs: 20_000 });
    // The first run read below v2's commit (it saw v1); the notification survived for v2.
    expect(calls).toEqual(['a=v1', 'a=v2']);
    expect(await read(db, 'docs', 'a', 'copy')).toBe('v2');
  });

  test('a handler that throws is retried with backoff and its notification is kept until it succeeds', async () => {
    const store = new MemoryStore();
    const db = client(store);
    const errors: unknown[] = [];
    let failuresLeft = 3;
    const calls: string[] = [];
    const base = copier(calls);
    const worker = db.worker({
      observers: [
        {
          ...base,
          handler: async (tx, cell) => {
            if (failuresLeft-- > 0) throw new Error('flaky handler');
            await base.handler(tx, cell);
          },
        },
      ],
      retry: { baseMs: 10, maxMs: 40 },
      onError: (e, failure) => errors.push([String(e), failure?.attempt]),
    });
    await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'x'));
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    expect(errors).toEqual([
      ['Error: flaky handler', 1],
      ['Error: flaky handler', 2],
      ['Error: flaky handler', 3],
    ]);
    expect(calls).toEqual(['a=x']);
    expect(await read(db, 'docs', 'a', 'copy')).toBe('x');
    expect(await notified(store, 'docs')).toEqual([]);
  });

  test('runUntilIdle gives up with a typed error when a handler keeps failing, and the notification stays', async () => {
    const store = new MemoryStore();
    const db = client(store);
    const worker = db.worker({
      observers: [
        {
          name: 'broken',
          table: 'docs',
          column: 'body',
          handler: async () => Promise.reject(new Error('no')),
        },
      ],
      retry: { baseMs: 5, maxMs: 20 },
      ...quiet,
    });
    await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'x'));
    await expect(worker.runUntilIdle({ timeoutMs: 300 })).rejects.toBeInstanceOf(ObserversNotIdleError);
    expect(worker.stats.failures).toBeGreaterThanOrEqual(2);
    expect(await notified(store, 'docs')).toEqual(['a']);
  });

  test('observers trigger observers; an observer writing its own column does not loop', async () => {
    const store = new MemoryStore();
    const db = client(store);
    const log: string[] = [];
    const committed: string[] = [];
    const worker = db.worker({
      onRun: (e) => committed.push(`${e.observer} ${e.row}`),
      observers: [
        {
          name: 'normalise',
          table: 'docs',
          column: 'body',
          handler: async (tx, { table, row, column }) => {
            const body = (await tx.getString(table, row, column)) ?? '';
            log.push(`normalise ${row}`);
            // Writes its own observed column: its ack recognises its own write.
            tx.set(table, row, column, body.trim());
            tx.set('words', row, 'count', String(body.trim().split(/\s+/).length));
          },
        },
        {
          name: 'total',
          table: 'words',
          column: 'count',
          handler: async (tx, { row }) => {
            log.push(`total ${row}`);
            const n = Number(await tx.getString('words', row, 'count'));
            const sum = Number((await tx.getString('totals', 'all', 'words')) ?? '0');
            tx.set('totals', 'all', 'words', String(sum + n));
          },
        },
      ],
    });
    await db.transact(async (tx) => {
      tx.set('docs', 'a', 'body', '  one two three ');
      tx.set('docs', 'b', 'body', 'four');
    });
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    // Handlers may be called again after a conflict (both totals write one cell), but
    // exactly one run per change commits.
    expect(committed.sort()).toEqual(['normalise a', 'normalise b', 'total a', 'total b']);
    expect(log.filter((l) => l.startsWith('normalise')).length).toBeGreaterThanOrEqual(2);
    expect(await read(db, 'docs', 'a', 'body')).toBe('one two three');
    expect(await read(db, 'totals', 'all', 'words')).toBe('4');
  });

  test('several observers of one column each run once; a failing one does not rerun the others', async () => {
    const store = new MemoryStore();
    const db = client(store);
    const calls: string[] = [];
    let failOnce = true;
    const worker = db.worker({
      observers: [
        { ...copier(calls), name: 'first' },
        {
          name: 'second',
          table: 'docs',
          column: 'body',
          handler: async (_tx, { row }) => {
            calls.push(`second ${row}`);
            if (failOnce) {
              failOnce = false;
              throw new Error('once');
            }
          },
        },
      ],
      retry: { baseMs: 5, maxMs: 5 },
      ...quiet,
    });
    await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'x'));
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    expect(calls).toEqual(['a=x', 'second a', 'second a']);
    expect(worker.stats).toMatchObject({ runs: 2, skipped: 1, failures: 1 });
  });
});

describe('observers: weak notifications', () => {
  test('tx.notify runs a weak observer without writing the cell; concurrent notifiers never conflict', async () => {
    const store = new MemoryStore();
    const db = client(store);
    const runs: string[] = [];
    const worker = db.worker({
      observers: [
        {
          name: 'recount',
          table: 'clusters',
          column: 'dirty',
          weak: true,
          handler: async (tx, { row }) => {
            let n = 0;
            for await (const r of tx.scan('members', { start: `${row}/`, end: `${row}0` }))
              if (r.columns.size) n++;
            runs.push(`${row}:${n}`);
            tx.set('clusters', row, 'size', String(n));
          },
        },
      ],
    });
    // Many transactions add members and notify the same cluster cell at once: a strong
    // write to one cell would conflict; weak notifications never do.
    const txs = await Promise.all(Array.from({ length: 8 }, () => db.begin()));
    txs.forEach((tx, i) => {
      tx.set('members', `c1/m${i}`, 'in', '1');
      tx.notify('clusters', 'c1', 'dirty');
    });
    await Promise.all(txs.map((tx) => tx.commit()));
    expect(await notified(store, 'clusters')).toEqual(['c1']);
    expect(await read(db, 'clusters', 'c1', 'dirty')).toBeUndefined();
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    expect(runs.at(-1)).toBe('c1:8');
    expect(await read(db, 'clusters', 'c1', 'size')).toBe('8');
    expect(await notified(store, 'clusters')).toEqual([]);
    // A notify-only transaction commits with no writes and still triggers the observer.
    await db.transact(async (tx) => tx.notify('clusters', 'c1', 'dirty'));
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    expect(runs.at(-1)).toBe('c1:8');
    expect(runs.length).toBeGreaterThanOrEqual(2);
  });

  test('a weak notification survives a client that stops right after its commit point', async () => {
    const store = new MemoryStore();
    const crasher = client(store, {
      lockTtlMs: 50,
      // The two-phase steps these hooks stop at (a one-step commit has none).
      onePhaseMaxRows: 1,
      hooks: {
        onCommitStep: (e) => {
          if (e.step === 'afterCommitPrimary') throw new ClientCrash();
        },
      },
    });
    const db = client(store);
    const seen: (string | undefined)[] = [];
    const worker = db.worker({
      observers: [
        {
          name: 'weak-reader',
          table: 'queue',
          column: 'ready',
          weak: true,
          handler: async (tx) => {
            seen.push(await tx.getString('items', 'b', 'v'));
          },
        },
      ],
    });
    const tx = await crasher.begin();
    tx.set('items', 'a', 'v', '1');
    tx.set('items', 'b', 'v', '2');
    tx.notify('queue', 'q', 'ready');
    await expect(tx.commit()).rejects.toBeInstanceOf(ClientCrash);
    // Marked before the prewrites, so it is there although the post-commit mark never ran.
    expect(await notified(store, 'queue')).toEqual(['q']);
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    // The run resolved the committed transaction's leftover lock and saw its write.
    expect(seen).toEqual(['2']);
  });

  test('a weak observer of a cell a dead client left locked settles the lock as a reader would, and does not run again and again', async () => {
    // Found in review: a weak run read nothing, so the lock stayed, the clear was refused
    // (a write in flight), and the worker ran the handler again at once, pass after pass.
    for (const stop of ['beforeCommitPrimary', 'afterCommitPrimary'] as const) {
      const store = new MemoryStore();
      const crasher = client(store, {
        lockTtlMs: 50,
        onePhaseMaxRows: 1,
        observedColumns: [{ table: 'docs', column: 'body' }],
        hooks: {
          onCommitStep: (e) => {
            if (e.step === stop) throw new ClientCrash();
          },
        },
      });
      const db = client(store, { lockTtlMs: 50 });
      let runs = 0;
      const worker = db.worker({
        observers: [
          {
            name: 'w',
            table: 'docs',
            column: 'body',
            weak: true,
            handler: async () => {
              runs++;
            },
          },
        ],
      });
      const tx = await crasher.begin();
      tx.set('docs', 'a', 'body', '1');
      tx.set('docs', 'b', 'body', '2');
      await expect(tx.commit()).rejects.toBeInstanceOf(ClientCrash);
      await new Promise((r) => setTimeout(r, 100)); // the locks have expired
      await worker.runUntilIdle({ timeoutMs: 5000 });
      // Once per notified row, or a little more (a run below a commit it then settles).
      expect(runs, stop).toBeGreaterThanOrEqual(stop === 'afterCommitPrimary' ? 2 : 1);
      expect(runs, stop).toBeLessThanOrEqual(4);
      expect(await notified(store, 'docs'), stop).toEqual([]);
      for (const row of ['a', 'b'])
        expect(
          inspectHeadRow((await store.read('docs', row))!.state).cells[0]?.lock,
          `${stop} ${row}`,
        ).toBeUndefined();
    }
  });

  test('a handler that commits or rolls back the run itself gets a clear error, not a closed transaction', async () => {
    for (const finish of ['commit', 'rollback'] as const) {
      const store = new MemoryStore();
      const db = client(store, { observedColumns: [{ table: 'docs', column: 'body' }] });
      const errors: unknown[] = [];
      const worker = db.worker({
        observers: [
          {
            name: 'eager',
            table: 'docs',
            column: 'body',
            handler: async (tx) => {
              tx.set('out', 'a', 'v', 'x');
              await (finish === 'commit' ? tx.commit() : tx.rollback());
            },
          },
        ],
        onError: (e) => errors.push(e),
      });
      await db.transact(async (tx) => tx.set('docs', 'a', 'body', '1'));
      await expect(worker.runUntilIdle({ timeoutMs: 200 })).rejects.toBeInstanceOf(ObserversNotIdleError);
      expect(errors[0], finish).toBeInstanceOf(InvalidArgumentError);
      expect(String(errors[0]), finish).toMatch(/handler committed or rolled back the run's transaction/);
      expect(await notified(store, 'docs'), finish).toEqual(['a']);
    }
  });

  test('a weak notification on a row the transaction also writes rides in the same CAS (one-phase too)', async () => {
    const store = new InstrumentedStore();
    const db = client(store);
    await db.transact(async (tx) => {
      tx.set('clusters', 'c1', 'size', '1');
      tx.notify('clusters', 'c1', 'dirty');
    });
    expect(store.calls.checkAndSetStamped).toBe(1);
    expect(await notified(store, 'clusters')).toEqual(['c1']);
    expect(await read(db, 'clusters', 'c1', 'size')).toBe('1');
  });

  test('a weak notification of a rolled-back or failed transaction is not written', async () => {
    const store = new MemoryStore();
    const db = client(store);
    const tx = await db.begin();
    tx.notify('clusters', 'c1', 'dirty');
    await tx.rollback();
    await expect(
      db.transact(async (t) => {
        t.notify('clusters', 'c2', 'dirty');
        throw new Error('user error');
      }),
    ).rejects.toThrow('user error');
    expect(await notified(store, 'clusters')).toEqual([]);
  });

  test('a strong observer does not run for a bare tx.notify (nothing changed since its ack)', async () => {
    const store = new MemoryStore();
    const db = client(store);
    const calls: string[] = [];
    const worker = db.worker({ observers: [copier(calls)] });
    await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'x'));
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    await db.transact(async (tx) => tx.notify('docs', 'a', 'body'));
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    expect(calls).toEqual(['a=x']);
    expect(worker.stats.skipped).toBe(1);
    expect(await notified(store, 'docs')).toEqual([]);
  });
});

describe('observers: workers, leases and scanning', () => {
  test('a crashed worker leaves its lease; another worker takes the row over once it expires', async () => {
    const store = new MemoryStore();
    const clock = fakeClock();
    const db = client(store, { clock, observedColumns: [{ table: 'docs', column: 'body' }] });
    await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'x'));
    const calls: string[] = [];
    // The "crashed" worker never finishes its handler (and its lease is never renewed). Its
    // client, like a crashed process's, is never closed (close() would wait for the handler).
    const crashed = new Percolator({ store, clock }).worker({
      observers: [{ ...copier([]), handler: () => new Promise(() => undefined) }],
      leaseMs: 60_000,
    });
    void crashed.runUntilIdle();
    await new Promise((r) => setTimeout(r, 20));
    const survivor = db.worker({ observers: [copier(calls)], leaseMs: 60_000 });
    await expect(survivor.runUntilIdle({ timeoutMs: 100 })).rejects.toBeInstanceOf(ObserversNotIdleError);
    expect(survivor.stats.leaseBusy).toBeGreaterThan(0);
    expect(calls).toEqual([]);
    clock.advance(60_001);
    await survivor.runUntilIdle({ timeoutMs: 10_000 });
    expect(calls).toEqual(['a=x']);
    expect(await notified(store, 'docs')).toEqual([]);
  });

  test('start() while a stop() waits for its rows: that stop resolves, the new loops run, and the next stop stops them', async () => {
    const store = new MemoryStore();
    const db = client(store);
    const seen: string[] = [];
    const gate = firstRunGate();
    const worker = db.worker({
      observers: [
        copier([], {
          handler: async (_tx, { row }) => {
            await gate.pass();
            seen.push(row);
          },
        }),
      ],
      idlePollMs: 20,
      ...quiet,
    });
    const settles = async (promise: Promise<unknown>, ms: number) =>
      Promise.race([promise.then(() => true), new Promise((r) => setTimeout(() => r(false), ms))]);
    await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'x'));
    worker.start();
    await gate.reached();
    const stopping = worker.stop(); // waits for row a's run
    worker.start();
    gate.open();
    expect(await settles(stopping, 5_000)).toBe(true);
    expect(worker.isRunning).toBe(true);
    await db.transact(async (tx) => tx.set('docs', 'b', 'body', 'y'));
    for (let i = 0; i < 500 && !seen.includes('b'); i++) await new Promise((r) => setTimeout(r, 10));
    expect(seen).toContain('b');
    expect(await settles(worker.stop(), 5_000)).toBe(true);
    expect(worker.isRunning).toBe(false);
  });

  test('a stop() not awaited, then close(): close waits for the row in progress, which commits', async () => {
    const store = new MemoryStore();
    const db = new Percolator({ store });
    const gate = firstRunGate();
    const worker = db.worker({
      observers: [
        copier([], {
          handler: async (tx, { table, row }) => {
            await gate.pass();
            tx.set(table, row, 'copy', 'done');
          },
        }),
      ],
      idlePollMs: 20,
      ...quiet,
    });
    await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'x'));
    worker.start();
    await gate.reached();
    void worker.stop(); // a shutdown path that does not wait for it
    let closed = false;
    const closing = db.close().then(() => {
      closed = true;
    });
    await new Promise((r) => setTimeout(r, 100));
    expect(closed).toBe(false); // the row is still being processed
    gate.open();
    await closing;
    expect(worker.stats.runs).toBe(1);
    expect(worker.stats.failures).toBe(0);
    expect(await read(new Percolator({ store }), 'docs', 'a', 'copy')).toBe('done');
  });

  test('several workers share the work and never run the same row at once', async () => {
    const store = new MemoryStore();
    const writer = client(store, { observedColumns: [{ table: 'docs', column: 'body' }] });
    const running = new Set<string>();
    let overlaps = 0;
    const perWorker = [0, 0, 0, 0];
    const observerFor = (w: number): Observer => ({
      name: 'slow-copy',
      table: 'docs',
      column: 'body',
      handler: async (tx, { table, row, column }) => {
        if (running.has(row)) overlaps++;
        running.add(row);
        perWorker[w]!++;
        await new Promise((r) => setTimeout(r, 1));
        tx.set(table, row, 'copy', (await tx.getString(table, row, column)) ?? '');
        running.delete(row);
      },
    });
    const workers = [0, 1, 2, 3].map((w) =>
      client(store).worker({ observers: [observerFor(w)], concurrency: 2, idlePollMs: 20 }),
    );
    for (const w of workers) w.start();
    for (let i = 0; i < 120; i++) {
      await writer.transact(async (tx) =>
        tx.set('docs', `doc/${String(i % 40).padStart(3, '0')}`, 'body', `v${i}`),
      );
    }
    await Promise.all(workers.map((w) => w.runUntilIdle({ timeoutMs: 30_000 })));
    await Promise.all(workers.map((w) => w.stop()));
    expect(overlaps).toBe(0);
    expect(await notified(store, 'docs')).toEqual([]);
    const copies = await writer.transact(async (tx) => {
      const out = new Map<string, string>();
      for await (const r of tx.scan('docs')) out.set(r.row, text(r.columns.get('copy'))!);
      return out;
    });
    for (let k = 0; k < 40; k++) {
      const last = Math.max(...[0, 1, 2].map((j) => k + 40 * j));
      expect(copies.get(`doc/${String(k).padStart(3, '0')}`)).toBe(`v${last}`);
    }
    // The work was spread: more than one worker ran handlers.
    expect(perWorker.filter((n) => n > 0).length).toBeGreaterThan(1);
  });

  test('background workers (start/stop) pick up new writes without runUntilIdle', async () => {
    const store = new MemoryStore();
    const db = client(store);
    const calls: string[] = [];
    const worker = db.worker({ observers: [copier(calls)], idlePollMs: 10 });
    worker.start();
    await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'x'));
    const deadline = Date.now() + 5000;
    while (calls.length === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 5));
    await worker.stop();
    expect(worker.isRunning).toBe(false);
    expect(calls).toEqual(['a=x']);
  });

  test('finding notifications costs in proportion to them: no full scans, few reads', async () => {
    const store = new InstrumentedStore();
    const db = client(store);
    // 300 rows with unobserved writes, 5 rows with observed ones.
    await db.transact(async (tx) => {
      for (let i = 0; i < 300; i++) tx.set('docs', `quiet/${i}`, 'title', 't');
      for (let i = 0; i < 5; i++) tx.set('docs', `busy/${i}`, 'title', 't');
    });
    const worker = db.worker({ observers: [copier([])] });
    await db.transact(async (tx) => {
      for (let i = 0; i < 5; i++) tx.set('docs', `busy/${i}`, 'body', 'b');
    });
    store.calls.read = 0;
    store.calls.scan = 0;
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    expect(store.calls.scan).toBe(0);
    // Per notified row: a handful of reads (row, lease resolution, transaction, clear): far below 300.
    expect(store.calls.read).toBeLessThanOrEqual(5 * 6);
    expect(worker.stats.rowsScanned).toBe(5);
  });

  test('the ack column is hidden from scans and cannot be written by users', async () => {
    const store = new MemoryStore();
    const db = client(store);
    const worker = db.worker({ observers: [copier([])] });
    await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'x'));
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    const columns = await db.transact(async (tx) => {
      const out: string[] = [];
      for await (const r of tx.scan('docs')) out.push(...r.columns.keys());
      return out;
    });
    expect(columns.sort()).toEqual(['body', 'copy']);
    const tx = await db.begin();
    expect(() => tx.set('docs', 'a', '\u0000percolator:ack\u0000copier\u0000body', '1')).toThrow(
      InvalidArgumentError,
    );
    expect(() => tx.notify('docs', '', 'body')).toThrow(InvalidArgumentError);
    expect(() => tx.notify('bad table!', 'a', 'body')).toThrow(InvalidArgumentError);
    await tx.rollback();
  });

  test('bad worker options are rejected with InvalidArgumentError', () => {
    const db = client(new MemoryStore());
    const ok = copier([]);
    expect(() => db.worker({ observers: [] })).toThrow(InvalidArgumentError);
    expect(() => db.worker({ observers: [ok, ok] })).toThrow(InvalidArgumentError);
    expect(() => db.worker({ observers: [{ ...ok, name: 'bad name' }] })).toThrow(InvalidArgumentError);
    expect(() => db.worker({ observers: [{ ...ok, table: '' }] })).toThrow(InvalidArgumentError);
    expect(() => db.worker({ observers: [ok], concurrency: 0 })).toThrow(InvalidArgumentError);
    expect(() => db.worker({ observers: [{ ...ok, handler: 'x' as never }] })).toThrow(InvalidArgumentError);
  });
});

describe('observers: close() while a run waits on a lock', () => {
  test("ends the run's lock wait at once (it waited lockWaitMs per attempt: found in review)", async () => {
    const store = new MemoryStore();
    const observed = [{ table: 'docs', column: 'body' }];
    const setup = new Percolator({ store, observedColumns: observed });
    await setup.transact(async (tx) => tx.set('docs', 'a', 'body', 'x'));
    await setup.close();
    // A live writer (long TTL) holds a lock on the observed cell, before its commit point.
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    let reached!: () => void;
    const atCommitPoint = new Promise<void>((r) => (reached = r));
    const writer = new Percolator({
      store,
      lockTtlMs: 60_000,
      onePhaseMaxRows: 1,
      observedColumns: observed,
      hooks: {
        onCommitStep: async (e) => {
          if (e.step !== 'beforeCommitPrimary') return;
          reached();
          await held;
        },
      },
    });
    const tx = await writer.begin();
    tx.set('docs', 'a', 'body', 'y');
    tx.set('docs', 'b', 'body', 'y');
    const committing = tx.commit();
    await atCommitPoint;
    const errors: unknown[] = [];
    const db = new Percolator({ store, lockWaitMs: 60_000, observedColumns: observed });
    const worker = db.worker({
      observers: [{ name: 'o', table: 'docs', column: 'body', handler: async () => {} }],
      maxRunAttempts: 3,
      onError: (e) => errors.push(e),
    });
    worker.start();
    await new Promise((r) => setTimeout(r, 300)); // the run reads docs/a and waits on the lock
    const closed = await Promise.race([
      db.close().then(() => 'closed'),
      new Promise((r) => setTimeout(() => r('still waiting after 10 s'), 10_000)),
    ]);
    expect(closed).toBe('closed');
    // Cut short by close(): not reported as a failure.
    expect(errors.filter((e) => !(e instanceof ClosedError))).toEqual([]);
    release();
    await committing;
    await writer.close();
  }, 30_000);
});

describe('observers: runUntilIdle and a failing store', () => {
  test('a scan that fails once retryably is reported and tried again: runUntilIdle completes, the observer ran', async () => {
    const store = new InstrumentedStore();
    const db = client(store);
    const calls: string[] = [];
    const errors: unknown[] = [];
    const worker = db.worker({
      observers: [copier(calls)],
      retry: { baseMs: 5, maxMs: 50 },
      onError: (e) => errors.push(e),
    });
    await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'x'));
    const dropped = new StoreError('injected: connection dropped during the index scan', 'no');
    let failures = 1;
    store.scanNotifiedFault = () => (failures-- > 0 ? dropped : undefined);
    await worker.runUntilIdle({ timeoutMs: 10_000 });
    expect(calls).toEqual(['a=x']);
    expect(errors).toEqual([dropped]);
    expect(await notified(store, 'docs')).toEqual([]);
  });

  test('a non-retryable error rejects at once; a retryable one that lasts rejects at the deadline with it as cause', async () => {
    const store = new InstrumentedStore();
    const db = client(store);
    const calls: string[] = [];
    const worker = db.worker({ observers: [copier(calls)], retry: { baseMs: 5, maxMs: 20 }, ...quiet });
    await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'x'));
    const refused = new StoreError('injected: permission denied', 'no', { retryable: false });
    store.scanNotifiedFault = () => refused;
    await expect(worker.runUntilIdle({ timeoutMs: 10_000 })).rejects.toBe(refused);
    expect(store.scanNotifiedCalls).toBe(1);
    const dropped = new StoreError('injected: connection dropped', 'no');
    store.scanNotifiedFault = () => dropped;
    const error = await worker.runUntilIdle({ timeoutMs: 100 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ObserversNotIdleError);
    expect((error as Error).cause).toBe(dropped);
    expect(store.scanNotifiedCalls).toBeGreaterThan(2);
    expect(calls).toEqual([]);
  });

  /** What a promise did within `ms`: settled (how) or still pending. */
  async function within(promise: Promise<unknown>, ms: number) {
    const timer = new Promise<'pending'>((resolve) => setTimeout(() => resolve('pending'), ms));
    return Promise.race([
      promise.then(
        () => 'resolved' as const,
        (error: unknown) => error,
      ),
      timer,
    ]);
  }

  test('the backoff of runs that failed here is forgotten once stale, also for cells another worker settled', async () => {
    const store = new MemoryStore();
    const db = client(store);
    const failing = db.worker({
      observers: [copier([], { handler: async () => Promise.reject(new Error('injected: fails here')) })],
      retry: { baseMs: 50, maxMs: 50 },
      ...quiet,
    });
    const retries = () => (failing as unknown as { retries: Map<string, unknown> }).retries.size;
    const rows = Array.from({ length: 20 }, (_, i) => `r${i}`);
    await db.transact(async (tx) => {
      for (const row of rows) tx.set('docs', row, 'body', 'x');
    });
    // One pass: every run fails here, and each cell gets a backoff.
    await expect(failing.runUntilIdle({ timeoutMs: 1 })).rejects.toBeInstanceOf(ObserversNotIdleError);
    expect(retries()).toBe(rows.length);
    // Another worker settles them all: this one never sees those cells again.
    await client(store)
      .worker({ observers: [copier([])] })
      .runUntilIdle();
    expect(await notified(store, 'docs')).toEqual([]);
    await new Promise((r) => setTimeout(r, 150));
    // The next failure here sweeps the stale entries away; its own stays.
    await db.transact(async (tx) => tx.set('docs', 'z', 'body', 'x'));
    await expect(failing.runUntilIdle({ timeoutMs: 1 })).rejects.toBeInstanceOf(ObserversNotIdleError);
    expect(retries()).toBe(1);
  });

  for (const [what, failing] of [
    ['its observer keeps failing (the cell waits out backoffs)', 'observer'],
    ['its index scans keep failing retryably (a long backoff between passes)', 'scan'],
  ] as const) {
    test(`a runUntilIdle in progress when the client closes, as ${what}: ClosedError, and no store call after close()`, async () => {
      const store = new InstrumentedStore();
      const db = new Percolator({ store });
      const worker = db.worker({
        observers: [
          copier([], {
            handler: async () => {
              if (failing === 'observer') throw new Error('injected: the handler fails');
            },
          }),
        ],
        retry: { baseMs: failing === 'scan' ? 60_000 : 20, maxMs: 60_000 },
        ...quiet,
      });
      await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'x'));
      if (failing === 'scan')
        store.scanNotifiedFault = () => new StoreError('injected: connection dropped', 'no');
      const drain = worker.runUntilIdle();
      await new Promise((r) => setTimeout(r, 100));
      expect(await within(db.close(), 5_000)).toBe('resolved');
      // It ended with the client, at once, whatever it was waiting for.
      expect(await within(drain, 1_000)).toBeInstanceOf(ClosedError);
      const calls = { ...store.calls, scans: store.scanNotifiedCalls };
      await new Promise((r) => setTimeout(r, 300));
      expect({ ...store.calls, scans: store.scanNotifiedCalls }).toEqual(calls);
      // And after close: runUntilIdle and start() are ClosedError, and send nothing.
      await expect(worker.runUntilIdle()).rejects.toBeInstanceOf(ClosedError);
      expect(() => worker.start()).toThrow(ClosedError);
      expect({ ...store.calls, scans: store.scanNotifiedCalls }).toEqual(calls);
    });
  }
});

describe('observers: every worker of a column runs all of its observers', () => {
  test('a worker that meets the ack of an observer it does not run reports it once (ObserversDifferError)', async () => {
    const store = new MemoryStore();
    const db = new Percolator({ store, observedColumns: [{ table: 'docs', column: 'body' }] });
    const runs = { A: 0, B: 0 };
    const observer = (name: 'A' | 'B'): Observer => ({
      name,
      table: 'docs',
      column: 'body',
      handler: async () => {
        runs[name]++;
      },
    });
    const errors: unknown[] = [];
    const a = new Percolator({ store }).worker({
      observers: [observer('A')],
      onError: (e) => errors.push(e),
    });
    const b = new Percolator({ store }).worker({ observers: [observer('B')] });
    await db.transact(async (tx) => tx.set('docs', 'd1', 'body', 'one'));
    await b.runUntilIdle(); // B runs, acks, clears
    await db.transact(async (tx) => tx.set('docs', 'd1', 'body', 'two'));
    await a.runUntilIdle(); // A meets B's ack on d1
    await db.transact(async (tx) => tx.set('docs', 'd1', 'body', 'three'));
    await a.runUntilIdle();
    expect(runs.A).toBe(2);
    const differ = errors.filter((e) => e instanceof ObserversDifferError);
    expect(differ).toHaveLength(1);
    expect((differ[0] as Error).message).toContain('"B"');
    expect((differ[0] as ObserversDifferError).retryable).toBe(false);
    await db.close();
  });

  test('a callback that throws or rejects neither fails a committed run nor escapes', async () => {
    const store = new MemoryStore();
    const db = new Percolator({ store, observedColumns: [{ table: 'docs', column: 'body' }] });
    let runs = 0;
    const worker = db.worker({
      observers: [
        {
          name: 'count',
          table: 'docs',
          column: 'body',
          handler: async () => {
            runs++;
          },
        },
      ],
      onRun: () => {
        throw new Error('onRun is broken');
      },
      onError: async () => {
        throw new Error('onError is broken too');
      },
    });
    await db.transact(async (tx) => tx.set('docs', 'd1', 'body', 'one'));
    await worker.runUntilIdle();
    expect(runs).toBe(1);
    expect(worker.stats.runs).toBe(1);
    expect(worker.stats.failures).toBe(0);
    await db.close();
  });
});

describe('observers: a weak notification whose second mark fails', () => {
  test('is raised again in the background: a worker that ran below the commit runs again and sees the write', async () => {
    // The first mark lands before the commit point; the prewrite of data/y is held while a
    // worker runs the weak observer below the commit (it misses NEW); then the commit, whose
    // second mark (raised to commitTs) fails once.
    class Faulty extends MemoryStore {
      gate: Promise<void> | undefined;
      /** Set once the transaction's write of data/y has landed: the next mark after it fails. */
      dataWritten = false;
      /** More failures in a row than the row-update loop retries (8): the mark fails for good. */
      failMarks = 8;
      private async hold(tables: string[]): Promise<void> {
        if (tables.includes('data') && this.gate) {
          const gate = this.gate;
          this.gate = undefined;
          await gate;
        }
      }
      private wrote(tables: string[]): void {
        if (tables.includes('data')) this.dataWritten = true;
      }
      override async checkAndSet(request: CasRequest) {
        await this.hold([request.table]);
        if (request.table === 'docs' && request.state && this.dataWritten && this.failMarks > 0) {
          this.failMarks--;
          throw new StoreError('the second mark did not get through', 'no');
        }
        const result = await super.checkAndSet(request);
        this.wrote([request.table]);
        return result;
      }
      override async checkAndSetMany(requests: readonly CasRequest[]) {
        await this.hold(requests.map((r) => r.table));
        const results = await super.checkAndSetMany(requests);
        this.wrote(requests.map((r) => r.table));
        return results;
      }
      override async checkAndSetStamped(
        request: CasRequest & { readonly state: Uint8Array },
        counter: string,
      ) {
        await this.hold([request.table]);
        const result = await super.checkAndSetStamped(request, counter);
        this.wrote([request.table]);
        return result;
      }
      override async checkAndSetStampedMany(
        requests: readonly (CasRequest & { readonly state: Uint8Array })[],
        counter: string,
      ) {
        await this.hold(requests.map((r) => r.table));
        const result = await super.checkAndSetStampedMany(requests, counter);
        this.wrote(requests.map((r) => r.table));
        return result;
      }
    }
    const store = new Faulty();
    const db = new Percolator({ store });
    const seen: (string | undefined)[] = [];
    const worker = new Percolator({ store }).worker({
      observers: [
        {
          name: 'W',
          weak: true,
          table: 'docs',
          column: 'c',
          handler: async (tx) => {
            seen.push(await tx.getString('data', 'y', 'v'));
          },
        },
      ],
      onError: () => {},
    });
    let release!: () => void;
    store.gate = new Promise((resolve) => (release = resolve));
    const committed = db.transact(async (tx) => {
      tx.notify('docs', 'x', 'c');
      tx.set('data', 'y', 'v', 'NEW');
    });
    await new Promise((resolve) => setTimeout(resolve, 20));
    await worker.runUntilIdle(); // below the commit: misses NEW
    expect(seen).toEqual([undefined]);
    release();
    await committed;
    expect(store.failMarks).toBe(0); // the second mark failed, 8 times in a row
    await db.flush(); // the mark raised again in the background
    await worker.runUntilIdle();
    expect(seen).toEqual([undefined, 'NEW']);
    await db.close();
  });
});

describe('observers: a batch with a row that fails', () => {
  test('runUntilIdle rejects only once the rows still running are done; then close() leaves no store call behind', async () => {
    const store = new InstrumentedStore(new MemoryStore());
    const db = client(store, { observedColumns: [{ table: 'docs', column: 'body' }] });
    let releaseA!: () => void;
    const gateA = new Promise<void>((r) => {
      releaseA = r;
    });
    let aStarted = false;
    let aFinished = false;
    const worker = db.worker({
      concurrency: 2,
      ...quiet,
      observers: [
        copier([], {
          handler: async (tx, { row }) => {
            if (row !== 'a') return;
            aStarted = true;
            await gateA;
            tx.set('docs', 'a', 'copy', 'x');
            aFinished = true;
          },
        }),
      ],
    });
    await db.transact(async (tx) => tx.set('docs', 'a', 'body', 'one'));
    // A notified row this version cannot decode (a newer format, say): its run throws.
    const garbage = new Uint8Array([0xff, 0xfe, 0xfd, 0x01]);
    expect(
      (
        await store.inner.checkAndSet({
          table: 'docs',
          key: 'b',
          expected: null,
          state: garbage,
          notified: true,
        })
      ).ok,
    ).toBe(true);
    const drain = worker.runUntilIdle({ timeoutMs: 10_000 }).then(
      () => undefined,
      (error: unknown) => ({ error, aFinished }),
    );
    while (!aStarted) await new Promise((r) => setTimeout(r, 5));
    setTimeout(releaseA, 50);
    const outcome = await drain;
    expect(outcome?.error).toBeInstanceOf(Error);
    // Before, it rejected at once while row a was still running (and close() then returned
    // with a's run still calling the store).
    expect(outcome?.aFinished).toBe(true);
    await db.close();
    const calls = JSON.stringify(store.calls);
    await new Promise((r) => setTimeout(r, 50));
    expect(JSON.stringify(store.calls)).toBe(calls);
  });
});

describe('observers: stop() while a loop is in the middle of a sweep', () => {
  test('the loop does not go to sleep for its idle poll first (fake timers: no wait at all)', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    try {
      class HeldScan extends InstrumentedStore {
        hold: { reached: () => void; until: Promise<void> } | undefined;
        override async scanNotified(table: string, options: { limit: number }) {
          const hold = this.hold;
          if (hold) {
            this.hold = undefined;
            hold.reached();
            await hold.until;
          }
          return super.scanNotified(table, options);
        }
      }
      const store = new HeldScan(new MemoryStore());
      const db = new Percolator({ store });
      const worker = db.worker({ concurrency: 1, idlePollMs: 60_000, observers: [copier([])], ...quiet });
      worker.start();
      // Nothing to do: the idle sleeps grow to idlePollMs.
      await vi.advanceTimersByTimeAsync(300_000);
      let release!: () => void;
      const until = new Promise<void>((r) => {
        release = r;
      });
      const reached = new Promise<void>((r) => {
        store.hold = { reached: r, until };
      });
      await vi.advanceTimersByTimeAsync(100_000); // to the next sweep, held in its scan
      await reached;
      let stopped = false;
      const stopping = worker.stop().then(() => {
        stopped = true;
      });
      release();
      // No timer runs from here: a loop that went to sleep would keep stop() waiting.
      for (let i = 0; i < 50 && !stopped; i++) await Promise.resolve();
      await new Promise((r) => setImmediate(r));
      // Before, it slept up to 1.5 x idlePollMs first.
      expect(stopped).toBe(true);
      await stopping;
      await db.close();
    } finally {
      vi.useRealTimers();
    }
  });
});
