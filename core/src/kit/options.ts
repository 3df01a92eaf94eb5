import { checkInteger, MAX_TIMER_MS } from '../options.js';

/** How long one statement may wait for its reply by default. */
export const DEFAULT_QUERY_TIMEOUT_MS = 30_000;

/**
 * A `queryTimeoutMs` option: a positive integer up to 2^31 - 1 (MAX_TIMER_MS), default
 * DEFAULT_QUERY_TIMEOUT_MS (or `fallback`). A statement that times out may still run on the
 * server, so an adapter reports a write that timed out as StoreError 'unknown' and throws
 * its connection away. The ceiling is the range of Node's timers: a longer one fires after
 * 1 ms, which would time out every call (and report every write 'unknown').
 */
export function validateQueryTimeout(
  value: unknown,
  option = 'queryTimeoutMs',
  fallback = DEFAULT_QUERY_TIMEOUT_MS,
): number {
  if (value === undefined) return fallback;
  checkInteger(option, value, 1, MAX_TIMER_MS);
  return value as number;
}
