// The RowStore contract's own types: every store (and the contract check) names the same
// list, by necessity; `duplicates` pairs these import lists.
import {
  type CasRequest,
  type CasResult,
  ClosedError,
  type NotificationScanOptions,
  type RowRef,
  type RowStore,
  type ScannedStoredRow,
  type ScanOptions,
  STAMP_OFFSET,
  type StampedManyResult,
  type StoreCapabilities,
  type StoredRow,
  StoreError,
} from '@percolator/core';
import { checkStampedManyRequests, fullCapabilities, validateNamespace } from '@percolator/core/kit';
import type { Cluster, Redis } from 'ioredis';
import { dropFailed, toStoreError } from './errors.js';
import { walkIndex } from './index-walk.js';
import {
  counterKeyName,
  indexMember,
  namespacePattern,
  notifyIndexName,
  rowKeyName,
  scanIndexName,
} from './keys.js';
import {
  CAS_MANY_SCRIPT,
  CAS_SCRIPT,
  type LuaScript,
  READ_PEEKED_SCRIPT,
  READ_STAMPED_SCRIPT,
  runScript,
} from './scripts.js';
import { VersionTokens } from './versions.js';

export type RedisClient = Redis | Cluster;

/** 64 MiB: far below Redis's 512 MB string limit, and a CAS still fits one timely command. */
export const REDIS_MAX_STATE_BYTES = 64 * 1024 * 1024;

interface IndexEntry {
  readonly index: string;
  readonly member: Buffer;
}

interface PreparedCas {
  readonly request: CasRequest;
  readonly key: string;
  readonly token: string;
  /** Index entries added BEFORE the CAS is sent (see "Indexes" below). */
  readonly added: IndexEntry[];
  /** The counter key a stamped CAS draws its timestamp from. */
  readonly counterKey?: string;
}

type StampedResult = CasResult & { timestamp?: number };

/** See CAS_LUA for the replies. */
type CasReply = [number, Buffer?, Buffer?, Buffer?, Buffer?];

type StampedCas = (
  request: CasRequest & { readonly state: Uint8Array },
  counter: string,
) => Promise<StampedResult>;

type StampedRequest = CasRequest & { readonly state: Uint8Array };

type StampedCasMany = (requests: readonly StampedRequest[], counter: string) => Promise<StampedManyResult>;

type StampedRead = (
  rows: readonly RowRef[],
  counter: string,
) => Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }>;

/**
 * A RowStore on Redis or Redis Cluster: one hash per row, CAS as a Lua script on that one
 * key (see scripts.ts), versions as unique tokens (see versions.ts).
 *
 * Indexes. The scan index and the notification index of a table are sorted sets in their
 * own slot, so on a Cluster they cannot change atomically with a row. They are kept a
 * SUPERSET of the truth: an entry is added before the CAS that may need it and removed
 * only after the CAS that made it useless. Entries carry the token of the write that
 * added them, and the row remembers the token of the entry that covers it (x for the scan
 * index, n for notifications), so a removal can only ever remove an entry no row points to:
 * without tokens, "clear then ZREM" racing "ZADD then set" could remove the entry of a
 * row whose flag a concurrent CAS has just set again. Entries left behind (a client died
 * between CAS and cleanup, or the CAS outcome was unknown) only cost a wasted read; scans
 * skip rows that no longer exist, and `scanNotified` may return such keys (the contract
 * allows false positives).
 *
 * Stamped CAS (standalone only). `checkAndSetStamped` runs the same CAS script with the
 * oracle's counter key as a second key: the script increments the counter, writes the value
 * into the state's stamp slot and applies the CAS, atomically and in one round trip. On a
 * Cluster the counter key and a row key hash to different slots (every row has a slot of
 * its own, see keys.ts), and a script may only touch keys of one slot, so a Cluster store
 * declares `stampedCheckAndSet: false` and has no `checkAndSetStamped` at all.
 *
 * Stamped CAS of many rows (standalone only). `checkAndSetStampedMany` runs one script
 * (CAS_MANY_LUA) over the counter, the rows and their tables' indexes: it checks every
 * row's version, and only if all match draws one value and writes every row with it, all
 * in one atomic step and one round trip. Its index entries are made inside the script (the
 * one server holds every key), not around it as for the single CAS. On a Cluster the rows
 * and the counter are in different slots, as above, so a Cluster store declares
 * `stampedCheckAndSetMany: false` and has no `checkAndSetStampedMany`.
 *
 * Stamped read (standalone only). `readStamped` runs one script (READ_STAMPED_LUA) that
 * increments the oracle's counter and then reads the rows, atomically and in one round trip.
 * On a Cluster the counter and the rows are in different slots, as above, so a Cluster store
 * declares `stampedRead: false` and has no `readStamped`.
 */
export class RedisStore implements RowStore {
  readonly name: string;
  readonly capabilities: StoreCapabilities;
  /** Present only on a standalone Redis (capability `stampedCheckAndSet`). */
  declare readonly checkAndSetStamped?: StampedCas;
  /** Present only on a standalone Redis (capability `stampedCheckAndSetMany`). */
  declare readonly checkAndSetStampedMany?: StampedCasMany;
  /** Present only on a standalone Redis (capability `stampedRead`). */
  declare readonly readStamped?: StampedRead;
  /** Present only on a standalone Redis (capability `peekedRead`). */
  declare readonly readPeeked?: StampedRead;
  private readonly tokens = new VersionTokens();
  private closed = false;

  constructor(
    readonly client: RedisClient,
    readonly namespace: string,
    private readonly ownsClient: boolean,
  ) {
    // Checked here too, not only in createRedisStore: the namespace goes into SCAN patterns,
    // and one with a glob character would drop other namespaces' keys.
    validateNamespace(namespace);
    this.name = client.isCluster ? 'redis-cluster' : 'redis';
    const stamped = !client.isCluster;
    this.capabilities = fullCapabilities(REDIS_MAX_STATE_BYTES, {
      stampedCheckAndSet: stamped,
      stampedCheckAndSetMany: stamped,
      stampedRead: stamped,
      peekedRead: stamped,
      // The stamped read's INCR is an in-memory write in the same script: cheaper than
      // sharing oracle batches, which cost each transaction a second round trip.
      stampedReadUnderLoad: stamped,
      // The many-row script costs about the single-row one: a one-row commit carries the
      // version rows of the values it moves out in it (docs/protocol.md 7.2).
      stampedManyForOneRow: stamped,
      // A script call costs the server a few microseconds, less than the client spends on a
      // transaction: three shared calls in flight keep both busy (core/src/sharing.ts; the
      // runs with 1, 2 and 3 are in docs/cost-history.md).
      ...(stamped ? { sharedCallsInFlight: 3 } : {}),
    });
    if (stamped) {
      this.checkAndSetStamped = this.stampedCas.bind(this);
      this.checkAndSetStampedMany = this.stampedCasMany.bind(this);
      this.readStamped = this.stampedRead.bind(this);
      this.readPeeked = this.peekedRead.bind(this);
    }
  }

  async read(table: string, key: string): Promise<StoredRow | null> {
    this.checkOpen();
    return await this.readRow(table, key);
  }

  async readMany(rows: readonly RowRef[]): Promise<(StoredRow | null)[]> {
    this.checkOpen();
    // All commands are written before any reply is awaited: one round trip per node.
    return await Promise.all(rows.map((r) => this.readRow(r.table, r.key)));
  }

  async checkAndSet(request: CasRequest): Promise<CasResult> {
    this.checkOpen();
    const [result] = await this.casBatch([request]);
    return result!;
  }

  /**
   * `checkAndSetStamped` on a standalone Redis (see the class comment and CAS_LUA). The
   * counter is advanced only when the CAS applies.
   */
  private async stampedCas(
    request: CasRequest & { readonly state: Uint8Array },
    counter: string,
  ): Promise<StampedResult> {
    this.checkOpen();
    // As for the many-row step (below): the script writes the stamp over bytes 1-8 of the
    // state, so a bare store's caller with a shorter state would lose its bytes silently.
    checkStampedManyRequests([request], this.capabilities.maxStateBytes);
    const [result] = await this.casBatch([request], counterKeyName(this.namespace, counter));
    return result!;
  }

  /**
   * `checkAndSetStampedMany` on a standalone Redis: one script (CAS_MANY_LUA, see there and
   * the class comment), so all or nothing and one round trip. The counter is advanced only
   * when every row matches. Versions are the tokens made here, in request order.
   *
   * The core's contract check (checkedStore) checks the requests before they get here; the
   * one step relies on their shape (distinct rows, each with a stamp slot), so they are
   * checked here again for a caller of a bare RedisStore, before anything is sent.
   *
   * A lost reply is StoreError 'unknown'. The script also recognises a second run of the
   * same request by its tokens and reports the first run's result (see CAS_MANY_LUA), but
   * the store never sends a request twice itself: the core re-reads the rows instead.
   */
  private async stampedCasMany(
    requests: readonly StampedRequest[],
    counter: string,
  ): Promise<StampedManyResult> {
    this.checkOpen();
    const what = 'stamped check-and-set of many rows';
    checkStampedManyRequests(requests, this.capabilities.maxStateBytes);
    const keys: string[] = [counterKeyName(this.namespace, counter)];
    const args: (string | Buffer)[] = [String(STAMP_OFFSET)];
    const tokens: string[] = [];
    for (const request of requests) {
      const { table, key, expected, state, notified } = request;
      const row = rowKeyName(this.namespace, table, key);
      const token = this.tokens.next();
      tokens.push(token);
      keys.push(row, scanIndexName(this.namespace, table), notifyIndexName(this.namespace, table));
      args.push(
        expected === null ? 'absent' : 'version',
        expected ?? '',
        token,
        Buffer.from(state.buffer, state.byteOffset, state.byteLength),
        notified ? '1' : '0',
        indexMember(key, ''),
      );
    }
    let reply: unknown;
    try {
      reply = await runScript(this.client, CAS_MANY_SCRIPT, keys, args);
    } catch (error) {
      throw toStoreError(error, what, 'write');
    }
    if (!Array.isArray(reply)) throw new StoreError(`redis ${what}: malformed reply`, 'unknown');
    if (reply[0] === 2) {
      // The script stopped after INCR, before touching any row.
      throw new StoreError(`redis ${what} failed: counter ${JSON.stringify(counter)} passed 2^53 - 1`, 'no', {
        retryable: false,
      });
    }
    if (reply[0] === 1) {
      const stamp = reply[1] as unknown;
      if (!Buffer.isBuffer(stamp) || stamp.length !== 8) {
        throw new StoreError(`redis ${what}: the reply carries no 8-byte stamp`, 'unknown');
      }
      return { ok: true, versions: tokens, timestamp: Number(stamp.readBigUInt64BE(0)) };
    }
    if (reply[0] !== 0 || reply.length !== 1 + 2 * requests.length) {
      throw new StoreError(`redis ${what}: malformed reply`, 'unknown');
    }
    return {
      ok: false,
      current: requests.map((_, i) => decodeRow(reply[1 + 2 * i] ?? null, reply[2 + 2 * i] ?? null)),
    };
  }

  /**
   * `readStamped` on a standalone Redis: INCR the counter, then read the rows, in one script
   * (READ_STAMPED_LUA), so the reads see every write that ran before the increment. Fails
   * like a read (StoreError 'no', retryable): nothing was written but the counter, which
   * may have advanced; an oracle allows the gap.
   */
  private stampedRead(
    rows: readonly RowRef[],
    counter: string,
  ): Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }> {
    return this.counterRead(rows, counter, READ_STAMPED_SCRIPT, 'stamped read');
  }

  /**
   * `readPeeked` on a standalone Redis: GET the counter (0 if absent), then read the rows,
   * in one script (READ_PEEKED_LUA), writing nothing. On a Cluster the counter and the rows
   * are in different slots, so a Cluster store declares `peekedRead: false`.
   */
  private peekedRead(
    rows: readonly RowRef[],
    counter: string,
  ): Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }> {
    return this.counterRead(rows, counter, READ_PEEKED_SCRIPT, 'peeked read');
  }

  private counterRead(
    rows: readonly RowRef[],
    counter: string,
    lua: LuaScript,
    what: string,
  ): Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }> {
    // Handlers on the script's own promise, no async frame: every first read runs here.
    let keys: string[];
    try {
      this.checkOpen();
      keys = [counterKeyName(this.namespace, counter)];
      for (const r of rows) keys.push(rowKeyName(this.namespace, r.table, r.key));
    } catch (error) {
      return Promise.reject(error);
    }
    return runScript(this.client, lua, keys, []).then(
      (reply) => counterReply(reply, rows.length, counter, lua === READ_PEEKED_SCRIPT, what),
      (error: unknown) => {
        throw toStoreError(error, what, 'read');
      },
    );
  }

  async checkAndSetMany(requests: readonly CasRequest[]): Promise<CasResult[]> {
    this.checkOpen();
    return await this.casBatch(requests);
  }

  async scan(table: string, options: ScanOptions): Promise<ScannedStoredRow[]> {
    this.checkOpen();
    const { limit } = options;
    const out: ScannedStoredRow[] = [];
    const wanted = () => limit - out.length;
    await walkIndex(this.client, scanIndexName(this.namespace, table), options, wanted, async (keys) => {
      // Rows are read after the index lookup; an index key whose row is gone is skipped.
      // Read no more rows than still wanted (more only where rows turn out to be gone).
      for (let i = 0; i < keys.length && wanted() > 0; ) {
        const chunk = keys.slice(i, i + wanted());
        i += chunk.length;
        const rows = await Promise.all(chunk.map((k) => this.readRow(table, k)));
        rows.forEach((row, j) => {
          if (row) out.push({ key: chunk[j]!, row });
        });
      }
    });
    return out;
  }

  async scanNotified(table: string, options: NotificationScanOptions): Promise<string[]> {
    this.checkOpen();
    const { limit } = options;
    const out: string[] = [];
    const wanted = () => limit - out.length;
    await walkIndex(
      this.client,
      notifyIndexName(this.namespace, table),
      { after: options.after },
      wanted,
      async (keys) => {
        out.push(...keys.slice(0, wanted()));
      },
    );
    return out;
  }

  async incrementCounter(name: string, delta: number): Promise<number> {
    this.checkOpen();
    let value: number;
    try {
      // If a reply is lost the caller gets 'unknown' and may call again: the counter then
      // skips numbers, which an oracle allows (gaps, never repeats).
      value = await this.client.incrby(counterKeyName(this.namespace, name), delta);
    } catch (error) {
      throw toStoreError(error, 'INCRBY', 'write');
    }
    if (!Number.isSafeInteger(value)) {
      throw new StoreError(`counter ${JSON.stringify(name)} passed 2^53`, 'unknown', { retryable: false });
    }
    return value;
  }

  /** Deletes every key of this store's namespace, on every master of a Cluster. */
  async dropNamespace(): Promise<void> {
    this.checkOpen();
    const nodes = this.client.isCluster ? (this.client as Cluster).nodes('master') : [this.client as Redis];
    const unlinked = { any: false };
    try {
      await Promise.all(nodes.map((node) => dropMatching(node, namespacePattern(this.namespace), unlinked)));
    } catch (error) {
      throw dropFailed(toStoreError(error, 'dropNamespace', 'write'), unlinked.any);
    }
  }

  /** Quits the client only if this store created it. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (!this.ownsClient) return;
    try {
      await this.client.quit();
    } catch {
      this.client.disconnect();
    }
  }

  private checkOpen(): void {
    if (this.closed) throw new ClosedError(`${this.name} store is closed`);
  }

  private async readRow(table: string, key: string): Promise<StoredRow | null> {
    let reply: (Buffer | null)[];
    try {
      reply = await this.client.hmgetBuffer(rowKeyName(this.namespace, table, key), 'v', 's');
    } catch (error) {
      throw toStoreError(error, 'read', 'read');
    }
    return decodeRow(reply[0] ?? null, reply[1] ?? null);
  }

  /**
   * Three rounds, each one round trip per node whatever the batch size:
   * 1. add the index entries the writes may need (before: a superset never misses a row),
   * 2. run every CAS script,
   * 3. remove the entries the applied writes made useless, and those of refused writes.
   * With `counterKey`, every CAS is stamped from that counter (see CAS_LUA).
   */
  private async casBatch(requests: readonly CasRequest[], counterKey?: string): Promise<StampedResult[]> {
    const prepared = requests.map((r) => this.prepare(r, counterKey));
    const toAdd = prepared.flatMap((p) => p.added);
    if (toAdd.length > 0) {
      try {
        await Promise.all(toAdd.map((e) => this.client.zadd(e.index, 0, e.member)));
      } catch (error) {
        // No CAS was sent; an index entry that did land is harmless (superset).
        const cause = toStoreError(error, 'ZADD', 'read');
        // Retryable as the cause says: a refused ACL or AUTH is not, and retrying would not help.
        throw new StoreError(`${cause.message} (no write was sent)`, 'no', {
          cause: error,
          retryable: cause.retryable,
        });
      }
    }
    const settled = await Promise.allSettled(prepared.map((p) => this.runCas(p)));
    const cleanup: IndexEntry[] = [];
    const results: StampedResult[] = [];
    let firstError: unknown;
    let anyMaybeApplied = false;
    settled.forEach((s, i) => {
      const p = prepared[i]!;
      if (s.status === 'rejected') {
        firstError ??= s.reason;
        if (!(s.reason instanceof StoreError && s.reason.applied === 'no')) anyMaybeApplied = true;
        return;
      }
      const { result, useless } = s.value;
      if (result.ok) anyMaybeApplied = true;
      cleanup.push(...useless);
      if (!result.ok) cleanup.push(...p.added);
      results.push(result);
    });
    if (cleanup.length > 0) {
      // Best effort: a failed removal leaves a harmless extra entry.
      await Promise.allSettled(cleanup.map((e) => this.client.zrem(e.index, e.member)));
    }
    if (firstError !== undefined) {
      if (requests.length === 1 || !anyMaybeApplied) throw firstError;
      throw new StoreError(
        `checkAndSetMany: some writes failed and others may have applied: ${(firstError as Error).message}`,
        'unknown',
        { cause: firstError },
      );
    }
    return results;
  }

  private prepare(request: CasRequest, counterKey?: string): PreparedCas {
    const { table, key, expected, state, notified } = request;
    const token = this.tokens.next();
    const added: IndexEntry[] = [];
    if (state !== null) {
      if (expected === null)
        added.push({ index: scanIndexName(this.namespace, table), member: indexMember(key, token) });
      if (notified)
        added.push({ index: notifyIndexName(this.namespace, table), member: indexMember(key, token) });
    }
    return { request, key, token, added, counterKey };
  }

  private async runCas(p: PreparedCas): Promise<{ result: StampedResult; useless: IndexEntry[] }> {
    const { table, key, expected, state, notified } = p.request;
    const args = [
      expected === null ? 'absent' : 'version',
      expected ?? '',
      state === null ? 'del' : 'put',
      p.token,
      state === null ? '' : Buffer.from(state.buffer, state.byteOffset, state.byteLength),
      notified ? '1' : '0',
    ];
    const keys = [rowKeyName(this.namespace, table, key)];
    if (p.counterKey !== undefined) {
      keys.push(p.counterKey);
      args.push(String(STAMP_OFFSET));
    }
    const what = p.counterKey === undefined ? 'check-and-set' : 'stamped check-and-set';
    let reply: CasReply;
    try {
      reply = (await runScript(this.client, CAS_SCRIPT, keys, args)) as CasReply;
    } catch (error) {
      throw toStoreError(error, what, 'write');
    }
    if (reply[0] === 2) {
      // The script stopped after INCR, before touching the row.
      throw new StoreError(`redis ${what} failed: the counter passed 2^53 - 1`, 'no', {
        retryable: false,
      });
    }
    if (reply[0] !== 1) {
      const [, version, current] = reply;
      const row = version ? { version: version.toString('latin1'), state: current ?? Buffer.alloc(0) } : null;
      return { result: { ok: false, current: row }, useless: [] };
    }
    const oldScanToken = reply[2]?.toString('latin1') ?? '';
    const oldNotifyToken = reply[3]?.toString('latin1') ?? '';
    const useless: IndexEntry[] = [];
    if (oldScanToken)
      useless.push({ index: scanIndexName(this.namespace, table), member: indexMember(key, oldScanToken) });
    if (oldNotifyToken && oldNotifyToken !== p.token) {
      useless.push({
        index: notifyIndexName(this.namespace, table),
        member: indexMember(key, oldNotifyToken),
      });
    }
    if (p.counterKey === undefined) return { result: { ok: true, version: p.token }, useless };
    const stamp = reply[4];
    if (stamp?.length !== 8) {
      throw new StoreError(`redis ${what}: the reply carries no 8-byte stamp`, 'unknown');
    }
    const timestamp = Number(stamp!.readBigUInt64BE(0));
    return { result: { ok: true, version: p.token, timestamp }, useless };
  }
}

/** A row from HMGET v s (both null when absent), as `read`, `readMany` and `readStamped` return it. */
function decodeRow(version: Buffer | null, state: Buffer | null): StoredRow | null {
  if (!version) return null;
  return { version: version.toString('latin1'), state: state ?? Buffer.alloc(0) };
}

/** SCAN one node for `pattern` and UNLINK each key (one by one: keys span many slots). */
async function dropMatching(node: Redis, pattern: string, unlinked: { any: boolean }): Promise<void> {
  let cursor = '0';
  do {
    const [next, keys] = await node.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
    cursor = next;
    if (keys.length > 0) {
      unlinked.any = true;
      await Promise.all(keys.map((k) => node.unlink(k)));
    }
  } while (cursor !== '0');
}

/** A stamped or peeked read's reply: the counter value, then each row's version and state. */
function counterReply(
  reply: unknown,
  rows: number,
  counter: string,
  peeked: boolean,
  what: string,
): { readonly timestamp: number; readonly rows: (StoredRow | null)[] } {
  if (!Array.isArray(reply)) throw new StoreError(`redis ${what}: malformed reply`, 'no');
  const timestamp = reply[0] as unknown;
  if (timestamp === null) {
    throw new StoreError(`redis ${what} failed: counter ${JSON.stringify(counter)} passed 2^53 - 1`, 'no', {
      retryable: false,
    });
  }
  if (
    !Number.isSafeInteger(timestamp) ||
    (timestamp as number) < (peeked ? 0 : 1) ||
    reply.length !== 1 + 2 * rows
  ) {
    throw new StoreError(`redis ${what}: malformed reply`, 'no');
  }
  const out: (StoredRow | null)[] = [];
  for (let i = 0; i < rows; i++) out.push(decodeRow(reply[1 + 2 * i] ?? null, reply[2 + 2 * i] ?? null));
  return { timestamp: timestamp as number, rows: out };
}
