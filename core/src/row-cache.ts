import type { StoredRow } from './store.js';

/**
 * The head rows this client last saw or wrote, each with its version: a guess at a row's
 * current state, so that a write to a row the client knows can go straight to its CAS
 * instead of reading the row first. A one-row blind write is then one round trip (the
 * stamped CAS) where it would be two.
 *
 * Only ever a guess. `updateRow` and `updateRows` send a CAS that expects the guessed
 * version; if the row has moved on, the CAS fails and the store returns the row as it is
 * (the CAS contract), so a stale guess costs one failed CAS, never a wrong write. A
 * decision that does not end in a successful CAS (nothing to write, or an error such as a
 * conflict) is never taken on a guess: the row is read and the decision made again. Version
 * tokens are never reused for a key (store.ts), so a guess cannot match a later row by
 * accident.
 *
 * Bounded by bytes (the rows' states and keys), least recently used first out.
 */
export class RowCache {
  private readonly rows = new Map<string, StoredRow | null>();
  private bytes = 0;

  constructor(private readonly maxBytes: number) {}

  get(table: string, key: string): StoredRow | null | undefined {
    const id = cacheKey(table, key);
    const row = this.rows.get(id);
    if (row === undefined) return undefined;
    // Most recently used last: the Map's order is the eviction order.
    this.rows.delete(id);
    this.rows.set(id, row);
    return row;
  }

  /** The row as just read or written (null: the row does not exist). */
  set(table: string, key: string, row: StoredRow | null): void {
    const id = cacheKey(table, key);
    this.drop(id);
    const size = sizeOf(id, row);
    if (size > this.maxBytes) return;
    this.rows.set(id, row);
    this.bytes += size;
    for (const [oldest, old] of this.rows) {
      if (this.bytes <= this.maxBytes) break;
      this.rows.delete(oldest);
      this.bytes -= sizeOf(oldest, old);
    }
  }

  /** Forget a row (its last write's outcome is unknown). */
  delete(table: string, key: string): void {
    this.drop(cacheKey(table, key));
  }

  get size(): number {
    return this.rows.size;
  }

  private drop(id: string): void {
    const old = this.rows.get(id);
    if (old === undefined) return;
    this.rows.delete(id);
    this.bytes -= sizeOf(id, old);
  }
}

function cacheKey(table: string, key: string): string {
  return `${table}\u0000${key}`;
}

/** Bytes held for a row: its state, its version and key text (two bytes a character), and a little overhead. */
function sizeOf(id: string, row: StoredRow | null): number {
  return 64 + id.length * 2 + (row ? row.state.byteLength + row.version.length * 2 : 0);
}
