// The RowStore contract's own types: every store (and the contract check) names the same
// list, by necessity; `duplicates` pairs these import lists.
import {
  type CasRequest,
  type CasResult,
  ClosedError,
  checkedStore,
  InvalidArgumentError,
  type NotificationScanOptions,
  type RowRef,
  RowTooLargeError,
  redactUrl,
  type ScannedStoredRow,
  type ScanOptions,
  STAMP_OFFSET,
  type StampedManyResult,
  type StoreCapabilities,
  type StoredRow,
  StoreError,
} from '@percolator/core';
import {
  backoffMs,
  type CasPlan,
  canonicalIntegerVersions,
  checkStampedManyRequests,
  DEFAULT_QUERY_TIMEOUT_MS,
  type EncodedRef,
  encodeRef,
  failedWithCurrent,
  fullCapabilities,
  type NamespacedStore,
  openPooled,
  POOLED_STORE_OPTION_KEYS,
  type PooledStoreOptions,
  packRounds,
  partlyApplied,
  planCas,
  settleBatch,
  sleep,
  toBytes,
  toSafeCounter,
} from '@percolator/core/kit';
import type { Connection as CoreConnection, QueryOptions } from 'mysql2';
import { createPool, format, type Pool, type PoolConnection, type SqlValue } from 'mysql2/promise';
import { MYSQL_URL } from './env.js';
import {
  connectError,
  ER_DUP_ENTRY,
  ER_LOCK_DEADLOCK,
  ER_MAX_PREPARED_STMT_COUNT_REACHED,
  errnoOf,
  isConnectionBroken,
  readError,
  writeError,
} from './errors.js';
import type { OptionKeys } from './options.js';
import {
  type MySqlNames,
  mysqlDropStatements,
  mysqlNames,
  mysqlSchemaStatements,
  schemaLockName,
} from './schema.js';
import { SESSION_SETTINGS_SQL, sessionSettingsError, wrongSessionSettings } from './session.js';
import { type MySqlStatements, mysqlStatements } from './statements.js';
import { VersionAllocator } from './versions.js';

/**
 * How often checkAndSetStampedMany sends its CALL when InnoDB picks it as a deadlock victim
 * (ER_LOCK_DEADLOCK: the whole transaction was rolled back, so sending it again is safe).
 * Its locks are taken in one order (schema.ts), but InnoDB's lock inheritance (an insert
 * rolled back, a deleted row purged) can still make concurrent creators of one key
 * deadlock; an error is left for the rare case that this happens again and again.
 */
const STAMPED_MANY_ATTEMPTS = 4;

/** Never more than this per state, even when max_allowed_packet would allow it. */
const STATE_CAP_BYTES = 64 * 1024 * 1024;
/** Room in every packet for SQL text, key, table name and protocol framing. */
const PACKET_HEADROOM_BYTES = 64 * 1024;

/**
 * The largest state that fits one statement: max_allowed_packet bounds the whole SQL text,
 * and a state travels in it as a hex literal (2 characters per byte).
 */
export function maxStateBytesFor(maxAllowedPacket: number): number {
  return Math.max(0, Math.min(STATE_CAP_BYTES, Math.floor((maxAllowedPacket - PACKET_HEADROOM_BYTES) / 2)));
}

/*
 * What the SQL adapters share lives in @percolator/core/kit (openPooled, planCas,
 * settleBatch, failureMapping, ...). What is left here has the same shape in both on
 * purpose (options, the version rule, the store type, the factory, connection handling,
 * row decoding) and holds this dialect's values and statements; `duplicates` pairs them
 * by shape.
 */
export interface MySqlStoreOptions extends PooledStoreOptions {
  /** Used when no `pool` is given. Default: $PERCOLATOR_MYSQL_URL or mysql://root@127.0.0.1:3306/test. */
  readonly uri?: string;
  /**
   * A `mysql2/promise` pool you own; `close()` leaves it open. Enable `multipleStatements`
   * on it for one-round-trip `checkAndSetMany` (without it, requests are sent one by one).
   */
  readonly pool?: Pool;
}

export { DEFAULT_QUERY_TIMEOUT_MS };

/** Versions are BIGINT UNSIGNED values; any other token matches no row. */
const isIssuableVersion = canonicalIntegerVersions(18446744073709551615n);

const OPTION_KEYS: OptionKeys<MySqlStoreOptions> = { uri: true, ...POOLED_STORE_OPTION_KEYS };

/**
 * Every optional method is implemented. stampedCheckAndSet, stampedRead and
 * stampedCheckAndSetMany are declared only when the namespace has the stamped CAS /
 * stamped read / stamped CAS-of-many procedure (createSchema makes all three); without it
 * the method fails (StoreError 'no').
 */
export type MySqlStore = NamespacedStore;

export async function createMySqlStore(options: MySqlStoreOptions = {}): Promise<MySqlStore> {
  const opening = openPooled('createMySqlStore', options, OPTION_KEYS, MYSQL_URL);
  const { url: uri, ownsPool, queryTimeoutMs } = opening;
  const names = mysqlNames(opening.namespace);
  if (
    options.pool !== undefined &&
    !['getConnection', 'query', 'end'].every(
      (m) => typeof (options.pool as unknown as Record<string, unknown>)[m] === 'function',
    )
  )
    throw new InvalidArgumentError(
      'createMySqlStore: pool must be a mysql2/promise Pool (createPool(...)): it has no getConnection, query and end methods',
    );
  let pool: Pool;
  try {
    pool =
      options.pool ??
      createPool({
        uri,
        connectionLimit: options.maxConnections ?? 10,
        multipleStatements: true,
        connectTimeout: 10_000,
        charset: 'utf8mb4',
        // TCP keepalive, so a connection to a vanished server is eventually noticed while idle.
        enableKeepAlive: true,
      });
  } catch (error) {
    // mysql2 parses the URL here: a password with a bare % threw a URIError, and a URL that
    // does not parse a TypeError whose `input` holds the whole URL, password and all. Only
    // the redacted URL is kept.
    throw new InvalidArgumentError(
      `createMySqlStore: mysql2 could not make a pool from ${redactUrl(uri)} (${error instanceof Error ? error.name : 'error'}): not a usable MySQL URL? Percent-encode special characters in the password`,
    );
  }
  const multipleStatements = hasMultipleStatements(pool);
  const connector = new Connector(pool, names.namespace, queryTimeoutMs);
  let sessionChecked = false;
  try {
    // The first connection's session settings are checked (Connector.connect) before
    // anything else is sent, so a refused pool writes nothing, not even the schema.
    (await connector.connect()).release();
    sessionChecked = true;
    if (options.createSchema !== false)
      await underSchemaLock(connector, mysqlSchemaStatements(names.namespace));
    const settings = (await connector.run('read server settings', 'read', mysqlStatements(names).settings, [
      names.stampedCasRoutine,
      names.stampedReadRoutine,
      names.stampedCasManyRoutine,
      ...names.stampedSlots.map((s) => s.routine),
    ])) as {
      p: unknown;
      stamped: unknown;
      stamped_read: unknown;
      stamped_many: unknown;
      stamped_slots: unknown;
    }[];
    const maxAllowedPacket = Number(settings[0]!.p);
    const store = new MySqlRowStore(
      connector,
      ownsPool,
      names,
      maxAllowedPacket,
      multipleStatements,
      {
        stampedCheckAndSet: Number(settings[0]!.stamped) > 0,
        stampedRead: Number(settings[0]!.stamped_read) > 0,
        stampedCheckAndSetMany: Number(settings[0]!.stamped_many) > 0,
      },
      Number(settings[0]!.stamped_slots) === names.stampedSlots.length,
    );
    await store.prepare();
    return checkedStore<MySqlStore>(store);
  } catch (error) {
    if (error instanceof Error && options.createSchema === false && sessionChecked) {
      error.message += ` (is the schema of namespace ${names.namespace} created? see mysqlSchemaSql())`;
    }
    if (ownsPool) await pool.end().catch(() => {});
    opening.explain(error);
    throw error;
  }
}

/** mysql2 keeps the pool's connection options here (not in its public typings). */
function hasMultipleStatements(pool: Pool): boolean {
  const core = pool.pool as unknown as { config?: { connectionConfig?: { multipleStatements?: unknown } } };
  return core?.config?.connectionConfig?.multipleStatements === true;
}

/**
 * Checks connections out and classifies failures (see errors.ts). Each connection's session
 * settings are checked the first time the store gets it (session.ts says which and why):
 * one more round trip per connection, not per call. Not in the pool's 'connection' event:
 * a pool passed in may already hold connections made before the store could listen, and
 * the server's defaults may change while the store runs. Refused rather than set back with
 * SET SESSION: the pool is the caller's, whose own queries may rely on its settings (and
 * mysql2 does not reset a session on release, so setting them per call would cost a round
 * trip each time). A session changed on a connection after the store checked it is not seen.
 */
class Connector {
  closed = false;
  /** mysql2's core connections whose session passed the check. */
  private readonly checked = new WeakSet<object>();

  constructor(
    readonly pool: Pool,
    readonly namespace: string,
    readonly queryTimeoutMs: number,
  ) {}

  async connect(): Promise<PoolConnection> {
    if (this.closed) throw new ClosedError(`mysql store (namespace ${this.namespace}) is closed`);
    let connection: PoolConnection;
    try {
      connection = await this.pool.getConnection();
    } catch (error) {
      throw connectError(error);
    }
    const core = coreOf(connection);
    if (!this.checked.has(core)) {
      let wrong: string[];
      try {
        const rows = (await query(
          connection,
          'check session settings',
          'read',
          SESSION_SETTINGS_SQL,
          undefined,
          1,
          this.queryTimeoutMs,
        )) as Row[];
        wrong = wrongSessionSettings(rows);
      } catch (error) {
        if (error instanceof StoreError && isConnectionBroken(error.cause)) connection.destroy();
        else connection.release();
        throw error;
      }
      if (wrong.length > 0) {
        // The caller's connection is sound; it goes back to their pool unchanged.
        connection.release();
        throw sessionSettingsError(this.namespace, wrong);
      }
      this.checked.add(core);
    }
    return connection;
  }

  /** One query on a pooled connection. `statements` > 1 marks a multi-statement batch. */
  async run(
    what: string,
    mode: 'read' | 'write',
    sql: string,
    values?: unknown[],
    statements = 1,
  ): Promise<unknown> {
    const connection = await this.connect();
    return withConnection(connection, () =>
      query(connection, what, mode, sql, values, statements, this.queryTimeoutMs),
    );
  }
}

/** Runs `work`, then returns the connection to the pool, or destroys it if it broke. */
async function withConnection<T>(connection: PoolConnection, work: () => Promise<T>): Promise<T> {
  let broken = false;
  try {
    return await work();
  } catch (error) {
    broken = error instanceof StoreError && isConnectionBroken(error.cause);
    throw error;
  } finally {
    if (broken) connection.destroy();
    else connection.release();
  }
}

async function query(
  connection: PoolConnection,
  what: string,
  mode: 'read' | 'write',
  sql: string,
  values?: unknown[],
  statements = 1,
  timeout?: number,
  prepared = false,
): Promise<unknown> {
  try {
    // Per-query options override pool settings a user may have changed: rows as objects,
    // BLOBs as Buffers. A `timeout` error leaves the statement running on the server; it
    // counts as a broken connection (errors.ts), so `withConnection` destroys it.
    return await send(connection, { sql, values, ...ROW_SHAPE, typeCast: true, timeout }, prepared);
  } catch (error) {
    throw mode === 'read' ? readError(what, error) : writeError(what, error, statements > 1);
  }
}

/**
 * A query on the callback connection under mysql2's promise wrapper. The wrapper's `query`
 * captures a stack trace on every call (its `trace` option, on by default), which cost
 * about a third of a call's client CPU; a failure here is wrapped in a StoreError whose
 * `cause` is the driver's error, so that trace adds nothing.
 *
 * `prepared`: as a server-side prepared statement (binary protocol; mysql2 prepares it once
 * per connection and keeps it), for the stamped procedures' CALLs only (see callProcedure).
 */
function send(connection: PoolConnection, options: QueryOptions, prepared = false): Promise<unknown> {
  const core = coreOf(connection);
  return new Promise((resolve, reject) => {
    const done = (error: unknown, result: unknown) => (error ? reject(error) : resolve(result));
    const { timeout } = options;
    if (!prepared) core.query(options, done);
    else if (timeout === undefined || preparedOn(core).has(options.sql)) core.execute(options, done);
    else firstExecute(core, options, timeout, done);
  });
}

/**
 * How every query asks for its rows: as objects, not arrays or nested tables (a pool passed
 * in may default otherwise). mysql2 keys a connection's prepared statements by these
 * options and the text (its statementKey), so `unprepare` must be given the same.
 */
const ROW_SHAPE = { rowsAsArray: false, nestTables: false } as const;

/** Per connection, the statements mysql2 has prepared there (their EXECUTE is timed alone). */
const prepared = new WeakMap<CoreConnection, Set<string>>();

function preparedOn(core: CoreConnection): Set<string> {
  let set = prepared.get(core);
  if (!set) prepared.set(core, (set = new Set()));
  return set;
}

/**
 * Whether mysql2 has closed this connection, or given it up after a fatal error: its server
 * session is gone with every statement prepared on it, and a command added now would only
 * be answered with an 'error' event on the connection (mysql2 internals, checked as
 * mysql2 3.x sets them in close() and _handleFatalError()).
 */
function isClosed(core: CoreConnection): boolean {
  const state = core as unknown as {
    _closing?: unknown;
    _fatalError?: unknown;
    stream?: { destroyed?: unknown };
  };
  return state._closing === true || (state._fatalError ?? null) !== null || state.stream?.destroyed === true;
}

/**
 * Closes the prepared statements of these texts on `core` (COM_STMT_CLOSE). mysql2 queues
 * the command behind whatever the connection is running, so this is safe on a connection
 * that someone else has checked out or that is busy: the statement is closed after the
 * commands already queued (an EXECUTE of it among them), and the server sends no reply, so
 * nobody waits and nothing else on the connection changes. A later EXECUTE of the same
 * text (another store of the namespace on this pool) prepares it again. (mysql2's unprepare
 * sends the close twice, once from its cache's eviction hook; the server ignores a close of
 * an id it no longer holds, and ids are not reused within a session.)
 */
function closeStatements(core: CoreConnection, texts: Iterable<string>): void {
  if (isClosed(core)) return; // the server freed them with the session
  for (const sql of texts) {
    prepared.get(core)?.delete(sql);
    try {
      // mysql2 types only unprepare(sql: string), whose key would lack ROW_SHAPE.
      (core.unprepare as unknown as (options: object) => unknown)({ sql, ...ROW_SHAPE });
    } catch {
      // The connection closed in between: the server freed the statement with it.
    }
  }
}

/**
 * The stamped CALL texts one store has sent as prepared statements, per connection, so
 * that it can close them again (`release`). On a pool passed in, nothing else would: the
 * connections outlive the store, and every statement left prepared counts against the
 * server's max_prepared_stmt_count, shared by every client of the server (a review saw
 * one pool of 4 connections hold 8 more after each of 5 stores was dropped and closed).
 */
class PreparedCalls {
  private readonly held = new Map<CoreConnection, Set<string>>();
  /**
   * Bumped by each release(). A CALL that was out at that moment may have prepared its
   * statement after release() looked (mysql2 caches it when the PREPARE's reply comes):
   * the CALL sees the epoch change when it ends and closes it there (callProcedure).
   */
  epoch = 0;

  /** Before a prepared CALL of `sql` on `core`. */
  note(core: CoreConnection, sql: string): void {
    let texts = this.held.get(core);
    if (texts === undefined) {
      // A connection not seen before: forget those closed since (the server freed theirs),
      // so a pool that replaces its connections does not grow this map.
      for (const other of this.held.keys()) if (isClosed(other)) this.held.delete(other);
      this.held.set(core, (texts = new Set()));
    }
    texts.add(sql);
  }

  /** `core` is being destroyed: the server frees its statements. */
  forget(core: CoreConnection): void {
    this.held.delete(core);
  }

  /** Closes, on `core`, the statement of `sql` that a CALL out during release() prepared. */
  releaseLate(core: CoreConnection, sql: string): void {
    this.held.get(core)?.delete(sql);
    closeStatements(core, [sql]);
  }

  /** Closes every statement this store prepared, on every connection still open. */
  release(): void {
    this.epoch++;
    for (const [core, texts] of this.held) closeStatements(core, texts);
    this.held.clear();
  }
}

/**
 * The first run of a statement on a connection: mysql2 sends PREPARE, then EXECUTE, and
 * times only the EXECUTE (`timeout` starts when it starts): a PREPARE whose reply never
 * came (a network partition on a new connection) waited for TCP to give up, some 15
 * minutes. So the two are timed together here, and a timeout fails the call as mysql2's
 * own would (no answer: the caller destroys the connection; a write's outcome is unknown).
 */
function firstExecute(
  core: CoreConnection,
  options: QueryOptions,
  timeout: number,
  done: (error: unknown, result: unknown) => void,
): void {
  let settled = false;
  const timer = setTimeout(() => {
    settled = true;
    const error = Object.assign(new Error('Query inactivity timeout (preparing the statement)'), {
      code: 'PROTOCOL_SEQUENCE_TIMEOUT',
      fatal: true,
      timeout,
    });
    done(error, undefined);
  }, timeout);
  try {
    core.execute(options, (error: unknown, result: unknown) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      if (!error) preparedOn(core).add(options.sql);
      done(error, result);
    });
  } catch (error) {
    // Refused before sending (a bad bind value, say): no timer left running.
    settled = true;
    clearTimeout(timer);
    done(error, undefined);
  }
}

/** The callback connection under mysql2's promise wrapper (a new wrapper each checkout). */
function coreOf(connection: PoolConnection): CoreConnection {
  return (connection as unknown as { readonly connection: CoreConnection }).connection;
}

/** DDL under a named lock, so processes starting at once create the tables one at a time. */
async function underSchemaLock(connector: Connector, statements: readonly string[]): Promise<void> {
  const connection = await connector.connect();
  const lock = schemaLockName(connector.namespace);
  const what = `schema change for namespace ${connector.namespace}`;
  await withConnection(connection, async () => {
    const rows = (await query(connection, what, 'write', 'SELECT GET_LOCK(?, 60) AS got', [lock])) as Row[];
    if (Number(rows[0]?.got) !== 1) {
      throw new StoreError(`mysql: ${what}: timed out waiting for lock ${lock}`, 'no');
    }
    try {
      for (const statement of statements) await query(connection, what, 'write', statement);
    } finally {
      await connection.query('DO RELEASE_LOCK(?)', [lock]).catch(() => {});
    }
  });
}

interface ResultHeader {
  readonly affectedRows: number;
  readonly insertId: number | string;
}

type Row = Record<string, unknown>;

class MySqlRowStore implements MySqlStore {
  readonly name = 'mysql';
  readonly capabilities: StoreCapabilities;
  readonly namespace: string;
  private readonly sql: MySqlStatements;
  private readonly versions: VersionAllocator;
  /** Largest SQL text of one round trip (max_allowed_packet minus headroom). */
  private readonly packetBudget: number;
  /**
   * The fixed-slot procedures' sizes, ascending, if the schema has all of them (else empty:
   * the many-row procedure takes every step).
   */
  private readonly slotSizes: readonly number[];
  /**
   * Whether the CALLs go as prepared statements (callProcedure): until the server refuses
   * a PREPARE for its cap on them (max_prepared_stmt_count, across all its connections),
   * then plain queries for the rest of this store's life.
   */
  private prepareCalls = true;
  /** What those prepared, where: closed by close() and dropNamespace() (PreparedCalls). */
  private readonly preparedCalls = new PreparedCalls();

  constructor(
    private readonly connector: Connector,
    private readonly ownsPool: boolean,
    names: MySqlNames,
    maxAllowedPacket: number,
    private readonly multipleStatements: boolean,
    procedures: Pick<StoreCapabilities, 'stampedCheckAndSet' | 'stampedRead' | 'stampedCheckAndSetMany'>,
    /** Whether the schema has every fixed-slot procedure. */
    slots: boolean,
  ) {
    this.namespace = names.namespace;
    this.slotSizes =
      slots && procedures.stampedCheckAndSetMany === true ? names.stampedSlots.map((s) => s.slots) : [];
    this.sql = mysqlStatements(names);
    this.packetBudget = maxAllowedPacket - PACKET_HEADROOM_BYTES;
    this.capabilities = fullCapabilities(maxStateBytesFor(maxAllowedPacket), procedures);
    this.versions = new VersionAllocator(async () => {
      const header = (await this.connector.run(
        'reserve a version block',
        'write',
        this.sql.reserveVersionBlock,
      )) as ResultHeader;
      return BigInt(header.insertId);
    });
  }

  prepare(): Promise<void> {
    return this.versions.prepare();
  }

  async read(table: string, key: string): Promise<StoredRow | null> {
    const ref = encodeRef({ table, key });
    const rows = (await this.connector.run('read', 'read', this.sql.read, [ref.tbl, ref.key])) as Row[];
    return rows.length === 0 ? null : toStoredRow(rows[0]!);
  }

  async checkAndSet(request: CasRequest): Promise<CasResult> {
    const plan = planCas(request, isIssuableVersion);
    switch (plan.kind) {
      case 'unmatchable':
        return this.failure(request);
      case 'ensureAbsent': {
        const current = await this.read(request.table, request.key);
        return current === null ? { ok: true, version: await this.newVersion() } : { ok: false, current };
      }
      case 'create': {
        const version = await this.newVersion();
        try {
          await this.connector.run('create', 'write', this.sql.create, createValues(plan, version));
          return { ok: true, version };
        } catch (error) {
          if (error instanceof StoreError && errnoOf(error.cause) === ER_DUP_ENTRY)
            return this.failure(request);
          throw error;
        }
      }
      case 'update':
      case 'delete': {
        const version = await this.newVersion();
        const [sql, values] = changeStatement(this.sql, plan, version);
        const header = (await this.connector.run(plan.kind, 'write', sql, values)) as ResultHeader;
        return header.affectedRows === 1 ? { ok: true, version } : this.failure(request);
      }
    }
  }

  async readMany(refs: readonly RowRef[]): Promise<(StoredRow | null)[]> {
    const encoded = refs.map(encodeRef);
    const found = new Map<string, Row>();
    // A key travels as a hex literal: at most ~2.2 KB of SQL per requested row.
    const perRound = Math.max(1, Math.min(1000, Math.floor(this.packetBudget / 2400)));
    for (let start = 0; start < encoded.length; start += perRound) {
      const chunk = encoded.slice(start, start + perRound);
      const [where, values] = whereRowsIn(chunk);
      const rows = (await this.connector.run(
        'readMany',
        'read',
        this.sql.readManyPrefix + where,
        values,
      )) as Row[];
      for (const row of rows) found.set(rowId(row.tbl as Buffer, row.row_key as Buffer), row);
    }
    return encoded.map((ref) => {
      const row = found.get(rowId(ref.tbl, ref.key));
      return row === undefined ? null : toStoredRow(row);
    });
  }

  /**
   * One SELECT, one read view (statements.ts, readPeekedPrefix); writes nothing. Rows past
   * one packet's worth are read after it, like readStamped's: later reads of a snapshot
   * are fine, only the first must not predate the value.
   */
  async readPeeked(
    refs: readonly RowRef[],
    counter: string,
  ): Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }> {
    const encoded = refs.map(encodeRef);
    const perRound = Math.max(1, Math.min(1000, Math.floor(this.packetBudget / 2400)));
    const first = encoded.slice(0, perRound);
    const [where, values] = first.length > 0 ? whereRowsIn(first) : ['FALSE', []];
    const reply = (await this.connector.run('readPeeked', 'read', this.sql.readPeekedPrefix + where, [
      Buffer.from(counter, 'utf8'),
      ...values,
    ])) as Row[];
    let timestamp: number | undefined;
    const found = new Map<string, Row>();
    for (const row of reply) {
      if (row.tbl === null) timestamp = toSafeCounter(String(row.version), counter);
      else found.set(rowId(row.tbl as Buffer, row.row_key as Buffer), row);
    }
    if (timestamp === undefined)
      throw new StoreError('mysql: peeked read: no counter value in the reply', 'no');
    const rows = first.map((ref) => {
      const row = found.get(rowId(ref.tbl, ref.key));
      return row === undefined ? null : toStoredRow(row);
    });
    if (encoded.length > perRound) rows.push(...(await this.readMany(refs.slice(perRound))));
    return { timestamp, rows };
  }

  async checkAndSetMany(requests: readonly CasRequest[]): Promise<CasResult[]> {
    const plans = requests.map((request) => planCas(request, isIssuableVersion));
    if (!this.multipleStatements) {
      // A user pool without multipleStatements: one statement per request, in order.
      const results: CasResult[] = [];
      for (const request of requests) {
        results.push(
          await this.checkAndSet(request).catch((error: unknown) => {
            throw results.length > 0 ? partlyApplied(error) : error;
          }),
        );
      }
      return results;
    }
    const outcomes: (CasResult | undefined)[] = plans.map(() => undefined);
    const batch: { index: number; sql: string; version: string }[] = [];
    for (const [index, plan] of plans.entries()) {
      if (plan.kind === 'unmatchable') continue;
      const version = await this.newVersion();
      batch.push({ index, sql: batchStatement(this.sql, plan, version), version });
    }
    let sentBefore = false;
    for (const round of packRounds(batch, this.packetBudget)) {
      const raw = await this.connector
        .run('checkAndSetMany', 'write', round.map((s) => s.sql).join(';\n'), undefined, round.length)
        .catch((error: unknown) => {
          throw sentBefore ? partlyApplied(error) : error;
        });
      sentBefore = true;
      // mysql2 returns a list of results only when the text held several statements.
      const results = (round.length === 1 ? [raw] : raw) as unknown[];
      round.forEach((statement, position) => {
        const result = results[position];
        if (Array.isArray(result)) {
          // ensureAbsent: a SELECT of the row; no row = success.
          const row = result[0] as Row | undefined;
          outcomes[statement.index] =
            row === undefined
              ? { ok: true, version: statement.version }
              : { ok: false, current: toStoredRow(row) };
        } else if ((result as ResultHeader).affectedRows === 1) {
          outcomes[statement.index] = { ok: true, version: statement.version };
        }
      });
    }
    return settleBatch(requests, outcomes, (refs) => this.readMany(refs));
  }

  async scan(table: string, options: ScanOptions): Promise<ScannedStoredRow[]> {
    const values: unknown[] = [Buffer.from(table, 'utf8')];
    let sql = this.sql.scanPrefix;
    const bound = (fragment: string, value: string | undefined) => {
      if (value === undefined) return;
      values.push(Buffer.from(value, 'utf8'));
      sql += ` AND row_key ${fragment} ?`;
    };
    bound('>=', options.start);
    bound('<', options.end);
    bound('>', options.after);
    values.push(options.limit);
    sql += ' ORDER BY row_key LIMIT ?';
    const rows = (await this.connector.run('scan', 'read', sql, values)) as Row[];
    return rows.map((row) => ({ key: (row.row_key as Buffer).toString('utf8'), row: toStoredRow(row) }));
  }

  async scanNotified(table: string, options: NotificationScanOptions): Promise<string[]> {
    const values: unknown[] = [Buffer.from(table, 'utf8')];
    let sql = this.sql.scanNotifiedPrefix;
    if (options.after !== undefined) {
      values.push(Buffer.from(options.after, 'utf8'));
      sql += ' AND row_key > ?';
    }
    values.push(options.limit);
    sql += ' ORDER BY row_key LIMIT ?';
    const rows = (await this.connector.run('scanNotified', 'read', sql, values)) as Row[];
    return rows.map((row) => (row.row_key as Buffer).toString('utf8'));
  }

  async incrementCounter(name: string, delta: number): Promise<number> {
    const header = (await this.connector.run('incrementCounter', 'write', this.sql.increment, [
      Buffer.from(name, 'utf8'),
      delta,
      delta,
    ])) as ResultHeader;
    return toSafeCounter(String(header.insertId), name);
  }

  /**
   * One CALL of the namespace's stamped CAS procedure (schema.ts explains the steps, why a
   * later counter value implies this write is visible, and why a procedure): one round trip,
   * one InnoDB transaction. The counter advances only when the CAS applies (a failed CAS
   * rolls back before drawing). Same inputs, limits, versions and failure mapping as
   * `checkAndSet`: RowTooLargeError before sending, a lost or timed-out reply is 'unknown',
   * a server error answer is 'no' (the procedure rolled back before answering).
   */
  async checkAndSetStamped(
    request: CasRequest & { readonly state: Uint8Array },
    counter: string,
  ): Promise<CasResult & { timestamp?: number }> {
    if (this.capabilities.stampedCheckAndSet !== true) {
      throw new StoreError(
        `mysql: checkAndSetStamped needs the procedure ${mysqlNames(this.namespace).stampedCasRoutine}, ` +
          'which this schema lacks (capabilities.stampedCheckAndSet is false); run mysqlSchemaSql() again',
        'no',
        { retryable: false },
      );
    }
    // The state is never null here (the contract check), so the plan creates or updates.
    const plan = planCas(request, isIssuableVersion);
    if (plan.kind !== 'create' && plan.kind !== 'update') return this.failure(request); // unmatchable
    const name = Buffer.from(counter, 'utf8');
    const version = await this.newVersion();
    const expected = plan.kind === 'update' ? plan.expected : null;
    const results = (await this.callProcedure('checkAndSetStamped', 'write', this.sql.stampedCas, [
      plan.tbl,
      plan.key,
      expected,
      version,
      plan.state,
      plan.notified,
      name,
      STAMP_OFFSET,
    ])) as unknown[];
    // A CALL answers its SELECT's rows, then the CALL's own OK packet.
    const row = (results[0] as Row[])[0];
    if (row === undefined) return { ok: false, current: null }; // CAS failed, row absent
    if (Number(row.applied) !== 1) return { ok: false, current: toStoredRow(row) };
    // Applied; a stamp beyond 2^53 cannot be a JS number, so that throws (never a plain failure).
    return { ok: true, version, timestamp: toSafeCounter(String(row.ts), counter) };
  }

  /**
   * One CALL of the namespace's stamped CAS-of-many procedure (schema.ts explains the
   * steps, why it is all or nothing, why a later counter value implies every row is
   * visible, and why it cannot deadlock): one round trip, one InnoDB transaction for the
   * writes. The rows travel as one bound JSON string, sorted here in (table, key) byte
   * order, the order the procedure locks them in (it refuses any other), and the states as
   * one bound blob. Versions come back in request order. A failure answers every requested
   * row as it is now (from the procedure's snapshot: no extra round trip) and draws nothing.
   *
   * Refused before sending (nothing written): a schema without the procedure (StoreError
   * 'no', not retryable), a row named twice or a request without a state
   * (InvalidArgumentError), a state past maxStateBytes or states that together do not fit
   * one packet (RowTooLargeError). A version this store never issues fails the call
   * without sending it. Failure mapping as for checkAndSetStamped: a lost or timed-out
   * reply is 'unknown', a server error answer is 'no' (rolled back before answering).
   */
  async checkAndSetStampedMany(
    requests: readonly (CasRequest & { readonly state: Uint8Array })[],
    counter: string,
  ): Promise<StampedManyResult> {
    if (this.capabilities.stampedCheckAndSetMany !== true) {
      throw new StoreError(
        `mysql: checkAndSetStampedMany needs the procedure ${mysqlNames(this.namespace).stampedCasManyRoutine}, ` +
          'which this schema lacks (capabilities.stampedCheckAndSetMany is false); run mysqlSchemaSql() again',
        'no',
        { retryable: false },
      );
    }
    checkStampedManyRequests(requests, this.capabilities.maxStateBytes);
    const plans = requests.map((request) => planCas(request, isIssuableVersion));
    // With a state, a plan creates, updates or cannot match.
    const writes = plans.filter(
      (plan): plan is Extract<CasPlan, { kind: 'create' | 'update' }> =>
        plan.kind === 'create' || plan.kind === 'update',
    );
    // An expected version this store never issued matches no row: fails, nothing sent.
    if (writes.length < plans.length) return this.failureMany(requests);
    // New versions in request order; the rows travel in (table, key) byte order, the order
    // the procedure locks them in (it refuses any other). `sorted[j]` is the request index
    // of the j-th row sent.
    const versions: string[] = [];
    for (let i = 0; i < writes.length; i++) versions.push(await this.newVersion());
    const sorted = writes.map((_, i) => i).sort((a, b) => compareRows(writes[a]!, writes[b]!));
    const entries: unknown[][] = [];
    const states: Buffer[] = [];
    let at = 1;
    for (const i of sorted) {
      const plan = writes[i]!;
      entries.push([
        plan.tbl.toString('hex'),
        plan.key.toString('hex'),
        plan.kind === 'update' ? plan.expected : null,
        versions[i],
        at,
        plan.state.length,
        plan.notified ? 1 : 0,
      ]);
      states.push(plan.state);
      at += plan.state.length;
    }
    const json = JSON.stringify(entries);
    const name = Buffer.from(counter, 'utf8');
    // The SQL text: the JSON (at most doubled by escaping) and the blob and counter name as
    // hex literals (2 characters per byte).
    const textBytes = 2 * json.length + 2 * (at - 1) + 2 * name.length;
    if (textBytes > this.packetBudget) {
      throw new RowTooLargeError(
        `mysql: the ${requests.length} states of checkAndSetStampedMany (${at - 1} bytes) do not fit one ` +
          `statement of max_allowed_packet (${this.packetBudget + PACKET_HEADROOM_BYTES} bytes); nothing was sent`,
      );
    }
    // A step of up to 16 rows goes to the smallest fixed-slot procedure it fits (schema.ts,
    // stampedSlotsProcedure: one statement for all rows), the rows in the same order, each
    // slot's number its position; a larger one to the many-row procedure.
    const slots = this.slotSizes.find((size) => size >= sorted.length);
    let sql: string;
    let values: unknown[];
    if (slots === undefined) {
      sql = this.sql.stampedCasMany;
      values = [json, Buffer.concat(states), name, STAMP_OFFSET];
    } else {
      sql = this.sql.stampedSlots.get(slots)!;
      values = [writes.filter((plan) => plan.kind === 'update').length];
      for (const i of sorted) {
        const plan = writes[i]!;
        values.push(
          plan.tbl,
          plan.key,
          plan.kind === 'update' ? plan.expected : null,
          versions[i],
          plan.state,
          plan.notified ? 1 : 0,
        );
      }
      for (let j = sorted.length; j < slots; j++) values.push(null, null, null, null, null, null);
      values.push(name, STAMP_OFFSET);
    }
    let results: unknown[];
    for (let attempt = 1; ; attempt++) {
      try {
        results = (await this.callProcedure('checkAndSetStampedMany', 'write', sql, values)) as unknown[];
        break;
      } catch (error) {
        // A deadlock victim committed nothing (its versions were never seen): send it again.
        const deadlock = error instanceof StoreError && errnoOf(error.cause) === ER_LOCK_DEADLOCK;
        if (!deadlock || attempt >= STAMPED_MANY_ATTEMPTS) throw error;
        await sleep(backoffMs(attempt, 2, 50));
      }
    }
    // A CALL answers its SELECT's rows, then the CALL's own OK packet.
    const reply = Array.isArray(results[0]) ? (results[0] as Row[]) : [];
    const head = reply.find((row) => Number(row.i) === 0);
    if (head === undefined) {
      throw new StoreError('mysql: checkAndSetStampedMany: no outcome in the reply', 'unknown');
    }
    // Applied; a stamp beyond 2^53 cannot be a JS number, so that throws (never a plain failure).
    if (Number(head.applied) === 1) {
      return { ok: true, versions, timestamp: toSafeCounter(String(head.ts), counter) };
    }
    const current: (StoredRow | null)[] = requests.map(() => null);
    for (const row of reply) {
      const i = Number(row.i);
      if (i > 0) current[sorted[i - 1]!] = toStoredRow(row);
    }
    return { ok: false, current };
  }

  /**
   * One CALL of the namespace's stamped read procedure (schema.ts explains the steps and why
   * the read sees every write below the drawn value): one round trip. It draws counter + 1
   * with the statement `incrementCounter` uses and commits that, then reads the rows in a
   * new transaction whose read view is created after the draw. Results in request order,
   * decoded like readMany (same version tokens). Fails like a read (StoreError 'no',
   * also for a lost or timed-out reply): it writes nothing but the counter, which may have
   * advanced (a gap, which is allowed).
   *
   * The rows travel as one bound JSON string. Should they not fit one packet, the first
   * part goes with the CALL and the rest is read with readMany afterwards: read later
   * still, so also after the draw.
   */
  async readStamped(
    refs: readonly RowRef[],
    counter: string,
  ): Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }> {
    const name = Buffer.from(counter, 'utf8');
    const encoded = refs.map(encodeRef);
    if (this.capabilities.stampedRead !== true) {
      throw new StoreError(
        `mysql: readStamped needs the procedure ${mysqlNames(this.namespace).stampedReadRoutine}, which ` +
          'this schema lacks (capabilities.stampedRead is false); run mysqlSchemaSql() again',
        'no',
        { retryable: false },
      );
    }
    // A row is at most ~2.2 KB of JSON (hex of a 64-byte table and a 1024-byte key).
    const perCall = Math.max(1, Math.floor(this.packetBudget / 2400));
    const first = encoded.slice(0, perCall);
    const json = JSON.stringify(first.map((ref) => [ref.tbl.toString('hex'), ref.key.toString('hex')]));
    const results = (await this.callProcedure('readStamped', 'read', this.sql.stampedRead, [
      name,
      json,
    ])) as unknown[];
    let timestamp: number | undefined;
    const rows: (StoredRow | null)[] = encoded.map(() => null);
    for (const row of results[0] as Row[]) {
      const i = Number(row.i);
      if (i === 0) timestamp = toSafeCounter(String(row.version), counter);
      else rows[i - 1] = toStoredRow(row);
    }
    if (timestamp === undefined) throw new StoreError('mysql: readStamped: no timestamp in the reply', 'no');
    if (encoded.length > perCall) {
      const rest = await this.readMany(refs.slice(perCall));
      rest.forEach((row, i) => {
        rows[perCall + i] = row;
      });
    }
    return { timestamp, rows };
  }

  /**
   * A CALL, on a connection of its own. MariaDB skips a procedure's handlers for errors
   * it deems fatal (e.g. a lock wait timeout or deadlock inside a row write): the CALL then
   * fails with its transaction still open on this connection, possibly holding the counter
   * increment or a half-done row write. That transaction must never commit (a later
   * START TRANSACTION would commit it implicitly), so after a server error answer the
   * connection is rolled back before it is reused, or destroyed (the server then rolls
   * back) if that fails. Either way the answer 'no' stays true: nothing was committed (by
   * a stamped read, at most its counter draw, which is a read's allowed gap).
   *
   * Sent as a prepared statement: a CALL's text is one fixed string per procedure, so each
   * connection prepares at most one statement per procedure. In a profile of the server
   * during the bench's transfers (`perf`), parsing the CALL text took 8.5% of its CPU, most
   * of it the states as hex literals (which the client also had to write out); bound in
   * the binary protocol they travel as bytes and nothing is parsed again. Reads with a
   * varying number of rows stay plain queries: their text varies with that number, and the
   * server caps prepared statements (max_prepared_stmt_count) across all connections.
   * Should the server refuse a PREPARE for that cap, the CALL goes as a plain query, and
   * every later one too (prepareCalls). close() and dropNamespace() close the statements
   * again (PreparedCalls): on a pool passed in, the connections outlive the store.
   */
  private async callProcedure(
    what: string,
    mode: 'read' | 'write',
    sql: string,
    values: unknown[],
  ): Promise<unknown> {
    // Read before waiting for a connection: a close() during that wait must count as one
    // during the CALL (found in review: the statement stayed prepared).
    const epoch = this.preparedCalls.epoch;
    const connection = await this.connector.connect();
    const core = coreOf(connection);
    const timeout = this.connector.queryTimeoutMs;
    const prepare = this.prepareCalls;
    // Noted before sending: close() may come while the PREPARE is out.
    if (prepare) this.preparedCalls.note(core, sql);
    let reusable = false;
    try {
      let result: unknown;
      try {
        result = await query(connection, what, mode, sql, values, 1, timeout, prepare);
      } catch (error) {
        // The PREPARE was refused, so nothing ran: the same CALL as a plain query.
        if (!(error instanceof StoreError && errnoOf(error.cause) === ER_MAX_PREPARED_STMT_COUNT_REACHED))
          throw error;
        this.prepareCalls = false;
        result = await query(connection, what, mode, sql, values, 1, timeout);
      }
      reusable = true;
      return result;
    } catch (error) {
      if (error instanceof StoreError && !isConnectionBroken(error.cause)) {
        reusable = await connection.query({ sql: 'ROLLBACK', timeout }).then(
          () => true,
          () => false,
        );
      }
      throw error;
    } finally {
      if (reusable) {
        // close() or dropNamespace() ran while this CALL was out, perhaps before mysql2
        // had the statement to close: it is closed here, before the connection goes back.
        if (prepare && this.preparedCalls.epoch !== epoch) this.preparedCalls.releaseLate(core, sql);
        connection.release();
      } else {
        this.preparedCalls.forget(core);
        connection.destroy();
      }
    }
  }

  /** Also closes this store's prepared CALLs: their procedures are gone. */
  async dropNamespace(): Promise<void> {
    try {
      await underSchemaLock(this.connector, mysqlDropStatements(this.namespace));
    } finally {
      this.preparedCalls.release();
    }
  }

  /**
   * On a pool passed in, closes this store's prepared CALLs on every connection that holds
   * one, idle or busy (mysql2 queues the close behind the connection's work; closeStatements),
   * without waiting for a connection. A pool the store made is ended, which frees them.
   */
  async close(): Promise<void> {
    if (this.connector.closed) return;
    this.connector.closed = true;
    if (this.ownsPool) await this.connector.pool.end();
    else this.preparedCalls.release();
  }

  /** A fresh version; if no block can be reserved, the CAS was certainly not sent. */
  private async newVersion(): Promise<string> {
    try {
      return await this.versions.nextVersion();
    } catch (error) {
      if (error instanceof ClosedError) throw error;
      const message = error instanceof Error ? error.message : String(error);
      throw new StoreError(`mysql: could not reserve versions, nothing was written: ${message}`, 'no', {
        cause: error,
      });
    }
  }

  /** The current row after a failed CAS; a failure of this extra read only loses `current`. */
  private failure(ref: RowRef): Promise<CasResult> {
    return failedWithCurrent((table, key) => this.read(table, key), ref);
  }

  /** The same for a failed checkAndSetStampedMany: every row, in one readMany. */
  private async failureMany(refs: readonly RowRef[]): Promise<StampedManyResult> {
    try {
      return { ok: false, current: await this.readMany(refs) };
    } catch {
      return { ok: false };
    }
  }
}

type ChangePlan = Extract<CasPlan, { kind: 'update' | 'delete' }>;
type CreatePlan = Extract<CasPlan, { kind: 'create' }>;

function createValues(plan: CreatePlan, version: string): SqlValue[] {
  return [plan.tbl, plan.key, version, plan.state, plan.notified];
}

function changeStatement(sql: MySqlStatements, plan: ChangePlan, version: string): [string, SqlValue[]] {
  return plan.kind === 'update'
    ? [sql.update, [version, plan.state, plan.notified, plan.tbl, plan.key, plan.expected]]
    : [sql.delete, [plan.tbl, plan.key, plan.expected]];
}

/** One statement of a multi-statement batch, with values escaped by mysql2 (hex for bytes). */
function batchStatement(
  sql: MySqlStatements,
  plan: Exclude<CasPlan, { kind: 'unmatchable' }>,
  version: string,
) {
  switch (plan.kind) {
    case 'create':
      return format(sql.createIgnore, createValues(plan, version));
    case 'ensureAbsent':
      return format(sql.read, [plan.tbl, plan.key]);
    default: {
      const [text, values] = changeStatement(sql, plan, version);
      return format(text, values);
    }
  }
}

/** "(tbl = ? AND row_key IN (?, ?)) OR ..." grouped by table, so the primary key serves it. */
function whereRowsIn(refs: readonly EncodedRef[]): [string, unknown[]] {
  const byTable = new Map<string, { tbl: Buffer; keys: Buffer[] }>();
  for (const ref of refs) {
    const id = ref.tbl.toString('latin1');
    const group = byTable.get(id) ?? { tbl: ref.tbl, keys: [] };
    group.keys.push(ref.key);
    byTable.set(id, group);
  }
  const clauses: string[] = [];
  const values: unknown[] = [];
  for (const { tbl, keys } of byTable.values()) {
    clauses.push(`(tbl = ? AND row_key IN (${keys.map(() => '?').join(', ')}))`);
    values.push(tbl, ...keys);
  }
  return [clauses.join(' OR '), values];
}

/** (table, key) byte order: VARBINARY order, the order the stamped CAS of many rows locks in. */
function compareRows(a: EncodedRef, b: EncodedRef): number {
  return Buffer.compare(a.tbl, b.tbl) || Buffer.compare(a.key, b.key);
}

/** latin1 maps bytes 1:1 to characters; table names contain no NUL, so this is unique. */
function rowId(tbl: Buffer, key: Buffer): string {
  return `${tbl.toString('latin1')}\u0000${key.toString('latin1')}`;
}

function toStoredRow(row: Row): StoredRow {
  return { version: String(row.version), state: toBytes(row.state as Buffer) };
}
