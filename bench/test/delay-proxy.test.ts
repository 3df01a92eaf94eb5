import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { InvalidArgumentError, MemoryStore } from '@percolator/core';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { runBench } from '../src/bench.js';
import { splitRtt, startDelayProxy } from '../src/delay-proxy.js';
import { delayedStore } from '../src/delayed-store.js';
import { parseOptions } from '../src/options.js';
import { summaryMarkdown } from '../src/report/summary.js';

let echo: Server;
let echoPort: number;

beforeAll(async () => {
  echo = createServer((socket) => socket.pipe(socket));
  await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', () => resolve()));
  echoPort = (echo.address() as { port: number }).port;
});

afterAll(async () => {
  await new Promise<void>((resolve) => echo.close(() => resolve()));
});

async function open(port: number): Promise<Socket> {
  const socket = connect({ host: '127.0.0.1', port });
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', () => resolve());
    socket.once('error', reject);
  });
  return socket;
}

/** Sends `data` and resolves with what came back once it is all back, and the time taken. */
function roundTrip(socket: Socket, data: Buffer): Promise<{ back: Buffer; ms: number }> {
  const start = performance.now();
  const chunks: Buffer[] = [];
  let length = 0;
  return new Promise((resolve) => {
    const onData = (chunk: Buffer) => {
      chunks.push(chunk);
      length += chunk.length;
      if (length >= data.length) {
        socket.off('data', onData);
        resolve({ back: Buffer.concat(chunks), ms: performance.now() - start });
      }
    };
    socket.on('data', onData);
    socket.write(data);
  });
}

describe('--rtt: the loopback delay proxy', () => {
  test('a round trip through a 20 ms proxy takes at least 15 ms, and the bytes arrive intact', async () => {
    const proxy = await startDelayProxy({ host: '127.0.0.1', port: echoPort }, 20);
    expect(proxy.host).toBe('127.0.0.1');
    const socket = await open(proxy.port);
    try {
      const small = await roundTrip(socket, Buffer.from('ping'));
      expect(small.back.toString()).toBe('ping');
      expect(small.ms).toBeGreaterThanOrEqual(15);
      // Many chunks, in order, both ways.
      const big = randomBytes(2 * 1024 * 1024);
      const { back } = await roundTrip(socket, big);
      expect(back.equals(big)).toBe(true);
    } finally {
      socket.destroy();
      await proxy.close();
    }
  });

  test('closing the proxy ends its connections; the server side sees the client leave', async () => {
    const proxy = await startDelayProxy({ host: '127.0.0.1', port: echoPort }, 2);
    const socket = await open(proxy.port);
    const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
    await proxy.close();
    await closed;
  });

  test('the delay is split so each timer is whole milliseconds', () => {
    expect(splitRtt(0)).toEqual({ up: 0, down: 0 });
    expect(splitRtt(1)).toEqual({ up: 1, down: 0 });
    expect(splitRtt(2)).toEqual({ up: 1, down: 1 });
    expect(splitRtt(5)).toEqual({ up: 3, down: 2 });
  });

  test('the memory store waits in process, with its own capabilities and answers', async () => {
    const inner = new MemoryStore();
    const store = delayedStore(inner, 20);
    expect(store.capabilities).toEqual(inner.capabilities);
    expect(typeof store.readMany).toBe('function');
    const start = performance.now();
    const written = await store.checkAndSet({
      table: 't',
      key: 'k',
      expected: null,
      state: new Uint8Array([1, 2]),
    });
    expect(performance.now() - start).toBeGreaterThanOrEqual(15);
    expect(written.ok).toBe(true);
    expect([...(await store.read('t', 'k'))!.state]).toEqual([1, 2]);
  });

  test('--rtt takes milliseconds', () => {
    expect(parseOptions(['--rtt', '1']).rttMs).toBe(1);
    expect(parseOptions(['--rtt', '1ms']).rttMs).toBe(1);
    expect(parseOptions([]).rttMs).toBe(0);
    expect(() => parseOptions(['--rtt', 'fast'])).toThrow(/--rtt/);
    expect(parseOptions(['--rtt', '0.5s']).rttMs).toBe(500);
    // Timers hold the delay, on whole milliseconds: 0.2 was held as 1 and reported as 0.2.
    expect(() => parseOptions(['--rtt', '0.2'])).toThrow(/whole number of milliseconds/);
    expect(() => parseOptions(['--rtt', '1.5ms'])).toThrow(InvalidArgumentError);
    expect(parseOptions(['--concurrency', '4096']).concurrency).toEqual([4096]);
    expect(() => parseOptions(['--concurrency', '8193'])).toThrow(/8192/);
  });

  test('a run with --rtt notes the delay measured, and leaves the Redis Cluster out without failing', async () => {
    const options = parseOptions(
      '--backends memory,redis-cluster --workloads read --modes raw --duration 40ms --warmup 0 --rtt 2'.split(
        ' ',
      ),
    );
    const report = await runBench(options);
    expect(report.failures).toEqual([]);
    expect(report.skipped).toContainEqual({
      backend: 'redis-cluster',
      reason: expect.stringMatching(/--rtt does not apply/),
    });
    expect(report.network?.rttMs).toBe(2);
    expect(report.network!.measuredRttMs).toBeGreaterThanOrEqual(1.5);
    expect(summaryMarkdown(report)).toMatch(/Network: `--rtt 2`/);
    expect(report.notes.join('\n')).toMatch(/--rtt 2 ms: .* measured \d+\.\d+ ms/);
    const read = report.results.find((r) => r.backend === 'memory' && r.mode === 'raw')!;
    // Each read waits about 2 ms: a client does at most ~500 a second.
    expect(read.throughput / read.concurrency).toBeLessThan(600);
    expect(read.criticalPath?.roundTrips).toBe(1);
  });

  test('the built package runs its proxies in a worker thread (run `pnpm build` first)', async () => {
    // Not skipped when the build is missing: a skipped test is a defect (scripts/run-tests.mjs).
    if (!existsSync(new URL('../dist/delay-proxy-worker.js', import.meta.url))) {
      throw new Error('bench/dist/delay-proxy-worker.js is missing: run `pnpm build` first');
    }
    const { measureRtt, startProxies } = (await import(
      new URL('../dist/delay-proxy.js', import.meta.url).href
    )) as typeof import('../src/delay-proxy.js');
    const group = await startProxies([{ host: '127.0.0.1', port: echoPort }], 20);
    try {
      expect(group.threaded).toBe(true);
      const socket = await open(group.proxies[0]!.port);
      const { back, ms } = await roundTrip(socket, Buffer.from('hello'));
      socket.destroy();
      expect(back.toString()).toBe('hello');
      expect(ms).toBeGreaterThanOrEqual(15);
    } finally {
      await group.close();
    }
    expect(await measureRtt(20, 3)).toBeGreaterThanOrEqual(15);
  });
});
