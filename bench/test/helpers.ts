import { PassThrough } from 'node:stream';
import { type CasRequest, type CasResult, MemoryStore, type RowStore } from '@percolator/core';
import type { OpenBackend } from '../src/backends.js';
import { main } from '../src/cli.js';
import { CountingStore } from '../src/counting-store.js';
import { PercolatorEngine } from '../src/engines/percolator.js';
import { RawEngine } from '../src/engines/raw.js';

/**
 * A deliberately broken store: its check-and-set ignores the expected version and
 * overwrites whatever is there. Everything built on it "works", fast, and loses updates.
 */
export class VersionIgnoringStore implements RowStore {
  readonly name = 'broken-cas';
  private readonly inner = new MemoryStore();
  readonly capabilities = { ...this.inner.capabilities, stampedCheckAndSet: false };

  read(table: string, key: string) {
    return this.inner.read(table, key);
  }

  async checkAndSet(request: CasRequest): Promise<CasResult> {
    // Yield first, as a networked store would, so concurrent writers interleave.
    await new Promise((resolve) => setImmediate(resolve));
    const current = await this.inner.read(request.table, request.key);
    return this.inner.checkAndSet({ ...request, expected: current?.version ?? null });
  }

  scan(table: string, options: Parameters<MemoryStore['scan']>[1]) {
    return this.inner.scan(table, options);
  }

  incrementCounter(name: string, delta: number) {
    return this.inner.incrementCounter(name, delta);
  }

  async close(): Promise<void> {}
}

/** A backend made of one store's Percolator and raw engines, for runBench's `open` hook. */
export function storeBackend(store: RowStore, name: OpenBackend['name'] = 'memory'): OpenBackend {
  // Short lock TTLs: a broken store strands locks, and readers would wait out the default 5 s.
  const engines = [
    new PercolatorEngine(new CountingStore(store), 20, { lockTtlMs: 100 }),
    new RawEngine(new CountingStore(store), 20),
  ];
  return {
    name,
    target: store.name,
    engines,
    notes: [],
    close: async () => {
      for (const e of engines) await e.close();
    },
  };
}

/** A stream the CLI can write to, and a test can listen on. */
export function sink(): NodeJS.WriteStream {
  return Object.assign(new PassThrough(), { isTTY: false }) as unknown as NodeJS.WriteStream;
}

/**
 * The CLI's main() on the memory store's transfer workload, Percolator engines only, with
 * `args` after those and results in `dir`: its exit code.
 */
export function memoryTransfers(dir: string, args: readonly string[], stdout = sink()): Promise<number> {
  return main(
    ['--backends', 'memory', '--workloads', 'transfer', '--modes', 'percolator', ...args, '--out', dir],
    { stdout, stderr: sink() },
  );
}
