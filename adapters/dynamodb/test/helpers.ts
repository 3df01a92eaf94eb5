import { uniqueNamespace } from '@percolator/testkit';
import { type DynamoDbTarget, dynamoDbTarget } from '@percolator/testkit/dynamodb';
import { afterAll, beforeAll } from 'vitest';
import { createDynamoDbStore, type DynamoDbRowStore, type DynamoDbStoreOptions } from '../src/store.js';

/**
 * One DynamoDB per test file: DynamoDB Local started in beforeAll (a free port,
 * in-memory) and stopped in afterAll, or PERCOLATOR_DYNAMODB_ENDPOINT if set. Stores
 * get unique namespaces and are closed afterwards; on an endpoint of the environment's,
 * each namespace is dropped too (a private DynamoDB Local goes away whole).
 */
export function useDynamoDb() {
  let target: DynamoDbTarget | undefined;
  const stores: DynamoDbRowStore[] = [];

  beforeAll(async () => {
    target = await dynamoDbTarget();
  });

  afterAll(async () => {
    try {
      for (const store of stores) await store.close();
      // A DynamoDB Local of our own goes away whole with its process (in memory): dropping
      // each namespace first would only scan its shared table once per store (a file's
      // stores took over two minutes that way on a slow machine).
      if (target === undefined || target.local) return;
      // Drop through a fresh store (a test may have closed its own), each namespace once.
      const dropped = new Set<string>();
      for (const store of stores) {
        const id = `${store.tableName}\u0000${store.namespace}`;
        if (dropped.has(id)) continue;
        dropped.add(id);
        const cleaner = await createDynamoDbStore({
          ...target.storeOptions(store.namespace),
          tableName: store.tableName,
          createTable: false,
        }).catch(() => undefined);
        await cleaner?.dropNamespace();
        await cleaner?.close();
      }
    } finally {
      // Never leave the JVM running, whatever failed above.
      await target?.stop();
    }
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
