import { createRequire } from 'node:module';

/*
 * The workspace has no @types/pg, so the adapter loads `pg` through `createRequire` and
 * describes the small part of its API it uses. A real `pg.Pool` satisfies `PgPool`.
 */

export interface PgQueryResult {
  readonly rows: Record<string, unknown>[];
  readonly rowCount: number | null;
}

export interface PgQueryConfig {
  readonly name?: string;
  readonly text: string;
  readonly values?: unknown[];
  /** Client-side: reject with "Query read timeout" if no reply came within this many ms. */
  readonly query_timeout?: number;
}

export interface PgPoolClient {
  query(config: PgQueryConfig): Promise<PgQueryResult>;
  query(text: string, values?: unknown[]): Promise<PgQueryResult>;
  /** Passing an error (or `true`) destroys the connection instead of returning it. */
  release(destroy?: Error | boolean): void;
  on(event: 'error', listener: (error: Error) => void): unknown;
  removeListener(event: 'error', listener: (error: Error) => void): unknown;
}

export interface PgPool {
  connect(): Promise<PgPoolClient>;
  end(): Promise<void>;
  on(event: 'error', listener: (error: Error) => void): unknown;
  on(event: 'acquire', listener: (client: PgPoolClient) => void): unknown;
}

const GUARDED = Symbol('percolator.pgErrorGuard');
const ignore = (): void => {};

/**
 * Gives every client the pool hands out a permanent no-op 'error' listener, attached
 * synchronously in pg-pool's 'acquire' event. pg-pool removes its own listener from a
 * client as it hands it out, and whoever awaited `pool.connect()` can attach one only a
 * microtask later. An ErrorResponse that arrives in the same network chunk as the message
 * that completed the connection (a server going down, "terminating connection due to
 * unexpected postmaster exit") is emitted in that gap and, with no listener, would crash
 * the process (seen once in the server-restart test). With the guard, a pending query
 * still gets its error, and an idle client's error still reaches the pool's 'error'.
 * Idempotent per pool and per client.
 */
export function guardClientErrors(pool: PgPool): void {
  const marked = pool as unknown as Record<symbol, boolean>;
  if (marked[GUARDED]) return;
  marked[GUARDED] = true;
  pool.on('acquire', (client) => {
    const c = client as unknown as Record<symbol, boolean>;
    if (c[GUARDED]) return;
    c[GUARDED] = true;
    client.on('error', ignore);
  });
}

export interface PgPoolOptions {
  readonly connectionString?: string;
  readonly max?: number;
  readonly connectionTimeoutMillis?: number;
  readonly idleTimeoutMillis?: number;
  readonly application_name?: string;
  /** TCP keepalive, so a connection to a vanished server is eventually noticed while idle. */
  readonly keepAlive?: boolean;
}

/** pg's Query: what `client.query(config)` builds, made here directly (see `submitQuery`). */
interface PgQuery {
  name?: string;
  query_timeout?: number;
  /** The result pg fills; each column's parser comes from `_types` where it is set. */
  _result?: { _types?: PgTypes };
}

/** What pg asks for a column's parser (a pg `types` option, pg-types' registry). */
export interface PgTypes {
  getTypeParser(oid: number, format?: string): (value: string) => unknown;
}

const BOOL_OID = 16;
const BYTEA_OID = 17;
const INT4_OID = 23;

/**
 * bytea in PostgreSQL's text format: `\x` and hex digits (bytea_output = 'hex', the
 * default), or, with bytea_output = 'escape', each byte as itself when printable, `\\` for
 * a backslash and `\ooo` (three octal digits) for any other byte.
 */
export function parseBytea(text: string): Buffer {
  if (text.startsWith('\\x')) return Buffer.from(text.slice(2), 'hex');
  const out = Buffer.allocUnsafe(text.length);
  let n = 0;
  for (let i = 0; i < text.length; ) {
    if (text.charCodeAt(i) !== 0x5c) {
      out[n++] = text.charCodeAt(i++);
    } else if (text.charCodeAt(i + 1) === 0x5c) {
      out[n++] = 0x5c;
      i += 2;
    } else {
      out[n++] = Number.parseInt(text.slice(i + 1, i + 4), 8);
      i += 4;
    }
  }
  return out.subarray(0, n);
}

const asText = (value: string): string => value;
const asBool = (value: string): boolean => value === 't';
const asInt = (value: string): number => Number(value);

/**
 * The parsers of every statement the store sends, whatever the pool's `types` option or
 * pg's global registry (`pg.types.setTypeParser`) say: bytea as a Buffer, boolean,
 * integer (ordinals) as a number, everything else as the text the server sent (versions,
 * timestamps and counter values travel as text, cast in SQL). Those settings are the
 * application's, for its own queries; a pool whose bytea parser returned the hex text made
 * every state read as 0 bytes and every scanned key as '\x6b...' (found by a review).
 * Text format only: a client in pg's binary mode (`binary: true`) gets pg's own parsers for
 * that format, as before; pg 8 decodes every field of a reply as UTF-8 text first, so no
 * state survives that mode, and reading one fails with a StoreError (store.ts, bytesOf).
 */
export const STORE_TYPES: PgTypes = {
  getTypeParser(oid: number, format?: string): (value: string) => unknown {
    if (format === 'binary') return pgOf().types.getTypeParser(oid, format);
    switch (oid) {
      case BYTEA_OID:
        return parseBytea;
      case BOOL_OID:
        return asBool;
      case INT4_OID:
        return asInt;
      default:
        return asText;
    }
  },
};

interface PgModule {
  Pool: new (options: PgPoolOptions) => PgPool;
  /** pg-types: the global parser registry. */
  types: PgTypes;
  Query: new (
    text: string,
    values: unknown[],
    callback: (error: Error | null, result: PgQueryResult) => void,
  ) => PgQuery;
}

const load = createRequire(import.meta.url);
let pgModule: PgModule | undefined;
const pgOf = (): PgModule => (pgModule ??= load('pg') as PgModule);

/**
 * Sends a statement on `client` as a pg `Query` made here, which pg runs as is (a
 * "submittable"); a named one is prepared once per connection. `client.query({ name,
 * text, values })` would copy its config through `Object.getOwnPropertyDescriptors`, wrap
 * the callback in a promise and, with a timeout, wrap it again: about 7 of the 34-38 µs a
 * call cost the client at 8 concurrent calls on this project's test machine. A Query made
 * from text and values takes the fast path of pg's config normalising; its name and read
 * timeout are the fields pg 8 reads when it prepares and sends it. A user's own pool of
 * another pg 8 release runs it the same way (the submittable interface is pg's public
 * one). postgres.test.ts checks that statements are still prepared under their names, and
 * the queryTimeoutMs tests that the timeout still applies.
 */
export function submitQuery(
  client: PgPoolClient,
  name: string | undefined,
  text: string,
  values: unknown[],
  timeoutMs: number,
): Promise<PgQueryResult> {
  return new Promise((resolve, reject) => {
    const query = new (pgOf().Query)(text, values, (error, result) =>
      error ? reject(error) : resolve(result),
    );
    if (name !== undefined) query.name = name;
    if (timeoutMs > 0) query.query_timeout = timeoutMs;
    // The Query's result was made without a parser set (no config object, the fast path
    // above); pg's client fills in its own (the pool's `types`, else pg's global registry)
    // only where none is set, so this one is used instead (STORE_TYPES). postgres.test.ts
    // checks that a pool's and the global bytea parser change nothing.
    if (query._result !== undefined) query._result._types = STORE_TYPES;
    (client as unknown as { query(query: PgQuery): void }).query(query);
  });
}

export function createPgPool(options: PgPoolOptions): PgPool {
  const pg = pgOf();
  const pool = new pg.Pool(options);
  guardClientErrors(pool);
  return pool;
}
