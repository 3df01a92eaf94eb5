import type { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { StoreError } from '@percolator/core';
import { backoffMs, sleep } from '@percolator/core/kit';
import { stopAtHandler } from './client.js';

/**
 * Sending commands, and deciding what a failure means.
 *
 * The SDK client runs with `maxAttempts: 1` (see `client.ts`): its standard retry
 * strategy retries timeouts and 5xx replies, and a conditional write retried after its
 * first attempt landed fails its own condition and would be reported as a conflict,
 * which is wrong.
 *
 * Retries: one layer per failure kind (docs/writing-an-adapter.md, "Retries").
 * - Every call a RowStore method makes (reads, CAS writes, counter increments) is sent
 *   ONCE. The core's loops own those retries (a CAS failure: `updateRow`, 8 store failures;
 *   a read: `readRow`, 6 attempts; anything else: `transact`'s attempts), so retrying here
 *   too would multiply the budgets.
 * - A write is `StoreError(..., 'no')` only when DynamoDB certainly refused it (a parsed
 *   4xx service error, throttling included) or it was never sent (connect or DNS failure); a
 *   lost or unreadable reply (timeout, reset, 5xx, a 2xx whose body was cut off) is
 *   `StoreError(..., 'unknown')`.
 * - What no core loop covers is retried here, with the `retry` policy: the maintenance
 *   calls (table checks and creation, listing and dropping namespaces) and the resending
 *   of a batch's unprocessed items (a partial success, not a failure).
 *
 * Deadline: on a caller's client every call is aborted (`abortSignal`) `requestTimeoutMs`
 * after it started. Such a client may have no request timeout (the SDK's default handler
 * has none) and would wait for ever on a lost reply. The abort may come after the request
 * was sent, so it is a lost reply: 'unknown' for a write, a retryable failure for a read.
 * On our own client the deadline covers only what comes before its handler (signing,
 * credentials): the handler bounds the wait for the reply's headers and any quiet spell
 * after them (client.ts), and never cuts a reply that is still arriving.
 */

export interface RetryPolicy {
  /** Attempts of a maintenance call, and batch rounds without progress, before giving up (>= 1). */
  readonly maxAttempts: number;
  readonly baseDelayMs: number;
  readonly maxDelayMs: number;
}

export const DEFAULT_RETRY: RetryPolicy = { maxAttempts: 8, baseDelayMs: 20, maxDelayMs: 2_000 };

type Failure =
  /** The service refused the request for load (or a transaction was cancelled): not applied. */
  | 'throttled'
  /** No connection was ever made (a failed DNS lookup or connect): not applied. */
  | 'not-sent'
  /** The service answered 5xx: the request may or may not have been applied. */
  | 'server'
  /**
   * The request may have been sent and no usable answer came (timeout, reset, unreadable
   * reply, an abort: the store's deadline, the SDK's AbortError): unknown.
   */
  | 'lost'
  /** The service answered with a parsed client error (4xx): not applied, retrying will not help. */
  | 'rejected';

const THROTTLING = new Set([
  'ProvisionedThroughputExceededException',
  'ThrottlingException',
  'RequestLimitExceeded',
  'LimitExceededException',
  // A single-item write that collided with a running transaction; rejected, not applied.
  'TransactionConflictException',
]);
/** Cancellation reason codes of TransactWriteItems that mean "try again later". */
const RETRYABLE_CANCEL_REASONS = new Set([
  'TransactionConflict',
  'ThrottlingError',
  'ProvisionedThroughputExceeded',
  'RequestLimitExceeded',
]);
/** A failed DNS lookup: it comes before any connection, so nothing was sent. */
const DNS_FAILURES = new Set(['ENOTFOUND', 'EAI_AGAIN']);
/**
 * Proof that nothing was sent only when Node raised them while connecting (`syscall:
 * 'connect'`; the HTTP request waits in the socket's buffer until the connection is up).
 * A connection that was already open (a keep-alive socket) can end with the same codes
 * after the request went out: Linux keeps an ICMP host, network or port unreachable on an
 * established connection as a soft error and reports it (`read EHOSTUNREACH`) when it gives
 * up retransmitting, so a write that landed would be reported as not applied.
 */
const CONNECT_FAILURES = new Set(['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH']);

function failedBeforeSending(error: { code?: string; syscall?: string }): boolean {
  if (DNS_FAILURES.has(error.code ?? '')) return true;
  return CONNECT_FAILURES.has(error.code ?? '') && error.syscall === 'connect';
}

/**
 * Authentication and authorization failures: unknown or invalid credentials, a bad
 * signature, a missing permission. Running the transaction again cannot fix them, so the
 * StoreError is not retryable (and the call is not retried here: they classify as
 * 'rejected').
 */
const AUTH_FAILURES = new Set([
  'UnrecognizedClientException',
  'AccessDeniedException',
  'InvalidSignatureException',
  'IncompleteSignatureException',
  'MissingAuthenticationTokenException',
]);

export function isAuthFailure(error: unknown): boolean {
  return AUTH_FAILURES.has(errorName(error));
}

/**
 * Whether running the transaction again cannot help: an authentication or authorization
 * failure, or a table that is not there (ResourceNotFoundException: deleted under a running
 * client; the store waits for a new table to be ACTIVE before its first call). Such a
 * StoreError is not retryable: a transaction failed with it only after its ten attempts
 * and their backoffs (found by a user, on PostgreSQL).
 */
export function isPermanentFailure(error: unknown): boolean {
  return isAuthFailure(error) || errorName(error) === 'ResourceNotFoundException';
}

interface SdkError {
  name?: string;
  message?: string;
  code?: string;
  syscall?: string;
  errors?: { code?: string; syscall?: string }[];
  $fault?: string;
  $metadata?: { httpStatusCode?: number; attempts?: number };
  CancellationReasons?: { Code?: string }[];
}

export function errorName(error: unknown): string {
  return (error as SdkError | undefined)?.name ?? '';
}

export function classify(error: unknown): Failure {
  const e = (error ?? {}) as SdkError;
  const status = e.$metadata?.httpStatusCode;
  if (typeof status === 'number') {
    // Only a 4xx reply that the SDK parsed into a service exception (`$fault: 'client'`)
    // proves DynamoDB refused the request. Any other reply that still ends in an error
    // (a 2xx whose body was cut off or could not be parsed, a 4xx without a readable
    // error, a 5xx) may follow a write that was applied.
    if (status < 400 || status >= 500 || e.$fault !== 'client') return status >= 500 ? 'server' : 'lost';
    if (THROTTLING.has(e.name ?? '')) return 'throttled';
    if (e.name === 'TransactionCanceledException') {
      const codes = (e.CancellationReasons ?? []).map((reason) => reason.Code ?? 'None');
      if (codes.includes('ConditionalCheckFailed')) return 'rejected';
      return codes.some((code) => RETRYABLE_CANCEL_REASONS.has(code)) ? 'throttled' : 'rejected';
    }
    return 'rejected';
  }
  // Node's autoSelectFamily reports a connect that failed on every address as an
  // AggregateError (no syscall of its own) of one connect error per address.
  if (
    failedBeforeSending(e) ||
    (e.errors !== undefined && e.errors.length > 0 && e.errors.every(failedBeforeSending))
  ) {
    return 'not-sent';
  }
  // The node HTTP handler's connect timeout: the socket never connected.
  if (e.name === 'TimeoutError' && /did not establish a connection/.test(e.message ?? '')) return 'not-sent';
  return 'lost';
}

function describeError(error: unknown): string {
  const e = error as SdkError | undefined;
  if (e instanceof Error || (e && typeof e === 'object'))
    return `${e.name ?? 'Error'}: ${e.message ?? String(e)}`;
  return String(error);
}

/** The policy's delay before attempt `attempt + 1` (`attempt` counts from 1): core's one backoff. */
function delayMs(policy: RetryPolicy, attempt: number): number {
  return backoffMs(attempt - 1, policy.baseDelayMs, policy.maxDelayMs);
}

// biome-ignore lint/suspicious/noExplicitAny: the SDK's command types are generic per operation
type AnyCommand = any;

export class Caller {
  constructor(
    private readonly client: DynamoDBClient,
    readonly policy: RetryPolicy,
    /** Each call is aborted this long after it started (`requestTimeoutMs`)... */
    readonly deadlineMs: number,
    /**
     * ...or, on our own client, once its handler takes the call, if that comes first: the
     * handler's own timeouts apply from there (client.ts).
     */
    private readonly untilHandler = false,
  ) {}

  /**
   * `client.send`, aborted after `deadlineMs`. The SDK checks the signal when the request
   * reaches its HTTP handler and destroys the request on abort, so nothing is sent after
   * the deadline (a caller's retry strategy included). The race ends the call even where a
   * client's handler ignores the signal; the SDK's own AbortError that follows is dropped.
   */
  private async send<T>(command: AnyCommand): Promise<T> {
    const controller = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const deadline = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        const error = Object.assign(
          new Error(`no reply within ${this.deadlineMs} ms (requestTimeoutMs), the call was aborted`),
          { name: 'TimeoutError' },
        );
        controller.abort(error);
        reject(error);
      }, this.deadlineMs);
    });
    if (this.untilHandler) stopAtHandler(controller.signal, () => clearTimeout(timer));
    try {
      return (await Promise.race([
        this.client.send(command, { abortSignal: controller.signal }),
        deadline,
      ])) as T;
    } finally {
      clearTimeout(timer);
    }
  }

  /** A read for a RowStore method: sent once (the core retries reads); any failure is 'no'. */
  async read<T>(operation: string, command: AnyCommand): Promise<T> {
    try {
      return await this.send<T>(command);
    } catch (error) {
      throw notApplied(operation, error);
    }
  }

  /**
   * An idempotent maintenance call (table checks, namespace listing and dropping), which
   * no core loop retries: retried here on any transient failure, with the policy.
   */
  async maintenance<T>(operation: string, command: AnyCommand): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.send<T>(command);
      } catch (error) {
        if (classify(error) === 'rejected' || attempt >= this.policy.maxAttempts) {
          throw notApplied(operation, error);
        }
        await sleep(delayMs(this.policy, attempt));
      }
    }
  }

  /**
   * A write, sent once. Conditional failures (`ConditionalCheckFailedException`, a
   * `TransactionCanceledException` naming `ConditionalCheckFailed`) are rethrown as they
   * are, for the caller to turn into `{ ok: false }`.
   */
  async write<T>(operation: string, command: AnyCommand): Promise<T> {
    try {
      return await this.send<T>(command);
    } catch (error) {
      const failure = classify(error);
      // Sent more than once (a caller's client with a retry strategy of its own, which
      // overrides maxAttempts: 1): an earlier attempt may have landed, so whatever the
      // last one answered (a conditional write failing on its own first write, above all)
      // proves nothing.
      if (failure === 'server' || failure === 'lost' || sentMoreThanOnce(error)) {
        throw new StoreError(
          `DynamoDB ${operation}: outcome unknown, the write may have been applied (${describeError(error)})`,
          'unknown',
          { cause: error },
        );
      }
      if (isConditionFailure(error)) throw error;
      throw new StoreError(`DynamoDB ${operation} was not applied: ${describeError(error)}`, 'no', {
        cause: error,
        retryable: !isPermanentFailure(error),
      });
    }
  }

  /**
   * Sends `items` with `send` (which answers the ones left unprocessed) until none are
   * left, waiting with the policy's backoff; gives up after `maxAttempts` rounds in a row
   * that made no progress. Safe only for idempotent requests (reads, deletes).
   */
  async untilProcessed<I>(what: string, items: I[], send: (items: I[]) => Promise<I[]>): Promise<void> {
    let pending = items;
    let idleRounds = 0;
    while (pending.length > 0) {
      const left = await send(pending);
      idleRounds = left.length < pending.length ? 0 : idleRounds + 1;
      if (left.length > 0) {
        if (idleRounds >= this.policy.maxAttempts) {
          throw new StoreError(`DynamoDB ${what} left ${left.length} items unprocessed after retries`, 'no');
        }
        await sleep(delayMs(this.policy, idleRounds + 1));
      }
      pending = left;
    }
  }
}

/** The SDK's count of attempts for the call that ended in `error` (absent: one). */
function sentMoreThanOnce(error: unknown): boolean {
  const attempts = (error as SdkError | undefined)?.$metadata?.attempts;
  return typeof attempts === 'number' && attempts > 1;
}

function notApplied(operation: string, error: unknown): StoreError {
  return new StoreError(`DynamoDB ${operation} failed: ${describeError(error)}`, 'no', {
    cause: error,
    retryable: !isPermanentFailure(error),
  });
}

export function isConditionFailure(error: unknown): boolean {
  const name = errorName(error);
  if (name === 'ConditionalCheckFailedException') return true;
  if (name !== 'TransactionCanceledException') return false;
  return ((error as SdkError).CancellationReasons ?? []).some(
    (reason) => reason.Code === 'ConditionalCheckFailed',
  );
}
