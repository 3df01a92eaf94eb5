import { StoreError } from '../errors.js';

/**
 * Failure mapping, the part every networked adapter shares: a failed call becomes a
 * StoreError whose `applied` says what is known. A read changes nothing, so it is always
 * 'no'. A write is 'no' only when the server certainly did not apply it (it answered with
 * an error that rolled the statement back, or nothing was sent); anything else (a lost
 * connection, a timeout after sending) is 'unknown'. Authentication and authorization
 * failures are not retryable: running the transaction again cannot fix them. Nor is a
 * table or stored routine of the namespace that is not there (dropped under a running
 * client, or never created): it stays missing until an operator acts, and retrying it
 * only delayed the error by a transaction's retries and backoffs (found by a user).
 */
export interface FailureRules {
  /** For messages: "postgres", "mysql". */
  readonly store: string;
  /** Whether a failed write certainly did not apply. */
  readonly certainlyNotApplied: (error: unknown) => boolean;
  readonly isAuthFailure: (error: unknown) => boolean;
  /** Whether the error says a table or routine of the namespace does not exist. */
  readonly isMissingSchema?: (error: unknown) => boolean;
}

export interface FailureMapping {
  /** A failed read: 'no'. */
  readError(what: string, error: unknown): StoreError;
  /** A failed write; `maybePartly`: earlier parts of it may have applied whatever the answer. */
  writeError(what: string, error: unknown, maybePartly?: boolean): StoreError;
  /** No connection could be had: nothing was sent, 'no'. */
  connectError(error: unknown): StoreError;
}

/** A driver error's message, with its code when the message does not already name it. */
export function messageOf(error: unknown): string {
  const { code, message } = (typeof error === 'object' && error !== null ? error : {}) as {
    code?: unknown;
    message?: unknown;
  };
  const text = typeof message === 'string' ? message : String(error);
  return typeof code === 'string' && !text.includes(code) ? `${text} (${code})` : text;
}

export function failureMapping(rules: FailureRules): FailureMapping {
  const fail = (message: string, applied: 'no' | 'unknown', error: unknown) =>
    new StoreError(`${rules.store}: ${message}: ${messageOf(error)}`, applied, {
      cause: error,
      retryable: !rules.isAuthFailure(error) && !rules.isMissingSchema?.(error),
    });
  return {
    readError: (what, error) => fail(`${what} failed`, 'no', error),
    writeError: (what, error, maybePartly = false) => {
      const applied = !maybePartly && rules.certainlyNotApplied(error) ? 'no' : 'unknown';
      const outcome = applied === 'no' ? 'it was not applied' : 'it may or may not have been applied';
      return fail(`${what} failed (${outcome})`, applied, error);
    },
    connectError: (error) => fail('could not get a connection', 'no', error),
  };
}

/**
 * A later round trip of a batch failed after earlier ones applied: the batch as a whole is
 * unknown (the core then re-reads each row and decides again).
 */
export function partlyApplied(error: unknown): unknown {
  if (!(error instanceof StoreError) || error.applied === 'unknown') return error;
  return new StoreError(`${error.message} (earlier requests of this batch were applied)`, 'unknown', {
    cause: error,
  });
}
