import { MemoryStore, Percolator } from '@percolator/core';
import { describe, expect, test } from 'vitest';
import { CountingStore } from '../src/counting-store.js';
import { traced, trackCall } from '../src/critical-path.js';
import { initialRows } from '../src/dataset.js';
import { PercolatorEngine } from '../src/engines/percolator.js';
import { RawEngine } from '../src/engines/raw.js';
import { runCell } from '../src/runner.js';
import { workloadByName } from '../src/workloads.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A MemoryStore without stamped reads: a transaction then takes its start timestamp first. */
class UnstampedMemoryStore extends MemoryStore {
  override readonly capabilities = { ...new MemoryStore().capabilities, stampedRead: false };
}

describe('sequential round trips (critical path)', () => {
  test('overlapping calls are one wait, calls one after another one each', async () => {
    const store = new CountingStore(new MemoryStore());
    const { trace } = await traced(async () => {
      await store.incrementCounter!('ts', 1);
      await Promise.all([store.read('t', 'a'), store.read('t', 'b')]);
      await store.read('t', 'c');
    });
    expect(trace.figures()).toEqual({ sequential: 3, criticalCalls: 4, backgroundCalls: 0 });
    expect(store.total).toBe(4);
  });

  test('calls left running, or made after the transaction returned, are background', async () => {
    const store = new CountingStore(new MemoryStore());
    let later: Promise<unknown> = Promise.resolve();
    const { trace } = await traced(async () => {
      await store.read('t', 'a');
      // Started before the return, finished after it: not waited for.
      later = store.read('t', 'b').then(async () => {
        await sleep(5);
        // In the transaction's context, after it returned (a tidy step).
        await store.read('t', 'c');
      });
    });
    await later;
    expect(trace.figures()).toEqual({ sequential: 1, criticalCalls: 1, backgroundCalls: 2 });
  });

  test('calls outside a traced transaction are not recorded; sync results pass through', async () => {
    expect(trackCall(() => 7)).toBe(7);
    const { trace } = await traced(async () => trackCall(() => 'sync'));
    expect(trace.figures().criticalCalls).toBe(1);
  });

  test('a read-only transaction of two rows read with Promise.all waits twice: begin + one batched read', async () => {
    const store = new CountingStore(new UnstampedMemoryStore());
    // The oracle's way (no peeked snapshot for a transaction not declared read-only).
    const db = new Percolator({ store, peekedWrites: false });
    await db.transact(async (tx) => {
      tx.set('t', 'a', 'c', '1');
      tx.set('t', 'b', 'c', '2');
    });
    await db.flush();
    const { value, trace } = await traced(() =>
      db.transact((tx) => Promise.all([tx.getString('t', 'a', 'c'), tx.getString('t', 'b', 'c')])),
    );
    await db.flush();
    expect(value).toEqual(['1', '2']);
    expect(trace.figures()).toMatchObject({ sequential: 2, criticalCalls: 2 });
    await db.close();
  });

  test('the bench reports both counts; a memory-store transfer waits twice, as do raw calls (four, two legs at once)', async () => {
    const memory = new MemoryStore();
    const shape = { records: 16, accounts: 16, valueBytes: 32 };
    const workload = workloadByName('transfer')!;
    for (const engine of [
      new PercolatorEngine(new CountingStore(memory), 20),
      new RawEngine(new CountingStore(memory), 20),
    ]) {
      await engine.load('acct', initialRows('acct', shape));
      const result = await runCell({
        backend: 'memory',
        engine,
        workload,
        concurrency: 2,
        durationMs: 60,
        warmupMs: 0,
        shape,
        seed: 1,
        opsPerTxn: 4,
      });
      expect(result.check.ok, result.check.detail).toBe(true);
      const path = result.criticalPath!;
      expect(path.transactions).toBeGreaterThan(0);
      expect(path.roundTrips).toBeGreaterThan(0);
      expect(path.roundTrips).toBeLessThanOrEqual(path.criticalCalls);
      // (Under load Percolator's calls per transaction may be fewer than its waits: the
      // first reads of transactions that start together share one peek, docs/protocol.md 4.10.)
      // raw: two legs of read + CAS sent at once: four calls, two round trips, nothing in the
      // background.
      if (engine.mode === 'raw') {
        expect(path).toMatchObject({ roundTrips: 2, criticalCalls: 4, backgroundCalls: 0 });
        expect(path.roundTrips).toBeLessThanOrEqual(result.roundTrips);
      }
      // Percolator on the memory store: the peek with the reads, then the one-step commit of both
      // rows (no secondaries left for the background).
      else expect(path).toMatchObject({ roundTrips: 2, criticalCalls: 2 });
      await engine.close();
    }
  });
});
