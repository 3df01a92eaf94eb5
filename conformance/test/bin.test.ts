/**
 * The installed `percolator-conformance` bin, run the way npm installs it: a symlink in
 * node_modules/.bin to the package's bin file, the package itself a symlink too. Needs
 * `pnpm build` (the test command builds first).
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const packageDir = fileURLToPath(new URL('..', import.meta.url));
const manifest = JSON.parse(readFileSync(join(packageDir, 'package.json'), 'utf8')) as {
  bin: Record<string, string>;
};

let project: string;
let bin: string;

beforeAll(() => {
  const target = manifest.bin['percolator-conformance'];
  expect(target, 'package.json declares the percolator-conformance bin').toBeDefined();
  if (!existsSync(join(packageDir, target!))) {
    throw new Error(`${target} is not built: run \`pnpm build\` first (the test command does)`);
  }
  project = mkdtempSync(join(tmpdir(), 'percolator-bin-'));
  const linked = join(project, 'node_modules', '@percolator', 'conformance');
  mkdirSync(dirname(linked), { recursive: true });
  symlinkSync(packageDir, linked, 'dir');
  bin = join(project, 'node_modules', '.bin', 'percolator-conformance');
  mkdirSync(dirname(bin), { recursive: true });
  symlinkSync(relative(dirname(bin), join(linked, target!)), bin);
});

afterAll(() => {
  if (project) rmSync(project, { recursive: true, force: true });
});

function run(...args: string[]) {
  const result = spawnSync(process.execPath, [bin, ...args], {
    cwd: project,
    encoding: 'utf8',
    timeout: 120_000,
  });
  return { code: result.status, out: result.stdout, err: result.stderr };
}

describe('the percolator-conformance bin through its symlink', () => {
  it('runs the suite and exits 0 when it passes', () => {
    const { code, out, err } = run('--backend', 'memory', '--parts', 'store', '--scale', '0.2');
    expect(out, err).toContain('PASSED: memory');
    expect(out).toMatch(/^store\s+\d+\s+0\s+0\s/m);
    expect(code).toBe(0);
  });

  it('exits 2 with a usage message on bad arguments', () => {
    const { code, err } = run('--backend', 'nope');
    expect(err).toContain('usage: percolator-conformance');
    expect(code).toBe(2);
  });

  it('exits non-zero when the backend is unreachable, naming the URL it was given', () => {
    const { code, err } = run('--backend', 'postgres', '--url', 'postgres://postgres@127.0.0.1:1/test');
    expect(err).toMatch(/could not start|cannot open backend/);
    expect(err).toContain('postgres://postgres@127.0.0.1:1/test');
    expect(code).toBe(2);
  });
});

describe('pnpm conformance in this repository', () => {
  it('builds before it runs the bin, so a fresh clone works', () => {
    const root = JSON.parse(readFileSync(join(packageDir, '..', 'package.json'), 'utf8')) as {
      scripts: Record<string, string>;
    };
    const script = root.scripts.conformance ?? '';
    expect(script).toMatch(/^pnpm build && node conformance\/dist\/\S+\.js$/);
    expect(script.endsWith(manifest.bin['percolator-conformance']!.replace(/^\.\//, 'conformance/'))).toBe(
      true,
    );
  });
});
