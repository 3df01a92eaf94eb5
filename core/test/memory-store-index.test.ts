import { compareKeys, MemoryStore } from '@percolator/core';
import { describe, expect, it } from 'vitest';

/** Creates, deletes and re-creates rows at random; every scan must list exactly the live keys, in order. */
describe('MemoryStore scan index (kept lazily)', () => {
  it('matches a model through random creates, deletes, re-creates and paged scans', async () => {
    const store = new MemoryStore();
    const live = new Map<string, string>(); // key -> version
    let seed = 7;
    const random = () => (seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff;
    const state = new Uint8Array([1]);
    for (let step = 0; step < 3000; step++) {
      const key = `k${Math.floor(random() * 200)}`;
      const version = live.get(key);
      if (version === undefined) {
        const r = await store.checkAndSet({ table: 't', key, expected: null, state });
        if (!r.ok) throw new Error('create failed');
        live.set(key, r.version);
      } else if (random() < 0.6) {
        const r = await store.checkAndSet({ table: 't', key, expected: version, state: null });
        if (!r.ok) throw new Error('delete failed');
        live.delete(key);
      }
      if (step % 97 === 0) {
        // A full scan in pages of 7, resumed with `after`.
        const seen: string[] = [];
        let after: string | undefined;
        for (;;) {
          const page = await store.scan('t', { limit: 7, ...(after === undefined ? {} : { after }) });
          seen.push(...page.map((r) => r.key));
          if (page.length < 7) break;
          after = page.at(-1)!.key;
        }
        expect(seen).toEqual([...live.keys()].sort(compareKeys));
        // And a range.
        const range = await store.scan('t', { start: 'k1', end: 'k5', limit: 1000 });
        expect(range.map((r) => r.key)).toEqual(
          [...live.keys()]
            .filter((k) => compareKeys(k, 'k1') >= 0 && compareKeys(k, 'k5') < 0)
            .sort(compareKeys),
        );
      }
    }
  });
});
