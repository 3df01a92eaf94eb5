import { MemoryStore, Percolator, StoreError, UnsupportedOperationError } from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { StampedReadGauge } from '../src/env.js';
import { InstrumentedStore } from './support.js';

/** Eight read-only transactions started in the same tick; the calls they made. */
async function eightReaders(stampedReadUnderLoad: boolean) {
  const store = new InstrumentedStore(new MemoryStore(), { stampedReadUnderLoad });
  const db = new Percolator({ store, peekedWrites: false });
  await db.transact(async (tx) => tx.set('t', 'k', 'v', '1'));
  const before = { ...store.calls };
  const values = await Promise.all(
    Array.from({ length: 8 }, () => db.transact((tx) => tx.getString('t', 'k', 'v'))),
  );
  await db.close();
  return {
    values,
    readStamped: store.calls.readStamped - before.readStamped,
    incrementCounter: store.calls.incrementCounter - before.incrementCounter,
  };
}

describe('stamped reads under load', () => {
  it('by default, transactions that start while a stamped read is in flight share the batched oracle', async () => {
    const { values, readStamped, incrementCounter } = await eightReaders(false);
    expect(values).toEqual(Array(8).fill('1'));
    expect(readStamped).toBe(1);
    expect(incrementCounter).toBeGreaterThanOrEqual(1);
  });

  it('with stampedReadUnderLoad (Redis), every transaction draws its start timestamp with its reads', async () => {
    const { values, readStamped, incrementCounter } = await eightReaders(true);
    expect(values).toEqual(Array(8).fill('1'));
    expect(readStamped).toBe(8);
    expect(incrementCounter).toBe(0);
  });
});

describe('the start timestamp drawn with the first reads (FirstDraw)', () => {
  /** A store whose stamped reads wait for `release` and then fail with `failure`, if set. */
  function heldStore() {
    const store = new InstrumentedStore();
    const control: { failure: Error | undefined; release: () => void; held: Promise<void> } = {
      failure: undefined,
      release: () => undefined,
      held: Promise.resolve(),
    };
    const stamped = store.readStamped.bind(store);
    store.readStamped = async (refs, counter) => {
      await control.held;
      if (control.failure) throw control.failure;
      return stamped(refs, counter);
    };
    const hold = () => {
      control.held = new Promise((resolve) => {
        control.release = resolve;
      });
    };
    return { store, control, hold };
  }

  it('whoever waits while the reads are in flight gets their timestamp; nobody waiting costs no draw of its own', async () => {
    const { store, control, hold } = heldStore();
    const db = new Percolator({ store, peekedWrites: false });
    await db.transact(async (tx) => tx.set('t', 'a', 'v', '1'));
    await db.flush();
    hold();
    const before = { ...store.calls };
    const seen: number[] = [];
    const result = db.transact(async (t) => {
      const read = t.getString('t', 'a', 'v');
      const ready = t.ready(); // while the stamped read is held: waits for the same draw
      const second = t.getString('t', 'b', 'v'); // joins the same batch
      await new Promise((resolve) => setTimeout(resolve, 5));
      control.release();
      seen.push(await ready, t.startTs);
      return [await read, await second];
    });
    expect(await result).toEqual(['1', undefined]);
    expect(seen[0]).toBe(seen[1]);
    expect(store.calls.readStamped - before.readStamped).toBe(1);
    expect(store.calls.incrementCounter - before.incrementCounter).toBe(0);
    await db.close();
  });

  it('a failure the oracle can route around: the reads and the waiter get the oracle timestamp', async () => {
    const { store, control, hold } = heldStore();
    const db = new Percolator({ store, peekedWrites: false });
    await db.transact(async (tx) => tx.set('t', 'a', 'v', '1'));
    await db.flush();
    hold();
    control.failure = new StoreError('the stamped read timed out before reaching the store', 'no');
    const before = { ...store.calls };
    const out = await db.transact(async (t) => {
      const read = t.getString('t', 'a', 'v');
      const ready = t.ready();
      control.release();
      const ts = await ready;
      return { value: await read, same: ts === t.startTs };
    });
    expect(out).toEqual({ value: '1', same: true });
    // One draw from the oracle serves both (ready() returns the transaction's timestamp,
    // so the draw count is what would show a second one).
    expect(store.calls.incrementCounter - before.incrementCounter).toBe(1);
    await db.close();
  });

  it('a failure retrying cannot fix reaches the reads and the waiter alike, and nothing is left unhandled', async () => {
    const { store, control, hold } = heldStore();
    const db = new Percolator({ store, peekedWrites: false });
    await db.transact(async (tx) => tx.set('t', 'a', 'v', '1'));
    await db.flush();
    const failure = new UnsupportedOperationError('this store was configured without stamped reads');
    control.failure = failure;
    // With a waiter.
    hold();
    const outcomes = await db
      .transact(
        async (t) => {
          const read = t.getString('t', 'a', 'v');
          const ready = t.ready();
          control.release();
          return Promise.allSettled([read, ready]);
        },
        { maxAttempts: 1 },
      )
      .catch((error: unknown) => error);
    expect(outcomes).toEqual([
      { status: 'rejected', reason: failure },
      { status: 'rejected', reason: failure },
    ]);
    // With nobody waiting but the read (an unhandled rejection would fail this run).
    hold();
    const alone = db.transact(async (t) => t.getString('t', 'a', 'v'), { maxAttempts: 1 });
    control.release();
    await expect(alone).rejects.toBe(failure);
    // A later transaction draws again, once the store is back.
    control.failure = undefined;
    expect(await db.transact((t) => t.getString('t', 'a', 'v'))).toBe('1');
    await db.close();
  });
});

/** A gauge on a hand-moved clock, with the oracle's business set by hand. */
function gauge(underLoad = false) {
  let now = 1_000;
  let busy = false;
  const g = new StampedReadGauge(
    () => busy,
    underLoad,
    () => now,
  );
  return {
    g,
    load: (on: boolean) => {
      busy = on;
    },
    advance: (ms: number) => {
      now += ms;
    },
  };
}

describe('how first reads get their timestamp (StampedReadGauge)', () => {
  it('idle: a stamped read; under load with nothing measured: the oracle, and the stamped way tried once per 250 ms', () => {
    const { g, load, advance } = gauge();
    expect(g.choose()).toBe('idle');
    expect(g.preferOracle()).toBe(false);
    load(true);
    expect(g.preferOracle()).toBe(true);
    expect([g.choose(), g.choose()]).toEqual(['oracle', 'oracle']);
    advance(250);
    expect([g.choose(), g.choose(), g.choose()]).toEqual(['stamped', 'oracle', 'oracle']);
    // Another stamped read in flight counts as load too.
    load(false);
    g.inFlight = 1;
    expect(g.choose()).toBe('oracle');
  });

  it('under load, stamped reads once they are measured clearly faster (below 0.55x the oracle way), the oracle way retried once per 250 ms', () => {
    const { g, load, advance } = gauge();
    load(true);
    for (let i = 0; i < 4; i++) g.record('oracle', 6);
    g.record('stamped', 1); // one sample is not enough to switch on
    expect(g.choose()).toBe('oracle');
    for (let i = 0; i < 3; i++) g.record('stamped', 5); // smoothed to about 1.9: clearly faster
    expect(g.preferOracle()).toBe(false);
    for (let i = 0; i < 20; i++) g.record('stamped', 5); // now about 4.5: faster, not clearly (> 0.55 * 6)
    expect(g.choose()).toBe('oracle');
    expect(g.preferOracle()).toBe(true);
    for (let i = 0; i < 30; i++) g.record('stamped', 2); // smoothed down to about 2.1
    expect(g.preferOracle()).toBe(false);
    expect([g.choose(), g.choose()]).toEqual(['stamped', 'stamped']);
    advance(250);
    expect([g.choose(), g.choose()]).toEqual(['oracle', 'stamped']);
    // The oracle way got faster (a lighter load): back to it. The stamped way last ran
    // 250 ms ago, so it is tried once first.
    for (let i = 0; i < 10; i++) g.record('oracle', 2);
    expect([g.choose(), g.choose(), g.choose()]).toEqual(['stamped', 'oracle', 'oracle']);
    // Idle is idle whatever was measured.
    load(false);
    expect(g.choose()).toBe('idle');
  });

  it('a stamped read that failed counts as its time plus the oracle way after it', () => {
    const { g, load } = gauge();
    load(true);
    for (let i = 0; i < 4; i++) g.record('oracle', 10);
    for (let i = 0; i < 4; i++) g.record('stamped', 1);
    expect(g.preferOracle()).toBe(false);
    // Failing stamped reads: each cost 1 ms and then the oracle way (10 ms).
    for (let i = 0; i < 30; i++) g.recordFailure(1);
    expect(g.preferOracle()).toBe(true);
  });

  it('with stampedReadUnderLoad, a stamped read always', () => {
    const { g, load, advance } = gauge(true);
    load(true);
    g.record('oracle', 1);
    g.record('stamped', 100);
    advance(1000);
    expect([g.choose(), g.choose()]).toEqual(['idle', 'idle']);
    expect(g.preferOracle()).toBe(false);
  });

  it('a client whose oracle is slow moves its first reads under load to stamped reads, and they read what was committed', async () => {
    const store = new InstrumentedStore(new MemoryStore());
    const db = new Percolator({ store, peekedWrites: false });
    await db.transact(async (tx) => {
      for (let i = 0; i < 8; i++) tx.set('t', `k${i}`, 'v', String(i));
    });
    await db.flush();
    // Every oracle fetch takes 20 ms; a stamped read (memory) well under 1 ms.
    const increment = store.incrementCounter.bind(store);
    store.incrementCounter = async (name, delta) => {
      await new Promise((r) => setTimeout(r, 20));
      return increment(name, delta);
    };
    const before = { ...store.calls };
    const deadline = Date.now() + 1800;
    let reads = 0;
    await Promise.all(
      Array.from({ length: 8 }, async (_, i) => {
        while (Date.now() < deadline) {
          expect(await db.transact((tx) => tx.getString('t', `k${i}`, 'v'))).toBe(String(i));
          reads++;
        }
      }),
    );
    await db.close();
    const stamped = store.calls.readStamped - before.readStamped;
    const fetches = store.calls.incrementCounter - before.incrementCounter;
    // For the first second the oracle serves them (a few fetches, each shared) while the
    // stamped way is tried every 250 ms; once it has 4 samples, clearly faster,
    // stamped reads serve nearly all of them.
    expect(stamped).toBeGreaterThan(reads / 2);
    expect(fetches).toBeGreaterThan(0);
    expect(fetches).toBeLessThan(reads / 4);
  });
});
