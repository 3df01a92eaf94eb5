import { conformanceSuite } from '@percolator/conformance';
import { MemoryStore } from '@percolator/core';

// The reference store runs the whole suite: every part, every capability.
conformanceSuite({
  name: 'memory',
  createStore: async () => new MemoryStore(),
});

// And again declaring Redis's cost hint: the client splits its shared peeks and shared
// stamped steps among three calls in flight (core/src/sharing.ts), so the protocol, history
// and fault cases also run with calls sent before their turn ends.
conformanceSuite({
  name: 'memory, three shared calls in flight',
  createStore: async () => new MemoryStore({ sharedCallsInFlight: 3 }),
  parts: ['protocol', 'history', 'faults'],
});
