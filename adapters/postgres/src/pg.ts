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
  return new pg.Pool(options);
}
