/**
 * A connection URL with its secrets replaced by `***`, for messages, logs and reports.
 * The one redaction every package uses (adapters' error messages, @percolator/connect,
 * the CLIs, bench). The user name and everything else stay, so a message still says
 * where it connected.
 *
 * Secrets are the password of `user:password@` and the value of a query parameter that
 * carries one (`?password=`, which the PostgreSQL and Redis clients both accept, and its
 * kin below). Text that is not one URL (a Redis Cluster node list "a:7001,b:7002", a typo)
 * is never returned as-is if it holds `user:password@` (with or without `//`) or such a
 * parameter: each is replaced too.
 */
export function redactUrl(url: string): string {
  try {
    const parsed = new URL(url);
    // "user:pass@host:port" parses as a URL of scheme "user:" with no host: not ours.
    if (parsed.host === '') return redactText(url);
    let changed = false;
    if (parsed.password !== '') {
      parsed.password = '***';
      changed = true;
    }
    for (const name of [...parsed.searchParams.keys()]) {
      if (SECRET_PARAMS.test(name)) {
        parsed.searchParams.set(name, '***');
        changed = true;
      }
    }
    return changed ? parsed.toString() : url;
  } catch {
    return redactText(url);
  }
}

/**
 * Text that is not one URL: each `user:password@` and each secret parameter replaced. A
 * parameter counts at the start, after `?`, `&`, `;`, `,` or a space: PostgreSQL's keyword
 * form (`host=db user=app password=s3cret`) separates them with spaces, and its values may
 * be quoted (`password='s3 cret'`).
 */
function redactText(text: string): string {
  return text
    .replace(/((?:^|[\s,/])[^:@/,\s]*):[^@,\s]*@/g, '$1:***@')
    .replace(KEYWORD_SECRET, '$1***')
    .replace(QUERY_SECRET, '$1***');
}

/** Query parameters whose value is a secret (a password, a token, a key). */
const SECRET_PARAMS = /pass|pwd|secret|token|key/i;

/** A parameter name that holds one of SECRET_PARAMS, and a value that may be quoted. */
const NAME = `[^=&;,\\s]*(?:${SECRET_PARAMS.source})[^=&;,\\s]*`;
const QUOTED = `'(?:[^'\\\\]|\\\\.)*'?`;
/** Keyword form (at the start or after a space): an unquoted value ends only at a space. */
const KEYWORD_SECRET = new RegExp(`((?:^|\\s)${NAME}\\s*=\\s*)(${QUOTED}|\\S*)`, 'gi');
/** A query string: a value ends at the next parameter. */
const QUERY_SECRET = new RegExp(`([?&;,]${NAME}=)(${QUOTED}|[^&;,\\s]*)`, 'gi');
