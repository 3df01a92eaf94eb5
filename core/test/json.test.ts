import { InvalidArgumentError, type JsonValue, MemoryStore, Percolator } from '@percolator/core';
import { describe, expect, it, vi } from 'vitest';

/** An array with a hole, which JSON would read back as null. */
function holes(): unknown[] {
  const array = [1, 2, 3];
  delete array[1];
  return array;
}

describe('typed values: tx.setJson / tx.getJson', () => {
  it('round-trips JSON values exactly', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    const values: JsonValue[] = [
      0,
      -1,
      0.1,
      1e-300,
      Number.MAX_SAFE_INTEGER,
      -Number.MAX_VALUE,
      '',
      'NUL\u0000 emoji 🦄 é',
      true,
      false,
      null,
      [],
      {},
      [1, 'two', [3, { four: 4 }], null],
      { nested: { deeper: [{ a: 1 }] }, 'key with spaces': 'x', '🦄': true },
    ];
    await db.transact(async (tx) => {
      for (const [i, v] of values.entries()) tx.setJson('j', `r${i}`, 'v', v);
    });
    const back = await db.transact(async (tx) =>
      Promise.all(values.map((_, i) => tx.getJson('j', `r${i}`, 'v'))),
    );
    expect(back).toEqual(values);
    expect(await db.transact((tx) => tx.getJson('j', 'absent', 'v'))).toBeUndefined();
    // Inside the transaction too (read-your-writes).
    await db.transact(async (tx) => {
      tx.setJson('j', 'own', 'v', { n: 1 });
      expect(await tx.getJson('j', 'own', 'v')).toEqual({ n: 1 });
    });
    await db.close();
  });

  it('refuses what JSON would change or drop, with InvalidArgumentError, and buffers nothing', async () => {
    const store = new MemoryStore();
    const db = new Percolator({ store });
    const cycle: Record<string, unknown> = {};
    cycle.self = cycle;
    const bad: unknown[] = [
      undefined,
      Number.NaN,
      Number.POSITIVE_INFINITY,
      -0,
      10n,
      () => 1,
      Symbol('s'),
      new Date(0),
      new Map(),
      cycle,
      holes(),
      '\uD800',
      { '\uDC00': 1 },
      { [Symbol('k')]: 1 },
      { nested: { value: undefined } },
    ];
    for (const value of bad) {
      const tx = await db.begin();
      expect(() => tx.setJson('j', 'r', 'v', value as JsonValue), String(value)).toThrow(
        InvalidArgumentError,
      );
      await tx.commit();
    }
    expect(await store.read('j', 'r')).toBeNull();
    await db.close();
  });

  it('refuses what JSON would silently drop (an array with named properties, a non-enumerable property) and nesting past 1,000 levels', async () => {
    const store = new MemoryStore();
    const db = new Percolator({ store });
    const named = Object.assign([1, 2], { extra: 'dropped' });
    const hidden = Object.defineProperty({ a: 1 }, 'b', { value: 2, enumerable: false });
    const hiddenInArray = Object.defineProperty([1], 'note', { value: 'x', enumerable: false });
    const nest = (levels: number): unknown => {
      let v: unknown = 1;
      for (let i = 0; i < levels; i++) v = i % 2 === 0 ? [v] : { v };
      return v;
    };
    const bad: [string, unknown, RegExp][] = [
      ['array with a named property', named, /named property "extra"/],
      ['nested array with a named property', { list: named }, /\$\.list is an array/],
      ['non-enumerable property', hidden, /\$\.b is not enumerable/],
      ['array with a non-enumerable named property', hiddenInArray, /named property "note"/],
      ['1,001 levels', nest(1001), /deeper than 1000 levels/],
      // Deep enough that the check's recursion overflowed the stack: a RangeError before.
      ['100,000 levels', nest(100_000), /deeper than 1000 levels/],
    ];
    for (const [name, value, message] of bad) {
      const tx = await db.begin();
      expect(() => tx.setJson('j', 'r', 'v', value as JsonValue), name).toThrow(InvalidArgumentError);
      expect(() => tx.setJson('j', 'r', 'v', value as JsonValue), name).toThrow(message);
      await tx.commit();
    }
    expect(await store.read('j', 'r')).toBeNull();
    // 1,000 levels are fine, and read back exactly.
    const deepest = nest(1000);
    await db.transact(async (tx) => tx.setJson('j', 'deep', 'v', deepest as JsonValue));
    expect(await db.transact((tx) => tx.getJson('j', 'deep', 'v'))).toEqual(deepest);
    await db.close();
  });

  it('reads each property once, so what is checked is what is written; a key named __proto__ is kept', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    let reads = 0;
    // A getter that answers a JSON value when checked and NaN (written as null) after.
    const shifty = {
      get x() {
        return reads++ === 0 ? 1 : Number.NaN;
      },
    };
    const proto = JSON.parse('{"__proto__": {"a": 1}, "b": [2]}') as JsonValue;
    await db.transact(async (tx) => {
      tx.setJson('j', 'shifty', 'v', shifty as unknown as JsonValue);
      tx.setJson('j', 'proto', 'v', proto);
    });
    expect(reads).toBe(1);
    const [back, protoBack] = await db.transact((tx) =>
      Promise.all([tx.getJson('j', 'shifty', 'v'), tx.getJson('j', 'proto', 'v')]),
    );
    expect(back).toEqual({ x: 1 });
    expect(JSON.stringify(protoBack)).toBe('{"__proto__":{"a":1},"b":[2]}');
    await db.close();
  });

  it('getJson of a value that is not JSON is an InvalidArgumentError', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    await db.transact(async (tx) => tx.set('j', 'raw', 'v', 'not json {'));
    await expect(db.transact((tx) => tx.getJson('j', 'raw', 'v'))).rejects.toBeInstanceOf(
      InvalidArgumentError,
    );
    await db.close();
  });

  it('a value whose JSON text is longer than a string can be: InvalidArgumentError, nothing buffered', async () => {
    const store = new MemoryStore();
    const db = new Percolator({ store });
    const tx = await db.begin();
    // What V8 throws past its string length limit (about 512 MiB), without building one.
    const stringify = vi.spyOn(JSON, 'stringify').mockImplementationOnce(() => {
      throw new RangeError('Invalid string length');
    });
    try {
      expect(() => tx.setJson('j', 'big', 'v', { huge: 'x' })).toThrow(InvalidArgumentError);
    } finally {
      stringify.mockRestore();
    }
    await tx.commit();
    expect(await store.read('j', 'big')).toBeNull();
    await db.close();
  });
});
