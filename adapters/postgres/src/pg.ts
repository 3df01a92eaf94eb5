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

interface PgModule {
  Pool: new (options: PgPoolOptions) => PgPool;
}

const load = createRequire(import.meta.url);

export function createPgPool(options: PgPoolOptions): PgPool {
  const pg = load('pg') as PgModule;
  const pool = new pg.Pool(options);
  guardClientErrors(pool);
  return pool;
}
