import { CorruptRowError, shownName } from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { decodeRow, decodeVersionRow, encodeRow, encodeVersionRow } from '../src/codec.js';
import { Cell } from '../src/row-state.js';
import { plainRow, rowFrom } from './row-support.js';

/**
 * Names in a head row (columns, the primary's table, row and column, secondaries, observer
 * acks) are read byte by byte when short and ASCII, through the strict UTF-8 decoder
 * otherwise (codec.ts, Reader.string): both ways must give back exactly what was written.
 */
describe('names in head rows', () => {
  const names = [
    'v',
    'balance',
    'x'.repeat(24),
    'y'.repeat(25),
    'é',
    'accounts-é-ü',
    '日本語の列',
    '🙂 emoji',
    `${'a'.repeat(23)}é`,
    'ctl\u0001\u007f',
    // A TextDecoder without ignoreBOM drops a leading U+FEFF: another name.
    '\uFEFF',
    '\uFEFFbom',
  ];

  it('round-trips short and long, ASCII and non-ASCII names in every place a row keeps one', () => {
    const row = rowFrom(
      names.map((name, i) => [
        name,
        {
          data: new Map([[10 + i, new Uint8Array([i])]]),
          lock: {
            startTs: 100 + i,
            primary: { table: `t-${name}`, row: `r-${name}`, column: name },
            kind: 'put',
            ttlMs: 5000,
            wallTimeMs: 1_700_000_000_000,
            secondaries: [{ table: name, row: `${name}!` }],
          },
          writes: [
            {
              startTs: 10 + i,
              commitTs: 11 + i,
              kind: 'put',
              value: 'inline',
              wallTimeMs: 1_700_000_000_000,
            },
          ],
          prunedThrough: 0,
          notifyTs: 0,
          acks: new Map([[`observer-${name}`, 3]]),
          garbage: [],
        },
      ]),
    );
    const decoded = decodeRow(encodeRow(row));
    expect([...decoded.cells.keys()]).toEqual(names);
    expect(plainRow(decoded)).toEqual(plainRow(row));
  });

  it('a short name that is not UTF-8 is a CorruptRowError, never a misread', () => {
    const row = rowFrom([
      [
        'ab',
        {
          data: new Map([[1, new Uint8Array([1])]]),
          lock: undefined,
          writes: [{ startTs: 1, commitTs: 2, kind: 'put', value: 'inline', wallTimeMs: 1_700_000_000_000 }],
          prunedThrough: 0,
          notifyTs: 0,
          acks: new Map(),
          garbage: [],
        },
      ],
    ]);
    const bytes = encodeRow(row);
    // The column name's two bytes follow its length byte (2): make the second a lone
    // continuation byte.
    const at = bytes.findIndex((b, i) => b === 2 && bytes[i + 1] === 0x61 && bytes[i + 2] === 0x62);
    expect(at).toBeGreaterThan(0);
    const broken = bytes.slice();
    broken[at + 2] = 0x80;
    expect(() => decodeRow(broken)).toThrow(CorruptRowError);
  });

  it('version rows of one value: format 16 and the stamped format 17 (its slot skipped) read back the value, whatever startTs is asked; an unknown format is a CorruptRowError', () => {
    const value = new TextEncoder().encode('a value');
    expect(decodeVersionRow(encodeVersionRow(value), 1)).toEqual(value);
    const stamped = encodeVersionRow(value, true);
    expect(stamped.length).toBe(1 + 8 + value.length);
    stamped.set([1, 2, 3, 4, 5, 6, 7, 8], 1); // what a store writes into the slot
    expect(decodeVersionRow(stamped, 1)).toEqual(value);
    for (const format of [15, 20]) {
      const other = encodeVersionRow(value, true);
      other[0] = format;
      expect(() => decodeVersionRow(other, 1)).toThrow(CorruptRowError);
    }
    // A format 17 row too short for its slot.
    expect(() => decodeVersionRow(new Uint8Array([17, 0, 0]), 1)).toThrow(CorruptRowError);
  });
});

describe('damaged head rows are refused, never misread', () => {
  const value = (text: string) => new TextEncoder().encode(text);
  const recordsOf = (...commits: number[]) =>
    new Cell(
      commits.map((commitTs) => ({
        commitTs,
        startTs: commitTs - 1,
        kind: 'put' as const,
        wallTimeMs: 5,
        value: 'inline' as const,
      })),
      new Map(commits.map((commitTs) => [commitTs - 1, value(`at ${commitTs}`)])),
    );

  it('write records out of commit order (a reader would take an older value for the newest)', () => {
    const ordered = encodeRow({ cells: new Map([['c', recordsOf(4, 2)]]) });
    expect(
      decodeRow(ordered)
        .cells.get('c')!
        .writes.map((w) => w.commitTs),
    ).toEqual([4, 2]);
    const climbing = encodeRow({ cells: new Map([['c', recordsOf(2, 4)]]) });
    expect(() => decodeRow(climbing)).toThrow(CorruptRowError);
    expect(() => decodeRow(climbing)).toThrow(/out of commit order/);
  });

  it('a number past 2^53 - 1, or a varint longer than 8 bytes (read inexactly, not refused)', () => {
    // format 4, the stamp slot, one cell named "c" with no flags, then its prunedThrough, no
    // data, no records, no acks.
    const withPruned = (...varint: number[]) =>
      new Uint8Array([4, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0x63, 0, ...varint, 0, 0, 0]);
    expect(decodeRow(withPruned(0x85, 0x80, 0x80, 0x00)).cells.get('c')!.prunedThrough).toBe(5);
    const largest = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f]; // 2^53 - 1
    expect(decodeRow(withPruned(...largest)).cells.get('c')!.prunedThrough).toBe(Number.MAX_SAFE_INTEGER);
    expect(() => decodeRow(withPruned(0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x10))).toThrow(/past 2\^53/);
    expect(() => decodeRow(withPruned(0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f))).toThrow(
      /longer than 8 bytes/,
    );
    expect(() => decodeRow(withPruned(...new Array(40).fill(0x80), 0))).toThrow(CorruptRowError);
  });

  it('a zigzagged delta past 2^53 - 1 (the writer never makes one: timestamps stay below 2^52), refused before it is rounded', () => {
    const deleted = new Cell(
      [{ commitTs: 5, startTs: 4, kind: 'delete' as const, wallTimeMs: 5, value: 'inline' as const }],
      new Map(),
    );
    const row = encodeRow({ cells: new Map([['c', deleted]]) });
    // The record's zigzag(commitTs - 0) = 10, then commitTs - startTs = 1.
    const at = row.findIndex((b, i) => i > 12 && b === 10 && row[i + 1] === 1);
    expect(at).toBeGreaterThan(0);
    const leb = (n: bigint) => {
      const out: number[] = [];
      for (;;) {
        const low = Number(n & 0x7fn);
        n >>= 7n;
        if (n === 0n) return [...out, low];
        out.push(low | 0x80);
      }
    };
    const withZigzag = (z: bigint) =>
      new Uint8Array([...row.subarray(0, at), ...leb(z), ...row.subarray(at + 1)]);
    expect(decodeRow(withZigzag(10n)).cells.get('c')!.writes[0]!.commitTs).toBe(5);
    // 2^53 + 1 rounds to 2^53 as a sum: read as commitTs 2^52 without the check.
    expect(() => decodeRow(withZigzag(2n ** 53n + 1n))).toThrow(/past 2\^53/);
  });

  it('bytes after the last cell (the next write would drop them)', () => {
    const row = encodeRow({ cells: new Map([['c', recordsOf(4, 2)]]) });
    const longer = new Uint8Array(row.length + 3);
    longer.set(row);
    expect(() => decodeRow(longer)).toThrow(/bytes after its last cell/);
    expect(() => decodeRow(row.subarray(0, row.length - 1))).toThrow(CorruptRowError);
  });
});

describe('shownName', () => {
  it('shows plain names bare and the rest as JSON strings; a name with "/" is quoted (names are joined with it)', () => {
    expect(shownName('accounts')).toBe('accounts');
    expect(shownName('user:42@eu-1.x+y')).toBe('user:42@eu-1.x+y');
    expect(shownName('a/b')).toBe('"a/b"');
    expect(shownName('a b')).toBe('"a b"');
    expect(shownName('a\u0000😀"b')).toBe('"a\\u0000😀\\"b"');
    // Row a/b with column c, and row a with column b/c, read apart.
    expect(`t/${shownName('a/b')}/${shownName('c')}`).not.toBe(`t/${shownName('a')}/${shownName('b/c')}`);
  });
});
