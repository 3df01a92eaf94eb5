import { describe, expect, it } from 'vitest';
import { isRetryable, LocalOracle, MemoryStore, Percolator, StoreError } from '../src/index.js';

describe('StoreError retryable', () => {
  it('defaults to retryable exactly when the call was not applied (as before)', () => {
    const no = new StoreError('down', 'no');
    expect(no.retryable).toBe(true);
    expect(no.code).toBe('STORE_UNAVAILABLE');
    const unknown = new StoreError('lost reply', 'unknown');
    expect(unknown.retryable).toBe(false);
    expect(unknown.code).toBe('STORE_AMBIGUOUS');
    expect(new StoreError('down', 'no', { cause: new Error('x') }).retryable).toBe(true);
  });

  it('takes retryable: false for failures running again cannot fix (authentication)', () => {
    const cause = new Error('password authentication failed');
    const error = new StoreError('auth', 'no', { cause, retryable: false });
    expect(error.retryable).toBe(false);
    expect(isRetryable(error)).toBe(false);
    expect(error.applied).toBe('no');
    expect(error.code).toBe('STORE_UNAVAILABLE');
    expect(error.cause).toBe(cause);
  });

  it('never makes a call that may have been applied retryable', () => {
    expect(new StoreError('lost', 'unknown', { retryable: true }).retryable).toBe(false);
    expect(new StoreError('down', 'no', { retryable: true }).retryable).toBe(true);
  });

  it('db.transact makes one attempt on a non-retryable StoreError, and retries a retryable one', async () => {
    for (const retryable of [false, true]) {
      // Every data call fails, as on a store whose credentials were revoked. An in-process
      // oracle, so the failure comes from the transaction's own read.
      const failing = new Proxy(new MemoryStore(), {
        get(target, property, receiver) {
          const value = Reflect.get(target, property, receiver);
          if (typeof value !== 'function') return value;
          if (property === 'close') return value.bind(target);
          return async () => {
            throw new StoreError('denied', 'no', { retryable });
          };
        },
      });
      const db = new Percolator({ store: failing, oracle: new LocalOracle() });
      let attempts = 0;
      const outcome = db.transact(
        async (tx) => {
          attempts++;
          await tx.get('t', 'r', 'c');
        },
        { maxAttempts: 3 },
      );
      await expect(outcome).rejects.toMatchObject({ code: 'STORE_UNAVAILABLE', retryable });
      expect(attempts).toBe(retryable ? 3 : 1);
      await db.close();
    }
  });
});
