import { createServer } from 'node:net';

/**
 * A TCP port nothing listens on right now (it can be taken before you bind it: retry).
 * `host` undefined: free on every interface, as DynamoDB Local binds them all.
 */
export function freePort(host?: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.once('error', reject);
    const done = () => {
      const address = server.address();
      server.close(() => {
        if (address !== null && typeof address === 'object') resolve(address.port);
        else reject(new Error('could not find a free port'));
      });
    };
    if (host === undefined) server.listen(0, done);
    else server.listen(0, host, done);
  });
}
