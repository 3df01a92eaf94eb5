import { describe, expect, it } from 'vitest';
import {
  addRecord,
  findRecord,
  hasWriteAtOrAfter,
  inlineHistoryBytes,
  type PrunePolicy,
  pruneDue,
  rowNeedsTidy,
  tidyCell,
  visibleWrite,
} from '../src/cells.js';
import { decodeRow, encodeRow } from '../src/codec.js';
import { CorruptRowError } from '../src/errors.js';
import { MemoryStore } from '../src/memory-store.js';
import { Percolator } from '../src/percolator.js';
import type { Cell, RecordKind, RowKey, ValuePlace, WriteRecord } from '../src/row-state.js';
import { plainRow, rowFrom } from './row-support.js';

/**
 * A cell's older records stay encoded (row-state.ts, Cell; codec.ts, format 3): the steps on
 * a current snapshot must give the same answers and write the same row as with every record
 * decoded, without decoding them.
 */

function rng(seed: number) {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

/** A cell with `n` committed records (newest first), values of `valueBytes`, some rollbacks and secondaries. */
function historyCell(n: number, random: () => number, valueBytes: number, now: number, allMoved = false) {
  const writes: WriteRecord[] = [];
  const data = new Map<number, Uint8Array>();
  let ts = 1_000;
  const older: WriteRecord[] = [];
  for (let i = 0; i < n; i++) {
    const startTs = ts + 2 + Math.floor(random() * 5);
    const roll = random();
    const kind: RecordKind = roll < 0.1 ? 'rollback' : roll < 0.15 ? 'delete' : 'put';
    const commitTs = kind === 'rollback' ? startTs : startTs + 1 + Math.floor(random() * 3);
    ts = commitTs;
    // `moving` only among the newest two: a move is transient (the tidy step ends it), and a
    // `moving` record keeps every newer record recent until then.
    const place: ValuePlace =
      kind !== 'put'
        ? 'inline'
        : allMoved && i < n - 1
          ? 'moved'
          : random() < 0.3
            ? 'moved'
            : i >= n - 2 && random() < 0.3
              ? 'moving'
              : 'inline';
    const secondaries: RowKey[] | undefined =
      kind !== 'rollback' && random() < 0.25 ? [{ table: 't', row: `s${i}` }] : undefined;
    const rec: WriteRecord = {
      commitTs,
      startTs,
      kind,
      value: place,
      wallTimeMs: now - (n - i) * 1_000 - Math.floor(random() * 500),
      secondaries,
    };
    if (kind === 'put' && place !== 'moved')
      data.set(
        startTs,
        Uint8Array.from({ length: valueBytes }, (_, j) => (i + j) & 0xff),
      );
    older.push(rec);
  }
  for (let i = older.length - 1; i >= 0; i--) writes.push(older[i]!);
  return {
    data,
    lock: undefined,
    writes,
    prunedThrough: 0,
    notifyTs: 0,
    acks: new Map<string, number>(),
    garbage: [] as number[],
  };
}

/** The same bytes decoded twice: one cell left lazy, one with its history decoded up front. */
function lazyAndEager(bytes: Uint8Array): [Cell, Cell] {
  const lazy = decodeRow(bytes).cells.get('c')!;
  const eager = decodeRow(bytes).cells.get('c')!;
  void eager.writes;
  expect(eager.history).toBeUndefined();
  return [lazy, eager];
}

describe('cell histories (codec format 3)', () => {
  it('a cell with a long history keeps its older records encoded, and they read back exactly', () => {
    const now = 10_000_000;
    const plain = historyCell(30, rng(1), 8, now);
    const bytes = encodeRow(rowFrom([['c', plain]]));
    const cell = decodeRow(bytes).cells.get('c')!;
    expect(cell.history).toBeDefined();
    expect(cell.recent.length).toBeLessThanOrEqual(3);
    expect(cell.recordCount).toBe(30);
    expect(plainRow(decodeRow(bytes))).toEqual(new Map([['c', plain]]));
    // Re-encoded without decoding the history: the same bytes.
    expect(encodeRow(decodeRow(bytes))).toEqual(bytes);
  });

  it.each([
    ['values kept inline', false, 1 << 20],
    ['values moved out, each commit marking the one it supersedes', true, 16],
  ])(
    'the steps on a current snapshot answer and write as with every record decoded, and leave the history encoded: %s',
    (_, allMoved, inlineLimit) => {
      const now = 10_000_000;
      for (let seed = 1; seed <= 200; seed++) {
        const random = rng(seed);
        const valueBytes = random() < 0.5 ? 4 : 40;
        const plain = historyCell(6 + Math.floor(random() * 30), random, valueBytes, now, allMoved);
        // A policy under which no prune is due: the lazy cell must never decode its history.
        const policy: PrunePolicy = {
          retentionMs: 3_600_000,
          maxVersionsPerCell: 64,
          inlineHistoryBytes: inlineLimit,
        };
        let bytes = encodeRow(rowFrom([['c', plain]]));
        for (let step = 0; step < 5; step++) {
          {
            // Reads at the current snapshot and just before the last commit (which may reach
            // into the history), and conflict checks.
            const [lazy, eager] = lazyAndEager(bytes);
            const newest = lazy.recent[0]!;
            for (const at of [newest.commitTs + 1, newest.commitTs, newest.startTs]) {
              expect(visibleWrite(lazy, at)).toEqual(visibleWrite(eager, at));
              expect(hasWriteAtOrAfter(lazy, at)).toBe(hasWriteAtOrAfter(eager, at));
            }
          }
          const [lazy, eager] = lazyAndEager(bytes);
          expect(lazy.history).toBeDefined();
          const newest = lazy.recent[0]!;
          const current = visibleWrite(lazy, newest.commitTs + 1);
          expect(current).toEqual(visibleWrite(eager, newest.commitTs + 1));
          if (current) expect(lazy.valueAt(current.startTs)).toEqual(eager.valueAt(current.startTs));
          const startTs = newest.commitTs + 10;
          expect(findRecord(lazy, startTs)).toBeUndefined();
          expect(findRecord(eager, startTs)).toBeUndefined();
          expect(inlineHistoryBytes(lazy)).toBe(inlineHistoryBytes(eager));
          expect(pruneDue(lazy, policy, now)).toBe(pruneDue(eager, policy, now));
          // A commit: the value, the record, the commit's own tidying.
          const value = Uint8Array.from({ length: 24 }, (_, j) => (seed + step + j) & 0xff);
          const rec: WriteRecord = {
            commitTs: startTs + 1,
            startTs,
            kind: 'put',
            value: 'inline',
            wallTimeMs: now,
            secondaries: step % 2 === 0 ? [{ table: 't', row: 'x' }] : undefined,
          };
          for (const cell of [lazy, eager]) {
            cell.setValue(startTs, value);
            addRecord(cell, { ...rec });
            tidyCell(cell, policy, now);
          }
          expect(rowNeedsTidy({ cells: new Map([['c', lazy]]) }, policy, now)).toBe(
            rowNeedsTidy({ cells: new Map([['c', eager]]) }, policy, now),
          );
          expect(lazy.history).toBeDefined(); // nothing above needed the older records
          const lazyBytes = encodeRow({ cells: new Map([['c', lazy]]) });
          const eagerBytes = encodeRow({ cells: new Map([['c', eager]]) });
          expect(plainRow(decodeRow(lazyBytes))).toEqual(plainRow(decodeRow(eagerBytes)));
          // A value being moved stays recent: the tidy step that moves it decodes no history.
          expect(decodeRow(lazyBytes).cells.get('c')!.history?.moving ?? 0).toBe(0);
          bytes = lazyBytes;
        }
      }
    },
  );

  it('a read at an old snapshot, a late record and pruning decode the history, and agree with the eager cell', () => {
    const now = 10_000_000;
    for (let seed = 1; seed <= 100; seed++) {
      const random = rng(seed * 7);
      const plain = historyCell(20 + Math.floor(random() * 30), random, 16, now);
      const bytes = encodeRow(rowFrom([['c', plain]]));
      const oldest = plain.writes.at(-1)!;
      {
        const [lazy, eager] = lazyAndEager(bytes);
        expect(findRecord(lazy, oldest.startTs)).toEqual(findRecord(eager, oldest.startTs));
        expect(findRecord(lazy, oldest.startTs)).toBeDefined();
      }
      {
        const [lazy, eager] = lazyAndEager(bytes);
        expect(visibleWrite(lazy, oldest.commitTs + 1)).toEqual(visibleWrite(eager, oldest.commitTs + 1));
        const rec = visibleWrite(lazy, oldest.commitTs + 1);
        if (rec) expect(lazy.valueAt(rec.startTs)).toEqual(eager.valueAt(rec.startTs));
        expect(findRecord(lazy, oldest.startTs)).toEqual(findRecord(eager, oldest.startTs));
      }
      {
        // A record older than the newest of the history (a late roll-forward) goes in order.
        const [lazy, eager] = lazyAndEager(bytes);
        const late: WriteRecord = {
          commitTs: oldest.commitTs + 1,
          startTs: oldest.commitTs + 1,
          kind: 'rollback',
          value: 'inline',
          wallTimeMs: now,
        };
        addRecord(lazy, { ...late });
        addRecord(eager, { ...late });
        expect(plainRow(decodeRow(encodeRow({ cells: new Map([['c', lazy]]) })))).toEqual(
          plainRow(decodeRow(encodeRow({ cells: new Map([['c', eager]]) }))),
        );
      }
      {
        // Pruning under a small cap and a short retention.
        const policy: PrunePolicy = { retentionMs: 5_000, maxVersionsPerCell: 4, inlineHistoryBytes: 32 };
        const [lazy, eager] = lazyAndEager(bytes);
        expect(pruneDue(lazy, policy, now)).toBe(true);
        tidyCell(lazy, policy, now);
        tidyCell(eager, policy, now);
        expect(plainRow(decodeRow(encodeRow({ cells: new Map([['c', lazy]]) })))).toEqual(
          plainRow(decodeRow(encodeRow({ cells: new Map([['c', eager]]) }))),
        );
      }
    }
  });

  it('commits prune in batches: at most a quarter of maxVersionsPerCell more records, never fewer than it', async () => {
    const store = new MemoryStore();
    const db = new Percolator({ store, gc: { maxVersionsPerCell: 32 } });
    const counts: number[] = [];
    for (let i = 0; i < 120; i++) {
      await db.transact(async (tx) => tx.set('t', 'r', 'v', `${i}`));
      counts.push(decodeRow((await store.read('t', 'r'))!.state).cells.get('v')!.recordCount);
    }
    expect(Math.max(...counts)).toBe(40);
    expect(Math.min(...counts.slice(40))).toBeGreaterThanOrEqual(32);
    // Between two prunes the count only grows: a prune is a batch, not one record per commit.
    const drops = counts.filter((n, i) => i > 0 && n < counts[i - 1]!).length;
    expect(drops).toBeGreaterThan(0);
    expect(drops).toBeLessThanOrEqual(Math.ceil(80 / 8));
    // db.gc() prunes exactly, to the cap.
    await db.gc('t');
    expect(decodeRow((await store.read('t', 'r'))!.state).cells.get('v')!.recordCount).toBe(32);
    await db.close();
  });

  it('a commit that moves values out of the history prunes in the same step (one decode for both)', async () => {
    // 100-byte values: the superseded ones pass inlineHistoryBytes every six commits or so,
    // and those moves decode the history. Each of them prunes too, so a hot cell past its cap
    // never reaches the batch trigger (a quarter of the cap more records).
    const store = new MemoryStore();
    const db = new Percolator({ store, gc: { maxVersionsPerCell: 32, inlineHistoryBytes: 512 } });
    const counts: number[] = [];
    const moved: number[] = [];
    for (let i = 0; i < 160; i++) {
      await db.transact(async (tx) => tx.set('t', 'r', 'v', `${i}`.padStart(100, '0')));
      const cell = decodeRow((await store.read('t', 'r'))!.state).cells.get('v')!;
      counts.push(cell.recordCount);
      moved.push(cell.writes.filter((rec) => rec.value !== 'inline').length);
    }
    expect(Math.max(...counts)).toBeLessThan(40);
    expect(Math.min(...counts.slice(40))).toBeGreaterThanOrEqual(32);
    // Every drop in the record count comes with values marked to move (or moved) in that commit.
    let drops = 0;
    for (let i = 41; i < counts.length; i++) {
      if (counts[i]! >= counts[i - 1]!) continue;
      drops++;
      expect(counts[i]).toBe(32);
    }
    expect(drops).toBeGreaterThanOrEqual(Math.floor(120 / 8));
    expect(moved.slice(40).every((n) => n > 0)).toBe(true);
    await db.close();
  });

  it('reads format 2 and 3 rows (no history section, no anchored records), and refuses what neither format allows', () => {
    const plain = historyCell(2, rng(3), 4, 10_000_000);
    const bytes = encodeRow(rowFrom([['c', plain]]));
    expect(bytes[0]).toBe(4);
    expect(decodeRow(bytes).cells.get('c')!.history).toBeUndefined();
    // With no anchored record (version blocks), format 4 is format 3's bytes.
    const format3 = Uint8Array.from(bytes);
    format3[0] = 3;
    expect(plainRow(decodeRow(format3))).toEqual(new Map([['c', plain]]));
    const format2 = Uint8Array.from(bytes);
    format2[0] = 2;
    expect(plainRow(decodeRow(format2))).toEqual(new Map([['c', plain]]));
    // Cell flag bit 4 (a history) is not format 2.
    const long = encodeRow(rowFrom([['c', historyCell(10, rng(4), 4, 10_000_000)]]));
    const flagged = Uint8Array.from(long);
    flagged[0] = 2;
    expect(() => decodeRow(flagged)).toThrow(CorruptRowError);
  });

  it('a history whose bytes do not match its header is a CorruptRowError, never a misread', () => {
    const long = encodeRow(rowFrom([['c', historyCell(12, rng(5), 4, 10_000_000)]]));
    // The last byte of the history is the last byte of the row: drop a record's worth of it.
    for (const cut of [1, 3]) {
      const truncated = long.slice(0, long.length - cut);
      expect(() => {
        const cell = decodeRow(truncated).cells.get('c')!;
        void cell.writes;
      }).toThrow(CorruptRowError);
    }
  });

  it('damaged rows decode, or fail with CorruptRowError: never another error, a hang or a huge allocation', () => {
    const random = rng(99);
    const rows = [
      encodeRow(rowFrom([['c', historyCell(40, rng(6), 8, 10_000_000)]])),
      encodeRow(
        rowFrom([
          ['a', historyCell(12, rng(7), 3, 10_000_000)],
          ['b', historyCell(3, rng(8), 20, 10_000_000)],
        ]),
      ),
    ];
    let corrupt = 0;
    for (let i = 0; i < 4_000; i++) {
      const bytes = Uint8Array.from(rows[i % rows.length]!);
      const damage = random();
      let damaged: Uint8Array;
      if (damage < 0.4) {
        bytes[1 + Math.floor(random() * (bytes.length - 1))] ^= 1 << Math.floor(random() * 8);
        damaged = bytes;
      } else if (damage < 0.7) {
        bytes[9 + Math.floor(random() * (bytes.length - 9))] = Math.floor(random() * 256);
        damaged = bytes;
      } else {
        damaged = bytes.subarray(0, Math.floor(random() * bytes.length));
      }
      try {
        const row = decodeRow(damaged);
        for (const cell of row.cells.values()) {
          void cell.writes;
          void cell.data;
        }
        encodeRow(row);
      } catch (error) {
        expect(error).toBeInstanceOf(CorruptRowError);
        corrupt++;
      }
    }
    expect(corrupt).toBeGreaterThan(0);
  });
});
