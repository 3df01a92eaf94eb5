import { createRequire } from 'node:module';

/**
 * Loads a database driver for the native baselines. The drivers are dependencies of the
 * adapters, not of this package (its dependency list and the shared lockfile stay as
 * they are), so when this package cannot resolve one itself it is resolved from the
 * adapter package that depends on it.
 */
export function loadDriver<T>(adapter: 'postgres' | 'mysql' | 'redis' | 'dynamodb', specifier: string): T {
  try {
    return createRequire(import.meta.url)(specifier) as T;
  } catch {
    // Not a dependency of @percolator/bench: fall through to the adapter's.
  }
  const anchor = new URL(`../node_modules/@percolator/${adapter}/package.json`, import.meta.url);
  try {
    return createRequire(anchor)(specifier) as T;
  } catch (error) {
    throw new Error(
      `cannot load the ${specifier} driver (through @percolator/${adapter}): ${String(error)}`,
      {
        cause: error,
      },
    );
  }
}
