import {
  type CasRequest,
  ClientCrash,
  MemoryStore,
  Percolator,
  type RowStore,
  StoreError,
} from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { runCli } from '../src/cli.js';
import { missingTable } from '../src/open.js';

/**
 * How runCli maps what goes wrong inside a command to an exit code, on in-process stores
 * (io.openStore): a store that cannot scan, and a store that fails mid-command.
 */

function capture(store: RowStore) {
  const out: string[] = [];
  const err: string[] = [];
  return {
    io: {
      out: (t: string) => void out.push(t),
      err: (t: string) => void err.push(t),
      openStore: async () => ({ store, target: 'test store', close: async () => {} }),
    },
    out: () => out.join(''),
    err: () => err.join(''),
  };
}

describe('runCli exit codes from inside a command', () => {
  it('a store that cannot scan: locks, gc and dump of a whole table exit 2 and say so', async () => {
    const inner = new MemoryStore();
    const noScan: RowStore = {
      name: 'no-scan',
      capabilities: { ...inner.capabilities, orderedScan: false },
      read: (t, k) => inner.read(t, k),
      checkAndSet: (r) => inner.checkAndSet(r),
      incrementCounter: (n, d) => inner.incrementCounter(n, d),
      scanNotified: (t, o) => inner.scanNotified(t, o),
      close: () => inner.close(),
    };
    for (const argv of [
      ['locks', 't'],
      ['gc', 't', '--dry-run'],
      ['dump', 't'],
    ]) {
      const run = capture(noScan);
      expect(await runCli(argv, run.io), argv.join(' ')).toBe(2);
      expect(run.err()).toContain('cannot scan rows in key order');
    }
  });

  it('a store that fails mid-command exits 3, naming the command and the store', async () => {
    const failing: RowStore = {
      ...new MemoryStore(),
      name: 'failing',
      capabilities: new MemoryStore().capabilities,
      read: async () => {
        throw new Error('connection reset');
      },
      checkAndSet: async () => {
        throw new Error('connection reset');
      },
      close: async () => {},
    };
    const run = capture(failing);
    expect(await runCli(['inspect', 't', 'r'], run.io)).toBe(3);
    expect(run.err()).toContain('inspect failed: connection reset (test store)');
  });

  /** The memory store, with every write to row `failOn` of table t failing ('no'). */
  function failingWritesTo(inner: MemoryStore, failOn: () => string | undefined): RowStore {
    const fail = (r: CasRequest) => {
      if (r.table === 't' && r.key === failOn()) throw new StoreError(`write to ${r.key} refused`, 'no');
    };
    return new Proxy(inner, {
      get(target, name, receiver) {
        const value = Reflect.get(target, name, receiver);
        if (name === 'checkAndSet')
          return async (r: CasRequest) => {
            fail(r);
            return target.checkAndSet(r);
          };
        if (name === 'checkAndSetMany')
          return async (rs: readonly CasRequest[]) => {
            rs.forEach(fail);
            return target.checkAndSetMany(rs);
          };
        return typeof value === 'function' ? value.bind(target) : value;
      },
    });
  }

  it('gc that fails part way says what it freed before the failure, then exits as the failure does', async () => {
    const inner = new MemoryStore();
    const db = new Percolator({ store: inner, gc: { inlineHistoryBytes: 4096 } });
    for (let i = 0; i < 4; i++)
      await db.transact(async (tx) => {
        for (const r of ['r0', 'r1', 'r2', 'r3']) tx.set('t', r, 'v', `value ${i}`);
      });
    await db.close();
    const run = capture(failingWritesTo(inner, () => 'r2'));
    const argv = ['gc', 't', '--retention', '0ms', '--max-versions', '1'];
    expect(await runCli(argv, run.io)).toBe(3);
    // Rows go in key order: r0 and r1 were pruned (three versions each), then r2 failed.
    expect(run.err()).toContain('gc t: 2 rows done before the failure, the last r1');
    expect(run.err()).toContain('freed 6 versions in head rows');
    expect(run.err()).toContain('gc failed: write to r2 refused (test store)');
    expect(run.out()).toBe('');
    // And what it says was done is done: r0 and r1 keep one version, r2 and r3 all four.
    const { inspectHeadRow } = await import('@percolator/core');
    const versions = async (r: string) =>
      inspectHeadRow((await inner.read('t', r))!.state).cells[0]!.writes.length;
    expect([await versions('r0'), await versions('r1'), await versions('r2'), await versions('r3')]).toEqual([
      1, 1, 4, 4,
    ]);
    // A failure before any row was done is the failure alone.
    const first = capture(failingWritesTo(inner, () => 'r2'));
    expect(
      await runCli(['gc', 't', '--row', 'r2', '--retention', '0ms', '--max-versions', '1'], first.io),
    ).toBe(3);
    expect(first.err()).not.toContain('before the failure');
  });

  it('resolve that fails part way lists the locks it settled before the failure', async () => {
    const inner = new MemoryStore();
    // Their clock 5 s behind the CLI's: their locks (TTL 1 s) are long expired to it.
    const clock = () => Date.now() - 5000;
    // Two dead transactions, each with a lock on row x (columns a and b) and its primary
    // elsewhere (rows p1, p2), neither committed: both are rolled back by a resolve.
    for (const [column, primary] of [
      ['a', 'p1'],
      ['b', 'p2'],
    ] as const) {
      const crashing = new Percolator({
        store: inner,
        clock,
        lockTtlMs: 1000,
        onePhaseMaxRows: 1,
        hooks: {
          onCommitStep: (e) => {
            if (e.step === 'beforeCommitPrimary') throw new ClientCrash('stopped before the commit point');
          },
        },
      });
      const tx = await crashing.begin();
      tx.set('t', primary, 'v', 'new');
      tx.set('t', 'x', column, 'new');
      await tx.commit().catch((e: unknown) => expect(e).toBeInstanceOf(ClientCrash));
      await crashing.close();
    }
    // The second lock's primary (p2) cannot be written: its rollback fails.
    const run = capture(failingWritesTo(inner, () => 'p2'));
    expect(await runCli(['resolve', 't', 'x'], run.io)).toBe(3);
    expect(run.err()).toMatch(
      /^t\/x: 1 lock settled before the failure\n {2}rolled back {4}a \(startTs \d+, primary t\/p1\/v\)/,
    );
    expect(run.err()).toContain('resolve failed: write to p2 refused (test store)');
  });

  it('a row no reader can decode: locks, gc, dump and inspect exit 1 and name the row', async () => {
    // Found in review: the message named a row format and nothing else, and the exit code
    // was 3 ("the store failed"), which a script retries; retrying never fixes it.
    const store = new MemoryStore();
    const db = new Percolator({ store });
    await db.transact(async (tx) => {
      tx.set('t', 'good', 'v', '1');
      tx.set('t', 'zzz', 'v', '1');
    });
    await db.close();
    const row = await store.read('t', 'zzz');
    const bad = new Uint8Array([103, ...new Uint8Array(16)]); // format 103: unknown
    expect((await store.checkAndSet({ table: 't', key: 'zzz', expected: row!.version, state: bad })).ok).toBe(
      true,
    );
    for (const argv of [
      ['locks', 't'],
      ['gc', 't', '--dry-run'],
      ['dump', 't'],
      ['inspect', 't', 'zzz'],
    ]) {
      const run = capture(store);
      expect(await runCli(argv, run.io), argv.join(' ')).toBe(1);
      expect(run.err(), argv.join(' ')).toContain('head row t/zzz');
      expect(run.err(), argv.join(' ')).toMatch(/format 103/);
    }
  });

  it('missingTable: a missing table or function, not a refused or timed-out connection', () => {
    const wrapped = (code: string) =>
      new StoreError('open failed', 'no', { cause: Object.assign(new Error('x'), { code }) });
    expect(missingTable(wrapped('42P01'))).toBe(true);
    expect(missingTable(wrapped('ER_NO_SUCH_TABLE'))).toBe(true);
    expect(missingTable(wrapped('ECONNREFUSED'))).toBe(false);
    expect(missingTable(wrapped('ETIMEDOUT'))).toBe(false);
    expect(missingTable(new Error('timeout'))).toBe(false);
  });

  it('an option given twice, or a duration past 100 years, is bad usage (exit 2) naming the option', async () => {
    // Found in review: the last of two --retention won (0 s would prune everything), and a
    // huge --older-than failed inside the library with its setting's name.
    const store = new MemoryStore();
    for (const [argv, message] of [
      [['gc', 't', '--dry-run', '--row', 'a', '--row', 'b'], /--row is given more than once/],
      [
        ['gc', 't', '--retention=1h', '--max-versions', '3', '--retention', '0s'],
        /--retention is given more than once/,
      ],
      [['locks', 't', '--older-than', '99999999999999d'], /too long: at most 100 years/],
    ] as const) {
      const run = capture(store);
      expect(await runCli([...argv], run.io), argv.join(' ')).toBe(2);
      expect(run.err()).toMatch(message);
      expect(run.err()).not.toMatch(/scanLocks|olderThanMs/);
    }
  });
});
