import { ClosedError, compareKeys, InvalidArgumentError, type RowStore } from '@percolator/core';
import { afterEach, describe, expect, it } from 'vitest';
import { memberKey, notifyIndexName, scanIndexName } from '../src/keys.js';
import type { RedisClient, RedisStore } from '../src/store.js';
import { bytes, namespaceKeys, text, uniqueNamespace } from './helpers.js';

export interface BehaviourSetup {
  /** A new store on a fresh namespace (or the given one), sharing one raw client. */
  newStore(namespace?: string): Promise<RedisStore>;
  /** The raw client, for checks behind the store's back. */
  client(): RedisClient;
}

const T = 'tbl';

/** Keys whose UTF-8 order differs from naive orders: NUL, prefixes, BMP vs astral. */
const _TRICKY_KEYS = [
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

    it("a delete takes its row's index entries with it: none is left behind by a plain, batched or stamped-created row", async () => {
      const s = await store();
      const client = setup.client();
      const keysIn = async (index: string) =>
        (await client.zrangeBuffer(index, 0, -1)).map((member) => memberKey(member));
      const versions = new Map<string, string>();
      for (const key of ['a', 'b', 'c', 'd']) {
        const r = await s.checkAndSet({ table: T, key, expected: null, state: bytes(key), notified: true });
        if (!r.ok) throw new Error(`create ${key}`);
        versions.set(key, r.version);
      }
      const stampedMany = s.checkAndSetStampedMany?.bind(s);
      if (stampedMany) {
        // Created by the multi-row script, which makes the entries itself.
        const state = Uint8Array.from([2, 0, 0, 0, 0, 0, 0, 0, 0, 0x65]);
        const r = await stampedMany([{ table: T, key: 'e', expected: null, state, notified: true }], 'c');
        if (!r.ok) throw new Error('stamped create e');
        versions.set('e', r.versions[0]!);
      }
      const all = [...versions.keys()];
      expect(await keysIn(scanIndexName(s.namespace, T))).toEqual(all);
      expect(await keysIn(notifyIndexName(s.namespace, T))).toEqual(all);

      const del = (key: string) => ({ table: T, key, expected: versions.get(key)!, state: null });
      expect(await s.checkAndSet(del('a'))).toMatchObject({ ok: true });
      expect((await s.checkAndSetMany([del('b'), del('c')])).map((r) => r.ok)).toEqual([true, true]);
      if (stampedMany) expect(await s.checkAndSet(del('e'))).toMatchObject({ ok: true });
      expect(await keysIn(scanIndexName(s.namespace, T))).toEqual(['d']);
      expect(await keysIn(notifyIndexName(s.namespace, T))).toEqual(['d']);
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
        // can touch both: no stamped CAS (of one row or many) and no stamped read on a Cluster.
        expect(s.capabilities.stampedCheckAndSet).toBe(false);
        expect((s as RowStore).checkAndSetStamped).toBeUndefined();
        expect('checkAndSetStamped' in s).toBe(false);
        expect(s.capabilities.stampedCheckAndSetMany).toBe(false);
        expect((s as RowStore).checkAndSetStampedMany).toBeUndefined();
        expect('checkAndSetStampedMany' in s).toBe(false);
        expect(s.capabilities.stampedRead).toBe(false);
        expect((s as RowStore).readStamped).toBeUndefined();
        expect('readStamped' in s).toBe(false);
        // No shared peeks or steps there, so nothing to split.
        expect(s.capabilities.sharedCallsInFlight).toBeUndefined();
      } else {
        expect(s.capabilities.stampedCheckAndSet).toBe(true);
        expect(typeof (s as RowStore).checkAndSetStamped).toBe('function');
        expect(s.capabilities.stampedCheckAndSetMany).toBe(true);
        expect(typeof (s as RowStore).checkAndSetStampedMany).toBe('function');
        expect(s.capabilities.stampedRead).toBe(true);
        expect(typeof (s as RowStore).readStamped).toBe('function');
        // Three shared calls in flight (core/src/sharing.ts; docs/cost-history.md).
        expect(s.capabilities.sharedCallsInFlight).toBe(3);
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
