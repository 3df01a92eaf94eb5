/**
 * The `percolator` bin as scripts meet it: a real child process, run through an installed
 * symlink (node_modules/.bin/percolator -> the package's dist/bin.js), checked for its
 * --help texts and exit codes. Needs `pnpm build` (the test command builds first).
 */
import { execFile } from 'node:child_process';
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { ClientCrash, Percolator } from '@percolator/core';
import { createRedisStore } from '@percolator/redis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { COMMANDS } from '../src/cli.js';
import { POSTGRES_URL, REDIS_URL, uniqueNamespace } from './backends.js';

const packageDir = fileURLToPath(new URL('..', import.meta.url));
const manifest = JSON.parse(readFileSync(join(packageDir, 'package.json'), 'utf8')) as {
  bin: Record<string, string>;
};
const exec = promisify(execFile);

let project: string;
let bin: string;

beforeAll(() => {
  const target = manifest.bin.percolator;
  expect(target, 'package.json declares the percolator bin').toBeDefined();
  if (!existsSync(join(packageDir, target!)))
    throw new Error(`${target} is not built: run \`pnpm build\` first (the test command does)`);
  project = mkdtempSync(join(tmpdir(), 'percolator-cli-bin-'));
  const linked = join(project, 'node_modules', '@percolator', 'cli');
  mkdirSync(dirname(linked), { recursive: true });
  symlinkSync(packageDir, linked, 'dir');
  bin = join(project, 'node_modules', '.bin', 'percolator');
  mkdirSync(dirname(bin), { recursive: true });
  symlinkSync(relative(dirname(bin), join(linked, target!)), bin);
});

afterAll(() => {
  if (project) rmSync(project, { recursive: true, force: true });
});

async function percolator(...args: string[]): Promise<{ code: number; out: string; err: string }> {
  try {
    const { stdout, stderr } = await exec(process.execPath, [bin, ...args], {
      cwd: project,
      timeout: 60_000,
    });
    return { code: 0, out: stdout, err: stderr };
  } catch (error) {
    const e = error as { code?: number; stdout?: string; stderr?: string };
    if (typeof e.code !== 'number') throw error;
    return { code: e.code, out: e.stdout ?? '', err: e.stderr ?? '' };
  }
}

describe('the percolator bin', () => {
  it('--help lists every command and the exit codes (exit 0); no command is a usage error (exit 2)', async () => {
    const help = await percolator('--help');
    expect(help.code).toBe(0);
    for (const name of Object.keys(COMMANDS)) expect(help.out).toContain(`  ${name} `);
    expect(help.out).toContain('Exit codes: 0 done');
    const none = await percolator();
    expect(none.code).toBe(2);
    expect(none.err).toContain('usage: percolator <command>');
  });

  it('every command has its own --help (exit 0), also after "--" as pnpm passes it', async () => {
    const names = Object.keys(COMMANDS);
    const runs = await Promise.all(names.map((name) => percolator('--', name, '--help')));
    for (const [i, name] of names.entries()) {
      const { code, out } = runs[i]!;
      expect(code, name).toBe(0);
      expect(out).toContain(`usage: percolator ${name}`);
      expect(out).toContain('Exit codes:');
    }
  });

  it('bad arguments exit 2 and say what is wrong, before connecting to anything', async () => {
    const cases: [string[], string][] = [
      [['frobnicate'], 'unknown command "frobnicate"'],
      [['inspect', 'accounts'], 'wrong number of arguments for inspect'],
      [['locks', 'accounts', '--backend', 'redis', '--older-than', 'soon'], 'not a duration'],
      // A bare number is not read as milliseconds: 3600 meant as an hour would prune almost everything.
      [
        ['gc', 'accounts', '--backend', 'redis', '--retention', '3600', '--max-versions', '32'],
        'has no unit',
      ],
      [['locks', 'accounts', '--backend', 'redis', '--older-than', '60'], 'has no unit'],
      [['gc', 'accounts', '--backend', 'redis', '--dry-run', '--max-versions', '0x10'], 'digits only'],
      [['gc', 'accounts', '--backend', 'redis', '--dry-run', '--max-versions='], 'digits only'],
      // A run that writes states the deployment's policy.
      [['gc', 'accounts', '--backend', 'redis'], 'gc without --dry-run needs --retention and --max-versions'],
      [['gc', 'accounts', '--backend', 'redis', '--retention', '1h'], 'needs --max-versions'],
      // With --config the file alone says where each store is.
      [
        ['locks', 'accounts', '--config', '/nonexistent/deployment.json', '--namespace', 'app'],
        'leave out --namespace',
      ],
      [
        ['locks', 'accounts', '--config', '/nonexistent/deployment.json', '--region', 'eu-west-1'],
        'leave out --region',
      ],
      [['locks', 'accounts', '--backend', 'redis', '--bogus'], 'unknown option --bogus for locks'],
      [['locks', 'accounts', '--backend', 'oracle'], '--backend must be one of'],
      [['locks', 'accounts'], '--backend (or --config) is required'],
      [['locks', 'accounts', '--backend', 'memory'], 'the memory store lives inside one process'],
      [['locks', 'accounts', '--backend', 'redis', '--namespace', 'Bad-Name'], 'not a namespace name'],
      [
        ['gc', 'accounts', '--backend', 'redis', '--max-versions', '0'],
        '--max-versions must be an integer >= 1',
      ],
      [['inspect', '__internal', 'r', '--backend', 'redis', '--url', REDIS_URL], 'table'],
      [
        ['locks', 'accounts', '--config', '/nonexistent/deployment.json'],
        'cannot read composite config /nonexistent/deployment.json',
      ],
    ];
    const runs = await Promise.all(cases.map(([args]) => percolator(...args)));
    for (const [i, [args, message]] of cases.entries()) {
      const { code, err } = runs[i]!;
      expect(err, args.join(' ')).toContain(message);
      expect(code, args.join(' ')).toBe(2);
    }
  });

  it('output to a slow pipe is written whole before the process exits (process.exit drops what is queued)', async () => {
    const { spawn } = await import('node:child_process');
    const cli = join(packageDir, 'dist', 'cli.js');
    // A megabyte on stdout, then main() (--help: exit 0) exits the process.
    const script = `const { main } = await import(${JSON.stringify(cli)}); process.stdout.write('x'.repeat(1 << 20)); await main(['--help']);`;
    const child = spawn(process.execPath, ['--input-type=module', '-e', script], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    child.stdout.pause(); // a reader that is not ready yet
    await new Promise((r) => setTimeout(r, 300));
    let received = 0;
    child.stdout.on('data', (chunk: Buffer) => {
      received += chunk.length;
    });
    child.stdout.resume();
    const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
    expect(code).toBe(0);
    expect(received).toBeGreaterThan(1 << 20);
  });

  it("a reader that stops early (| head) closes the pipe: the exit code is the command's, no EPIPE crash", async () => {
    const { spawn } = await import('node:child_process');
    const cli = join(packageDir, 'dist', 'cli.js');
    const script = `const { main } = await import(${JSON.stringify(cli)}); process.stdout.write('y\\n'.repeat(1 << 20)); await main(['--help']);`;
    const child = spawn(process.execPath, ['--input-type=module', '-e', script], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let err = '';
    child.stderr.on('data', (chunk: Buffer) => {
      err += chunk.toString();
    });
    child.stdout.once('data', () => child.stdout.destroy());
    const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
    expect(err).not.toContain('EPIPE');
    expect(code).toBe(0);
  });

  it('an unreachable store exits 3, naming it', async () => {
    const { code, err } = await percolator(
      'locks',
      'accounts',
      '--backend',
      'redis',
      '--url',
      'redis://127.0.0.1:1',
    );
    expect(err).toContain('cannot open redis');
    expect(err).toContain('redis://127.0.0.1:1');
    expect(code).toBe(3);
  });

  it('what is not there exits 4: a namespace, a table with no rows, a row, a table no composite route covers', async () => {
    const ns = uniqueNamespace('absent');
    const namespace = await percolator(
      'locks',
      'accounts',
      '--backend',
      'postgres',
      '--url',
      POSTGRES_URL,
      '--namespace',
      ns,
    );
    expect(namespace.err).toContain(`namespace ${ns} not found`);
    expect(namespace.code).toBe(4);
    const redis = ['--backend', 'redis', '--url', REDIS_URL, '--namespace', ns];
    const table = await percolator('locks', 'no_such_table', ...redis);
    expect(table.err).toContain('holds no rows');
    expect(table.code).toBe(4);
    const row = await percolator('resolve', 'no_such_table', 'r1', ...redis);
    expect(row.err).toContain('is not stored');
    expect(row.code).toBe(4);
    const file = join(project, 'routes.json');
    writeFileSync(
      file,
      JSON.stringify({
        stores: { cache: { backend: 'redis', url: REDIS_URL, namespace: ns } },
        routes: [{ table: 'sessions', store: 'cache' }],
        counterStore: null,
      }),
    );
    const unrouted = await percolator('inspect', 'accounts', 'r1', '--config', file);
    expect(unrouted.err).toContain('has no route');
    expect(unrouted.code).toBe(4);
    // A composite whose SQL store has no such namespace: not found, as for one backend.
    writeFileSync(
      file,
      JSON.stringify({
        stores: { db: { backend: 'postgres', url: POSTGRES_URL, namespace: ns } },
        routes: [{ table: 'accounts', store: 'db' }],
        counterStore: 'db',
      }),
    );
    const missing = await percolator('locks', 'accounts', '--config', file);
    expect(missing.err).toContain(`store db: namespace ${ns} not found on postgres`);
    expect(missing.code).toBe(4);
    // A memory store in the file: the CLI would only see an empty store of its own.
    writeFileSync(
      file,
      JSON.stringify({
        stores: { m: { backend: 'memory' } },
        routes: [{ table: 'accounts', store: 'm' }],
        counterStore: 'm',
      }),
    );
    const memory = await percolator('locks', 'accounts', '--config', file);
    expect(memory.err).toContain('store m is a memory store');
    expect(memory.code).toBe(2);
    writeFileSync(file, JSON.stringify({ stores: {}, counterStore: null }));
    const bad = await percolator('inspect', 'accounts', 'r1', '--config', file);
    expect(bad.err).toContain('composite config: stores');
    expect(bad.code).toBe(2);
  });

  it('resolve leaves a live lock alone (exit 1); --wait waits for it to expire, as a reader does, then rolls it back (exit 0)', async () => {
    const namespace = uniqueNamespace('wait');
    const store = await createRedisStore({ url: REDIS_URL, namespace });
    try {
      const db = new Percolator({ store });
      await db.transact(async (tx) => tx.set('t', 'r', 'v', 'old'));
      const crashing = new Percolator({
        store,
        lockTtlMs: 3000, // long enough that the first resolve (a child process start) meets it live
        onePhaseMaxRows: 1, // two phases: the hook stops at one of their steps
        hooks: {
          onCommitStep: (e) => {
            if (e.step === 'beforeCommitPrimary') throw new ClientCrash();
          },
        },
      });
      // Two rows: a single-row transaction may commit in one CAS, with no lock to leave.
      await crashing
        .transact(
          async (tx) => {
            tx.set('t', 'r', 'v', 'new');
            tx.set('t', 's', 'v', 'new');
          },
          { maxAttempts: 1 },
        )
        .catch(() => undefined);
      const argv = ['--backend', 'redis', '--url', REDIS_URL, '--namespace', namespace];
      const live = await percolator('resolve', 't', 'r', ...argv);
      expect(live.out).toContain('left alone');
      expect(live.code).toBe(1);
      const waited = await percolator('resolve', 't', 'r', ...argv, '--wait', '30s', '--json');
      expect(waited.code, waited.err).toBe(0);
      expect(JSON.parse(waited.out)).toMatchObject([
        { column: 'v', isPrimary: true, outcome: { action: 'rolled-back' } },
      ]);
      expect(await db.transact(async (tx) => tx.getString('t', 'r', 'v'))).toBe('old');
      await db.close();
    } finally {
      await store.dropNamespace();
      await store.close();
    }
  });
});
