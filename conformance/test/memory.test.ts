import { conformanceSuite } from '@percolator/conformance';
import { MemoryStore } from '@percolator/core';

// The reference store runs the whole suite: every part, every capability.
conformanceSuite({
  name: 'memory',
  createStore: async () => new MemoryStore(),
});
