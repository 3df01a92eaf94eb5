import type { CompositeStore, RowStore } from '@percolator/core';

interface DroppableStore extends RowStore {
  dropNamespace(): Promise<void>;
}

/** Drops the namespace of every store under a composite, then closes them all (closeStores). */
export async function destroyComposite(store: RowStore): Promise<void> {
  const composite = store as CompositeStore;
  const errors: unknown[] = [];
  await Promise.all(
    composite.stores.map((s) => (s as DroppableStore).dropNamespace().catch((e: unknown) => errors.push(e))),
  );
  await composite.close();
  if (errors.length > 0) throw errors[0];
}
