import { failureMapping } from '@percolator/core/kit';

export { messageOf } from '@percolator/core/kit';

/** SQLSTATEs after which the whole statement was rolled back and trying again may work. */
const TRANSIENT_ROLLBACK = new Set(['40001', '40P01']);

interface PgErrorFields {
  readonly code?: unknown;
  readonly severity?: unknown;
  readonly message?: unknown;
}

function fields(error: unknown): PgErrorFields {
  return typeof error === 'object' && error !== null ? (error as PgErrorFields) : {};
}

/**
 * SQLSTATEs of authentication and authorization failures: class 28 (invalid authorization
 * specification: 28000, e.g. a role that does not exist or may not log in; 28P01, a wrong
 * password) and 42501 (insufficient privilege). Running the transaction again cannot fix
 * them, so they are not retryable.
 */
export function isAuthFailure(error: unknown): boolean {
  const { code } = fields(error);
  return typeof code === 'string' && (code.startsWith('28') || code === '42501');
}

export function isTransientRollback(error: unknown): boolean {
  const { code } = fields(error);
  return typeof code === 'string' && TRANSIENT_ROLLBACK.has(code);
}

/**
 * Whether the server answered the statement with an ERROR: then the statement (run in
 * autocommit) was rolled back. FATAL/PANIC, class 08 (connection exception) and class 57
 * (operator intervention, e.g. pg_terminate_backend) may arrive after a commit, and
 * socket errors / "Connection terminated unexpectedly" give no answer at all.
 */
function certainlyRolledBack(error: unknown): boolean {
  const { code, severity, message } = fields(error);
  // pg refuses to send on a client it already knows is broken.
  if (typeof message === 'string' && /is not queryable/.test(message)) return true;
  if (severity !== 'ERROR' || typeof code !== 'string') return false;
  return !code.startsWith('08') && !code.startsWith('57');
}

/** Whether the connection should be thrown away rather than returned to the pool. */
export function isConnectionBroken(error: unknown): boolean {
  return !certainlyRolledBack(error);
}

export const { readError, writeError, connectError } = failureMapping({
  store: 'postgres',
  certainlyNotApplied: certainlyRolledBack,
  isAuthFailure,
});
