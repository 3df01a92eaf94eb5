import { InvalidArgumentError } from '../errors.js';

/** How long one statement may wait for its reply by default. */
export const DEFAULT_QUERY_TIMEOUT_MS = 30_000;

/**
 * A `queryTimeoutMs` option: a positive integer, default DEFAULT_QUERY_TIMEOUT_MS. A
 * statement that times out may still run on the server, so an adapter reports a write
 * that timed out as StoreError 'unknown' and throws its connection away.
 */
export function validateQueryTimeout(value: unknown, option = 'queryTimeoutMs'): number {
  if (value === undefined) return DEFAULT_QUERY_TIMEOUT_MS;
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 1) {
    throw new InvalidArgumentError(`${option} must be a positive integer, got ${String(value)}`);
  }
  return value;
}
