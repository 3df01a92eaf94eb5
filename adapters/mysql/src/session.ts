import { StoreError } from '@percolator/core';

/**
 * Session settings the store relies on, read once per connection (Connector.connect).
 * `SHOW ... WHERE` because the isolation variable is `tx_isolation` on MariaDB before 11.1
 * and `transaction_isolation` on MySQL 8 (which dropped `tx_isolation`): a SELECT of the
 * missing one would fail. Fixed text, nothing spliced in.
 */
export const SESSION_SETTINGS_SQL = `SHOW SESSION VARIABLES WHERE Variable_name IN
  ('autocommit', 'completion_type', 'sql_mode', 'tx_isolation', 'transaction_isolation', 'sql_select_limit')`;

/** sql_select_limit's default, the largest BIGINT UNSIGNED: no limit. */
const NO_SELECT_LIMIT = '18446744073709551615';

/**
 * What is wrong with one connection's session, each as "setting (why), needs value";
 * empty if nothing. Each of these loses, hides or misreports data (a review reproduced
 * every one on MariaDB 10.11):
 * - autocommit OFF: a CAS runs in a transaction that never commits; it is acknowledged, yet
 *   invisible to others and rolled back when the connection closes; later reads on that
 *   connection keep an old read view.
 * - completion_type CHAIN: every COMMIT in the stamped procedures starts a new transaction
 *   that stays open on the pooled connection, with the same effects (after a stamped read
 *   it is READ ONLY, so the next write fails); RELEASE closes the connection at each
 *   COMMIT, so a stamped CAS that committed answers "connection lost" ('unknown').
 * - NO_BACKSLASH_ESCAPES: mysql2 escapes the quotes of a string value with backslashes,
 *   which this mode keeps as text: the stamped procedures' JSON argument arrives broken
 *   (every stamped read and stamped CAS of many rows fails).
 * - READ UNCOMMITTED: reads see writes that are not committed and may roll back.
 * - sql_select_limit: a SELECT without LIMIT (readMany, readPeeked) drops rows that exist,
 *   which read as absent.
 * Allowed: SERIALIZABLE (a stamped read then takes shared locks: it waits for rows a
 * writer holds and may deadlock with a stamped CAS of many rows; InnoDB rolls the victim
 * back whole, answered as not applied, retryable),
 * and sql_mode without STRICT_TRANS_TABLES (every value is checked before it is sent, so
 * nothing can be truncated; the procedures keep the sql_mode they were created with).
 */
export function wrongSessionSettings(rows: readonly Record<string, unknown>[]): string[] {
  const value = new Map(rows.map((row) => [String(row.Variable_name).toLowerCase(), String(row.Value)]));
  const wrong: string[] = [];
  const autocommit = value.get('autocommit');
  if (autocommit !== undefined && autocommit.toUpperCase() !== 'ON' && autocommit !== '1')
    wrong.push(`autocommit is ${autocommit} (a write would never commit), needs autocommit = 1`);
  const completion = value.get('completion_type');
  if (completion !== undefined && completion.toUpperCase() !== 'NO_CHAIN' && completion !== '0')
    wrong.push(
      `completion_type is ${completion} (each COMMIT in the stored procedures would open another transaction or close the connection), needs completion_type = 'NO_CHAIN'`,
    );
  const modes = (value.get('sql_mode') ?? '').toUpperCase().split(',');
  if (modes.includes('NO_BACKSLASH_ESCAPES'))
    wrong.push(
      'sql_mode has NO_BACKSLASH_ESCAPES (mysql2 escapes quotes in string values with backslashes), needs sql_mode without it',
    );
  const isolation = value.get('transaction_isolation') ?? value.get('tx_isolation');
  if (isolation !== undefined && /UNCOMMITTED/i.test(isolation))
    wrong.push(
      `the isolation level is ${isolation} (reads would see uncommitted writes), needs REPEATABLE READ (the default), READ COMMITTED or SERIALIZABLE`,
    );
  const limit = value.get('sql_select_limit');
  if (limit !== undefined && limit !== NO_SELECT_LIMIT)
    wrong.push(
      `sql_select_limit is ${limit} (reads would drop rows that exist), needs sql_select_limit = DEFAULT`,
    );
  return wrong;
}

export function sessionSettingsError(namespace: string, wrong: readonly string[]): StoreError {
  return new StoreError(
    `mysql store (namespace ${namespace}) refuses a connection whose session settings it cannot work with: ` +
      `${wrong.join('; ')}. Set them on every connection of the pool (for example with SET SESSION in its ` +
      `'connection' handler) or leave the server's defaults; nothing was written`,
    'no',
    { retryable: false },
  );
}
