import { conformanceSuite } from '@percolator/conformance';
import type { RowStore } from '@percolator/core';
import { createDynamoDbStore, type DynamoDbRowStore } from '../src/store.js';
import { uniqueNamespace, useDynamoDb } from './helpers.js';

// DynamoDB Local (or PERCOLATOR_DYNAMODB_ENDPOINT) for this file; every store gets its own namespace.
const db = useDynamoDb();

conformanceSuite({
  name: 'dynamodb',
  // Round trips take milliseconds (the memory store's take microseconds).
  scale: Number(process.env.PERCOLATOR_CONFORMANCE_SCALE ?? 0.1),
  createStore: () => createDynamoDbStore(db.target().storeOptions(uniqueNamespace('c'))),
  destroyStore: async (store: RowStore) => {
    const dynamo = store as DynamoDbRowStore;
    await dynamo.dropNamespace().catch(() => {});
    await dynamo.close();
  },
});
