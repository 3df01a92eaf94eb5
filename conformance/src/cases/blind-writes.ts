/**
 * One-phase blind writes (docs/protocol.md section 4, "A blind write"): on a store with a
 * stamped CAS, a transaction that writes one row without reading anything is one CAS whose
 * start and commit timestamp are the one value the store draws in its atomic step. These
 * cases pin down the new step: a reader whose start lands between the stamp and the reply
 * sees the write, a reader that started before does not, a lost reply (or a client that
 * dies before it) is CommitUnknownError and never a second write, and a random workload of
 * blind writes with faults, checked against every reader's snapshot.
 */
import {
  type CasRequest,
  type CasResult,
  CommitUnknownError,
  inspectHeadRow,
  Percolator,
  type RowStore,
  type Transaction,
  writeStamp,
} from '@percolator/core';
import { FaultyStore } from '../faulty-store.js';
import type { CaseContext, ConformanceCase } from '../types.js';
import { check, checkEqual, errorText, format } from '../util.js';
import { client, DEFAULT_RANDOM_FAULTS, type FaultMode, faultSuffix, outcomeOf, partFor } from './harness.js';
import { oracleOption } from './store-helpers.js';

const TABLE = 'p_blind';

type StampedCas = (
  request: CasRequest & { readonly state: Uint8Array },
  counter: string,
) => Promise<CasResult & { timestamp?: number }>;

/**
 * The CAS that makes a one-row write visible: on (TABLE, row), with no lock left in the
 * row. Where the store stamps, the blind write's one CAS; elsewhere its commit point.
 */
function isCommitOf(request: CasRequest | undefined, row: string): boolean {
  if (request?.table !== TABLE || request.key !== row || request.state === null) return false;
  // Any stamp will do to decode a state whose stamp the store has yet to draw.
  return inspectHeadRow(writeStamp(request.state, 1)).cells.every((cell) => cell.lock === undefined);
}

/**
 * A view of `store` whose next commit CAS on `row` (isCommitOf), once armed, reaches the
 * store and is applied, but whose reply waits until `release()`: the window between a
 * write becoming visible and its client hearing so.
 */
class ReplyGate {
  private armed: string | undefined;
  private open: () => void = () => {};
  private gate = Promise.resolve();
  private onApplied!: (result: CasResult & { timestamp?: number }) => void;
  /** Resolves with the held call's result once the store has applied it. */
  applied!: Promise<CasResult & { timestamp?: number }>;
  readonly store: RowStore;

  constructor(inner: RowStore) {
    const hold = async <R extends CasResult>(request: CasRequest, send: () => Promise<R>): Promise<R> => {
      const result = await send();
      if (this.armed !== undefined && isCommitOf(request, this.armed)) {
        this.armed = undefined;
        this.onApplied(result);
        await this.gate;
      }
      return result;
    };
    const stamped = inner.checkAndSetStamped?.bind(inner) as StampedCas | undefined;
    const wrapped: Partial<RowStore> = {
      checkAndSet: (request) => hold(request, () => inner.checkAndSet(request)),
      ...(stamped
        ? {
            checkAndSetStamped: (request: CasRequest & { readonly state: Uint8Array }, counter: string) =>
              hold(request, () => stamped(request, counter)),
          }
        : {}),
    };
    this.store = new Proxy(inner, {
      get(target, property) {
        if (property in wrapped) return wrapped[property as keyof RowStore];
        const value = Reflect.get(target, property, target);
        return typeof value === 'function' ? value.bind(target) : value;
      },
    });
  }

  arm(row: string): void {
    this.armed = row;
    this.gate = new Promise((resolve) => {
      this.open = resolve;
    });
    this.applied = new Promise((resolve) => {
      this.onApplied = resolve;
    });
  }

  release(): void {
    this.open();
  }
}

/** Runs a blind write of `value` to both columns of `row`; resolves to the committed transaction. */
async function blindWrite(
  db: Percolator,
  row: string,
  value: string,
): Promise<Transaction & { readonly commitTs: number }> {
  let written: Transaction | undefined;
  let commitTs = 0;
  await db.transact(
    async (tx) => {
      written = tx;
      tx.set(TABLE, row, 'a', value);
      tx.set(TABLE, row, 'b', value);
      commitTs = (await tx.commit()).commitTs;
    },
    { maxAttempts: 20 },
  );
  return Object.assign(written!, { commitTs });
}

async function readRow(tx: Transaction, row: string): Promise<[string | undefined, string | undefined]> {
  return [await tx.getString(TABLE, row, 'a'), await tx.getString(TABLE, row, 'b')];
}

async function betweenWriteAndReply(ctx: CaseContext, store: RowStore): Promise<void> {
  const stamps = store.capabilities.stampedCheckAndSet;
  const gate = new ReplyGate(store);
  const writer = new Percolator({ store: gate.store, ...oracleOption(store) });
  const reader = new Percolator({ store, ...oracleOption(store) });
  ctx.defer(async () => {
    gate.release();
    await writer.close();
    await reader.close();
  });
  await blindWrite(writer, 'k', 'old');
  // A reader that draws its start timestamp before the write.
  const early = await reader.begin();
  gate.arm('k');
  const writing = blindWrite(writer, 'k', 'new');
  writing.catch(() => undefined); // awaited below; a failure meanwhile ends the race
  const applied = await Promise.race([
    gate.applied,
    writing.then(() => {
      throw new Error('the blind write finished without its commit CAS being held');
    }),
  ]);
  check(applied.ok, `the held commit CAS did not apply: ${format(applied)}`);
  if (stamps) check(applied.timestamp !== undefined, 'an applied stamped CAS must return its timestamp');
  // A reader that starts now, after the write landed and before the writer heard back, must see it.
  const late = await reader.transact(async (tx) => ({ seen: await readRow(tx, 'k'), startTs: tx.startTs }));
  checkEqual(late.seen, ['new', 'new'], 'a snapshot started after the write landed, before its reply');
  checkEqual(
    await readRow(early, 'k'),
    ['old', 'old'],
    'a snapshot started before the write (read after it landed)',
  );
  await early.rollback();
  gate.release();
  const tx = await writing;
  const head = inspectHeadRow((await store.read(TABLE, 'k'))!.state);
  const newest = head.cells.map((cell) => cell.writes[0]!);
  check(
    // At or above the early snapshot: a peeked one (docs/protocol.md 4.10) may equal a
    // commit timestamp drawn after it, which it does not see (visible is below it).
    newest.every((w) => w.commitTs >= early.startTs && w.commitTs < late.startTs),
    `the write's commit timestamps ${format(newest.map((w) => w.commitTs))} must lie between the early reader's ${early.startTs} and the late one's ${late.startTs}`,
  );
  if (stamps) {
    // One CAS: start and commit timestamp are the one stamp, and no lock was ever written.
    checkEqual(tx.startTs, applied.timestamp, "the blind write's start timestamp is the drawn stamp");
    for (const w of newest) {
      check(
        w.commitTs === applied.timestamp && w.startTs === applied.timestamp,
        `a one-phase blind write's record is ${format(w)}, expected start = commit = ${applied.timestamp}`,
      );
    }
  }
  ctx.note(
    `${stamps ? 'one stamped CAS' : 'two-step commit'}; early reader at ${early.startTs}, late at ${late.startTs}`,
  );
}

async function lostReply(ctx: CaseContext, store: RowStore): Promise<void> {
  const stamps = store.capabilities.stampedCheckAndSet;
  const faulty = new FaultyStore(store);
  const db = new Percolator({ store: faulty, ...oracleOption(store) });
  const reader = new Percolator({ store, ...oracleOption(store) });
  ctx.defer(async () => {
    faulty.clearFaults();
    await db.close();
    await reader.close();
  });
  await blindWrite(db, 'k', 'v0');
  let commitsSent = 0;
  faulty.onCall((call) => {
    if (isCommitOf(call.request, 'k')) commitsSent++;
  });
  // Applied, then the reply is lost: a client that dies here is in the same place.
  faulty.inject({ kind: 'after', operation: CAS_OPERATIONS, match: (call) => isCommitOf(call.request, 'k') });
  const error = await blindWrite(db, 'k', 'v1').then(
    () => undefined,
    (e: unknown) => e,
  );
  if (stamps) {
    check(
      error instanceof CommitUnknownError && error.startTs === undefined,
      `a lost reply to a one-phase blind write must be CommitUnknownError, got ${errorText(error)}`,
    );
  } else {
    check(
      error === undefined || error instanceof CommitUnknownError,
      `a lost reply to a commit point is settled by a re-read or is CommitUnknownError, got ${errorText(error)}`,
    );
  }
  checkEqual(commitsSent, 1, 'commit CASes sent for the write whose reply was lost (never sent twice)');
  checkEqual(
    await reader.transact((tx) => readRow(tx, 'k')),
    ['v1', 'v1'],
    'a reader after the lost reply (the write landed)',
  );
  const head = inspectHeadRow((await store.read(TABLE, 'k'))!.state);
  for (const cell of head.cells) {
    check(cell.lock === undefined, `column ${cell.column} holds a lock after a lost reply`);
    checkEqual(cell.writes.length, 2, `column ${cell.column}'s records (v0 and v1, once each)`);
  }
  // A lost request (never applied) is sent again, and commits once.
  const failedBefore = faulty.stats.failedBefore;
  const sentBefore = commitsSent;
  faulty.inject({
    kind: 'before',
    operation: CAS_OPERATIONS,
    match: (call) => isCommitOf(call.request, 'k'),
  });
  await blindWrite(db, 'k', 'v2');
  checkEqual(faulty.stats.failedBefore - failedBefore, 1, 'commit CASes lost before reaching the store');
  checkEqual(
    commitsSent - sentBefore,
    2,
    'commit CASes sent for the write whose request was lost (it, then once more)',
  );
  checkEqual(await reader.transact((tx) => readRow(tx, 'k')), ['v2', 'v2'], 'after a lost request');
  ctx.note(`lost reply: ${error === undefined ? 'settled by a re-read' : 'CommitUnknownError'}`);
}

const CAS_OPERATIONS = ['checkAndSet', 'checkAndSetStamped', 'checkAndSetMany'] as const;

interface Write {
  readonly row: string;
  readonly value: string;
  outcome?: 'ok' | 'fail' | 'info';
  /** The commit timestamp of an ok write (on a stamped store, its start timestamp too). */
  commitTs?: number;
  invokedAt: number;
  completedAt?: number;
  /** A read-modify-write: the value its snapshot read ('init', or another write's). */
  read?: string | undefined;
}

/**
 * Blind writes of unique values to a few rows (two columns each) from several clients,
 * with random faults, while readers read every row in one snapshot. Checked: columns
 * written together are seen together; no reader sees a failed write; a reader sees the
 * newest write committed below its start timestamp (stamped stores) and every write that
 * completed before it began, unless a later one replaced it (all stores).
 */
async function randomBlindWrites(ctx: CaseContext, mode: FaultMode): Promise<void> {
  const store = await ctx.createStore();
  const stamped = store.capabilities.stampedCheckAndSet;
  const rows = ['r0', 'r1', 'r2'];
  const clients = [0, 1, 2].map(() =>
    client(ctx, store, mode === 'faulty' ? { faults: DEFAULT_RANDOM_FAULTS, lockTtlMs: 250 } : {}),
  );
  const setup = client(ctx, store).db;
  for (const row of rows) await blindWrite(setup, row, 'init');
  const writes = new Map<string, Write>();
  let clock = 0; // a logical clock of invocations and completions
  const writers = ctx.scaled(4, 3);
  const perWriter = ctx.scaled(25, 10);
  let done = false;
  const writing = Promise.all(
    Array.from({ length: writers }, async (_, w) => {
      const { db } = clients[w % clients.length]!;
      const random = ctx.random.fork(`blind writer ${w}`);
      // The last writer reads each row before it writes it: its commits must not pass over
      // a blind write committed after its snapshot (first committer wins), the rule a
      // conflict check that missed one-step blind writes' records would break.
      const readsFirst = w === writers - 1;
      for (let i = 0; i < perWriter; i++) {
        const write: Write = {
          row: rows[random.int(rows.length)]!,
          value: `${readsFirst ? 'm' : 'w'}${w}-${i}`,
          invokedAt: ++clock,
        };
        writes.set(write.value, write);
        try {
          if (readsFirst) {
            await db.transact(
              async (tx) => {
                write.read = (await readRow(tx, write.row))[0];
                tx.set(TABLE, write.row, 'a', write.value);
                tx.set(TABLE, write.row, 'b', write.value);
                write.commitTs = (await tx.commit()).commitTs;
              },
              { maxAttempts: 20 },
            );
          } else {
            const tx = await blindWrite(db, write.row, write.value);
            write.commitTs = tx.commitTs;
          }
          write.outcome = 'ok';
        } catch (error) {
          write.outcome = outcomeOf(error);
        }
        write.completedAt = ++clock;
        await new Promise((resolve) => setTimeout(resolve, 1));
      }
    }),
  ).finally(() => {
    done = true;
  });
  const bad: string[] = [];
  let snapshots = 0;
  // Each snapshot is judged once every write is done: a write's outcome, commit timestamp
  // and completion are known only then (judged while the writes ran, a write whose reply
  // had not come back, the window this case is about, escaped the checks).
  const snapshotsRead: {
    seen: [string | undefined, string | undefined][];
    startTs: number;
    began: number;
  }[] = [];
  const check1 = (
    row: string,
    seen: [string | undefined, string | undefined],
    startTs: number,
    began: number,
  ) => {
    const [a, b] = seen;
    if (a !== b) bad.push(`${row}: columns written together read ${format(a)} and ${format(b)}`);
    const w = a === undefined || a === 'init' ? undefined : writes.get(a);
    if (a !== 'init' && w === undefined) bad.push(`${row}: read ${format(a)}, which nobody wrote`);
    if (w?.outcome === 'fail') bad.push(`${row}: read ${w.value}, whose write failed`);
    if (w && w.row !== row) bad.push(`${row}: read ${w.value}, written to ${w.row}`);
    const rowWrites = [...writes.values()].filter((x) => x.row === row && x.outcome === 'ok');
    if (stamped) {
      if (w?.commitTs !== undefined && w.commitTs >= startTs) {
        bad.push(`${row}: a snapshot at ${startTs} read ${w.value}, committed at ${w.commitTs}`);
      }
      const newer = rowWrites.filter(
        (x) => x.commitTs! < startTs && x.commitTs! > (w?.commitTs ?? (w ? Number.POSITIVE_INFINITY : 0)),
      );
      if (newer.length > 0) {
        bad.push(
          `${row}: a snapshot at ${startTs} read ${format(a)} (at ${w?.commitTs ?? 'init'}) but missed ${newer[0]!.value} (at ${newer[0]!.commitTs})`,
        );
      }
    }
    // Real time: a write that completed before this reader began, and was not followed by
    // one begun after it completed (which could be the newer one), must be seen or replaced.
    for (const x of rowWrites) {
      if (x.completedAt! >= began || x === w) continue;
      const replacedOk =
        w !== undefined &&
        (w.completedAt === undefined || w.completedAt > x.invokedAt) &&
        w.outcome !== 'fail';
      if (!replacedOk) {
        bad.push(`${row}: a reader begun after ${x.value} completed read ${format(a)}, which is older`);
        break;
      }
    }
  };
  const reading = Promise.all(
    [0, 1].map(async (r) => {
      const { db } = clients[r]!;
      while (!done) {
        const began = ++clock;
        let result: { seen: [string | undefined, string | undefined][]; startTs: number };
        try {
          result = await db.transact(
            async (tx) => {
              const seen: [string | undefined, string | undefined][] = [];
              for (const row of rows) seen.push(await readRow(tx, row));
              return { seen, startTs: tx.startTs };
            },
            { maxAttempts: 3 },
          );
        } catch (error) {
          outcomeOf(error);
          continue;
        }
        snapshots++;
        snapshotsRead.push({ ...result, began });
        await new Promise((resolve) => setTimeout(resolve, 1));
      }
    }),
  );
  await Promise.all([writing, reading]);
  for (const { seen, startTs, began } of snapshotsRead) {
    for (const [i, row] of rows.entries()) check1(row, seen[i]!, startTs, began);
  }
  // First committer wins: a read-modify-write that read P and committed at C has no
  // committed write of its row between P's commit and C (it would have overwritten a write
  // its snapshot never saw: a lost update).
  let readModifyWrites = 0;
  for (const x of writes.values()) {
    if (x.read === undefined && !x.value.startsWith('m')) continue;
    if (x.outcome !== 'ok') continue;
    readModifyWrites++;
    const p = x.read === undefined || x.read === 'init' ? undefined : writes.get(x.read);
    const after = p ? p.commitTs! : 0;
    const between = [...writes.values()].find(
      (y) =>
        y !== x &&
        y !== p &&
        y.row === x.row &&
        y.outcome === 'ok' &&
        y.commitTs! > after &&
        y.commitTs! < x.commitTs!,
    );
    if (between)
      bad.push(
        `${x.row}: ${x.value} read ${format(x.read)} (committed at ${after}) and committed at ${x.commitTs}, over ${between.value} committed at ${between.commitTs} (a lost update)`,
      );
  }
  if (!stamped) {
    ctx.note(
      'the store does not stamp commits: snapshots checked against real time, not against commit timestamps',
    );
  }
  check(bad.length === 0, () => `${bad.length} bad read(s), e.g. ${bad.slice(0, 3).join('; ')}`);
  check(snapshots > 0, 'no reader snapshot succeeded');
  const counts = { ok: 0, fail: 0, info: 0 };
  for (const w of writes.values()) counts[w.outcome!]++;
  check(counts.ok > 0, 'no blind write committed');
  check(readModifyWrites > 0, 'no read-modify-write committed: first committer wins went unchecked');
  ctx.note(
    `${snapshots} snapshots checked against ${writes.size} writes ${JSON.stringify(counts)}, ${readModifyWrites} of them read-modify-writes`,
  );
}

export function blindWriteCases(mode: FaultMode): ConformanceCase[] {
  const part = partFor(mode);
  const cases: ConformanceCase[] = [
    {
      part,
      name: `blind one-row writes: readers see the newest write below their snapshot, never a failed one${faultSuffix(mode)}`,
      timeoutMs: 60_000,
      run: (ctx) => randomBlindWrites(ctx, mode),
    },
  ];
  if (mode === 'clean') {
    cases.push({
      part,
      name:
        'a blind one-row write is seen by a reader that starts between its commit CAS and the reply, not by one that started before; ' +
        'a lost reply never sends it twice (one stamped CAS where the store stamps: CommitUnknownError)',
      run: async (ctx) => {
        await betweenWriteAndReply(ctx, await ctx.createStore());
        await lostReply(ctx, await ctx.createStore());
      },
    });
  }
  return cases;
}
