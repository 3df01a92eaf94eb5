import { randomBytes } from 'node:crypto';
import { InvalidArgumentError, type RowStore } from '@percolator/core';
import type { BackendName } from './backends.js';
import { type ConnectedStore, type ConnectOptions, describeTarget, openStore } from './open.js';

let counter = 0;
/**
 * A namespace no other run uses: `prefix` + "_" + 8 random hex + "_" + a counter, within
 * the adapters' rule /^[a-z][a-z0-9_]{0,31}$/ (prefix: /^[a-z][a-z0-9]{0,9}$/).
 */
export function freshNamespace(prefix = 'ns'): string {
  if (!/^[a-z][a-z0-9]{0,9}$/.test(prefix)) {
    throw new InvalidArgumentError(
      `namespace prefix must match /^[a-z][a-z0-9]{0,9}$/, got ${JSON.stringify(prefix)}`,
    );
  }
  return `${prefix}_${randomBytes(4).toString('hex')}_${(counter++).toString(36)}`.slice(0, 32);
}

/**
 * Stores on demand, each in a fresh namespace that `destroyStore` drops: the shape
 * `conformanceSuite` and `runConformance` take (`createStore` / `destroyStore`).
 */
export interface StoreFactory {
  readonly backend: BackendName;
  /** Where the stores connect, with any password hidden. */
  readonly target: string;
  createStore(): Promise<RowStore>;
  /** Drops the store's namespace, then closes it (and its client). */
  destroyStore(store: RowStore): Promise<void>;
}

export interface StoreFactoryOptions extends Omit<ConnectOptions, 'namespace'> {
  /** Start of every namespace (see freshNamespace). Default "conf". */
  readonly prefix?: string;
}

export async function storeFactory(
  backend: BackendName,
  options: StoreFactoryOptions = {},
): Promise<StoreFactory> {
  const { prefix = 'conf', ...connect } = options;
  freshNamespace(prefix); // checks the prefix now, not at the first store
  const open = new WeakMap<RowStore, ConnectedStore>();
  return {
    backend,
    target: await describeTarget(backend, connect),
    async createStore() {
      const c = await openStore(backend, { ...connect, namespace: freshNamespace(prefix) });
      open.set(c.store, c);
      return c.store;
    },
    async destroyStore(store) {
      const c = open.get(store);
      if (c === undefined) throw new Error('destroyStore: not a store this factory created');
      open.delete(store);
      try {
        await c.dropNamespace();
      } finally {
        await c.close();
      }
    },
  };
}
