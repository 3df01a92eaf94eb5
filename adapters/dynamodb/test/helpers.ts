import { uniqueNamespace } from '@percolator/testkit';
import { type DynamoDbTarget, dynamoDbTarget } from '@percolator/testkit/dynamodb';
import { afterAll, beforeAll } from 'vitest';
import { createDynamoDbStore, type DynamoDbRowStore, type DynamoDbStoreOptions } from '../src/store.js';

/**
 * One DynamoDB per test file: DynamoDB Local started in beforeAll (a free port,
 * in-memory) and stopped in afterAll, or PERCOLATOR_DYNAMODB_ENDPOINT if set. Stores
 * get unique namespaces and are dropped and closed afterwards.
 */
export function useDynamoDb() {
  let target: DynamoDbTarget | undefined;
  const stores: DynamoDbRowStore[] = [];

  beforeAll(async () => {
    target = await dynamoDbTarget();
  });

  afterAll(async () => {
    // Drop through a fresh store: a test may have closed its own.
    for (const store of stores) {
      await store.close();
      if (target === undefined) continue;
      const cleaner = await createDynamoDbStore({
        ...target.storeOptions(store.namespace),
        tableName: store.tableName,
        createTable: false,
      }).catch(() => undefined);
      await cleaner?.dropNamespace();
      await cleaner?.close();
    }
    await target?.stop();
  });

  const env = () => {
    if (target === undefined) throw new Error('DynamoDB target not started (beforeAll failed?)');
    return target;
  };

  return {
    target: env,
    /** A store on a fresh namespace, cleaned up after the file. */
    async store(extra: Partial<DynamoDbStoreOptions> = {}): Promise<DynamoDbRowStore> {
      const store = await createDynamoDbStore({ ...env().storeOptions(uniqueNamespace()), ...extra });
      stores.push(store);
      return store;
    },
    /** Registers a store created elsewhere for cleanup. */
    track(store: DynamoDbRowStore): DynamoDbRowStore {
      stores.push(store);
      return store;
    },
  };
}

/** A fresh namespace per test, so concurrent runs never share data. */
export { uniqueNamespace };

export const bytes = (text: string) => new TextEncoder().encode(text);
export const text = (data: Uint8Array) => new TextDecoder().decode(data);
