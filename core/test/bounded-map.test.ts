import { describe, expect, it } from 'vitest';
import { BoundedMap } from '../src/bounded-map.js';

describe('BoundedMap', () => {
  it('keeps at least the latest half of its bound and at most its bound, newest value winning', () => {
    const map = new BoundedMap<number, string>(10);
    for (let i = 0; i < 100; i++) {
      map.set(i, `v${i}`);
      expect(map.size).toBeLessThanOrEqual(10);
      for (let j = Math.max(0, i - 4); j <= i; j++) expect(map.get(j)).toBe(`v${j}`);
    }
    expect(map.has(0)).toBe(false);
    map.set(99, 'again');
    expect(map.get(99)).toBe('again');
    map.delete(99);
    expect(map.get(99)).toBeUndefined();
    expect(map.has(99)).toBe(false);
  });

  it('a key set again in the young generation is not shadowed by its old value once deleted', () => {
    const map = new BoundedMap<string, number>(4);
    map.set('a', 1);
    map.set('b', 2); // young is full: the next set moves it to old
    map.set('a', 3);
    expect(map.get('a')).toBe(3);
    map.delete('a');
    expect(map.get('a')).toBeUndefined();
    expect(map.empty).toBe(false);
    map.delete('b');
    expect(map.empty).toBe(true);
  });
});
