import { AsyncResource } from 'node:async_hooks';

/**
 * A scope made when this module loaded, outside any caller's async context. Work the
 * client runs in the background for no one caller (the observer worker's loops, the tidy
 * step's batches) runs in it: started from a caller, it inherited the caller's context, so
 * a tracer's active span (a request's, the span around `worker.start()`) became the parent
 * of every observer run and tidy pass after it, one trace that never ended (found in
 * review). Context managers built on AsyncLocalStorage follow AsyncResource scopes.
 */
const BACKGROUND = new AsyncResource('percolator.background');

/** Runs `fn` (and what it schedules) in no caller's async context. */
export function detached<T>(fn: () => T): T {
  return BACKGROUND.runInAsyncScope(fn);
}
