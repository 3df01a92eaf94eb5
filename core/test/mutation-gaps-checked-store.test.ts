import { checkedStore, MemoryStore, type RowStore, StoreError } from '@percolator/core';
import { describe, expect, it } from 'vitest';

/**
 * Cases found by mutation testing of the contract check of adapter replies
 * (checked-store.ts): each fails with a small, plausible bug there that the rest of the suite
 * let through. A reply that breaks the contract is a StoreError that is never retryable:
 * 'unknown' for a write (it may have landed; the core re-reads), 'no' for a read.
 */

const bytes = (text: string) => new TextEncoder().encode(text);

/** A stamped state: a format byte, the 8-byte slot, then `tail`. */
const template = (tail: string) => Uint8Array.from([9, 0, 0, 0, 0, 0, 0, 0, 0, ...bytes(tail)]);

type Patch = Partial<Record<keyof RowStore, unknown>>;

/** A memory store whose methods in `patch` answer what the patch says, behind the contract check. */
function lying(patch: (inner: MemoryStore) => Patch): { store: RowStore; inner: MemoryStore } {
  const inner = new MemoryStore();
  Object.assign(inner, patch(inner));
  return { store: checkedStore(inner), inner };
}

async function broken(promise: Promise<unknown>, applied: 'no' | 'unknown'): Promise<void> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(StoreError);
  expect(error).toMatchObject({ applied, retryable: false });
  expect((error as Error).message).toContain('broke the store contract');
}

describe('checked store: malformed write replies are unknown, never retryable', () => {
  it('a CAS answered ok with an empty version', async () => {
    const { store, inner } = lying((memory) => {
      const cas = memory.checkAndSet.bind(memory);
      return {
        checkAndSet: async (request: Parameters<MemoryStore['checkAndSet']>[0]) => {
          await cas(request);
          return { ok: true, version: '' };
        },
      };
    });
    await broken(store.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('x') }), 'unknown');
    // It did land: 'no' would have let the caller take the write for not applied.
    expect(await inner.read('t', 'k')).not.toBeNull();
  });

  it('a CAS answered with ok that is not a boolean, or a failure whose row is not a row', async () => {
    const answers: unknown[] = [
      { ok: 'yes', version: '1' },
      { ok: 1, version: '1' },
      { ok: false, current: { version: '1', state: 'not bytes' } },
      { ok: false, current: { version: '', state: bytes('x') } },
    ];
    for (const answer of answers) {
      const { store } = lying(() => ({ checkAndSet: async () => answer }));
      await broken(store.checkAndSet({ table: 't', key: 'k', expected: null, state: bytes('x') }), 'unknown');
    }
  });

  it('a checkAndSetMany answered with one result too few (or too many)', async () => {
    for (const drop of [1, -1]) {
      const { store } = lying((inner) => ({
        checkAndSetMany: async (requests: Parameters<MemoryStore['checkAndSet']>[0][]) => {
          const results = [];
          for (const request of requests) results.push(await inner.checkAndSet(request));
          return drop > 0 ? results.slice(drop) : [...results, results[0]];
        },
      }));
      await broken(
        store.checkAndSetMany!([
          { table: 't', key: 'a', expected: null, state: bytes('a') },
          { table: 't', key: 'b', expected: null, state: bytes('b') },
        ]),
        'unknown',
      );
    }
  });

  it('a stamped CAS answered ok without a timestamp (or with 0)', async () => {
    for (const timestamp of [undefined, 0, 1.5]) {
      const { store } = lying(() => ({
        checkAndSetStamped: async () => ({ ok: true, version: '7', timestamp }),
      }));
      await broken(
        store.checkAndSetStamped!({ table: 't', key: 'k', expected: null, state: template('x') }, 'c'),
        'unknown',
      );
    }
  });

  it('a stamped CAS of many rows answered with versions that are not one per request', async () => {
    const answers = [
      { ok: true, versions: ['1'], timestamp: 3 },
      { ok: true, versions: ['1', ''], timestamp: 3 },
      { ok: true, versions: ['1', '2'], timestamp: 0 },
      { ok: false, current: [null] },
    ];
    for (const answer of answers) {
      const { store } = lying(() => ({ checkAndSetStampedMany: async () => answer }));
      await broken(
        store.checkAndSetStampedMany!(
          [
            { table: 't', key: 'a', expected: null, state: template('a') },
            { table: 't', key: 'b', expected: null, state: template('b') },
          ],
          'c',
        ),
        'unknown',
      );
    }
  });

  it('a counter increment answered below its delta (a counter never drawn from), or not a safe integer', async () => {
    for (const value of [0, 2, 2 ** 53, Number.NaN]) {
      const { store } = lying(() => ({ incrementCounter: async () => value }));
      await broken(store.incrementCounter!('c', 3), 'unknown');
    }
  });
});

describe('checked store: malformed read replies are no, never retryable', () => {
  it('a read answered with a state that is not bytes, or an empty version', async () => {
    for (const row of [
      { version: '1', state: 'text' },
      { version: '', state: bytes('x') },
      { version: 1, state: bytes('x') },
    ]) {
      const { store } = lying(() => ({ read: async () => row }));
      await broken(store.read('t', 'k'), 'no');
    }
  });

  it('a readMany answered with a row too few', async () => {
    const { store } = lying(() => ({ readMany: async () => [null] }));
    await broken(
      store.readMany!([
        { table: 't', key: 'a' },
        { table: 't', key: 'b' },
      ]),
      'no',
    );
  });
});
