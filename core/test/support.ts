import { type ChildProcess, spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  type CasRequest,
  type CasResult,
  ClientCrash,
  MemoryStore,
  Percolator,
  type RowRef,
  type RowStore,
  type StoreCapabilities,
  type StoredRow,
  StoreError,
} from '@percolator/core';

/**
 * 'fail-before': lost before the store, reported unknown. 'fail-after': applied, its reply
 * lost. 'late': reported unknown at once, and applied only when the test runs it from
 * `late` (a request delayed in the network, not lost). 'refuse' (plain checkAndSet only):
 * refused before it was applied (StoreError 'no').
 */
export type Fault = 'fail-before' | 'fail-after' | 'late' | 'refuse' | undefined;

/**
 * A MemoryStore wrapper for core tests: counts calls, injects failures before or after a
 * CAS is applied, fails reads, and holds a CAS at a gate until released.
 */
export class InstrumentedStore implements RowStore {
  readonly name = 'instrumented-memory';
  readonly inner: MemoryStore;
  readonly capabilities: StoreCapabilities;
  calls = {
    read: 0,
    readStamped: 0,
    readPeeked: 0,
    checkAndSet: 0,
    checkAndSetStamped: 0,
    incrementCounter: 0,
    scan: 0,
  };
  /** Rows read, by `read` and `readStamped` alike (a stamped read of no rows draws only a timestamp). */
  rowReads = 0;
  /** Decides a fault for each CAS; return undefined to let it through. */
  casFault: (request: CasRequest) => Fault = () => undefined;
  readFault: (table: string, key: string) => boolean = () => false;
  /** Decides an error for each scanNotified call (a dropped connection, say); undefined lets it through. */
  scanNotifiedFault: (table: string) => Error | undefined = () => undefined;
  scanNotifiedCalls = 0;
  /** checkAndSetStampedMany calls (declared only when the capabilities passed say so). */
  stampedManyCalls = 0;
  /** Decides a fault for each checkAndSetStampedMany (one for all its rows: it is one step). */
  manyFault: (requests: readonly CasRequest[]) => Fault = () => undefined;
  /** While set, an applied checkAndSetStampedMany waits for it before replying. */
  manyReplyHold: Promise<void> | undefined;
  /** Requests that failed with 'late', each applying its call when run (oldest first). */
  readonly late: (() => Promise<{ readonly ok: boolean }>)[] = [];
  /** Awaited before every plain checkAndSet reaches the store (after its gate). */
  beforeCas: ((request: CasRequest) => Promise<void>) | undefined;
  /** Awaited first in every write call, plain or stamped (so a test can land a delayed step first). */
  beforeWrite: (() => Promise<void>) | undefined;
  /** Held CAS calls, keyed by `${table}/${key}`. */
  private gates = new Map<string, Promise<void>>();

  constructor(inner = new MemoryStore(), capabilities?: Partial<StoreCapabilities>) {
    this.inner = inner;
    // Two-phase commits unless a test asks for one-step ones: most tests here are about the steps.
    this.capabilities = { ...inner.capabilities, stampedCheckAndSetMany: false, ...capabilities };
  }

  /** Holds the next CAS on (table, key) until the returned function is called. */
  gate(table: string, key: string): () => void {
    let release!: () => void;
    this.gates.set(
      `${table}/${key}`,
      new Promise<void>((r) => {
        release = r;
      }),
    );
    return () => {
      this.gates.delete(`${table}/${key}`);
      release();
    };
  }

  async read(table: string, key: string): Promise<StoredRow | null> {
    this.calls.read++;
    this.rowReads++;
    if (this.readFault(table, key)) throw new StoreError('injected read failure', 'no');
    return this.inner.read(table, key);
  }

  async checkAndSet(request: CasRequest): Promise<CasResult> {
    this.calls.checkAndSet++;
    if (this.beforeWrite) await this.beforeWrite();
    const gate = this.gates.get(`${request.table}/${request.key}`);
    if (gate) {
      this.gates.delete(`${request.table}/${request.key}`);
      await gate;
    }
    if (this.beforeCas) await this.beforeCas(request);
    const fault = this.casFault(request);
    if (fault === 'fail-before')
      throw new StoreError('injected: connection lost before the write', 'unknown');
    if (fault === 'refuse') throw new StoreError('injected: refused before it was applied', 'no');
    const result = await this.inner.checkAndSet(request);
    if (fault === 'fail-after') throw new StoreError('injected: reply lost after the write', 'unknown');
    return result;
  }

  async checkAndSetStamped(
    request: CasRequest & { readonly state: Uint8Array },
    counter: string,
  ): Promise<CasResult & { timestamp?: number }> {
    this.calls.checkAndSetStamped++;
    if (this.beforeWrite) await this.beforeWrite();
    const gate = this.gates.get(`${request.table}/${request.key}`);
    if (gate) {
      this.gates.delete(`${request.table}/${request.key}`);
      await gate;
    }
    const fault = this.casFault(request);
    if (fault === 'fail-before')
      throw new StoreError('injected: connection lost before the write', 'unknown');
    if (fault === 'late') {
      const copy = { ...request, state: request.state.slice() };
      this.late.push(() => this.inner.checkAndSetStamped(copy, counter));
      throw new StoreError('injected: no reply yet (the request is delayed)', 'unknown');
    }
    const result = await this.inner.checkAndSetStamped(request, counter);
    if (fault === 'fail-after') throw new StoreError('injected: reply lost after the write', 'unknown');
    return result;
  }

  async checkAndSetStampedMany(
    requests: readonly (CasRequest & { readonly state: Uint8Array })[],
    counter: string,
  ) {
    this.stampedManyCalls++;
    if (this.beforeWrite) await this.beforeWrite();
    const fault = this.manyFault(requests);
    if (fault === 'fail-before')
      throw new StoreError('injected: connection lost before the write', 'unknown');
    if (fault === 'late') {
      const copy = requests.map((r) => ({ ...r, state: r.state.slice() }));
      this.late.push(() => this.inner.checkAndSetStampedMany(copy, counter));
      throw new StoreError('injected: no reply yet (the request is delayed)', 'unknown');
    }
    const result = await this.inner.checkAndSetStampedMany(requests, counter);
    if (this.manyReplyHold) await this.manyReplyHold;
    if (fault === 'fail-after') throw new StoreError('injected: reply lost after the write', 'unknown');
    return result;
  }

  async readPeeked(refs: readonly RowRef[], counter: string) {
    this.calls.readPeeked++;
    this.rowReads += refs.length;
    for (const r of refs)
      if (this.readFault(r.table, r.key)) throw new StoreError('injected read failure', 'no');
    return this.inner.readPeeked(refs, counter);
  }

  async readStamped(refs: readonly RowRef[], counter: string) {
    this.calls.readStamped++;
    this.rowReads += refs.length;
    for (const r of refs)
      if (this.readFault(r.table, r.key)) throw new StoreError('injected read failure', 'no');
    return this.inner.readStamped(refs, counter);
  }

  async incrementCounter(name: string, delta: number): Promise<number> {
    this.calls.incrementCounter++;
    return this.inner.incrementCounter(name, delta);
  }

  async scan(...args: Parameters<MemoryStore['scan']>) {
    this.calls.scan++;
    return this.inner.scan(...args);
  }

  async scanNotified(...args: Parameters<MemoryStore['scanNotified']>) {
    this.scanNotifiedCalls++;
    const fault = this.scanNotifiedFault(args[0]);
    if (fault) throw fault;
    return this.inner.scanNotified(...args);
  }

  async close(): Promise<void> {}
}

/** A wall clock tests move by hand, so lock expiry needs no sleeping. */
export function fakeClock(start = 1_700_000_000_000) {
  let now = start;
  const clock = () => now;
  clock.advance = (ms: number) => {
    now += ms;
  };
  return clock;
}

export const text = (bytes: Uint8Array | undefined) =>
  bytes === undefined ? undefined : new TextDecoder().decode(bytes);

const testDir = dirname(fileURLToPath(import.meta.url));
const repoRoot = join(testDir, '..', '..');
/** vite-node as vitest resolves it, so child processes run the TypeScript sources. */
const viteNode = join(
  dirname(
    createRequire(createRequire(join(repoRoot, 'package.json')).resolve('vitest/package.json')).resolve(
      'vite-node/package.json',
    ),
  ),
  'vite-node.mjs',
);

/**
 * Runs `core/test/<file>` in a child process of its own (a separate client of the store),
 * with the workspace's vitest aliases; stdout is piped for the child's reports.
 */
export function spawnTestScript(
  file: string,
  args: readonly string[],
  stdin: 'ignore' | 'pipe',
): ChildProcess {
  return spawn(
    process.execPath,
    [viteNode, '--config', join(repoRoot, 'vitest.config.ts'), join(testDir, file), ...args],
    { cwd: repoRoot, stdio: [stdin, 'pipe', 'inherit'] },
  );
}

/**
 * A client stopped just before its commit point, its locks on t/x (primary) and t/y left
 * behind with `lockTtlMs`. Two phases: the steps the hook stops at (a one-step commit has none).
 */
export async function stoppedBeforeCommitPrimary(store: RowStore, lockTtlMs: number): Promise<Percolator> {
  const crashed = new Percolator({
    store,
    lockTtlMs,
    onePhaseMaxRows: 1,
    hooks: {
      onCommitStep: (e) => {
        if (e.step === 'beforeCommitPrimary') throw new ClientCrash();
      },
    },
  });
  const error = await crashed
    .transact(async (tx) => {
      tx.set('t', 'x', 'v', '1');
      tx.set('t', 'y', 'v', '1');
    })
    .then(
      () => undefined,
      (e: unknown) => e,
    );
  if (!(error instanceof ClientCrash))
    throw new Error(`the client did not stop at its commit point: ${String(error)}`);
  return crashed;
}
