/**
 * What a capability flag promises when it is false: the core never calls that method,
 * even when the store happens to implement it. A case for a capability the store does not
 * declare runs this check instead (a real test, never a skip).
 */
import {
  InvalidArgumentError,
  Percolator,
  type RowStore,
  type StoreCapabilities,
  UnsupportedOperationError,
} from '@percolator/core';
import { stopAt } from '../crash.js';
import type { StoreOperation } from '../faulty-store.js';
import type { Capability, CaseContext, ConformanceCase } from '../types.js';
import { check, checkEqual, errorText, rejection } from '../util.js';
import { oracleFor, outcomeOf, settled } from './harness.js';

/** The store method each optional capability flag governs. */
export const CAPABILITY_METHODS: Record<Capability, StoreOperation> = {
  batchRead: 'readMany',
  batchCheckAndSet: 'checkAndSetMany',
  orderedScan: 'scan',
  atomicCounter: 'incrementCounter',
  notificationIndex: 'scanNotified',
  stampedCheckAndSet: 'checkAndSetStamped',
  stampedCheckAndSetMany: 'checkAndSetStampedMany',
  stampedRead: 'readStamped',
  peekedRead: 'readPeeked',
};

const OPTIONAL_METHODS = Object.values(CAPABILITY_METHODS);

export function undeclaredName(capability: Capability): string {
  return `${capability} not declared: the core never calls ${CAPABILITY_METHODS[capability]}`;
}

/** The case to run for `c` against stores with `capabilities`: `c` itself, or the undeclared check. */
export function effectiveCase(c: ConformanceCase, capabilities: StoreCapabilities): ConformanceCase {
  const capability = c.requires;
  if (capability === undefined || capabilities[capability]) return c;
  return {
    part: c.part,
    name: undeclaredName(capability),
    run: (ctx) => checkUndeclared(ctx, capability),
  };
}

/**
 * A store wrapper that counts calls per method and offers every optional method, whether
 * or not the wrapped store has it: so only the capability flag can keep the core away.
 */
function recording(store: RowStore): { store: RowStore; calls: Map<string, number> } {
  const calls = new Map<string, number>();
  const proxy = new Proxy(store, {
    get(target, property) {
      const value = Reflect.get(target, property, target);
      const name = String(property);
      const optional = (OPTIONAL_METHODS as readonly string[]).includes(name);
      if (typeof value !== 'function' && !optional) return value;
      return (...args: unknown[]) => {
        calls.set(name, (calls.get(name) ?? 0) + 1);
        if (typeof value !== 'function') {
          return Promise.reject(new UnsupportedOperationError(`${target.name} has no ${name}`));
        }
        return (value as (...a: unknown[]) => unknown).apply(target, args);
      };
    },
  });
  return { store: proxy, calls };
}

const T = 'u_rows';
const OTHER = 'u_rows_2';

/**
 * Runs a short workload through Percolator clients over a recording store: multi-row
 * read-modify-write transactions that contend, deletes, observed writes, a client that
 * stops after its commit point and readers that recover its locks, a scan and an
 * observer worker where declared. Then checks the undeclared method was never called.
 */
async function checkUndeclared(ctx: CaseContext, capability: Capability): Promise<void> {
  const method = CAPABILITY_METHODS[capability];
  const inner = await ctx.createStore();
  const { store, calls } = recording(inner);
  const caps = inner.capabilities;
  check(!caps[capability], `the store declares ${capability} after all`);
  if (!caps.atomicCounter) {
    // The default oracle needs the counter: the client must refuse, not call it.
    const error = await rejection(() => new Percolator({ store }), 'a client with the default oracle');
    check(
      error instanceof InvalidArgumentError,
      () => `a client with the default oracle over a store without a counter: got ${errorText(error)}`,
    );
  }
  const oracle = oracleFor(inner);
  const lockTtlMs = 1000;
  const observed = [{ table: T, column: 'watched' }];
  const make = (hooks?: ConstructorParameters<typeof Percolator>[0]['hooks']) => {
    const db = new Percolator({
      store,
      lockTtlMs,
      observedColumns: observed,
      ...(oracle ? { oracle } : {}),
      // A client with hooks stops at a two-phase step (a one-step commit has none).
      ...(hooks ? { hooks, onePhaseMaxRows: 1 } : {}),
    });
    ctx.defer(() => db.close());
    return db;
  };
  const clients = [make(), make(), make()];
  const rows = ['a', 'b', 'c', 'd'];
  const rounds = ctx.scaled(8, 4);
  let committed = 0;
  await Promise.all(
    clients.map(async (db, w) => {
      for (let i = 0; i < rounds; i++) {
        const [x, y] = [rows[(w + i) % rows.length]!, rows[(w + i + 1) % rows.length]!];
        await db
          .transact(
            async (tx) => {
              const n = Number((await tx.getString(T, x, 'n')) ?? '0');
              await tx.get(OTHER, y, 'n');
              tx.set(T, x, 'n', String(n + 1));
              tx.set(T, y, 'watched', `w${w}.${i}`);
              tx.set(OTHER, y, 'n', String(n));
              if (i % 3 === 2) tx.delete(OTHER, x, 'n');
            },
            { maxAttempts: 20 },
          )
          .then(
            () => committed++,
            (error: unknown) => outcomeOf(error), // contention: fine, as long as some commit
          );
        // One-row transactions take the core's one-row path where it has one.
        await db.transact(async (tx) => tx.set(T, `solo${w}`, 'n', String(i)));
      }
    }),
  );
  // A client that stops after its commit point; readers roll its locks forward (no wait:
  // the primary is committed).
  const crasher = make({ onCommitStep: stopAt({ step: 'afterCommitPrimary' }) });
  const stopped = await crasher.begin();
  for (const row of rows) stopped.set(T, row, 'n', 'stopped');
  await rejection(() => stopped.commit(), 'a commit that stops after the primary commit');
  const seen = await settled(
    clients[0]!,
    async (tx) => Promise.all(rows.map((row) => tx.getString(T, row, 'n'))),
    'reading after the stopped commit',
  );
  checkEqual(
    seen,
    rows.map(() => 'stopped'),
    'rows of a transaction stopped after its commit point',
  );
  // Read-only transactions peek their snapshot where the store can.
  const peeked = await settled(
    clients[1]!,
    async (tx) => tx.getString(T, rows[0]!, 'n'),
    'a read-only transaction',
    { readOnly: true },
  );
  checkEqual(peeked, 'stopped', 'a read-only transaction after the stopped commit');
  if (caps.orderedScan) {
    await clients[1]!.transact(async (tx) => {
      for await (const _ of tx.scan(T)) void _;
    });
  } else {
    const error = await rejection(
      () =>
        clients[1]!.transact(async (tx) => {
          for await (const _ of tx.scan(T)) void _;
        }),
      'a scan without orderedScan',
    );
    check(
      error instanceof UnsupportedOperationError,
      () => `a scan without orderedScan must fail with UnsupportedOperationError, got ${errorText(error)}`,
    );
  }
  const observer = { name: 'u_observer', table: T, column: 'watched', handler: async () => {} };
  if (caps.notificationIndex) {
    await clients[2]!.worker({ observers: [observer] }).runUntilIdle();
  } else {
    const error = await rejection(
      () => clients[2]!.worker({ observers: [observer] }),
      'an observer worker without notificationIndex',
    );
    check(
      error instanceof UnsupportedOperationError,
      () =>
        `an observer worker without notificationIndex: expected UnsupportedOperationError, got ${errorText(error)}`,
    );
  }
  const total = [...calls.values()].reduce((a, b) => a + b, 0);
  ctx.note(
    `${committed} multi-row transactions committed; ${total} store calls, ${calls.get(method) ?? 0} to ${method}`,
  );
  check(committed > 0, 'no transaction of the workload committed');
  checkEqual(calls.get(method) ?? 0, 0, `calls to ${method} while ${capability} is not declared`);
}
