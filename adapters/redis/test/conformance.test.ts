import { conformanceSuite } from '@percolator/conformance';
import type { RowStore } from '@percolator/core';
import type { RedisStore } from '../src/store.js';
import { standaloneStore, uniqueNamespace } from './helpers.js';

// Every store gets its own namespace and its own connection (the store's client), and is
// dropped afterwards. Redis answers in ~0.1 ms on loopback, so a mid-size scale fits.
conformanceSuite({
  name: 'redis',
  createStore: () => standaloneStore(uniqueNamespace('conf')),
  destroyStore: async (store: RowStore) => {
    await (store as RedisStore).dropNamespace();
    await store.close();
  },
  scale: Number(process.env.PERCOLATOR_CONFORMANCE_SCALE ?? 0.5),
});
