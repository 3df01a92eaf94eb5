import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { freePort, portFree } from '../src/ports.js';

/**
 * The ports private servers get: free, below the kernel's ephemeral range (where an
 * outgoing connection's local port could take one while its server is down for a restart),
 * never the same twice in one process, and with the extra ports asked for free, below the
 * range and reserved as well.
 */
function ephemeralStart(): number | undefined {
  try {
    return Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
  } catch {
    return undefined; // no /proc: freePort falls back to the kernel's choice
  }
}
const LOWEST = 20_000;

afterEach(() => vi.restoreAllMocks());

describe('freePort', () => {
  it('hands out free ports below the ephemeral range, each once', async () => {
    const start = ephemeralStart();
    const ports: number[] = [];
    for (let i = 0; i < 20; i++) ports.push(await freePort('127.0.0.1'));
    expect(new Set(ports).size).toBe(ports.length);
    for (const port of ports) {
      if (start !== undefined) expect(port).toBeLessThan(start);
      expect(await portFree(port, '127.0.0.1')).toBe(true);
    }
  });

  it('with offsets, the ports at those offsets are free, below the range, and never handed out again', async () => {
    const start = ephemeralStart();
    for (let i = 0; i < 10; i++) {
      const port = await freePort(undefined, [10_000]);
      if (start !== undefined) expect(port + 10_000).toBeLessThan(start);
      expect(await portFree(port + 10_000)).toBe(true);
    }
    // A plain draw that lands on a node's bus port goes elsewhere (it was handed out with it).
    const node = await freePort(undefined, [10_000]);
    if (start !== undefined) {
      const room = start - LOWEST;
      vi.spyOn(Math, 'random').mockReturnValueOnce((node + 10_000 - LOWEST + 0.5) / room);
    }
    expect(await freePort()).not.toBe(node + 10_000);
  });

  it('refuses an offset that is not a positive integer', async () => {
    for (const offset of [0, -1, 1.5, 70_000])
      await expect(freePort(undefined, [offset])).rejects.toBeInstanceOf(RangeError);
  });

  it('portFree says no for a port something listens on', async () => {
    const server = createServer();
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as { port: number };
    expect(await portFree(port, '127.0.0.1')).toBe(false);
    await new Promise((resolve) => server.close(resolve));
    expect(await portFree(port, '127.0.0.1')).toBe(true);
  });
});
