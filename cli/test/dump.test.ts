import { randomBytes } from 'node:crypto';
import { stopAt } from '@percolator/conformance';
import {
  ClientCrash,
  CompositeStore,
  MemoryStore,
  Percolator,
  type RowStore,
  SnapshotTooOldError,
} from '@percolator/core';
import { createPostgresStore } from '@percolator/postgres';
import { createRedisStore, listRedisNamespaces } from '@percolator/redis';
import { describe, expect, it, vi } from 'vitest';
import { runCli } from '../src/cli.js';
import { inspectRow } from '../src/commands.js';
import { type DumpedCell, type DumpSink, dumpCommand, dumpTable, dumpTo } from '../src/dump.js';
import { EXIT, NotFoundError } from '../src/errors.js';
import { onStore } from './backends.js';

/**
 * `percolator dump` / `inspect` (moved from the conformance CLI) against the real servers (PostgreSQL and
 * Redis at their local defaults), and the exported functions on the memory store: dump
 * shows exactly the committed values (never a stopped client's pending ones), inspect
 * shows the lock such a client left, and nothing there / bad usage exit 4 / 2 / 3.
 */

function io() {
  const out: string[] = [];
  const err: string[] = [];
  return {
    io: { out: (t: string) => void out.push(t), err: (t: string) => void err.push(t) },
    get out() {
      return out.join('');
    },
    get err() {
      return err.join('');
    },
  };
}

async function cli(argv: string[]) {
  const run = io();
  const code = await runCli(argv, run.io);
  return { code, out: run.out, err: run.err };
}

function jsonCells(text: string): DumpedCell[] {
  return JSON.parse(text) as DumpedCell[];
}

const fresh = () => `dump_${randomBytes(5).toString('hex')}`;
const TTL = 300;

const COMMITTED: DumpedCell[] = [
  { row: 'alice', column: 'balance', value: '10', encoding: 'utf8' },
  { row: 'alice', column: 'note', value: 'ff00', encoding: 'hex' },
  { row: 'bob', column: 'balance', value: '20', encoding: 'utf8' },
  { row: 'carol', column: 'balance', value: '30', encoding: 'utf8' },
  { row: 'dave', column: 'balance', value: '40', encoding: 'utf8' },
];

/**
 * Commits COMMITTED's values, then leaves two stopped clients behind:
 * - alice+bob: stopped before the primary's commit (both rows locked with 999, never committed);
 * - carol+dave: stopped right after it (committed as 31/41, dave's lock not yet rolled forward).
 */
async function fill(store: RowStore): Promise<void> {
  const db = new Percolator({ store });
  await db.transact(async (tx) => {
    tx.set('accounts', 'alice', 'balance', '10');
    tx.set('accounts', 'alice', 'note', new Uint8Array([0xff, 0x00]));
    tx.set('accounts', 'bob', 'balance', '20');
    tx.set('accounts', 'carol', 'balance', '30');
    tx.set('accounts', 'dave', 'balance', '40');
    tx.set('accounts', 'erin', 'balance', 'gone');
  });
  await db.transact(async (tx) => tx.delete('accounts', 'erin', 'balance'));
  await db.close();
  for (const [step, rows, value] of [
    ['beforeCommitPrimary', ['alice', 'bob'], '999'],
    ['afterCommitPrimary', ['carol', 'dave'], undefined],
  ] as const) {
    const crashing = new Percolator({
      store,
      lockTtlMs: TTL,
      onePhaseMaxRows: 1, // two phases: the hook stops at one of their steps
      hooks: { onCommitStep: stopAt({ step }) },
    });
    await expect(
      crashing.transact(
        async (tx) => {
          for (const row of rows) {
            const old = Number(await tx.getString('accounts', row, 'balance'));
            tx.set('accounts', row, 'balance', value ?? String(old + 1));
          }
        },
        { maxAttempts: 1 },
      ),
    ).rejects.toBeInstanceOf(ClientCrash);
    await crashing.close();
  }
}

/** What a reader sees once the stopped clients' locks are resolved. */
const RESOLVED: DumpedCell[] = COMMITTED.map((c) =>
  c.row === 'carol' ? { ...c, value: '31' } : c.row === 'dave' ? { ...c, value: '41' } : c,
);

interface Case {
  readonly backend: string[];
  open(namespace: string): Promise<RowStore & { dropNamespace(): Promise<void> }>;
}

const CASES: Record<string, Case> = {
  postgres: {
    backend: ['--backend', 'postgres'],
    open: (namespace) => createPostgresStore({ namespace }),
  },
  redis: {
    backend: ['--backend', 'redis'],
    open: (namespace) => createRedisStore({ namespace }),
  },
};

describe('dump / inspect on real servers', () => {
  for (const [name, c] of Object.entries(CASES)) {
    it(`${name}: inspect shows a stopped client's locks; dump shows exactly the committed values`, async () => {
      const namespace = fresh();
      const store = await c.open(namespace);
      const args = [...c.backend, '--namespace', namespace];
      try {
        await fill(store);

        // inspect: the raw head rows, locks and all (and it resolves nothing).
        const alice = await cli(['inspect', 'accounts', 'alice', ...args, '--json']);
        expect(alice.err).toBe('');
        expect(alice.code).toBe(0);
        const view = JSON.parse(alice.out);
        expect(view).toMatchObject({ table: 'accounts', row: 'alice' });
        const balance = view.cells.find((x: { column: string }) => x.column === 'balance');
        expect(balance.lock).toMatchObject({
          kind: 'put',
          ttlMs: TTL,
          primary: { table: 'accounts', row: 'alice', column: 'balance' },
          secondaries: [{ table: 'accounts', row: 'bob' }],
        });
        expect(balance.lock.ageMs).toBeGreaterThanOrEqual(0);
        expect(balance.writes).toHaveLength(1);
        expect(balance.writes[0]).toMatchObject({ kind: 'put', value: 'inline', inlineBytes: 2 });
        // A blind write that commits in one step: its start and commit timestamp are one drawn value.
        expect(balance.writes[0].commitTs).toBeGreaterThanOrEqual(balance.writes[0].startTs);
        expect(balance.lock.startTs).toBeGreaterThan(balance.writes[0].commitTs);
        // The pending "999" (3 bytes) and the committed "10" (2 bytes) are both in the head row.
        expect(balance.inlineBytes).toBe(5);

        const dave = await cli(['inspect', 'accounts', 'dave', ...args]);
        expect(dave.code).toBe(0);
        expect(dave.out).toMatch(/^accounts\/dave: head row version \S+, \d+ B, 1 cell$/m);
        expect(dave.out).toMatch(/lock {6}startTs \d+, put, primary accounts\/carol\/balance\n/);
        expect(dave.out).toMatch(/\(ttl 300 ms/);
        expect(dave.out).toContain('transaction: committed at');
        expect(dave.out).toMatch(/write {5}commitTs \d+, startTs \d+, put, value inline \(2 B/);
        expect(dave.out).toContain(`namespace ${namespace}`);

        // dump: the committed values only. alice/bob's locks are rolled back (never shown),
        // carol/dave's commit is rolled forward; erin's value was deleted.
        const json = await cli(['dump', 'accounts', ...args, '--json']);
        expect(json.err).toBe('');
        expect(json.code).toBe(0);
        expect(jsonCells(json.out)).toEqual(RESOLVED);
        expect(json.out).not.toContain('999');

        // The reader resolved the locks exactly as the protocol does: a rollback record on
        // alice, no lock left on dave.
        const after = JSON.parse((await cli(['inspect', 'accounts', 'alice', ...args, '--json'])).out);
        const cell = after.cells.find((x: { column: string }) => x.column === 'balance');
        expect(cell.lock).toBeUndefined();
        expect(cell.writes.map((w: { kind: string }) => w.kind)).toEqual(['rollback', 'put']);
        const daveAfter = JSON.parse((await cli(['inspect', 'accounts', 'dave', ...args, '--json'])).out);
        expect(daveAfter.cells[0].lock).toBeUndefined();

        const text = await cli(['dump', 'accounts', ...args]);
        expect(text.code).toBe(0);
        expect(text.out).toContain('accounts (latest committed values)');
        expect(text.out).toContain(`namespace ${namespace}`);
        expect(text.out).toMatch(
          /^alice\n {2}balance {2}"10"\n {2}note {2}0xff00\nbob\n {2}balance {2}"20"\n/m,
        );
        expect(text.out).toMatch(/^4 rows, 5 values$/m);

        const one = await cli(['dump', 'accounts', ...args, '--row', 'bob', '--json']);
        expect(one.code).toBe(0);
        expect(jsonCells(one.out)).toEqual(RESOLVED.filter((x) => x.row === 'bob'));
        const limited = await cli(['dump', 'accounts', ...args, '--limit', '2', '--json']);
        expect(limited.code).toBe(0);
        expect(jsonCells(limited.out)).toEqual(RESOLVED.filter((x) => x.row === 'alice' || x.row === 'bob'));

        // Nothing there: exit 4.
        for (const argv of [
          ['dump', 'nosuch', ...args],
          ['dump', 'accounts', ...args, '--row', 'nobody'],
          ['dump', 'accounts', ...args, '--row', 'erin'], // stored, but its only value was deleted
          ['inspect', 'accounts', 'nobody', ...args],
          ['inspect', 'nosuch', 'alice', ...args],
        ]) {
          const result = await cli(argv);
          expect(result.code, argv.join(' ')).toBe(4);
          expect(result.out).toBe('');
          expect(result.err).toMatch(/holds no rows|is not stored|has no committed values/);
        }
      } finally {
        await store.dropNamespace();
        await store.close();
      }
    });
  }

  it('a namespace that does not exist: exit 4, and nothing is created', async () => {
    const namespace = fresh();
    const pg = await cli(['dump', 'accounts', '--backend', 'postgres', '--namespace', namespace]);
    expect(pg.code).toBe(4);
    expect(pg.err).toContain(`namespace ${namespace} not found`);
    const redis = await cli(['dump', 'accounts', '--backend', 'redis', '--namespace', namespace]);
    expect(redis.code).toBe(4);
    expect(redis.err).toContain('table accounts holds no rows');
    // Not even the oracle counter: no timestamp is drawn when there is nothing to read.
    expect((await listRedisNamespaces({})).map((n) => n.namespace)).not.toContain(namespace);
  });

  it('bad usage exits 2, unreachable stores 3', async () => {
    for (const argv of [
      ['dump'],
      ['dump', '--backend', 'postgres'],
      ['dump', 'a', 'b', '--backend', 'postgres'],
      ['dump', 'accounts'],
      ['dump', 'accounts', '--backend', 'memory'],
      ['dump', 'accounts', '--backend', 'nope'],
      ['dump', '__v.accounts', '--backend', 'postgres'],
      ['dump', 'bad name', '--backend', 'postgres'],
      ['dump', 'accounts', '--backend', 'postgres', '--limit', '0'],
      ['dump', 'accounts', '--backend', 'postgres', '--limit', 'x'],
      ['dump', 'accounts', '--backend', 'postgres', '--namespace', 'Bad'],
      ['dump', 'accounts', '--backend', 'postgres', '--bogus'],
      ['inspect', 'accounts', '--backend', 'postgres'],
      ['inspect', 'accounts', 'alice', 'x', '--backend', 'postgres'],
      ['inspect', 'accounts', 'alice', '--backend', 'postgres', '--row', 'bob'],
      ['inspect', 'accounts', 'alice', '--backend', 'postgres', '--limit', '1'],
    ]) {
      if (argv.length === 0) continue;
      const result = await cli(argv);
      expect(result.code, argv.join(' ')).toBe(2);
      expect(result.err).toMatch(/usage: percolator (dump|inspect)|usage: percolator <command>/);
      expect(result.out).toBe('');
    }
    for (const argv of [
      ['dump', 'accounts', '--backend', 'redis', '--url', 'redis://127.0.0.1:1'],
      [
        'inspect',
        'accounts',
        'alice',
        '--backend',
        'postgres',
        '--url',
        'postgres://postgres@127.0.0.1:1/test',
      ],
    ]) {
      const result = await cli(argv);
      expect(result.code, argv.join(' ')).toBe(3);
      expect(result.err).toMatch(/cannot open (redis|postgres)/);
    }
  });

  it('--help says it is read-only, and the main usage lists the commands', async () => {
    const help = await cli(['dump', '--help']);
    expect(help.code).toBe(0);
    expect(help.out).toContain('never committed');
    expect(help.out).toContain('usage: percolator dump TABLE');
    const main = await cli(['--help']);
    expect(main.out).toContain('  dump TABLE');
    expect(main.out).toContain('  inspect TABLE ROW');
  });
});

describe('dumpTable / inspectRow on the memory store', () => {
  it('dumps exactly the committed values and inspects the lock a stopped client left', async () => {
    const store = new MemoryStore();
    await fill(store);
    const lock = (await inspectRow(store, 'accounts', 'bob'))!.cells[0]!.lock!;
    expect(lock).toMatchObject({ kind: 'put', primary: { row: 'alice', column: 'balance' }, ttlMs: TTL });
    expect(await dumpTable(store, 'accounts')).toEqual(RESOLVED);
    expect(await dumpTable(store, 'accounts', { row: 'dave' })).toEqual(
      RESOLVED.filter((x) => x.row === 'dave'),
    );
    expect((await inspectRow(store, 'accounts', 'bob'))!.cells[0]!.lock).toBeUndefined();
    await expect(dumpTable(store, 'nosuch')).rejects.toBeInstanceOf(NotFoundError);
    await expect(dumpTable(store, 'accounts', { row: 'erin' })).rejects.toBeInstanceOf(NotFoundError);
    await expect(inspectRow(store, 'accounts', 'nobody')).rejects.toBeInstanceOf(NotFoundError);
    await store.close();
  });

  it('a value that moved to a version row: inspect names the row, dump reads it', async () => {
    const store = new MemoryStore();
    const db = new Percolator({ store, gc: { inlineHistoryBytes: 0 } });
    await db.transact(async (tx) => tx.set('t', 'r', 'c', 'old'));
    await db.transact(async (tx) => tx.set('t', 'r', 'c', 'new'));
    await db.tidy('t', 'r', { force: true });
    await db.close();
    const writes = (await inspectRow(store, 't', 'r'))!.cells[0]!.writes;
    expect(writes[0]).toMatchObject({ value: 'inline' });
    expect(writes[1]).toMatchObject({ value: 'moved', versionRow: { table: '__v.t' } });
    expect(await dumpTable(store, 't')).toEqual([{ row: 'r', column: 'c', value: 'new', encoding: 'utf8' }]);
    await store.close();
  });
});

describe('dump on a composite deployment without a counter', () => {
  it('says it needs the deployment\'s counter (not "pass an oracle", which a CLI user cannot), and reads nothing', async () => {
    const inner = new MemoryStore();
    const db = new Percolator({ store: inner });
    await db.transact(async (tx) => tx.set('accounts', 'a', 'balance', '1'));
    await db.close();
    const store = new CompositeStore({ default: inner, counterStore: null });
    const result = await onStore(store, 'dump', 'accounts');
    expect(result.code).toBe(EXIT.usage);
    expect(result.out).toBe('');
    expect(result.err).toContain("a timestamp from the deployment's counter");
    expect(result.err).toContain('counterStore: null');
    expect(result.err).not.toContain('pass an oracle');
    // inspect, which it points at, works there.
    expect((await onStore(store, 'inspect', 'accounts', 'a')).code).toBe(0);
  });
});

describe('dump streams its output', () => {
  /** 1,200 rows of two columns (one value is 200 bytes of hex): several scan pages and output chunks. */
  async function bigTable(): Promise<{ store: MemoryStore; scans: () => number }> {
    const store = new MemoryStore();
    const db = new Percolator({ store });
    for (let from = 0; from < 1200; from += 100) {
      await db.transact(async (tx) => {
        for (let i = from; i < from + 100; i++) {
          const row = `r${String(i).padStart(5, '0')}`;
          tx.set('big', row, 'name', `row ${i} "quoted" \u00e9`);
          tx.set(
            'big',
            row,
            'blob',
            new Uint8Array(100).fill(i % 256).map((b, j) => (j === 0 ? 0xff : b)),
          );
        }
      });
    }
    await db.close();
    let scans = 0;
    const scan = store.scan.bind(store);
    store.scan = (table, options) => {
      scans++;
      return scan(table, options);
    };
    return { store, scans: () => scans };
  }

  /** A sink that records each write and the scan calls made before it. */
  function recordingSink(scans: () => number) {
    const writes: { text: string; scansBefore: number }[] = [];
    let closed = false;
    let full = false;
    let release: (() => void) | undefined;
    const sink: DumpSink = {
      write: (text) => {
        writes.push({ text, scansBefore: scans() });
        return !full;
      },
      drained: () => new Promise<void>((resolve) => (release = resolve)),
      closed: () => closed,
    };
    return {
      sink,
      writes,
      text: () => writes.map((w) => w.text).join(''),
      close: () => (closed = true),
      fill: (value: boolean) => (full = value),
      release: () => release?.(),
    };
  }

  it('writes exactly what the collected dump prints, text and --json, while it is still scanning', async () => {
    const { store, scans } = await bigTable();
    const collected = await dumpCommand(store, { table: 'big' });
    const target = 'the test store';
    for (const json of [false, true]) {
      const before = scans();
      const out = recordingSink(scans);
      expect(await dumpTo(store, { table: 'big' }, out.sink, { json, target })).toBe(EXIT.ok);
      expect(out.text()).toBe(
        json ? `${JSON.stringify(collected.data, null, 2)}\n` : `${collected.text}\n  (${target})\n`,
      );
      // More than one write, the first before the scan reached its last page.
      expect(out.writes.length).toBeGreaterThan(2);
      expect(out.writes[0]!.scansBefore).toBeLessThan(scans());
      expect(scans() - before).toBeGreaterThan(2);
    }
    // The CLI writes as it goes too (several writes, not one at the end).
    let writes = 0;
    const streamed = await runCli(['dump', 'big'], {
      out: () => void writes++,
      err: () => undefined,
      openStore: async () => ({ store, target, close: async () => {} }),
    });
    expect({ streamed, writes: writes > 2 }).toEqual({ streamed: 0, writes: true });
    // Through the CLI: the same bytes as the collected text, with --full and --limit too.
    for (const extra of [[], ['--full'], ['--limit', '300'], ['--row', 'r00007']]) {
      const args = {
        table: 'big',
        ...(extra[0] === '--limit' ? { limit: 300 } : {}),
        ...(extra[0] === '--row' ? { row: 'r00007' } : {}),
        full: extra[0] === '--full',
      };
      const expected = await dumpCommand(store, args);
      const text = await onStore(store, 'dump', 'big', ...extra);
      expect(text).toEqual({ code: 0, out: `${expected.text}\n  (the test store)\n`, err: '' });
      const json = await onStore(store, 'dump', 'big', ...extra, '--json');
      expect(json).toEqual({ code: 0, out: `${JSON.stringify(expected.data, null, 2)}\n`, err: '' });
    }
    await store.close();
  });

  it('waits while the output is full, and stops reading once the reader has gone', async () => {
    const { store, scans } = await bigTable();
    const out = recordingSink(scans);
    out.fill(true);
    const done = dumpTo(store, { table: 'big' }, out.sink, { json: false, target: 't' });
    await vi.waitFor(() => expect(out.writes.length).toBe(1));
    // Full: nothing more is written (nor read beyond what the scan had in hand) until it drains.
    const scansWhileFull = scans();
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(out.writes.length).toBe(1);
    expect(scans()).toBe(scansWhileFull);
    // Drained: one more chunk, and it waits again.
    out.release();
    await vi.waitFor(() => expect(out.writes.length).toBe(2));
    // The reader goes away (a closed pipe): the dump ends there, exit 0, the rest unread.
    out.close();
    out.release();
    expect(await done).toBe(EXIT.ok);
    expect(out.writes.length).toBe(2);
    const scansClosed = scans();
    const whole = recordingSink(scans);
    await dumpTo(store, { table: 'big' }, whole.sink, { json: false, target: 't' });
    expect(whole.writes.length).toBeGreaterThan(3);
    expect(scansClosed).toBeLessThan(scans() - scansClosed);
    await store.close();
  });

  it('fails with a hint when its output waited longer than the writers keep history (a paused pager)', async () => {
    const { store, scans } = await bigTable();
    const out = recordingSink(scans);
    out.fill(true);
    const done = dumpTo(store, { table: 'big' }, out.sink, { json: false, target: 't' }).then(
      () => undefined,
      (e: unknown) => e,
    );
    await vi.waitFor(() => expect(out.writes.length).toBe(1));
    // Meanwhile writers that keep one version (retention 0) rewrite rows the dump has not read.
    const writer = new Percolator({ store, gc: { retentionMs: 0, maxVersionsPerCell: 1 } });
    for (let i = 0; i < 3; i++)
      await writer.transact(async (tx) => tx.set('big', 'r01100', 'name', `rewritten ${i}`));
    await writer.close();
    out.fill(false);
    out.release();
    const failure = await done;
    expect(failure).toBeInstanceOf(SnapshotTooOldError);
    expect((failure as Error).message).toContain('dump to a file, then read that');
    await store.close();
  });

  it('writes nothing for a table with no committed value: exit 4 as before', async () => {
    const store = new MemoryStore();
    const out = recordingSink(() => 0);
    await expect(
      dumpTo(store, { table: 'none' }, out.sink, { json: true, target: 't' }),
    ).rejects.toBeInstanceOf(NotFoundError);
    expect(out.writes).toEqual([]);
    expect(await onStore(store, 'dump', 'none', '--json')).toMatchObject({ code: 4, out: '' });
    await store.close();
  });
});
