import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { InvalidArgumentError } from '@percolator/core';
import { afterAll, describe, expect, test } from 'vitest';
import { MAX_INLINE_HISTORY_BYTES, parseOptions } from '../src/options.js';
import type { BenchReport } from '../src/types.js';
import { memoryTransfers } from './helpers.js';

const dirs: string[] = [];

/** Transfers on the memory store, one client, with `--inline-history-bytes` as given (and more flags). */
async function transfers(inlineHistoryBytes: string, ...more: string[]): Promise<BenchReport> {
  const dir = await mkdtemp(join(tmpdir(), 'bench-inline-'));
  dirs.push(dir);
  const code = await memoryTransfers(dir, [
    '--concurrency',
    '1',
    '--duration',
    '200ms',
    '--warmup',
    '50ms',
    '--accounts',
    '8',
    '--inline-history-bytes',
    inlineHistoryBytes,
    ...more,
  ]);
  expect(code).toBe(0);
  return JSON.parse(await readFile(join(dir, 'results.json'), 'utf8')) as BenchReport;
}

afterAll(async () => {
  for (const dir of dirs) await rm(dir, { recursive: true, force: true });
});

describe('--inline-history-bytes', () => {
  test('is parsed as an integer from 0 to the maximum; anything else is an InvalidArgumentError', () => {
    expect(parseOptions([]).inlineHistoryBytes).toBeUndefined();
    expect(parseOptions(['--inline-history-bytes', '4096']).inlineHistoryBytes).toBe(4096);
    expect(parseOptions(['--inline-history-bytes', '0']).inlineHistoryBytes).toBe(0);
    for (const bad of ['-1', '1.5', 'lots', String(MAX_INLINE_HISTORY_BYTES + 1)])
      expect(() => parseOptions(['--inline-history-bytes', bad])).toThrow(InvalidArgumentError);
  });

  test("reaches the Percolator client: with 0 every commit moves the cells' old values to version rows, with a large budget none does", async () => {
    // A transfer writes two head rows. With 0, each commit after a cell's first also
    // creates the version row of the value it supersedes, in the same step (about 4 rows
    // a transfer); with 64 KB every old value stays inline until pruning drops it.
    const moving = await transfers('0');
    const inline = await transfers('65536');
    const [m] = moving.results;
    const [i] = inline.results;
    expect(m?.check.ok && i?.check.ok).toBe(true);
    expect(m!.transactions).toBeGreaterThan(20);
    expect(i!.transactions).toBeGreaterThan(20);
    expect(m!.io?.rowsWritten).toBeGreaterThan(3);
    expect(i!.io?.rowsWritten).toBeLessThanOrEqual(2.01);
    expect(moving.command).toContain('--inline-history-bytes 0');
  });
});

describe('--version-block-bytes', () => {
  test('is parsed as an integer from 0 to the maximum; anything else is an InvalidArgumentError', () => {
    expect(parseOptions([]).versionBlockBytes).toBeUndefined();
    expect(parseOptions(['--version-block-bytes', '0']).versionBlockBytes).toBe(0);
    expect(parseOptions(['--version-block-bytes', '65536']).versionBlockBytes).toBe(65536);
    for (const bad of ['-1', '1.5', 'lots', String(MAX_INLINE_HISTORY_BYTES + 1)])
      expect(() => parseOptions(['--version-block-bytes', bad])).toThrow(InvalidArgumentError);
  });

  test('reaches the Percolator client: with 0 every moved value gets a version row of its own, by default they share blocks', async () => {
    // The default inline budget (512 bytes) and 100-byte values: a cell's old values move
    // five or six at a time, to one version row (a block), or with 0 to one each.
    const single = await transfers('512', '--version-block-bytes', '0');
    const blocks = await transfers('512');
    const [s] = single.results;
    const [b] = blocks.results;
    expect(s?.check.ok && b?.check.ok).toBe(true);
    expect(s!.transactions).toBeGreaterThan(20);
    expect(b!.transactions).toBeGreaterThan(20);
    // Two head rows a transfer either way; about two version rows more with 0, a fifth of that in blocks.
    expect(s!.io!.rowsWritten).toBeGreaterThan(3);
    expect(b!.io!.rowsWritten).toBeLessThan(2.8);
    expect(single.command).toContain('--version-block-bytes 0');
  });
});
