import { failureMapping } from '@percolator/core/kit';

export { messageOf } from '@percolator/core/kit';

/**
 * Server error numbers that may arrive after the statement took effect (the connection
 * or server is going away, or an error no handler can catch came after a COMMIT), so they
 * do not prove the statement was rolled back.
 */
const AMBIGUOUS_SERVER_ERRNOS = new Set([
  1053, // ER_SERVER_SHUTDOWN
  1152, // ER_ABORTING_CONNECTION
  1180, // ER_ERROR_DURING_COMMIT (also what the stamped CAS procedure raises after COMMIT)
  1317, // ER_QUERY_INTERRUPTED (KILL QUERY)
  1927, // ER_CONNECTION_KILLED (MariaDB, KILL)
  // ER_STATEMENT_TIMEOUT (MariaDB max_statement_time): like KILL QUERY it skips a stored
  // procedure's handlers, and a timer that fires during the procedure's COMMIT leaves the
  // commit done and this error as the answer (a review reproduced it: of 28 stamped CALLs
  // answered 1969, 23 had written their row). A single autocommit statement it interrupts
  // is rolled back, but the CALLs are writes too, so 1969 proves nothing either way.
  1969,
  4031, // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8)
  // Errors the server raises as fatal (ME_FATAL, or an out-of-memory status set directly):
  // a stored procedure's handlers never run for them (sp_head::execute checks
  // is_fatal_error), so the stamped procedures' exit handler cannot turn one that comes
  // after their COMMIT into ER_ERROR_DURING_COMMIT. The CALL answers the bare error and the
  // write may be committed: on MariaDB 10.11 a procedure that commits and then sorts past
  // sort_buffer_size answers 1038 with its row committed (errors.test.ts).
  5, // EE_OUTOFMEMORY (mysys my_malloc: "Out of memory (Needed N bytes)")
  1037, // ER_OUTOFMEMORY
  1038, // ER_OUT_OF_SORTMEMORY
  1041, // ER_OUT_OF_RESOURCES (the server's own allocator out of memory)
  1436, // ER_STACK_OVERRUN_NEED_MORE (thread stack exhausted)
]);

export const ER_DUP_ENTRY = 1062;

/** InnoDB chose this transaction as a deadlock victim and rolled ALL of it back. */
export const ER_LOCK_DEADLOCK = 1213;

/** A PREPARE refused: the server holds max_prepared_stmt_count statements (nothing ran). */
export const ER_MAX_PREPARED_STMT_COUNT_REACHED = 1461;

/**
 * Authentication and authorization failures: running the transaction again cannot fix
 * them, so they are not retryable.
 */
const AUTH_ERRNOS = new Set([
  1044, // ER_DBACCESS_DENIED_ERROR: no access to the database
  1045, // ER_ACCESS_DENIED_ERROR: unknown user or wrong password
  1142, // ER_TABLEACCESS_DENIED_ERROR
  1143, // ER_COLUMNACCESS_DENIED_ERROR
  1227, // ER_SPECIFIC_ACCESS_DENIED_ERROR
  1370, // ER_PROCACCESS_DENIED_ERROR (EXECUTE on the stamped CAS procedure)
  1698, // ER_ACCESS_DENIED_NO_PASSWORD_ERROR (MariaDB answers an unknown user with it)
  1862, // ER_MUST_CHANGE_PASSWORD_LOGIN
]);

interface MySqlErrorFields {
  readonly errno?: unknown;
  readonly code?: unknown;
  readonly sqlState?: unknown;
  readonly fatal?: unknown;
  readonly message?: unknown;
}

function fields(error: unknown): MySqlErrorFields {
  return typeof error === 'object' && error !== null ? (error as MySqlErrorFields) : {};
}

export function errnoOf(error: unknown): number | undefined {
  const { errno } = fields(error);
  return typeof errno === 'number' ? errno : undefined;
}

/** Also SQLSTATE 28000 (invalid authorization specification), whatever the errno. */
export function isAuthFailure(error: unknown): boolean {
  const errno = errnoOf(error);
  return (errno !== undefined && AUTH_ERRNOS.has(errno)) || fields(error).sqlState === '28000';
}

/**
 * ER_NO_SUCH_TABLE (1146) and ER_SP_DOES_NOT_EXIST (1305): a table or procedure of the
 * namespace is not there (dropped, or never created). Not retryable
 * (core/src/kit/failures.ts).
 */
export function isMissingSchema(error: unknown): boolean {
  const errno = errnoOf(error);
  return errno === 1146 || errno === 1305;
}

/** mysql2 refuses to send on a connection it already knows is closed. */
function refusedToSend(error: unknown): boolean {
  const { message } = fields(error);
  return typeof message === 'string' && /closed state/.test(message);
}

/**
 * Whether the server answered ONE autocommit statement with an error: then InnoDB rolled
 * the statement back. Lost connections (mysql2 marks them `fatal`), socket errors and
 * timeouts after sending give no answer, so the statement may have run.
 */
function serverRejected(error: unknown): boolean {
  const { errno, sqlState, fatal } = fields(error);
  if (fatal === true || typeof errno !== 'number' || typeof sqlState !== 'string') return false;
  return errno < 2000 && !AMBIGUOUS_SERVER_ERRNOS.has(errno);
}

function certainlyRolledBack(error: unknown): boolean {
  return refusedToSend(error) || serverRejected(error);
}

/** Whether the connection should be destroyed rather than returned to the pool. */
export function isConnectionBroken(error: unknown): boolean {
  return !serverRejected(error);
}

/**
 * `writeError(what, error, maybePartly)`: with `maybePartly` (a multi-statement batch),
 * earlier statements may have applied even when the server answered with an error.
 */
export const { readError, writeError, connectError } = failureMapping({
  store: 'mysql',
  certainlyNotApplied: certainlyRolledBack,
  isAuthFailure,
  isMissingSchema,
});
