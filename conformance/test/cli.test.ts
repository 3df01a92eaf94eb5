import type { RowStore } from '@percolator/core';
import { describe, expect, it } from 'vitest';
import type { Backend } from '../src/backends.js';
import { allCases } from '../src/cases/index.js';
import { parseCliArgs, runCli } from '../src/cli.js';
import { IgnoresVersionStore } from './broken-stores.js';

function io(backend?: () => RowStore) {
  const out: string[] = [];
  const err: string[] = [];
  return {
    out,
    err,
    io: {
      out: (t: string) => void out.push(t),
      err: (t: string) => void err.push(t),
      ...(backend
        ? {
            openBackend: async (): Promise<Backend> => ({
              name: 'memory',
              target: 'test',
              createStore: async () => backend(),
              destroyStore: (s) => s.close(),
              close: async () => {},
            }),
          }
        : {}),
    },
  };
}

describe('conformance CLI', () => {
  it('runs the memory backend, prints a table per part, and exits 0', async () => {
    const run = io();
    const code = await runCli(
      ['--', '--backend', 'memory', '--parts', 'store,history', '--scale', '0.2'],
      run.io,
    );
    const text = run.out.join('');
    expect(code).toBe(0);
    expect(text).toMatch(/^part\s+pass\s+fail\s+not declared\s+time$/m);
    // Every store case passes on the memory store (it declares every capability).
    const storeCases = allCases().filter((c) => c.part === 'store').length;
    expect(text).toMatch(new RegExp(`^store\\s+${storeCases}\\s+0\\s+0\\s`, 'm'));
    expect(text).toMatch(/^history\s+1\s+0\s+0\s/m);
    expect(text).not.toMatch(/^protocol/m);
    expect(text).toContain('PASSED: memory');
  }, 60_000);

  it('exits 1 and lists the failures when a case fails', async () => {
    const run = io(() => new IgnoresVersionStore());
    const code = await runCli(
      ['--backend', 'memory', '--parts', 'store', '--grep', 'stale version', '--seed', '7'],
      run.io,
    );
    const text = run.out.join('');
    expect(code).toBe(1);
    expect(text).toMatch(/^store\s+0\s+1\s+0\s/m);
    expect(text).toContain('FAILED: 1 case(s) on memory (seed 7)');
    expect(text).toContain('store: a stale version fails and changes nothing');
  });

  it('exits 2 on bad arguments', async () => {
    for (const argv of [
      [],
      ['--backend', 'oracle'],
      ['--backend', 'memory', '--parts', 'nope'],
      ['--backend', 'memory', '--scale', '0'],
    ]) {
      const run = io();
      expect(await runCli(argv, run.io)).toBe(2);
      expect(run.err.join('')).toContain('usage: percolator-conformance --backend');
    }
  });

  it('takes per-backend default scales and explicit options', () => {
    expect(parseCliArgs(['--backend', 'dynamodb']).scale).toBe(0.1);
    const args = parseCliArgs([
      '--backend',
      'postgres',
      '--url',
      'postgres://x',
      '--seed',
      '42',
      '--scale',
      '2',
    ]);
    expect(args).toMatchObject({ backend: 'postgres', url: 'postgres://x', seed: 42, scale: 2 });
  });

  it('runs the suite only: the operator commands point to the percolator CLI (exit 2)', async () => {
    for (const command of ['dump', 'inspect', 'namespaces', 'drop-namespace']) {
      const run = io();
      expect(await runCli(['--', command, 'accounts', '--backend', 'postgres'], run.io)).toBe(2);
      expect(run.err.join('')).toContain(`percolator ${command} --help`);
    }
    const help = io();
    expect(await runCli(['--help'], help.io)).toBe(0);
    expect(help.out.join('')).toContain('use the operator CLI: percolator --help');
  });
});
