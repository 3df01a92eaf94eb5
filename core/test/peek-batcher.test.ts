import { describe, expect, it } from 'vitest';
import { MemoryStore, type RowRef, StoreError } from '../src/index.js';
import { PeekBatcher } from '../src/peek-batcher.js';
import type { RowStore } from '../src/store.js';

/** `store` with its `readPeeked` replaced: a store no checked store guards. */
function withReadPeeked(store: MemoryStore, readPeeked: RowStore['readPeeked']): RowStore {
  return {
    ...store,
    name: store.name,
    capabilities: store.capabilities,
    read: store.read.bind(store),
    checkAndSet: store.checkAndSet.bind(store),
    close: store.close.bind(store),
    readPeeked,
  };
}

/**
 * The batcher on its own, over a store no checked store guards (the client always puts one
 * under it, which refuses a broken reply first): what it does with a reply of the wrong size.
 */
describe('PeekBatcher', () => {
  it('a reply with the wrong number of rows fails every waiter (alone or shared), never hands out rows cut from the wrong place', async () => {
    const store = new MemoryStore();
    const counter = 'c';
    const refs = (...keys: string[]): RowRef[] => keys.map((key) => ({ table: 't', key }));
    for (const broken of [
      (rows: unknown[]) => rows.slice(1),
      (rows: unknown[]) => [...rows, null],
      () => 'not rows',
    ]) {
      const peeked = store.readPeeked.bind(store);
      const batcher = new PeekBatcher(
        withReadPeeked(store, async (r, c) => {
          const reply = await peeked(r, c);
          return { ...reply, rows: broken(reply.rows) as never };
        }),
        counter,
      );
      const shared = await Promise.allSettled([batcher.peek(refs('a', 'b')), batcher.peek(refs('c'))]);
      const alone = await Promise.allSettled([batcher.peek(refs('a', 'b'))]);
      for (const outcome of [...shared, ...alone]) {
        expect(outcome.status).toBe('rejected');
        const reason = (outcome as PromiseRejectedResult).reason;
        expect(reason).toBeInstanceOf(StoreError);
        expect(reason).toMatchObject({ retryable: false, applied: 'no' });
        expect(String(reason.message)).toContain('readPeeked broke the store contract');
      }
    }
  });

  it('a reply of the right size: each waiter gets its own rows, in its own order', async () => {
    const store = new MemoryStore();
    const state = new Uint8Array([1, 2, 3]);
    await store.checkAndSet({ table: 't', key: 'b', expected: null, state });
    const batcher = new PeekBatcher(store, 'c');
    const [first, second] = await Promise.all([
      batcher.peek([
        { table: 't', key: 'a' },
        { table: 't', key: 'b' },
      ]),
      batcher.peek([{ table: 't', key: 'b' }]),
    ]);
    expect(first.rows.map((r) => r?.state)).toEqual([undefined, state]);
    expect(second.rows.map((r) => r?.state)).toEqual([state]);
    expect(first.timestamp).toBe(second.timestamp);
  });

  it('a store that throws instead of rejecting: each waiter of that call gets the error, and the next call goes out', async () => {
    const store = new MemoryStore();
    await store.checkAndSet({ table: 't', key: 'a', expected: null, state: new Uint8Array([7]) });
    let throwing = true;
    const error = new StoreError('injected: thrown, not rejected', 'no');
    const batcher = new PeekBatcher(
      withReadPeeked(store, (refs, counter) => {
        if (throwing) throw error;
        return store.readPeeked(refs, counter);
      }),
      'c',
    );
    const outcomes = await Promise.allSettled([
      batcher.peek([{ table: 't', key: 'a' }]),
      batcher.peek([{ table: 't', key: 'b' }]),
    ]);
    expect(outcomes).toEqual([
      { status: 'rejected', reason: error },
      { status: 'rejected', reason: error },
    ]);
    throwing = false;
    const reply = await batcher.peek([{ table: 't', key: 'a' }]);
    expect(reply.rows[0]?.state).toEqual(new Uint8Array([7]));
  });
});

/**
 * A store that declares `sharedCallsInFlight` (Redis): what a turn asks is split among
 * shared peeks sent at once (sharing.ts), each waiter still getting its own rows.
 */
describe('PeekBatcher with calls in flight to spare', () => {
  /** A batcher over a memory store holding rows k0..k9, recording each peek's size. */
  async function recorded(callsInFlight: number) {
    const store = new MemoryStore();
    for (let i = 0; i < 10; i++)
      await store.checkAndSet({ table: 't', key: `k${i}`, expected: null, state: new Uint8Array([i]) });
    const sizes: number[] = [];
    /** The call (0 the first) to fail, if any. */
    let fail: number | undefined;
    const batcher = new PeekBatcher(
      withReadPeeked(store, async (refs, counter) => {
        sizes.push(refs.length);
        if (sizes.length - 1 === fail) throw new StoreError('injected: connection lost', 'no');
        return store.readPeeked(refs, counter);
      }),
      'c',
      callsInFlight,
    );
    const ask = (keys: readonly number[]) => keys.map((i) => batcher.peek([{ table: 't', key: `k${i}` }]));
    return { sizes, ask, failing: (call: number | undefined) => (fail = call) };
  }

  it('one call in flight: the eight peeks of a turn are one call, sent when the turn ends', async () => {
    const { sizes, ask } = await recorded(1);
    const peeks = ask([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(sizes).toEqual([]);
    const replies = await Promise.all(peeks);
    expect(sizes).toEqual([8]);
    expect(replies.map((r) => r.rows[0]?.state[0])).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
  });

  it('three in flight: the peeks of a turn go in calls sized by what is outstanding, most of them before the turn ends', async () => {
    const { sizes, ask } = await recorded(3);
    const peeks = ask([0, 1, 2, 3, 4, 5, 6, 7]);
    // Each call takes its share of the rows asked and not answered (sent ones included):
    // 1 of 2, 1 of 3, 2 of 5, 3 of 8; the last row waits for the turn to end.
    expect(sizes).toEqual([1, 1, 2, 3]);
    const replies = await Promise.all(peeks);
    expect(sizes).toEqual([1, 1, 2, 3, 1]);
    // Each waiter its own row, whichever call carried it.
    expect(replies.map((r) => r.rows[0]?.state[0])).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    // All answered: the next turn starts from nothing outstanding, as the first did.
    sizes.length = 0;
    await Promise.all(ask([0, 1, 2, 3, 4, 5, 6, 7]));
    expect(sizes).toEqual([1, 1, 2, 3, 1]);
  });

  it('three in flight: a failed call fails only its own waiters, and its rows stop counting as outstanding', async () => {
    const { sizes, ask, failing } = await recorded(3);
    failing(2);
    const outcomes = await Promise.allSettled(ask([0, 1, 2, 3, 4, 5, 6, 7]));
    // The third call carried rows 2 and 3.
    expect(outcomes.map((o) => o.status)).toEqual([
      'fulfilled',
      'fulfilled',
      'rejected',
      'rejected',
      'fulfilled',
      'fulfilled',
      'fulfilled',
      'fulfilled',
    ]);
    failing(undefined);
    sizes.length = 0;
    const replies = await Promise.all(ask([0, 1, 2, 3, 4, 5, 6, 7]));
    expect(sizes).toEqual([1, 1, 2, 3, 1]);
    expect(replies.map((r) => r.rows[0]?.state[0])).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
  });
});
