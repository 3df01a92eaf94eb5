import { describe, expect, it } from 'vitest';
import { allocBytes, copyBytes, MAX_ON_HEAP_BYTES, MAX_POOLED_BYTES } from '../src/byte-pool.js';

describe('the byte pool', () => {
  it('hands out arrays that never overlap, across many slabs', () => {
    const arrays: Uint8Array[] = [];
    // Sizes that do not divide a slab, so arrays end near every slab's end.
    for (let i = 0; i < 2000; i++) {
      const a = allocBytes(65 + ((i * 37) % 300));
      a.fill(i % 251);
      arrays.push(a);
    }
    for (const [i, a] of arrays.entries()) {
      expect(a.length).toBe(65 + ((i * 37) % 300));
      expect(a.every((b) => b === i % 251)).toBe(true);
    }
    // Small ones share slabs; every one starts 8-byte aligned.
    expect(new Set(arrays.map((a) => a.buffer)).size).toBeLessThan(arrays.length / 10);
    for (const a of arrays) expect(a.byteOffset % 8).toBe(0);
  });

  it('gives a large request, or a small one V8 keeps in its heap, an array of its own', () => {
    const small = allocBytes(MAX_ON_HEAP_BYTES);
    expect(small.byteOffset).toBe(0);
    expect(small.buffer.byteLength).toBe(MAX_ON_HEAP_BYTES);
    const big = allocBytes(MAX_POOLED_BYTES + 1);
    expect(big.byteOffset).toBe(0);
    expect(big.buffer.byteLength).toBe(MAX_POOLED_BYTES + 1);
    expect(allocBytes(MAX_POOLED_BYTES).buffer.byteLength).toBeGreaterThan(MAX_POOLED_BYTES);
  });

  it('copies: the copy is equal and independent of its source', () => {
    const source = new Uint8Array([1, 2, 3, 4]);
    const copy = copyBytes(source);
    expect([...copy]).toEqual([1, 2, 3, 4]);
    source[0] = 9;
    expect(copy[0]).toBe(1);
    expect(copyBytes(new Uint8Array(0)).length).toBe(0);
  });
});
