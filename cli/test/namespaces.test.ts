import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Percolator, type RowStore } from '@percolator/core';
import { createMySqlStore } from '@percolator/mysql';
import { createPostgresStore } from '@percolator/postgres';
import { createRedisClusterClient, createRedisStore } from '@percolator/redis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCli } from '../src/cli.js';

/**
 * `percolator namespaces` / `drop-namespace` (moved from the conformance CLI) against the real servers: a
 * namespace made by a store is listed, refused without --yes, dropped with it, then gone
 * (and a second drop is refused as not found).
 */

function io() {
  const out: string[] = [];
  const err: string[] = [];
  return {
    io: { out: (t: string) => void out.push(t), err: (t: string) => void err.push(t) },
    get out() {
      return out.join('');
    },
    get err() {
      return err.join('');
    },
  };
}

async function cli(argv: string[]) {
  const run = io();
  const code = await runCli(argv, run.io);
  return { code, out: run.out, err: run.err };
}

async function listed(backend: string[]): Promise<string[]> {
  const { code, out, err } = await cli(['namespaces', ...backend, '--json']);
  expect(err).toBe('');
  expect(code).toBe(0);
  return (JSON.parse(out) as { namespace: string }[]).map((n) => n.namespace);
}

/** Writes through the protocol, so key/item stores hold rows, indexes and counters. */
async function fill(store: RowStore): Promise<void> {
  const db = new Percolator({ store });
  await db.transact(async (tx) => {
    tx.set('accounts', 'alice', 'balance', '10');
    tx.set('accounts', 'bob', 'balance', '20');
  });
  await db.close();
}

const fresh = () => `ns_cli_${randomBytes(5).toString('hex')}`;

interface Case {
  readonly backend: string[];
  /** Creates the namespace (with data) and closes its store. */
  create(namespace: string): Promise<void>;
  /** What the drop's output must mention. */
  readonly dropped: (namespace: string) => RegExp;
}

let dynamoEndpoint: string | undefined;
let stopDynamo: (() => Promise<void>) | undefined;

const CASES: Record<string, Case> = {
  postgres: {
    backend: ['--backend', 'postgres'],
    async create(namespace) {
      const store = await createPostgresStore({ namespace });
      await fill(store);
      await store.close();
    },
    dropped: (ns) =>
      new RegExp(`${ns}_cas_stamped_many, ${ns}_counters, ${ns}_read_stamped, ${ns}_rows, ${ns}_version_seq`),
  },
  mysql: {
    backend: ['--backend', 'mysql'],
    async create(namespace) {
      const store = await createMySqlStore({ namespace });
      await fill(store);
      await store.close();
    },
    dropped: (ns) =>
      new RegExp(
        `${ns}_counters, ${ns}_rows, ${ns}_stamped_cas_v\\d+, (${ns}_stamped_read_v\\d+, )?${ns}_version_blocks`,
      ),
  },
  redis: {
    backend: ['--backend', 'redis'],
    async create(namespace) {
      const store = await createRedisStore({ namespace });
      await fill(store);
      await store.close();
    },
    dropped: () => /: \d+ keys$/m,
  },
  'redis-cluster': {
    backend: ['--backend', 'redis-cluster'],
    async create(namespace) {
      const client = createRedisClusterClient();
      client.on('error', () => {});
      try {
        const store = await createRedisStore({ client, namespace });
        await fill(store);
        await store.close();
      } finally {
        await client.quit();
      }
    },
    dropped: () => /: \d+ keys$/m,
  },
  dynamodb: {
    get backend() {
      return ['--backend', 'dynamodb', '--url', dynamoEndpoint!];
    },
    async create(namespace) {
      const { createDynamoDbStore } = await import('@percolator/dynamodb');
      const { LOCAL_CREDENTIALS, LOCAL_REGION } = await import('@percolator/testkit/dynamodb');
      const store = await createDynamoDbStore({
        endpoint: dynamoEndpoint!,
        region: LOCAL_REGION,
        credentials: { ...LOCAL_CREDENTIALS },
        tableName: 'percolator_test',
        namespace,
        createTable: true,
      });
      await fill(store);
      await store.close();
    },
    dropped: () => /: \d+ items$/m,
  },
};

beforeAll(async () => {
  const { startDynamoDbLocal } = await import('@percolator/testkit/dynamodb');
  const local = await startDynamoDbLocal();
  dynamoEndpoint = local.endpoint;
  stopDynamo = () => local.stop();
});

afterAll(async () => {
  await stopDynamo?.();
});

describe('namespaces / drop-namespace on real servers', () => {
  for (const [name, c] of Object.entries(CASES)) {
    it(`${name}: lists a namespace, refuses without --yes, drops it, then it is gone`, async () => {
      const namespace = fresh();
      await c.create(namespace);
      try {
        expect(await listed(c.backend)).toContain(namespace);
        const table = await cli(['namespaces', ...c.backend]);
        expect(table.code).toBe(0);
        expect(table.out).toMatch(new RegExp(`^\\s+${namespace}\\s+\\S`, 'm'));

        const refused = await cli(['drop-namespace', namespace, ...c.backend]);
        expect(refused.code).toBe(1);
        expect(refused.err).toContain(`refusing to drop namespace ${namespace}`);
        expect(refused.err).toContain('--yes');
        expect(await listed(c.backend)).toContain(namespace);
        // --json says as much: why nothing was dropped, and what the namespace holds.
        const refusedJson = await cli(['drop-namespace', namespace, ...c.backend, '--json']);
        expect(refusedJson.code).toBe(1);
        const said = JSON.parse(refusedJson.out) as Record<string, unknown>;
        expect(said.namespace).toBe(namespace);
        expect(said.refused).toMatch(/without --yes: nothing dropped/);
        expect(typeof said.holds).toBe('string');
        expect(await listed(c.backend)).toContain(namespace);

        const dropped = await cli(['--', 'drop-namespace', namespace, ...c.backend, '--yes']);
        expect(dropped.err).toBe('');
        expect(dropped.code).toBe(0);
        expect(dropped.out).toContain(`dropped namespace ${namespace}`);
        expect(dropped.out).toMatch(c.dropped(namespace));
        expect(await listed(c.backend)).not.toContain(namespace);

        const again = await cli(['drop-namespace', namespace, ...c.backend, '--yes']);
        expect(again.code).toBe(4);
        expect(again.err).toContain(`namespace ${namespace} not found`);
      } finally {
        await cli(['drop-namespace', namespace, ...c.backend, '--yes']);
      }
    });
  }

  it('a namespace that does not exist: exit 4, nothing dropped', async () => {
    const before = await listed(CASES.postgres!.backend);
    const result = await cli(['drop-namespace', fresh(), '--backend', 'postgres', '--yes']);
    expect(result.code).toBe(4);
    expect(result.err).toMatch(/not found .*nothing dropped/);
    expect(await listed(CASES.postgres!.backend)).toEqual(before);
  });

  it('bad usage exits 2 before connecting: bad names, no name, no backend, memory, stray flags', async () => {
    for (const argv of [
      ['drop-namespace', 'x"; DROP TABLE y; --', '--backend', 'postgres', '--yes'],
      ['drop-namespace', "x') or 1=1 --", '--backend', 'mysql', '--yes'],
      ['drop-namespace', 'a*', '--backend', 'redis', '--yes'],
      ['drop-namespace', 'Upper', '--backend', 'redis', '--yes'],
      ['drop-namespace', `a${'b'.repeat(32)}`, '--backend', 'postgres', '--yes'],
      ['drop-namespace', '--backend', 'postgres', '--yes'],
      ['drop-namespace', 'a', 'b', '--backend', 'postgres', '--yes'],
      ['namespaces'],
      ['namespaces', '--backend', 'memory'],
      ['namespaces', '--backend', 'nope'],
      ['namespaces', 'extra', '--backend', 'postgres'],
      ['namespaces', '--backend', 'postgres', '--yes'],
      ['namespaces', '--backend', 'postgres', '--bogus'],
      ['namespaces', '--backend', 'postgres', '--namespace', 'x'],
    ]) {
      const result = await cli(argv);
      expect(result.code, argv.join(' ')).toBe(2);
      expect(result.err).toMatch(/usage: percolator (drop-)?namespace/);
    }
  });

  it('an unreachable store exits 3', async () => {
    for (const argv of [
      ['namespaces', '--backend', 'postgres', '--url', 'postgres://postgres@127.0.0.1:1/test'],
      ['drop-namespace', 'x', '--backend', 'mysql', '--url', 'mysql://root@127.0.0.1:1/test', '--yes'],
      ['namespaces', '--backend', 'redis', '--url', 'redis://127.0.0.1:1'],
      ['namespaces', '--backend', 'dynamodb', '--url', 'http://127.0.0.1:1'],
    ]) {
      const result = await cli(argv);
      expect(result.code, argv.join(' ')).toBe(3);
    }
  });

  it('a DynamoDB table that is not there: exit 4 for every command, named, and nothing is created', async () => {
    const table = `nosuch_${randomBytes(4).toString('hex')}`;
    const where = ['--backend', 'dynamodb', '--url', dynamoEndpoint!, '--dynamodb-table', table];
    const dir = mkdtempSync(join(tmpdir(), 'percolator-cli-'));
    const config = join(dir, 'composite.json');
    writeFileSync(
      config,
      JSON.stringify({
        stores: {
          cache: { backend: 'redis', url: 'redis://127.0.0.1:6379', namespace: 'app' },
          ddb: { backend: 'dynamodb', url: dynamoEndpoint!, dynamoTable: table },
        },
        routes: [{ table: 'accounts', store: 'ddb' }],
        default: 'cache',
        counterStore: 'cache',
      }),
    );
    try {
      for (const argv of [
        ['dump', 'accounts', ...where, '--namespace', 'app'],
        ['locks', 'accounts', ...where],
        ['namespaces', ...where],
        ['drop-namespace', 'app', ...where, '--yes'],
        ['inspect', 'accounts', 'a', '--config', config],
      ]) {
        const result = await cli(argv);
        expect(result.code, argv.join(' ')).toBe(4);
        expect(result.err, argv.join(' ')).toContain(`DynamoDB table ${table} not found`);
        expect(result.err).not.toContain('createTable');
        expect(result.err).not.toContain('usage:');
      }
      const composite = await cli(['inspect', 'accounts', 'a', '--config', config]);
      expect(composite.err).toContain('store ddb: DynamoDB table');
      expect(composite.err).toContain('its table in the config');
      // Nothing created: the table is still not there.
      expect((await cli(['namespaces', ...where])).code).toBe(4);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('--help prints the usage and exits 0', async () => {
    const result = await cli(['namespaces', '--help']);
    expect(result.code).toBe(0);
    expect(result.out).toContain('usage: percolator namespaces');
    const drop = await cli(['drop-namespace', '--help']);
    expect(drop.code).toBe(0);
    expect(drop.out).toContain('usage: percolator drop-namespace NAME');
  });
});
