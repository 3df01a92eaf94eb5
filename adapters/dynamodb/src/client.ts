import { DynamoDBClient, type DynamoDBClientConfig } from '@aws-sdk/client-dynamodb';
import { InvalidArgumentError } from '@percolator/core';
import { validateQueryTimeout } from '@percolator/core/kit';

export interface ClientOptions {
  readonly client?: DynamoDBClient;
  readonly endpoint?: string;
  readonly region?: string;
  readonly credentials?: DynamoDBClientConfig['credentials'];
  readonly requestTimeoutMs?: number;
}

export const DEFAULT_REQUEST_TIMEOUT_MS = 5_000;
const CONNECT_TIMEOUT_MS = 3_000;

/**
 * The client the store talks through, whether the store owns it (and so destroys it on
 * close), and the deadline of each call on a caller's client (`requestTimeoutMs`).
 *
 * A client we create has `maxAttempts: 1`: the SDK's own retries would resend a
 * conditional write whose reply was lost, and if the first attempt had landed the resent
 * one fails its condition and looks like a conflict. Our own retry layer (`calls.ts`)
 * retries only what is safe. A timed-out request is turned into an error
 * (`throwOnRequestTimeout`) so it surfaces as an unknown outcome instead of hanging.
 * A caller's client may have no timeout at all (the SDK's default handler has none), and
 * its handler's settings cannot be read back, so `Caller` aborts each call it makes on such
 * a client after `deadlineMs` (requestTimeoutMs), counted from the call's start: a bound on
 * the whole call. On our own client the same deadline ends where its handler's timeouts
 * begin (`untilHandler`): the handler bounds the wait for a reply's headers
 * (`requestTimeout`) and any quiet spell of the socket after them (`socketTimeout`), so a
 * long reply that is still arriving is never cut, while what comes before the handler
 * (credentials that never resolve, say) still is.
 */
export async function resolveClient(options: ClientOptions): Promise<{
  client: DynamoDBClient;
  owned: boolean;
  deadlineMs: number;
  untilHandler: boolean;
}> {
  const timeout = validateQueryTimeout(
    options.requestTimeoutMs,
    'requestTimeoutMs',
    DEFAULT_REQUEST_TIMEOUT_MS,
  );
  if (options.client !== undefined) {
    // null or {} failed with a TypeError reading its config.
    if (
      typeof options.client !== 'object' ||
      options.client === null ||
      typeof (options.client as { send?: unknown }).send !== 'function' ||
      typeof (options.client as { config?: unknown }).config !== 'object'
    )
      throw new InvalidArgumentError('client must be a DynamoDBClient from @aws-sdk/client-dynamodb');
    if (options.endpoint !== undefined || options.region !== undefined || options.credentials !== undefined) {
      throw new InvalidArgumentError('pass either `client` or `endpoint`/`region`/`credentials`, not both');
    }
    await assertSingleAttempt(options.client);
    return { client: options.client, owned: false, deadlineMs: timeout, untilHandler: false };
  }
  const config: DynamoDBClientConfig = {
    maxAttempts: 1,
    requestHandler: {
      connectionTimeout: Math.min(CONNECT_TIMEOUT_MS, timeout),
      // Until the reply's headers: then the call resolves and the SDK reads its body.
      requestTimeout: timeout,
      throwOnRequestTimeout: true,
      // A socket quiet this long, the body's reading included: a reply that stalls after its
      // headers fails, one still arriving is never cut.
      socketTimeout: timeout,
    },
  };
  if (options.endpoint !== undefined) config.endpoint = options.endpoint;
  if (options.region !== undefined) config.region = options.region;
  if (options.credentials !== undefined) config.credentials = options.credentials;
  const client = new DynamoDBClient(config);
  handOverAtHandler(client);
  return { client, owned: true, deadlineMs: timeout, untilHandler: true };
}

/** Deadlines that end when their call reaches our own client's handler, by the call's abort signal. */
const untilHandler = new WeakMap<AbortSignal, () => void>();

/** `stop` ends the deadline of the call sent with `signal` once our own client's handler gets it. */
export function stopAtHandler(signal: AbortSignal, stop: () => void): void {
  untilHandler.set(signal, stop);
}

/**
 * Our own client's handler stops a call's deadline as it takes the call (after signing,
 * credentials included): from there its own timeouts apply. Its `handle` is wrapped on
 * this one instance, which the store made and no one else holds.
 */
function handOverAtHandler(client: DynamoDBClient): void {
  type Handle = (request: unknown, options?: { abortSignal?: AbortSignal }) => Promise<unknown>;
  const handler = client.config.requestHandler as unknown as { handle: Handle };
  const handle = handler.handle.bind(handler);
  handler.handle = (request, options) => {
    const signal = options?.abortSignal;
    if (signal !== undefined) {
      untilHandler.get(signal)?.();
      untilHandler.delete(signal);
    }
    return handle(request, options);
  };
}

/**
 * A caller's client must not retry on its own, for the reason given above. Its
 * `maxAttempts` is checked here; a `retryStrategy` of its own overrides that setting and
 * cannot be read back, so `Caller.write` (calls.ts) also takes any write the SDK sent more
 * than once and that then failed as an unknown outcome.
 */
async function assertSingleAttempt(client: DynamoDBClient): Promise<void> {
  const setting: unknown = client.config.maxAttempts;
  const attempts = typeof setting === 'function' ? await setting() : setting;
  if (attempts !== 1) {
    throw new InvalidArgumentError(
      `the DynamoDB client passed in must be created with maxAttempts: 1 (it has ${String(attempts)}): ` +
        'SDK retries would resend conditional writes whose reply was lost and report them as conflicts',
    );
  }
}
