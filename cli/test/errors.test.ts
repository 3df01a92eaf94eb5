import { MemoryStore, type RowStore } from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { runCli } from '../src/cli.js';

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
});
