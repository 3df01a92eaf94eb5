import { redactUrl, StoreError } from '@percolator/core';
import { type UrlLookup, urlFromEnv } from '@percolator/core/kit';
import { type Connection, createConnection } from 'mysql2/promise';
import { isAuthFailure, messageOf } from './errors.js';

export const MYSQL_URL_ENV = 'PERCOLATOR_MYSQL_URL';
export const DEFAULT_MYSQL_URL = 'mysql://root@127.0.0.1:3306/test';
export const MYSQL_URL: UrlLookup = { option: 'uri', variable: MYSQL_URL_ENV, fallback: DEFAULT_MYSQL_URL };

/** The connection URI for tests and the CLI: $PERCOLATOR_MYSQL_URL or the local default. */
export function resolveMySqlUrl(env: NodeJS.ProcessEnv = process.env): string {
  return urlFromEnv(MYSQL_URL, env);
}

/** The URL without its password, for messages: core's one redaction, re-exported as before. */
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
    throw new StoreError(
      `MySQL/MariaDB is not reachable at ${redactUrl(url)}: ${messageOf(error)}. ` +
        `Start a server or set ${MYSQL_URL_ENV} (default ${DEFAULT_MYSQL_URL}).`,
      'no',
      { cause: error, retryable: !isAuthFailure(error) },
    );
  } finally {
    await connection?.end().catch(() => {});
  }
}
