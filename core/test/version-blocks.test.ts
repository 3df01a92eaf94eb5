import { describe, expect, it } from 'vitest';
import { markMoving, movingBlocks, pruneCell } from '../src/cells.js';
import {
  BLOCK_FORMAT,
  decodeRow,
  decodeVersionRow,
  encodeRow,
  encodeVersionBlock,
  encodeVersionRow,
  HEAD_FORMAT,
  versionRowEntries,
} from '../src/codec.js';
import { CorruptRowError, InvalidArgumentError } from '../src/errors.js';
import { inspectHeadRow, namedVersionRows, versionRowRef } from '../src/inspect.js';
import { MemoryStore } from '../src/memory-store.js';
import { Percolator } from '../src/percolator.js';
import { blockOf, Cell, type WriteRecord } from '../src/row-state.js';
import { versionTable } from '../src/versions.js';
import { InstrumentedStore } from './support.js';

/**
 * Version blocks (docs/protocol.md 2.2): values marked `moving` together share one version
 * row, named by the group's anchor (its largest startTs).
 */

const bytes = (n: number, fill = 1) => new Uint8Array(n).fill(fill);

/** A cell of `n` committed puts of `size`-byte values, newest first (startTs 10, 20, ...; commitTs + 1). */
function cellOfPuts(n: number, size: number): Cell {
  const writes: WriteRecord[] = [];
  const data = new Map<number, Uint8Array>();
  for (let i = n; i >= 1; i--) {
    const startTs = i * 10;
    writes.push({ commitTs: startTs + 1, startTs, kind: 'put', wallTimeMs: 1000 + i, value: 'inline' });
    data.set(startTs, bytes(size, i));
  }
  return new Cell(writes, data);
}

describe('version blocks', () => {
  it('values marked together share one anchor, the largest startTs among them; a block limit splits them; 0 gives each its own', () => {
    const cell = cellOfPuts(7, 100);
    // 6 superseded values of 100 bytes (116 with the entry): 3 fit a 400-byte block.
    expect(markMoving(cell, 512, 400)).toBe(true);
    const moving = cell.writes.filter((w) => w.value === 'moving');
    expect(moving.map((w) => w.startTs)).toEqual([60, 50, 40, 30, 20, 10]);
    expect(moving.map(blockOf)).toEqual([60, 60, 60, 30, 30, 30]);
    expect(cell.writes[0]!.value).toBe('inline'); // the newest: what a current snapshot reads
    expect(
      movingBlocks(cell).map((b) => ({ block: b.block, values: b.entries.map((e) => e.rec.startTs) })),
    ).toEqual([
      { block: 60, values: [60, 50, 40] },
      { block: 30, values: [30, 20, 10] },
    ]);
    // A value larger than the limit is a block of its own; limit 0: every value alone.
    const big = cellOfPuts(3, 1000);
    markMoving(big, 'force', 400);
    expect(big.writes.filter((w) => w.value === 'moving').map((w) => w.block)).toEqual([
      undefined,
      undefined,
    ]);
    const single = cellOfPuts(4, 100);
    markMoving(single, 'force', 0);
    expect(movingBlocks(single).map((b) => b.entries.length)).toEqual([1, 1, 1]);
    // A later marking makes a new group: older groups keep their anchors.
    const more = cellOfPuts(4, 100);
    markMoving(more, 'force', 10_000);
    const firstAnchors = more.writes.map((w) => w.block);
    more.writes.unshift({ commitTs: 51, startTs: 50, kind: 'put', wallTimeMs: 2000, value: 'inline' });
    more.data.set(50, bytes(100));
    markMoving(more, 'force', 10_000);
    expect(more.writes.map((w) => w.block)).toEqual([undefined, undefined, ...firstAnchors.slice(1)]);
    expect(more.writes[1]!.value).toBe('moving');
    expect(blockOf(more.writes[1]!)).toBe(40);
  });

  it('anchored records round-trip in recent records and in the history (format 4); format 3 refuses them', () => {
    const cell = cellOfPuts(12, 50);
    markMoving(cell, 'force', 180);
    // Moved (a `moving` record stays recent: codec.ts, recentCount), so most go to the history.
    for (const w of cell.writes) if (w.value === 'moving') w.value = 'moved';
    for (const w of cell.writes.slice(1)) cell.dropValue(w.startTs);
    expect(new Set(cell.writes.map(blockOf)).size).toBeLessThan(cell.writes.length - 1);
    const before = cell.writes.map((w) => [w.startTs, w.value, blockOf(w)]);
    const encoded = encodeRow({ cells: new Map([['c', cell]]) });
    expect(encoded[0]).toBe(HEAD_FORMAT);
    expect(HEAD_FORMAT).toBe(4);
    const back = decodeRow(encoded).cells.get('c')!;
    expect(back.history).toBeDefined(); // the older records went to the history, still encoded
    expect(back.writes.map((w) => [w.startTs, w.value, blockOf(w)])).toEqual(before);
    // Written again without decoding the history: the anchors survive the copy.
    const again = decodeRow(encodeRow(decodeRow(encoded))).cells.get('c')!;
    expect(again.writes.map((w) => [w.startTs, w.value, blockOf(w)])).toEqual(before);
    // In format 3 an anchor bit is refused, in the history too, and at once: a write
    // copies a history's bytes undecoded, into a format 4 row.
    const format3 = Uint8Array.from(encoded);
    format3[0] = 3;
    expect(() => decodeRow(format3)).toThrow(CorruptRowError);
  });

  it('an anchor on a record that cannot have one (a delete, an inline put) or not above its startTs is a CorruptRowError', () => {
    const encodeOne = (rec: WriteRecord) =>
      encodeRow({ cells: new Map([['c', new Cell([rec], new Map([[rec.startTs, bytes(4)]]))]]) });
    const base = { commitTs: 11, startTs: 10, wallTimeMs: 1 } as const;
    expect(
      decodeRow(encodeOne({ ...base, kind: 'put', value: 'moved', block: 15 })).cells.get('c')!.writes[0]!
        .block,
    ).toBe(15);
    for (const bad of [
      { ...base, kind: 'delete', value: 'inline', block: 15 },
      { ...base, kind: 'put', value: 'inline', block: 15 },
      { ...base, kind: 'put', value: 'moved', block: 5 },
    ] as WriteRecord[]) {
      expect(() => decodeRow(encodeOne(bad))).toThrow(CorruptRowError);
    }
  });

  it('a pass that writes a block confirms the moves of the values it wrote, not of a record naming the block without its value', async () => {
    const store = new MemoryStore();
    const db = new Percolator({ store });
    await db.transact(async (tx) => tx.set('t', 'r', 'v', 'seed'));
    // A damaged head row: two `moving` records in block 30, one of them without its value.
    const now = Date.now();
    const cell = new Cell(
      [
        { commitTs: 41, startTs: 40, kind: 'put', wallTimeMs: now - 4, value: 'inline' },
        { commitTs: 31, startTs: 30, kind: 'put', wallTimeMs: now - 3, value: 'moving', block: 30 },
        { commitTs: 21, startTs: 20, kind: 'put', wallTimeMs: now - 2, value: 'moving', block: 30 },
      ],
      new Map([
        [40, bytes(4, 4)],
        [30, bytes(3, 3)],
      ]),
    );
    const current = (await store.read('t', 'r'))!;
    await store.checkAndSet({
      table: 't',
      key: 'r',
      expected: current.version,
      state: encodeRow({ cells: new Map([['v', cell]]) }),
    });
    await db.tidy('t', 'r');
    const after = inspectHeadRow((await store.read('t', 'r'))!.state).cells[0]!;
    expect(after.writes.map((w) => [w.startTs, w.value])).toEqual([
      [40, 'inline'],
      [30, 'moved'],
      [20, 'moving'],
    ]);
    const ref = versionRowRef('t', 'r', 'v', 30);
    expect(versionRowEntries((await store.read(ref.table, ref.key))!.state)).toEqual([
      { startTs: 30, bytes: 3 },
    ]);
    await db.close();
  });

  it('a block holds its values newest first; a missing one reads undefined; formats 16 and 17 read too; damage is a CorruptRowError', () => {
    const block = encodeVersionBlock([
      { startTs: 30, value: bytes(3, 3) },
      { startTs: 20, value: bytes(2, 2) },
    ]);
    expect(block[0]).toBe(BLOCK_FORMAT);
    expect(decodeVersionRow(block, 20)).toEqual(bytes(2, 2));
    expect(decodeVersionRow(block, 30)).toEqual(bytes(3, 3));
    expect(decodeVersionRow(block, 25)).toBeUndefined();
    expect(versionRowEntries(block)).toEqual([
      { startTs: 30, bytes: 3 },
      { startTs: 20, bytes: 2 },
    ]);
    const stamped = encodeVersionBlock([{ startTs: 7, value: bytes(4) }], true);
    expect(decodeVersionRow(stamped, 7)).toEqual(bytes(4));
    expect(decodeVersionRow(encodeVersionRow(bytes(5)), 99)).toEqual(bytes(5));
    expect(decodeVersionRow(encodeVersionRow(bytes(5), true), 99)).toEqual(bytes(5));
    expect(() => decodeVersionRow(block.slice(0, block.length - 1), 20)).toThrow(CorruptRowError);
    expect(() => decodeVersionRow(Uint8Array.from([BLOCK_FORMAT, 0x7f]), 1)).toThrow(CorruptRowError);
    expect(() => decodeVersionRow(Uint8Array.from([20, 0]), 1)).toThrow(CorruptRowError);
  });

  it('pruning names a block as garbage only when the last record in it goes', () => {
    const cell = cellOfPuts(8, 100);
    markMoving(cell, 'force', 400); // blocks 70 (70, 60, 50) and 40 (40, 30, 20), and 10 alone
    for (const w of cell.writes) if (w.value === 'moving') w.value = 'moved';
    const policy = { retentionMs: 1e12, maxVersionsPerCell: 5, inlineHistoryBytes: 512 };
    // Keeps 80, 70, 60, 50, and 40 as the version at the safe point: 30, 20 and 10 go.
    pruneCell(cell, policy, 1e9);
    expect(cell.writes.map((w) => w.startTs)).toEqual([80, 70, 60, 50, 40]);
    expect(cell.garbage).toEqual([10]); // block 40 stays: record 40 still names it
    const fewer = { ...policy, maxVersionsPerCell: 2 };
    pruneCell(cell, fewer, 1e9);
    expect(cell.writes.map((w) => w.startTs)).toEqual([80, 70]);
    expect(cell.garbage).toEqual([10, 40]); // block 70 stays: record 70 still names it
    // Every version row the head names, garbage included, once each.
    const view = inspectHeadRow(encodeRow({ cells: new Map([['v', cell]]) }));
    expect(namedVersionRows('t', 'r', view).named.map((r) => r.key)).toEqual(
      [70, 10, 40].map((ts) => versionRowRef('t', 'r', 'v', ts).key),
    );
  });

  it('on a hot cell: one version row per move, not per value; every old snapshot reads its value; a block that lost a value is a CorruptRowError', async () => {
    const store = new InstrumentedStore(new MemoryStore());
    const vt = versionTable('t');
    const creates = new Map<string, number>();
    store.casFault = (request) => {
      if (request.expected === null && request.table === vt)
        creates.set(request.key, (creates.get(request.key) ?? 0) + 1);
      return undefined;
    };
    const db = new Percolator({ store, gc: { maxVersionsPerCell: 1000 } });
    const snapshots: { tx: Awaited<ReturnType<typeof db.begin>>; value: string | undefined }[] = [];
    let value: string | undefined;
    for (let i = 0; i < 60; i++) {
      snapshots.push({ tx: await db.begin(), value });
      value = `${i}`.padEnd(100, '.');
      const v = value;
      await db.transact(async (tx) => tx.set('t', 'r', 'v', v));
    }
    await db.flush();
    for (const s of snapshots) expect(await s.tx.getString('t', 'r', 'v')).toBe(s.value);
    const cell = inspectHeadRow((await store.read('t', 'r'))!.state).cells[0]!;
    const moved = cell.writes.filter((w) => w.value === 'moved');
    expect(moved.length).toBeGreaterThan(40);
    // 100-byte values past the 512-byte inline budget move 5 or 6 at a time.
    expect(creates.size).toBeLessThanOrEqual(Math.ceil(moved.length / 4));
    expect([...creates.values()].every((n) => n === 1)).toBe(true);
    // Tamper: rewrite one block without the value of its oldest record.
    const victim = moved.find((w) => w.block !== undefined && w.block !== w.startTs)!;
    const ref = versionRowRef('t', 'r', 'v', victim.block!);
    const stored = (await store.read(ref.table, ref.key))!;
    await store.checkAndSet({
      ...ref,
      expected: stored.version,
      state: encodeVersionBlock([{ startTs: victim.block!, value: bytes(1) }]),
    });
    // The snapshot that reads the victim's value: the first one taken after its commit.
    const at = snapshots.find(
      (s) =>
        s.tx.startTs > victim.commitTs &&
        !cell.writes.some((w) => w.commitTs > victim.commitTs && w.commitTs < s.tx.startTs),
    );
    expect(at).toBeDefined();
    await expect(at!.tx.getString('t', 'r', 'v')).rejects.toBeInstanceOf(CorruptRowError);
    await db.close();
  });

  it('gc.versionBlockBytes must be a non-negative integer', () => {
    const store = new MemoryStore();
    for (const versionBlockBytes of [-1, 1.5, Number.NaN])
      expect(() => new Percolator({ store, gc: { versionBlockBytes } })).toThrow(InvalidArgumentError);
  });
});
