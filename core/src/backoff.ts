/** Full-jitter exponential backoff: random in [0, min(cap, base * 2^attempt)]. */
export function backoffMs(attempt: number, baseMs = 2, capMs = 200): number {
  return Math.random() * Math.min(capMs, baseMs * 2 ** Math.min(attempt, 16));
}

/** Runs `run` on a later macrotask, after the current turn of the event loop (setImmediate where there is one). */
export const nextTurn: (run: () => void) => void =
  typeof setImmediate === 'function' ? (run) => setImmediate(run) : (run) => setTimeout(run, 0);

/**
 * The callbacks waiting on each caller's signal, behind ONE listener of ours per signal:
 * a listener per wait put more than 10 on a signal shared by many transactions (one
 * shutdown signal for a whole service), and Node warned of a leak (found in review). The
 * listener goes when its last callback does.
 */
const watched = new WeakMap<
  AbortSignal,
  { readonly callbacks: Set<() => void>; readonly fire: () => void }
>();

/** Calls `callback` once when `signal` aborts (it must not have yet); returns the way to stop watching. */
export function onAbort(signal: AbortSignal, callback: () => void): () => void {
  let entry = watched.get(signal);
  if (!entry) {
    const callbacks = new Set<() => void>();
    const fire = () => {
      watched.delete(signal);
      for (const f of [...callbacks]) f();
      callbacks.clear();
    };
    entry = { callbacks, fire };
    watched.set(signal, entry);
    signal.addEventListener('abort', fire, { once: true });
  }
  const { callbacks, fire } = entry;
  callbacks.add(callback);
  return () => {
    if (!callbacks.delete(callback) || callbacks.size > 0) return;
    if (watched.get(signal)?.callbacks === callbacks) watched.delete(signal);
    signal.removeEventListener('abort', fire);
  };
}

export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  if (!signal) return new Promise((resolve) => setTimeout(resolve, ms));
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      stop();
      resolve();
    };
    const timer = setTimeout(done, ms);
    const stop = onAbort(signal, done);
  });
}

/** Resolves when `promise` settles, `ms` pass or `signal` aborts, whichever is first; leaves no timer behind. */
export function waitAtMost(promise: Promise<unknown>, ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    let stop: (() => void) | undefined;
    const done = () => {
      clearTimeout(timer);
      stop?.();
      resolve();
    };
    const timer = setTimeout(done, ms);
    if (signal) stop = onAbort(signal, done);
    promise.then(done, done);
  });
}
