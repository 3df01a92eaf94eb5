/**
 * Part 4's own checks: the FaultyStore wrapper does what the fault cases rely on, over the
 * store under test (a call failed before it reaches the store changes nothing; one failed
 * after it was applied did change the store; delays delay; a seed repeats its faults).
 * The protocol and history cases with faults on are in protocol.ts and history.ts.
 */
import { type RowStore, StoreError } from '@percolator/core';
import { FaultyStore } from '../faulty-store.js';
import type { ConformanceCase } from '../types.js';
import { bytes, check, checkEqual, errorText, rejection, text } from '../util.js';

const T = 'f_rows';

function expectStoreError(error: unknown, applied: 'no' | 'unknown', what: string): void {
  check(
    error instanceof StoreError && error.applied === applied,
    () => `${what}: expected StoreError with applied '${applied}', got ${errorText(error)}`,
  );
}

async function state(store: RowStore, key: string): Promise<string | null> {
  const row = await store.read(T, key);
  return row === null ? null : text(row.state);
}

export const faultCases: ConformanceCase[] = [
  {
    part: 'faults',
    name: 'FaultyStore: a call failed before reaching the store changes nothing',
    async run(ctx) {
      const store = await ctx.createStore();
      const faulty = new FaultyStore(store, { seed: ctx.seed });
      faulty.failBefore(undefined, 'checkAndSet');
      const error = await rejection(
        () => faulty.checkAndSet({ table: T, key: 'a', expected: null, state: bytes('x') }),
        'a CAS failed before reaching the store',
      );
      expectStoreError(error, 'no', 'a CAS failed before reaching the store');
      check(
        String((error as Error).message).includes(`seed ${ctx.seed}`),
        'the fault message must name the seed',
      );
      checkEqual(await state(store, 'a'), null, 'the row after a call that failed before reaching the store');
      const ok = await faulty.checkAndSet({ table: T, key: 'a', expected: null, state: bytes('y') });
      check(ok.ok, 'the next call goes through');
      checkEqual(await state(store, 'a'), 'y', 'the row after the next call');
    },
  },
  {
    part: 'faults',
    name: 'FaultyStore: a call failed after the store applied it is ambiguous but applied',
    async run(ctx) {
      const store = await ctx.createStore();
      const faulty = new FaultyStore(store, { seed: ctx.seed });
      faulty.failAfter((call) => call.key === 'b');
      const error = await rejection(
        () => faulty.checkAndSet({ table: T, key: 'b', expected: null, state: bytes('landed') }),
        'a CAS failed after it was applied',
      );
      expectStoreError(error, 'unknown', 'a CAS failed after it was applied');
      checkEqual(await state(store, 'b'), 'landed', 'the row after an ambiguous failure');
      checkEqual(faulty.stats.failedAfter, 1, 'faults counted');
      // A read failed after it ran counts as a fault, but not as an ambiguous write.
      faulty.failAfter((call) => call.key === 'b', 'read');
      await rejection(() => faulty.read(T, 'b'), 'a read failed after it ran');
      checkEqual(faulty.stats.failedAfter, 2, 'faults counted, the read included');
      checkEqual(faulty.stats.writesFailedAfter, 1, 'ambiguous writes counted, the read not');
      // Nor a counter draw: its lost reply loses a timestamp, no row.
      if (store.incrementCounter !== undefined) {
        faulty.failAfter(undefined, 'incrementCounter');
        await rejection(() => faulty.incrementCounter('faults.counter', 1), 'a draw failed after it ran');
        checkEqual(faulty.stats.failedAfter, 3, 'faults counted, the draw included');
        checkEqual(faulty.stats.writesFailedAfter, 1, 'ambiguous row writes counted, the draw not');
      }
      // Nor a CAS the store refused (it wrote nothing), reported failed after it ran.
      const before = faulty.stats.failedAfter;
      faulty.failAfter((call) => call.key === 'b');
      await rejection(
        () => faulty.checkAndSet({ table: T, key: 'b', expected: null, state: bytes('again') }),
        'a refused CAS failed after it ran',
      );
      checkEqual(faulty.stats.failedAfter, before + 1, 'faults counted, the refused CAS included');
      checkEqual(faulty.stats.writesFailedAfter, 1, 'ambiguous row writes counted, the refused CAS not');
      checkEqual(await state(store, 'b'), 'landed', 'the row after a refused CAS');
    },
  },
  {
    part: 'faults',
    name: 'FaultyStore: delays and holds keep a call from the store until due',
    async run(ctx) {
      const store = await ctx.createStore();
      const faulty = new FaultyStore(store, { seed: ctx.seed });
      faulty.inject({ kind: 'delay', delayMs: 40, operation: 'read' });
      const started = performance.now();
      await faulty.read(T, 'c');
      check(performance.now() - started >= 35, 'a delayed call returned early');
      const hold = faulty.hold((call) => call.key === 'c');
      const pending = faulty.checkAndSet({ table: T, key: 'c', expected: null, state: bytes('held') });
      await hold.reached;
      checkEqual(await state(store, 'c'), null, 'a held call must not reach the store');
      hold.release();
      check((await pending).ok, 'the released call');
      checkEqual(await state(store, 'c'), 'held', 'the row after the held call was released');
    },
  },
  {
    part: 'faults',
    name: 'FaultyStore: a call reported failed while on its way lands later, with the bytes it was sent',
    async run(ctx) {
      const store = await ctx.createStore();
      const faulty = new FaultyStore(store, { seed: ctx.seed });
      let landed!: () => void;
      const until = new Promise<void>((resolve) => {
        landed = resolve;
      });
      faulty.inject({ kind: 'late', operation: 'checkAndSet', until });
      const sent = bytes('late');
      const error = await rejection(
        () => faulty.checkAndSet({ table: T, key: 'd', expected: null, state: sent }),
        'a CAS reported failed while on its way',
      );
      expectStoreError(error, 'unknown', 'a CAS reported failed while on its way');
      // The caller may reuse its buffer once told the call failed: the call carries a copy.
      sent.fill(0);
      checkEqual(await state(store, 'd'), null, 'the row before the late call lands');
      checkEqual(faulty.stats.late, 1, 'late calls counted');
      landed();
      await faulty.settle();
      checkEqual(await state(store, 'd'), 'late', 'the row once the late call landed');
      checkEqual(faulty.stats.writesLate, 1, 'late calls that wrote counted');
      // A late CAS that the store refuses when it lands wrote nothing.
      faulty.inject({ kind: 'late', operation: 'checkAndSet', delayMs: 1 });
      await rejection(
        () => faulty.checkAndSet({ table: T, key: 'd', expected: null, state: bytes('again') }),
        'a late CAS that will be refused',
      );
      await faulty.settle();
      checkEqual(faulty.stats.late, 2, 'late calls counted');
      checkEqual(faulty.stats.writesLate, 1, 'late calls that wrote counted, the refused one not');
      checkEqual(await state(store, 'd'), 'late', 'the row after the refused late CAS');
    },
  },
  {
    part: 'faults',
    name: 'FaultyStore: random faults repeat exactly from the seed',
    async run(ctx) {
      const random = { failBefore: 0.2, failAfter: 0.2, delay: 0.2, maxDelayMs: 1 };
      const trace = async (seed: number) => {
        const faulty = new FaultyStore(await ctx.createStore(), { seed, random });
        const outcomes: string[] = [];
        for (let i = 0; i < 40; i++) {
          try {
            await faulty.checkAndSet({ table: T, key: `k${i}`, expected: null, state: bytes('v') });
            outcomes.push('ok');
          } catch (error) {
            outcomes.push(error instanceof StoreError ? error.applied : 'other');
          }
        }
        return { outcomes, log: faulty.log.map((e) => `${e.call.number}:${e.kind}:${e.delayMs ?? ''}`) };
      };
      const a = await trace(ctx.seed);
      const b = await trace(ctx.seed);
      checkEqual(b, a, 'two runs with the same seed');
      check(
        a.outcomes.includes('no') && a.outcomes.includes('unknown'),
        'random faults of both kinds happen',
      );
      const c = await trace(ctx.seed + 1);
      check(JSON.stringify(c) !== JSON.stringify(a), 'a different seed gives different faults');
    },
  },
];
