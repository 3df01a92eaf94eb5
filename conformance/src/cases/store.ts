/**
 * Part 1, the store contract (docs/protocol.md section 1), checked with raw store calls; two
 * cases go through the core, to check what a user sees (typed size errors, round trips).
 * The optional capabilities are in capabilities.ts.
 */
import {
  InvalidArgumentError,
  MAX_VALUE_BYTES,
  Percolator,
  type RowStore,
  RowTooLargeError,
} from '@percolator/core';
import type { ConformanceCase } from '../types.js';
import {
  bytes,
  check,
  checkEqual,
  errorText,
  format,
  pool,
  rejection,
  sameBytes,
  show,
  text,
} from '../util.js';
import {
  ALL_BYTES,
  checkCurrent,
  create,
  expectRow,
  LARGE_CAP,
  mustRead,
  noise,
  OTHER,
  oracleOption,
  PAST_LIMIT_CAP,
  T,
  TRICKY_KEYS,
} from './store-helpers.js';

export const storeCases: ConformanceCase[] = [
  {
    part: 'store',
    name: 'read of a missing row returns null',
    async run(ctx) {
      const store = await ctx.createStore();
      checkEqual(await store.read(T, 'missing'), null, 'read of a row never written');
    },
  },
  {
    part: 'store',
    name: 'create, read, check-and-set, delete',
    async run(ctx) {
      const store = await ctx.createStore();
      const v1 = await create(store, T, 'row', bytes('one'));
      check(
        typeof v1 === 'string' && v1.length > 0,
        `a CAS must return a non-empty version string, got ${format(v1)}`,
      );
      await expectRow(store, T, 'row', v1, bytes('one'));

      const again = await store.checkAndSet({ table: T, key: 'row', expected: null, state: bytes('dup') });
      check(!again.ok, 'creating a row that already exists (expected=null) must fail');
      if (!again.ok) checkCurrent(again.current, await store.read(T, 'row'), 'create over an existing row');
      await expectRow(store, T, 'row', v1, bytes('one'));

      // The same bytes again: the version must change all the same.
      const same = await store.checkAndSet({ table: T, key: 'row', expected: v1, state: bytes('one') });
      check(same.ok, 'CAS with the current version must succeed');
      check(same.version !== v1, 'a CAS that writes the same bytes must still return a new version');
      const r2 = await store.checkAndSet({
        table: T,
        key: 'row',
        expected: same.version,
        state: bytes('two'),
      });
      check(r2.ok, 'CAS with the current version must succeed');
      check(r2.version !== v1 && r2.version !== same.version, 'a successful CAS must return a new version');
      await expectRow(store, T, 'row', r2.version, bytes('two'));

      const del = await store.checkAndSet({ table: T, key: 'row', expected: r2.version, state: null });
      check(del.ok, 'delete with the current version must succeed');
      checkEqual(await store.read(T, 'row'), null, 'read after delete');

      const delAgain = await store.checkAndSet({ table: T, key: 'row', expected: r2.version, state: null });
      check(!delAgain.ok, 'deleting an already deleted row with its old version must fail');
      if (!delAgain.ok) checkCurrent(delAgain.current, null, 'delete of a deleted row');
    },
  },
  {
    part: 'store',
    name: 'a stale version fails and changes nothing',
    async run(ctx) {
      const store = await ctx.createStore();
      const v1 = await create(store, T, 'k', bytes('v1'));
      const r2 = await store.checkAndSet({ table: T, key: 'k', expected: v1, state: bytes('v2') });
      check(r2.ok, 'CAS with the current version must succeed');
      const stale = await store.checkAndSet({ table: T, key: 'k', expected: v1, state: bytes('stale') });
      check(!stale.ok, 'CAS with a stale version must fail');
      if (!stale.ok) checkCurrent(stale.current, await store.read(T, 'k'), 'stale CAS');
      const staleDelete = await store.checkAndSet({ table: T, key: 'k', expected: v1, state: null });
      check(!staleDelete.ok, 'delete with a stale version must fail');
      const made = await store.checkAndSet({ table: T, key: 'never', expected: v1, state: bytes('x') });
      check(!made.ok, 'CAS with a version on an absent row must fail');
      checkEqual(await store.read(T, 'never'), null, 'a failed CAS on an absent row must not create it');
      await expectRow(store, T, 'k', r2.version, bytes('v2'));
    },
  },
  {
    part: 'store',
    name: 'a version is never reused after delete and re-create (ABA)',
    async run(ctx) {
      const store = await ctx.createStore();
      const seen: string[] = [];
      // The same bytes every time: a version derived from the content (a hash, an ETag)
      // repeats with them, which protocol.md section 1 forbids (found in review: each
      // cycle wrote other bytes, so such a store passed).
      for (let cycle = 0; cycle < 6; cycle++) {
        const v1 = await create(store, T, 'aba', bytes('same'));
        const r = await store.checkAndSet({ table: T, key: 'aba', expected: v1, state: bytes('same') });
        check(r.ok, 'update with the current version must succeed');
        for (const v of [v1, r.version]) {
          check(!seen.includes(v), `version ${format(v)} was returned twice for one key (cycle ${cycle})`);
          seen.push(v);
        }
        for (const old of seen.slice(0, -1)) {
          const stale = await store.checkAndSet({
            table: T,
            key: 'aba',
            expected: old,
            state: bytes('ABA!'),
          });
          check(
            !stale.ok,
            `a CAS with old version ${format(old)} succeeded after delete and re-create (ABA)`,
          );
        }
        const del = await store.checkAndSet({ table: T, key: 'aba', expected: r.version, state: null });
        check(del.ok, 'delete with the current version must succeed');
        for (const old of seen) {
          const ghost = await store.checkAndSet({
            table: T,
            key: 'aba',
            expected: old,
            state: bytes('ghost'),
          });
          check(!ghost.ok, `a CAS with version ${format(old)} succeeded on a deleted row`);
        }
      }
    },
  },
  {
    part: 'store',
    name: 'concurrent CAS on one row: exactly one winner per version',
    async run(ctx) {
      const store = await ctx.createStore();
      const writers = Math.max(4, ctx.scaled(16));
      const rounds = ctx.scaled(12, 3);
      // Creation races too: exactly one create wins.
      const creates = await Promise.all(
        Array.from({ length: writers }, (_, i) =>
          store.checkAndSet({ table: T, key: 'race', expected: null, state: bytes(`w${i}`) }),
        ),
      );
      const createWinners = creates.flatMap((r, i) => (r.ok ? [i] : []));
      checkEqual(createWinners.length, 1, `winners among ${writers} concurrent creates of one row`);
      let current = await expectWinner(store, creates, createWinners[0]!, 'w');
      for (let round = 0; round < rounds; round++) {
        const results = await Promise.all(
          Array.from({ length: writers }, (_, i) =>
            store.checkAndSet({ table: T, key: 'race', expected: current, state: bytes(`r${round}w${i}`) }),
          ),
        );
        const winners = results.flatMap((r, i) => (r.ok ? [i] : []));
        checkEqual(
          winners.length,
          1,
          `winners among ${writers} concurrent CAS on version ${current} (round ${round})`,
        );
        current = await expectWinner(store, results, winners[0]!, `r${round}w`);
      }
      const deletes = await Promise.all(
        Array.from({ length: writers }, () =>
          store.checkAndSet({ table: T, key: 'race', expected: current, state: null }),
        ),
      );
      checkEqual(deletes.filter((r) => r.ok).length, 1, 'winners among concurrent deletes');
      checkEqual(await store.read(T, 'race'), null, 'read after the winning delete');

      async function expectWinner(
        s: RowStore,
        results: readonly { ok: boolean; version?: string }[],
        winner: number,
        prefix: string,
      ): Promise<string> {
        const row = await mustRead(s, T, 'race');
        const version = (results[winner] as { version: string }).version;
        checkEqual(row.version, version, 'the row version after a race is the winner version');
        checkEqual(text(row.state), `${prefix}${winner}`, 'the row state after a race is the winner state');
        return version;
      }
    },
  },
  {
    part: 'store',
    name: 'binary and Unicode keys and values (NUL bytes, emoji, empty value)',
    async run(ctx) {
      const store = await ctx.createStore();
      const values = [
        new Uint8Array(0),
        Uint8Array.of(0),
        Uint8Array.of(0, 0, 0),
        ALL_BYTES,
        Uint8Array.of(0xff, 0xfe, 0xc0, 0x80), // not UTF-8
        bytes('🦄 é \u0000 中'),
      ];
      const tables = [T, OTHER];
      const written = new Map<string, { version: string; state: Uint8Array }>();
      for (const [i, key] of TRICKY_KEYS.entries()) {
        for (const table of tables) {
          const state =
            i % 7 === 0 ? new Uint8Array(0) : Uint8Array.of(...values[i % values.length]!, i, table.length);
          const version = await create(store, table, key, state);
          written.set(`${table}\u0001${key}`, { version, state });
        }
      }
      for (const key of TRICKY_KEYS) {
        for (const table of tables) {
          const { version, state } = written.get(`${table}\u0001${key}`)!;
          const row = await store.read(table, key);
          check(row !== null, `read(${table}, ${format(key)}) returned null`);
          check(
            row.version === version,
            `key ${format(key)} in ${table}: version ${row.version}, expected ${version}`,
          );
          check(
            sameBytes(row.state, state),
            () => `key ${format(key)} in ${table}: state ${show(row.state)}, expected ${show(state)}`,
          );
          check(row.state instanceof Uint8Array, `read must return the state as a Uint8Array`);
        }
      }
      // Every value shape round-trips through an update too, the empty value included.
      let version = written.get(`${T}\u0001plain`)!.version;
      for (const value of values) {
        const r = await store.checkAndSet({ table: T, key: 'plain', expected: version, state: value });
        check(r.ok, 'update with the current version must succeed');
        version = r.version;
        await expectRow(store, T, 'plain', version, value);
      }
      checkEqual(await store.read(T, 'a\u0000\u0000'), null, 'a key that differs only by a trailing NUL');
      checkEqual(await store.read(T, 'A'), null, 'keys are case-sensitive');
      checkEqual(await store.read(T, '\u0065\u0301\u0301'), null, 'keys are not Unicode-normalised');
    },
  },
  {
    part: 'store',
    name: 'states are copied: reusing the buffer passed to a CAS changes nothing stored',
    async run(ctx) {
      const store = await ctx.createStore();
      const input = bytes('original');
      const v = await create(store, T, 'copy', input);
      input.fill(0x21);
      const first = await mustRead(store, T, 'copy');
      checkEqual(text(first.state), 'original', 'state after the caller reused its buffer');
      // The core never changes a state it read, so a store may hand out its own buffer;
      // say so, since a direct caller of the store could be surprised.
      first.state.fill(0x3f);
      const second = await mustRead(store, T, 'copy');
      if (text(second.state) !== 'original') {
        ctx.note('read returns the stored buffer itself: changing it changes the stored state (allowed)');
      }
      check(second.version === v, 'the version changed without a CAS');
    },
  },
  {
    part: 'store',
    name: 'a state of maxStateBytes (up to 64 MiB) is stored and read back exactly',
    timeoutMs: 120_000,
    async run(ctx) {
      const store = await ctx.createStore();
      const limit = store.capabilities.maxStateBytes;
      check(
        Number.isFinite(limit) && limit > 0,
        `capabilities.maxStateBytes must be a positive number, got ${limit}`,
      );
      const size = Math.min(limit, LARGE_CAP);
      if (size < limit) ctx.note(`maxStateBytes is ${limit}; tested ${size} bytes (the suite's cap)`);
      else ctx.note(`tested the full maxStateBytes: ${size} bytes`);
      const state = noise(size, ctx.random);
      const v = await create(store, T, 'large', state);
      await expectRow(store, T, 'large', v, state);
      const next = noise(size, ctx.random);
      const r = await store.checkAndSet({ table: T, key: 'large', expected: v, state: next });
      check(r.ok, 'replacing a large state must succeed');
      await expectRow(store, T, 'large', r.version, next);
    },
  },
  {
    part: 'store',
    name: 'a state one byte past maxStateBytes fails with RowTooLargeError and is not stored',
    timeoutMs: 120_000,
    async run(ctx) {
      const store = await ctx.createStore();
      const limit = store.capabilities.maxStateBytes;
      check(
        limit <= PAST_LIMIT_CAP,
        `maxStateBytes is ${limit}: the suite builds states past the limit only up to ${PAST_LIMIT_CAP} bytes`,
      );
      const tooBig = new Uint8Array(limit + 1).fill(7);
      const expectTooLarge = (error: unknown, what: string) =>
        check(
          error instanceof RowTooLargeError,
          () => `${what}: expected RowTooLargeError (from @percolator/core), got ${errorText(error)}`,
        );
      const createError = await rejection(
        () => store.checkAndSet({ table: T, key: 'huge', expected: null, state: tooBig }),
        `creating a row with ${limit + 1} bytes (maxStateBytes ${limit})`,
      );
      expectTooLarge(createError, `creating a row with ${limit + 1} bytes`);
      checkEqual(await store.read(T, 'huge'), null, 'an oversized create must not store anything');
      const v = await create(store, T, 'huge', bytes('small'));
      const updateError = await rejection(
        () => store.checkAndSet({ table: T, key: 'huge', expected: v, state: tooBig }),
        `updating a row to ${limit + 1} bytes`,
      );
      expectTooLarge(updateError, `updating a row to ${limit + 1} bytes`);
      await expectRow(store, T, 'huge', v, bytes('small'));
    },
  },
  {
    part: 'store',
    name: 'through the core: a large value commits, one past the limit fails with a typed error',
    timeoutMs: 120_000,
    async run(ctx) {
      const store = await ctx.createStore();
      // Short lock waits: a broken store must fail this case quickly, not hang it.
      const db = new Percolator({ store, lockTtlMs: 500, lockWaitMs: 1000, ...oracleOption(store) });
      ctx.defer(() => db.close());
      const limit = store.capabilities.maxStateBytes;
      // A row also holds a lock, a write record and encoding overhead: a quarter fits.
      const fits = noise(Math.floor(Math.min(MAX_VALUE_BYTES, limit) / 4), ctx.random);
      await db.transact(async (tx) => tx.set('big', 'ok', 'v', fits), { maxAttempts: 3 });
      const back = await db.transact(async (tx) => tx.get('big', 'ok', 'v'), { maxAttempts: 3 });
      check(sameBytes(back, fits), `a ${fits.length}-byte value did not read back intact`);

      await db.transact(async (tx) => tx.set('big', 'edge', 'v', 'before'));
      const size = Math.min(limit, MAX_VALUE_BYTES) + 1;
      const error = await rejection(async () => {
        const tx = await db.begin();
        try {
          tx.set('big', 'edge', 'v', new Uint8Array(size).fill(1));
          await tx.commit();
        } catch (e) {
          await tx.rollback().catch(() => undefined);
          throw e;
        }
      }, `committing a ${size}-byte value (maxStateBytes ${limit}, value limit ${MAX_VALUE_BYTES})`);
      check(
        error instanceof RowTooLargeError || error instanceof InvalidArgumentError,
        () =>
          `a value past the limit must fail with RowTooLargeError or InvalidArgumentError, got ${errorText(error)}`,
      );
      const after = await db.transact(async (tx) => tx.getString('big', 'edge', 'v'));
      checkEqual(after, 'before', 'the row after a rejected oversized write');
      await db.transact(async (tx) => tx.set('big', 'edge', 'v', 'after'));
      checkEqual(await db.transact(async (tx) => tx.getString('big', 'edge', 'v')), 'after', 'a later write');
    },
  },
  {
    part: 'store',
    name: 'through the core: binary and Unicode keys, columns and values round-trip',
    async run(ctx) {
      const store = await ctx.createStore();
      const options = { store, lockTtlMs: 500, lockWaitMs: 1000, ...oracleOption(store) };
      const db = new Percolator(options);
      ctx.defer(() => db.close());
      // onePhaseMaxRows 1: every transaction of several rows commits in two phases, so its
      // locks and commit records name a tricky key as their primary.
      const twoPhase = new Percolator({ ...options, onePhaseMaxRows: 1 });
      ctx.defer(() => twoPhase.close());
      const columns = ['c', 'colonne é', '列 🦄', 'nul\u0000col', '\uFEFFcol'];
      const unique = [...new Set(TRICKY_KEYS)];
      const cells = unique.map((key, i) => ({
        key,
        column: columns[i % columns.length]!,
        value: i % 5 === 0 ? new Uint8Array(0) : Uint8Array.of(0, i, 0xff, ...bytes(key).slice(0, 16)),
      }));
      for (const [table, client] of [
        ['core.rows', db],
        ['core.rows2', twoPhase],
      ] as const) {
        // Several rows per transaction, so both the one-row and the several-row commit paths run.
        for (let i = 0; i < cells.length; i += 4) {
          await client.transact(async (tx) => {
            for (const c of cells.slice(i, i + 4)) tx.set(table, c.key, c.column, c.value);
          });
        }
        await db.transact(async (tx) => {
          const where = (c: (typeof cells)[number]) =>
            `through the core, ${table} ${format(c.key)}/${format(c.column)}`;
          for (const c of cells) {
            const got = await tx.get(table, c.key, c.column);
            check(got !== undefined, `${where(c)} reads as absent`);
            check(sameBytes(got, c.value), `${where(c)} read ${show(got)}`);
          }
          // Reads sent together (a batched read where the store has one) give each its own row.
          const together = await Promise.all(cells.map((c) => tx.get(table, c.key, c.column)));
          cells.forEach((c, i) => {
            check(
              sameBytes(together[i], c.value),
              `${where(c)}, read with the others, read ${show(together[i])}`,
            );
          });
          if (store.capabilities.orderedScan && store.scan) {
            const scanned = new Map<string, ReadonlyMap<string, Uint8Array>>();
            for await (const r of tx.scan(table)) scanned.set(r.row, r.columns);
            checkEqual(
              [...scanned.keys()].sort(),
              unique.slice().sort(),
              `the keys a scan of ${table} gives`,
            );
            for (const c of cells) {
              check(sameBytes(scanned.get(c.key)?.get(c.column), c.value), `${where(c)}, scanned`);
            }
          }
        });
      }
      // Strings keep every character, a leading U+FEFF included.
      const strings = ['\uFEFF', '\uFEFFvalue', 'a\uFEFF', '\uFEFF\uFEFF'];
      await db.transact(async (tx) => {
        for (const [i, value] of strings.entries()) tx.set('core.strings', `s${i}`, 'v', value);
      });
      await db.transact(async (tx) => {
        for (const [i, value] of strings.entries()) {
          checkEqual(
            await tx.getString('core.strings', `s${i}`, 'v'),
            value,
            `getString of ${format(value)}`,
          );
        }
      });
    },
  },
  {
    part: 'store',
    name: 'many rows',
    timeoutMs: 120_000,
    async run(ctx) {
      const store = await ctx.createStore();
      const count = ctx.scaled(1000, 40);
      const key = (i: number) => `row/${String(i).padStart(6, '0')}`;
      const versions = await pool(count, 16, (i) => create(store, T, key(i), bytes(`v${i}`)));
      // Update even rows, delete every third.
      await pool(count, 16, async (i) => {
        if (i % 2 === 0) {
          const r = await store.checkAndSet({
            table: T,
            key: key(i),
            expected: versions[i]!,
            state: bytes(`u${i}`),
          });
          check(r.ok, `updating ${key(i)} failed`);
          versions[i] = r.version;
        }
        if (i % 3 === 0) {
          const r = await store.checkAndSet({ table: T, key: key(i), expected: versions[i]!, state: null });
          check(r.ok, `deleting ${key(i)} failed`);
        }
      });
      await pool(count, 16, async (i) => {
        const row = await store.read(T, key(i));
        if (i % 3 === 0) check(row === null, `${key(i)} was deleted but reads ${format(row)}`);
        else {
          check(row !== null, `${key(i)} is missing`);
          checkEqual(text(row.state), i % 2 === 0 ? `u${i}` : `v${i}`, `state of ${key(i)}`);
          checkEqual(row.version, versions[i], `version of ${key(i)}`);
        }
      });
      if (store.capabilities.orderedScan && store.scan) {
        const seen: string[] = [];
        let after: string | undefined;
        for (;;) {
          const page = await store.scan(T, { after, limit: 97 });
          if (page.length === 0) break;
          seen.push(...page.map((r) => r.key));
          after = page[page.length - 1]!.key;
        }
        const expected = Array.from({ length: count }, (_, i) => i)
          .filter((i) => i % 3 !== 0)
          .map(key);
        checkEqual(seen.length, expected.length, 'rows found by paging through a scan');
        checkEqual(seen, expected, 'keys found by paging through a scan');
      }
    },
  },
  {
    part: 'store',
    name: 'two stores from the factory are isolated from each other',
    async run(ctx) {
      const a = await ctx.createStore();
      const b = await ctx.createStore();
      const va = await create(a, T, 'shared', bytes('in A'));
      checkEqual(await b.read(T, 'shared'), null, 'store B reading a row written only in store A');
      const vb = await create(b, T, 'shared', bytes('in B'));
      await expectRow(a, T, 'shared', va, bytes('in A'));
      await expectRow(b, T, 'shared', vb, bytes('in B'));
      const del = await b.checkAndSet({ table: T, key: 'shared', expected: vb, state: null });
      check(del.ok, 'delete in B');
      await expectRow(a, T, 'shared', va, bytes('in A'));
      if (a.capabilities.orderedScan && a.scan && b.scan) {
        checkEqual((await b.scan(T, { limit: 10 })).length, 0, 'rows of A seen by a scan of B');
        checkEqual((await a.scan(T, { limit: 10 })).length, 1, 'rows seen by a scan of A');
      }
      if (a.capabilities.atomicCounter && a.incrementCounter && b.incrementCounter) {
        await a.incrementCounter('conf.iso', 5);
        checkEqual(await b.incrementCounter('conf.iso', 1), 1, 'a counter in B after incrementing it in A');
      }
      if (a.capabilities.notificationIndex && a.scanNotified && b.scanNotified) {
        await a.checkAndSet({ table: T, key: 'flagged', expected: null, state: bytes('n'), notified: true });
        checkEqual(await b.scanNotified(T, { limit: 10 }), [], 'notified rows of A seen by B');
      }
    },
  },
];
