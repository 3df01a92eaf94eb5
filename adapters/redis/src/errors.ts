import { PercolatorError, StoreError } from '@percolator/core';
import { ReplyError } from 'ioredis';

/** ioredis refused the command before writing it to a socket. */
const NEVER_SENT = [
  "Stream isn't writeable and enableOfflineQueue options is false",
  "Cluster isn't ready and enableOfflineQueue options is false",
];

/**
 * Replies that mean the client is not authenticated (NOAUTH), its credentials are wrong
 * (WRONGPASS) or its ACL user may not run the command or touch the key (NOPERM). Running
 * the transaction again cannot fix them, so they are not retryable.
 */
const AUTH_REPLY = /^(NOAUTH|WRONGPASS|NOPERM)\b/;

/** Whether `error` is a Redis authentication or authorization failure. */
export function isAuthFailure(error: unknown): boolean {
  return error instanceof ReplyError && AUTH_REPLY.test((error as Error).message);
}

/**
 * Maps an ioredis failure to a StoreError.
 *
 * - Reads change nothing, so any failed read is 'no' (retryable, except authentication and
 *   authorization failures: NOAUTH, WRONGPASS, NOPERM).
 * - A write is 'no' only when the command certainly did not run: ioredis refused it before
 *   sending, or the server answered with an error reply that rejects a command before it
 *   runs (NOSCRIPT, OOM, CLUSTERDOWN, READONLY, LOADING, BUSY, ...). An error raised by a
 *   script while it runs ("... script: ...", a WRONGTYPE on a key it reads included, on
 *   Redis 7) could come after a write, so it is 'unknown'.
 * - Everything else is 'unknown': "Connection is closed." and MaxRetriesPerRequestError
 *   (the connection dropped while the command was in flight, or ioredis gave up waiting to
 *   send it: ioredis uses the same error for both), "Command timed out" (the command may
 *   still run), "Too many Cluster redirections".
 */
export function toStoreError(error: unknown, what: string, effect: 'read' | 'write'): PercolatorError {
  if (error instanceof PercolatorError) return error;
  const message = error instanceof Error ? error.message : String(error);
  const text = `redis ${what} failed: ${message}`;
  if (effect === 'read')
    return new StoreError(text, 'no', { cause: error, retryable: !isAuthFailure(error) });
  if (NEVER_SENT.includes(message)) return new StoreError(text, 'no', { cause: error });
  if (error instanceof ReplyError) {
    const raisedInsideScript =
      !message.startsWith('NOSCRIPT') && !message.startsWith('BUSY') && /script/i.test(message);
    return new StoreError(text, raisedInsideScript ? 'unknown' : 'no', {
      cause: error,
      retryable: !isAuthFailure(error),
    });
  }
  return new StoreError(text, 'unknown', { cause: error });
}

/**
 * A drop that failed after it sent an UNLINK has deleted keys, whatever the error: never
 * 'no' (nothing applied), which an error reply (a MOVED during resharding, a NOPERM on some
 * keys) would otherwise be.
 */
export function dropFailed(error: PercolatorError, unlinked: boolean): PercolatorError {
  if (!unlinked || !(error instanceof StoreError) || error.applied === 'unknown') return error;
  return new StoreError(`${error.message} (after deleting some of its keys)`, 'unknown', {
    cause: error.cause ?? error,
    retryable: error.retryable,
  });
}
