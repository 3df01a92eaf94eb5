import { ClientCrash, InvalidArgumentError, MemoryStore, Percolator } from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { RowCache } from '../src/row-cache.js';
import { cellOf, emptyRow, type RowState } from '../src/row-state.js';
import { AmbiguousOutcome, Guess, updateRow } from '../src/row-update.js';
import { fakeClock, InstrumentedStore } from './support.js';

/** Rows read and CAS sent (stamped or not); the start timestamp's draw is left out. */
const calls = (store: InstrumentedStore) => ({
  rowReads: store.rowReads,
  cas: store.calls.checkAndSet + store.calls.checkAndSetStamped,
});
const delta = (store: InstrumentedStore, before: ReturnType<typeof calls>) => {
  const now = calls(store);
  return { rowReads: now.rowReads - before.rowReads, cas: now.cas - before.cas };
};

describe('RowCache', () => {
  const row = (bytes: number, version = 'v1') => ({ version, state: new Uint8Array(bytes) });

  it('keeps rows up to its byte bound, least recently used out first', () => {
    const cache = new RowCache(1000);
    cache.set('t', 'a', row(300));
    cache.set('t', 'b', row(300));
    expect(cache.get('t', 'a')?.version).toBe('v1'); // a is now the most recent
    cache.set('t', 'c', row(300)); // over the bound: b goes
    expect(cache.get('t', 'b')).toBeUndefined();
    expect(cache.get('t', 'a')).toBeDefined();
    expect(cache.get('t', 'c')).toBeDefined();
    cache.set('t', 'a', row(300, 'v2')); // replaced, not counted twice
    expect(cache.get('t', 'a')?.version).toBe('v2');
    expect(cache.size).toBe(2);
  });

  it('through many evictions keeps exactly the most recently used rows that fit', () => {
    const name = (i: number) => String(i).padStart(4, '0');
    // Every row costs the same: 64 + 2 * 6 (table, separator, 4-character key) + 100 + 2 * 5.
    const cache = new RowCache(10 * (64 + 12 + 100 + 10));
    cache.set('t', 'keep', row(100, 'vkeep'));
    for (let i = 0; i < 1000; i++) {
      cache.set('t', name(i), row(100, `v${name(i)}`));
      expect(cache.get('t', 'keep')).toBeDefined(); // used again and again: never evicted
      expect(cache.size).toBe(Math.min(10, i + 2));
    }
    // The other nine are the nine written last.
    for (let i = 991; i < 1000; i++) expect(cache.get('t', name(i))?.version).toBe(`v${name(i)}`);
    expect(cache.get('t', name(990))).toBeUndefined();
    cache.delete('t', 'keep');
    expect(cache.size).toBe(9);
    cache.set('t', 'next', row(100, 'vnext'));
    cache.set('t', 'last', row(100, 'vlast'));
    expect(cache.get('t', name(991))).toBeUndefined(); // least recently used, evicted first
    expect(cache.size).toBe(10);
  });

  it('counts a buffer that states are views into once, in full: the bound is on the memory it keeps alive', () => {
    const cache = new RowCache(256 * 1024);
    // Views into one 16 KiB buffer (as the byte pool's slab): the buffer counts once.
    const slab = new ArrayBuffer(16 * 1024);
    for (let i = 0; i < 50; i++)
      cache.set('t', `s${i}`, { version: 'v', state: new Uint8Array(slab, i * 300, 300) });
    expect(cache.size).toBe(50);
    // Views into buffers of their own (a reply sliced from a larger socket read): each keeps
    // 16 KiB alive, so only what fits stays; counted by their own bytes, all 100 would.
    for (let i = 0; i < 50; i++) {
      cache.set('t', `o${i}`, { version: 'v', state: new Uint8Array(new ArrayBuffer(16 * 1024), 0, 300) });
    }
    expect(cache.size).toBeLessThan(16);
    expect(cache.size).toBeGreaterThan(10);
    expect(cache.get('t', 'o49')).toBeDefined();
    expect(cache.get('t', 's0')).toBeUndefined(); // the slab's views went first, least recently used
    // Dropping the last view of a buffer frees its count: whole-buffer rows fit again.
    for (let i = 0; i < 50; i++) cache.delete('t', `o${i}`);
    for (let i = 0; i < 14; i++) cache.set('t', `w${i}`, row(16 * 1024));
    expect(cache.size).toBe(14);
  });

  it('keeps a copy of a row whose buffer is larger than an eighth of it, not the buffer', () => {
    const cache = new RowCache(64 * 1024);
    const big = new Uint8Array(new ArrayBuffer(16 * 1024), 100, 300);
    big.fill(7);
    cache.set('t', 'r', { version: 'v', state: big });
    const kept = cache.get('t', 'r')!;
    expect(kept.state.buffer.byteLength).toBe(300);
    expect(kept.state.every((b) => b === 7)).toBe(true);
    big.fill(0); // the caller's array changes; the cache's copy does not
    expect(cache.get('t', 'r')!.state[0]).toBe(7);
    // Views into a buffer within an eighth are kept as they are.
    const small = new Uint8Array(new ArrayBuffer(4 * 1024), 0, 300);
    cache.set('t', 's', { version: 'v', state: small });
    expect(cache.get('t', 's')!.state).toBe(small);
  });

  it('remembers absent rows, forgets on delete, and never holds a row larger than its bound', () => {
    const cache = new RowCache(1000);
    cache.set('t', 'gone', null);
    expect(cache.get('t', 'gone')).toBeNull();
    cache.delete('t', 'gone');
    expect(cache.get('t', 'gone')).toBeUndefined();
    cache.set('t', 'big', row(5000));
    expect(cache.get('t', 'big')).toBeUndefined();
    expect(cache.size).toBe(0);
  });
});

describe('the row cache in transactions', () => {
  // Stores that draw a start timestamp together with reads read a blind write's rows in that
  // same round trip; on the others, the row cache saves the read before the CAS.
  const noStampedReads = () => new InstrumentedStore(new MemoryStore(), { stampedRead: false });

  it('a blind one-row write to a row the client has seen goes straight to its CAS, with no read', async () => {
    const store = noStampedReads();
    const db = new Percolator({ store });
    await db.transact(async (tx) => tx.set('t', 'k', 'v', '1'));
    const before = calls(store);
    await db.transact(async (tx) => tx.set('t', 'k', 'v', '2'));
    // One stamped CAS; the row is not read.
    expect(delta(store, before)).toEqual({ rowReads: 0, cas: 1 });
    expect(await db.transact((tx) => tx.getString('t', 'k', 'v'))).toBe('2');
    await db.close();
  });

  it('a read in a transaction that may write fills it; a read-only transaction leaves it alone', async () => {
    const store = noStampedReads();
    const other = new Percolator({ store });
    await other.transact(async (tx) => {
      tx.set('t', 'r', 'v', '1');
      tx.set('t', 'w', 'v', '1');
    });
    const db = new Percolator({ store });
    await db.transact((tx) => tx.getString('t', 'r', 'v'), { readOnly: true });
    await db.transact((tx) => tx.getString('t', 'w', 'v'));
    let before = calls(store);
    await db.transact(async (tx) => tx.set('t', 'w', 'v', '2'));
    expect(delta(store, before)).toEqual({ rowReads: 0, cas: 1 }); // seen by a read that could write
    before = calls(store);
    await db.transact(async (tx) => tx.set('t', 'r', 'v', '2'));
    expect(delta(store, before)).toEqual({ rowReads: 1, cas: 1 }); // not cached: read first
    await Promise.all([db.close(), other.close()]);
  });

  it('rowCacheBytes 0 turns it off (the row is read first); bad values are refused', async () => {
    const store = noStampedReads();
    const db = new Percolator({ store, rowCacheBytes: 0 });
    await db.transact(async (tx) => tx.set('t', 'k', 'v', '1'));
    const before = calls(store);
    await db.transact(async (tx) => tx.set('t', 'k', 'v', '2'));
    expect(delta(store, before)).toEqual({ rowReads: 1, cas: 1 });
    await db.close();
    for (const rowCacheBytes of [-1, 1.5, Number.NaN, '8' as unknown as number]) {
      expect(() => new Percolator({ store, rowCacheBytes })).toThrow(InvalidArgumentError);
    }
  });

  it('a stale guess costs one failed CAS, never a lost write: the other client’s value stays in the history', async () => {
    const store = noStampedReads();
    const a = new Percolator({ store });
    const b = new Percolator({ store });
    await a.transact(async (tx) => tx.set('t', 'k', 'v', 'a1'));
    const afterA1 = await b.begin();
    await b.transact(async (tx) => tx.set('t', 'k', 'v', 'b1'));
    const afterB1 = await b.begin();
    const before = calls(store);
    await a.transact(async (tx) => tx.set('t', 'k', 'v', 'a2')); // a's cache still holds a1's row
    // The guess failed its CAS, whose reply carried the row as it is; the second CAS landed.
    expect(delta(store, before)).toEqual({ rowReads: 0, cas: 2 });
    expect(await afterA1.getString('t', 'k', 'v')).toBe('a1');
    expect(await afterB1.getString('t', 'k', 'v')).toBe('b1');
    expect(await a.transact((tx) => tx.getString('t', 'k', 'v'))).toBe('a2');
    await Promise.all([afterA1.rollback(), afterB1.rollback(), a.close(), b.close()]);
  });

  it('a stale guess that shows no lock, on a row another client has locked: the lock is found and settled first', async () => {
    const store = new InstrumentedStore(new MemoryStore(), { stampedCheckAndSet: false });
    const clock = fakeClock();
    const a = new Percolator({ store, clock, lockTtlMs: 1000 });
    await a.transact(async (tx) => tx.set('t', 'k', 'v', 'a1'));
    // b prewrites k (and another row, so k is its primary with a secondary) and crashes.
    const b = new Percolator({
      store,
      clock,
      lockTtlMs: 1000,
      hooks: {
        onCommitStep: (e) => {
          if (e.step === 'beforeCommitPrimary') throw new ClientCrash();
        },
      },
    });
    const tx = await b.begin();
    tx.set('t', 'k', 'v', 'b1');
    tx.set('t', 'other', 'v', 'b1');
    await expect(tx.commit()).rejects.toBeInstanceOf(ClientCrash);
    await b.close();
    clock.advance(2000); // b's locks are past their TTL
    // a's cache shows k without b's lock; the CAS on that guess fails and a sees the lock.
    await a.transact(async (t) => {
      t.set('t', 'k', 'v', 'a2');
      t.set('t', 'other', 'v', 'a2');
    });
    const values = await a.transact((t) =>
      Promise.all([t.getString('t', 'k', 'v'), t.getString('t', 'other', 'v')]),
    );
    expect(values).toEqual(['a2', 'a2']);
    await a.close();
  });

  it('a decision on a guess that writes nothing, or throws, is made again on the row as read', async () => {
    const store = new InstrumentedStore();
    const db = new Percolator({ store });
    await db.transact(async (tx) => tx.set('t', 'k', 'v', 'real'));
    const env = (db as unknown as { env: Parameters<typeof updateRow>[0] }).env;
    const seen: (string | undefined)[] = [];
    // On the guess (no row) the decision says "done"; on the real row it says so too,
    // but only the real row's answer may be returned.
    const done = await updateRow(env, 't', 'k', new Guess(null), (row) => {
      seen.push(row ? `${row.cells.size} cells` : 'none');
      return { done: row ? 'real row' : 'guess' };
    });
    expect(done.result).toBe('real row');
    expect(seen).toEqual(['none', '1 cells']);
    // A decision that throws on the guess is not the answer either.
    let calls = 0;
    const thrown = await updateRow(env, 't', 'k', new Guess(null), (row) => {
      calls++;
      if (!row) throw new Error('decided on the guess');
      return { done: 'decided on the real row' };
    });
    expect(thrown.result).toBe('decided on the real row');
    expect(calls).toBe(2);
    await db.close();
  });
});

describe('updateRow after a write whose outcome is unknown', () => {
  it('a decision too large for the store on the row as re-read leaves the outcome unknown', async () => {
    const store = new InstrumentedStore(new MemoryStore({ maxStateBytes: 2000 }));
    const db = new Percolator({ store });
    const env = (db as unknown as { env: Parameters<typeof updateRow>[0] }).env;
    let cas = 0;
    // The first write lands, but its reply is lost.
    store.casFault = () => (++cas === 1 ? 'fail-after' : undefined);
    const rowOf = (bytes: number): RowState => {
      const row = emptyRow();
      cellOf(row, 'c').setValue(7, new Uint8Array(bytes).fill(1));
      return row;
    };
    // Small on the empty row; on the row as re-read (holding the lost write) too large.
    const update = updateRow(env, 't', 'k', null, (row) => ({
      write: rowOf(row ? 5000 : 100),
      result: 'written',
    }));
    // Before, the encoding's RowTooLargeError came out: "not written", for a write that landed.
    await expect(update).rejects.toBeInstanceOf(AmbiguousOutcome);
    expect((await store.inner.read('t', 'k')) !== null).toBe(true);
    await db.close();
  });

  it('a decision that fails on a bad argument (a clock reading) on the row as re-read leaves the outcome unknown', async () => {
    const store = new InstrumentedStore();
    const db = new Percolator({ store });
    const env = (db as unknown as { env: Parameters<typeof updateRow>[0] }).env;
    let cas = 0;
    store.casFault = () => (++cas === 1 ? 'fail-after' : undefined);
    const update = updateRow(env, 't', 'k', null, (row) => {
      // The re-read row holds the lost write; deciding on it takes a clock reading that fails.
      if (row) throw new InvalidArgumentError('clock returned NaN');
      const fresh = emptyRow();
      cellOf(fresh, 'c').setValue(7, new Uint8Array([1]));
      return { write: fresh, result: 'written' };
    });
    // Before, the InvalidArgumentError came out as if nothing had been written.
    await expect(update).rejects.toBeInstanceOf(AmbiguousOutcome);
    expect(await store.inner.read('t', 'k')).not.toBeNull();
    // With no earlier send in doubt, the same error is the caller's, as it was.
    const plain = updateRow(env, 't', 'k2', null, () => {
      throw new InvalidArgumentError('clock returned NaN');
    });
    await expect(plain).rejects.toBeInstanceOf(InvalidArgumentError);
    await db.close();
  });
});
