/**
 * A snapshot-isolation checker for list-append histories, after Elle (Kingsbury & Alvaro,
 * "Elle: Inferring Isolation Anomalies from Experimental Observations", VLDB 2020).
 *
 * Every transaction appends unique values to lists and reads whole lists. Because each
 * value is unique and a list only grows, a read names exactly which appends it saw and in
 * which order; the longest read of a key gives that key's version order, which every
 * other read must be a prefix of. From the version orders we infer write-write (ww),
 * write-read (wr) and read-write anti-dependency (rw) edges between transactions, and
 * look for cycles. Under snapshot isolation G0, G1 (a/b/c), G-single (read skew),
 * G-nonadjacent (rw edges that are never adjacent, Cerone & Gotsman's characterisation) and lost
 * updates must not occur; G2-item (write skew, a cycle with two or more rw edges) is
 * allowed and reported only as information.
 *
 * Where the history records when each transaction was invoked and completed, a committed
 * transaction that completed before another was invoked also gives a real-time (rt) edge:
 * a timestamp oracle makes the second one's snapshot include the first one's commit
 * (strong snapshot isolation). An rt edge orders commit before start, as a wr edge does,
 * so it counts as one in the cycles above; a cycle that needs one is reported with the
 * suffix -realtime (a stale snapshot: T1 -rt-> T2 -rw-> T1 is G-single-realtime).
 */
import {
  type CycleStep,
  DependencyGraph,
  type EdgeKind,
  labelCycle,
  shortestPath,
  stronglyConnectedComponents,
} from './graph.js';

export type { CycleStep, EdgeKind } from './graph.js';

export type ListAppendMop =
  | { readonly f: 'append'; readonly key: string; readonly value: number }
  /** `value` is the list read, or null when not known (failed or unknown transactions). */
  | { readonly f: 'r'; readonly key: string; readonly value: readonly number[] | null };

export interface ListAppendOp {
  /** Defaults to the position in the history. */
  readonly id?: number;
  /** Which client or worker ran it (for messages only). */
  readonly process?: number;
  /**
   * When it was invoked (before begin; a transaction retried inside one call counts from
   * the first attempt) and when it completed (its commit acknowledged), on one clock shared
   * by every client of the history, e.g. performance.now(). Real-time edges need both; the
   * completion of an info or fail transaction is not used.
   */
  readonly invoke?: number;
  readonly complete?: number;
  /**
   * ok: committed; fail: certainly did not commit; info: outcome unknown (for example a
   * commit-unknown error). Reads of fail transactions are not used, nor those of an info
   * transaction until a committed read saw one of its appends (then it committed, and its
   * reads were a snapshot like any other).
   */
  readonly type: 'ok' | 'fail' | 'info';
  readonly txn: readonly ListAppendMop[];
  /**
   * Optional timestamps: the snapshot its reads were taken at (`tx.startTs`), and for a
   * committed transaction its commit timestamp. With them, each committed read is checked
   * against snapshot isolation's visibility rule itself (stale-read, future-read), which
   * real time only bounds.
   */
  readonly startTs?: number;
  readonly commitTs?: number;
}

export type AnomalyType =
  | 'G0'
  | 'G1a'
  | 'G1b'
  | 'G1c'
  | 'G-single'
  | 'G-nonadjacent'
  | 'G2-item'
  | 'G0-realtime'
  | 'G1c-realtime'
  | 'G-single-realtime'
  | 'G-nonadjacent-realtime'
  | 'G2-item-realtime'
  | 'lost-update'
  | 'lost-append'
  | 'incompatible-order'
  | 'duplicate-append'
  | 'duplicate-elements'
  | 'garbage-read'
  | 'stale-read'
  | 'future-read'
  | 'internal';

export interface Anomaly {
  readonly type: AnomalyType;
  readonly message: string;
  /** Ids of the transactions involved. */
  readonly ops: readonly number[];
  /** For cycle anomalies: the dependency edges, closing back on the first transaction. */
  readonly cycle?: readonly CycleStep[];
}

export interface CheckOptions {
  /**
   * Anomalies reported as information instead of failures. Default ['G2-item',
   * 'G2-item-realtime']: write skew is allowed under snapshot isolation. Pass [] to check
   * (strict) serializability.
   */
  readonly allowed?: readonly AnomalyType[];
  /**
   * The history's last op is a read of every key made after all the others ended (their
   * locks resolved). Then each key's list there must hold every read of it as a prefix
   * (nothing a committed transaction saw may vanish), every append of an ok transaction,
   * and every append of an info transaction any of whose appends a committed read saw (it
   * committed); else lost-append.
   */
  readonly finalRead?: boolean;
}

export interface CheckResult {
  /** True when no anomaly outside `allowed` was found. */
  readonly valid: boolean;
  readonly anomalies: readonly Anomaly[];
  /** Allowed anomalies found (G2-item by default). */
  readonly allowed: readonly Anomaly[];
  readonly counts: { readonly ok: number; readonly fail: number; readonly info: number };
  readonly graph: { readonly nodes: number; readonly edges: number; readonly components: number };
}

/**
 * Where the ops carry timestamps: a committed read at snapshot S (its transaction's
 * startTs) must hold every append of a committed transaction whose commitTs is below S
 * (stale-read if one is missing) and none whose commitTs is S or above (future-read): the
 * visibility rule of snapshot isolation. Appends of the reader itself, and of transactions
 * without a commit timestamp (unknown outcomes, clients stopped after their commit point),
 * are not judged here.
 */
function checkTimestamps(
  history: readonly ListAppendOp[],
  ids: readonly number[],
  committed: readonly boolean[],
  writers: Map<string, Map<number, Writer>>,
  report: (a: Anomaly) => void,
): void {
  history.forEach((op, i) => {
    const snapshot = op.startTs;
    if (!committed[i] || snapshot === undefined) return;
    for (const m of op.txn) {
      if (m.f !== 'r' || m.value === null) continue;
      const list = new Set(m.value);
      for (const [value, w] of writers.get(m.key) ?? []) {
        if (w.op === i) continue;
        const writer = history[w.op]!;
        if (writer.type !== 'ok' || writer.commitTs === undefined) continue;
        const visible = writer.commitTs < snapshot;
        if (visible === list.has(value)) continue;
        report({
          type: visible ? 'stale-read' : 'future-read',
          message: visible
            ? `T${ids[i]} read ${JSON.stringify(m.key)} = [${m.value.join(',')}] at snapshot ${snapshot}, without ${value} appended by T${ids[w.op]}, committed at ${writer.commitTs}`
            : `T${ids[i]} read ${JSON.stringify(m.key)} = [${m.value.join(',')}] at snapshot ${snapshot}, with ${value} appended by T${ids[w.op]}, committed at ${writer.commitTs}`,
          ops: [ids[i]!, ids[w.op]!],
        });
      }
    }
  });
}

/** At most this many examples of one anomaly type are kept, so reports stay readable. */
const MAX_EXAMPLES = 8;

interface Writer {
  readonly op: number;
  /** Whether this was the transaction's last append to the key (G1b looks at this). */
  readonly last: boolean;
}

export function checkListAppend(history: readonly ListAppendOp[], options: CheckOptions = {}): CheckResult {
  const allowedTypes = new Set<AnomalyType>(options.allowed ?? ['G2-item', 'G2-item-realtime']);
  const found: Anomaly[] = [];
  const perType = new Map<AnomalyType, number>();
  const report = (anomaly: Anomaly) => {
    const n = perType.get(anomaly.type) ?? 0;
    perType.set(anomaly.type, n + 1);
    if (n < MAX_EXAMPLES) found.push(anomaly);
  };
  const ids = history.map((op, i) => op.id ?? i);

  const writers = indexAppends(history, ids, report);
  const seen = seenByCommitted(history, writers);
  // Whose reads count: committed transactions, an info one once seen committed.
  const committed = history.map((op, i) => op.type === 'ok' || (op.type === 'info' && seen.has(i)));
  checkReadsAgainstWriters(history, ids, committed, writers, report);
  checkInternal(history, ids, committed, report);
  checkTimestamps(history, ids, committed, writers, report);

  const reads = externalReads(history, committed);
  const whole = allReads(history, committed);
  const orders = versionOrders(whole, ids, report);
  checkLostUpdates(ids, reads, orders, report);
  if (options.finalRead && history.length > 0)
    checkFinalRead(history, ids, committed, whole, writers, report);

  const graph = new DependencyGraph();
  history.forEach((op, i) => {
    if (op.type !== 'fail') graph.addNode(i);
  });
  const writerOf = (key: string, value: number) => {
    const w = writers.get(key)?.get(value);
    return w !== undefined && history[w.op]!.type !== 'fail' ? w.op : undefined;
  };
  for (const [key, order] of orders) {
    for (let i = 0; i + 1 < order.length; i++) {
      const a = writerOf(key, order[i]!);
      const b = writerOf(key, order[i + 1]!);
      if (a !== undefined && b !== undefined) graph.addEdge(a, b, { kind: 'ww', key });
    }
  }
  for (const read of reads) {
    const order = orders.get(read.key);
    if (order === undefined || !isPrefix(read.value, order)) continue;
    const last = read.value[read.value.length - 1];
    if (last !== undefined) {
      const w = writerOf(read.key, last);
      if (w !== undefined) graph.addEdge(w, read.op, { kind: 'wr', key: read.key });
    }
    const next = order[read.value.length];
    if (next !== undefined) {
      const w = writerOf(read.key, next);
      if (w !== undefined) graph.addEdge(read.op, w, { kind: 'rw', key: read.key });
    }
  }
  addRealtimeEdges(history, graph);

  const components = stronglyConnectedComponents(graph);
  for (const component of components) {
    for (const anomaly of classifyComponent(graph, component, ids)) report(anomaly);
  }

  const anomalies = found.filter((a) => !allowedTypes.has(a.type));
  const allowed = found.filter((a) => allowedTypes.has(a.type));
  return {
    valid: anomalies.length === 0,
    anomalies,
    allowed,
    counts: {
      ok: history.filter((o) => o.type === 'ok').length,
      fail: history.filter((o) => o.type === 'fail').length,
      info: history.filter((o) => o.type === 'info').length,
    },
    graph: { nodes: graph.nodes().length, edges: graph.edgeCount(), components: components.length },
  };
}

/** A short human summary of a result, for failure messages. */
export function describeCheck(result: CheckResult): string {
  const lines = [
    `${result.valid ? 'valid' : 'INVALID'}: ${result.counts.ok} ok, ${result.counts.fail} failed, ` +
      `${result.counts.info} unknown; graph ${result.graph.nodes} nodes, ${result.graph.edges} edges, ` +
      `${result.graph.components} cyclic components`,
  ];
  for (const a of result.anomalies) lines.push(`  ${a.type}: ${a.message}`);
  const allowedTypes = [...new Set(result.allowed.map((a) => a.type))];
  if (allowedTypes.length > 0) lines.push(`  allowed (information only): ${allowedTypes.join(', ')}`);
  return lines.join('\n');
}

function indexAppends(
  history: readonly ListAppendOp[],
  ids: readonly number[],
  report: (a: Anomaly) => void,
): Map<string, Map<number, Writer>> {
  const writers = new Map<string, Map<number, Writer>>();
  history.forEach((op, i) => {
    const lastIndex = new Map<string, number>();
    op.txn.forEach((m, j) => {
      if (m.f === 'append') lastIndex.set(m.key, j);
    });
    op.txn.forEach((m, j) => {
      if (m.f !== 'append') return;
      let byValue = writers.get(m.key);
      if (byValue === undefined) writers.set(m.key, (byValue = new Map()));
      const previous = byValue.get(m.value);
      if (previous !== undefined) {
        report({
          type: 'duplicate-append',
          message: `value ${m.value} was appended to ${JSON.stringify(m.key)} by T${ids[previous.op]} and T${ids[i]}; values must be unique`,
          ops: [ids[previous.op]!, ids[i]!],
        });
        return;
      }
      byValue.set(m.value, { op: i, last: lastIndex.get(m.key) === j });
    });
  });
  return writers;
}

function checkReadsAgainstWriters(
  history: readonly ListAppendOp[],
  ids: readonly number[],
  committed: readonly boolean[],
  writers: Map<string, Map<number, Writer>>,
  report: (a: Anomaly) => void,
): void {
  history.forEach((op, i) => {
    if (!committed[i]) return;
    for (const m of op.txn) {
      if (m.f !== 'r' || m.value === null) continue;
      const k = JSON.stringify(m.key);
      const seen = new Set<number>();
      for (const v of m.value) {
        if (seen.has(v)) {
          report({
            type: 'duplicate-elements',
            message: `T${ids[i]} read ${k} = [${m.value.join(',')}], which holds ${v} twice`,
            ops: [ids[i]!],
          });
        }
        seen.add(v);
        const w = writers.get(m.key)?.get(v);
        if (w === undefined) {
          report({
            type: 'garbage-read',
            message: `T${ids[i]} read ${v} in ${k}, which no transaction appended`,
            ops: [ids[i]!],
          });
        } else if (history[w.op]!.type === 'fail') {
          report({
            type: 'G1a',
            message: `T${ids[i]} read ${v} in ${k}, appended by T${ids[w.op]}, which failed (aborted read)`,
            ops: [ids[i]!, ids[w.op]!],
          });
        }
      }
      const last = m.value[m.value.length - 1];
      const w = last === undefined ? undefined : writers.get(m.key)?.get(last);
      if (w !== undefined && w.op !== i && !w.last) {
        report({
          type: 'G1b',
          message: `T${ids[i]} read ${k} ending in ${last}, an intermediate append of T${ids[w.op]} (intermediate read)`,
          ops: [ids[i]!, ids[w.op]!],
        });
      }
    }
  });
}

/** A transaction must see its own earlier reads and appends (Elle's "internal" check). */
function checkInternal(
  history: readonly ListAppendOp[],
  ids: readonly number[],
  committed: readonly boolean[],
  report: (a: Anomaly) => void,
): void {
  history.forEach((op, i) => {
    if (!committed[i]) return;
    // Per key: the list we know it must hold (after a read), or the appends made so far.
    const known = new Map<string, number[]>();
    const pending = new Map<string, number[]>();
    for (const m of op.txn) {
      if (m.f === 'append') {
        const list = known.get(m.key);
        if (list !== undefined) list.push(m.value);
        else pending.set(m.key, [...(pending.get(m.key) ?? []), m.value]);
        continue;
      }
      if (m.value === null) continue;
      const expected = known.get(m.key);
      const own = pending.get(m.key) ?? [];
      const bad =
        expected !== undefined
          ? !sameList(expected, m.value)
          : !sameList(m.value.slice(m.value.length - own.length), own) || m.value.length < own.length;
      if (bad) {
        report({
          type: 'internal',
          message:
            `T${ids[i]} read ${JSON.stringify(m.key)} = [${m.value.join(',')}] but its own earlier ` +
            `operations imply ${expected !== undefined ? `[${expected.join(',')}]` : `a list ending in [${own.join(',')}]`}`,
          ops: [ids[i]!],
        });
      }
      known.set(m.key, [...m.value]);
      pending.delete(m.key);
    }
  });
}

interface ExternalRead {
  readonly op: number;
  readonly key: string;
  /** The list as committed by others: the transaction's own appends stripped. */
  readonly value: readonly number[];
  /** Whether the transaction also appended to this key. */
  readonly appended: boolean;
}

/** The first read of each key in each committed transaction, minus its own appends. */
function externalReads(history: readonly ListAppendOp[], committed: readonly boolean[]): ExternalRead[] {
  const reads: ExternalRead[] = [];
  history.forEach((op, i) => {
    if (!committed[i]) return;
    const ownAppends = new Map<string, number>();
    const done = new Set<string>();
    const appendedKeys = new Set(op.txn.filter((m) => m.f === 'append').map((m) => m.key));
    for (const m of op.txn) {
      if (m.f === 'append') {
        ownAppends.set(m.key, (ownAppends.get(m.key) ?? 0) + 1);
        continue;
      }
      if (m.value === null || done.has(m.key)) continue;
      done.add(m.key);
      const own = ownAppends.get(m.key) ?? 0;
      reads.push({
        op: i,
        key: m.key,
        value: m.value.slice(0, Math.max(0, m.value.length - own)),
        appended: appendedKeys.has(m.key),
      });
    }
  });
  return reads;
}

/**
 * Every read of each committed transaction, whole: with the transaction's own appends at
 * the end, and later reads too. They place its appends in the version order (as Elle
 * does), so a read that missed them gets its rw edge to it.
 */
function allReads(
  history: readonly ListAppendOp[],
  committed: readonly boolean[],
): { op: number; key: string; value: readonly number[] }[] {
  const reads: { op: number; key: string; value: readonly number[] }[] = [];
  history.forEach((op, i) => {
    if (!committed[i]) return;
    for (const m of op.txn)
      if (m.f === 'r' && m.value !== null) reads.push({ op: i, key: m.key, value: m.value });
  });
  return reads;
}

/** Per key, the longest read; every other read must be a prefix of it. */
function versionOrders(
  reads: readonly { op: number; key: string; value: readonly number[] }[],
  ids: readonly number[],
  report: (a: Anomaly) => void,
): Map<string, readonly number[]> {
  const longest = new Map<string, (typeof reads)[number]>();
  for (const r of reads) {
    const best = longest.get(r.key);
    if (best === undefined || r.value.length > best.value.length) longest.set(r.key, r);
  }
  const orders = new Map<string, readonly number[]>();
  for (const [key, best] of longest) orders.set(key, best.value);
  for (const r of reads) {
    const best = longest.get(r.key)!;
    if (!isPrefix(r.value, best.value)) {
      report({
        type: 'incompatible-order',
        message:
          `T${ids[r.op]} read ${JSON.stringify(r.key)} = [${r.value.join(',')}], which is not a prefix of ` +
          `[${best.value.join(',')}] read by T${ids[best.op]}`,
        ops: [ids[r.op]!, ids[best.op]!],
      });
    }
  }
  return orders;
}

/** Transactions one of whose appends an ok transaction (not itself) read: they committed. */
function seenByCommitted(
  history: readonly ListAppendOp[],
  writers: Map<string, Map<number, Writer>>,
): Set<number> {
  const seen = new Set<number>();
  const okReads = allReads(
    history,
    history.map((op) => op.type === 'ok'),
  );
  for (const r of okReads) {
    for (const v of r.value) {
      const w = writers.get(r.key)?.get(v);
      if (w !== undefined && w.op !== r.op) seen.add(w.op);
    }
  }
  return seen;
}

/** What `finalRead` asks: the last op's lists keep everything committed (see CheckOptions). */
function checkFinalRead(
  history: readonly ListAppendOp[],
  ids: readonly number[],
  committed: readonly boolean[],
  /** allReads of the committed transactions. */
  reads: readonly { op: number; key: string; value: readonly number[] }[],
  writers: Map<string, Map<number, Writer>>,
  report: (a: Anomaly) => void,
): void {
  const last = history.length - 1;
  const final = new Map<string, readonly number[]>();
  for (const m of history[last]!.txn) if (m.f === 'r' && m.value !== null) final.set(m.key, m.value);
  const finalSets = new Map([...final].map(([key, list]) => [key, new Set(list)]));
  const inFinal = (key: string, value: number) => finalSets.get(key)?.has(value) ?? false;
  const lost = (op: number, key: string, value: number, why: string) =>
    report({
      type: 'lost-append',
      message: `${value} appended to ${JSON.stringify(key)} by T${ids[op]} (${why}) is missing from the final read [${(final.get(key) ?? []).join(',')}] (T${ids[last]})`,
      ops: [ids[op]!, ids[last]!],
    });
  for (const { op: i, key, value } of reads) {
    if (i === last) continue;
    // A read that is no prefix of the final one but holds only values still there
    // disagrees on the order: versionOrders reports it (the final read is the longest,
    // or the longest has a value the final one lost). Its own appends are checked below.
    const missing = value.find((v) => !inFinal(key, v) && writers.get(key)?.get(v)?.op !== i);
    if (missing !== undefined) {
      report({
        type: 'lost-append',
        message: `T${ids[i]} read ${JSON.stringify(key)} = [${value.join(',')}], but ${missing} is missing from the final read [${(final.get(key) ?? []).join(',')}] (T${ids[last]})`,
        ops: [ids[i]!, ids[last]!],
      });
    }
  }
  history.forEach((op, i) => {
    if (!committed[i] || i === last) return;
    const why = op.type === 'ok' ? 'committed' : 'unknown outcome, but read by a committed transaction';
    for (const m of op.txn) if (m.f === 'append' && !inFinal(m.key, m.value)) lost(i, m.key, m.value, why);
  });
}

/** Two committed transactions that read the same version of a key and both appended to it. */
function checkLostUpdates(
  ids: readonly number[],
  reads: readonly ExternalRead[],
  orders: Map<string, readonly number[]>,
  report: (a: Anomaly) => void,
): void {
  const groups = new Map<string, number[]>();
  for (const r of reads) {
    if (!r.appended) continue;
    const order = orders.get(r.key);
    if (order === undefined || !isPrefix(r.value, order)) continue;
    const id = `${r.key}\u0000${r.value.length}`;
    groups.set(id, [...(groups.get(id) ?? []), r.op]);
  }
  for (const [id, ops] of groups) {
    if (ops.length < 2) continue;
    const [key, length] = id.split('\u0000') as [string, string];
    report({
      type: 'lost-update',
      message:
        `${ops.map((o) => `T${ids[o]}`).join(', ')} all read version ${length} of ${JSON.stringify(key)} ` +
        `and all committed appends to it`,
      ops: ops.map((o) => ids[o]!),
    });
  }
}

const WW: ReadonlySet<EdgeKind> = new Set(['ww']);
const WW_WR: ReadonlySet<EdgeKind> = new Set(['ww', 'wr']);
const RW: ReadonlySet<EdgeKind> = new Set(['rw']);
const ANY: ReadonlySet<EdgeKind> = new Set(['ww', 'wr', 'rw']);

const WW_WR_RT: ReadonlySet<EdgeKind> = new Set(['ww', 'wr', 'rt']);
const ANY_RT: ReadonlySet<EdgeKind> = new Set(['ww', 'wr', 'rw', 'rt']);

/**
 * Real-time edges: T1 -> T2 when T1 committed (ok) and completed before T2 was invoked.
 * Only a transitive reduction is added (Elle's frontier): T2 gets edges from the ok
 * transactions completed before its invoke that no other such one follows, so the edges
 * stay about (concurrency x transactions). An info transaction imposes no edge (it may
 * have committed any time later), but can receive one.
 */
function addRealtimeEdges(history: readonly ListAppendOp[], graph: DependencyGraph): void {
  // [time, 0 invoke | 1 complete, op]; at equal times invokes go first (no edge).
  const events: [number, number, number][] = [];
  history.forEach((op, i) => {
    if (op.type === 'fail' || op.invoke === undefined) return;
    events.push([op.invoke, 0, i]);
    if (op.type === 'ok' && op.complete !== undefined) events.push([op.complete, 1, i]);
  });
  events.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  const frontier = new Set<number>();
  const before = new Map<number, number[]>();
  for (const [, kind, op] of events) {
    if (kind === 0) {
      const predecessors = [...frontier];
      before.set(op, predecessors);
      for (const p of predecessors) graph.addEdge(p, op, { kind: 'rt', key: '' });
    } else {
      // Whatever completed before this one began is now implied through it.
      for (const p of before.get(op) ?? []) frontier.delete(p);
      frontier.add(op);
    }
  }
}

/**
 * Looks for the worst cycle in one strongly connected component: G0 (ww only), then G1c
 * (ww and wr), then G-single (exactly one rw), then G-nonadjacent, and reports a G2-item
 * cycle (write skew: two adjacent rw edges somewhere) only when none
 * of those exists. Then, if nothing but write skew was found, the same with rt edges
 * counted as wr edges (the -realtime anomalies).
 */
function classifyComponent(graph: DependencyGraph, component: readonly number[], ids: readonly number[]) {
  const anomalies = classifyCycles(graph, component, ids, false);
  if (anomalies.every((a) => a.type === 'G2-item')) {
    const realtime = classifyCycles(graph, component, ids, true);
    const worse = realtime.filter((a) => a.type !== 'G2-item-realtime');
    if (worse.length > 0) return [...anomalies, ...worse];
    if (anomalies.length === 0) return realtime;
  }
  return anomalies;
}

function classifyCycles(
  graph: DependencyGraph,
  component: readonly number[],
  ids: readonly number[],
  realtime: boolean,
): Anomaly[] {
  const scope = new Set(component);
  const name = (i: number) => `T${ids[i]}`;
  const anomalies: Anomaly[] = [];
  const flow = realtime ? WW_WR_RT : WW_WR;
  const any = realtime ? ANY_RT : ANY;
  const preference: EdgeKind[] = realtime ? ['ww', 'wr', 'rt', 'rw'] : ['ww', 'wr', 'rw'];
  const describeCycle = (steps: readonly CycleStep[]) =>
    steps
      .map((s) => `${name(s.from)} -${s.kind === 'rt' ? 'rt' : `${s.kind}(${JSON.stringify(s.key)})`}->`)
      .join(' ') + ` ${name(steps[0]!.from)}`;
  const make = (type: AnomalyType, what: string, steps: CycleStep[]): Anomaly => ({
    type: realtime ? (`${type}-realtime` as AnomalyType) : type,
    message: `${what}${realtime ? ' (with real-time order)' : ''}: ${describeCycle(steps)}`,
    ops: steps.map((s) => ids[s.from]!),
    cycle: steps.map((s) => ({ ...s, from: ids[s.from]!, to: ids[s.to]! })),
  });

  // An rt edge is never part of a write cycle: G0 is searched without it.
  const g0 = realtime ? undefined : cycleIn(graph, scope, WW, () => true);
  if (g0 !== undefined) anomalies.push(make('G0', 'write cycle', labelCycle(graph, g0, ['ww'])));

  // G1c: a cycle of ww/wr edges with at least one wr edge (or rt, counted as one).
  const g1c = cycleIn(graph, scope, flow, (from, to) =>
    graph.labels(from, to).some((l) => l.kind === 'wr' || (realtime && l.kind === 'rt')),
  );
  if (g1c !== undefined) {
    anomalies.push(
      make(
        'G1c',
        'circular information flow',
        labelCycle(graph, g1c, realtime ? ['wr', 'rt', 'ww'] : ['wr', 'ww']),
      ),
    );
  }

  // G-single: one rw edge a -> b closed by a path of ww/wr edges b ~> a.
  let single: CycleStep[] | undefined;
  for (const a of component) {
    for (const b of graph.successors(a, RW)) {
      if (!scope.has(b)) continue;
      const back = shortestPath(graph, b, a, flow, scope);
      if (back === undefined) continue;
      const rw = graph.labels(a, b).find((l) => l.kind === 'rw')!;
      single = [{ from: a, to: b, kind: 'rw', key: rw.key }, ...labelCycle(graph, back, preference)];
      break;
    }
    if (single !== undefined) break;
  }
  if (single !== undefined) anomalies.push(make('G-single', 'read skew (one anti-dependency)', single));

  // G-nonadjacent: two or more rw edges, no two of them adjacent. Snapshot isolation
  // forbids it too (every SI cycle has two consecutive anti-dependencies).
  if (single === undefined) {
    const nonadjacent = nonadjacentCycle(graph, component, scope, any);
    if (nonadjacent !== undefined) {
      anomalies.push(make('G-nonadjacent', 'anti-dependencies that are never adjacent', nonadjacent));
    }
  }

  if (anomalies.length === 0) {
    const cycle = cycleIn(graph, scope, any, () => true);
    if (cycle !== undefined) {
      const steps = labelCycle(graph, cycle, preference);
      anomalies.push(make('G2-item', 'write skew (two or more anti-dependencies)', steps));
    }
  }
  return anomalies;
}

/**
 * A cycle that starts with an rw edge a -> b and returns to a without ever taking two rw
 * edges in a row, and whose last edge is not rw (it is followed by a -> b). Breadth-first
 * over (node, whether the edge into it was rw).
 */
function nonadjacentCycle(
  graph: DependencyGraph,
  component: readonly number[],
  scope: ReadonlySet<number>,
  any: ReadonlySet<EdgeKind>,
): CycleStep[] | undefined {
  for (const a of component) {
    for (const b of graph.successors(a, RW)) {
      if (!scope.has(b)) continue;
      const id = (node: number, rw: boolean) => `${node}:${rw ? 1 : 0}`;
      const parent = new Map<string, { from: string; step: CycleStep }>();
      const start = id(b, true);
      const seen = new Set([start]);
      let frontier: [number, boolean][] = [[b, true]];
      let goal: string | undefined;
      search: while (frontier.length > 0) {
        const next: [number, boolean][] = [];
        for (const [node, lastRw] of frontier) {
          for (const to of graph.successors(node, any)) {
            if (!scope.has(to)) continue;
            const labels = graph.labels(node, to).filter((l) => any.has(l.kind));
            const plain = labels.find((l) => l.kind !== 'rw');
            const rw = labels.find((l) => l.kind === 'rw');
            for (const [label, isRw] of [
              [plain, false],
              [lastRw ? undefined : rw, true],
            ] as const) {
              if (label === undefined) continue;
              const state = id(to, isRw);
              if (seen.has(state)) continue;
              seen.add(state);
              parent.set(state, {
                from: id(node, lastRw),
                step: { from: node, to, kind: label.kind, key: label.key },
              });
              if (to === a && !isRw) {
                goal = state;
                break search;
              }
              next.push([to, isRw]);
            }
          }
        }
        frontier = next;
      }
      if (goal === undefined) continue;
      const steps: CycleStep[] = [];
      for (let state = goal; state !== start; state = parent.get(state)!.from)
        steps.push(parent.get(state)!.step);
      const first = graph.labels(a, b).find((l) => l.kind === 'rw')!;
      return [{ from: a, to: b, kind: 'rw', key: first.key }, ...steps.reverse()];
    }
  }
  return undefined;
}

/**
 * A short cycle inside `scope` over the allowed edge kinds that contains an edge accepted
 * by `mustUse`; returned as a closed node path (first node repeated at the end).
 */
function cycleIn(
  graph: DependencyGraph,
  scope: ReadonlySet<number>,
  allowed: ReadonlySet<EdgeKind>,
  mustUse: (from: number, to: number) => boolean,
): number[] | undefined {
  // Only nodes in a cyclic component of the restricted graph can be on such a cycle.
  for (const component of stronglyConnectedComponents(graph, allowed, scope)) {
    const inner = new Set(component);
    for (const from of component) {
      for (const to of graph.successors(from, allowed)) {
        if (!inner.has(to) || !mustUse(from, to)) continue;
        const back = shortestPath(graph, to, from, allowed, inner);
        if (back !== undefined) return [from, ...back];
      }
    }
  }
  return undefined;
}

function isPrefix(prefix: readonly number[], list: readonly number[]): boolean {
  if (prefix.length > list.length) return false;
  for (let i = 0; i < prefix.length; i++) if (prefix[i] !== list[i]) return false;
  return true;
}

function sameList(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && isPrefix(a, b);
}
