/**
 * Every error the library throws on purpose is a PercolatorError with a stable `code`.
 * `retryable` tells callers (and `db.transact`) whether running the whole transaction
 * again with a new start timestamp may succeed.
 */
export class PercolatorError extends Error {
  readonly code: string;
  readonly retryable: boolean;
  constructor(code: string, message: string, options?: { cause?: unknown; retryable?: boolean }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = code;
    this.retryable = options?.retryable ?? false;
  }
}

/**
 * Whether `Error.stackTraceLimit` may be set (as Node itself checks before it does): not
 * where `Error` is frozen (`--frozen-intrinsics`, a lockdown), where setting it would throw
 * and turn every conflict into a TypeError. There a ConflictError keeps its stack.
 */
const STACK_LIMIT_WRITABLE = ((): boolean => {
  const descriptor = Object.getOwnPropertyDescriptor(Error, 'stackTraceLimit');
  if (descriptor === undefined) return Object.isExtensible(Error);
  return descriptor.writable === true || descriptor.set !== undefined;
})();

/**
 * A write-write conflict, or the transaction was rolled back by another client. Retryable.
 *
 * It carries no stack trace (`stack` is its name and message only). A conflict is an
 * outcome of concurrency, not a fault in the caller's code: its frames would be the
 * protocol's own, and its message names the row. Capturing them cost about 30 µs per
 * conflict in a CPU profile of contended transfers on the in-memory store (the async
 * frames included), 2.5% of all CPU at a 5% conflict rate, for errors `db.transact` mostly
 * catches and retries.
 */
export class ConflictError extends PercolatorError {
  constructor(message: string, options?: { cause?: unknown }) {
    const limit = STACK_LIMIT_WRITABLE ? Error.stackTraceLimit : undefined;
    if (limit !== undefined) Error.stackTraceLimit = 0;
    try {
      super('CONFLICT', message, { ...options, retryable: true });
    } finally {
      if (limit !== undefined) Error.stackTraceLimit = limit;
    }
  }
}

/**
 * The primary commit was sent but its outcome could not be verified: the transaction
 * may or may not be committed. Never retried automatically.
 */
export class CommitUnknownError extends PercolatorError {
  /** Undefined for a one-phase blind write, whose start timestamp the store drew. */
  readonly startTs: number | undefined;
  constructor(message: string, startTs: number | undefined, options?: { cause?: unknown }) {
    super('COMMIT_UNKNOWN', message, { ...options, retryable: false });
    this.startTs = startTs;
  }
}

/** The snapshot asked for is older than the versions still kept (section 7). Retryable. */
export class SnapshotTooOldError extends PercolatorError {
  constructor(message: string) {
    super('SNAPSHOT_TOO_OLD', message, { retryable: true });
  }
}

/** Bad input: names, keys, values, options. Nothing was changed. */
export class InvalidArgumentError extends PercolatorError {
  /** `cause`: a more specific error this one says in other words (an option of a config file, say). */
  constructor(message: string, options?: { readonly cause?: unknown }) {
    super('INVALID_ARGUMENT', message, { retryable: false, cause: options?.cause });
  }
}

/** A lock held by a live transaction did not go away within the bounded wait. Retryable. */
export class LockNotResolvedError extends PercolatorError {
  constructor(message: string) {
    super('LOCK_NOT_RESOLVED', message, { retryable: true });
  }
}

/** The store cannot do what was asked (for example an ordered scan). */
export class UnsupportedOperationError extends PercolatorError {
  constructor(message: string) {
    super('UNSUPPORTED', message, { retryable: false });
  }
}

/** A row grew past the store's size limit; the write was not sent. */
export class RowTooLargeError extends PercolatorError {
  constructor(message: string) {
    super('ROW_TOO_LARGE', message, { retryable: false });
  }
}

/**
 * A stored row this code cannot read: a format it does not know (for example written by
 * another version of the library), or a head row that names a version row which is gone.
 * Nothing is guessed: the read fails instead of returning a value that may be wrong.
 * Also a row this code cannot write exactly (a stamp past MAX_TIMESTAMP, codec.ts): the
 * write fails and nothing is sent.
 */
export class CorruptRowError extends PercolatorError {
  constructor(message: string) {
    super('CORRUPT_ROW', message, { retryable: false });
  }
}

/**
 * The caller's AbortSignal fired (or `timeoutMs` passed) before the commit point: the
 * transaction was rolled back and nothing of it is visible. A transaction that had passed
 * its commit point when the signal fired is committed and is never reported this way.
 */
export class AbortedError extends PercolatorError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('ABORTED', message, { ...options, retryable: false });
  }
}

/** The transaction or client was used after it finished or closed. */
export class ClosedError extends PercolatorError {
  constructor(message: string) {
    super('CLOSED', message, { retryable: false });
  }
}

/**
 * Thrown by a store adapter when a call failed. `applied: 'no'` promises the store did
 * not apply it (for example the connection was refused before sending); `'unknown'`
 * means it may have (timeout, connection lost after sending). The core treats any other
 * exception from a write as `'unknown'`.
 *
 * `retryable` defaults to `applied === 'no'`: a call that certainly did not apply may work
 * when the transaction runs again. Adapters pass `retryable: false` for failures that
 * running again cannot fix, such as a wrong password or missing privileges. It can only
 * turn retrying off: an error that may have been applied is never retryable.
 */
export class StoreError extends PercolatorError {
  readonly applied: 'no' | 'unknown';
  /**
   * Whether running again could fix the failure, were the call known not to have applied:
   * `retryable` for 'no'; for 'unknown' (never retryable as it stands: it may have applied)
   * what the failure itself is, a lost reply (true) or a store that broke its contract or
   * refused the credentials (false). A caller that learns the call did not apply, or that
   * it changed nothing the transaction depends on (a timestamp draw), reports it as 'no'
   * with this as its `retryable`.
   */
  readonly retryableIfNotApplied: boolean;
  constructor(
    message: string,
    applied: 'no' | 'unknown',
    options?: { readonly cause?: unknown; readonly retryable?: boolean },
  ) {
    super(applied === 'no' ? 'STORE_UNAVAILABLE' : 'STORE_AMBIGUOUS', message, {
      cause: options?.cause,
      retryable: applied === 'no' && options?.retryable !== false,
    });
    this.applied = applied;
    // Not said: what its cause is (an 'unknown' built from a refused call must not become
    // retryable once found not applied; review).
    const cause = options?.cause;
    this.retryableIfNotApplied =
      options?.retryable !== undefined
        ? options.retryable
        : cause instanceof StoreError
          ? cause.retryableIfNotApplied
          : !(cause instanceof PercolatorError && !cause.retryable);
  }
}

export function isRetryable(error: unknown): boolean {
  return error instanceof PercolatorError && error.retryable;
}
