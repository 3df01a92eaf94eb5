import type { RowStore } from '@percolator/core';
import { methodNames } from './counting-store.js';
import { splitRtt } from './delay-proxy.js';

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * `--rtt` on the in-memory store, which has no socket to put a proxy in front of: every
 * call waits the request's share of the round trip before it reaches the store, and the
 * reply's share after (splitRtt). Capabilities and optional methods are the store's own.
 */
export function delayedStore(inner: RowStore, rttMs: number): RowStore {
  const { up, down } = splitRtt(rttMs);
  const out: Record<string, unknown> = { name: inner.name, capabilities: inner.capabilities };
  for (const method of methodNames(inner)) {
    if (method === 'constructor') continue;
    const fn = (inner as unknown as Record<string, (...args: unknown[]) => unknown>)[method]!;
    out[method] =
      method === 'close'
        ? () => inner.close()
        : async (...args: unknown[]) => {
            if (up > 0) await sleep(up);
            const result = await fn.apply(inner, args);
            if (down > 0) await sleep(down);
            return result;
          };
  }
  return out as unknown as RowStore;
}
