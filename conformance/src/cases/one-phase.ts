/**
 * One-phase commits of several rows (docs/protocol.md 4.5), on stores that declare
 * `stampedCheckAndSetMany`: the store method itself (one drawn value on every row, all or
 * nothing), and the commits built on it: a lost reply settled by the re-read and never a
 * second write, a call lost before the store sent again, a reader whose start timestamp
 * lands between the stamp and the reply seeing every row, and a client that dies in that
 * window leaving every row or none. The list-append history runs (history.ts) mix
 * one-step and two-phase clients under faults.
 */
import {
  type CasRequest,
  CommitUnknownError,
  ConflictError,
  inspectHeadRow,
  type Percolator,
  type RowStore,
  STAMP_OFFSET,
  type StampedManyResult,
  StoreError,
  type Transaction,
} from '@percolator/core';
import { type DrawThenRead, drawThenReadMany, type StampedWrite, stampedRace } from '../stamped-race.js';
import type { CaseContext, ConformanceCase } from '../types.js';
import { bytes, check, checkEqual, errorText, rejection } from '../util.js';
import { client } from './harness.js';

const TABLE = 'p_onestep';
const OTHER = 'p_onestep_2';
const COUNTER = 'conformance.onestep';

type StampedRequest = CasRequest & { readonly state: Uint8Array };

/** A state with its stamp slot zeroed and `text` after it. */
function stampable(text: string): Uint8Array {
  const body = bytes(text);
  const state = new Uint8Array(STAMP_OFFSET + 8 + body.length);
  state.set(body, STAMP_OFFSET + 8);
  return state;
}

function stampOf(state: Uint8Array): number {
  return Number(new DataView(state.buffer, state.byteOffset, state.byteLength).getBigUint64(STAMP_OFFSET));
}

function textAfterStamp(state: Uint8Array): string {
  return new TextDecoder().decode(state.subarray(STAMP_OFFSET + 8));
}

/** The raw method: one drawn value on every row, all or nothing. */
async function storeMethod(ctx: CaseContext): Promise<void> {
  const store = await ctx.createStore();
  const many = store.checkAndSetStampedMany?.bind(store);
  check(many !== undefined, 'stampedCheckAndSetMany is declared but checkAndSetStampedMany is missing');
  // Creates in an order that is not the key order, over two tables.
  const refs: [string, string][] = [
    [TABLE, 'z'],
    [OTHER, 'a'],
    [TABLE, 'b'],
  ];
  const create = await many(
    refs.map(([table, key]) => ({ table, key, expected: null, state: stampable(`one ${key}`) })),
    COUNTER,
  );
  check(create.ok, 'three creates of absent rows were refused');
  checkEqual(create.versions.length, 3, 'versions in the reply');
  const after = await store.incrementCounter!(COUNTER, 1);
  check(after > create.timestamp, `a later draw (${after}) is not above the stamp ${create.timestamp}`);
  const rows = await Promise.all(refs.map(([table, key]) => store.read(table, key)));
  for (const [i, row] of rows.entries()) {
    check(row !== null, `row ${refs[i]!.join('/')} is missing after the step`);
    checkEqual(row.version, create.versions[i], `version of ${refs[i]!.join('/')} (reply in request order)`);
    checkEqual(stampOf(row.state), create.timestamp, `stamp of ${refs[i]!.join('/')}`);
    checkEqual(textAfterStamp(row.state), `one ${refs[i]![1]}`, `state of ${refs[i]!.join('/')}`);
  }
  // One stale version among three: nothing is written.
  const stale: StampedRequest[] = refs.map(([table, key], i) => ({
    table,
    key,
    expected: i === 1 ? 'not-a-version-this-store-made' : rows[i]!.version,
    state: stampable(`two ${key}`),
  }));
  const refused = await many(stale, COUNTER);
  check(!refused.ok, 'a step with one stale version was applied');
  const unchanged = await Promise.all(refs.map(([table, key]) => store.read(table, key)));
  for (const [i, row] of unchanged.entries()) {
    checkEqual(row?.version, rows[i]!.version, `version of ${refs[i]!.join('/')} after a refused step`);
  }
  if (refused.current !== undefined) {
    checkEqual(refused.current.length, 3, 'current rows in a refusal');
    for (const [i, row] of refused.current.entries()) {
      if (row !== undefined) checkEqual(row?.version, rows[i]!.version, `current row ${i} in a refusal`);
    }
  }
  // A create of a present row, beside an update that matches: neither is written.
  const mixed = await many(
    [
      { table: TABLE, key: 'new', expected: null, state: stampable('three new') },
      { table: TABLE, key: 'b', expected: null, state: stampable('three b') },
      { table: TABLE, key: 'z', expected: rows[0]!.version, state: stampable('three z') },
    ],
    COUNTER,
  );
  check(!mixed.ok, 'a create of a present row was applied');
  checkEqual(await store.read(TABLE, 'new'), null, 'the create beside a refused one');
  checkEqual((await store.read(TABLE, 'z'))?.version, rows[0]!.version, 'the update beside a refused one');
  // And the matching step applies, all of it, with a value above every earlier one.
  const update = await many(
    refs.map(([table, key], i) => ({
      table,
      key,
      expected: rows[i]!.version,
      state: stampable(`four ${key}`),
    })),
    COUNTER,
  );
  check(update.ok, 'a matching update of three rows was refused');
  check(update.timestamp > after, `the stamp ${update.timestamp} is not above an earlier draw ${after}`);
  for (const [table, key] of refs) {
    const row = await store.read(table, key);
    checkEqual(row && textAfterStamp(row.state), `four ${key}`, `state of ${table}/${key}`);
    checkEqual(row && stampOf(row.state), update.timestamp, `stamp of ${table}/${key}`);
  }

  // Under a race (found missing in review: each call above ran alone). First, one-row
  // steps against readers that draw (or peek) and then read: a step that drew its value and
  // wrote its rows in two moves lets a reader above the stamp miss the write.
  const raced = await ctx.createStore();
  const one: StampedWrite = async (request, counter) => {
    const r = await raced.checkAndSetStampedMany!([request], counter);
    return r.ok ? { ok: true, version: r.versions[0]!, timestamp: r.timestamp } : { ok: false };
  };
  const readers: [string, DrawThenRead, boolean][] = [];
  if (raced.capabilities.stampedRead && raced.readStamped)
    readers.push(['readStamped', raced.readStamped.bind(raced), false]);
  else if (raced.capabilities.atomicCounter && raced.incrementCounter)
    readers.push(['a draw, then reads', drawThenReadMany(raced), false]);
  if (raced.capabilities.peekedRead && raced.readPeeked)
    readers.push(['readPeeked', raced.readPeeked.bind(raced), true]);
  check(readers.length > 0, 'checkAndSetStampedMany needs a counter that readers can draw from or peek at');
  for (const [i, [what, read, peeked]] of readers.entries()) {
    const result = await stampedRace({
      write: one,
      read,
      rows: ctx.scaled(40, 10),
      table: `many_race_${i}`,
      counter: `race.many.${i}`,
      peeked,
    });
    checkEqual(
      result.violations.slice(0, 5),
      [],
      `${what}: reads above a stamp that missed the stamped write`,
    );
    checkEqual(result.repeatedValues, 0, `${what}: counter values handed out twice`);
    check(result.readsDuringWrites > 0, `${what}: no read raced the writes: the race checked nothing`);
  }
  // Then steps over the same two rows at once, named in both orders, each expecting the
  // versions it read: a step is all or nothing, so whatever won, both rows hold the same
  // winner's state and stamp (a step that checked both and then wrote each row with its
  // own CAS lets two steps each win one row).
  const pair: [string, string][] = [
    [TABLE, 'race-a'],
    [OTHER, 'race-b'],
  ];
  await many(
    pair.map(([table, key]) => ({ table, key, expected: null, state: stampable('start') })),
    COUNTER,
  );
  let won = 0;
  for (let round = 0; round < ctx.scaled(20, 5); round++) {
    const seen = await Promise.all(pair.map(([table, key]) => store.read(table, key)));
    const steps = await Promise.all(
      Array.from({ length: 6 }, (_, w) => {
        const order = w % 2 === 0 ? [0, 1] : [1, 0];
        return many(
          order.map((i) => ({
            table: pair[i]![0],
            key: pair[i]![1],
            expected: seen[i]!.version,
            state: stampable(`round ${round} writer ${w}`),
          })),
          COUNTER,
        );
      }),
    );
    const winners = steps.filter((r) => r.ok).length;
    check(winners <= 1, `round ${round}: ${winners} steps expecting the same versions all applied`);
    won += winners;
    const now = await Promise.all(pair.map(([table, key]) => store.read(table, key)));
    checkEqual(
      textAfterStamp(now[0]!.state),
      textAfterStamp(now[1]!.state),
      `round ${round}: the two rows hold different steps' states`,
    );
    checkEqual(stampOf(now[0]!.state), stampOf(now[1]!.state), `round ${round}: the two rows' stamps`);
  }
  check(won > 0, 'no racing step ever applied: the race checked nothing');
}

/** Both cells of rows a and b (one transaction writes both), as one snapshot reads them. */
async function readPair(tx: Transaction): Promise<(string | undefined)[]> {
  return [await tx.getString(TABLE, 'a', 'v'), await tx.getString(OTHER, 'b', 'v')];
}

/** A write of both rows after reading one, so it has a start timestamp of its own. */
async function writePair(tx: Transaction, value: string): Promise<void> {
  await tx.getString(TABLE, 'a', 'v');
  tx.set(TABLE, 'a', 'v', value);
  tx.set(OTHER, 'b', 'v', value);
}

/** The records of `startTs` on (table, key), column v. */
async function recordsOf(store: RowStore, table: string, key: string, startTs: number): Promise<number> {
  const row = await store.read(table, key);
  const cell = row ? inspectHeadRow(row.state).cells.find((c) => c.column === 'v') : undefined;
  return cell?.writes.filter((w) => w.startTs === startTs).length ?? 0;
}

/** Lost replies and lost requests of the one step. */
async function lostReplies(ctx: CaseContext): Promise<void> {
  const store = await ctx.createStore();
  // Records followed by the start timestamp, a lost reply settled by a re-read: a drawn
  // snapshot (a peeked one's commit is named by the store's draw, below).
  const { db, faulty } = client(ctx, store, { wrap: true, peekedWrites: false });
  const reader = client(ctx, store).db;
  let steps = 0;
  faulty!.onCall((call) => {
    if (call.operation === 'checkAndSetStampedMany') steps++;
  });
  await db.transact((tx) => writePair(tx, 'v0'));
  check(steps === 1, `a two-row transaction made ${steps} one-step calls, not 1`);
  // Applied, then reported failed: the re-read finds the records, and nothing is sent again.
  faulty!.failAfter(undefined, 'checkAndSetStampedMany');
  let tx!: Transaction;
  await db.transact(async (t) => {
    tx = t;
    await writePair(t, 'v1');
  });
  checkEqual(steps, 2, 'one-step calls after a lost reply (settled by the re-read)');
  for (const [table, key] of [
    [TABLE, 'a'],
    [OTHER, 'b'],
  ] as const) {
    checkEqual(await recordsOf(store, table, key, tx.startTs), 1, `records of the settled commit on ${key}`);
  }
  checkEqual(await reader.transact(readPair), ['v1', 'v1'], 'after a lost reply');
  // Failed before reaching the store (certain, or unknown in the faulty mode): sent again.
  faulty!.inject({ kind: 'before', operation: 'checkAndSetStampedMany', times: 2 });
  await db.transact((t) => writePair(t, 'v2'));
  checkEqual(steps, 5, 'one-step calls after two lost requests');
  checkEqual(await reader.transact(readPair), ['v2', 'v2'], 'after lost requests');
  // A blind write (no start timestamp of its own) whose reply is lost: unknown, never resent.
  faulty!.failAfter(undefined, 'checkAndSetStampedMany');
  const blind = await rejection(
    () =>
      db.transact(async (t) => {
        t.set(TABLE, 'a', 'v', 'v3');
        t.set(OTHER, 'b', 'v', 'v3');
      }),
    'a blind two-row write whose reply was lost',
  );
  check(blind instanceof CommitUnknownError, () => `a blind write's lost reply: got ${errorText(blind)}`);
  checkEqual(steps, 6, 'one-step calls after a blind write with a lost reply (never sent twice)');
  checkEqual(await reader.transact(readPair), ['v3', 'v3'], 'after a blind write whose reply was lost');
  if (store.capabilities.peekedRead !== true) return;
  // A peeked snapshot's commit (docs/protocol.md 4.10): its rows carry only the value the
  // store drew, so a lost reply is unknown, as a blind write's, and never sent again.
  const peeked = client(ctx, store, { wrap: true, peekedWrites: true });
  let peekedSteps = 0;
  peeked.faulty!.onCall((call) => {
    if (call.operation === 'checkAndSetStampedMany') peekedSteps++;
  });
  peeked.faulty!.failAfter(undefined, 'checkAndSetStampedMany');
  const lost = await rejection(
    () => peeked.db.transact((t) => writePair(t, 'v4')),
    'a two-row write of a peeked snapshot whose reply was lost',
  );
  check(lost instanceof CommitUnknownError, () => `a peeked snapshot's lost reply: got ${errorText(lost)}`);
  checkEqual(peekedSteps, 1, "one-step calls after a peeked snapshot's lost reply (never sent twice)");
  checkEqual(await reader.transact(readPair), ['v4', 'v4'], "after a peeked snapshot's lost reply");
  await peeked.db.transact((t) => writePair(t, 'v5'));
  checkEqual(await reader.transact(readPair), ['v5', 'v5'], 'after a peeked snapshot commits');
  // Still on its way when the client gave up on it ('late', it lands when let): the re-read
  // finds the rows as the step expected them, the fence (one plain CAS of a row to itself)
  // makes sure it never lands, and the commit goes again (docs/protocol.md 4.11). A blind
  // write (a drawn client's) is fenced the same way.
  let fences = 0;
  for (const c of [peeked.faulty!, faulty!]) {
    c.onCall((call) => {
      if (call.operation === 'checkAndSet') fences++;
    });
  }
  const lateSteps = [peekedSteps, steps];
  let land!: () => void;
  const landing = new Promise<void>((resolve) => {
    land = resolve;
  });
  peeked.faulty!.inject({ kind: 'late', operation: 'checkAndSetStampedMany', until: landing });
  await peeked.db.transact((t) => writePair(t, 'v6'));
  checkEqual(await reader.transact(readPair), ['v6', 'v6'], 'after a peeked step that is still on its way');
  // The blind write's expected versions are the client's last sight of its rows: fresh.
  checkEqual(await db.transact(readPair), ['v6', 'v6'], 'the blind writer reads the rows');
  faulty!.inject({ kind: 'late', operation: 'checkAndSetStampedMany', until: landing });
  await db.transact(async (t) => {
    t.set(TABLE, 'a', 'v', 'v7');
    t.set(OTHER, 'b', 'v', 'v7');
  });
  checkEqual(await reader.transact(readPair), ['v7', 'v7'], 'after a blind step that is still on its way');
  checkEqual(
    [peekedSteps - lateSteps[0]!, steps - lateSteps[1]!, fences],
    [2, 2, 2],
    'one-step calls (the late one and the one sent again) and fences, peeked and blind',
  );
  // A step that only creates rows (both keys new): the fence creates one of them with no
  // values (a head row that reads as absent), so the late create can never land either.
  const createsBefore = [steps, fences];
  faulty!.inject({ kind: 'late', operation: 'checkAndSetStampedMany', until: landing });
  await db.transact(async (t) => {
    t.set(TABLE, 'created-a', 'v', 'c1');
    t.set(OTHER, 'created-b', 'v', 'c1');
  });
  const readCreated = (t: Transaction) =>
    Promise.all([t.getString(TABLE, 'created-a', 'v'), t.getString(OTHER, 'created-b', 'v')]);
  checkEqual(await reader.transact(readCreated), ['c1', 'c1'], 'after a create-only step still on its way');
  checkEqual(
    [steps - createsBefore[0]!, fences - createsBefore[1]!],
    [2, 1],
    'one-step calls (the late one and the one sent again) and fences of a create-only step',
  );
  // The late steps land now: refused, as their rows moved under the fences (or, for the
  // creates, came to be).
  land();
  await Promise.all([peeked.faulty!.settle(), faulty!.settle()]);
  checkEqual(
    peeked.faulty!.stats.writesLate + faulty!.stats.writesLate,
    0,
    'late steps that wrote when they landed',
  );
  checkEqual(await reader.transact(readPair), ['v7', 'v7'], 'after the late steps landed');
  checkEqual(
    await reader.transact(readCreated),
    ['c1', 'c1'],
    'the created rows after the late steps landed',
  );
}

/**
 * A view of `inner` whose next `checkAndSetStampedMany` reaches the store and is applied,
 * but whose reply waits until `release` (and then, with `lose`, fails as unknown).
 */
function replyHeld(inner: RowStore) {
  let open!: () => void;
  const gate = new Promise<void>((resolve) => {
    open = resolve;
  });
  let onApplied!: (result: StampedManyResult) => void;
  const applied = new Promise<StampedManyResult>((resolve) => {
    onApplied = resolve;
  });
  let armed = true;
  let lose = false;
  const many = inner.checkAndSetStampedMany!.bind(inner);
  const store = new Proxy(inner, {
    get(target, property) {
      if (property === 'checkAndSetStampedMany') {
        return async (requests: readonly StampedRequest[], counter: string) => {
          const result = await many(requests, counter);
          if (!armed) return result;
          armed = false;
          onApplied(result);
          await gate;
          if (lose) throw new StoreError('injected: the reply was lost after the step applied', 'unknown');
          return result;
        };
      }
      const value = Reflect.get(target, property, target);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
  return {
    store,
    applied,
    release: (options: { lose?: boolean } = {}) => {
      lose = options.lose ?? false;
      open();
    },
  };
}

/**
 * Rows a and b written 'old', then a client (through a FaultyStore over `replyHeld`)
 * committing 'new' to both, whose one-step commit's reply is held; and a reader.
 */
async function commitHeld(ctx: CaseContext) {
  const store = await ctx.createStore();
  const setup = client(ctx, store).db;
  await setup.transact((tx) => writePair(tx, 'old'));
  await setup.flush();
  const held = replyHeld(store);
  ctx.defer(() => held.release());
  const { db: writer, faulty } = client(ctx, held.store, { wrap: true });
  const reader = client(ctx, store).db;
  const tx = await writer.begin();
  await writePair(tx, 'new');
  return { held, reader, faulty: faulty!, committing: tx.commit() };
}

/** A reader whose start timestamp lands after the stamp, before the reply, sees every row. */
async function readerInTheWindow(ctx: CaseContext): Promise<void> {
  const { held, reader, committing } = await commitHeld(ctx);
  const result = await held.applied;
  check(result.ok, 'the held one-step commit was not applied');
  // Both a read-write snapshot (drawn) and a read-only one (peeked where the store can).
  const drawn = await reader.begin();
  check(drawn.startTs > result.timestamp, `a start timestamp drawn after the stamp is ${drawn.startTs}`);
  checkEqual(await readPair(drawn), ['new', 'new'], 'a snapshot drawn between the stamp and the reply');
  await drawn.rollback();
  checkEqual(
    await reader.transact(readPair, { readOnly: true }),
    ['new', 'new'],
    'a read-only snapshot between the stamp and the reply',
  );
  held.release();
  const { commitTs } = await committing;
  checkEqual(commitTs, result.timestamp, 'the commit timestamp is the stamp');
}

/** A client whose reply is lost and which can read nothing after it: every row or none. */
async function clientDiesInTheWindow(ctx: CaseContext): Promise<void> {
  const { held, reader, faulty, committing } = await commitHeld(ctx);
  const failed = committing.then(
    () => undefined,
    (error: unknown) => error,
  );
  await held.applied;
  // The network goes: every later call of this client fails before the store.
  faulty.hold(() => true).fail();
  held.release({ lose: true });
  const error = await failed;
  check(
    error instanceof CommitUnknownError,
    () => `a lost reply with no way to re-read: got ${errorText(error)}`,
  );
  checkEqual(
    await reader.transact(readPair),
    ['new', 'new'],
    'rows of a commit whose client died after it landed',
  );
}

/**
 * Values a one-step commit moves out of its head rows go in its step (protocol.md 7.1): as
 * the commit returns, their records say `moved` and their version rows are there, stamped
 * by the store like every row of the step, and an older snapshot reads them. Before, the
 * records said `moving` until a tidy pass after the commit.
 */
async function movesRideTheStep(ctx: CaseContext): Promise<void> {
  const store = await ctx.createStore();
  const { db } = client(ctx, store, { gc: { inlineHistoryBytes: 0 } });
  const startOf = async (value: string) => {
    const tx = await db.begin();
    await writePair(tx, value);
    await tx.commit();
    return tx.startTs;
  };
  const firstTs = await startOf('first');
  const old = await db.begin();
  checkEqual(await readPair(old), ['first', 'first'], 'the snapshot before the second commit');
  await startOf('second');
  for (const [table, key] of [
    [TABLE, 'a'],
    [OTHER, 'b'],
  ] as const) {
    const row = await store.read(table, key);
    const cell = row ? inspectHeadRow(row.state).cells.find((c) => c.column === 'v') : undefined;
    const place = cell?.writes.find((w) => w.startTs === firstTs)?.value;
    checkEqual(place, 'moved', `${table}/${key}: the first value's place as the second commit returns`);
  }
  checkEqual(await readPair(old), ['first', 'first'], 'the older snapshot, from the version rows');
  const later = await db.begin();
  checkEqual(await readPair(later), ['second', 'second'], 'a snapshot after the second commit');
  // A one-row transaction: where a step of several rows costs about one row's
  // (stampedManyForOneRow), the value its commit moves out goes in its step too; else the
  // tidy step moves it. Either way an older snapshot reads it.
  const soloTs = await db.begin().then(async (tx) => {
    tx.set(TABLE, 'solo', 'v', 'first');
    await tx.commit();
    return tx.startTs;
  });
  const beforeSolo = await db.begin();
  await db.transact(async (tx) => {
    await tx.getString(TABLE, 'solo', 'v');
    tx.set(TABLE, 'solo', 'v', 'second');
  });
  const solo = await store.read(TABLE, 'solo');
  const soloCell = solo ? inspectHeadRow(solo.state).cells.find((c) => c.column === 'v') : undefined;
  if (store.capabilities.stampedManyForOneRow === true) {
    checkEqual(
      soloCell?.writes.find((w) => w.startTs === soloTs)?.value,
      'moved',
      "a one-row commit: the first value's place as the second commit returns",
    );
  }
  checkEqual(await beforeSolo.getString(TABLE, 'solo', 'v'), 'first', 'the older snapshot of the one row');
}

const SHARED = ['s1', 's2', 's3', 's4'];

/** Per key of SHARED, a transaction that read both its rows and writes them `value key`, ready to commit. */
function pairsReady(db: Percolator, value: string): Promise<Transaction[]> {
  return Promise.all(
    SHARED.map(async (k) => {
      const tx = await db.begin();
      await tx.getString(TABLE, k, 'v');
      await tx.getString(OTHER, k, 'v');
      tx.set(TABLE, k, 'v', `${value} ${k}`);
      tx.set(OTHER, k, 'v', `${value} ${k}`);
      return tx;
    }),
  );
}

/** Both rows of every key of SHARED, as one snapshot reads them, in key order. */
function readShared(tx: Transaction): Promise<(string | undefined)[]> {
  return Promise.all(SHARED.flatMap((k) => [tx.getString(TABLE, k, 'v'), tx.getString(OTHER, k, 'v')]));
}

/** Each transaction of `txs` (one per key of SHARED) has exactly `expected[i]` records on both its rows. */
async function checkRecords(
  store: RowStore,
  txs: readonly Transaction[],
  expected: readonly number[],
  what: string,
) {
  for (const [i, k] of SHARED.entries()) {
    for (const table of [TABLE, OTHER]) {
      checkEqual(
        await recordsOf(store, table, k, txs[i]!.startTs),
        expected[i],
        `${what}: records on ${table}/${k}`,
      );
    }
  }
}

/**
 * Group commit (docs/protocol.md 4.5, "Shared stamped steps"): the one-step commits a
 * client sends in one turn go as one atomic step with one commit timestamp. A transaction
 * whose rows changed fails alone while the others commit; a lost reply of the shared step
 * is settled by each transaction's re-read, and nothing is written twice.
 */
async function sharedSteps(ctx: CaseContext): Promise<void> {
  const store = await ctx.createStore();
  // Each transaction's records followed by its start timestamp: drawn snapshots. One shared
  // call per turn, whatever the store declares: the case counts the steps of a turn.
  const { db, faulty } = client(ctx, store, { wrap: true, peekedWrites: false, sharedCallsInFlight: 1 });
  const other = client(ctx, store).db;
  const reader = client(ctx, store).db;
  let steps = 0;
  faulty!.onCall((call) => {
    if (call.operation === 'checkAndSetStampedMany' || call.operation === 'checkAndSetStamped') steps++;
  });
  const readAll = () => reader.transact(readShared);
  const both = (values: readonly string[]) => values.flatMap((v) => [v, v]);

  // Four commits sent in one turn: one step, one commit timestamp, every row once.
  let txs = await pairsReady(db, 'one');
  steps = 0;
  const results = await Promise.all(txs.map((tx) => tx.commit()));
  checkEqual(steps, 1, 'stamped steps of four one-step commits sent in one turn');
  checkEqual(
    new Set(results.map((r) => r.commitTs)).size,
    1,
    'distinct commit timestamps of one shared step',
  );
  await checkRecords(store, txs, [1, 1, 1, 1], 'a shared step');
  checkEqual(await readAll(), both(SHARED.map((k) => `one ${k}`)), 'rows after a shared step');

  // One of them lost a race: it alone fails; the others commit once.
  txs = await pairsReady(db, 'two');
  await other.transact(async (tx) => tx.set(TABLE, 's1', 'v', 'other'));
  const outcomes = await Promise.allSettled(txs.map((tx) => tx.commit()));
  const lost = outcomes[0]!;
  check(
    lost.status === 'rejected' && lost.reason instanceof ConflictError,
    () =>
      `the transaction whose row changed: ${lost.status === 'rejected' ? errorText(lost.reason) : 'committed'}`,
  );
  for (const [i, o] of outcomes.entries()) {
    if (i > 0)
      check(
        o.status === 'fulfilled',
        () =>
          `transaction ${SHARED[i]} beside the one that lost: ${o.status === 'rejected' ? errorText(o.reason) : ''}`,
      );
  }
  await checkRecords(store, txs, [0, 1, 1, 1], 'a shared step refused for one of its transactions');
  checkEqual(
    await readAll(),
    ['other', 'one s1', 'two s2', 'two s2', 'two s3', 'two s3', 'two s4', 'two s4'],
    'rows after a shared step refused for one of its transactions',
  );

  // A lost reply of the shared step: each transaction's re-read finds its records.
  txs = await pairsReady(db, 'three');
  faulty!.failAfter(undefined, 'checkAndSetStampedMany');
  steps = 0;
  const settled = await Promise.all(txs.map((tx) => tx.commit()));
  checkEqual(steps, 1, 'stamped steps after the lost reply of a shared step (settled by re-reads)');
  checkEqual(new Set(settled.map((r) => r.commitTs)).size, 1, 'commit timestamps found by the re-reads');
  await checkRecords(store, txs, [1, 1, 1, 1], 'a shared step whose reply was lost');
  checkEqual(
    await readAll(),
    both(SHARED.map((k) => `three ${k}`)),
    'rows after a lost reply of a shared step',
  );

  // A store that asks for more shared calls in flight (sharedCallsInFlight): the eight
  // one-row commits of a turn go in more than one step, some of them shared, every row
  // still written once.
  const inFlight = store.capabilities.sharedCallsInFlight ?? 1;
  if (inFlight > 1) {
    const split = client(ctx, store, { wrap: true, peekedWrites: false });
    let splitSteps = 0;
    split.faulty!.onCall((call) => {
      if (call.operation === 'checkAndSetStampedMany' || call.operation === 'checkAndSetStamped')
        splitSteps++;
    });
    const rows = SHARED.flatMap((k) => [TABLE, OTHER].map((table) => ({ table, k })));
    const singles = await Promise.all(
      rows.map(async ({ table, k }) => {
        const tx = await split.db.begin();
        await tx.getString(table, k, 'v');
        tx.set(table, k, 'v', `four ${k}`);
        return tx;
      }),
    );
    splitSteps = 0;
    const stamps = (await Promise.all(singles.map((tx) => tx.commit()))).map((r) => r.commitTs);
    check(
      splitSteps > 1 && new Set(stamps).size < stamps.length,
      () =>
        `eight one-row commits sent in one turn, ${inFlight} calls in flight: ${splitSteps} steps, ` +
        `${new Set(stamps).size} commit timestamps (expected more than one step, some shared)`,
    );
    for (const [i, { table, k }] of rows.entries())
      checkEqual(
        await recordsOf(store, table, k, singles[i]!.startTs),
        1,
        `eight commits of a turn, ${inFlight} calls in flight: records on ${table}/${k}`,
      );
    checkEqual(
      await readAll(),
      both(SHARED.map((k) => `four ${k}`)),
      `rows after eight commits of a turn, ${inFlight} calls in flight`,
    );
  }
}

/**
 * A shared step applied, its reply held: a reader that starts then sees every transaction
 * of it; then the reply is lost and the client can read nothing more (it died): each
 * transaction is CommitUnknownError, and every row of every one of them is there.
 */
async function sharedStepHeld(ctx: CaseContext): Promise<void> {
  const store = await ctx.createStore();
  const held = replyHeld(store);
  ctx.defer(() => held.release());
  // One shared call per turn, whatever the store declares: the four commits share the held step.
  const { db: writer, faulty } = client(ctx, held.store, { wrap: true, sharedCallsInFlight: 1 });
  const reader = client(ctx, store).db;
  const txs = await pairsReady(writer, 'held');
  const failed = Promise.all(
    txs.map((tx) =>
      tx.commit().then(
        () => undefined,
        (error: unknown) => error,
      ),
    ),
  );
  const result = await held.applied;
  check(result.ok, 'the held shared step was not applied');
  const drawn = await reader.begin();
  check(drawn.startTs > result.timestamp, `a start timestamp drawn after the stamp is ${drawn.startTs}`);
  const all = SHARED.flatMap((k) => [`held ${k}`, `held ${k}`]);
  checkEqual(await readShared(drawn), all, 'a snapshot drawn between a shared step and its reply');
  await drawn.rollback();
  checkEqual(
    await reader.transact(readShared, { readOnly: true }),
    all,
    'a read-only snapshot between a shared step and its reply',
  );
  // The network goes: every later call of this client fails before the store.
  faulty!.hold(() => true).fail();
  held.release({ lose: true });
  for (const [i, error] of (await failed).entries()) {
    check(
      error instanceof CommitUnknownError,
      () => `transaction ${SHARED[i]} of a shared step whose client died: got ${errorText(error)}`,
    );
  }
  checkEqual(
    await reader.transact(readShared),
    all,
    'rows of a shared step whose client died after it landed',
  );
  await checkRecords(store, txs, [1, 1, 1, 1], 'a shared step whose client died after it landed');
}

export const onePhaseCases: ConformanceCase[] = [
  {
    part: 'store',
    name: 'checkAndSetStampedMany writes one drawn value into every row, all or nothing',
    requires: 'stampedCheckAndSetMany',
    run: storeMethod,
  },
  {
    part: 'faults',
    name: "a transaction of several rows commits in one step: a lost reply is settled by a re-read, a lost request is sent again, a blind write's lost reply is CommitUnknownError, a step still on its way (a create-only one too) is fenced and sent again",
    requires: 'stampedCheckAndSetMany',
    run: lostReplies,
  },
  {
    part: 'faults',
    name: 'a reader whose start lands between a one-step commit and its reply sees every row',
    requires: 'stampedCheckAndSetMany',
    run: readerInTheWindow,
  },
  {
    part: 'faults',
    name: 'a client that dies between a one-step commit and its reply leaves every row of it',
    requires: 'stampedCheckAndSetMany',
    run: clientDiesInTheWindow,
  },
  {
    part: 'faults',
    name: 'values a one-step commit moves out of the head row go in its step: moved as it returns, read by older snapshots',
    requires: 'stampedCheckAndSetMany',
    run: movesRideTheStep,
  },
  {
    part: 'faults',
    name: "one-step commits a client sends in one turn share one step: one commit timestamp; a lost race fails only its own transaction; a lost reply is settled by each one's re-read",
    requires: 'stampedCheckAndSetMany',
    run: sharedSteps,
  },
  {
    part: 'faults',
    name: 'a reader whose start lands between a shared step and its reply sees every transaction of it; a client that dies there leaves every row of every one',
    requires: 'stampedCheckAndSetMany',
    run: sharedStepHeld,
  },
];
