/**
 * A connection URL with its password replaced by `***`, for messages, logs and reports.
 * The one redaction every package uses (adapters' error messages, @percolator/connect,
 * the CLIs, bench). The user name and everything else stay, so a message still says
 * where it connected.
 *
 * Text that is not one URL (a Redis Cluster node list "a:7001,b:7002", a typo) is never
 * returned as-is if it holds `//user:password@`: each such password is replaced too.
 */
export function redactUrl(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.password === '') return url;
    parsed.password = '***';
    return parsed.toString();
  } catch {
    return url.replace(/(\/\/[^:@/,\s]*):[^@,\s]*@/g, '$1:***@');
  }
}
