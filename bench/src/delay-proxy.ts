import { existsSync } from 'node:fs';
import { connect, createServer, type Socket } from 'node:net';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';

/**
 * `--rtt`: a fixed network delay on every backend call. A loopback TCP proxy in front of
 * each server holds every chunk for a fixed time in each direction, so every round trip
 * (a statement, a command, a pipeline, an HTTP request) costs `rtt` more, whoever sends it:
 * Percolator, raw calls and the native transactions alike.
 */

export interface ProxyTarget {
  readonly host: string;
  readonly port: number;
}

/** The delay each way: `up` on what the client sends, `down` on what the server answers. */
export interface RttSplit {
  readonly up: number;
  readonly down: number;
}

/**
 * About half the round trip each way, in whole milliseconds where `rttMs` is whole: the
 * request gets the larger half (1 ms: all of it; 5 ms: 3 and 2). Node's timers fire at
 * 1 ms granularity, so a half-millisecond each way would come out as a whole one each way,
 * a round trip twice too long; for a request and its reply only the sum matters.
 */
export function splitRtt(rttMs: number): RttSplit {
  if (rttMs <= 0) return { up: 0, down: 0 };
  const up = Math.min(rttMs, Math.ceil(rttMs / 2));
  return { up, down: rttMs - up };
}

/** Early by at most this much, a chunk goes out with the timer that is due (a later timer would be ~1 ms late). */
const EARLY_MS = 0.25;

/** Chunks from one socket to another, each held `delayMs`, in order. */
class DelayLine {
  private readonly queue: { chunk: Buffer; due: number }[] = [];
  private timer: NodeJS.Timeout | undefined;
  private ending = false;

  constructor(
    private readonly delayMs: number,
    private readonly out: Socket,
  ) {}

  push(chunk: Buffer): void {
    if (this.delayMs <= 0 && this.queue.length === 0) {
      this.out.write(chunk);
      return;
    }
    this.queue.push({ chunk, due: performance.now() + this.delayMs });
    if (!this.timer) this.arm();
  }

  /** The source ended: end the destination once everything held has gone out. */
  end(): void {
    this.ending = true;
    if (this.queue.length === 0) this.out.end();
  }

  clear(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.queue.length = 0;
  }

  private arm(): void {
    const wait = this.queue[0]!.due - performance.now();
    this.timer = setTimeout(() => this.fire(), Math.max(1, Math.round(wait)));
  }

  private fire(): void {
    this.timer = undefined;
    const now = performance.now();
    while (this.queue.length > 0 && this.queue[0]!.due <= now + EARLY_MS) {
      if (!this.out.destroyed) this.out.write(this.queue.shift()!.chunk);
      else this.queue.shift();
    }
    if (this.queue.length > 0) this.arm();
    else if (this.ending) this.out.end();
  }
}

export interface DelayProxy {
  /** Where clients connect instead of the server: 127.0.0.1 and a free port. */
  readonly host: string;
  readonly port: number;
  readonly target: ProxyTarget;
  close(): Promise<void>;
}

/** A proxy on 127.0.0.1 in front of `target`, adding `rttMs` to every round trip (in this thread). */
export async function startDelayProxy(target: ProxyTarget, rttMs: number): Promise<DelayProxy> {
  const { up, down } = splitRtt(rttMs);
  const sockets = new Set<Socket>();
  const server = createServer({ noDelay: true }, (client) => {
    const upstream = connect({ host: target.host, port: target.port, noDelay: true });
    sockets.add(client);
    sockets.add(upstream);
    const toServer = new DelayLine(up, upstream);
    const toClient = new DelayLine(down, client);
    client.on('data', (chunk: Buffer) => toServer.push(chunk));
    upstream.on('data', (chunk: Buffer) => toClient.push(chunk));
    client.on('end', () => toServer.end());
    upstream.on('end', () => toClient.end());
    const drop = () => {
      toServer.clear();
      toClient.clear();
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on('error', drop);
    upstream.on('error', drop);
    client.on('close', drop);
    upstream.on('close', drop);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const address = server.address();
  if (address === null || typeof address !== 'object') throw new Error('the delay proxy has no port');
  return {
    host: '127.0.0.1',
    port: address.port,
    target,
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(() => resolve());
      }),
  };
}

/** Proxies for several targets, running in their own thread (see startProxies). */
export interface ProxyGroup {
  /** One per target, in order. */
  readonly proxies: readonly ProxyTarget[];
  /** True when they run in a worker thread (from the built package), false in this one (from source). */
  readonly threaded: boolean;
  close(): Promise<void>;
}

const WORKER = fileURLToPath(new URL('./delay-proxy-worker.js', import.meta.url));

/**
 * Proxies for `targets`, in a worker thread of their own when the built worker is there:
 * the bench's own event loop is busy with the clients, and a timer it served late would
 * add more delay to the client that uses more CPU (Percolator) than to the baselines.
 */
export async function startProxies(targets: readonly ProxyTarget[], rttMs: number): Promise<ProxyGroup> {
  if (!existsSync(WORKER)) {
    const proxies = await Promise.all(targets.map((t) => startDelayProxy(t, rttMs)));
    return {
      proxies: proxies.map(({ host, port }) => ({ host, port })),
      threaded: false,
      close: async () => {
        await Promise.all(proxies.map((p) => p.close()));
      },
    };
  }
  const worker = new Worker(WORKER, { workerData: { targets, rttMs } });
  worker.unref();
  const ports = await new Promise<number[]>((resolve, reject) => {
    worker.once('message', (message: { ports?: number[]; error?: string }) =>
      message.ports ? resolve(message.ports) : reject(new Error(message.error ?? 'delay proxy failed')),
    );
    worker.once('error', reject);
  });
  return {
    proxies: ports.map((port) => ({ host: '127.0.0.1', port })),
    threaded: true,
    close: async () => {
      const exited = new Promise<void>((resolve) => worker.once('exit', () => resolve()));
      worker.postMessage('close');
      await Promise.race([exited, new Promise((resolve) => setTimeout(resolve, 2000))]);
      await worker.terminate();
    },
  };
}

/** Round trips through a proxy to an echo server: what `--rtt` adds, measured (median ms). */
export async function measureRtt(rttMs: number, samples = 20): Promise<number> {
  const echo = createServer({ noDelay: true }, (socket) => socket.pipe(socket));
  await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', () => resolve()));
  const address = echo.address() as { port: number };
  const group = await startProxies([{ host: '127.0.0.1', port: address.port }], rttMs);
  const proxy = group.proxies[0]!;
  const socket = connect({ host: proxy.host, port: proxy.port, noDelay: true });
  try {
    await new Promise<void>((resolve, reject) => {
      socket.once('connect', () => resolve());
      socket.once('error', reject);
    });
    const times: number[] = [];
    for (let i = 0; i < samples; i++) {
      const start = performance.now();
      const reply = new Promise<void>((resolve) => socket.once('data', () => resolve()));
      socket.write('x');
      await reply;
      times.push(performance.now() - start);
    }
    times.sort((a, b) => a - b);
    return times[Math.floor(times.length / 2)]!;
  } finally {
    socket.destroy();
    await group.close();
    await new Promise<void>((resolve) => echo.close(() => resolve()));
  }
}
