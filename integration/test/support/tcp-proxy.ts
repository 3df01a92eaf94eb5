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
  /**
   * Bytes through each connection, for a failure message: the open ones, and the closed
   * ones that lost replies (a stuck client whose connection lost nothing here lost it
   * elsewhere).
   */
  private readonly traffic = new Map<Socket, Traffic>();

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

  /** Its state and its connections' traffic, on one line (test failure messages). */
  describe(): string {
    const at = (ms: number) => new Date(ms).toISOString().slice(11, 23);
    const connections = [...this.traffic].map(
      ([socket, t]) =>
        `${socket.remotePort ?? '?'} ${t.closed === undefined ? 'open' : `closed ${at(t.closed)}`} since ${at(t.opened)}: ` +
        `${t.up} B up, ${t.down} B down, ${t.dropped} B of replies dropped`,
    );
    return `proxy :${this.port} ${this.server ? 'listening' : 'cut'}${this.dropping ? ', dropping replies' : ''}; ${connections.join('; ') || 'no connections'}`;
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
    const traffic: Traffic = { up: 0, down: 0, dropped: 0, opened: Date.now() };
    this.traffic.set(client, traffic);
    const close = () => {
      client.destroy();
      upstream.destroy();
      this.sockets.delete(client);
      this.sockets.delete(upstream);
      traffic.closed ??= Date.now();
      if (traffic.dropped === 0) this.traffic.delete(client);
    };
    client.on('error', close).on('close', close);
    upstream.on('error', close).on('close', close);
    client.on('data', (chunk) => {
      traffic.up += chunk.length;
      upstream.write(chunk);
    });
    upstream.on('data', (chunk) => {
      if (this.dropping) {
        traffic.dropped += chunk.length;
        return;
      }
      traffic.down += chunk.length;
      client.write(chunk);
    });
    upstream.connect(this.targetPort, this.targetHost);
  }
}

interface Traffic {
  up: number;
  down: number;
  dropped: number;
  readonly opened: number;
  closed?: number;
}
