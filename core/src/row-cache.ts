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
 * Bounded by bytes (the rows' states and keys), least recently used first out. A state
 * that is a view into a larger buffer (an encoded row from the byte pool's slab, a reply
 * sliced from a driver's socket buffer) keeps that whole buffer alive, so what is counted
 * is each distinct buffer, once, in full: the bound is on the memory the cache keeps
 * alive, not on the bytes it could hand back.
 *
 * The order is a linked list, not the Map's insertion order: evicting by deleting a Map's
 * first entry again and again leaves holes that V8 skips on every iteration from the front
 * until the table is rehashed, which cost about 8 µs a write once every write evicted a row.
 */
export class RowCache {
  private readonly rows = new Map<string, Entry>();
  /** Least recently used first. */
  private head: Entry | undefined;
  private tail: Entry | undefined;
  private bytes = 0;
  /**
   * Per shared buffer (a state that is a view into more than its own bytes): the entries
   * holding it, and the bytes counted for it when the first took it.
   */
  private readonly shared = new Map<ArrayBufferLike, { holders: number; readonly bytes: number }>();

  constructor(private readonly maxBytes: number) {}

  get(table: string, key: string): StoredRow | null | undefined {
    const entry = this.rows.get(cacheKey(table, key));
    if (entry === undefined) return undefined;
    if (entry !== this.tail) {
      this.unlink(entry);
      this.append(entry);
    }
    return entry.row;
  }

  /** The row as just read or written (null: the row does not exist). */
  set(table: string, key: string, seen: StoredRow | null): void {
    const id = cacheKey(table, key);
    let entry = this.rows.get(id);
    let row = seen;
    let buffer = row && sharesBuffer(row.state) ? row.state.buffer : undefined;
    if (row && buffer && buffer.byteLength > this.maxBytes / 8) {
      // A buffer too large for this cache to keep alive whole (a small cache and a pool
      // slab, or a large socket read): the cache keeps a copy of the state's own bytes.
      row = { version: row.version, state: row.state.slice() };
      buffer = undefined;
    }
    const size = sizeOf(id, row, buffer !== undefined);
    if (size + (buffer?.byteLength ?? 0) > this.maxBytes) {
      if (entry) this.remove(entry);
      return;
    }
    if (entry) {
      // A row seen again (the common case): the entry is reused, one map lookup in all.
      this.release(entry);
      entry.row = row;
      entry.size = size;
      entry.buffer = buffer;
      if (entry !== this.tail) {
        this.unlink(entry);
        this.append(entry);
      }
    } else {
      entry = { id, row, size, buffer, prev: undefined, next: undefined };
      this.rows.set(id, entry);
      this.append(entry);
    }
    this.hold(entry);
    while (this.bytes > this.maxBytes && this.head) this.remove(this.head);
  }

  /** Forget a row (its last write's outcome is unknown). */
  delete(table: string, key: string): void {
    const entry = this.rows.get(cacheKey(table, key));
    if (entry) this.remove(entry);
  }

  get size(): number {
    return this.rows.size;
  }

  private remove(entry: Entry): void {
    this.unlink(entry);
    this.rows.delete(entry.id);
    this.release(entry);
  }

  /** Counts an entry's bytes, and its shared buffer's unless another entry holds it. */
  private hold(entry: Entry): void {
    this.bytes += entry.size;
    const buffer = entry.buffer;
    if (!buffer) return;
    const shared = this.shared.get(buffer);
    if (shared) shared.holders++;
    else {
      this.shared.set(buffer, { holders: 1, bytes: buffer.byteLength });
      this.bytes += buffer.byteLength;
    }
  }

  /** Undoes `hold`. */
  private release(entry: Entry): void {
    this.bytes -= entry.size;
    const buffer = entry.buffer;
    if (!buffer) return;
    const shared = this.shared.get(buffer)!;
    if (--shared.holders > 0) return;
    this.shared.delete(buffer);
    this.bytes -= shared.bytes;
  }

  private append(entry: Entry): void {
    entry.prev = this.tail;
    entry.next = undefined;
    if (this.tail) this.tail.next = entry;
    else this.head = entry;
    this.tail = entry;
  }

  private unlink(entry: Entry): void {
    if (entry.prev) entry.prev.next = entry.next;
    else this.head = entry.next;
    if (entry.next) entry.next.prev = entry.prev;
    else this.tail = entry.prev;
    entry.prev = entry.next = undefined;
  }
}

interface Entry {
  readonly id: string;
  row: StoredRow | null;
  /** Own bytes; a shared buffer's are counted once, in `shared`. */
  size: number;
  buffer: ArrayBufferLike | undefined;
  prev: Entry | undefined;
  next: Entry | undefined;
}

function cacheKey(table: string, key: string): string {
  return `${table}\u0000${key}`;
}

/**
 * Bytes held for a row: its state (unless it is a view into a shared buffer, counted
 * apart), its version and key text (two bytes a character), and a little overhead.
 */
function sizeOf(id: string, row: StoredRow | null, shared: boolean): number {
  if (!row) return 64 + id.length * 2;
  return 64 + id.length * 2 + (shared ? 0 : row.state.byteLength) + row.version.length * 2;
}

/**
 * Whether a state is a view into a buffer larger than itself. A small array that starts its
 * buffer counts as its own: V8 keeps arrays of up to 64 bytes in its heap, and asking one
 * for its `buffer` would move it out.
 */
function sharesBuffer(state: Uint8Array): boolean {
  if (state.byteOffset === 0 && state.byteLength <= 64) return false;
  return state.byteLength !== state.buffer.byteLength;
}
