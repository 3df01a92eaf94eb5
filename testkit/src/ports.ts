import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';

/**
 * Ports for the servers a test starts (private PostgreSQL, MariaDB, Redis, DynamoDB Local).
 *
 * Why not the kernel's choice (`listen(0)`). That hands out a port of the ephemeral range,
 * the range every outgoing connection's local port comes from. Between our probe and the
 * server's own bind, or while a test has a server down to restart it on the same port, a
 * client connection (the test's own pool reconnecting, say) can take that port as its
 * local end, and the server then fails to bind, or a readiness check talks to the wrong
 * peer. So a port is drawn at random from below the ephemeral range (Linux:
 * /proc/sys/net/ipv4/ip_local_port_range), where no outgoing connection lands, and probed
 * with a bind. Drawn at random, two test processes seldom pick the same one, and one
 * process never hands out the same port twice. Where the range cannot be read, or leaves no
 * room below it, the kernel's choice is the fallback.
 */
const LOWEST = 20_000;
const handedOut = new Set<number>();

/** Whether the port, or one at an offset from it, was handed out already in this process. */
function taken(port: number, offsets: readonly number[]): boolean {
  return handedOut.has(port) || offsets.some((o) => handedOut.has(port + o));
}

/**
 * Marks the port and those at its offsets as handed out: a Cluster node's bus port (port +
 * 10000) must not go to another server while the node is down for a restart (review).
 */
function reserve(port: number, offsets: readonly number[]): number {
  handedOut.add(port);
  for (const offset of offsets) handedOut.add(port + offset);
  return port;
}

/** The first port of the ephemeral range, or undefined where it cannot be read. */
function ephemeralStart(): number | undefined {
  try {
    const [low] = readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/);
    const n = Number(low);
    return Number.isInteger(n) && n > 0 ? n : undefined;
  } catch {
    return undefined;
  }
}

/** Whether nothing listens on `port` now (a bind on `host`, or every interface). */
export function portFree(port: number, host?: string): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer();
    server.unref();
    server.once('error', () => resolve(false));
    const done = () => server.close(() => resolve(true));
    if (host === undefined) server.listen(port, done);
    else server.listen(port, host, done);
  });
}

/**
 * A TCP port nothing listens on right now, below the ephemeral range (see above); it can
 * still be taken before you bind it. `host` undefined: free on every interface, as DynamoDB
 * Local binds them all. `offsets`: other ports that must be free too, each at
 * `port + offset` (a Redis Cluster node's bus port, `port + 10000`), below the ephemeral
 * range as well.
 */
export async function freePort(host?: string, offsets: readonly number[] = []): Promise<number> {
  for (const offset of offsets)
    if (!Number.isSafeInteger(offset) || offset < 1 || offset > 60_000)
      throw new RangeError(`freePort: an offset is an integer from 1 to 60000, got ${offset}`);
  const start = ephemeralStart();
  const top = Math.max(0, ...offsets);
  if (start !== undefined && start - top - LOWEST >= 1000) {
    const room = start - top - LOWEST;
    for (let attempt = 0; attempt < 100; attempt++) {
      const port = LOWEST + Math.floor(Math.random() * room);
      if (taken(port, offsets)) continue;
      if (!(await portFree(port, host))) continue;
      let others = true;
      for (const offset of offsets) if (!(await portFree(port + offset, host))) others = false;
      if (!others) continue;
      return reserve(port, offsets);
    }
  }
  return kernelPort(host, offsets);
}

/** The kernel's choice, for where no range below the ephemeral one can be used. */
async function kernelPort(host: string | undefined, offsets: readonly number[]): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = await new Promise<number>((resolve, reject) => {
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
    if (taken(port, offsets) || port + Math.max(0, ...offsets) > 65_535) continue;
    let others = true;
    for (const offset of offsets) if (!(await portFree(port + offset, host))) others = false;
    if (!others) continue;
    return reserve(port, offsets);
  }
  throw new Error('could not find a free port');
}
