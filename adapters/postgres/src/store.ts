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
  type ScannedStoredRow,
  type ScanOptions,
  type StampedManyResult,
  type StoreCapabilities,
  type StoredRow,
  StoreError,
} from '@percolator/core';
import {
  type CasPlan,
  canonicalIntegerVersions,
  checkStampedManyRequests,
  DEFAULT_QUERY_TIMEOUT_MS,
  encodeRef,
  failedWithCurrent,
  fullCapabilities,
  groupsWithDistinctRows,
  type NamespacedStore,
  openPooled,
  POOLED_STORE_OPTION_KEYS,
  type PooledStoreOptions,
  partlyApplied,
  planCas,
  settleBatch,
  toBytes,
  toSafeCounter,
} from '@percolator/core/kit';
import { POSTGRES_URL } from './env.js';
import {
  connectError,
  isConnectionBroken,
  isMissingSchema,
  isTransientRollback,
  readError,
  writeError,
} from './errors.js';
import type { OptionKeys } from './options.js';
import {
  createPgPool,
  guardClientErrors,
  type PgPool,
  type PgPoolClient,
  type PgQueryResult,
  submitQuery,
} from './pg.js';
import {
  CAS_MANY_MISMATCH,
  casStampedManyFunctionBody,
  type PostgresNames,
  postgresDropStatements,
  postgresNames,
  postgresSchemaStatements,
  schemaLockKey,
} from './schema.js';
import { type PostgresStatements, postgresStatements } from './statements.js';

/** bytea travels as hex text in results; 64 MiB keeps one row's message well under 1 GiB. */
export const POSTGRES_MAX_STATE_BYTES = 64 * 1024 * 1024;

/**
 * The most state bytes one statement of several rows carries. pg sends a bytea[] as one
 * hex string (two characters a byte) in one message: past V8's string limit (about 2^29
 * characters) it cannot be built, and past 1 GiB the server drops the connection; either
 * way the call failed as 'unknown' with nothing applied, every time it was tried.
 */
export const POSTGRES_BATCH_STATE_BYTES = 2 * POSTGRES_MAX_STATE_BYTES;

/** The kinds of write a casMany batch holds, as bits: one bit set is one kind. */
const KIND_BIT = { update: 1, delete: 2, create: 4 } as const;

/**
 * The lock_timeout (ms) the stamped statements set for their transaction: a little below
 * queryTimeoutMs, so the server usually answers before the client gives up, and a backend
 * whose client did give up (it destroys the connection, which a backend waiting for a lock
 * does not notice) stops waiting soon after instead of never. At least 1 (0 means none).
 */
function serverLockTimeoutMs(queryTimeoutMs: number): number {
  return Math.max(1, queryTimeoutMs - Math.min(1000, Math.ceil(queryTimeoutMs / 10)));
}

/** A deadlock or serialization failure rolls a whole statement back, so it is safe to send it again. */
const TRANSIENT_ATTEMPTS = 4;

/*
 * What the SQL adapters share lives in @percolator/core/kit (openPooled, planCas,
 * settleBatch, failureMapping, ...). What is left here has the same shape in both on
 * purpose (options, the version rule, the store type, the factory, connection handling,
 * row decoding) and holds this dialect's values and statements; `duplicates` pairs them
 * by shape.
 */
export interface PostgresStoreOptions extends PooledStoreOptions {
  /** Used when no `pool` is given. Default: $PERCOLATOR_POSTGRES_URL or postgres://postgres@127.0.0.1:5432/test. */
  readonly connectionString?: string;
  /** A `pg.Pool` you own; `close()` leaves it open. */
  readonly pool?: PgPool;
}

export { DEFAULT_QUERY_TIMEOUT_MS };

/** Versions are values of a BIGINT sequence; any other token matches no row. */
const isIssuableVersion = canonicalIntegerVersions(9223372036854775807n);

const OPTION_KEYS: OptionKeys<PostgresStoreOptions> = { connectionString: true, ...POOLED_STORE_OPTION_KEYS };

/**
 * Every optional method is implemented (readStamped and checkAndSetStampedMany refuse, and
 * stampedRead / stampedCheckAndSetMany are false, only on a hand-made schema that lacks
 * their function); dropNamespace also drops the sequence.
 */
export type PostgresStore = NamespacedStore;

export async function createPostgresStore(options: PostgresStoreOptions = {}): Promise<PostgresStore> {
  const opening = openPooled('createPostgresStore', options, OPTION_KEYS, POSTGRES_URL);
  const { url, ownsPool, queryTimeoutMs } = opening;
  const names = postgresNames(opening.namespace);
  if (
    options.pool !== undefined &&
    !['connect', 'query', 'on', 'end'].every(
      (m) => typeof (options.pool as unknown as Record<string, unknown>)[m] === 'function',
    )
  )
    throw new InvalidArgumentError(
      'createPostgresStore: pool must be a pg Pool (new pg.Pool(...)): it has no connect, query, on and end methods',
    );
  const pool =
    options.pool ??
    createPgPool({
      connectionString: url,
      max: options.maxConnections ?? 10,
      connectionTimeoutMillis: 10_000,
      application_name: `percolator:${names.namespace}`,
      keepAlive: true,
    });
  // An idle connection that dies (server restart, pg_terminate_backend) emits 'error' on
  // the pool; without a listener that would crash the process.
  if (ownsPool) pool.on('error', () => {});
  guardClientErrors(pool);
  const store = new PostgresRowStore(pool, ownsPool, names, queryTimeoutMs);
  try {
    if (options.createSchema !== false) await store.createSchema();
    else await store.verifySchema();
  } catch (error) {
    await store.close();
    opening.explain(error);
    throw error;
  }
  return checkedStore<PostgresStore>(store);
}

class PostgresRowStore implements PostgresStore {
  readonly name = 'postgres';
  // Not readonly here: verifySchema turns stampedRead / stampedCheckAndSetMany off for a
  // user-made schema without their function, before the store is handed out.
  capabilities: StoreCapabilities = fullCapabilities(POSTGRES_MAX_STATE_BYTES);
  readonly namespace: string;
  private readonly sql: PostgresStatements;
  /** Each statement's prepared-statement name, made once. */
  private readonly names: Record<keyof PostgresStatements, string>;
  /** `serverLockTimeoutMs(queryTimeoutMs)` as text, the stamped statements' last parameter. */
  private readonly lockTimeout: string;
  private closed = false;
  /** The calls waiting for a pooled connection (connect): close() answers each with ClosedError. */
  private readonly waiting = new Set<(error: Error) => void>();

  constructor(
    private readonly pool: PgPool,
    private readonly ownsPool: boolean,
    names: PostgresNames,
    private readonly queryTimeoutMs: number,
  ) {
    this.namespace = names.namespace;
    this.lockTimeout = String(serverLockTimeoutMs(queryTimeoutMs));
    this.sql = postgresStatements(names);
    this.names = Object.fromEntries(
      Object.keys(this.sql).map((statement) => [statement, `perc:${this.namespace}:${statement}`]),
    ) as Record<keyof PostgresStatements, string>;
  }

  async read(table: string, key: string): Promise<StoredRow | null> {
    const ref = encodeRef({ table, key });
    const result = await this.query('read', 'read', [ref.tbl, ref.key]);
    return result.rows.length === 0 ? null : toStoredRow(result.rows[0]!);
  }

  async checkAndSet(request: CasRequest): Promise<CasResult> {
    const plan = planCas(request, isIssuableVersion);
    if (plan.kind === 'unmatchable') return this.failure(request);
    const result = await this.query(plan.kind, 'write', casValues(plan));
    const row = result.rows[0];
    if (plan.kind === 'ensureAbsent') {
      // Present row: the statement returned it, so `current` costs nothing more.
      if (row !== undefined && row.ok === false) return { ok: false, current: toStoredRow(row) };
      return { ok: true, version: String(row!.version) };
    }
    if (row !== undefined) return { ok: true, version: String(row.version) };
    return this.failure(request);
  }

  async readMany(refs: readonly RowRef[]): Promise<(StoredRow | null)[]> {
    const encoded = refs.map(encodeRef);
    if (encoded.length === 0) return [];
    const result = await this.query('readMany', 'read', [
      encoded.map((r) => r.tbl),
      encoded.map((r) => r.key),
    ]);
    const rows: (StoredRow | null)[] = encoded.map(() => null);
    for (const row of result.rows) rows[Number(row.i) - 1] = toStoredRow(row);
    return rows;
  }

  async checkAndSetMany(requests: readonly CasRequest[]): Promise<CasResult[]> {
    const plans = requests.map((request) => planCas(request, isIssuableVersion));
    const outcomes: (CasResult | undefined)[] = plans.map(() => undefined);
    let sentBefore = false;
    const size = (index: number) => requests[index]!.state?.length ?? 0;
    for (const group of groupsWithDistinctRows(requests).flatMap((g) => withinBudget(g, size))) {
      if (group.every((index) => plans[index]!.kind === 'unmatchable')) continue;
      const applied = await this.casManyStatement(group.map((index) => plans[index]!)).catch(
        (error: unknown) => {
          throw sentBefore ? partlyApplied(error) : error;
        },
      );
      sentBefore = true;
      group.forEach((index, position) => {
        const version = applied.get(position + 1);
        if (version !== undefined) outcomes[index] = { ok: true, version };
      });
    }
    return settleBatch(requests, outcomes, (refs) => this.readMany(refs));
  }

  async scan(table: string, options: ScanOptions): Promise<ScannedStoredRow[]> {
    const values: unknown[] = [Buffer.from(table, 'utf8')];
    let text = this.sql.scanPrefix;
    const bound = (fragment: string, value: string | undefined) => {
      if (value === undefined) return;
      values.push(Buffer.from(value, 'utf8'));
      text += ` AND key ${fragment} $${values.length}`;
    };
    bound('>=', options.start);
    bound('<', options.end);
    bound('>', options.after);
    values.push(options.limit);
    text += ` ORDER BY key LIMIT $${values.length}`;
    const result = await this.run('scan', 'read', undefined, text, values);
    return result.rows.map((row) => ({
      key: bytesOf(row.key, 'key').toString('utf8'),
      row: toStoredRow(row),
    }));
  }

  async scanNotified(table: string, options: NotificationScanOptions): Promise<string[]> {
    const values: unknown[] = [Buffer.from(table, 'utf8')];
    let text = this.sql.scanNotifiedPrefix;
    if (options.after !== undefined) {
      values.push(Buffer.from(options.after, 'utf8'));
      text += ` AND key > $${values.length}`;
    }
    values.push(options.limit);
    text += ` ORDER BY key LIMIT $${values.length}`;
    const result = await this.run('scanNotified', 'read', undefined, text, values);
    return result.rows.map((row) => bytesOf(row.key, 'key').toString('utf8'));
  }

  async incrementCounter(name: string, delta: number): Promise<number> {
    const result = await this.query('increment', 'write', [Buffer.from(name, 'utf8'), String(delta)]);
    return toSafeCounter(String(result.rows[0]!.value), name);
  }

  /**
   * One statement, one round trip, one transaction: it takes the row, draws counter + 1
   * and applies the CAS with that value written big-endian at STAMP_OFFSET. An update is
   * statements.ts' stampedUpdate (the row locked at its expected version, then the draw);
   * a create calls the multi-row function for one row (the row inserted, then the draw,
   * then the stamp written into it), which one statement cannot do, or, on a schema
   * without that function, the older stampedCreate. See there for why a later draw sees
   * the write. The counter advances only once the row is held (and, for stampedCreate,
   * when its snapshot shows the row absent); it never advances for a request refused
   * before sending.
   */
  async checkAndSetStamped(
    request: CasRequest & { readonly state: Uint8Array },
    counter: string,
  ): Promise<CasResult & { timestamp?: number }> {
    // The state is never null here (the contract check), so the plan creates or updates.
    const plan = planCas(request, isIssuableVersion);
    if (plan.kind !== 'create' && plan.kind !== 'update') return this.failure(request);
    const name = Buffer.from(counter, 'utf8');
    if (plan.kind === 'create' && this.capabilities.stampedCheckAndSetMany === true) {
      const step = await this.stampedStep([plan], name);
      if (step === 'mismatch') return this.failure(request);
      if ('current' in step) return { ok: false, current: step.current[0] ?? null };
      return { ok: true, version: step.versions[0]!, timestamp: toSafeCounter(step.drawn, counter) };
    }
    const values: unknown[] = [plan.tbl, plan.key, name, plan.state, plan.notified];
    if (plan.kind === 'update') values.push(plan.expected);
    values.push(this.lockTimeout);
    const statement = plan.kind === 'create' ? 'stampedCreate' : 'stampedUpdate';
    const result = await this.withTransientRetry(() => this.query(statement, 'write', values));
    const row = result.rows[0];
    if (row === undefined) return this.failure(request);
    // Applied; a stamp beyond 2^53 cannot be a JS number, so that throws (not a plain failure).
    return { ok: true, version: String(row.version), timestamp: toSafeCounter(String(row.ts), counter) };
  }

  /**
   * One statement (statements.ts: casStampedMany) calls the namespace's PL/pgSQL function
   * (schema.ts: casStampedManyFunctionBody): it locks the rows it updates (in (tbl, key)
   * byte order, at their expected versions) and inserts the rows it creates, and only then
   * draws counter + 1 and writes every row with that value at STAMP_OFFSET, in one
   * transaction. A request that does not match draws nothing and is answered with the
   * rows as they are; a create whose key appeared while the call waited raises
   * CAS_MANY_MISMATCH, which rolls the whole statement back: `ok: false`, with `current`
   * from one more read (as checkAndSet does on failure). See the function's comment for
   * why it is atomic and why it cannot deadlock.
   */
  async checkAndSetStampedMany(
    requests: readonly (CasRequest & { readonly state: Uint8Array })[],
    counter: string,
  ): Promise<StampedManyResult> {
    checkStampedManyRequests(requests, this.capabilities.maxStateBytes);
    const bytes = requests.reduce((sum, r) => sum + r.state.length, 0);
    if (bytes > POSTGRES_BATCH_STATE_BYTES) {
      // One atomic step cannot be split: the core sends its transactions' rows alone, or in
      // two phases (a RowTooLargeError means nothing was sent).
      throw new RowTooLargeError(
        `postgres: the ${requests.length} states of checkAndSetStampedMany (${bytes} bytes) exceed one ` +
          `statement's ${POSTGRES_BATCH_STATE_BYTES} bytes; nothing was sent`,
      );
    }
    if (this.capabilities.stampedCheckAndSetMany !== true) {
      throw new StoreError(
        `postgres: checkAndSetStampedMany needs the function ${postgresNames(this.namespace).casStampedMany} ` +
          'as this version defines it, which this schema lacks (capabilities.stampedCheckAndSetMany is false); ' +
          'run postgresSchemaSql() again',
        'no',
        { retryable: false },
      );
    }
    const plans = requests.map((request) => planCas(request, isIssuableVersion));
    // A version this store never issues matches no row: the whole step fails, nothing sent.
    const writes = plans.filter((p) => p.kind === 'create' || p.kind === 'update');
    if (writes.length !== plans.length) return this.manyFailure(requests);
    const step = await this.stampedStep(writes, Buffer.from(counter, 'utf8'));
    if (step === 'mismatch') return this.manyFailure(requests);
    if ('current' in step) return { ok: false, current: step.current };
    // Applied; a stamp beyond 2^53 cannot be a JS number, so that throws (not a plain failure).
    return { ok: true, versions: step.versions, timestamp: toSafeCounter(step.drawn, counter) };
  }

  /**
   * Sends one call of the multi-row function: the drawn value and the new versions in
   * request order (applied), the rows as they are (a request did not match, nothing
   * written), or 'mismatch' (CAS_MANY_MISMATCH: rolled back, the rows not known).
   */
  private async stampedStep(
    writes: readonly Extract<CasPlan, { kind: 'create' | 'update' }>[],
    counter: Buffer,
  ): Promise<
    | { readonly drawn: string; readonly versions: string[] }
    | { readonly current: (StoredRow | null)[] }
    | 'mismatch'
  > {
    const values = [
      counter,
      writes.map((p) => p.tbl),
      writes.map((p) => p.key),
      writes.map((p) => (p.kind === 'update' ? p.expected : null)),
      writes.map((p) => p.state),
      writes.map((p) => p.notified),
      this.lockTimeout,
    ];
    let result: PgQueryResult;
    try {
      result = await this.withTransientRetry(() => this.query('casStampedMany', 'write', values));
    } catch (error) {
      // A create's key appeared while the call waited: the server rolled everything back.
      if (isCasManyMismatch(error)) return 'mismatch';
      throw error;
    }
    const drawn = result.rows.find((row) => Number(row.i) === 0);
    if (drawn === undefined) {
      // Refused before the draw; the reply holds the present rows (absent: null).
      const current: (StoredRow | null)[] = writes.map(() => null);
      for (const row of result.rows) current[Number(row.i) - 1] = toStoredRow(row);
      return { current };
    }
    const versions: string[] = [];
    for (const row of result.rows) {
      const i = Number(row.i);
      if (i > 0) versions[i - 1] = String(row.version);
    }
    for (let i = 0; i < writes.length; i++) {
      if (versions[i] === undefined) {
        // Applied (row 0 came back), yet a version is missing: not a plain failure.
        throw new StoreError(`postgres: stamped check-and-set: no version for request ${i + 1}`, 'unknown', {
          retryable: false,
        });
      }
    }
    return { drawn: String(drawn.version), versions };
  }

  /**
   * One statement (statements.ts: readStamped) calls the namespace's PL/pgSQL function
   * (schema.ts: readStampedFunctionBody), which draws counter + 1 with the upsert
   * `incrementCounter` uses and then reads the rows in a second query: under READ COMMITTED
   * a fresh snapshot, taken after the draw waited out any stamped CAS holding the counter.
   * Results in request order, decoded like readMany. Fails like a read (StoreError 'no'):
   * it writes nothing but the counter, which may have advanced (a gap, which is allowed).
   */
  async readStamped(
    refs: readonly RowRef[],
    counter: string,
  ): Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }> {
    const name = Buffer.from(counter, 'utf8');
    const encoded = refs.map(encodeRef);
    if (this.capabilities.stampedRead !== true) {
      throw new StoreError(
        `postgres: readStamped needs the function ${postgresNames(this.namespace).readStamped}, which this ` +
          'schema lacks (capabilities.stampedRead is false); run postgresSchemaSql() again',
        'no',
        { retryable: false },
      );
    }
    const result = await this.withTransientRetry(() =>
      this.query('readStamped', 'read', [name, encoded.map((r) => r.tbl), encoded.map((r) => r.key)]),
    );
    let timestamp: number | undefined;
    const rows: (StoredRow | null)[] = encoded.map(() => null);
    for (const row of result.rows) {
      const i = Number(row.i);
      if (i === 0) timestamp = toSafeCounter(String(row.version), counter);
      else rows[i - 1] = toStoredRow(row);
    }
    if (timestamp === undefined)
      throw new StoreError('postgres: stamped read: no timestamp in the reply', 'no');
    return { timestamp, rows };
  }

  /** One statement, one snapshot (statements.ts, readPeeked); writes nothing. */
  async readPeeked(
    refs: readonly RowRef[],
    counter: string,
  ): Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }> {
    const name = Buffer.from(counter, 'utf8');
    const encoded = refs.map(encodeRef);
    const result = await this.withTransientRetry(() =>
      encoded.length === 1
        ? this.query('readPeekedOne', 'read', [name, encoded[0]!.tbl, encoded[0]!.key])
        : this.query('readPeeked', 'read', [name, encoded.map((r) => r.tbl), encoded.map((r) => r.key)]),
    );
    let timestamp: number | undefined;
    const rows: (StoredRow | null)[] = encoded.map(() => null);
    for (const row of result.rows) {
      const i = Number(row.i);
      if (i === 0) timestamp = toSafeCounter(String(row.version), counter);
      else rows[i - 1] = toStoredRow(row);
    }
    if (timestamp === undefined)
      throw new StoreError('postgres: peeked read: no counter value in the reply', 'no');
    return { timestamp, rows };
  }

  async createSchema(): Promise<void> {
    await this.underSchemaLock(postgresSchemaStatements(this.namespace));
  }

  /** Proves the server answers and the tables exist (when the user manages the schema). */
  async verifySchema(): Promise<void> {
    try {
      await this.query('probe', 'read', []);
    } catch (error) {
      // Only where a table or function is missing: a refused or timed-out connection got
      // the hint too, and sent operators looking for a schema problem (found in review).
      if (error instanceof Error && isMissingSchema((error as { cause?: unknown }).cause)) {
        error.message += ` (is the schema of namespace ${this.namespace} created? see postgresSchemaSql())`;
      }
      throw error;
    }
    // A schema made from an older postgresSchemaSql() may lack the functions, or have an
    // older multi-row CAS: everything works without them, only stamped reads / stamped
    // multi-row CAS are not offered (stamped creates then use stampedCreate).
    const body = casStampedManyFunctionBody(postgresNames(this.namespace));
    const fn = (await this.query('hasFunctions', 'read', [body])).rows[0];
    if (fn?.read_stamped !== true) this.capabilities = { ...this.capabilities, stampedRead: false };
    if (fn?.cas_stamped_many !== true) {
      this.capabilities = { ...this.capabilities, stampedCheckAndSetMany: false };
    }
  }

  async dropNamespace(): Promise<void> {
    await this.underSchemaLock(postgresDropStatements(this.namespace));
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const closed = new ClosedError(`postgres store (namespace ${this.namespace}) is closed`);
    for (const onClose of this.waiting) onClose(closed);
    this.waiting.clear();
    if (this.ownsPool) await this.pool.end();
  }

  /** DDL in one transaction under an advisory lock, so concurrent starters queue up. */
  private async underSchemaLock(statements: readonly string[]): Promise<void> {
    const client = await this.connect();
    try {
      await client.query('BEGIN');
      await client.query('SELECT pg_advisory_xact_lock(hashtext($1))', [schemaLockKey(this.namespace)]);
      for (const statement of statements) await client.query(statement);
      await client.query('COMMIT');
      client.release();
    } catch (error) {
      // Destroying the connection also ends the open transaction.
      client.release(error instanceof Error ? error : true);
      throw writeError(`schema change for namespace ${this.namespace}`, error);
    }
  }

  /** The current row after a failed CAS; a failure of this extra read only loses `current`. */
  private failure(ref: RowRef): Promise<CasResult> {
    return failedWithCurrent((table, key) => this.read(table, key), ref);
  }

  /** A failed checkAndSetStampedMany with the rows as they are now (lost if that read fails). */
  private async manyFailure(refs: readonly RowRef[]): Promise<StampedManyResult> {
    try {
      return { ok: false, current: await this.readMany(refs) };
    } catch {
      return { ok: false };
    }
  }

  /** Runs one casMany statement; returns applied request ordinals (1-based) -> new version. */
  private async casManyStatement(unordered: readonly CasPlan[]): Promise<Map<number, string>> {
    // In (table, key) order, the order the statement takes rows in (statements.ts, casMany).
    // The statement does not rely on it (its ORDER BYs fix the order of its locks and
    // inserts in any plan); a plan that walks the requests meets the rows in that order
    // too. `order[i]` is the caller's index.
    const order = unordered.map((_, i) => i);
    order.sort(
      (a, b) =>
        Buffer.compare(unordered[a]!.tbl, unordered[b]!.tbl) ||
        Buffer.compare(unordered[a]!.key, unordered[b]!.key),
    );
    const plans = order.map((i) => unordered[i]!);
    // Unmatchable requests travel too (as a kind no CTE handles) to keep ordinals aligned.
    const values = [
      plans.map((p) => p.tbl),
      plans.map((p) => p.key),
      plans.map((p) => ('expected' in p ? p.expected : null)),
      plans.map((p) => ('state' in p ? p.state : null)),
      plans.map((p) => ('notified' in p ? p.notified : false)),
      plans.map((p) => p.kind),
    ];
    // Lock the rows first, in order (statements.ts, casMany), unless the batch writes at
    // most one row that exists and one kind only: an UPDATE or DELETE of several rows
    // takes them in the plan's order, and a mix of kinds could hold one kind's rows while
    // another waits.
    let kinds = 0;
    let existing = 0;
    for (const p of plans) {
      if (p.kind === 'update' || p.kind === 'delete' || p.kind === 'create') kinds |= KIND_BIT[p.kind];
      if (p.kind === 'update' || p.kind === 'delete') existing++;
    }
    const oneKind = (kinds & (kinds - 1)) === 0; // none or one bit
    const statement = oneKind && existing <= 1 ? 'casMany' : 'casManyLocking';
    const result = await this.withTransientRetry(() => this.query(statement, 'write', values));
    // Ordinals are 1-based positions in `plans`; the caller's are positions in `unordered`.
    return new Map(result.rows.map((row) => [order[Number(row.i) - 1]! + 1, String(row.version)]));
  }

  /**
   * Sends a statement again after a deadlock or serialization failure (40P01, 40001): the
   * server rolled the whole statement back, so it certainly did not apply. Under READ
   * COMMITTED a stamped statement never gets 40001; under REPEATABLE READ or SERIALIZABLE
   * (a pool configured so) a concurrent counter draw makes it fail that way.
   */
  private async withTransientRetry(send: () => Promise<PgQueryResult>): Promise<PgQueryResult> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await send();
      } catch (error) {
        const cause = (error as Error).cause;
        if (attempt < TRANSIENT_ATTEMPTS && isTransientRollback(cause)) continue;
        throw error;
      }
    }
  }

  private query(
    statement: keyof PostgresStatements,
    mode: 'read' | 'write',
    values: unknown[],
  ): Promise<PgQueryResult> {
    // Named statements are parsed and planned once per connection.
    return this.run(statement, mode, this.names[statement], this.sql[statement], values);
  }

  private async run(
    what: string,
    mode: 'read' | 'write',
    /** A prepared statement's name; undefined for a one-off (scans, whose text varies). */
    name: string | undefined,
    text: string,
    values: unknown[],
  ): Promise<PgQueryResult> {
    // A dying connection may also emit 'error' on the client; the pending query gets the
    // error anyway, and `guardClientErrors` keeps the event from crashing the process.
    const client = await this.connect();
    try {
      // On timeout pg rejects but leaves the statement running; `isConnectionBroken` is
      // true for that error, so the connection is destroyed below, not reused.
      const result = await submitQuery(client, name, text, values, this.queryTimeoutMs);
      client.release();
      return result;
    } catch (error) {
      if (isConnectionBroken(error)) {
        client.release(error instanceof Error ? error : true);
      } else {
        client.release();
      }
      if (mode === 'read') throw readError(what, error);
      // The server's lock_timeout (SQLSTATE 55P03) ends a stamped statement with an error:
      // it is its own transaction, rolled back, so 'no' (retryable), which a blocked one-step
      // commit can retry, where 'unknown' made it a CommitUnknownError (found in review).
      // Only the client's own timeout, which leaves the statement running, is 'unknown'.
      throw writeError(what, error);
    }
  }

  private async connect(): Promise<PgPoolClient> {
    if (this.closed) throw new ClosedError(`postgres store (namespace ${this.namespace}) is closed`);
    try {
      // pg-pool's end() never answers the callers still queued for a connection: they would
      // wait out connectionTimeoutMillis and fail as a retryable timeout. close() answers
      // them at once (each waiter is in `waiting` until its connection comes, so nothing is
      // left behind per call); a connection that comes after that goes back to the pool.
      return await new Promise<PgPoolClient>((resolve, reject) => {
        const connecting = this.pool.connect();
        const onClose = (error: Error) => {
          reject(error);
          connecting.then(
            (client) => client.release(),
            () => {},
          );
        };
        this.waiting.add(onClose);
        connecting.then(
          (client) => {
            this.waiting.delete(onClose);
            resolve(client);
          },
          (error: unknown) => {
            this.waiting.delete(onClose);
            reject(error);
          },
        );
      });
    } catch (error) {
      if (error instanceof ClosedError) throw error;
      throw connectError(error);
    }
  }
}

function casValues(plan: CasPlan): unknown[] {
  switch (plan.kind) {
    case 'create':
      return [plan.tbl, plan.key, plan.state, plan.notified];
    case 'update':
      return [plan.tbl, plan.key, plan.expected, plan.state, plan.notified];
    case 'delete':
      return [plan.tbl, plan.key, plan.expected];
    case 'ensureAbsent':
    case 'unmatchable':
      return [plan.tbl, plan.key];
  }
}

/** The function's "a row changed after the draw" error (schema.ts), behind the StoreError. */
function isCasManyMismatch(error: unknown): boolean {
  return (
    error instanceof StoreError && (error.cause as { code?: unknown } | undefined)?.code === CAS_MANY_MISMATCH
  );
}

function toStoredRow(row: Record<string, unknown>): StoredRow {
  return { version: String(row.version), state: toBytes(bytesOf(row.state, 'state')) };
}

/**
 * A bytea column's value, which the store's own parsers (pg.ts, STORE_TYPES) make a
 * Buffer. Anything else means the reply was not parsed as the store asked: a StoreError,
 * never a state or key made from the wrong bytes. Nothing is written when it is thrown
 * (only reads and refused writes decode rows).
 */
function bytesOf(value: unknown, what: 'state' | 'key'): Buffer {
  if (Buffer.isBuffer(value)) return value;
  throw new StoreError(
    `postgres: a row's ${what} came back as ${value === null ? 'null' : typeof value}, not bytes ` +
      "(was the reply parsed by a type parser other than the store's?)",
    'no',
    { retryable: false },
  );
}

/** `indices` in order, cut where the next state would pass POSTGRES_BATCH_STATE_BYTES. */
function withinBudget(indices: readonly number[], size: (index: number) => number): number[][] {
  const out: number[][] = [];
  let current: number[] = [];
  let bytes = 0;
  for (const index of indices) {
    const n = size(index);
    if (current.length > 0 && bytes + n > POSTGRES_BATCH_STATE_BYTES) {
      out.push(current);
      current = [];
      bytes = 0;
    }
    current.push(index);
    bytes += n;
  }
  if (current.length > 0) out.push(current);
  return out;
}
