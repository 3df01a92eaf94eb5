/**
 * The arguments part of the store contract (docs/writing-an-adapter.md, "What the core
 * checks"): what a store accepts, and that everything else is refused with
 * InvalidArgumentError before anything is sent. Stores reach the cases behind the core's
 * contract check (`checkedStore`), as they reach the core, so these hold for every store;
 * an adapter that hands out an unchecked store fails them.
 */
import { InvalidArgumentError, type RowStore, STAMP_OFFSET } from '@percolator/core';
import type { ConformanceCase } from '../types.js';
import { bytes, check, checkEqual, errorText, rejection } from '../util.js';
import { checkCurrent, create, expectRow, T } from './store-helpers.js';

type Call = readonly [what: string, call: (store: RowStore) => Promise<unknown>];

const state = bytes('x');

/** Every call here is bad in exactly one way; each must be refused with InvalidArgumentError. */
function badCalls(store: RowStore): Call[] {
  const calls: Call[] = [
    ['read of a table name with a space', (s) => s.read('bad table', 'k')],
    ['read of an empty table name', (s) => s.read('', 'k')],
    ['read of a 65-character table name', (s) => s.read('x'.repeat(65), 'k')],
    ['read of an empty key', (s) => s.read(T, '')],
    ['read of a 1025-byte key', (s) => s.read(T, 'x'.repeat(1025))],
    ['read of a key with a lone surrogate', (s) => s.read(T, 'k\ud800')],
    ['read of a key that is not a string', (s) => s.read(T, 7 as unknown as string)],
    [
      'CAS on a table name with a metacharacter',
      (s) => s.checkAndSet({ table: 't;drop', key: 'k', expected: null, state }),
    ],
    [
      'CAS of a key with a lone surrogate',
      (s) => s.checkAndSet({ table: T, key: '\udfff', expected: null, state }),
    ],
    [
      'CAS with a string state',
      (s) => s.checkAndSet({ table: T, key: 'k', expected: null, state: 'text' as unknown as Uint8Array }),
    ],
    [
      'CAS expecting the empty version (no store issues one)',
      (s) => s.checkAndSet({ table: T, key: 'k', expected: '', state }),
    ],
    [
      'CAS expecting a version that is not a string',
      (s) => s.checkAndSet({ table: T, key: 'k', expected: 7 as unknown as string, state }),
    ],
    [
      'CAS with a notified flag that is not a boolean',
      (s) =>
        s.checkAndSet({ table: T, key: 'k', expected: null, state, notified: 'yes' as unknown as boolean }),
    ],
    ['CAS of no request', (s) => s.checkAndSet(null as never)],
  ];
  const caps = store.capabilities;
  if (caps.batchRead && store.readMany) {
    calls.push(
      ['readMany of no array', (s) => s.readMany!('t' as never)],
      [
        'readMany with one bad key',
        (s) =>
          s.readMany!([
            { table: T, key: 'ok' },
            { table: T, key: '' },
          ]),
      ],
    );
  }
  if (caps.batchCheckAndSet && store.checkAndSetMany) {
    calls.push([
      'checkAndSetMany with one bad request (none may be applied)',
      (s) =>
        s.checkAndSetMany!([
          { table: T, key: 'arg-batch', expected: null, state },
          { table: T, key: '', expected: null, state },
        ]),
    ]);
  }
  if (caps.orderedScan && store.scan) {
    calls.push(
      ['scan with a negative limit', (s) => s.scan!(T, { limit: -1 })],
      ['scan with a fractional limit', (s) => s.scan!(T, { limit: 1.5 })],
      ['scan with no options', (s) => s.scan!(T, undefined as never)],
      ['scan with a lone surrogate bound', (s) => s.scan!(T, { limit: 1, start: '\ud800' })],
      ['scan of a bad table name', (s) => s.scan!('bad table', { limit: 1 })],
    );
  }
  if (caps.notificationIndex && store.scanNotified) {
    calls.push(
      ['scanNotified with a negative limit', (s) => s.scanNotified!(T, { limit: -1 })],
      [
        'scanNotified after a bound that is not a string',
        (s) => s.scanNotified!(T, { after: 3 as never, limit: 1 }),
      ],
    );
  }
  if (caps.atomicCounter && store.incrementCounter) {
    calls.push(
      ['incrementCounter by 0', (s) => s.incrementCounter!('c', 0)],
      ['incrementCounter by 1.5', (s) => s.incrementCounter!('c', 1.5)],
      ['incrementCounter of an empty name', (s) => s.incrementCounter!('', 1)],
      ['incrementCounter of a name with a lone surrogate', (s) => s.incrementCounter!('c\ud800', 1)],
    );
  }
  if (caps.stampedCheckAndSet && store.checkAndSetStamped) {
    calls.push(
      [
        'stamped CAS of a state shorter than the stamp slot',
        (s) =>
          s.checkAndSetStamped!(
            { table: T, key: 'k', expected: null, state: new Uint8Array(STAMP_OFFSET + 7) },
            'arg.counter',
          ),
      ],
      [
        'stamped CAS of a null state',
        (s) =>
          s.checkAndSetStamped!({ table: T, key: 'k', expected: null, state: null as never }, 'arg.counter'),
      ],
      [
        'stamped CAS drawing from an empty counter name',
        (s) => s.checkAndSetStamped!({ table: T, key: 'k', expected: null, state: new Uint8Array(16) }, ''),
      ],
    );
  }
  if (caps.stampedRead === true && store.readStamped) {
    calls.push(
      ['stamped read of a bad key', (s) => s.readStamped!([{ table: T, key: '' }], 'arg.counter')],
      [
        'stamped read drawing from an empty counter name',
        (s) => s.readStamped!([{ table: T, key: 'k' }], ''),
      ],
    );
  }
  if (caps.peekedRead === true && store.readPeeked) {
    calls.push(
      ['peeked read of a bad key', (s) => s.readPeeked!([{ table: T, key: '' }], 'arg.counter')],
      ['peeked read of an empty counter name', (s) => s.readPeeked!([{ table: T, key: 'k' }], '')],
    );
  }
  return calls;
}

export const argumentCases: ConformanceCase[] = [
  {
    part: 'store',
    name: 'bad arguments are refused with InvalidArgumentError before anything is sent; a batch with one bad request changes nothing',
    async run(ctx) {
      const store = await ctx.createStore();
      for (const [what, call] of badCalls(store)) {
        const error = await rejection(() => call(store), what);
        check(
          error instanceof InvalidArgumentError,
          () => `${what} must be refused with InvalidArgumentError, got ${errorText(error)}`,
        );
      }
      checkEqual(await store.read(T, 'k'), null, 'a refused CAS must write nothing');
      checkEqual(await store.read(T, 'arg-batch'), null, 'a refused checkAndSetMany must write nothing');
      // The limits are inclusive: a 1024-byte key and a 64-character table name are fine.
      checkEqual(await store.read(T, 'é'.repeat(512)), null, 'read of a 1024-byte key');
      checkEqual(await store.read('x'.repeat(64), 'k'), null, 'read of a 64-character table name');
      if (store.capabilities.atomicCounter && store.incrementCounter) {
        checkEqual(
          await store.incrementCounter('c\u0000other 😀', 3),
          3,
          'a counter name with NUL and emoji',
        );
      }
    },
  },
  {
    part: 'store',
    name: 'a version the store never issued matches no row; expected null with state null succeeds only on an absent row',
    async run(ctx) {
      const store = await ctx.createStore();
      const v = await create(store, T, 'foreign', bytes('f'));
      for (const foreign of [
        'abc',
        `0${v}`,
        `${v}0`,
        '99999999999999999999999',
        '-1',
        ' ',
        'x'.repeat(300),
      ]) {
        const result = await store.checkAndSet({
          table: T,
          key: 'foreign',
          expected: foreign,
          state: bytes('x'),
        });
        check(!result.ok, `a CAS expecting ${JSON.stringify(foreign).slice(0, 40)} (never issued) must fail`);
        if (!result.ok)
          checkCurrent(result.current, await store.read(T, 'foreign'), 'CAS with a foreign version');
        const removed = await store.checkAndSet({ table: T, key: 'foreign', expected: foreign, state: null });
        check(
          !removed.ok,
          `a delete expecting ${JSON.stringify(foreign).slice(0, 40)} (never issued) must fail`,
        );
      }
      await expectRow(store, T, 'foreign', v, bytes('f'));

      const absent = await store.checkAndSet({ table: T, key: 'absent', expected: null, state: null });
      check(absent.ok, 'expected null with state null on an absent row must succeed');
      checkEqual(await store.read(T, 'absent'), null, '"must be absent" must not create the row');
      const present = await store.checkAndSet({ table: T, key: 'foreign', expected: null, state: null });
      check(!present.ok, 'expected null with state null on a present row must fail');
      if (!present.ok)
        checkCurrent(present.current, await store.read(T, 'foreign'), '"must be absent" on a row');
      await expectRow(store, T, 'foreign', v, bytes('f'));
    },
  },
  {
    part: 'store',
    name: 'a scan or notification scan with limit 0 returns no rows',
    async run(ctx) {
      const store = await ctx.createStore();
      await create(store, T, 'one', bytes('1'));
      if (store.capabilities.orderedScan && store.scan) {
        checkEqual(await store.scan(T, { limit: 0 }), [], 'scan with limit 0');
      }
      if (store.capabilities.notificationIndex && store.scanNotified) {
        await store.checkAndSet({ table: T, key: 'n', expected: null, state: bytes('n'), notified: true });
        checkEqual(await store.scanNotified(T, { limit: 0 }), [], 'scanNotified with limit 0');
      }
    },
  },
];
