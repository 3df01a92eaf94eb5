import { createServer, type Server, Socket } from 'node:net';

/**
 * A loopback TCP proxy in front of a real server, so a test can cut the network to it
 * for real (the client's driver sees what it would see in production, not a switch in
 * front of the adapter):
 * - `cut()`: every open connection is reset (RST) and new ones are refused.
 * - `refuse()`: every open connection is closed in order (FIN, as a server going away
 *   does) and new ones are refused.
 * - `dropNextReplies()`: requests still reach the server and are applied, but whatever
 *   the server answers is thrown away, and after `settleMs` the connections are reset and
 *   the proxy is cut. That is a lost reply: the write landed, the client cannot know.
 * - `restore()`: accepts connections again, on the same port.
 */
export class TcpProxy {
  private server: Server | undefined;
  private readonly sockets = new Set<Socket>();
  private dropping = false;

  private constructor(
    private readonly targetHost: string,
    private readonly targetPort: number,
    readonly port: number,
  ) {}

  static async start(targetHost: string, targetPort: number): Promise<TcpProxy> {
    const probe = createServer();
    await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
    const port = (probe.address() as { port: number }).port;
    await new Promise<void>((resolve) => probe.close(() => resolve()));
    const proxy = new TcpProxy(targetHost, targetPort, port);
    await proxy.restore();
    return proxy;
  }

  /** Rewrites a URL's host and port to point at this proxy. */
  url(target: string): string {
    const url = new URL(target);
    url.hostname = '127.0.0.1';
    url.port = String(this.port);
    return url.toString();
  }

  async restore(): Promise<void> {
    if (this.server) return;
    this.dropping = false;
    const server = createServer((client) => this.pipe(client));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.port, '127.0.0.1', () => resolve());
    });
    this.server = server;
  }

  async cut(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    for (const socket of this.sockets) socket.resetAndDestroy();
    this.sockets.clear();
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  async refuse(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    for (const socket of this.sockets) socket.end();
    this.sockets.clear();
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  /** From now on, replies are dropped; `settleMs` later everything is cut. */
  dropNextReplies(settleMs = 300): void {
    this.dropping = true;
    setTimeout(() => void this.cut(), settleMs);
  }

  private pipe(client: Socket): void {
    const upstream = new Socket();
    this.sockets.add(client);
    this.sockets.add(upstream);
    const close = () => {
      client.destroy();
      upstream.destroy();
      this.sockets.delete(client);
      this.sockets.delete(upstream);
    };
    client.on('error', close).on('close', close);
    upstream.on('error', close).on('close', close);
    client.on('data', (chunk) => upstream.write(chunk));
    upstream.on('data', (chunk) => {
      if (!this.dropping) client.write(chunk);
    });
    upstream.connect(this.targetPort, this.targetHost);
  }
}
