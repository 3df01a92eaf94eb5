import { createRedisClient } from '@percolator/redis';
import { trackCall } from '../critical-path.js';
import {
  CallCounter,
  type Engine,
  type KvTx,
  type LogicalTable,
  nativeKey,
  retryTransaction,
  type TxHints,
  type TxOutcome,
} from './engine.js';

type RedisConnection = ReturnType<typeof createRedisClient>;

const PREFIX = /^[a-z][a-z0-9_]{0,31}$/;
const CHUNK = 500;

/** EXEC returned nil: a WATCHed key changed. The function runs again. */
class WatchAborted extends Error {
  constructor() {
    super('a watched key changed (EXEC aborted)');
  }
}

class RedisTx implements KvTx {
  readonly writes = new Map<string, string>();
  watched = false;
  private reads = 0;

  constructor(
    private readonly conn: RedisConnection,
    private readonly prefix: string,
    private readonly counter: CallCounter,
    private readonly readOnly: boolean,
  ) {}

  key(table: LogicalTable, key: string): string {
    return `${this.prefix}:${nativeKey(table, key)}`;
  }

  async read(table: LogicalTable, keys: readonly string[]): Promise<(string | undefined)[]> {
    const names = keys.map((k) => this.key(table, k));
    if (this.readOnly) {
      // One MGET is atomic: a read-only transaction of one read call needs nothing else.
      if (++this.reads > 1) throw new Error('a read-only Redis transaction may read once');
      this.counter.add(1);
      const values = await trackCall(() => this.conn.mget(...names));
      return values.map((v) => v ?? undefined);
    }
    // WATCH and MGET go out together (one round trip, two commands): the connection sends
    // them in order, so the keys are watched before they are read, as a user pipelining
    // the two would have it. Waiting for WATCH's reply first cost a round trip.
    this.counter.add(1, 2);
    this.watched = true;
    const [, values] = await trackCall(() =>
      Promise.all([this.conn.watch(...names), this.conn.mget(...names)]),
    );
    return values.map((v) => v ?? undefined);
  }

  write(table: LogicalTable, entries: ReadonlyArray<readonly [string, string]>): void {
    for (const [k, v] of entries) this.writes.set(this.key(table, k), v);
  }

  async commit(): Promise<void> {
    if (this.writes.size === 0) {
      if (this.watched) {
        this.counter.add(1);
        await trackCall(() => this.conn.unwatch());
      }
      return;
    }
    // MULTI, MSET, EXEC go out as one pipeline: one round trip, three commands.
    this.counter.add(1, 3);
    const result = await trackCall(() => this.conn.multi().mset(Object.fromEntries(this.writes)).exec());
    if (result === null) throw new WatchAborted();
    for (const [error] of result) if (error) throw error;
  }
}

/**
 * Redis's optimistic transactions (standalone only: WATCH/MULTI cannot span Cluster
 * slots): WATCH the keys read, MGET them, then MULTI/MSET/EXEC; a nil EXEC (a watched
 * key changed) runs the function again. WATCH belongs to a connection, so every
 * concurrent transaction takes a dedicated connection from a small pool.
 */
export class RedisNativeEngine implements Engine {
  readonly mode = 'native';
  readonly variant = 'watch-multi-exec';
  readonly maxRowsPerTxn = Number.POSITIVE_INFINITY;
  readonly singleRowOnly = false;
  readonly dataKey: string;
  private readonly counter = new CallCounter();
  private readonly idle: RedisConnection[] = [];
  private readonly all = new Set<RedisConnection>();
  private readonly keys = new Map<LogicalTable, string[]>();

  constructor(
    private readonly url: string,
    private readonly prefix: string,
    private readonly maxAttempts: number,
  ) {
    if (!PREFIX.test(prefix)) throw new Error(`bad key prefix ${prefix}`);
    this.dataKey = `native:redis:${prefix}`;
  }

  private async acquire(): Promise<RedisConnection> {
    const conn = this.idle.pop();
    if (conn) return conn;
    const fresh = createRedisClient(this.url);
    fresh.on('error', () => {
      // Reported through the failed command.
    });
    await fresh.connect();
    this.all.add(fresh);
    return fresh;
  }

  private discard(conn: RedisConnection): void {
    this.all.delete(conn);
    conn.disconnect();
  }

  async transact<T>(fn: (tx: KvTx) => Promise<T>, hints?: TxHints): Promise<TxOutcome<T>> {
    const conn = await this.acquire();
    try {
      const outcome = await retryTransaction(
        this.maxAttempts,
        (error) => error instanceof WatchAborted,
        async () => {
          const tx = new RedisTx(conn, this.prefix, this.counter, hints?.readOnly === true);
          const value = await fn(tx);
          await tx.commit();
          return value;
        },
      );
      this.idle.push(conn);
      return outcome;
    } catch (error) {
      // A connection may be left with keys WATCHed: never reuse it after a failure.
      this.discard(conn);
      throw error;
    }
  }

  async load(table: LogicalTable, entries: ReadonlyArray<readonly [string, string]>): Promise<void> {
    const conn = await this.acquire();
    try {
      const names: string[] = [];
      for (let i = 0; i < entries.length; i += CHUNK) {
        const chunk: Record<string, string> = {};
        for (const [k, v] of entries.slice(i, i + CHUNK)) {
          const name = `${this.prefix}:${nativeKey(table, k)}`;
          chunk[name] = v;
          names.push(name);
        }
        await conn.mset(chunk);
      }
      this.keys.set(table, [...(this.keys.get(table) ?? []), ...names]);
    } finally {
      this.idle.push(conn);
    }
  }

  async snapshot(table: LogicalTable): Promise<Map<string, string>> {
    const names = this.keys.get(table) ?? [];
    const conn = await this.acquire();
    try {
      const out = new Map<string, string>();
      const strip = `${this.prefix}:${nativeKey(table, '')}`.length;
      for (let i = 0; i < names.length; i += CHUNK) {
        const chunk = names.slice(i, i + CHUNK);
        const values = await conn.mget(...chunk);
        chunk.forEach((name, j) => {
          const value = values[j];
          if (value !== null && value !== undefined) out.set(name.slice(strip), value);
        });
      }
      return out;
    } finally {
      this.idle.push(conn);
    }
  }

  counters() {
    return { roundTrips: this.counter.roundTrips, commands: this.counter.commands };
  }

  /** e.g. "Redis 7.0.15" (for the report). */
  async serverVersion(): Promise<string> {
    const conn = await this.acquire();
    try {
      return `Redis ${/redis_version:([^\r\n]+)/.exec(await conn.info('server'))?.[1] ?? '?'}`;
    } finally {
      this.idle.push(conn);
    }
  }

  /** Deletes the keys it created and closes its connections. */
  async close(): Promise<void> {
    try {
      const names = [...this.keys.values()].flat();
      if (names.length > 0) {
        const conn = await this.acquire();
        for (let i = 0; i < names.length; i += CHUNK) await conn.unlink(...names.slice(i, i + CHUNK));
        this.idle.push(conn);
      }
    } finally {
      for (const conn of this.all) conn.disconnect();
      this.all.clear();
      this.idle.length = 0;
    }
  }
}
