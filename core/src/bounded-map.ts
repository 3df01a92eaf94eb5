/**
 * A map that forgets its oldest entries past a size: what a client remembers only to save
 * work (versions of the version rows it created, released secondaries lists), where
 * forgetting is always safe.
 *
 * Two generations, not first-in-first-out eviction from one Map: deleting a Map's first
 * entry again and again leaves holes that V8 skips on every `keys().next()` until the
 * table is rehashed, which cost about 11 µs an insert at 20,000 entries. Here an insert
 * costs a Map.set, and once the young generation holds half the bound it becomes the old
 * one and the old one is dropped whole. So between half the bound and the bound of the
 * most recently set entries are kept.
 */
export class BoundedMap<K, V> {
  private young = new Map<K, V>();
  private old = new Map<K, V>();

  constructor(private readonly maxEntries: number) {}

  get(key: K): V | undefined {
    const value = this.young.get(key);
    return value !== undefined ? value : this.old.get(key);
  }

  has(key: K): boolean {
    return this.young.has(key) || this.old.has(key);
  }

  set(key: K, value: V): void {
    if (this.young.size >= Math.max(1, this.maxEntries >> 1)) {
      this.old = this.young;
      this.young = new Map();
    }
    this.old.delete(key);
    this.young.set(key, value);
  }

  delete(key: K): void {
    this.young.delete(key);
    this.old.delete(key);
  }

  /** Whether nothing is remembered: a cheap test before any lookup. */
  get empty(): boolean {
    return this.young.size === 0 && this.old.size === 0;
  }

  get size(): number {
    return this.young.size + this.old.size;
  }
}
