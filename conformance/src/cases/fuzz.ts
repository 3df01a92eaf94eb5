/**
 * Fuzzing names, keys and values through the core (issue "faults a deployment meets"):
 * seeded random tables, row keys, columns and values, with NUL, paired and lone
 * surrogates, SQL and Lua metacharacters, maximum lengths and one past them. Every
 * accepted write must read back byte-exact; everything refused must be refused with
 * InvalidArgumentError before anything is sent, and change nothing.
 *
 * 10,000 cases per store by default (the CLI's run); PERCOLATOR_FUZZ_CASES sets another
 * number, and CI runs 1,000.
 */
import { InvalidArgumentError, MAX_KEY_BYTES, Percolator } from '@percolator/core';
import type { Random } from '../random.js';
import type { ConformanceCase } from '../types.js';
import { check, errorText, sameBytes, show } from '../util.js';
import { oracleOption } from './store-helpers.js';

const META = [
  "'",
  '"',
  '`',
  ';',
  '--',
  '/*',
  '*/',
  '\\',
  '%',
  '_',
  '[[',
  ']]',
  '$1',
  '?',
  '{',
  '}',
  ':',
  '#',
  ' ',
];
/** Metacharacters a table name may not hold (`_`, `-` and `.` are allowed). */
const NOT_IN_TABLE_NAMES = META.filter((m) => !/^[A-Za-z0-9_.-]+$/.test(m));
const SPECIAL = [
  '\u0000',
  '\u{1F984}',
  '\u00e9',
  '\uFFFD',
  '\uE000',
  '\u0001',
  '\n',
  '\t',
  'DROP TABLE x;',
  'redis.call("FLUSHALL")',
];

function fuzzCount(): number {
  const fromEnv = Number(process.env.PERCOLATOR_FUZZ_CASES);
  if (Number.isInteger(fromEnv) && fromEnv > 0) return fromEnv;
  return process.env.CI ? 1000 : 10_000;
}

function text(random: Random, maxChars: number): string {
  const n = random.between(1, maxChars);
  let out = '';
  for (let i = 0; i < n; i++) {
    const r = random.next();
    if (r < 0.15) out += random.pick(META);
    else if (r < 0.3) out += random.pick(SPECIAL);
    else if (r < 0.4) out += String.fromCodePoint(random.between(0x80, 0x10ffff));
    else out += String.fromCharCode(random.between(0x20, 0x7e));
  }
  // Code points picked above may be lone surrogates (D800-DFFF): keep only well-formed ones here.
  return out.toWellFormed();
}

function utf8(textValue: string): number {
  return Buffer.byteLength(textValue, 'utf8');
}

/** A string of exactly `bytes` UTF-8 bytes (ASCII and two-byte characters). */
function ofBytes(random: Random, bytes: number): string {
  let out = '';
  while (utf8(out) + 2 <= bytes) out += random.chance(0.5) ? 'é' : 'ab';
  while (utf8(out) < bytes) out += 'a';
  return out;
}

type Case =
  | { valid: true; table: string; row: string; column: string; value: Uint8Array | string }
  | { valid: false; why: string; table: unknown; row: unknown; column: unknown; value: unknown };

const TABLES = ['fz', 'fz.second-table_2', 'a', 'z'.repeat(64)];

function makeCase(random: Random, maxValue: number, limit: number): Case {
  const table = random.pick(TABLES);
  const row = random.chance(0.05) ? ofBytes(random, MAX_KEY_BYTES) : text(random, 24);
  const column = random.chance(0.05) ? ofBytes(random, 256) : text(random, 12);
  const value: Uint8Array | string = random.chance(0.5)
    ? Uint8Array.from({ length: random.chance(0.02) ? maxValue : random.int(300) }, () => random.int(256))
    : random.chance(0.1)
      ? ''
      : text(random, 40);
  const r = random.next();
  if (r < 0.55) return { valid: true, table, row, column, value };
  // One thing wrong at a time.
  const bad = random.int(10);
  const invalid = (
    why: string,
    patch: Partial<{ table: unknown; row: unknown; column: unknown; value: unknown }>,
  ) => ({ valid: false, why, table, row, column, value, ...patch }) as Case;
  switch (bad) {
    case 0:
      return invalid('an empty table name', { table: '' });
    case 1:
      return invalid('a 65-character table name', { table: 'x'.repeat(65) });
    case 2:
      return invalid('a table name with a metacharacter', { table: `fz${random.pick(NOT_IN_TABLE_NAMES)}x` });
    case 3:
      return invalid('a reserved table name', { table: '__v.fz' });
    case 4:
      return invalid('a row key one byte past the limit', { row: ofBytes(random, MAX_KEY_BYTES + 1) });
    case 5:
      return invalid('a row key with a lone surrogate', {
        row: `k${random.chance(0.5) ? '\uD800' : '\uDFFF'}k`,
      });
    case 6:
      return invalid('an empty column', { column: '' });
    case 7:
      return invalid('a column one byte past the limit', { column: ofBytes(random, 257) });
    case 8:
      return invalid('a value one byte past the limit', { value: new Uint8Array(limit + 1) });
    default:
      return invalid('a string value with a lone surrogate', { value: 'v\uDC00' });
  }
}

export const fuzzCases: ConformanceCase[] = [
  {
    part: 'store',
    name: 'fuzzed names, keys and values: accepted ones read back byte-exact, the rest get InvalidArgumentError and change nothing',
    timeoutMs: 600_000,
    async run(ctx) {
      const store = await ctx.createStore();
      const db = new Percolator({ store, ...oracleOption(store) });
      ctx.defer(() => db.close());
      const random = ctx.random.fork('fuzz');
      const count = fuzzCount();
      // The largest value a store takes (half its row limit, at most 1 MiB), kept modest so
      // a run stays quick: values of this size are a few of the cases.
      const limit = Math.min(1024 * 1024, Math.floor((store.capabilities.maxStateBytes - 4096) / 2));
      const maxValue = Math.min(limit, 64 * 1024);
      const expected = new Map<string, { table: string; row: string; column: string; value: Uint8Array }>();
      let refused = 0;
      let batch: Extract<Case, { valid: true }>[] = [];
      const flush = async () => {
        if (batch.length === 0) return;
        const writes = batch;
        batch = [];
        await db.transact(async (tx) => {
          for (const c of writes) tx.set(c.table, c.row, c.column, c.value);
        });
        for (const c of writes) {
          const bytes = typeof c.value === 'string' ? new TextEncoder().encode(c.value) : c.value;
          expected.set(JSON.stringify([c.table, c.row, c.column]), { ...c, value: bytes });
        }
      };
      const probe = await db.begin();
      for (let i = 0; i < count; i++) {
        const c = makeCase(random, maxValue, limit);
        if (c.valid) {
          batch.push(c);
          if (batch.length >= 40) await flush();
          continue;
        }
        let error: unknown;
        try {
          probe.set(c.table as string, c.row as string, c.column as string, c.value as string);
        } catch (e) {
          error = e;
        }
        check(
          error instanceof InvalidArgumentError,
          () =>
            `${c.why} must be refused with InvalidArgumentError, got ${error === undefined ? 'no error' : errorText(error)}`,
        );
        refused++;
      }
      await flush();
      // The transaction that refused every bad write commits one good one: a refused write
      // it had buffered after all would reach the store now (found by the scan below).
      const PROBE = { table: 'fz', row: 'fuzz probe row', column: 'probe', value: 'kept' };
      probe.set(PROBE.table, PROBE.row, PROBE.column, PROBE.value);
      await probe.commit();
      expected.set(JSON.stringify([PROBE.table, PROBE.row, PROBE.column]), {
        ...PROBE,
        value: new TextEncoder().encode(PROBE.value),
      });
      // Read everything back, in batches of one transaction each.
      const all = [...expected.values()];
      for (let i = 0; i < all.length; i += 100) {
        const part = all.slice(i, i + 100);
        const got = await db.transact(async (tx) =>
          Promise.all(part.map((c) => tx.get(c.table, c.row, c.column))),
        );
        for (const [j, c] of part.entries()) {
          check(
            sameBytes(got[j], c.value),
            () =>
              `${JSON.stringify([c.table, c.row, c.column])} read back as ${show(got[j])}, wrote ${show(c.value)}`,
          );
        }
      }
      // Nothing refused reached the store: every cell of the fuzzed tables is one written
      // on purpose (a refused write keeps the other fields of a good one, so it would land
      // in these tables, under its row or column).
      if (store.capabilities.orderedScan) {
        for (const table of TABLES) {
          const cells = await db.transact(async (tx) => {
            const found: string[] = [];
            for await (const { row, columns } of tx.scan(table)) {
              for (const column of columns.keys()) found.push(JSON.stringify([table, row, column]));
            }
            return found;
          });
          for (const cell of cells)
            check(expected.has(cell), `a cell no accepted write made is in the store: ${cell}`);
          const made = [...expected.values()].filter((c) => c.table === table).length;
          check(cells.length === made, `table ${table} holds ${cells.length} cells, ${made} written`);
        }
      } else {
        ctx.note(
          'the store cannot scan: that refused writes changed nothing is checked by their errors only',
        );
      }
      ctx.note(
        `${count} fuzz cases: ${count - refused} accepted (${expected.size} distinct cells read back), ${refused} refused`,
      );
    },
  },
];
