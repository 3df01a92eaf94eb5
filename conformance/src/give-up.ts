/**
 * For adapter tests of failures that retrying cannot fix (a refused password, a missing
 * privilege): the adapter must report them as StoreError with `retryable: false`, and the
 * core must then give up at once. These helpers show the "at once".
 */
import type { Percolator, RowStore } from '@percolator/core';

/** `store` with the name of every call that fails recorded in `failed`. */
export function recordFailures<S extends RowStore>(
  store: S,
): { readonly store: S; readonly failed: string[] } {
  const failed: string[] = [];
  const recorded = new Proxy(store, {
    get(target, property, receiver) {
      const value = Reflect.get(target, property, receiver);
      if (typeof value !== 'function') return value;
      return (...args: unknown[]) =>
        Promise.resolve(value.apply(target, args)).catch((error: unknown) => {
          failed.push(String(property));
          throw error;
        });
    },
  });
  return { store: recorded, failed };
}

/**
 * One `db.transact` that reads and writes cell (t, r, c): its error (undefined if it
 * committed) and how often the function ran. A non-retryable failure runs it at most once
 * (not at all if the start timestamp is what failed); a retryable one up to maxAttempts.
 */
export async function transactOnce(db: Percolator): Promise<{ error: unknown; attempts: number }> {
  let attempts = 0;
  const error = await db
    .transact(async (tx) => {
      attempts++;
      await tx.get('t', 'r', 'c');
      tx.set('t', 'r', 'c', 'after');
    })
    .then(
      () => undefined,
      (e: unknown) => e,
    );
  return { error, attempts };
}
