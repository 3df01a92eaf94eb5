import { type CasRequest, MemoryStore, type RowStore } from '@percolator/core';
import { describe, expect, test } from 'vitest';
import { CountingStore } from '../src/counting-store.js';

const bytes = (n: number) => new Uint8Array(n).fill(7);

describe('CountingStore counts bytes and calls by direction', () => {
  test('reads count returned state bytes; writes count the states sent', async () => {
    const store = new CountingStore(new MemoryStore());
    const created = await store.checkAndSet({ table: 't', key: 'a', expected: null, state: bytes(100) });
    expect(created.ok).toBe(true);
    expect(store.io).toEqual({
      reads: 0,
      writes: 1,
      rowsRead: 0,
      rowsWritten: 1,
      bytesRead: 0,
      bytesWritten: 100,
    });
    await store.read('t', 'a');
    await store.read('t', 'missing');
    expect(store.io).toMatchObject({ reads: 2, rowsRead: 2, bytesRead: 100 });
    await store.checkAndSetMany!([
      { table: 't', key: 'b', expected: null, state: bytes(30) },
      { table: 't', key: 'c', expected: null, state: bytes(20) },
    ]);
    await store.readMany!([
      { table: 't', key: 'a' },
      { table: 't', key: 'b' },
      { table: 't', key: 'nope' },
    ]);
    expect(store.io).toMatchObject({ reads: 3, writes: 2, rowsRead: 5, rowsWritten: 3, bytesWritten: 150 });
    expect(store.io.bytesRead).toBe(100 + 100 + 30);
    const scanned = await store.scan!('t', { limit: 10 });
    expect(scanned).toHaveLength(3);
    expect(store.io).toMatchObject({ reads: 4, rowsRead: 8, bytesRead: 230 + 150 });
    // A delete sends no state; the counter increment is a write call with no row.
    await store.checkAndSet({ table: 't', key: 'c', expected: scanned[2]!.row.version, state: null });
    await store.incrementCounter!('n', 1);
    expect(store.io).toMatchObject({ writes: 4, rowsWritten: 4, bytesWritten: 150 });
    expect(store.total).toBe(8);
  });

  test('a lost check-and-set that returns the current row counts that row as read', async () => {
    const inner = new MemoryStore();
    await inner.checkAndSet({ table: 't', key: 'a', expected: null, state: bytes(64) });
    const store = new CountingStore(inner);
    const lost = await store.checkAndSet({ table: 't', key: 'a', expected: null, state: bytes(10) });
    expect(lost.ok).toBe(false);
    const current = lost.ok ? undefined : lost.current;
    expect(store.io.bytesWritten).toBe(10);
    expect(store.io.bytesRead).toBe(current ? 64 : 0);
  });

  test('the stamped check-and-set counts the state it sends', async () => {
    const store = new CountingStore(new MemoryStore());
    if (!store.checkAndSetStamped) return; // only where the store has it
    const result = await store.checkAndSetStamped(
      { table: 't', key: 's', expected: null, state: bytes(42) },
      'ts',
    );
    expect(result.ok).toBe(true);
    expect(store.io).toMatchObject({ writes: 1, rowsWritten: 1, bytesWritten: 42 });
  });

  test('a store method the proxy does not know is forwarded and counted, not hidden', async () => {
    const inner = new MemoryStore();
    const seen: unknown[] = [];
    const extended: RowStore & { writeVersions(requests: readonly CasRequest[]): Promise<number> } = {
      name: 'extended',
      capabilities: inner.capabilities,
      read: (table, key) => inner.read(table, key),
      checkAndSet: (request) => inner.checkAndSet(request),
      close: async () => {},
      writeVersions(requests) {
        seen.push(requests.length);
        return Promise.resolve(requests.length);
      },
    };
    const store = new CountingStore(extended) as CountingStore & {
      writeVersions(requests: readonly CasRequest[]): Promise<number>;
    };
    expect(typeof store.writeVersions).toBe('function');
    expect(await store.writeVersions([{ table: 't', key: 'k', expected: null, state: bytes(1) }])).toBe(1);
    expect(seen).toEqual([1]);
    expect(store.calls.other).toBe(1);
    expect(store.total).toBe(1);
    // Known methods are still counted under their own names, never twice.
    await store.read('t', 'k');
    expect(store.calls).toMatchObject({ read: 1, other: 1 });
  });
});
