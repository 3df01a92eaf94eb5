/**
 * How the CLI opens a backend. The suite itself (index.ts) depends on core only; the CLI
 * opens stores through @percolator/connect (the one backend list) and, for a DynamoDB run
 * with no endpoint, starts DynamoDB Local through @percolator/testkit. Both are optional
 * peer dependencies, imported here by computed name, so the library never needs them.
 */
import type * as Connect from '@percolator/connect';
import type { RowStore } from '@percolator/core';
import type * as TestkitDynamoDb from '@percolator/testkit/dynamodb';

/** Imports an optional peer of the CLI, or throws an error that says how to get it. */
async function peer<T>(specifier: string, why: string): Promise<T> {
  try {
    return (await import(/* @vite-ignore */ specifier)) as T;
  } catch (error) {
    const code = (error as { code?: string }).code;
    const missing = code === 'ERR_MODULE_NOT_FOUND' && String((error as Error).message).includes(specifier);
    throw new Error(
      missing
        ? `${why} needs ${specifier}: install it next to @percolator/conformance (npm install ${specifier}); ` +
            `in the percolator repository run \`pnpm build\``
        : `cannot load ${specifier} (is it built? run \`pnpm build\`): ${(error as Error).message}`,
      { cause: error },
    );
  }
}

/** @percolator/connect, loaded once. */
export const connect: typeof Connect = await peer<typeof Connect>(
  '@percolator/connect',
  'the percolator-conformance CLI',
);

export const BACKENDS = connect.BACKENDS;
export type BackendName = Connect.BackendName;

/** Workload scale that keeps each backend's run to a few minutes at most. */
export const DEFAULT_SCALES: Record<BackendName, number> = {
  memory: 1,
  redis: 0.5,
  'redis-cluster': 0.5,
  postgres: 0.25,
  mysql: 0.25,
  dynamodb: 0.1,
};

export interface BackendOptions {
  /** Connection URL (cluster: comma-separated host:port list; DynamoDB: endpoint). */
  readonly url?: string;
  /** DynamoDB region and table. */
  readonly region?: string;
  readonly table?: string;
}

export interface Backend {
  readonly name: BackendName;
  /** Where it connects, with any password hidden. */
  readonly target: string;
  createStore(): Promise<RowStore>;
  destroyStore(store: RowStore): Promise<void>;
  /** Stops anything the backend started (DynamoDB Local). */
  close(): Promise<void>;
}

/** A store factory for a run: every store in a fresh namespace, dropped after its case. */
export async function openBackend(name: BackendName, options: BackendOptions = {}): Promise<Backend> {
  const settings = {
    ...(options.url === undefined ? {} : { url: options.url }),
    ...(options.region === undefined ? {} : { region: options.region }),
    ...(options.table === undefined ? {} : { table: options.table }),
  };
  // No endpoint for DynamoDB: a DynamoDB Local started for this run.
  if (name === 'dynamodb' && connect.configuredUrl(name, settings) === undefined) {
    const testkit = await peer<typeof TestkitDynamoDb>(
      '@percolator/testkit/dynamodb',
      'a DynamoDB run without --url or PERCOLATOR_DYNAMODB_ENDPOINT (it starts DynamoDB Local)',
    );
    const local = await testkit.startDynamoDbLocal();
    try {
      const factory = await connect.storeFactory(name, { ...settings, url: local.endpoint });
      return {
        name,
        ...bind(factory),
        target: `${factory.target} (DynamoDB Local started for this run)`,
        close: () => local.stop(),
      };
    } catch (error) {
      await local.stop();
      throw error;
    }
  }
  const factory = await connect.storeFactory(name, settings);
  return { name, target: factory.target, ...bind(factory), close: async () => {} };
}

function bind(factory: Connect.StoreFactory) {
  return {
    createStore: () => factory.createStore(),
    destroyStore: (store: RowStore) => factory.destroyStore(store),
  };
}
