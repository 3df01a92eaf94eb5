import { checkListAppend, type ListAppendMop, type ListAppendOp, Random } from '@percolator/conformance';
import { describe, expect, it } from 'vitest';

// A tiny history notation: 'a x 1' appends 1 to x, 'r x 1 2' reads [1, 2], 'r x' reads [].
function txn(type: ListAppendOp['type'], ...mops: string[]): ListAppendOp {
  return {
    type,
    txn: mops.map((m): ListAppendMop => {
      const [f, key, ...values] = m.split(' ');
      if (f === 'a') return { f: 'append', key: key!, value: Number(values[0]) };
      return { f: 'r', key: key!, value: type === 'ok' ? values.map(Number) : null };
    }),
  };
}
const ok = (...mops: string[]) => txn('ok', ...mops);
/** The history as run one transaction after another: each completes before the next is invoked. */
const sequential = (history: ListAppendOp[]) =>
  history.map((op, i) => ({ ...op, invoke: 2 * i, complete: 2 * i + 1 }));
const types = (history: ListAppendOp[]) =>
  [...new Set(checkListAppend(history).anomalies.map((a) => a.type))].sort();

describe('checkListAppend (Elle list-append, snapshot isolation)', () => {
  it('accepts an empty history and a serial one', () => {
    expect(checkListAppend([]).valid).toBe(true);
    const result = checkListAppend([
      ok('a x 1'),
      ok('r x 1', 'a x 2'),
      ok('r x 1 2', 'a y 1'),
      ok('r x 1 2', 'r y 1'),
    ]);
    expect(result.valid).toBe(true);
    expect(result.anomalies).toEqual([]);
    expect(result.allowed).toEqual([]);
    expect(result.counts).toEqual({ ok: 4, fail: 0, info: 0 });
  });

  it('accepts reads of a transaction own appends', () => {
    expect(types([ok('r x', 'a x 1', 'r x 1', 'a x 2', 'r x 1 2'), ok('r x 1 2')])).toEqual([]);
    expect(types([ok('a x 1', 'r x 1'), ok('r x 1', 'a x 2', 'r x 1 2')])).toEqual([]);
  });

  it('finds G0 (write cycle)', () => {
    const history = [ok('a x 1', 'a y 1'), ok('a x 2', 'a y 2'), ok('r x 1 2', 'r y 2 1')];
    const result = checkListAppend(history);
    expect(result.valid).toBe(false);
    const g0 = result.anomalies.find((a) => a.type === 'G0');
    expect(g0?.cycle?.every((s) => s.kind === 'ww')).toBe(true);
    expect([...(g0?.ops ?? [])].sort()).toEqual([0, 1]);
  });

  it('finds G1a (aborted read)', () => {
    expect(types([txn('fail', 'a x 1'), ok('r x 1')])).toEqual(['G1a']);
  });

  it('treats an unknown (info) transaction whose append is read as committed, not aborted', () => {
    expect(types([txn('info', 'a x 1', 'r y'), ok('r x 1')])).toEqual([]);
  });

  it('finds G1b (intermediate read)', () => {
    expect(types([ok('a x 1', 'a x 2'), ok('r x 1')])).toContain('G1b');
  });

  it('finds G1c (circular information flow)', () => {
    const result = checkListAppend([ok('a x 1', 'r y 1'), ok('a y 1', 'r x 1')]);
    expect(result.anomalies.map((a) => a.type)).toEqual(['G1c']);
    expect(result.anomalies[0]!.cycle!.every((s) => s.kind === 'wr')).toBe(true);
  });

  it('finds G-single (read skew: one anti-dependency)', () => {
    const history = [ok('a x 1', 'a y 1'), ok('r x', 'r y 1'), ok('r x 1')];
    const result = checkListAppend(history);
    expect(result.anomalies.map((a) => a.type)).toEqual(['G-single']);
    const cycle = result.anomalies[0]!.cycle!;
    expect(cycle.filter((s) => s.kind === 'rw')).toHaveLength(1);
    expect(result.anomalies[0]!.message).toMatch(/T1 -rw\("x"\)-> T0/);
  });

  it('places a transaction own appends in the version order, from its later reads (as Elle does)', () => {
    // T1 appends 2 to x after 1 and sees it; T2 read x before T1's append but y after it.
    // Only T1's own read [1, 2] tells that 2 follows 1: without it there is no rw edge.
    const history = [ok('a x 1'), ok('r x 1', 'a x 2', 'r x 1 2', 'a y 1'), ok('r x 1', 'r y 1')];
    const result = checkListAppend(history);
    expect(result.anomalies.map((a) => a.type)).toEqual(['G-single']);
    expect(result.anomalies[0]!.message).toMatch(/T2 -rw\("x"\)-> T1/);
  });

  it('finds G-nonadjacent (two anti-dependencies, never adjacent), which snapshot isolation forbids', () => {
    // T0 -rw(x)-> T1 -wr(y)-> T2 -rw(z)-> T3 -wr(w)-> T0
    const history = [
      ok('r x', 'r w 1'),
      ok('a x 1', 'a y 1'),
      ok('r y 1', 'r z'),
      ok('a z 1', 'a w 1'),
      ok('r x 1', 'r z 1'),
    ];
    const result = checkListAppend(history);
    expect(result.anomalies.map((a) => a.type)).toEqual(['G-nonadjacent']);
    expect(result.anomalies[0]!.cycle!.map((s) => s.kind)).toEqual(['rw', 'wr', 'rw', 'wr']);
  });

  it('finds a lost update (two committed appends from the same read)', () => {
    const history = [ok('a x 1'), ok('r x 1', 'a x 2'), ok('r x 1', 'a x 3'), ok('r x 1 2 3')];
    expect(types(history)).toEqual(['G-single', 'lost-update']);
  });

  it('allows G2-item (write skew) under snapshot isolation, reporting it as information', () => {
    const history = [
      ok('a x 1', 'a y 1'),
      ok('r x 1', 'r y 1', 'a x 2'),
      ok('r x 1', 'r y 1', 'a y 2'),
      ok('r x 1 2', 'r y 1 2'),
    ];
    const si = checkListAppend(history);
    expect(si.valid).toBe(true);
    expect(si.allowed.map((a) => a.type)).toEqual(['G2-item']);
    expect(si.allowed[0]!.cycle!.filter((s) => s.kind === 'rw')).toHaveLength(2);
    const serializable = checkListAppend(history, { allowed: [] });
    expect(serializable.valid).toBe(false);
    expect(serializable.anomalies.map((a) => a.type)).toEqual(['G2-item']);
  });

  it('finds reads that disagree on the order of a key (incompatible order)', () => {
    expect(types([ok('a x 1'), ok('a x 2'), ok('r x 1 2'), ok('r x 2 1')])).toContain('incompatible-order');
    expect(types([ok('a x 1'), ok('a x 2'), ok('r x 1 2'), ok('r x 2')])).toContain('incompatible-order');
  });

  it('finds garbage reads, duplicated elements, duplicate appends and internal inconsistency', () => {
    expect(types([ok('r x 99')])).toEqual(['garbage-read']);
    expect(types([ok('a x 1'), ok('r x 1 1')])).toContain('duplicate-elements');
    expect(types([ok('a x 1'), ok('a x 1')])).toEqual(['duplicate-append']);
    expect(types([ok('a x 5', 'r x')])).toEqual(['internal']);
    expect(types([ok('a x 1'), ok('a x 2'), ok('r x 1', 'r x 1 2')])).toContain('internal');
  });

  it('ignores the reads of failed and unknown transactions', () => {
    expect(
      types([ok('a x 1'), txn('fail', 'r x 1', 'a y 1'), txn('info', 'r x 1', 'a y 2'), ok('r y 2')]),
    ).toEqual([]);
  });

  it('finds a stale snapshot: a transaction invoked after a commit was acknowledged misses it (real time)', () => {
    const history = [ok('r x', 'a x 1'), ok('r x'), ok('r x 1')];
    // Without times, T1 may have run before T0: nothing to find.
    expect(types(history)).toEqual([]);
    const result = checkListAppend(sequential(history));
    expect(result.anomalies.map((a) => a.type)).toEqual(['G-single-realtime']);
    expect(result.anomalies[0]!.message).toMatch(/T1 -rw\("x"\)-> T0 -rt-> T1/);
  });

  it('checks each committed read against the timestamps: commits below its snapshot in, the others out', () => {
    const at = (op: ListAppendOp, startTs: number, commitTs?: number): ListAppendOp => ({
      ...op,
      startTs,
      ...(commitTs === undefined ? {} : { commitTs }),
    });
    // T0 commits at 5. A snapshot at 6 must see it; one at 5 or below must not.
    expect(types([at(ok('r x', 'a x 1'), 1, 5), at(ok('r x 1'), 6)])).toEqual([]);
    expect(types([at(ok('r x', 'a x 1'), 1, 5), at(ok('r x'), 5)])).toEqual([]);
    // Overlapping in every other respect (no real time, no dependency cycle): only the
    // timestamps tell that the first read missed a commit and the second saw one too early.
    const stale = checkListAppend([at(ok('r x', 'a x 1'), 1, 5), at(ok('r x'), 6)]);
    expect(stale.anomalies.map((a) => a.type)).toEqual(['stale-read']);
    expect(stale.anomalies[0]!.message).toMatch(
      /T1 read "x" = \[\] at snapshot 6, without 1 appended by T0, committed at 5/,
    );
    expect(types([at(ok('r x', 'a x 1'), 1, 5), at(ok('r x 1'), 4)])).toEqual(['future-read']);
    // Its own appends, and writers without a commit timestamp (unknown outcome, or stopped
    // after their commit point), are not judged by timestamps.
    expect(types([at(ok('r x', 'a x 1', 'r x 1'), 3, 5)])).toEqual([]);
    expect(types([at(ok('r x', 'a x 1'), 1), at(ok('r x'), 6)])).toEqual([]);
    expect(types([at(txn('info', 'r x', 'a x 1'), 1, 5), at(ok('r x'), 6)])).toEqual([]);
  });

  it('finds non-monotonic reads through real-time order, in one key and across keys', () => {
    expect(types(sequential([ok('r x', 'a x 1'), ok('r x 1'), ok('r x'), ok('r x 1')]))).toEqual([
      'G-single-realtime',
    ]);
    // y was appended after x was acknowledged: seeing y but not x is stale.
    expect(
      types(
        sequential([ok('r x', 'a x 1'), ok('r y', 'a y 1'), ok('r y 1'), ok('r x'), ok('r x 1', 'r y 1')]),
      ),
    ).toEqual(['G-single-realtime']);
  });

  it('finds a read of a value appended by a transaction invoked after the reader completed', () => {
    expect(types(sequential([ok('r x 1'), ok('r x', 'a x 1')]))).toEqual(['G1c-realtime']);
  });

  it('orders only completed commits in real time: overlapping and unknown (info) transactions give no edge', () => {
    // T1 was invoked before T0 completed: it may read before T0's commit.
    const overlapping = [ok('r x', 'a x 1'), ok('r x'), ok('r x 1')];
    const times = [
      [0, 3],
      [2, 4],
      [5, 6],
    ];
    expect(
      types(overlapping.map((op, i) => ({ ...op, invoke: times[i]![0], complete: times[i]![1] }))),
    ).toEqual([]);
    // Completion at the very instant of the next invoke gives no order either.
    expect(types(overlapping.map((op, i) => ({ ...op, invoke: i, complete: i + 1 })))).toEqual([]);
    // An info transaction may have committed any time after it ended.
    expect(types(sequential([txn('info', 'r x', 'a x 1'), ok('r x'), ok('r x 1')]))).toEqual([]);
  });

  it('with finalRead: a committed append or a read value missing from the final read is lost', () => {
    const final = (history: ListAppendOp[]) =>
      [...new Set(checkListAppend(history, { finalRead: true }).anomalies.map((a) => a.type))].sort();
    // Read once, then gone: the longest read alone would take [1] as the order.
    expect(types([ok('r x', 'a x 1'), ok('r x 1'), ok('r x')])).toEqual([]);
    expect(final([ok('r x', 'a x 1'), ok('r x 1'), ok('r x')])).toEqual(['lost-append']);
    // Never read, but committed.
    expect(final([ok('r x', 'a x 1'), ok('r x')])).toEqual(['lost-append']);
    // A read of a value that then vanished, whoever appended it.
    expect(final([ok('a x 1'), ok('r x 1', 'a x 2'), ok('r x 1 2', 'r y'), ok('r x 1', 'r y')])).toEqual([
      'lost-append',
    ]);
    expect(final([ok('r x', 'a x 1'), ok('r x 1'), ok('r x 1')])).toEqual([]);
  });

  it('with finalRead: an unknown (info) transaction a committed read saw committed, so every append of it stays', () => {
    const final = (history: ListAppendOp[]) =>
      [...new Set(checkListAppend(history, { finalRead: true }).anomalies.map((a) => a.type))].sort();
    const info = (...mops: string[]) => txn('info', ...mops);
    expect(final([info('r x', 'a x 1'), ok('r x 1'), ok('r x')])).toEqual(['lost-append']);
    // Its primary x is in the final read, its secondary y is gone: also lost.
    expect(final([info('r x', 'a x 1', 'r y', 'a y 1'), ok('r x 1', 'r y')])).toEqual(['lost-append']);
    expect(final([info('r x', 'a x 1', 'r y', 'a y 1'), ok('r x 1', 'r y 1'), ok('r x', 'r y')])).toEqual([
      'lost-append',
    ]);
    // Never seen: it may not have committed, and its absence is no loss.
    expect(final([info('r x', 'a x 1', 'r y', 'a y 1'), ok('r x', 'r y')])).toEqual([]);
    expect(final([info('r x', 'a x 1', 'r y', 'a y 1'), ok('r x 1', 'r y 1')])).toEqual([]);
  });

  it('uses the reads of an unknown (info) transaction once a committed read saw one of its appends', () => {
    // Its reads kept, as the workload records them.
    const info = (...mops: string[]) => ({ ...ok(...mops), type: 'info' as const });
    // T2's commit was unknown, but T3 saw 3: it committed from the same read as T1.
    expect(
      types([ok('r x', 'a x 1'), ok('r x 1', 'a x 2'), info('r x 1', 'a x 3'), ok('r x 1 2 3')]),
    ).toEqual(['G-single', 'lost-update']);
    // Never seen, its reads say nothing: it may not have committed.
    expect(types([ok('r x', 'a x 1'), ok('r x 1', 'a x 2'), info('r x 1', 'a x 3'), ok('r x 1 2')])).toEqual(
      [],
    );
    // Seen: a garbage read of its own counts too.
    expect(types([info('r y 9', 'a x 1'), ok('r x 1')])).toEqual(['garbage-read']);
  });

  it('uses the ids given in the history in its messages', () => {
    const history = [txn('fail', 'a x 1'), ok('r x 1')].map((op, i) => ({ ...op, id: 100 + i }));
    const [anomaly] = checkListAppend(history).anomalies;
    expect(anomaly!.ops).toEqual([101, 100]);
    expect(anomaly!.message).toContain('T101');
  });

  it('finds nothing in simulated serial and snapshot-isolation executions', () => {
    for (let seed = 1; seed <= 20; seed++) {
      expect(checkListAppend(simulate(seed, 'serial'), { allowed: [] }).valid).toBe(true);
      const si = checkListAppend(simulate(seed, 'si'));
      expect(si.anomalies).toEqual([]);
    }
  });

  it('finds lost updates in a simulated execution without write-conflict checks', () => {
    const found = new Set<string>();
    for (let seed = 1; seed <= 10; seed++) {
      for (const a of checkListAppend(simulate(seed, 'no-conflict-check')).anomalies) found.add(a.type);
    }
    expect(found).toContain('lost-update');
    // An overwritten append vanishes from later lists, so reads also disagree on order.
    expect(found).toContain('incompatible-order');
  });

  it('finds stale snapshots in a simulated execution whose snapshots lag one commit behind', () => {
    const found = new Set<string>();
    for (let seed = 1; seed <= 10; seed++) {
      const history = simulate(seed, 'stale-snapshot');
      // Without times it is a valid snapshot-isolation history: only real time shows the lag.
      expect(checkListAppend(history.map(({ invoke, complete, ...op }) => op)).anomalies).toEqual([]);
      for (const a of checkListAppend(history).anomalies) found.add(a.type);
    }
    expect(found).toContain('G-single-realtime');
  });

  it('finds read skew in a simulated execution that reads each key at its own time', () => {
    const found = new Set<string>();
    for (let seed = 1; seed <= 10; seed++) {
      for (const a of checkListAppend(simulate(seed, 'read-committed')).anomalies) found.add(a.type);
    }
    expect(found).toContain('G-single');
  });
});

/**
 * A toy database over list cells, running interleaved transactions:
 * - serial: one at a time;
 * - si: snapshot reads, first committer wins on written keys;
 * - no-conflict-check: snapshot reads, every commit applied (lost updates);
 * - read-committed: each read sees the latest committed state (read skew), conflicts checked;
 * - stale-snapshot: si, but each snapshot is one commit old (valid but for real time).
 * Each transaction records its invoke and complete step.
 */
function simulate(
  seed: number,
  mode: 'serial' | 'si' | 'no-conflict-check' | 'read-committed' | 'stale-snapshot',
): ListAppendOp[] {
  const random = new Random(seed);
  const keys = ['x', 'y', 'z'];
  type Version = { commit: number; lists: Map<string, number[]> };
  const versions: Version[] = [{ commit: 0, lists: new Map(keys.map((k) => [k, []])) }];
  const lastWrite = new Map<string, number>();
  let clock = 0;
  let nextValue = 1;
  const history: ListAppendOp[] = [];
  interface Running {
    invoke: number;
    start: number;
    snapshot: Map<string, number[]>;
    plan: { key: string; append: boolean }[];
    mops: ListAppendMop[];
    writes: Map<string, number[]>;
  }
  const running: Running[] = [];
  const latest = () => versions[versions.length - 1]!.lists;
  let steps = 0;
  const begin = (): Running => ({
    invoke: steps++,
    start: mode === 'stale-snapshot' && versions.length > 1 ? versions[versions.length - 2]!.commit : clock,
    snapshot: new Map(
      mode === 'stale-snapshot' && versions.length > 1 ? versions[versions.length - 2]!.lists : latest(),
    ),
    plan: Array.from({ length: random.between(1, 4) }, () => ({
      key: random.pick(keys),
      append: random.chance(0.5),
    })),
    mops: [],
    writes: new Map(),
  });
  const stepOf = (t: Running) => {
    const { key, append } = t.plan.shift()!;
    const base = mode === 'read-committed' ? latest() : t.snapshot;
    const list = t.writes.get(key) ?? base.get(key)!;
    t.mops.push({ f: 'r', key, value: [...list] });
    if (append) {
      const value = nextValue++;
      t.writes.set(key, [...list, value]);
      t.mops.push({ f: 'append', key, value });
    }
  };
  const finish = (t: Running) => {
    const conflict =
      mode !== 'no-conflict-check' && [...t.writes.keys()].some((k) => (lastWrite.get(k) ?? 0) > t.start);
    if (conflict) {
      history.push({
        type: 'fail',
        txn: t.mops.map((m) => (m.f === 'r' ? { ...m, value: null } : m)),
        invoke: t.invoke,
        complete: steps++,
      });
      return;
    }
    clock++;
    const lists = new Map(latest());
    for (const [k, v] of t.writes) {
      lists.set(k, v);
      lastWrite.set(k, clock);
    }
    versions.push({ commit: clock, lists });
    history.push({ type: 'ok', txn: t.mops, invoke: t.invoke, complete: steps++ });
  };
  for (let i = 0; i < 200; i++) {
    if (mode === 'serial') {
      const t = begin();
      while (t.plan.length > 0) stepOf(t);
      finish(t);
      continue;
    }
    if (running.length < 4) running.push(begin());
    const t = random.pick(running);
    if (t.plan.length > 0) stepOf(t);
    else {
      running.splice(running.indexOf(t), 1);
      finish(t);
    }
  }
  for (const t of running) {
    while (t.plan.length > 0) stepOf(t);
    finish(t);
  }
  history.push({
    type: 'ok',
    txn: keys.map((key) => ({ f: 'r', key, value: [...latest().get(key)!] })),
    invoke: steps++,
    complete: steps++,
  });
  return history;
}
