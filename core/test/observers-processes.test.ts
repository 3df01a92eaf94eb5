import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createInterface } from 'node:readline';
import { Percolator, type WorkerStats } from '@percolator/core';
import { createRedisStore, defaultRedisUrl, type RedisStore } from '@percolator/redis';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { spawnTestScript } from './support.js';

/**
 * Workers in separate processes share the work through the store alone: leases are rows
 * in the store, so no two processes run the same row at once, and together they process
 * every notification. Runs against Redis (PERCOLATOR_REDIS_URL, default
 * redis://127.0.0.1:6379); the children run the TypeScript sources through vite-node.
 */
const TABLE = 'mp_docs';
const ROWS = 60;
const PROCESSES = 3;

let store: RedisStore;
const namespace = `obs_mp_${randomBytes(4).toString('hex')}`;

beforeAll(async () => {
  try {
    store = await createRedisStore({ namespace });
  } catch (error) {
    throw new Error(
      `Redis is not reachable at ${defaultRedisUrl()}: set PERCOLATOR_REDIS_URL (${(error as Error).message})`,
    );
  }
});

afterAll(async () => {
  await store?.dropNamespace();
  await store?.close();
});

interface Child {
  readonly process: ChildProcess;
  readonly runs: [string, number, number][];
  ready: Promise<void>;
  done: Promise<WorkerStats>;
}

function startChild(): Child {
  const child = spawnTestScript('observers-process-child.ts', [namespace, TABLE], 'pipe');
  const runs: [string, number, number][] = [];
  let ready!: () => void;
  let done!: (stats: WorkerStats) => void;
  let failed!: (e: Error) => void;
  const result: Child = {
    process: child,
    runs,
    ready: new Promise<void>((r) => (ready = r)),
    done: new Promise<WorkerStats>((r, j) => {
      done = r;
      failed = j;
    }),
  };
  result.ready.catch(() => undefined);
  child.once('exit', (code) => failed(new Error(`worker process exited with code ${code} before finishing`)));
  createInterface({ input: child.stdout! }).on('line', (line) => {
    if (!line.startsWith('{')) return;
    const message = JSON.parse(line);
    if (message.ready) ready();
    if (message.run) runs.push(message.run);
    if (message.done) done(message.stats);
  });
  return result;
}

test('workers in separate processes share the work and never run the same row at once', async () => {
  const children = Array.from({ length: PROCESSES }, startChild);
  try {
    await Promise.all(children.map((c) => Promise.race([c.ready, c.done])));
    const writer = new Percolator({ store, observedColumns: [{ table: TABLE, column: 'in' }] });
    for (let i = 0; i < ROWS; i += 5) {
      await writer.transact(async (tx) => {
        for (let j = i; j < i + 5; j++) tx.set(TABLE, `row/${String(j).padStart(3, '0')}`, 'in', `v${j}`);
      });
    }
    for (const c of children) c.process.stdin!.write('drain\n');
    const stats = await Promise.all(children.map((c) => c.done));

    const outs = await writer.transact(async (tx) => {
      const found = new Map<string, string>();
      for await (const r of tx.scan(TABLE)) found.set(r.row, new TextDecoder().decode(r.columns.get('out')));
      return found;
    });
    await writer.close();
    for (let j = 0; j < ROWS; j++) expect(outs.get(`row/${String(j).padStart(3, '0')}`)).toBe(`v${j}`);
    expect(await store.scanNotified(TABLE, { limit: 100 })).toEqual([]);
    // Every row's committed run happened once overall (no change was run twice).
    expect(stats.reduce((n, s) => n + s.runs, 0)).toBe(ROWS);
    // No two processes ran the same row at overlapping times.
    const byRow = new Map<string, [number, number, number][]>();
    children.forEach((c, p) => {
      for (const [row, start, end] of c.runs) byRow.set(row, [...(byRow.get(row) ?? []), [p, start, end]]);
    });
    for (const [row, runs] of byRow) {
      for (const a of runs) {
        for (const b of runs) {
          if (a !== b && a[0] !== b[0])
            expect(a[2] <= b[1] || b[2] <= a[1], `row ${row} ran in two processes at once`).toBe(true);
        }
      }
    }
    // The work was spread over more than one process.
    expect(children.filter((c) => c.runs.length > 0).length).toBeGreaterThan(1);
  } finally {
    for (const c of children) if (c.process.exitCode === null) c.process.kill('SIGKILL');
  }
}, 90_000);
