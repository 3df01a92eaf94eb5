import { conformanceSuite } from '@percolator/conformance';
import { storeFactory } from '@percolator/connect';
import { dynamoDbTarget } from '@percolator/testkit/dynamodb';
import { afterAll } from 'vitest';

// DynamoDB Local (or PERCOLATOR_DYNAMODB_ENDPOINT) for this file; stores from
// @percolator/connect, each in its own namespace, dropped afterwards.
const db = await dynamoDbTarget();
afterAll(() => db.stop());
const stores = await storeFactory('dynamodb', {
  url: db.endpoint,
  region: db.region,
  table: db.tableName,
  prefix: 'c',
});

conformanceSuite({
  name: 'dynamodb',
  // Round trips take milliseconds (the memory store's take microseconds).
  scale: Number(process.env.PERCOLATOR_CONFORMANCE_SCALE ?? 0.1),
  createStore: stores.createStore,
  destroyStore: stores.destroyStore,
});
