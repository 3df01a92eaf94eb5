import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * A redis-server of our own on a free port, so a test can really kill it mid-commit and
 * start it again without disturbing the shared server. It keeps an append-only file with
 * `appendfsync always` (every acknowledged write is on disk before the reply), so a
 * restart brings back exactly what was acknowledged, locks included.
 */
export interface PrivateRedis {
  readonly url: string;
  /** SIGKILL: no shutdown, no final save. Resolves once the process is gone. */
  kill(): Promise<void>;
  /** Starts it again on the same port and data directory; resolves once it answers. */
  restart(): Promise<void>;
  /** Kills it and removes its data directory. */
  destroy(): Promise<void>;
}

export async function startPrivateRedis(): Promise<PrivateRedis> {
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'percolator-redis-'));
  let child: ChildProcess | undefined;
  const launch = async () => {
    const proc = spawn(
      'redis-server',
      [
        '--port',
        String(port),
        '--bind',
        '127.0.0.1',
        '--dir',
        dir,
        '--save',
        '',
        '--appendonly',
        'yes',
        '--appendfsync',
        'always',
      ],
      { stdio: 'ignore' },
    );
    child = proc;
    const spawnFailed = new Promise<never>((_, reject) =>
      proc.once('error', (e) =>
        reject(new Error(`redis-server could not be started (is it on PATH?): ${e.message}`)),
      ),
    );
    await Promise.race([waitForPort(port), spawnFailed]);
  };
  const kill = async () => {
    const proc = child;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
    proc.kill('SIGKILL');
    await exited;
  };
  await launch();
  return {
    url: `redis://127.0.0.1:${port}`,
    kill,
    restart: launch,
    async destroy() {
      await kill();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

async function waitForPort(port: number): Promise<void> {
  const deadline = Date.now() + 15_000;
  for (;;) {
    const open = await new Promise<boolean>((resolve) => {
      const socket = new Socket();
      socket.once('connect', () => {
        socket.destroy();
        resolve(true);
      });
      socket.once('error', () => resolve(false));
      socket.connect(port, '127.0.0.1');
    });
    if (open) return;
    if (Date.now() > deadline) throw new Error(`redis-server did not listen on port ${port} within 15 s`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() =>
        typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no free port')),
      );
    });
  });
}
