import { conformanceSuite } from '@percolator/conformance';
import { storeFactory } from '@percolator/connect';

// Stores from @percolator/connect (PERCOLATOR_REDIS_URL or the local default): each in its
// own namespace with its own connection, dropped afterwards. Redis answers in ~0.1 ms on
// loopback, so a mid-size scale fits.
const stores = await storeFactory('redis', { prefix: 'conf' });

conformanceSuite({
  name: 'redis',
  createStore: stores.createStore,
  destroyStore: stores.destroyStore,
  scale: Number(process.env.PERCOLATOR_CONFORMANCE_SCALE ?? 0.5),
});
