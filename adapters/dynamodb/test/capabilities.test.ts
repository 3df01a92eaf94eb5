import { compareKeys, type RowRef } from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { bytes, text, useDynamoDb } from './helpers.js';

const db = useDynamoDb();

/** Keys where UTF-16 order (JavaScript's `<`) and UTF-8 byte order disagree, plus NULs. */
const KEYS = [
  'a',
  'a\u0000',
  'a\u0000\u0000',
  'a\u0001',
  'ab',
  'b',
  '\u0000',
  '\u007f',
  '\u0080',
  'é',
  '\u07ff',
  '\u0800',
  '\uD7FF',
  '\uE000',
  '\uFFFF',
  '😀',
  '😀a',
  '\u{10000}',
  '\u{10FFFF}',
  'Z',
  '0',
];

describe('dynamodb capabilities', () => {
  it('declares what it offers', async () => {
    const store = await db.store();
    expect(store.capabilities).toEqual({
      batchRead: true,
      batchCheckAndSet: false,
      orderedScan: true,
      atomicCounter: true,
      notificationIndex: true,
      stampedCheckAndSet: false,
      peekedRead: true,
      maxStateBytes: store.capabilities.maxStateBytes,
    });
    expect(store.checkAndSetStamped).toBeUndefined();
  });

  it('scan returns rows in compareKeys (UTF-8 byte) order, page by page', async () => {
    const store = await db.store();
    for (const key of KEYS) {
      await store.checkAndSet({ table: 'scan', key, expected: null, state: bytes(`v:${key}`) });
    }
    await store.checkAndSet({ table: 'other', key: 'a', expected: null, state: bytes('other') });
    const sorted = [...KEYS].sort(compareKeys);
    expect(sorted).not.toEqual([...KEYS].sort()); // the test data does tell the orders apart

    const all = await store.scan('scan', { limit: 1000 });
    expect(all.map((r) => r.key)).toEqual(sorted);
    for (const r of all) expect(text(r.row.state)).toBe(`v:${r.key}`);
    expect(all[0]?.row.version).toBe((await store.read('scan', all[0]?.key ?? ''))?.version);

    const paged: string[] = [];
    let after: string | undefined;
    for (;;) {
      const page = await store.scan('scan', { limit: 4, ...(after === undefined ? {} : { after }) });
      paged.push(...page.map((r) => r.key));
      if (page.length < 4) break;
      after = page[page.length - 1]?.key;
    }
    expect(paged).toEqual(sorted);
  });

  it('scan honours start (inclusive), end (exclusive) and after together', async () => {
    const store = await db.store();
    for (const key of KEYS) await store.checkAndSet({ table: 'r', key, expected: null, state: bytes('x') });
    const sorted = [...KEYS].sort(compareKeys);
    const bounds = [undefined, '', 'a', 'a\u0000', 'ab', 'é', '\uFFFF', '😀', '\u{10FFFF}', 'zzz'];
    for (const start of bounds) {
      for (const end of bounds) {
        for (const after of [undefined, 'a\u0000', '\uE000']) {
          const expected = sorted.filter(
            (k) =>
              (start === undefined || compareKeys(k, start) >= 0) &&
              (end === undefined || compareKeys(k, end) < 0) &&
              (after === undefined || compareKeys(k, after) > 0),
          );
          const options = { limit: 100, start, end, after };
          const got = await store.scan('r', options);
          expect(
            got.map((r) => r.key),
            JSON.stringify(options),
          ).toEqual(expected);
          const limited = await store.scan('r', { ...options, limit: 2 });
          expect(limited.map((r) => r.key)).toEqual(expected.slice(0, 2));
        }
      }
    }
    expect(await store.scan('r', { limit: 0 })).toEqual([]);
    expect(await store.scan('missing', { limit: 10 })).toEqual([]);
  });

  it('readMany reads over 100 rows (BatchGetItem chunks), duplicates and absent rows, in request order', async () => {
    const store = await db.store();
    const written = new Map<string, string>();
    for (let i = 0; i < 180; i++) {
      const table = i % 2 === 0 ? 'even' : 'odd';
      const key = `k\u0000${i}😀`;
      const result = await store.checkAndSet({ table, key, expected: null, state: bytes(`s${i}`) });
      if (result.ok) written.set(`${table}/${key}`, result.version);
    }
    const refs: RowRef[] = [];
    for (let i = 0; i < 260; i++) {
      refs.push({ table: i % 2 === 0 ? 'even' : 'odd', key: `k\u0000${i % 230}😀` });
    }
    refs.push({ table: 'even', key: 'k\u00000😀' }); // a duplicate
    const rows = await store.readMany(refs);
    expect(rows).toHaveLength(refs.length);
    refs.forEach((ref, i) => {
      const version = written.get(`${ref.table}/${ref.key}`);
      if (version === undefined) expect(rows[i]).toBeNull();
      else expect(rows[i]?.version).toBe(version);
    });
    expect(rows.filter((r) => r !== null).length).toBeGreaterThan(150);
    expect(await store.readMany([])).toEqual([]);
  });

  it('incrementCounter is atomic and starts at 0', async () => {
    const store = await db.store();
    expect(await store.incrementCounter('percolator.oracle', 1)).toBe(1);
    expect(await store.incrementCounter('percolator.oracle', 10)).toBe(11);
    const values = await Promise.all(
      Array.from({ length: 20 }, () => store.incrementCounter('race\u0000😀', 3)),
    );
    expect(new Set(values).size).toBe(20);
    expect(Math.max(...values)).toBe(60);
    expect(await store.incrementCounter('percolator.oracle', 1)).toBe(12);
  });

  it('checkAndSetMany applies each request on its own, results in order', async () => {
    const store = await db.store();
    const made = await store.checkAndSet({ table: 't', key: 'b', expected: null, state: bytes('b0') });
    if (!made.ok) throw new Error('setup failed');
    const results = await store.checkAndSetMany([
      { table: 't', key: 'a', expected: null, state: bytes('a1') },
      { table: 't', key: 'b', expected: 'not-the-version', state: bytes('b1') },
      { table: 't', key: 'b', expected: null, state: bytes('b2') },
      { table: 't', key: 'c', expected: null, state: bytes('c1'), notified: true },
    ]);
    expect(results.map((r) => r.ok)).toEqual([true, false, false, true]);
    expect(results[1]).toEqual({ ok: false, current: { version: made.version, state: bytes('b0') } });
    expect(text((await store.read('t', 'a'))?.state ?? new Uint8Array())).toBe('a1');
    expect(await store.scanNotified('t', { limit: 10 })).toEqual(['c']);
  });
});

describe('dynamodb notification index', () => {
  it('lists a flagged row as soon as the CAS returns, and forgets it when a write clears the flag', async () => {
    const store = await db.store();
    const flagged = ['n\u0000', '😀', 'a', '\uFFFF', 'b'];
    const versions = new Map<string, string>();
    for (const key of flagged) {
      const r = await store.checkAndSet({
        table: 'obs',
        key,
        expected: null,
        state: bytes('1'),
        notified: true,
      });
      if (!r.ok) throw new Error('create failed');
      versions.set(key, r.version);
      // Immediately visible: the index item is written in the same transaction.
      expect(await store.scanNotified('obs', { limit: 100 })).toContain(key);
    }
    await store.checkAndSet({ table: 'obs', key: 'plain', expected: null, state: bytes('1') });
    await store.checkAndSet({
      table: 'elsewhere',
      key: 'x',
      expected: null,
      state: bytes('1'),
      notified: true,
    });
    const sorted = [...flagged].sort(compareKeys);
    expect(await store.scanNotified('obs', { limit: 100 })).toEqual(sorted);
    expect(await store.scanNotified('obs', { limit: 2 })).toEqual(sorted.slice(0, 2));
    expect(await store.scanNotified('obs', { after: 'a', limit: 100 })).toEqual(
      sorted.filter((k) => compareKeys(k, 'a') > 0),
    );

    // A write without the flag clears it (the fallback transaction deletes the index item).
    const aVersion = versions.get('a') ?? '';
    const cleared = await store.checkAndSet({
      table: 'obs',
      key: 'a',
      expected: aVersion,
      state: bytes('2'),
    });
    expect(cleared.ok).toBe(true);
    expect(await store.scanNotified('obs', { limit: 100 })).not.toContain('a');
    // A failed CAS changes nothing.
    const failed = await store.checkAndSet({ table: 'obs', key: 'b', expected: aVersion, state: bytes('x') });
    expect(failed.ok).toBe(false);
    expect(await store.scanNotified('obs', { limit: 100 })).toContain('b');
    // Deleting a flagged row removes its index entry.
    expect(
      (await store.checkAndSet({ table: 'obs', key: 'b', expected: versions.get('b') ?? '', state: null }))
        .ok,
    ).toBe(true);
    expect(await store.read('obs', 'b')).toBeNull();
    // Setting it again, then writing again with the flag, keeps one entry.
    if (!cleared.ok) return;
    const again = await store.checkAndSet({
      table: 'obs',
      key: 'a',
      expected: cleared.version,
      state: bytes('3'),
      notified: true,
    });
    if (!again.ok) throw new Error('flag failed');
    await store.checkAndSet({
      table: 'obs',
      key: 'a',
      expected: again.version,
      state: bytes('4'),
      notified: true,
    });
    expect(await store.scanNotified('obs', { limit: 100 })).toEqual(
      ['n\u0000', '😀', 'a', '\uFFFF'].sort(compareKeys),
    );
    expect(await store.scanNotified('plain', { limit: 100 })).toEqual([]);
  });

  it('stays exact under concurrent writers that set and clear the flag', async () => {
    const store = await db.store();
    const keys = ['r1', 'r2'];
    for (const key of keys) await store.checkAndSet({ table: 'c', key, expected: null, state: bytes('0') });
    // Which write won last is known from the final version, so is the expected flag.
    const flagOf = new Map<string, boolean>();
    const worker = async (id: number) => {
      for (let i = 0; i < 12; i++) {
        const key = keys[(id + i) % keys.length] as string;
        const row = await store.read('c', key);
        if (row === null) continue;
        const notified = (id + i) % 3 !== 0;
        const r = await store.checkAndSet({
          table: 'c',
          key,
          expected: row.version,
          state: bytes(`${id}.${i}`),
          notified,
        });
        if (r.ok) flagOf.set(r.version, notified);
      }
    };
    await Promise.all([0, 1, 2, 3, 4, 5].map(worker));
    const listed = await store.scanNotified('c', { limit: 10 });
    for (const key of keys) {
      const row = await store.read('c', key);
      expect(listed.includes(key), key).toBe(flagOf.get(row?.version ?? '') ?? false);
    }
  });
});
