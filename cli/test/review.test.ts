/**
 * Findings of a new-user review, each as the user met it: names the CLI prints in JSON
 * (NUL, emoji) passed back with --json-names; the commit record's secondaries list that
 * read as unsettled work; long values in `dump`; `resolve --wait` telling to pass --wait;
 * parseArgs' own messages and usage text burying the error; connection errors naming the
 * driver's option; `notifications --json`'s wall time without an age; DynamoDB's
 * unreachable endpoint named nowhere.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ClientCrash, MemoryStore, Percolator, type RowStore } from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { inspectCommand, notificationsCommand, resolveCommand } from '../src/commands.js';
import { dumpCommand } from '../src/dump.js';
import { loadCompositeConfig, openBackend, openComposite } from '../src/open.js';
import { onStore } from './backends.js';

/** A client stopped after `step`: its locks stay (a dead client's, past `ttlMs` once that passes). */
async function stopped(
  store: RowStore,
  rows: string[],
  step: 'afterPrewrite' | 'afterCommitPrimary',
  lockTtlMs = 100,
): Promise<void> {
  const db = new Percolator({
    store,
    lockTtlMs,
    onePhaseMaxRows: 1,
    hooks: {
      onCommitStep: (e) => {
        if (e.step === step) throw new ClientCrash(`stopped at ${step}`);
      },
    },
  });
  const tx = await db.begin();
  for (const r of rows) tx.set('accounts', r, 'balance', 'new');
  await tx.commit().catch((e: unknown) => expect(e).toBeInstanceOf(ClientCrash));
  await db.close();
}

const ODD = 'a\u0000😀"b'; // NUL, an emoji and a quote: argv cannot carry the NUL
const ODD_JSON = JSON.stringify(ODD); // as the CLI prints it

describe('--json-names: any row key, as the CLI prints it', () => {
  it('inspect, resolve, locks, dump --row and gc --row address a key with NUL and emoji; plain arguments work unchanged', async () => {
    const store = new MemoryStore();
    await stopped(store, [ODD, 'plain'], 'afterPrewrite');
    const locks = await onStore(store, 'locks', 'accounts');
    expect(locks.code).toBe(1);
    expect(locks.out).toContain(ODD_JSON);

    // The printed form, taken as typed: not stored, and the message says what to do.
    const typed = await onStore(store, 'inspect', 'accounts', ODD_JSON);
    expect(typed.code).toBe(4);
    expect(typed.err).toContain('--json-names');

    const inspected = await onStore(store, 'inspect', '--json-names', '"accounts"', ODD_JSON, '--json');
    expect(inspected.code, inspected.err).toBe(0);
    expect(JSON.parse(inspected.out).row).toBe(ODD);

    await new Promise((r) => setTimeout(r, 150)); // past the dead client's TTL
    const resolved = await onStore(store, 'resolve', '--json-names', '"accounts"', ODD_JSON);
    expect(resolved.code, resolved.err).toBe(0);
    expect(resolved.out).toContain('rolled back');
    expect((await onStore(store, 'resolve', 'accounts', 'plain')).code).toBe(0);

    const dumped = await onStore(store, 'dump', '"accounts"', '--json-names', '--row', ODD_JSON, '--json');
    expect(dumped.code, dumped.err).toBe(4); // rolled back: no committed value, but found
    expect(dumped.err).toContain('has no committed values');
    const gc = await onStore(store, 'gc', '--json-names', '"accounts"', '--row', ODD_JSON, '--dry-run');
    expect(gc.code, gc.err).toBe(0);
    expect((await onStore(store, 'inspect', 'accounts', 'plain')).code).toBe(0);
  });

  it('with --json-names a name that is no JSON string literal is bad usage, naming the argument', async () => {
    const store = new MemoryStore();
    const r = await onStore(store, 'inspect', '--json-names', 'accounts', '"x"');
    expect(r.code).toBe(2);
    expect(r.err).toContain('--json-names: TABLE must be a JSON string literal');
    const help = await onStore(store, 'inspect', '--help');
    expect(help.out).toContain('--json-names');
    // Not for commands that take no names.
    expect((await onStore(store, 'namespaces', '--json-names', '--backend', 'redis')).code).toBe(2);
  });
});

describe('inspect on a committed primary', () => {
  it('says the secondaries list is kept until the next write and how to see what is still locked', async () => {
    const store = new MemoryStore();
    const db = new Percolator({ store, onePhaseMaxRows: 1 });
    await db.transact(async (tx) => {
      for (const r of ['alice', 'bob', 'carol']) tx.set('accounts', r, 'balance', '1');
    });
    await db.close();
    const primary = (await inspectCommand(store, { table: 'accounts', row: 'alice' })).data.cells[0]!;
    const row = primary.writes[0]?.secondaries?.length ? 'alice' : undefined;
    expect(row, 'alice is the primary').toBe('alice');
    const r = await inspectCommand(store, { table: 'accounts', row: 'alice' });
    expect(r.text).not.toContain('not yet settled');
    expect(r.text).toContain('secondaries: accounts/bob, accounts/carol');
    expect(r.text).toContain("until this cell's next write");
    expect(r.text).toContain('`percolator locks accounts` shows whether any is still locked');
    // --json keeps its field names.
    expect(r.data.cells[0]!.writes[0]!.secondaries).toHaveLength(2);
  });
});

describe('dump of a long value', () => {
  it('cuts the text at 256 bytes, saying the full size; --full prints it whole; --json is whole', async () => {
    const store = new MemoryStore();
    const db = new Percolator({ store });
    await db.transact(async (tx) => {
      tx.set('t', 'zeros', 'v', new Uint8Array(1 << 20));
      tx.set('t', 'hex', 'v', new Uint8Array(1000).fill(0xff));
      tx.set('t', 'emoji', 'v', '😀'.repeat(100)); // 400 bytes: cut between characters only
      tx.set('t', 'short', 'v', 'hello');
    });
    await db.close();
    const cut = await dumpCommand(store, { table: 't' });
    expect(cut.text.length).toBeLessThan(10_000);
    expect(cut.text).toContain('(cut: first 256 of 1048576 bytes; --full prints it whole)');
    expect(cut.text).toContain(`0x${'ff'.repeat(256)} ... (cut: first 256 of 1000 bytes`);
    expect(cut.text).toContain(`"${'😀'.repeat(64)}" ... (cut: first 256 of 400 bytes`);
    expect(cut.text).toContain('"hello"\n');
    const full = await onStore(store, 'dump', 't', '--full');
    expect(full.code).toBe(0);
    expect(full.out).toContain('\\u0000'.repeat(1 << 20));
    expect(full.out).not.toContain('(cut:');
    const json = await onStore(store, 'dump', 't', '--json');
    const zeros = (JSON.parse(json.out) as { row: string; value: string }[]).find((c) => c.row === 'zeros');
    expect(zeros?.value.length).toBe(1 << 20);
    expect((await onStore(store, 'dump', '--help')).out).toContain('--json always');
  });
});

describe('resolve --wait on a live lock', () => {
  it('says it waited, how long, and what to do next', async () => {
    const store = new MemoryStore();
    await stopped(store, ['alice', 'bob'], 'afterPrewrite', 60_000);
    const waited = await resolveCommand(store, { table: 'accounts', row: 'bob', waitMs: 300 });
    expect(waited.code).toBe(1);
    expect(waited.text).toContain('still live after waiting 300 ms');
    expect(waited.text).toContain('a longer --wait');
    expect(waited.text).not.toContain('pass --wait');
    const once = await resolveCommand(store, { table: 'accounts', row: 'bob' });
    expect(once.text).toContain('retry later or pass --wait');
  });
});

describe('usage errors', () => {
  const store = new MemoryStore();
  it('a value starting with "-" is checked as the option value it is, not parseArgs\' "ambiguous"', async () => {
    for (const [argv, message] of [
      [['locks', 'accounts', '--older-than', '-5s'], '--older-than: not a duration: "-5s"'],
      [['gc', 't', '--dry-run', '--max-versions', '-1'], '--max-versions must be an integer >= 1'],
      [
        ['dump', 't', '--row', '-x'],
        '--row -x: a value that starts with "-" is written joined to its option, --row=-x',
      ],
      [
        ['dump', 't', '--row', '--limit', '3'],
        '--row needs a value (the next argument, --limit, is an option)',
      ],
      [['dump', 't', '--limit'], '--limit needs a value'],
      [['dump', 't', '--json=yes'], '--json takes no value'],
      [
        ['inspect', 't', '-5'],
        'unknown option -5 for inspect (an argument that starts with "-" goes after "--"',
      ],
      [
        // parseArgs names only the first letter of a key like "-dash" (found by a new user).
        ['inspect', 't', '-dash'],
        'unknown option -d (in -dash) for inspect (an argument that starts with "-" goes after "--", at the end: percolator inspect ... -- -dash)',
      ],
      [
        ['inspect', 't', '--', '-5', '--backend', 'redis'],
        'wrong number of arguments for inspect: it takes TABLE ROW, got 4 ("t", "-5", "--backend", "redis") (everything after "--" is an argument, options too: put options before it)',
      ],
    ] as const) {
      const r = await onStore(store, ...argv);
      expect(r.code, argv.join(' ')).toBe(2);
      expect(r.err, argv.join(' ')).toContain(message);
      expect(r.err).not.toMatch(/ambiguous|Did you forget/);
    }
  });

  it('print the error, the one-line usage and where the rest is, not the whole help', async () => {
    const r = await onStore(store, 'locks', 'accounts', '--older-than', 'soon');
    expect(r.err).toBe(
      '--older-than: not a duration: "soon" (e.g. 30s, 500ms, 5m, 1h)\n' +
        'usage: percolator locks TABLE [--older-than DURATION] [--json-names] [connection options]\n' +
        'run `percolator locks --help` for more\n',
    );
    const unknown = await onStore(store, 'frobnicate');
    expect(unknown.code).toBe(2);
    expect(unknown.err.split('\n').length).toBeLessThan(4);
    // The whole text for --help and for no command at all.
    expect((await onStore(store)).err).toContain('Exit codes:');
    expect((await onStore(store, 'locks', '--help')).out).toContain('Exit codes:');
  });
});

describe('notifications --json', () => {
  it('has the age of the oldest change (ageMs) beside its wall time (sinceMs)', async () => {
    const store = new MemoryStore();
    const db = new Percolator({ store, observedColumns: [{ table: 'docs', column: 'body' }] });
    await db.transact(async (tx) => tx.set('docs', 'd1', 'body', 'x'));
    await db.close();
    const now = Date.now() + 5000;
    const r = await notificationsCommand(store, { tables: ['docs'], observer: 'indexer', now: () => now });
    const oldest = r.data[0]!.oldest;
    expect(oldest.sinceMs).toBeGreaterThan(1_000_000_000_000);
    expect(oldest.ageMs).toBe(now - oldest.sinceMs!);
    expect(oldest.ageMs).toBeGreaterThanOrEqual(5000);
    expect(r.text).toContain(`${oldest.ageMs} ms ago`);
  });
});

describe('connection errors name what the user passed', () => {
  it('--url, not the driver option (PostgreSQL, MariaDB); the password stays hidden', async () => {
    for (const backend of ['postgres', 'mysql'] as const) {
      const url = `${backend}://root:s3cret@127.0.0.1:5999/test`;
      const error = await openBackend({ backend, url }).then(
        () => undefined,
        (e: unknown) => e as Error,
      );
      expect(error?.message).toContain('from --url)');
      expect(error?.message).toContain(`cannot open ${backend} namespace percolator:`);
      expect(error?.message).not.toMatch(/connectionString|uri option|s3cret/);
    }
  });

  it('DynamoDB: an unreachable endpoint is named, with where it came from', async () => {
    const error = await openBackend({
      backend: 'dynamodb',
      url: 'http://127.0.0.1:8999',
      namespace: 'app',
    }).then(
      () => undefined,
      (e: unknown) => e as Error,
    );
    expect(error?.message).toContain('cannot open dynamodb namespace app:');
    expect(error?.message).toContain(
      '(connecting to http://127.0.0.1:8999 table percolator_test, from --url)',
    );
  });

  it('a composite config: an unset urlEnv is said once; a store that cannot be reached names its field', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'percolator-review-'));
    const file = join(dir, 'deployment.json');
    writeFileSync(
      file,
      JSON.stringify({
        stores: {
          pg: { backend: 'postgres', urlEnv: 'PERCOLATOR_REVIEW_UNSET_URL', namespace: 'app' },
          cache: { backend: 'redis', url: 'redis://127.0.0.1:6379', namespace: 'app' },
        },
        default: 'pg',
        counterStore: 'pg',
      }),
    );
    delete process.env.PERCOLATOR_REVIEW_UNSET_URL;
    const config = await loadCompositeConfig(file);
    const unset = await openComposite(config).then(
      () => undefined,
      (e: unknown) => e as Error,
    );
    expect(unset?.message).toBe(
      'composite config: stores.pg.urlEnv: the environment variable PERCOLATOR_REVIEW_UNSET_URL is not set',
    );
    process.env.PERCOLATOR_REVIEW_UNSET_URL = 'postgres://postgres:s3cret@127.0.0.1:5999/test';
    try {
      const unreachable = await openComposite(config).then(
        () => undefined,
        (e: unknown) => e as Error,
      );
      expect(unreachable?.message).toContain('from PERCOLATOR_REVIEW_UNSET_URL (stores.pg.urlEnv))');
      expect(unreachable?.message).not.toContain('s3cret');
    } finally {
      delete process.env.PERCOLATOR_REVIEW_UNSET_URL;
    }
  });
});

describe('resolve --wait on a lock whose owner is alive (found by an operator)', () => {
  it('says the owner refreshed it while it waited, instead of "run again with a longer --wait"', async () => {
    const store = new MemoryStore();
    let open!: () => void;
    const gate = new Promise<void>((resolve) => (open = resolve));
    let paused!: () => void;
    const atPause = new Promise<void>((resolve) => (paused = resolve));
    const owner = new Percolator({
      store,
      lockTtlMs: 1500,
      onePhaseMaxRows: 1,
      hooks: {
        onCommitStep: async (e) => {
          if (e.step !== 'beforeCommitPrimary') return;
          paused();
          await gate;
        },
      },
    });
    const commit = owner.transact(async (tx) => {
      tx.set('t', 'a', 'v', '1');
      tx.set('t', 'b', 'v', '1');
    });
    await atPause;
    const result = await onStore(store, 'resolve', 't', 'b', '--wait', '2s');
    expect(result.code).toBe(1);
    expect(result.out).toContain("its owner is alive: its heartbeat refreshed the primary's lock meanwhile");
    expect(result.out).not.toContain('run again with a longer --wait');
    open();
    await commit;
    await owner.close();
  });
});
