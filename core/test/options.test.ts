import { InvalidArgumentError, MemoryStore, Percolator, type PercolatorOptions } from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { InstrumentedStore } from './support.js';

/** Node's timers keep at most this many ms; a longer delay fires after 1 ms. */
const MAX_TIMER_MS = 2 ** 31 - 1;

describe('client options: every one checked at construction, the error names it', () => {
  const store = new MemoryStore({ maxStateBytes: 1024 * 1024 });
  const bad: Array<[string, Record<string, unknown>]> = [
    ['lockWaitMs', { lockWaitMs: -5 }],
    ['lockWaitMs', { lockWaitMs: 'abc' }],
    ['lockWaitMs', { lockWaitMs: Number.NaN }],
    ['lockWaitMs', { lockWaitMs: 1.5 }],
    ['lockWaitMs', { lockWaitMs: MAX_TIMER_MS + 1 }],
    ['lockTtlMs', { lockTtlMs: 2 ** 40 }],
    ['lockTtlMs', { lockTtlMs: 1e300 }],
    ['lockTtlMs', { lockTtlMs: MAX_TIMER_MS + 1 }],
    ['clock', { clock: 'x' }],
    ['clock', { clock: 42 }],
    ['clock', { clock: null }],
    ['hooks', { hooks: 5 }],
    ['hooks', { hooks: null }],
    ['hooks.onCommitStep', { hooks: { onCommitStep: 1 } }],
    ['onCommitstep', { hooks: { onCommitstep: () => undefined } }],
    ['gc.retentionMs', { gc: { retentionMs: '5' } }],
    ['gc.retentionMs', { gc: { retentionMs: Number.NaN } }],
    ['gc.retentionMs', { gc: { retentionMs: -1 } }],
    ['gc.retentionMs', { gc: { retentionMs: 1.5 } }],
    ['gc.maxVersionsPerCell', { gc: { maxVersionsPerCell: 0 } }],
    ['gc.maxVersionsPerCell', { gc: { maxVersionsPerCell: 2.5 } }],
    ['gc.inlineHistoryBytes', { gc: { inlineHistoryBytes: -1 } }],
    ['gc.versionBlockBytes', { gc: { versionBlockBytes: 1e12 } }],
    ['gc.versionBlockBytes', { gc: { versionBlockBytes: 1024 * 1024 + 1 } }],
    ['rowCacheBytes', { rowCacheBytes: '8' }],
    ['onePhaseMaxRows', { onePhaseMaxRows: 0 }],
    ['sharedCallsInFlight', { sharedCallsInFlight: 0 }],
    ['sharedCallsInFlight', { sharedCallsInFlight: 65 }],
    ['sharedCallsInFlight', { sharedCallsInFlight: 1.5 }],
    ['sharedCallsInFlight', { sharedCallsInFlight: '3' }],
    ['observedColumns', { observedColumns: {} }],
    ['observedColumns', { observedColumns: 'ab' }],
    ['observedColumns[0]', { observedColumns: [null] }],
    ['observedColumns[1]', { observedColumns: [{ table: 't', column: 'c' }, { table: 't' }] }],
    ['observedColumns[0]', { observedColumns: [{ table: 't', colum: 'd' }] }],
    ['observedColumns[0]', { observedColumns: [{ table: 'bad table', column: 'c' }] }],
  ];
  for (const [name, options] of bad) {
    it(`${JSON.stringify(options)}: InvalidArgumentError naming ${name}`, () => {
      let failure: unknown;
      try {
        new Percolator({ store, ...options } as unknown as PercolatorOptions);
      } catch (error) {
        failure = error;
      }
      expect(failure).toBeInstanceOf(InvalidArgumentError);
      expect((failure as Error).message).toContain(name);
    });
  }

  it('the bounds themselves, and the documented special values, are accepted', async () => {
    const good: Partial<PercolatorOptions>[] = [
      { lockTtlMs: MAX_TIMER_MS }, // its default lockWaitMs (2 x lockTtlMs) is capped at the timers' range
      { lockWaitMs: 0 },
      { lockWaitMs: MAX_TIMER_MS },
      { gc: { retentionMs: Number.POSITIVE_INFINITY, maxVersionsPerCell: Number.MAX_SAFE_INTEGER } },
      { gc: { versionBlockBytes: 0, inlineHistoryBytes: 0 } },
      { gc: { versionBlockBytes: 1024 * 1024 } },
      { clock: () => Date.now(), hooks: {} },
      { hooks: { onCommitStep: () => undefined }, observedColumns: [] },
    ];
    for (const options of good) {
      const db = new Percolator({ store, ...options });
      await db.transact(async (tx) => tx.set('t', 'r', 'c', 'v'));
      await db.close();
    }
  });
});

describe('the options of calls: a misspelt key or a bad value is refused, nothing done', () => {
  it('db.tidy, db.resolveLocks and db.gc', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    await db.transact(async (tx) => tx.set('t', 'r', 'c', 'v'));
    const bad: [string, () => Promise<unknown>, RegExp][] = [
      ['tidy forced', () => db.tidy('t', 'r', { forced: true } as never), /unknown option "forced"/],
      ['tidy force "yes"', () => db.tidy('t', 'r', { force: 'yes' } as never), /force must be a boolean/],
      [
        'resolveLocks waitms',
        () => db.resolveLocks('t', 'r', { waitms: 5 } as never),
        /did you mean "waitMs"/,
      ],
      ['resolveLocks waitMs -1', () => db.resolveLocks('t', 'r', { waitMs: -1 }), /waitMs/],
      ['resolveLocks waitMs "x"', () => db.resolveLocks('t', 'r', { waitMs: 'x' } as never), /waitMs/],
      ['resolveLocks waitMs NaN', () => db.resolveLocks('t', 'r', { waitMs: Number.NaN }), /waitMs/],
      ['resolveLocks signal', () => db.resolveLocks('t', 'r', { signal: 'x' } as never), /AbortSignal/],
      [
        'gc dryRun "false"',
        () => db.gc('t', { row: 'r', dryRun: 'false' } as never),
        /dryRun must be a boolean/,
      ],
    ];
    for (const [name, call, message] of bad) {
      const failure = await call().catch((e: unknown) => e);
      expect(failure, name).toBeInstanceOf(InvalidArgumentError);
      expect((failure as Error).message, name).toMatch(message);
    }
    expect(await db.resolveLocks('t', 'r', { waitMs: 0 })).toEqual([]);
    expect((await db.tidy('t', 'r', { force: true })).moved).toBeGreaterThanOrEqual(0);
    await db.close();
  });

  it('new MemoryStore', () => {
    expect(() => new MemoryStore({ maxStateByte: 10 } as never)).toThrow(/unknown option "maxStateByte"/);
    for (const maxStateBytes of [-1, 0, 1.5, Number.NaN, '10'])
      expect(() => new MemoryStore({ maxStateBytes } as never), String(maxStateBytes)).toThrow(
        InvalidArgumentError,
      );
    expect(new MemoryStore({ maxStateBytes: 4096 }).capabilities.maxStateBytes).toBe(4096);
    for (const sharedCallsInFlight of [0, 65, 1.5, Number.NaN, '3'])
      expect(() => new MemoryStore({ sharedCallsInFlight } as never), String(sharedCallsInFlight)).toThrow(
        /MemoryStore sharedCallsInFlight must be an integer from 1 to 64/,
      );
    expect(new MemoryStore({ sharedCallsInFlight: 3 }).capabilities.sharedCallsInFlight).toBe(3);
    expect(new MemoryStore().capabilities.sharedCallsInFlight).toBeUndefined();
  });

  it("a store's sharedCallsInFlight out of range is a typed error at new Percolator, which sends nothing", () => {
    for (const sharedCallsInFlight of [0, 65, 2.5, Number.NaN, '3']) {
      const store = new InstrumentedStore(new MemoryStore(), { sharedCallsInFlight } as never);
      expect(() => new Percolator({ store }), String(sharedCallsInFlight)).toThrow(
        /store\.capabilities\.sharedCallsInFlight must be an integer from 1 to 64/,
      );
      expect(Object.values(store.calls).every((n) => n === 0)).toBe(true);
    }
  });
});

describe('inputs a review found accepted or failing untyped', () => {
  it("a clock's readings are checked before use: a bad one fails the call with InvalidArgumentError and writes nothing", async () => {
    for (const reading of [Number.POSITIVE_INFINITY, -1, Number.NaN, 2 ** 56, '1700000000000', undefined]) {
      const store = new MemoryStore();
      const db = new Percolator({ store, clock: () => reading as number, onePhaseMaxRows: 1 });
      const tx = await db.begin();
      tx.set('t', 'a', 'v', '1');
      tx.set('t', 'b', 'v', '2');
      // Infinity looped the encoder for ever; -1 and 2^56 wrote rows no read could decode.
      const error = await tx.commit().catch((e: unknown) => e);
      expect(error, String(reading)).toBeInstanceOf(InvalidArgumentError);
      expect(String(error)).toMatch(/clock returned .*a wall time must be milliseconds/);
      expect(await store.read('t', 'a'), String(reading)).toBeNull();
      await db.close();
    }
    // A fraction is a fine clock (performance.timeOrigin + performance.now()): rounded down.
    const store = new MemoryStore();
    const db = new Percolator({ store, clock: () => performance.timeOrigin + performance.now() });
    await db.transact(async (tx) => tx.set('t', 'a', 'v', 'x'));
    expect(await db.transact((tx) => tx.getString('t', 'a', 'v'))).toBe('x');
    await db.close();
  });

  it('a store that is not one (a forgotten await, an empty object) and a transact of no function: typed errors', async () => {
    expect(() => new Percolator({ store: Promise.resolve(new MemoryStore()) as never })).toThrow(
      /was given a Promise: await the store factory/,
    );
    for (const store of [{}, { read: () => null }, null, 'memory'])
      expect(() => new Percolator({ store: store as never }), JSON.stringify(store)).toThrow(
        InvalidArgumentError,
      );
    const store = new InstrumentedStore();
    const db = new Percolator({ store });
    await expect(db.transact('not a function' as never)).rejects.toBeInstanceOf(InvalidArgumentError);
    expect(store.calls.incrementCounter + store.calls.readStamped + store.calls.readPeeked).toBe(0);
    await db.close();
  });

  it('worker options: unknown keys, non-boolean weak, non-function callbacks, numbers past the timers, runUntilIdle timeoutMs', async () => {
    const db = new Percolator({ store: new MemoryStore() });
    const observer = { name: 'o', table: 't', column: 'c', handler: async () => {} };
    const bad: [string, Record<string, unknown>][] = [
      ['concurency', { concurency: 2 }],
      ['leaseMS', { leaseMS: 100 }],
      ['retry', { retry: { base: 5 } }],
      ['weak', { observers: [{ ...observer, weak: 'false' }] }],
      ['weak', { observers: [{ ...observer, weakly: true }] }],
      ['onError', { onError: 'x' }],
      ['onRun', { onRun: 1 }],
      ['clock', { clock: 5 }],
      ['idlePollMs', { idlePollMs: 3e9 }],
      ['leaseMs', { leaseMs: 6.5e9 }],
      ['retry.maxMs', { retry: { maxMs: 2 ** 31 } }],
      ['concurrency', { concurrency: 1e6 }],
      ['leaseMs', { leaseMs: 1.5 }],
    ];
    for (const [name, options] of bad)
      expect(() => db.worker({ observers: [observer], ...options } as never), name).toThrow(
        InvalidArgumentError,
      );
    const worker = db.worker({ observers: [observer] });
    for (const options of [
      { timeoutMs: Number.NaN },
      { timeoutMs: '1000' },
      { timeout: 5 },
      { timeoutMs: -1 },
    ])
      await expect(worker.runUntilIdle(options as never), JSON.stringify(options)).rejects.toBeInstanceOf(
        InvalidArgumentError,
      );
    await worker.runUntilIdle({ timeoutMs: 1000 });
    await db.close();
  });
});
