import { conformanceSuite } from '@percolator/conformance';
import { CompositeStore, MemoryStore } from '@percolator/core';

// The whole suite over three in-memory stores: every table sharded across them by row key,
// one table routed to a single store, the oracle in the first. Fast, so every part runs at scale 1.
conformanceSuite({
  name: 'composite(memory x3)',
  createStore: async () => {
    const shards = [new MemoryStore(), new MemoryStore(), new MemoryStore()];
    return new CompositeStore({
      routes: [{ table: 'conf.other-table_2', store: shards[2]! }],
      default: { shards },
      counterStore: shards[0]!,
    });
  },
});
