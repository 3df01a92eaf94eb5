/** Full-jitter exponential backoff: random in [0, min(cap, base * 2^attempt)]. */
export function backoffMs(attempt: number, baseMs = 2, capMs = 200): number {
  return Math.random() * Math.min(capMs, baseMs * 2 ** Math.min(attempt, 16));
}

/** Runs `run` on a later macrotask, after the current turn of the event loop (setImmediate where there is one). */
export const nextTurn: (run: () => void) => void =
  typeof setImmediate === 'function' ? (run) => setImmediate(run) : (run) => setTimeout(run, 0);

export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  if (!signal) return new Promise((resolve) => setTimeout(resolve, ms));
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    if (signal.aborted) done();
    else signal.addEventListener('abort', done, { once: true });
  });
}

/** Resolves when `promise` settles, `ms` pass or `signal` aborts, whichever is first; leaves no timer behind. */
export function waitAtMost(promise: Promise<unknown>, ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    if (signal?.aborted) return done();
    signal?.addEventListener('abort', done, { once: true });
    promise.then(done, done);
  });
}
