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

/**
 * 42P01 undefined_table and 42883 undefined_function: a table or function of the namespace
 * is not there (dropped, or never created). Not retryable (core/src/kit/failures.ts).
 */
export function isMissingSchema(error: unknown): boolean {
  const { code } = fields(error);
  return code === '42P01' || code === '42883';
}

export function isTransientRollback(error: unknown): boolean {
  const { code } = fields(error);
  return typeof code === 'string' && TRANSIENT_ROLLBACK.has(code);
}

/**
 * SQLSTATE classes and codes that can arrive with FATAL or PANIC, or for a statement whose
 * commit may have landed, so they never prove a rollback where the severity is not known:
 * - 08 connection exception ("connection to client lost", protocol violations), FATAL;
 * - 57 operator intervention: 57P01 terminate/shutdown, 57P04 database dropped, 57P05
 *   idle_session_timeout, 57P03 cannot connect now, FATAL; 57014 cancel;
 * - 25P03 idle_in_transaction_session_timeout and 25P04 transaction_timeout (17+), FATAL;
 * - 53 insufficient resources (53300 too many connections; 53100 disk full and 53200 out
 *   of memory also as PANIC), 58 system error and XX internal error (elog's default code,
 *   e.g. "cannot abort transaction ..., it was already committed"): an ERROR raised in a
 *   critical section, as while the commit record is written and flushed, becomes a PANIC
 *   with its own code, and the commit may be on disk;
 * - 42501 and 42809: what errcode_for_file_access gives EACCES/EPERM/EROFS and
 *   ENOTDIR/EISDIR/ENOTEMPTY (elog.c), so a failed WAL write or fsync (PANIC) can carry
 *   them. A plain "permission denied" is 42501 too; with an unknown severity it is then
 *   'unknown' rather than 'no': it is not retryable either way (isAuthFailure).
 * FATALs that stay out: those of connection start (class 28, 3D000, 55000, 0A000), which
 * reach connectError, never a statement; and 40001 "terminating connection due to conflict
 * with recovery", only on a hot standby, which applies no write.
 */
const MAYBE_APPLIED_CLASSES = ['08', '57', '53', '58', 'XX'];
const MAYBE_APPLIED_CODES = new Set(['25P03', '25P04', '42501', '42809']);

/** A SQLSTATE as the server sends it: five digits or upper-case letters. */
const SQLSTATE = /^[0-9A-Z]{5}$/;

function mayComeAfterCommit(code: string): boolean {
  return MAYBE_APPLIED_CLASSES.includes(code.slice(0, 2)) || MAYBE_APPLIED_CODES.has(code);
}

/**
 * Whether the server answered the statement with an ERROR: then the statement (run in
 * autocommit) was rolled back. FATAL/PANIC, class 08 (connection exception) and class 57
 * (operator intervention, e.g. pg_terminate_backend) may arrive after a commit, and
 * socket errors / "Connection terminated unexpectedly" give no answer at all.
 *
 * `severity` is the server's field S, which PostgreSQL translates with lc_messages
 * ("FEHLER", "ERREUR", "ОШИБКА"); the untranslated field V is parsed by pg-protocol but
 * copied onto no error (parseErrorMessage keeps its field map local), so it cannot be read.
 * A severity word other than ERROR/FATAL/PANIC is such a translation (a server error:
 * it comes with a SQLSTATE) of one of the three, so the SQLSTATE decides: a code that can
 * come with FATAL/PANIC or after a commit (mayComeAfterCommit) may have applied, any other
 * was an ERROR and rolled back. Without that, a server with non-English messages made
 * every error 'unknown' and destroyed its connection.
 */
function certainlyRolledBack(error: unknown): boolean {
  const { code, severity, message } = fields(error);
  // pg refuses to send on a client it already knows is broken.
  if (typeof message === 'string' && /is not queryable/.test(message)) return true;
  if (typeof code !== 'string' || typeof severity !== 'string') return false;
  if (severity === 'ERROR') return !code.startsWith('08') && !code.startsWith('57');
  if (severity === 'FATAL' || severity === 'PANIC' || severity === '') return false;
  return SQLSTATE.test(code) && !mayComeAfterCommit(code);
}

/** Whether the connection should be thrown away rather than returned to the pool. */
export function isConnectionBroken(error: unknown): boolean {
  return !certainlyRolledBack(error);
}

export const { readError, writeError, connectError } = failureMapping({
  store: 'postgres',
  certainlyNotApplied: certainlyRolledBack,
  isAuthFailure,
  isMissingSchema,
});
