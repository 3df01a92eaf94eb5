import {
  type CasResult,
  ClosedError,
  compareKeys,
  InvalidArgumentError,
  ORACLE_COUNTER,
  type RowStore,
  RowTooLargeError,
} from '@percolator/core';
import { afterEach, describe, expect, it } from 'vitest';
import { notifyIndexName, scanIndexName } from '../src/keys.js';
import { REDIS_MAX_STATE_BYTES, type RedisClient, type RedisStore } from '../src/store.js';
import { bytes, namespaceKeys, text, uniqueNamespace } from './helpers.js';

export interface BehaviourSetup {
  /** A new store on a fresh namespace (or the given one), sharing one raw client. */
  newStore(namespace?: string): Promise<RedisStore>;
  /** The raw client, for checks behind the store's back. */
  client(): RedisClient;
}

const T = 'tbl';

/** Keys whose UTF-8 order differs from naive orders: NUL, prefixes, BMP vs astral. */
const TRICKY_KEYS = [
  'a',
  'a\u0000',
  'a\u0000b',
  'a\u0001',
  'ab',
  'b',
  '\u007f',
  '\u0080',
  'é',
  '\uffff',
  '😀',
  '😀\u0000😀',
  '\ue000',
  '{',
  '}',
  '{x}',
  'k{a}b',
  '*',
  '?[]',
  ':',
];

export function describeStoreBehaviour(label: string, setup: BehaviourSetup): void {
  describe(`${label}: redis store behaviour`, () => {
    const stores: RedisStore[] = [];
    async function store(namespace?: string): Promise<RedisStore> {
      const s = await setup.newStore(namespace);
      stores.push(s);
      return s;
    }
    afterEach(async () => {
      for (const s of stores.splice(0)) {
        await s.dropNamespace().catch(() => {});
        await s.close();
      }
    });

    it('creates, reads, updates and refuses stale versions, with binary keys and values', async () => {
      const s = await store();
      const key = 'k\u0000😀\u0000{tag}';
      expect(await s.read(T, key)).toBeNull();
      const state = new Uint8Array([0, 1, 2, 255, 0, 0x1f600 & 0xff]);
      const created = await s.checkAndSet({ table: T, key, expected: null, state });
      expect(created.ok).toBe(true);
      const v1 = (created as { version: string }).version;
      const row = await s.read(T, key);
      expect(row?.version).toBe(v1);
      expect(Buffer.from(row!.state).equals(Buffer.from(state))).toBe(true);
      expect(Buffer.isBuffer(row!.state)).toBe(true);

      // Creating again fails and shows the current row.
      const again = await s.checkAndSet({ table: T, key, expected: null, state: bytes('x') });
      expect(again.ok).toBe(false);
      expect((again as { current?: unknown }).current).toMatchObject({ version: v1 });

      const updated = await s.checkAndSet({ table: T, key, expected: v1, state: bytes('😀 two') });
      expect(updated.ok).toBe(true);
      const v2 = (updated as { version: string }).version;
      expect(v2).not.toBe(v1);
      const stale = await s.checkAndSet({ table: T, key, expected: v1, state: bytes('three') });
      expect(stale.ok).toBe(false);
      const current = (stale as { current?: { version: string; state: Uint8Array } }).current!;
      expect(current.version).toBe(v2);
      expect(text(current.state)).toBe('😀 two');

      // Empty state is a value, not absence.
      const empty = await s.checkAndSet({ table: T, key, expected: v2, state: new Uint8Array(0) });
      expect(empty.ok).toBe(true);
      const read = await s.read(T, key);
      expect(read?.state.length).toBe(0);

      // An update of an absent row fails with current = null.
      const missing = await s.checkAndSet({ table: T, key: 'nope', expected: v2, state: bytes('x') });
      expect(missing).toEqual({ ok: false, current: null });
    });

    it('never reuses a version after delete and re-create', async () => {
      const s = await store();
      const seen = new Set<string>();
      let version: string | null = null;
      const stale: string[] = [];
      for (let i = 0; i < 20; i++) {
        const created: CasResult = await s.checkAndSet({
          table: T,
          key: 'aba',
          expected: null,
          state: bytes(`${i}`),
        });
        expect(created.ok).toBe(true);
        version = (created as { version: string }).version;
        expect(seen.has(version)).toBe(false);
        seen.add(version);
        for (const old of stale) {
          expect(
            (await s.checkAndSet({ table: T, key: 'aba', expected: old, state: bytes('stale') })).ok,
          ).toBe(false);
        }
        stale.push(version);
        const deleted = await s.checkAndSet({ table: T, key: 'aba', expected: version, state: null });
        expect(deleted.ok).toBe(true);
        expect(await s.read(T, 'aba')).toBeNull();
        // Deleting again with the old version fails.
        expect((await s.checkAndSet({ table: T, key: 'aba', expected: version, state: null })).ok).toBe(
          false,
        );
      }
      // A second store instance (another process, say) makes different tokens too.
      const other = await store(s.namespace);
      const created = await other.checkAndSet({ table: T, key: 'aba', expected: null, state: bytes('o') });
      expect(seen.has((created as { version: string }).version)).toBe(false);
    });

    it('lets exactly one of many concurrent CAS win', async () => {
      const s = await store();
      const peers = [s, await store(s.namespace), await store(s.namespace)];
      const creates = await Promise.all(
        Array.from({ length: 12 }, (_, i) =>
          peers[i % peers.length]!.checkAndSet({
            table: T,
            key: 'race',
            expected: null,
            state: bytes(`c${i}`),
          }),
        ),
      );
      expect(creates.filter((r) => r.ok)).toHaveLength(1);
      const base = (await s.read(T, 'race'))!;
      const updates = await Promise.all(
        Array.from({ length: 12 }, (_, i) =>
          peers[i % peers.length]!.checkAndSet({
            table: T,
            key: 'race',
            expected: base.version,
            state: bytes(`u${i}`),
          }),
        ),
      );
      const winners = updates.filter((r) => r.ok);
      expect(winners).toHaveLength(1);
      expect((await s.read(T, 'race'))!.version).toBe((winners[0] as { version: string }).version);
      // Every loser saw the winner's row.
      for (const r of updates.filter((u) => !u.ok)) {
        expect((r as { current?: { version: string } }).current?.version).toBe(
          (winners[0] as { version: string }).version,
        );
      }
    });

    it('reads many rows in request order', async () => {
      const s = await store();
      const keys = ['x', 'y\u0000', '😀', 'absent'];
      for (const k of keys.slice(0, 3))
        await s.checkAndSet({ table: T, key: k, expected: null, state: bytes(`v:${k}`) });
      await s.checkAndSet({ table: 'other', key: 'x', expected: null, state: bytes('other table') });
      const rows = await s.readMany([
        ...keys.map((key) => ({ table: T, key })),
        { table: 'other', key: 'x' },
      ]);
      expect(rows.map((r) => (r ? text(r.state) : null))).toEqual([
        'v:x',
        'v:y\u0000',
        'v:😀',
        null,
        'other table',
      ]);
      expect(await s.readMany([])).toEqual([]);
    });

    it('applies a batch of CAS each on its own', async () => {
      const s = await store();
      const first = await s.checkAndSet({ table: T, key: 'b1', expected: null, state: bytes('1') });
      const v1 = (first as { version: string }).version;
      const results = await s.checkAndSetMany([
        { table: T, key: 'b1', expected: v1, state: bytes('1b') },
        { table: T, key: 'b2', expected: null, state: bytes('2') },
        { table: T, key: 'b3', expected: 'not-a-version', state: bytes('3') },
        { table: T, key: 'b1', expected: 'stale', state: null },
      ]);
      expect(results.map((r) => r.ok)).toEqual([true, true, false, false]);
      expect(results[2]).toEqual({ ok: false, current: null });
      expect(text((await s.read(T, 'b1'))!.state)).toBe('1b');
      expect(text((await s.read(T, 'b2'))!.state)).toBe('2');
      expect(await s.read(T, 'b3')).toBeNull();
    });

    it('scans in compareKeys (UTF-8 byte) order with bounds, paging, and skips deleted rows', async () => {
      const s = await store();
      const versions = new Map<string, string>();
      for (const key of TRICKY_KEYS) {
        const r = await s.checkAndSet({ table: T, key, expected: null, state: bytes(`v:${key}`) });
        versions.set(key, (r as { version: string }).version);
      }
      await s.checkAndSet({ table: 'other', key: 'a', expected: null, state: bytes('other table') });
      const sorted = [...TRICKY_KEYS].sort(compareKeys);
      const all = await s.scan(T, { limit: 1000 });
      expect(all.map((r) => r.key)).toEqual(sorted);
      expect(all.map((r) => text(r.row.state))).toEqual(sorted.map((k) => `v:${k}`));
      expect(all.map((r) => r.row.version)).toEqual(sorted.map((k) => versions.get(k)));

      // Paging with `after` visits everything once, in order.
      const paged: string[] = [];
      let after: string | undefined;
      for (;;) {
        const page = await s.scan(T, { limit: 3, after });
        if (page.length === 0) break;
        paged.push(...page.map((r) => r.key));
        after = page[page.length - 1]!.key;
      }
      expect(paged).toEqual(sorted);

      // Bounds: start inclusive, end exclusive, after exclusive.
      const inRange = (start: string, end: string) =>
        sorted.filter((k) => compareKeys(k, start) >= 0 && compareKeys(k, end) < 0);
      expect((await s.scan(T, { start: 'a\u0000', end: 'b', limit: 100 })).map((r) => r.key)).toEqual(
        inRange('a\u0000', 'b'),
      );
      expect((await s.scan(T, { start: 'a', end: 'a\u0000b', limit: 100 })).map((r) => r.key)).toEqual([
        'a',
        'a\u0000',
      ]);
      expect((await s.scan(T, { start: '\uffff', limit: 100 })).map((r) => r.key)).toEqual(
        sorted.filter((k) => compareKeys(k, '\uffff') >= 0),
      );
      expect((await s.scan(T, { start: 'a', after: 'a\u0000', limit: 2 })).map((r) => r.key)).toEqual([
        'a\u0000b',
        'a\u0001',
      ]);
      expect((await s.scan(T, { start: 'b', after: 'a', limit: 1 })).map((r) => r.key)).toEqual(['b']);
      expect(await s.scan(T, { start: 'z', end: 'a', limit: 10 })).toEqual([]);
      expect(await s.scan('empty_table', { limit: 10 })).toEqual([]);

      // Deleted rows vanish from scans, and their index entries are removed.
      for (const key of ['a', 'a\u0000b', '😀']) {
        expect((await s.checkAndSet({ table: T, key, expected: versions.get(key)!, state: null })).ok).toBe(
          true,
        );
      }
      const left = sorted.filter((k) => !['a', 'a\u0000b', '😀'].includes(k));
      expect((await s.scan(T, { limit: 1000 })).map((r) => r.key)).toEqual(left);
      expect(await setup.client().zcard(scanIndexName(s.namespace, T))).toBe(left.length);
      // A re-created row appears once.
      await s.checkAndSet({ table: T, key: 'a', expected: null, state: bytes('again') });
      const rescanned = await s.scan(T, { limit: 1000 });
      expect(rescanned.filter((r) => r.key === 'a')).toHaveLength(1);
      expect(text(rescanned.find((r) => r.key === 'a')!.row.state)).toBe('again');
    });

    it('scans random keys (NUL, control, BMP, astral) in compareKeys order', async () => {
      const s = await store();
      let seed = 7;
      const next = (n: number) => {
        seed = (seed * 48271) % 2147483647;
        return seed % n;
      };
      const alphabet = [
        0x0, 0x1, 0x7f, 0x80, 0xff, 0x100, 0x7ff, 0x800, 0xd7ff, 0xe000, 0xfffd, 0xffff, 0x10000, 0x1f600,
        0x10ffff,
      ];
      const keys = new Set<string>();
      while (keys.size < 200) {
        const length = 1 + next(5);
        keys.add(String.fromCodePoint(...Array.from({ length }, () => alphabet[next(alphabet.length)]!)));
      }
      const results = await s.checkAndSetMany(
        [...keys].map((key) => ({ table: T, key, expected: null, state: bytes(key) })),
      );
      expect(results.every((r) => r.ok)).toBe(true);
      const scanned = await s.scan(T, { limit: 1000 });
      expect(scanned.map((r) => r.key)).toEqual([...keys].sort(compareKeys));
      expect(scanned.every((r) => text(r.row.state) === r.key)).toBe(true);
    });

    it('scan skips stale index entries and still fills the limit', async () => {
      const s = await store();
      // Leave index entries whose rows are gone (as a client that died between the
      // delete and the index cleanup would).
      const index = scanIndexName(s.namespace, T);
      for (let i = 0; i < 300; i++) {
        const key = `g${String(i).padStart(3, '0')}`;
        await s.checkAndSet({ table: T, key, expected: null, state: bytes('x') });
      }
      const before = await setup.client().zrangeBuffer(index, 0, -1);
      for (let i = 0; i < 290; i++) {
        const key = `g${String(i).padStart(3, '0')}`;
        const row = (await s.read(T, key))!;
        await s.checkAndSet({ table: T, key, expected: row.version, state: null });
      }
      await setup.client().zadd(index, ...before.flatMap((m) => [0, m] as [number, Buffer]));
      const rows = await s.scan(T, { limit: 5 });
      expect(rows.map((r) => r.key)).toEqual(['g290', 'g291', 'g292', 'g293', 'g294']);
    });

    it('keeps the notification index: set, clear, delete, paging', async () => {
      const s = await store();
      const keys = ['n1', 'n\u0000', '😀n', 'n2'];
      const versions = new Map<string, string>();
      for (const key of keys) {
        const r = await s.checkAndSet({ table: T, key, expected: null, state: bytes('x'), notified: true });
        versions.set(key, (r as { version: string }).version);
      }
      await s.checkAndSet({ table: T, key: 'quiet', expected: null, state: bytes('x') });
      const sorted = [...keys].sort(compareKeys);
      expect(await s.scanNotified(T, { limit: 100 })).toEqual(sorted);
      expect(await s.scanNotified(T, { limit: 2 })).toEqual(sorted.slice(0, 2));
      expect(await s.scanNotified(T, { after: sorted[1], limit: 100 })).toEqual(sorted.slice(2));

      // Still notified after another notified write; cleared by a plain write; gone on delete.
      let r = await s.checkAndSet({
        table: T,
        key: 'n1',
        expected: versions.get('n1')!,
        state: bytes('y'),
        notified: true,
      });
      r = await s.checkAndSet({
        table: T,
        key: 'n1',
        expected: (r as { version: string }).version,
        state: bytes('z'),
      });
      expect(r.ok).toBe(true);
      await s.checkAndSet({ table: T, key: 'n2', expected: versions.get('n2')!, state: null });
      const now = sorted.filter((k) => k !== 'n1' && k !== 'n2');
      expect(await s.scanNotified(T, { limit: 100 })).toEqual(now);
      // Cleanup removed the entries (no stale ones left behind).
      expect(await setup.client().zcard(notifyIndexName(s.namespace, T))).toBe(now.length);
      // A refused notified write leaves no entry.
      await s.checkAndSet({ table: T, key: 'quiet', expected: 'wrong', state: bytes('x'), notified: true });
      expect(await s.scanNotified(T, { limit: 100 })).toEqual(now);
    });

    it('never drops a set notification while setters and clearers race', async () => {
      const s = await store();
      const peers = [s, await store(s.namespace)];
      const key = 'hot';
      await s.checkAndSet({ table: T, key, expected: null, state: bytes('0'), notified: false });
      // Each worker reads, then writes with a random flag; CAS serialises the writes. After
      // each successful CAS that set the flag, the key must be in the index.
      let violations = 0;
      await Promise.all(
        peers.flatMap((p, w) =>
          Array.from({ length: 3 }, async (_, j) => {
            for (let i = 0; i < 40; i++) {
              const row = (await p.read(T, key))!;
              const notified = (i + j + w) % 2 === 0;
              const r = await p.checkAndSet({
                table: T,
                key,
                expected: row.version,
                state: bytes(`${w}${j}${i}`),
                notified,
              });
              if (r.ok && notified) {
                // Only if no later CAS replaced ours, the flag is still ours to check.
                // Scan first, then read: if the row still has our version, it had it
                // during the scan too.
                const listed = await p.scanNotified(T, { limit: 10 });
                const now = await p.read(T, key);
                if (now?.version === r.version && !listed.includes(key)) violations++;
              }
            }
          }),
        ),
      );
      expect(violations).toBe(0);
      const final = (await s.read(T, key))!;
      const r = await s.checkAndSet({
        table: T,
        key,
        expected: final.version,
        state: bytes('end'),
        notified: true,
      });
      expect(r.ok).toBe(true);
      expect(await s.scanNotified(T, { limit: 10 })).toEqual([key]);
    });

    it('counts atomically from 0 and rejects bad deltas', async () => {
      const s = await store();
      expect(await s.incrementCounter(ORACLE_COUNTER, 1)).toBe(1);
      expect(await s.incrementCounter(ORACLE_COUNTER, 5)).toBe(6);
      expect(await s.incrementCounter('c\u0000😀{x}', 2)).toBe(2);
      const peer = await store(s.namespace);
      const values = await Promise.all(
        Array.from({ length: 50 }, (_, i) => (i % 2 ? s : peer).incrementCounter(ORACLE_COUNTER, 1)),
      );
      expect(new Set(values).size).toBe(50);
      expect(Math.max(...values)).toBe(56);
      for (const bad of [0, -1, 1.5, Number.NaN, 2 ** 53]) {
        await expect(s.incrementCounter(ORACLE_COUNTER, bad)).rejects.toBeInstanceOf(InvalidArgumentError);
      }
    });

    it('isolates namespaces, and dropNamespace deletes exactly one namespace', async () => {
      const a = await store();
      const b = await store();
      await a.checkAndSet({ table: T, key: 'same', expected: null, state: bytes('a'), notified: true });
      await b.checkAndSet({ table: T, key: 'same', expected: null, state: bytes('b') });
      await a.incrementCounter('c', 3);
      expect(text((await a.read(T, 'same'))!.state)).toBe('a');
      expect(text((await b.read(T, 'same'))!.state)).toBe('b');
      expect(await b.scanNotified(T, { limit: 10 })).toEqual([]);
      expect(await b.incrementCounter('c', 1)).toBe(1);
      // Many rows, so keys land on every node of a cluster.
      await a.checkAndSetMany(
        Array.from({ length: 60 }, (_, i) => ({ table: T, key: `r${i}`, expected: null, state: bytes('x') })),
      );
      expect((await namespaceKeys(setup.client(), a.namespace)).length).toBeGreaterThan(60);
      await a.dropNamespace();
      expect(await namespaceKeys(setup.client(), a.namespace)).toEqual([]);
      expect(await a.read(T, 'same')).toBeNull();
      expect(await a.incrementCounter('c', 1)).toBe(1);
      expect(text((await b.read(T, 'same'))!.state)).toBe('b');
      expect((await namespaceKeys(setup.client(), b.namespace)).length).toBeGreaterThan(0);
    });

    it('rejects bad input with InvalidArgumentError and changes nothing', async () => {
      const s = await store();
      const state = bytes('x');
      const bad = [
        { table: 'bad table', key: 'k', expected: null, state },
        { table: 'bad{', key: 'k', expected: null, state },
        { table: '', key: 'k', expected: null, state },
        { table: T, key: '', expected: null, state },
        { table: T, key: '\ud800', expected: null, state },
        { table: T, key: 'x'.repeat(1025), expected: null, state },
        { table: T, key: 'k', expected: '', state },
        { table: T, key: 'k', expected: null, state: 'not bytes' },
      ];
      for (const request of bad) {
        await expect(s.checkAndSet(request as never)).rejects.toBeInstanceOf(InvalidArgumentError);
      }
      await expect(s.read('a:b', 'k')).rejects.toBeInstanceOf(InvalidArgumentError);
      await expect(s.scan(T, { limit: 0 })).rejects.toBeInstanceOf(InvalidArgumentError);
      await expect(s.scan(T, { limit: 5, start: '\udc00' })).rejects.toBeInstanceOf(InvalidArgumentError);
      // A batch with one bad request sends nothing.
      await expect(
        s.checkAndSetMany([
          { table: T, key: 'good', expected: null, state },
          { table: T, key: '', expected: null, state },
        ]),
      ).rejects.toBeInstanceOf(InvalidArgumentError);
      expect(await namespaceKeys(setup.client(), s.namespace)).toEqual([]);
    });

    it('refuses a state over maxStateBytes before sending it', async () => {
      const s = await store();
      expect(s.capabilities.maxStateBytes).toBe(REDIS_MAX_STATE_BYTES);
      const huge = new Uint8Array(REDIS_MAX_STATE_BYTES + 1);
      await expect(
        s.checkAndSet({ table: T, key: 'big', expected: null, state: huge }),
      ).rejects.toBeInstanceOf(RowTooLargeError);
      expect(await namespaceKeys(setup.client(), s.namespace)).toEqual([]);
      // A large state that fits round-trips intact.
      const big = new Uint8Array(4 * 1024 * 1024).map((_, i) => (i * 31) & 0xff);
      const r = await s.checkAndSet({ table: T, key: 'big', expected: null, state: big });
      expect(r.ok).toBe(true);
      expect(Buffer.from((await s.read(T, 'big'))!.state).equals(Buffer.from(big))).toBe(true);
    });

    it('declares its capabilities and refuses use after close', async () => {
      const s = await store();
      expect(s.capabilities).toMatchObject({
        batchRead: true,
        batchCheckAndSet: true,
        orderedScan: true,
        atomicCounter: true,
        notificationIndex: true,
      });
      if (setup.client().isCluster) {
        // The oracle's counter key and a row key are in different hash slots, so no script
        // can touch both: no stamped CAS and no stamped read on a Cluster.
        expect(s.capabilities.stampedCheckAndSet).toBe(false);
        expect((s as RowStore).checkAndSetStamped).toBeUndefined();
        expect('checkAndSetStamped' in s).toBe(false);
        expect(s.capabilities.stampedRead).toBe(false);
        expect((s as RowStore).readStamped).toBeUndefined();
        expect('readStamped' in s).toBe(false);
      } else {
        expect(s.capabilities.stampedCheckAndSet).toBe(true);
        expect(typeof (s as RowStore).checkAndSetStamped).toBe('function');
        expect(s.capabilities.stampedRead).toBe(true);
        expect(typeof (s as RowStore).readStamped).toBe('function');
      }
      await s.close();
      await expect(s.read(T, 'k')).rejects.toBeInstanceOf(ClosedError);
      // The client was not ours: it still works.
      expect(await setup.client().ping()).toBe('PONG');
    });

    it('rejects a bad namespace before connecting', async () => {
      for (const namespace of ['', 'A', '1abc', 'a:b', 'a*', 'a{b}', 'x'.repeat(33), 'ns-1']) {
        await expect(setup.newStore(namespace)).rejects.toBeInstanceOf(InvalidArgumentError);
      }
      // The longest legal namespace works.
      const ok = await store(uniqueNamespace('n').padEnd(32, 'z'));
      expect(ok.namespace).toHaveLength(32);
    });
  });
}
