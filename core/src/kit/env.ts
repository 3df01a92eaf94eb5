import { StoreError } from '../errors.js';
import { redactUrl } from '../redact.js';
import { messageOf } from './failures.js';

/**
 * Where an adapter's connection URL comes from: the option, else an environment variable,
 * else a local default. `source` says which, so a failure to connect names what to fix.
 */
export interface UrlLookup {
  /** The option's name, e.g. 'connectionString'. */
  readonly option: string;
  /** The environment variable, e.g. 'PERCOLATOR_POSTGRES_URL'. */
  readonly variable: string;
  /** Used when neither is set. */
  readonly fallback: string;
}

/** The URL from the environment (trimmed; blank counts as unset), or the fallback. */
export function urlFromEnv(
  lookup: Pick<UrlLookup, 'variable' | 'fallback'>,
  env: NodeJS.ProcessEnv = process.env,
): string {
  const fromEnv = env[lookup.variable]?.trim();
  return fromEnv ? fromEnv : lookup.fallback;
}

/** The URL to connect to and where it came from (for messages). */
export function resolveUrl(
  lookup: UrlLookup,
  given: string | undefined,
  env: NodeJS.ProcessEnv = process.env,
): { readonly url: string; readonly source: string } {
  if (given !== undefined) return { url: given, source: `the ${lookup.option} option` };
  if (env[lookup.variable]?.trim()) return { url: urlFromEnv(lookup, env), source: `$${lookup.variable}` };
  return {
    url: lookup.fallback,
    source: `the default; pass ${lookup.option} or set ${lookup.variable}`,
  };
}

/**
 * The error when a server cannot be reached at `url`: StoreError 'no' (nothing was sent)
 * whose message names the environment variable to set; not retryable for an auth failure.
 */
export function unreachableError(
  server: string,
  url: string,
  lookup: Pick<UrlLookup, 'variable' | 'fallback'>,
  error: unknown,
  isAuthFailure: (error: unknown) => boolean,
): StoreError {
  return new StoreError(
    `${server} is not reachable at ${redactUrl(url)}: ${messageOf(error)}. ` +
      `Start a server or set ${lookup.variable} (default ${lookup.fallback}).`,
    'no',
    { cause: error, retryable: !isAuthFailure(error) },
  );
}
