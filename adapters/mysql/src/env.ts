import { redactUrl } from '@percolator/core';
import { type UrlLookup, unreachableError, urlFromEnv } from '@percolator/core/kit';
import { type Connection, createConnection } from 'mysql2/promise';
import { isAuthFailure } from './errors.js';

export const MYSQL_URL_ENV = 'PERCOLATOR_MYSQL_URL';
export const DEFAULT_MYSQL_URL = 'mysql://root@127.0.0.1:3306/test';
export const MYSQL_URL: UrlLookup = { option: 'uri', variable: MYSQL_URL_ENV, fallback: DEFAULT_MYSQL_URL };

/** The connection URI for tests and the CLI: $PERCOLATOR_MYSQL_URL or the local default. */
export function resolveMySqlUrl(env: NodeJS.ProcessEnv = process.env): string {
  return urlFromEnv(MYSQL_URL, env);
}

/** One redaction for every package (core); re-exported here for compatibility. */
export { redactUrl };

/**
 * Resolves the URL and proves the server answers; otherwise throws a StoreError('no')
 * whose message names the environment variable to set.
 */
export async function assertMySqlReachable(url: string = resolveMySqlUrl()): Promise<string> {
  let connection: Connection | undefined;
  try {
    connection = await createConnection({ uri: url, connectTimeout: 5000 });
    await connection.query('SELECT 1');
    return url;
  } catch (error) {
    throw unreachableError('MySQL/MariaDB', url, MYSQL_URL, error, isAuthFailure);
  } finally {
    await connection?.end().catch(() => {});
  }
}
