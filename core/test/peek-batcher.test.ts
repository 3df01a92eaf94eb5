import { describe, expect, it } from 'vitest';
import { MemoryStore, type RowRef, StoreError } from '../src/index.js';
import { PeekBatcher } from '../src/peek-batcher.js';

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
        {
          ...store,
          name: store.name,
          capabilities: store.capabilities,
          read: store.read.bind(store),
          checkAndSet: store.checkAndSet.bind(store),
          close: store.close.bind(store),
          readPeeked: async (r, c) => {
            const reply = await peeked(r, c);
            return { ...reply, rows: broken(reply.rows) as never };
          },
        },
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
});
