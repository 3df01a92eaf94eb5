import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm, symlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { isMainModule } from '../src/cli.js';
import { loadDriver } from '../src/drivers.js';

/**
 * The CLI as a process: started through links the way an installed bin is, and stopped
 * with SIGINT / SIGTERM. These run the built files (`pnpm build` first; `pnpm test` does).
 */
const dist = (file: string) => fileURLToPath(new URL(`../dist/${file}`, import.meta.url));

interface Exit {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly stdout: string;
  readonly stderr: string;
}

function start(args: readonly string[]): { child: ChildProcess; exit: Promise<Exit>; stderr: () => string } {
  const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (c: Buffer) => {
    stdout += c.toString();
  });
  child.stderr!.on('data', (c: Buffer) => {
    stderr += c.toString();
  });
  const exit = new Promise<Exit>((resolve) => {
    child.on('close', (code, signal) => resolve({ code, signal, stdout, stderr }));
  });
  return { child, exit, stderr: () => stderr };
}

/** Resolves once `pattern` shows on the child's stderr; rejects if it exits first or after `ms`. */
async function waitFor(
  run: ReturnType<typeof start>,
  pattern: RegExp,
  ms = 90_000,
): Promise<RegExpExecArray> {
  const deadline = Date.now() + ms;
  let exited = false;
  void run.exit.then(() => {
    exited = true;
  });
  for (;;) {
    const match = pattern.exec(run.stderr());
    if (match) return match;
    if (exited || Date.now() > deadline) {
      throw new Error(`never printed ${pattern} (exited: ${exited}):\n${run.stderr()}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

beforeAll(() => {
  if (!existsSync(dist('cli.js')) || !existsSync(dist('bin.js'))) {
    throw new Error('bench/dist is missing: run `pnpm build` first');
  }
});

describe('the CLI runs when started through a link, as an installed bin is', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'bench-bin-'));
  });
  afterAll(() => rm(dir, { recursive: true, force: true }));

  test('package.json names dist/bin.js as the percolator-bench bin (and the soak its own)', async () => {
    const pkg = JSON.parse(await readFile(new URL('../package.json', import.meta.url), 'utf8')) as {
      bin: Record<string, string>;
    };
    expect(pkg.bin).toEqual({
      'percolator-bench': './dist/bin.js',
      'percolator-soak': './dist/soak/bin.js',
    });
  });

  test.each(['bin.js', 'cli.js'])(
    'a symlink to %s prints the usage, and bad arguments exit 2',
    async (file) => {
      // npm links node_modules/.bin/<name> (no extension) to the package's file.
      const link = join(dir, `percolator-bench-${file.replace('.js', '')}`);
      await symlink(dist(file), link);
      const help = await start([link, '--help']).exit;
      expect(help.code, help.stderr).toBe(0);
      expect(help.stdout).toMatch(/^usage: pnpm bench/);
      const bad = await start([link, '--backends', 'nope']).exit;
      expect(bad.code).toBe(2);
      expect(bad.stderr).toMatch(/unknown backend "nope"/);
    },
  );

  test('isMainModule compares real paths', async () => {
    const link = join(dir, 'linked-cli.js');
    await symlink(dist('cli.js'), link);
    const url = pathToFileURL(dist('cli.js')).href;
    expect(isMainModule(url, link)).toBe(true);
    expect(isMainModule(url, dist('cli.js'))).toBe(true);
    expect(isMainModule(url, dist('bin.js'))).toBe(false);
    expect(isMainModule(url, undefined)).toBe(false);
    expect(isMainModule(url, join(dir, 'missing.js'))).toBe(false);
  });
});

describe('SIGINT and SIGTERM stop the run and drop what it created', () => {
  let dir: string;
  let pg: {
    query(text: string, values?: unknown[]): Promise<{ rows: Record<string, unknown>[] }>;
    end(): Promise<void>;
  };

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'bench-signal-'));
    const { Client } = loadDriver<{
      Client: new (o: { connectionString: string }) => typeof pg & { connect(): Promise<void> };
    }>('postgres', 'pg');
    const client = new Client({
      connectionString: process.env.PERCOLATOR_POSTGRES_URL || 'postgres://postgres@127.0.0.1:5432/test',
    });
    await client.connect();
    pg = client;
  });
  afterAll(async () => {
    await pg?.end();
    await rm(dir, { recursive: true, force: true });
  });

  async function leftInPostgres(runId: string): Promise<string[]> {
    const like = `bench\\_${runId}%`;
    const schemas = await pg.query('SELECT nspname AS name FROM pg_namespace WHERE nspname LIKE $1', [like]);
    const tables = await pg.query('SELECT relname AS name FROM pg_class WHERE relname LIKE $1', [like]);
    return [...schemas.rows, ...tables.rows].map((r) => String(r.name));
  }

  test.each([
    // In a measured cell (percolator, raw and native data all exist by then).
    { signal: 'SIGINT', code: 130, workloads: 'read,transfer', when: /\[\s*1\/\d+\] postgres read/ },
    // While the history workload writes its cells, before any cell.
    { signal: 'SIGTERM', code: 143, workloads: 'history', when: /postgres: history: writing/ },
  ] as const)(
    '$signal during $workloads: exits $code after dropping every bench_<runId> schema and table',
    async ({ signal, code, workloads, when }) => {
      const out = join(dir, signal);
      const run = start([
        dist('cli.js'),
        '--backends',
        'postgres',
        '--workloads',
        workloads,
        '--duration',
        '60s',
        '--warmup',
        '0',
        '--records',
        '64',
        '--accounts',
        '16',
        '--out',
        out,
      ]);
      const runId = (await waitFor(run, /== run ([0-9a-f]+):/))[1]!;
      await waitFor(run, when);
      // The run has created its namespace and the native schema by now.
      expect((await leftInPostgres(runId)).length).toBeGreaterThan(0);
      run.child.kill(signal);
      const exit = await run.exit;
      expect(exit.signal, exit.stderr).toBeNull();
      expect(exit.code, exit.stderr).toBe(code);
      expect(exit.stderr).toContain(`${signal}: stopping`);
      expect(exit.stderr).toMatch(new RegExp(`dropped what run ${runId} created`));
      expect(await leftInPostgres(runId)).toEqual([]);
      // An interrupted run writes no report (it would replace a finished one with part of one).
      expect(existsSync(join(out, 'results.json'))).toBe(false);
    },
    120_000,
  );
});
