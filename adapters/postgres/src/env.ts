import { redactUrl } from '@percolator/core';
import { type UrlLookup, unreachableError, urlFromEnv } from '@percolator/core/kit';
import { isAuthFailure } from './errors.js';
import { createPgPool } from './pg.js';

export const POSTGRES_URL_ENV = 'PERCOLATOR_POSTGRES_URL';
export const DEFAULT_POSTGRES_URL = 'postgres://postgres@127.0.0.1:5432/test';
export const POSTGRES_URL: UrlLookup = {
  option: 'connectionString',
  variable: POSTGRES_URL_ENV,
  fallback: DEFAULT_POSTGRES_URL,
};

/** The connection string for tests and the CLI: $PERCOLATOR_POSTGRES_URL or the local default. */
export function resolvePostgresUrl(env: NodeJS.ProcessEnv = process.env): string {
  return urlFromEnv(POSTGRES_URL, env);
}

/** One redaction for every package (core); re-exported here for compatibility. */
export { redactUrl };

/**
 * Resolves the URL and proves the server answers; otherwise throws a StoreError('no')
 * whose message names the environment variable to set.
 */
export async function assertPostgresReachable(url: string = resolvePostgresUrl()): Promise<string> {
  const pool = createPgPool({ connectionString: url, max: 1, connectionTimeoutMillis: 5000 });
  pool.on('error', () => {});
  try {
    const client = await pool.connect();
    try {
      await client.query('SELECT 1');
    } finally {
      client.release();
    }
    return url;
  } catch (error) {
    throw unreachableError('PostgreSQL', url, POSTGRES_URL, error, isAuthFailure);
  } finally {
    await pool.end();
  }
}
