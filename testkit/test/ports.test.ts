import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { describe, expect, it } from 'vitest';
import { freePort, portFree } from '../src/ports.js';

/**
 * The ports private servers get: free, below the kernel's ephemeral range (where an
 * outgoing connection's local port could take one while its server is down for a restart),
 * never the same twice in one process, and with the extra ports asked for free as well.
 */
const ephemeralStart = Number(
  readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0],
);

describe('freePort', () => {
  it('hands out free ports below the ephemeral range, each once', async () => {
    const ports: number[] = [];
    for (let i = 0; i < 20; i++) ports.push(await freePort('127.0.0.1'));
    expect(new Set(ports).size).toBe(ports.length);
    for (const port of ports) {
      expect(port).toBeLessThan(ephemeralStart);
      expect(await portFree(port, '127.0.0.1')).toBe(true);
    }
  });

  it('with offsets, the ports at those offsets are free and below the range too (a Redis Cluster bus port)', async () => {
    for (let i = 0; i < 10; i++) {
      const port = await freePort(undefined, [10_000]);
      expect(port + 10_000).toBeLessThan(ephemeralStart);
      expect(await portFree(port + 10_000)).toBe(true);
    }
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
