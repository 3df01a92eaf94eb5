/**
 * Part 2, the protocol through Percolator over the store under test: snapshot isolation's
 * promises (no lost update, no aborted or intermediate read, no read skew) and what it does
 * not promise (write skew). Recovery from stopped clients is in recovery.ts. The cases
 * that tolerate faults also run in the 'faults' part over a FaultyStore.
 */
import { ConflictError, type Transaction } from '@percolator/core';
import type { CaseContext, ConformanceCase } from '../types.js';
import { check, checkEqual, errorText, format, rejection } from '../util.js';
import {
  client,
  type FaultMode,
  faultSuffix,
  faultsFor,
  LOCK_TTL_MS,
  outcomeOf,
  partFor,
  readAll,
  settled,
} from './harness.js';
import { recoveryCases } from './recovery.js';

/** Short locks when faults may leave some behind, so other clients are not held up long. */
function ttlFor(mode: FaultMode): number {
  return mode === 'faulty' ? 250 : LOCK_TTL_MS;
}

// ---------------------------------------------------------------------------------------

async function lostUpdate(ctx: CaseContext, mode: FaultMode): Promise<void> {
  const store = await ctx.createStore();
  const faults = faultsFor(mode);
  const lockTtlMs = ttlFor(mode);
  const clients = [0, 1, 2].map(() => client(ctx, store, { faults, lockTtlMs }));
  const workers = ctx.scaled(10, 3);
  const perWorker = ctx.scaled(10, 3);
  const T = 'p_counter';
  // Two kinds of transaction: "pair" bumps the shared total and the worker's own row
  // (two rows: the full two-phase commit); "solo" bumps only the total (one row).
  const counts = { pairOk: 0, soloOk: 0, pairUnknown: 0, soloUnknown: 0, failed: 0 };
  await Promise.all(
    Array.from({ length: workers }, async (_, w) => {
      const { db } = clients[w % clients.length]!;
      for (let i = 0; i < perWorker; i++) {
        const pair = (w + i) % 2 === 0;
        try {
          await db.transact(
            async (tx) => {
              const total = Number((await tx.getString(T, 'total', 'n')) ?? '0');
              tx.set(T, 'total', 'n', String(total + 1));
              if (pair) {
                const mine = Number((await tx.getString(T, `w${w}`, 'n')) ?? '0');
                tx.set(T, `w${w}`, 'n', String(mine + 1));
              }
            },
            { maxAttempts: 100 },
          );
          if (pair) counts.pairOk++;
          else counts.soloOk++;
        } catch (error) {
          if (outcomeOf(error) === 'fail') counts.failed++;
          else if (pair) counts.pairUnknown++;
          else counts.soloUnknown++;
        }
      }
    }),
  );
  const checker = client(ctx, store, { lockTtlMs }).db;
  const [total, mine] = await settled(
    checker,
    async (tx) => {
      const t = Number((await tx.getString(T, 'total', 'n')) ?? '0');
      let sum = 0;
      for (let w = 0; w < workers; w++) sum += Number((await tx.getString(T, `w${w}`, 'n')) ?? '0');
      return [t, sum] as const;
    },
    'reading the counters',
  );
  ctx.note(`${JSON.stringify(counts)}; total ${total}, per-worker rows sum ${mine}`);
  check(counts.pairOk + counts.soloOk > 0, 'no increment committed at all');
  const within = (value: number, low: number, high: number) => value >= low && value <= high;
  check(
    within(mine, counts.pairOk, counts.pairOk + counts.pairUnknown),
    `per-worker rows sum to ${mine}, but ${counts.pairOk} two-row increments committed ` +
      `(${counts.pairUnknown} unknown): an update was lost or applied twice`,
  );
  check(
    within(total - mine, counts.soloOk, counts.soloOk + counts.soloUnknown),
    `the total is ${total}: ${total - mine} one-row increments visible, but ${counts.soloOk} committed ` +
      `(${counts.soloUnknown} unknown): an update was lost or applied twice`,
  );
  if (mode === 'clean')
    checkEqual(counts.pairUnknown + counts.soloUnknown, 0, 'unknown outcomes without faults');
}

// ---------------------------------------------------------------------------------------

async function abortedAndIntermediate(ctx: CaseContext, mode: FaultMode): Promise<void> {
  const store = await ctx.createStore();
  const faults = faultsFor(mode);
  const lockTtlMs = ttlFor(mode);
  const T = 'p_dirty';
  const cells = [
    [T, 'x'],
    ['p_dirty2', 'y'],
  ] as const;
  const setup = client(ctx, store, { lockTtlMs }).db;
  await setup.transact(async (tx) => {
    for (const [table, row] of cells) tx.set(table, row, 'v', 'initial');
  });

  if (mode === 'clean') {
    // A rolled-back transaction, a user error inside transact, a conflict loser.
    const t1 = await setup.begin();
    t1.set(T, 'x', 'v', 'aborted-rollback');
    await t1.rollback();
    const userError = new Error('user abort');
    const thrown = await rejection(
      () =>
        setup.transact(async (tx) => {
          tx.set(T, 'x', 'v', 'aborted-user');
          throw userError;
        }),
      'transact whose function throws',
    );
    check(
      thrown === userError,
      `transact must rethrow the user's own error unchanged, got ${errorText(thrown)}`,
    );
    const a = await setup.begin();
    const b = await setup.begin();
    await a.getString(T, 'x', 'v');
    await b.getString(T, 'x', 'v');
    a.set(T, 'x', 'v', 'winner');
    b.set(T, 'x', 'v', 'aborted-conflict');
    b.set('p_dirty2', 'y', 'v', 'aborted-conflict');
    await a.commit();
    const lost = await rejection(() => b.commit(), 'the second of two conflicting commits');
    check(
      lost instanceof ConflictError,
      `a write-write conflict must fail with ConflictError, got ${errorText(lost)}`,
    );
    checkEqual(
      await setup.transact((tx) => readAll(tx, cells)),
      ['winner', 'initial'],
      'after a rollback, a user abort and a conflict',
    );
    // Intermediate values inside one transaction are never visible; the last write wins.
    await setup.transact(async (tx) => {
      tx.set(T, 'x', 'v', 'intermediate-1');
      tx.set(T, 'x', 'v', 'intermediate-2');
      tx.delete(T, 'x', 'v');
      tx.set(T, 'x', 'v', 'final');
      tx.set('p_dirty2', 'y', 'v', 'intermediate');
      tx.delete('p_dirty2', 'y', 'v');
      checkEqual(await tx.getString(T, 'x', 'v'), 'final', 'a transaction reads its own last write');
    });
    checkEqual(await setup.transact((tx) => readAll(tx, cells)), ['final', undefined], 'after overwrites');
    await setup.transact(async (tx) => {
      for (const [table, row] of cells) tx.set(table, row, 'v', 'initial');
    });
  }

  // Concurrent writers whose transactions write intermediate values, and sometimes abort,
  // while readers check every snapshot.
  const writers = ctx.scaled(4, 2);
  const perWriter = ctx.scaled(15, 4);
  const readers = 3;
  const outcome = new Map<number, 'ok' | 'fail' | 'info' | 'aborted'>();
  // Each attempt of a transaction writes values of its own (`final-<id>.<attempt>`): the
  // one that may have committed is its last (transact runs again only an attempt that
  // certainly did not commit), so a value of an earlier one is a leaked write.
  const lastAttempt = new Map<number, number>();
  // Values seen by the readers, judged once every writer is done (a writer's outcome is
  // known only then: judged while it ran, a value of a transaction that failed later
  // would pass).
  const seenValues: string[] = [];
  const badReads: string[] = [];
  let snapshots = 0;
  let done = false;
  const clients = [0, 1, 2].map(() => client(ctx, store, { faults, lockTtlMs }));
  const writing = Promise.all(
    Array.from({ length: writers }, async (_, w) => {
      const { db } = clients[w % 3]!;
      const random = ctx.random.fork(`writer ${w}`);
      for (let i = 0; i < perWriter; i++) {
        const id = w * 1000 + i;
        const abort = random.chance(0.3);
        try {
          await db.transact(
            async (tx) => {
              const attempt = (lastAttempt.get(id) ?? 0) + 1;
              lastAttempt.set(id, attempt);
              // Read first: writers of x then conflict, so attempts fail and are retried,
              // and the values of attempts that did not commit must never be seen (blind
              // writes of two rows in one step never conflicted: found in review).
              if (i % 2 === 0) await tx.getString(cells[0]![0], cells[0]![1], 'v');
              for (const [table, row] of cells) tx.set(table, row, 'v', `mid-${id}.${attempt}`);
              for (const [table, row] of cells) tx.set(table, row, 'v', `final-${id}.${attempt}`);
              if (abort) throw new UserAbort();
            },
            { maxAttempts: 20 },
          );
          outcome.set(id, 'ok');
        } catch (error) {
          outcome.set(id, error instanceof UserAbort ? 'aborted' : outcomeOf(error));
        }
        // A memory store answers in microtasks: yield so readers' timers get to run.
        await yieldToTimers();
      }
    }),
  ).finally(() => {
    done = true;
  });
  const reading = Promise.all(
    Array.from({ length: readers }, async (_, r) => {
      const { db } = clients[r % 3]!;
      while (!done) {
        let seen: (string | undefined)[];
        try {
          seen = await db.transact((tx) => readAll(tx, r % 2 ? [...cells].reverse() : cells), {
            maxAttempts: 3,
          });
        } catch (error) {
          outcomeOf(error);
          continue;
        }
        snapshots++;
        const [x, y] = r % 2 ? [seen[1], seen[0]] : seen;
        if (x !== y) badReads.push(`a snapshot saw x=${format(x)} but y=${format(y)} (not atomic)`);
        for (const value of [x, y]) {
          if (value?.startsWith('mid-')) badReads.push(`a snapshot saw intermediate value ${value}`);
          else if (value?.startsWith('final-')) seenValues.push(value);
        }
        await yieldToTimers();
      }
    }),
  );
  await Promise.all([writing, reading]);
  /** Why a value a snapshot held cannot have committed, if it cannot. */
  const notCommitted = (value: string): string | undefined => {
    const [id, attempt] = value.slice('final-'.length).split('.').map(Number) as [number, number];
    const o = outcome.get(id);
    if (o === 'aborted' || o === 'fail') return `its transaction ${o === 'fail' ? 'failed' : 'aborted'}`;
    if (attempt !== lastAttempt.get(id)) {
      return `attempt ${attempt} of its transaction was retried (attempt ${lastAttempt.get(id)} was the last)`;
    }
    return undefined;
  };
  for (const value of new Set(seenValues)) {
    const why = notCommitted(value);
    if (why !== undefined) badReads.push(`a snapshot saw ${value}, but ${why}`);
  }
  const final = await settled(setup, (tx) => readAll(tx, cells), 'final read');
  if (final[0]?.startsWith('final-')) {
    const why = notCommitted(final[0]);
    check(why === undefined, () => `the final value ${final[0]} did not commit: ${why}`);
  }
  // A writer that committed left a final value (a store that dropped every write passed).
  const committed = [...outcome.values()].filter((o) => o === 'ok').length;
  check(committed > 0, 'no writer committed: the readers had nothing to see');
  check(
    final[0]?.startsWith('final-') === true,
    () => `${committed} writers committed, but x holds ${format(final[0])}`,
  );
  const retried = [...lastAttempt.values()].filter((a) => a > 1).length;
  ctx.note(`${committed} writers committed; ${retried} transactions ran more than one attempt`);
  checkEqual(final[0], final[1], 'the final values of x and y (written together)');
  check(
    badReads.length === 0,
    () => `${badReads.length} bad snapshot(s), e.g. ${badReads.slice(0, 3).join('; ')}`,
  );
  check(snapshots > 0, 'no reader snapshot succeeded');
  ctx.note(`${snapshots} snapshots checked, ${outcome.size} writer transactions`);
}

class UserAbort extends Error {}

function yieldToTimers(): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, 1));
}

// ---------------------------------------------------------------------------------------

async function readSkew(ctx: CaseContext, mode: FaultMode): Promise<void> {
  const store = await ctx.createStore();
  const faults = faultsFor(mode);
  const lockTtlMs = ttlFor(mode);
  const accounts = ['p_bank_a', 'p_bank_b'].flatMap((table) =>
    ['acct0', 'acct1', 'acct2'].map((row) => [table, row] as const),
  );
  const initial = 100;
  const expectedSum = initial * accounts.length;
  const setup = client(ctx, store, { lockTtlMs }).db;
  await setup.transact(async (tx) => {
    for (const [table, row] of accounts) tx.set(table, row, 'balance', String(initial));
  });
  const balance = async (tx: Transaction, cell: readonly [string, string]) =>
    Number(await tx.getString(cell[0], cell[1], 'balance'));

  if (mode === 'clean') {
    // Deterministic: a reader that read one side before a transfer must see the other
    // side as it was at its snapshot too.
    const reader = await setup.begin();
    const before = await balance(reader, accounts[0]!);
    await setup.transact(async (tx) => {
      tx.set(accounts[0]![0], accounts[0]![1], 'balance', String((await balance(tx, accounts[0]!)) - 30));
      tx.set(accounts[1]![0], accounts[1]![1], 'balance', String((await balance(tx, accounts[1]!)) + 30));
    });
    const after = await balance(reader, accounts[1]!);
    checkEqual(before + after, 2 * initial, 'a snapshot read of two accounts around a committed transfer');
    await reader.commit();
  }

  const transferers = ctx.scaled(5, 2);
  const perTransferer = ctx.scaled(15, 4);
  const clients = [0, 1, 2].map(() => client(ctx, store, { faults, lockTtlMs }));
  const wrong: string[] = [];
  let snapshots = 0;
  let committedTransfers = 0;
  let done = false;
  const transfers = Promise.all(
    Array.from({ length: transferers }, async (_, t) => {
      const { db } = clients[t % 3]!;
      const random = ctx.random.fork(`transferer ${t}`);
      for (let i = 0; i < perTransferer; i++) {
        const [from, to] = random.shuffle(accounts);
        const amount = random.between(1, 20);
        try {
          await db.transact(
            async (tx) => {
              tx.set(from![0], from![1], 'balance', String((await balance(tx, from!)) - amount));
              tx.set(to![0], to![1], 'balance', String((await balance(tx, to!)) + amount));
            },
            { maxAttempts: 30 },
          );
          committedTransfers++;
        } catch (error) {
          outcomeOf(error);
        }
        await yieldToTimers();
      }
    }),
  ).finally(() => {
    done = true;
  });
  const scanning = store.capabilities.orderedScan;
  const readers = Array.from({ length: 3 }, async (_, r) => {
    const { db } = clients[r % 3]!;
    const random = ctx.random.fork(`reader ${r}`);
    while (!done) {
      const useScan = scanning && r === 2;
      let sum: number;
      try {
        sum = await db.transact(
          async (tx) => {
            let s = 0;
            if (useScan) {
              for (const table of ['p_bank_a', 'p_bank_b']) {
                for await (const row of tx.scan(table))
                  s += Number(new TextDecoder().decode(row.columns.get('balance')));
              }
            } else {
              for (const cell of random.shuffle(accounts)) s += await balance(tx, cell);
            }
            return s;
          },
          { maxAttempts: 3 },
        );
      } catch (error) {
        outcomeOf(error);
        continue;
      }
      snapshots++;
      if (sum !== expectedSum)
        wrong.push(`a ${useScan ? 'scan' : 'snapshot'} summed to ${sum}, not ${expectedSum}`);
      await yieldToTimers();
    }
  });
  await Promise.all([transfers, ...readers]);
  const finalSum = await settled(
    setup,
    async (tx) => {
      let s = 0;
      for (const cell of accounts) s += await balance(tx, cell);
      return s;
    },
    'final sum',
  );
  checkEqual(finalSum, expectedSum, 'the sum of all balances after the transfers');
  check(
    wrong.length === 0,
    () => `read skew: ${wrong.length} inconsistent snapshot(s), e.g. ${wrong.slice(0, 3).join('; ')}`,
  );
  check(snapshots > 0, 'no reader snapshot succeeded');
  // With no transfer committed every sum is right whatever the store does (found in review).
  check(committedTransfers > 0, 'no transfer committed: the readers had nothing to skew');
  ctx.note(`${snapshots} snapshots checked, ${committedTransfers} transfers committed`);
}

// ---------------------------------------------------------------------------------------

/**
 * Transactions with nothing to write commit, whatever one-step commit the store offers: one
 * that reads and writes nothing (db.transact, begin/commit), one that only reads, read-only
 * or not. (A one-step commit of "every row written" must not take zero rows for one step.)
 */
async function emptyTransactions(ctx: CaseContext): Promise<void> {
  const store = await ctx.createStore();
  const { db } = client(ctx, store);
  const T = 'p_empty';
  checkEqual(await db.transact(async () => 42), 42, 'a transaction that reads and writes nothing');
  checkEqual(
    await db.transact(async () => 43, { readOnly: true }),
    43,
    'a read-only transaction that reads nothing',
  );
  const tx = await db.begin();
  const { commitTs } = await tx.commit();
  check(commitTs >= tx.startTs, `begin/commit of nothing: commitTs ${commitTs} below startTs ${tx.startTs}`);
  await db.transact(async (t) => t.set(T, 'a', 'v', 'x'));
  checkEqual(
    await db.transact((t) => t.getString(T, 'a', 'v')),
    'x',
    'a read-write transaction that only reads',
  );
  checkEqual(
    await db.transact((t) => t.getString(T, 'a', 'v'), { readOnly: true }),
    'x',
    'a read-only transaction that reads',
  );
}

async function writeSkew(ctx: CaseContext): Promise<void> {
  const store = await ctx.createStore();
  const db = client(ctx, store).db;
  const T = 'p_oncall';
  await db.transact(async (tx) => {
    tx.set(T, 'alice', 'on', 'yes');
    tx.set(T, 'bob', 'on', 'yes');
  });
  // Each doctor checks that the other is on call, then goes off call.
  const t1 = await db.begin();
  const t2 = await db.begin();
  for (const tx of [t1, t2]) {
    checkEqual(
      [await tx.getString(T, 'alice', 'on'), await tx.getString(T, 'bob', 'on')],
      ['yes', 'yes'],
      'both on call',
    );
  }
  t1.set(T, 'alice', 'on', 'no');
  t2.set(T, 'bob', 'on', 'no');
  await t1.commit();
  const second = await t2.commit().then(
    () => undefined,
    (e: unknown) => e,
  );
  check(
    second === undefined,
    () =>
      `snapshot isolation allows write skew (disjoint write sets both commit); the second commit failed: ${errorText(second)}`,
  );
  checkEqual(
    await db.transact(async (tx) => [
      await tx.getString(T, 'alice', 'on'),
      await tx.getString(T, 'bob', 'on'),
    ]),
    ['no', 'no'],
    'after write skew nobody is on call',
  );
  ctx.note(
    'write skew is allowed: snapshot isolation is not serializable (write a guard cell to prevent it)',
  );
}

// ---------------------------------------------------------------------------------------

export function protocolCases(mode: FaultMode): ConformanceCase[] {
  const part = partFor(mode);
  const s = faultSuffix(mode);
  const cases: ConformanceCase[] = [
    {
      part,
      name: `lost update: concurrent increments with transact give the exact total${s}`,
      timeoutMs: 60_000,
      run: (ctx) => lostUpdate(ctx, mode),
    },
    {
      part,
      name: `aborted and intermediate writes are never visible${s}`,
      timeoutMs: 60_000,
      run: (ctx) => abortedAndIntermediate(ctx, mode),
    },
    {
      part,
      name: `read skew is prevented: snapshots stay consistent while transfers run${s}`,
      timeoutMs: 60_000,
      run: (ctx) => readSkew(ctx, mode),
    },
  ];
  // Faults off only: it asserts that both disjoint writers commit, and an injected fault may
  // rightly make either one fail. What it shows (SI allows write skew) needs no faults.
  if (mode === 'clean') {
    cases.push({
      part,
      name: 'write skew is allowed (snapshot isolation, documented): disjoint writers both commit',
      run: writeSkew,
    });
    cases.push({
      part,
      name: 'transactions with nothing to write commit (nothing read either; read only; read-only)',
      run: emptyTransactions,
    });
  }
  cases.push(...recoveryCases(mode));
  return cases;
}
