#!/usr/bin/env node
/**
 * Installs the packages as a user gets them: `pnpm pack` every workspace package, then
 * `npm install` the tarballs into an empty project outside the workspace (third-party
 * dependencies come from the npm registry). Used by scripts/test/packed-install.test.ts;
 * run it by hand to get such a project to try things in:
 *
 *   pnpm build && node scripts/packed-install.mjs [dir]    # default: a new temp dir
 *
 * Needs `pnpm build` first: it packs what is in each package's dist/.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const run = promisify(execFile);

export const ROOT = fileURLToPath(new URL('..', import.meta.url));

/** Every workspace package directory, from pnpm-workspace.yaml (`dir` and `dir/*` entries). */
export function packageDirs() {
  const yaml = readFileSync(join(ROOT, 'pnpm-workspace.yaml'), 'utf8');
  const patterns = [...yaml.matchAll(/^\s*-\s*['"]?([^'"\s]+)['"]?\s*$/gm)].map((m) => m[1]);
  const dirs = [];
  for (const pattern of patterns) {
    if (pattern.endsWith('/*')) {
      const parent = pattern.slice(0, -2);
      for (const name of readdirNames(join(ROOT, parent))) dirs.push(`${parent}/${name}`);
    } else {
      dirs.push(pattern);
    }
  }
  return dirs.filter((dir) => existsSync(join(ROOT, dir, 'package.json')));
}

/** Subdirectories, sorted so the order (and any message) is the same every time. */
function readdirNames(dir) {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { withFileTypes: true })
    .filter((entry) => entry.isDirectory())
    .map((entry) => entry.name)
    .sort();
}

/**
 * The environment for npm and node in the project: without the npm_* / pnpm settings that
 * `pnpm test` passes down (they would configure npm as if it ran inside the workspace).
 */
export function cleanEnv(extra = {}) {
  const env = {};
  for (const [key, value] of Object.entries(process.env)) {
    if (/^(npm_|pnpm_|PNPM_|NODE_OPTIONS$|NODE_PATH$|INIT_CWD$)/.test(key)) continue;
    env[key] = value;
  }
  return { ...env, ...extra };
}

/**
 * Packs every package into `dir`; resolves to one entry per package: its name, directory,
 * tarball path and the files in it (as `pnpm pack --json` lists them).
 */
export async function packAll(dir) {
  mkdirSync(dir, { recursive: true });
  const packed = [];
  for (const pkgDir of packageDirs()) {
    const manifest = JSON.parse(readFileSync(join(ROOT, pkgDir, 'package.json'), 'utf8'));
    if (manifest.private) continue;
    if (!existsSync(join(ROOT, pkgDir, 'dist'))) {
      throw new Error(`${pkgDir}/dist does not exist: run \`pnpm build\` first`);
    }
    const { stdout } = await run('pnpm', ['pack', '--json', '--pack-destination', dir], {
      cwd: join(ROOT, pkgDir),
      env: cleanEnv(),
      maxBuffer: 64 * 1024 * 1024,
    });
    const result = JSON.parse(stdout.slice(stdout.indexOf('{')));
    packed.push({
      name: result.name,
      dir: pkgDir,
      tarball: result.filename,
      files: result.files.map((f) => f.path),
    });
  }
  return packed;
}

/**
 * Writes an empty ES-module project at `project` that depends on the tarballs, and runs
 * `npm install` there. Resolves to npm's output.
 */
export async function installInto(project, packed) {
  mkdirSync(project, { recursive: true });
  const dependencies = Object.fromEntries(packed.map((p) => [p.name, `file:${p.tarball}`]));
  writeFileSync(
    join(project, 'package.json'),
    `${JSON.stringify({ name: 'percolator-packed-install', private: true, type: 'module', dependencies }, null, 2)}\n`,
  );
  const { stdout, stderr } = await run(
    'npm',
    ['install', '--no-audit', '--no-fund', '--ignore-scripts', '--prefer-offline', '--loglevel=error'],
    { cwd: project, env: cleanEnv(), maxBuffer: 64 * 1024 * 1024, timeout: 300_000 },
  );
  return stdout + stderr;
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const base = process.argv[2] ? resolve(process.argv[2]) : mkdtempSync(join(tmpdir(), 'percolator-packed-'));
  const packed = await packAll(join(base, 'tarballs'));
  for (const p of packed) console.log(`packed ${p.name}: ${p.tarball} (${p.files.length} files)`);
  await installInto(join(base, 'app'), packed);
  console.log(`installed into ${join(base, 'app')}`);
}
