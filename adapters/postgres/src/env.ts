import { redactUrl, StoreError } from '@percolator/core';
import { type UrlLookup, urlFromEnv } from '@percolator/core/kit';
import { isAuthFailure, messageOf } from './errors.js';
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

/** The URL without its password, for messages: core's one redaction, re-exported as before. */
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
    throw new StoreError(
      `PostgreSQL is not reachable at ${redactUrl(url)}: ${messageOf(error)}. ` +
        `Start a server or set ${POSTGRES_URL_ENV} (default ${DEFAULT_POSTGRES_URL}).`,
      'no',
      { cause: error, retryable: !isAuthFailure(error) },
    );
  } finally {
    await pool.end();
  }
}
