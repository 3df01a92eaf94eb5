import { MemoryStore, Percolator } from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { InstrumentedStore } from './support.js';

/** Eight read-only transactions started in the same tick; the calls they made. */
async function eightReaders(stampedReadUnderLoad: boolean) {
  const store = new InstrumentedStore(new MemoryStore(), { stampedReadUnderLoad });
  const db = new Percolator({ store });
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
