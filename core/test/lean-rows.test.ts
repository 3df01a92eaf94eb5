import {
  type CasRequest,
  CompositeStore,
  CorruptRowError,
  InvalidArgumentError,
  inspectHeadRow,
  MemoryStore,
  Percolator,
  StoreError,
  versionRowRef,
  versionRowValue,
  versionTable,
} from '@percolator/core';
import { describe, expect, it, vi } from 'vitest';
import { GARBAGE_BATCH } from '../src/cells.js';
import { decodeRow, encodeRow, STAMP } from '../src/codec.js';
import { STAMP_OFFSET, writeStamp } from '../src/store.js';
import { plainRow, rowFrom } from './row-support.js';
import { InstrumentedStore } from './support.js';

/** Lean rows (docs/protocol.md sections 2 and 7): what the conformance suite cannot see from outside. */
/** The memory store, seen through a proxy that shows every check-and-set call's requests to `onCall`. */
function onCasCalls(inner: MemoryStore, onCall: (requests: readonly CasRequest[]) => void): MemoryStore {
  return new Proxy(inner, {
    get(target, name) {
      const value = Reflect.get(target, name);
      if (typeof value !== 'function') return value;
      return (...args: unknown[]) => {
        if (name === 'checkAndSet') onCall([args[0] as CasRequest]);
        if (name === 'checkAndSetMany') onCall(args[0] as CasRequest[]);
        return value.apply(target, args);
      };
    },
  });
}

describe('lean rows', () => {
  it('a committing client drops its released secondaries lists in its next write of the row, with no write of its own', async () => {
    const store = new InstrumentedStore();
    const db = new Percolator({ store });
    await db.transact(async (tx) => {
      tx.set('t', 'a', 'v', '1');
      tx.set('t', 'b', 'v', '1');
    });
    await db.close();
    const listed = inspectHeadRow((await store.read('t', 'a'))!.state).cells[0]!.writes[0]!;
    expect(listed.secondaries).toEqual([{ table: 't', row: 'b' }]);
    const writes = store.calls.checkAndSet;
    const again = new Percolator({ store });
    // A fresh client knows nothing of that transaction: its list stays.
    await again.transact(async (tx) => tx.set('t', 'a', 'w', 'x'));
    expect(
      inspectHeadRow((await store.read('t', 'a'))!.state).cells[0]!.writes[0]!.secondaries,
    ).toBeDefined();
    await again.close();
    // The client that committed it drops the list in its next write of that row.
    const owner = new Percolator({ store });
    await owner.transact(async (tx) => {
      tx.set('t', 'a', 'v', '2');
      tx.set('t', 'c', 'v', '2');
    });
    await owner.flush(); // its secondaries are committed in the background
    const writesOf = () => store.calls.checkAndSet + store.calls.checkAndSetStamped;
    const before = writesOf();
    await owner.transact(async (tx) => tx.set('t', 'a', 'w', 'y'));
    await owner.close();
    const cell = inspectHeadRow((await store.read('t', 'a'))!.state).cells.find((c) => c.column === 'v')!;
    expect(cell.writes[0]!.secondaries).toBeUndefined(); // released by its own client
    expect(cell.writes[1]!.secondaries).toEqual([{ table: 't', row: 'b' }]); // left for GC
    // The single-row transaction cost its usual write (one stamped CAS here), nothing more.
    expect(writesOf() - before).toBe(1);
    expect(writes).toBeGreaterThan(0);
  });

  it('on a store without stamped CAS the release rides on the next prewrite', async () => {
    const store = new InstrumentedStore(new MemoryStore(), { stampedCheckAndSet: false });
    const owner = new Percolator({ store });
    await owner.transact(async (tx) => {
      tx.set('t', 'a', 'v', '1');
      tx.set('t', 'b', 'v', '1');
    });
    await owner.flush();
    const before = store.calls.checkAndSet;
    await owner.transact(async (tx) => tx.set('t', 'a', 'w', 'y'));
    expect(store.calls.checkAndSet - before).toBe(2); // prewrite and commit, nothing more
    const cell = inspectHeadRow((await store.read('t', 'a'))!.state).cells.find((c) => c.column === 'v')!;
    expect(cell.writes[0]!.secondaries).toBeUndefined();
    await owner.close();
  });

  it('the stamp slot holds the timestamp big-endian, across the 32-bit boundary and up to 2^53 - 1', () => {
    for (const ts of [
      0,
      1,
      255,
      256,
      2 ** 32 - 1,
      2 ** 32,
      2 ** 32 + 1,
      2 ** 45 + 7,
      Number.MAX_SAFE_INTEGER,
    ]) {
      const state = Uint8Array.from({ length: 12 }, (_, i) => 0xa0 + i);
      const stamped = writeStamp(state, ts);
      const view = new DataView(stamped.buffer, stamped.byteOffset, stamped.byteLength);
      expect(view.getBigUint64(STAMP_OFFSET)).toBe(BigInt(ts));
      // Only the slot changes, and the input is left alone.
      expect(stamped[0]).toBe(0xa0);
      expect([...stamped.subarray(STAMP_OFFSET + 8)]).toEqual([0xa9, 0xaa, 0xab]);
      expect(state[STAMP_OFFSET]).toBe(0xa1);
    }
    expect(() => writeStamp(new Uint8Array(4), 1)).toThrow(RangeError);
  });

  it('a stamped record takes its commitTs from the slot the store fills, and keeps it when re-encoded', () => {
    const cell = (commitTs: number) => ({
      data: new Map([[90, Uint8Array.from([1, 2])]]),
      lock: undefined,
      writes: [
        { commitTs, startTs: 90, kind: 'put' as const, value: 'inline' as const, wallTimeMs: 5 },
        { commitTs: 80, startTs: 70, kind: 'put' as const, value: 'moved' as const, wallTimeMs: 4 },
        { commitTs: 75, startTs: 75, kind: 'rollback' as const, value: 'inline' as const, wallTimeMs: 4 },
      ],
      prunedThrough: 0,
      notifyTs: 0,
      acks: new Map<string, number>(),
      garbage: [],
    });
    const template = encodeRow(
      rowFrom([
        ['a', cell(STAMP)],
        ['b', cell(STAMP)],
      ]),
    );
    expect(() => decodeRow(template)).toThrow(CorruptRowError); // a stamped record with no stamp
    const stamp = 2 ** 45 + 7;
    const decoded = decodeRow(writeStamp(template, stamp));
    const expected = new Map([
      ['a', cell(stamp)],
      ['b', cell(stamp)],
    ]);
    expect(plainRow(decoded)).toEqual(expected);
    expect(plainRow(decodeRow(encodeRow(decoded)))).toEqual(expected);
    // Re-encoded without decoding the older records (the history), it reads the same.
    const fresh = decodeRow(writeStamp(template, stamp));
    expect(fresh.cells.get('a')!.history).toBeDefined();
    expect(plainRow(decodeRow(encodeRow(fresh)))).toEqual(expected);
  });

  it('a start-stamped record (a one-phase blind write) takes both timestamps and its data key from the slot', () => {
    const cell = (ts: number) => ({
      data: new Map([
        [ts, Uint8Array.from([9])],
        [70, Uint8Array.from([1, 2])],
      ]),
      lock: undefined,
      writes: [
        { commitTs: ts, startTs: ts, kind: 'put' as const, value: 'inline' as const, wallTimeMs: 6 },
        { commitTs: 80, startTs: 70, kind: 'put' as const, value: 'inline' as const, wallTimeMs: 4 },
      ],
      prunedThrough: 0,
      notifyTs: 0,
      acks: new Map<string, number>(),
      garbage: [],
    });
    const template = encodeRow(rowFrom([['a', cell(STAMP)]]));
    expect(() => decodeRow(template)).toThrow(CorruptRowError); // stamped, and no stamp
    const stamp = 2 ** 40 + 3;
    const decoded = decodeRow(writeStamp(template, stamp));
    expect(plainRow(decoded)).toEqual(new Map([['a', cell(stamp)]]));
    // Re-encoded with real values (no start-stamped bit left), it reads the same with any slot.
    const again = encodeRow(decoded);
    expect(plainRow(decodeRow(again))).toEqual(plainRow(decoded));
    expect(plainRow(decodeRow(writeStamp(again, 5)))).toEqual(plainRow(decoded));
    // An observed column's notification, stamped in the same CAS.
    const noted = encodeRow(rowFrom([['a', { ...cell(STAMP), notifyTs: STAMP }]]));
    expect(() => decodeRow(noted)).toThrow(CorruptRowError);
    expect(plainRow(decodeRow(writeStamp(noted, stamp)))).toEqual(
      new Map([['a', { ...cell(stamp), notifyTs: stamp }]]),
    );
    expect(plainRow(decodeRow(encodeRow(decodeRow(writeStamp(noted, stamp)))))).toEqual(
      plainRow(decodeRow(writeStamp(noted, stamp))),
    );
    // Bit 6 without bit 5 is no record kind this code knows: an error, never a guess.
    const bits = Uint8Array.from(writeStamp(template, stamp));
    const at = bits.indexOf(0 | (0 << 2) | 32 | 64);
    expect(at).toBeGreaterThan(0);
    bits[at] = 64;
    expect(() => decodeRow(bits)).toThrow(/unknown write record kind/);
  });

  it('a tidy round that fails is tried again: a store failure on its head CAS does not leave the last write untidied', async () => {
    const inner = new MemoryStore();
    // The writes are one-phase (stamped CAS); the only plain CASes on the head row are the
    // tidy step's. Fail the first 8 of them (a round's store failures: the round fails).
    let failures = 8;
    const store = new Proxy(inner, {
      get(target, name) {
        const value = Reflect.get(target, name);
        if (typeof value !== 'function') return value;
        return (...args: unknown[]) => {
          const requests = (name === 'checkAndSetMany' ? args[0] : [args[0]]) as CasRequest[];
          if (
            (name === 'checkAndSet' || name === 'checkAndSetMany') &&
            requests.some((r) => r.table === 't') &&
            failures > 0
          ) {
            failures--;
            return Promise.reject(new StoreError('injected: the head CAS never reached the store', 'no'));
          }
          return value.apply(target, args);
        };
      },
    });
    // onePhaseMaxRows 1: no step of several rows, so the moves are the tidy step's (a
    // one-step commit would carry them itself).
    const db = new Percolator({ store, onePhaseMaxRows: 1 });
    const big = 'x'.repeat(1024);
    for (let i = 0; i < 3; i++) await db.transact(async (tx) => tx.set('t', 'r', 'v', `${i}${big}`));
    await db.close();
    expect(failures).toBe(0);
    const view = inspectHeadRow((await inner.read('t', 'r'))!.state);
    expect(view.cells[0]!.writes.map((w) => w.value)).toEqual(['inline', 'moved', 'moved']);
  });

  it('after a burst of writes, close() leaves no unfinished move: the tidy step follows the burst to its last write', async () => {
    const store = new MemoryStore();
    const big = 'x'.repeat(1024);
    await Promise.all(
      Array.from({ length: 8 }, async (_, c) => {
        const db = new Percolator({ store });
        for (let i = 0; i < 300; i++)
          await db.transact(async (tx) => tx.set('t', `cell${c}`, 'v', `${i}${big}`));
        await db.close();
      }),
    );
    for (let c = 0; c < 8; c++) {
      const view = inspectHeadRow((await store.read('t', `cell${c}`))!.state);
      expect(view.cells[0]!.writes.filter((w) => w.value !== 'moved').map((w) => w.value)).toEqual([
        'inline',
      ]);
      // Pruned version rows are deleted GARBAGE_BATCH at a time (docs/protocol.md 7.3): fewer
      // names than that wait for the row's next write or gc, and ask for no tidy step.
      expect(view.cells[0]!.garbage.length).toBeLessThan(GARBAGE_BATCH);
    }
  });

  it('a write landing while its row is tidied asks for another round only if the row still needs one: each version row is created once', async () => {
    const store = new InstrumentedStore();
    const creates = new Map<string, number>();
    store.casFault = (request) => {
      if (request.expected === null && request.table === versionTable('t'))
        creates.set(request.key, (creates.get(request.key) ?? 0) + 1);
      return undefined;
    };
    // No pruning by count: every superseded value is moved, however the tidy step's batches
    // fall in time (with pruning, a value pruned before its batch never needs moving).
    const db = new Percolator({ store, gc: { maxVersionsPerCell: 1000 } });
    // Back to back, so transactions' prewrites land on rows whose tidy step (started by
    // commits before) is still running; that step's own head CAS settles them.
    for (let i = 0; i < 100; i++)
      await db.transact(async (tx) => {
        for (const row of ['a', 'b']) {
          await tx.getString('t', row, 'v');
          tx.set('t', row, 'v', `${i}`.padEnd(100, 'x'));
        }
      });
    await db.close();
    expect([...creates.values()].filter((n) => n > 1)).toEqual([]);
    let moved = 0;
    for (const row of ['a', 'b']) {
      const cell = inspectHeadRow((await store.read('t', row))!.state).cells[0]!;
      expect(cell.writes.filter((w) => w.value === 'moving')).toEqual([]);
      for (const w of cell.writes.filter((w) => w.value === 'moved')) {
        const ref = versionRowRef('t', row, 'v', w.block ?? w.startTs);
        // Its block holds it (a 100-byte value).
        expect(versionRowValue((await store.read(ref.table, ref.key))!.state, w.startTs)?.length).toBe(100);
        moved++;
      }
    }
    // Every superseded value moved, but the few the inline budget keeps (512 bytes of them),
    // in blocks of several values: fewer version rows than values.
    expect(moved).toBeGreaterThanOrEqual(2 * 90);
    expect(creates.size).toBeLessThan(moved / 3);
  });

  it('the rows one commit writes are tidied together: one batch of version-row creates for all of them, not one per row', async () => {
    const inner = new MemoryStore();
    const vt = versionTable('t');
    let createCalls = 0;
    const store = onCasCalls(inner, (requests) => {
      if (requests.some((r) => r.table === vt && r.expected === null)) createCalls++;
    });
    const db = new Percolator({ store });
    const transactions = 30;
    for (let i = 0; i < transactions; i++)
      await db.transact(async (tx) => {
        for (let r = 0; r < 10; r++) tx.set('t', `r${r}`, 'v', `${i}`.padEnd(100, '.'));
      });
    await db.close();
    // Each row's pass on its own made 40 such calls here (1.3 per transaction); batched, 8.
    expect(createCalls).toBeLessThan(transactions / 2);
    let moved = 0;
    for (let r = 0; r < 10; r++) {
      const cell = inspectHeadRow((await inner.read('t', `r${r}`))!.state).cells[0]!;
      expect(cell.writes.filter((w) => w.value === 'moving')).toEqual([]);
      for (const w of cell.writes.filter((w) => w.value === 'moved')) {
        moved++;
        const ref = versionRowRef('t', `r${r}`, 'v', w.block ?? w.startTs);
        expect(versionRowValue((await inner.read(ref.table, ref.key))!.state, w.startTs)).toBeDefined();
      }
    }
    expect(moved).toBeGreaterThan(100);
  });

  it('the tidy step waits a moment for more rows: one-row commits in a row share batches, and flush() starts the waiting batch at once', async () => {
    const inner = new MemoryStore();
    const vt = versionTable('t');
    let createCalls = 0;
    let headCasCalls = 0;
    let inTidy = false;
    const store = onCasCalls(inner, (requests) => {
      if (requests.some((r) => r.table === vt && r.expected === null)) {
        createCalls++;
        inTidy = true;
      } else if (inTidy && requests.every((r) => r.table === 't')) {
        headCasCalls++;
        inTidy = false;
      }
    });
    const db = new Percolator({ store });
    // With timers frozen, the batch waits until flush() starts it: flush() only returns if it does.
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    try {
      // 600-byte values: every commit after a row's first leaves a superseded value to move.
      for (let i = 0; i < 40; i++)
        await db.transact(async (tx) => tx.set('t', `r${i % 8}`, 'v', `${i}`.padEnd(600, '.')));
      expect(createCalls).toBe(0);
      await db.flush();
    } finally {
      vi.useRealTimers();
    }
    // A batch per commit made 32 create calls here (one per commit that left a value).
    expect(createCalls).toBeLessThanOrEqual(8);
    expect(headCasCalls).toBeLessThanOrEqual(createCalls);
    for (let r = 0; r < 8; r++) {
      const cell = inspectHeadRow((await inner.read('t', `r${r}`))!.state).cells[0]!;
      expect(cell.writes.filter((w) => w.value === 'moving')).toEqual([]);
      expect(cell.writes.filter((w) => w.value === 'moved').length).toBe(4);
    }
    await db.close();
  });

  it('a client deletes the version rows it created with the versions it remembers, with no read; another client reads first; a stale version is read back from the failed delete', async () => {
    const store = new InstrumentedStore();
    const gc = { inlineHistoryBytes: 0, maxVersionsPerCell: 2 };
    let versionReads = 0;
    let versionDeletes = 0;
    store.readFault = (table) => {
      if (table === versionTable('t')) versionReads++;
      return false;
    };
    store.casFault = (request) => {
      if (request.table === versionTable('t') && request.state === null) versionDeletes++;
      return undefined;
    };
    const exists = async (row: string, ts: number) => {
      const ref = versionRowRef('t', row, 'v', ts);
      return (await store.read(ref.table, ref.key)) !== null;
    };
    const namedOf = async (row: string) => {
      const cell = inspectHeadRow((await store.read('t', row))!.state).cells[0]!;
      return [...cell.garbage, ...cell.writes.filter((w) => w.value === 'moved').map((w) => w.startTs)];
    };
    // Every superseded value moves at once, and pruning keeps two records.
    const db = new Percolator({ store, gc });
    const moved = new Set<number>();
    for (let i = 0; i < 3 * GARBAGE_BATCH; i++) {
      await db.transact(async (tx) => tx.set('t', 'own', 'v', `value ${i}`));
      await db.flush();
      for (const ts of await namedOf('own')) moved.add(ts);
    }
    await db.tidy('t', 'own');
    const reads = versionReads;
    expect(versionDeletes).toBeGreaterThan(GARBAGE_BATCH);
    expect(reads).toBe(0);
    for (const ts of moved) expect(await exists('own', ts)).toBe((await namedOf('own')).includes(ts));

    // Moved by one client, pruned and deleted by another: each version row is read first.
    await db.transact(async (tx) => {
      for (let i = 0; i < GARBAGE_BATCH; i++) tx.set('t', `r${i}`, 'v', 'first');
    });
    for (let i = 0; i < GARBAGE_BATCH; i++)
      await db.transact(async (tx) => tx.set('t', `r${i}`, 'v', 'second'));
    await db.close();
    const byDb = new Set<string>();
    for (let i = 0; i < GARBAGE_BATCH; i++)
      for (const ts of await namedOf(`r${i}`)) byDb.add(versionRowRef('t', `r${i}`, 'v', ts).key);
    expect(byDb.size).toBe(GARBAGE_BATCH);
    const readKeys: string[] = [];
    store.readFault = (table, key) => {
      if (table === versionTable('t')) readKeys.push(key);
      return false;
    };
    const other = new Percolator({ store, gc });
    for (let i = 0; i < GARBAGE_BATCH; i++) {
      for (const value of ['third', 'fourth', 'fifth'])
        await other.transact(async (tx) => tx.set('t', `r${i}`, 'v', value));
      await other.tidy('t', `r${i}`);
    }
    await other.close();
    for (const key of byDb) expect(await store.inner.read(versionTable('t'), key)).toBeNull();
    // Each was read before its delete. (A pass whose head CAS lost to the next commit leaves
    // its names, and the next pass reads them, gone by then, to confirm.)
    expect(new Set(readKeys.filter((k) => byDb.has(k)))).toEqual(byDb);

    // A version the creator remembers, made stale: its row deleted and created again
    // behind its back. The failed delete returns the row as it is, and a second delete goes.
    const owner = new Percolator({ store, gc });
    await owner.transact(async (tx) => tx.set('t', 'stale', 'v', 'a'));
    await owner.transact(async (tx) => tx.set('t', 'stale', 'v', 'b'));
    await owner.flush();
    const [ts] = await namedOf('stale');
    const ref = versionRowRef('t', 'stale', 'v', ts!);
    const row = (await store.inner.read(ref.table, ref.key))!;
    await store.inner.checkAndSet({ ...ref, expected: row.version, state: null });
    await store.inner.checkAndSet({ ...ref, expected: null, state: row.state });
    // The next commit prunes it, and its tidy pass (moving 'b') deletes it.
    await owner.transact(async (tx) => tx.set('t', 'stale', 'v', 'c'));
    await owner.flush();
    expect(await namedOf('stale')).not.toContain(ts);
    expect(await exists('stale', ts!)).toBe(false);
    await owner.close();
  });

  it('pruned version rows are deleted in batches of GARBAGE_BATCH in the background, and all at once by db.tidy', async () => {
    const store = new InstrumentedStore();
    // Every superseded value moves to a version row: 2 * GARBAGE_BATCH of them.
    const mover = new Percolator({ store, gc: { inlineHistoryBytes: 0, maxVersionsPerCell: 1000 } });
    for (let i = 0; i < 2 * GARBAGE_BATCH + 1; i++)
      await mover.transact(async (tx) => tx.set('t', 'r', 'v', `value ${i}`));
    await mover.close();
    const movedTs = inspectHeadRow((await store.read('t', 'r'))!.state)
      .cells[0]!.writes.filter((w) => w.value === 'moved')
      .map((w) => w.startTs);
    expect(movedTs).toHaveLength(2 * GARBAGE_BATCH);
    const exists = async (ts: number) => {
      const ref = versionRowRef('t', 'r', 'v', ts);
      return (await store.read(ref.table, ref.key)) !== null;
    };
    const garbageOf = async () => inspectHeadRow((await store.read('t', 'r'))!.state).cells[0]!.garbage;
    // A client that keeps few versions and moves nothing: its commits prune moved records,
    // in batches (cells.ts, pruneDue: once a cell holds a quarter of the cap more).
    const cap = 2 * GARBAGE_BATCH - 3;
    const pruner = new Percolator({ store, gc: { inlineHistoryBytes: 1 << 20, maxVersionsPerCell: cap } });
    let deleted = 0;
    store.casFault = (request) => {
      if (request.state === null) deleted++;
      return undefined;
    };
    const deletes = () => deleted;
    let commits = 0;
    const commit = async () => {
      await pruner.transact(async (tx) => tx.set('t', 'r', 'v', `pruner ${commits++}`));
      await pruner.flush();
    };
    const before = deletes();
    // Below the batch, commits leave the names and their version rows be: no tidy pass.
    let named: number[] = [];
    let prunes = 0;
    for (let i = 0; ; i++) {
      expect(i).toBeLessThan(4 * cap);
      const prior = [...(await garbageOf())];
      await commit();
      const now = await garbageOf();
      if (now.length === 0 && prior.length > 0) {
        named = prior;
        break;
      }
      if (now.length > prior.length) prunes++;
      expect(now.length).toBeLessThan(GARBAGE_BATCH);
      expect(deletes()).toBe(before);
      for (const ts of now) expect(await exists(ts)).toBe(true);
    }
    expect(prunes).toBeGreaterThan(0);
    // The commit that makes the batch deletes all of it (what was named, and what it pruned) in one pass.
    expect(deletes() - before).toBeGreaterThanOrEqual(GARBAGE_BATCH);
    for (const ts of named) expect(await exists(ts)).toBe(false);
    // Asked for, the tidy step deletes whatever is named, however little.
    while ((await garbageOf()).length === 0) await commit();
    const few = [...(await garbageOf())];
    expect(few.length).toBeLessThan(GARBAGE_BATCH);
    const report = await pruner.tidy('t', 'r');
    expect(report.deleted).toBe(few.length);
    expect(await garbageOf()).toEqual([]);
    for (const ts of few) expect(await exists(ts)).toBe(false);
    // No orphans: every moved record's version row is either still named by a record or gone.
    const kept = new Set(
      inspectHeadRow((await store.read('t', 'r'))!.state)
        .cells[0]!.writes.filter((w) => w.value === 'moved')
        .map((w) => w.startTs),
    );
    for (const ts of movedTs) expect(await exists(ts)).toBe(kept.has(ts));
    await pruner.close();
  });

  it('a row in an unknown format is a CorruptRowError, never a misread', async () => {
    const store = new MemoryStore();
    const db = new Percolator({ store });
    // Format 1 (the first version's layout) and a format from the future.
    for (const [key, state] of [
      ['old', Uint8Array.from([1, 0])],
      ['future', Uint8Array.from([99, 0])],
    ] as const) {
      await store.checkAndSet({ table: 't', key, expected: null, state });
      await expect(db.transact((tx) => tx.get('t', key, 'v'))).rejects.toBeInstanceOf(CorruptRowError);
      await expect(db.transact(async (tx) => tx.set('t', key, 'v', 'x'))).rejects.toBeInstanceOf(
        CorruptRowError,
      );
      expect((await store.read('t', key))!.state).toEqual(state);
    }
    await db.close();
  });

  it('a head row naming a version row that is gone is a CorruptRowError, never a wrong value', async () => {
    const store = new MemoryStore();
    const db = new Percolator({ store, gc: { inlineHistoryBytes: 0, maxVersionsPerCell: 100 } });
    await db.transact(async (tx) => tx.set('t', 'r', 'v', 'first'));
    const old = await db.begin();
    await db.transact(async (tx) => tx.set('t', 'r', 'v', 'second'));
    await db.flush(); // the move to a version row is done (close() would end the transaction `old` too)
    const view = inspectHeadRow((await store.read('t', 'r'))!.state);
    const moved = view.cells[0]!.writes.find((w) => w.value === 'moved')!;
    expect(moved).toBeDefined();
    const ref = versionRowRef('t', 'r', 'v', moved.startTs);
    expect(await old.getString('t', 'r', 'v')).toBe('first');
    const stored = (await store.read(ref.table, ref.key))!;
    await store.checkAndSet({ ...ref, expected: stored.version, state: null });
    await expect(old.getString('t', 'r', 'v')).rejects.toBeInstanceOf(CorruptRowError);
  });

  it('table names starting with "__" are reserved', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    const tx = await db.begin();
    expect(() => tx.set('__v.t', 'r', 'v', 'x')).toThrow(InvalidArgumentError);
    await expect(tx.get('__lease', 'r', 'v')).rejects.toBeInstanceOf(InvalidArgumentError);
    expect(
      () => new Percolator({ store: new MemoryStore(), observedColumns: [{ table: '__x', column: 'c' }] }),
    ).toThrow(InvalidArgumentError);
    await db.close();
  });

  it('version tables are valid store table names, one per user table, hashed past 60 characters', () => {
    expect(versionTable('accounts')).toBe('__v.accounts');
    const long = 'x'.repeat(64);
    expect(versionTable(long)).toMatch(/^__h\.[0-9a-f]{60}$/);
    expect(versionTable(long)).not.toBe(versionTable(`${'x'.repeat(63)}y`));
    // Keys are injective across (row, column) splits, and stay within 1024 bytes.
    expect(versionRowRef('t', 'a\u0000b', 'c', 5).key).not.toBe(versionRowRef('t', 'b', 'c\u0000a', 5).key);
    expect(versionRowRef('t', 'ab', 'c', 5).key).not.toBe(versionRowRef('t', 'b', 'ca', 5).key);
    const huge = versionRowRef('t', '\u{1F600}'.repeat(256), 'c'.repeat(256), 2 ** 50).key;
    expect(Buffer.byteLength(huge)).toBeLessThanOrEqual(1024);
  });

  it('a composite store routes version rows with their table and leases to the default, with no route naming them', async () => {
    const a = new MemoryStore();
    const b = new MemoryStore();
    const long = 'l'.repeat(64);
    const store = new CompositeStore({
      routes: [
        { table: 'docs', store: b },
        { table: long, store: b },
      ],
      default: a,
      counterStore: a,
    });
    expect(store.storeFor(versionTable('docs'), 'k')).toBe(b);
    expect(store.storeFor(versionTable(long), 'k')).toBe(b);
    expect(store.storeFor(versionTable('other'), 'k')).toBe(a);
    expect(store.storeFor('__lease', 'k')).toBe(a);
    const noDefault = new CompositeStore({ routes: [{ table: 'docs', store: b }], counterStore: a });
    expect(noDefault.storeFor('__lease', 'k')).toBe(b);
    const db = new Percolator({ store, gc: { inlineHistoryBytes: 0 } });
    for (let i = 0; i < 5; i++) await db.transact(async (tx) => tx.set('docs', 'd', 'v', `v${i}`));
    await db.close();
    expect((await b.scan(versionTable('docs'), { limit: 100 })).length).toBeGreaterThan(0);
    expect(await a.scan(versionTable('docs'), { limit: 100 })).toEqual([]);
  });
});

describe('options', () => {
  it('a misspelt client, gc or transact option is an InvalidArgumentError naming it, never silently ignored', async () => {
    const store = new MemoryStore();
    expect(() => new Percolator({ store, lockTTLMs: 10 } as never)).toThrow(
      /unknown option "lockTTLMs" \(did you mean "lockTtlMs"\?\)/,
    );
    expect(() => new Percolator({ store, gc: { maxVersions: 3 } } as never)).toThrow(InvalidArgumentError);
    expect(() => new Percolator(undefined as never)).toThrow(InvalidArgumentError);
    const db = new Percolator({ store });
    await expect(db.transact(async () => 1, { attempts: 3 } as never)).rejects.toBeInstanceOf(
      InvalidArgumentError,
    );
    await db.close();
  });
});
