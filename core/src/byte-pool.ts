/**
 * Small byte arrays carved from shared slabs, as Node's `Buffer.allocUnsafe` does.
 *
 * Every `new Uint8Array(n)` past 64 bytes allocates its own backing store outside V8's
 * heap, which V8 must later track and free: on Node 20 that cost about 1-2.5 µs each, where
 * a view onto an existing slab costs about 0.2 µs. A transfer made five or six of them (two
 * values encoded, two rows encoded, a version block) and a CPU profile on the memory store
 * showed them as garbage collection and `slice` (figures in docs/protocol.md 4.9).
 *
 * The price is the one Node's pool has: a live view keeps its whole slab alive. So only
 * what is short-lived or accounted for comes from here: values buffered in a transaction
 * (copied into the row at commit) and encoded rows (sent to the store, which copies them;
 * the row cache counts each slab it keeps alive once, in full: row-cache.ts). What the
 * client hands to its caller (`tx.get`) is always a copy of its own.
 */

/** Slab size; a request above `MAX_POOLED_BYTES` gets its own array. */
const SLAB_BYTES = 64 * 1024;
export const MAX_POOLED_BYTES = 2 * 1024;
/** V8 keeps typed arrays up to this size inside its own heap, which is cheaper still. */
export const MAX_ON_HEAP_BYTES = 64;

let slab = new ArrayBuffer(SLAB_BYTES);
let offset = 0;

/** `n` bytes, zeroed only if they are a fresh array (callers write every byte). */
export function allocBytes(n: number): Uint8Array {
  if (n > MAX_POOLED_BYTES || n <= MAX_ON_HEAP_BYTES) return new Uint8Array(n);
  if (offset + n > SLAB_BYTES) {
    slab = new ArrayBuffer(SLAB_BYTES);
    offset = 0;
  }
  const out = new Uint8Array(slab, offset, n);
  // 8-byte aligned, so a later view may use a DataView or a wider typed array cheaply.
  offset = (offset + n + 7) & ~7;
  return out;
}

/** A copy of `bytes` (from a slab when small). */
export function copyBytes(bytes: Uint8Array): Uint8Array {
  const out = allocBytes(bytes.length);
  out.set(bytes);
  return out;
}
