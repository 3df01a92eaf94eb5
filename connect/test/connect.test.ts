import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  BACKENDS,
  configuredUrl,
  describeTarget,
  openComposite,
  openNamespaceAdmin,
  openStore,
  parseCompositeConfig,
  readCompositeConfig,
  storeFactory,
} from '@percolator/connect';
import { CompositeStore, InvalidArgumentError, MemoryStore, Percolator, redactUrl } from '@percolator/core';
import { ensurePostgres } from '@percolator/testkit/postgres';
import { afterAll, describe, expect, it } from 'vitest';

const postgres = await ensurePostgres();
afterAll(() => postgres.stop());

describe('redactUrl (core): the one redaction', () => {
  it('hides the password and keeps the rest', () => {
    expect(redactUrl('postgres://app:s3cret@db:5432/x')).toBe('postgres://app:***@db:5432/x');
    expect(redactUrl('redis://:s3cret@127.0.0.1:6379')).toBe('redis://:***@127.0.0.1:6379');
    expect(redactUrl('postgres://app@db/x')).toBe('postgres://app@db/x');
  });

  it('hides passwords in text that is not one URL', () => {
    const text = redactUrl('redis://a:pw1@h1:1,redis://b:pw2@h2:2 [bad');
    expect(text).not.toMatch(/pw1|pw2/);
    expect(redactUrl('127.0.0.1:7001,127.0.0.1:7002')).toBe('127.0.0.1:7001,127.0.0.1:7002');
    // A node list with credentials and no scheme parses as a URL of scheme "u:" with no host.
    expect(redactUrl('u:s3cretPW@127.0.0.1:1')).toBe('u:***@127.0.0.1:1');
    expect(redactUrl('u:pw1@a:1,v:pw2@b:2')).toBe('u:***@a:1,v:***@b:2');
  });

  it('hides a password given as a query parameter (pg and ioredis both take ?password=)', () => {
    expect(redactUrl('postgres://postgres@127.0.0.1:5432/test?password=s3cretPW')).toBe(
      'postgres://postgres@127.0.0.1:5432/test?password=***',
    );
    expect(redactUrl('redis://127.0.0.1:6379/0?password=s3cretPW&db=1')).toBe(
      'redis://127.0.0.1:6379/0?password=***&db=1',
    );
    expect(redactUrl('postgres://db/x?sslmode=require')).toBe('postgres://db/x?sslmode=require');
    expect(redactUrl('bad url ?password=s3cretPW')).not.toContain('s3cretPW');
  });

  it("hides a password in PostgreSQL's keyword form (spaces between, values maybe quoted)", () => {
    expect(redactUrl('host=db user=ops password=s3cret dbname=app')).toBe(
      'host=db user=ops password=*** dbname=app',
    );
    expect(redactUrl('password=s3cret host=db')).toBe('password=*** host=db');
    expect(redactUrl("host=db password = 's3 cr\\'et' dbname=app")).toBe('host=db password = *** dbname=app');
    expect(redactUrl('host=db sslkey=/etc/k.pem user=ops')).toBe('host=db sslkey=*** user=ops');
    // Unquoted, a keyword-form value ends only at a space: ;, & and , are part of it.
    expect(redactUrl('host=db password=ab;cd&ef,gh dbname=app')).toBe('host=db password=*** dbname=app');
    expect(redactUrl('host=db user=ops dbname=app')).toBe('host=db user=ops dbname=app');
  });
});

describe('openStore', () => {
  it('opens the memory store with no adapter and no URL', async () => {
    const opened = await openStore('memory');
    expect(opened.store).toBeInstanceOf(MemoryStore);
    expect(opened.target).toBe('in-process');
    await opened.dropNamespace();
    await opened.close();
  });

  it('refuses an unknown backend or option, and an empty URL', async () => {
    await expect(openStore('oracle' as never)).rejects.toThrow(InvalidArgumentError);
    await expect(openStore('memory', { uri: 'x' } as never)).rejects.toThrow(
      /unknown openStore option "uri"/,
    );
    await expect(openStore('postgres', { url: ' ' })).rejects.toThrow(InvalidArgumentError);
    await expect(openStore('postgres', { create: 'false' as never })).rejects.toThrow(
      /create must be a boolean/,
    );
    expect(BACKENDS).toEqual(['memory', 'postgres', 'mysql', 'redis', 'redis-cluster', 'dynamodb']);
  });

  it('refuses a malformed URL, a wrong scheme, a redis path that is no database number, and rediss:// for a Cluster: typed, password hidden', async () => {
    const refused = async (
      backend: Parameters<typeof openStore>[0],
      options: Parameters<typeof openStore>[1],
    ) => {
      const error = await openStore(backend, options).then(
        () => undefined,
        (e: unknown) => e as Error,
      );
      expect(error).toBeInstanceOf(InvalidArgumentError);
      expect(error!.message).not.toContain('topsecret');
      expect(JSON.stringify(error)).not.toContain('topsecret');
      return error!.message;
    };
    // A port past 65535: the drivers threw a bare TypeError whose `input` held the password.
    expect(await refused('mysql', { url: 'mysql://root:topsecret@127.0.0.1:99999/test' })).toMatch(
      /url is not a valid mysql URL/,
    );
    expect(await refused('redis', { url: 'redis://:topsecret@127.0.0.1:99999' })).toMatch(
      /not a valid redis URL/,
    );
    // A Cluster node list given to redis.
    expect(await refused('redis', { url: '127.0.0.1:7000,127.0.0.1:7001' })).toMatch(
      /not a valid redis URL|must start/,
    );
    expect(await refused('postgres', { url: 'mysql://u:topsecret@h/d' })).toMatch(
      /must start with postgres:\/\//,
    );
    // Not a URL at all (a password typed where the URL goes): not echoed (found in review).
    for (const backend of ['postgres', 'mysql', 'redis'] as const) {
      expect(await refused(backend, { url: 'not a url topsecret' })).toMatch(/not a URL with a host/);
    }
    // ioredis took a name in the path as db 0, silently.
    expect(await refused('redis', { url: 'redis://:topsecret@127.0.0.1:6379/cache' })).toMatch(
      /database number/,
    );
    expect(await refused('redis-cluster', { url: 'rediss://127.0.0.1:7000' })).toMatch(/TLS/);
    // From the environment: the message names the variable.
    expect(
      await refused('mysql', { env: { PERCOLATOR_MYSQL_URL: 'mysql://u:topsecret@h:70000/d' } }),
    ).toMatch(/PERCOLATOR_MYSQL_URL/);
    expect(await refused('postgres', { env: { PERCOLATOR_POSTGRES_URL: 'redis://h' } })).toMatch(
      /PERCOLATOR_POSTGRES_URL must start with postgres/,
    );
    // What pg takes beyond a URL (a socket) still goes to pg: no InvalidArgumentError here.
    for (const url of [
      'postgres://postgres@/test?host=/var/run/postgresql',
      'socket:/var/run/postgresql?db=test',
    ]) {
      expect(await describeTarget('postgres', { url })).toContain('postgres');
    }
  });

  it("refuses settings of another backend, and a pool size that is no positive integer (they were ignored, or the driver's own default)", async () => {
    await expect(openStore('redis', { maxConnections: 4 })).rejects.toThrow(/maxConnections is for postgres/);
    await expect(openStore('postgres', { region: 'eu-west-1' })).rejects.toThrow(/region is for dynamodb/);
    await expect(openStore('mysql', { table: 't' })).rejects.toThrow(/table is for dynamodb/);
    for (const maxConnections of [0, -1, 1.5, Number.NaN]) {
      await expect(openStore('postgres', { maxConnections })).rejects.toThrow(InvalidArgumentError);
    }
  });

  it("leaves DynamoDB's region to the AWS SDK's lookup (the profile's) when none is set and no endpoint is given", async () => {
    expect(await describeTarget('dynamodb', { env: {} })).toBe(
      'AWS DynamoDB (the region of the AWS configuration) table percolator_test',
    );
    expect(await describeTarget('dynamodb', { env: { AWS_REGION: 'eu-west-1' } })).toBe(
      'AWS DynamoDB (eu-west-1) table percolator_test',
    );
  });

  it('takes the URL from the option, else the backend variable', () => {
    const env = { PERCOLATOR_REDIS_URL: ' redis://envhost:6379 ' };
    expect(configuredUrl('redis', { env })).toBe('redis://envhost:6379');
    expect(configuredUrl('redis', { env, url: 'redis://given:1' })).toBe('redis://given:1');
    expect(configuredUrl('redis', { env: {} })).toBeUndefined();
  });

  it('opens PostgreSQL from a URL; the target hides the password; the namespace is dropped', async () => {
    const withPassword = new URL(postgres.url);
    const opened = await openStore('postgres', {
      url: postgres.url,
      namespace: 'connect_pg_t',
      maxConnections: 2,
    });
    try {
      expect(opened.target).not.toContain(withPassword.password || '\u0000');
      const db = new Percolator({ store: opened.store });
      await db.transact(async (tx) => tx.set('t', 'r', 'c', 'v'));
      await db.close();
      const admin = await openNamespaceAdmin('postgres', { url: postgres.url });
      try {
        expect((await admin.list()).map((n) => n.namespace)).toContain('connect_pg_t');
      } finally {
        await admin.close();
      }
    } finally {
      await opened.dropNamespace();
      await opened.close();
    }
    expect(await describeTarget('postgres', { url: 'postgres://u:pw@h:5432/d' })).toBe(
      'postgres://u:***@h:5432/d',
    );
  });

  it('with create: false, a namespace that is not there is an error and nothing is created', async () => {
    await expect(
      openStore('postgres', { url: postgres.url, namespace: 'connect_none_t', create: false }),
    ).rejects.toThrow();
    const admin = await openNamespaceAdmin('postgres', { url: postgres.url });
    try {
      expect((await admin.list()).map((n) => n.namespace)).not.toContain('connect_none_t');
    } finally {
      await admin.close();
    }
  });

  it('an unreachable server fails with the URL, password hidden', async () => {
    const error = await openStore('redis', { url: 'redis://:topsecret@127.0.0.1:1' }).then(
      () => undefined,
      (e: unknown) => e as Error,
    );
    expect(error?.message).toContain('127.0.0.1:1');
    expect(error?.message).not.toContain('topsecret');
  });

  it("an unreachable server's error names connect's url option, the variable, or the default: never the driver's option", async () => {
    const failure = (backend: 'postgres' | 'mysql' | 'dynamodb', options: Parameters<typeof openStore>[1]) =>
      openStore(backend, { create: false, ...options }).then(
        () => undefined,
        (e: unknown) => (e as Error).message,
      );
    for (const backend of ['postgres', 'mysql'] as const) {
      const url = `${backend}://root:s3cret@127.0.0.1:5999/test`;
      const given = await failure(backend, { url });
      expect(given).toContain('from the url option)');
      expect(given).not.toMatch(/connectionString|uri option|s3cret/);
      const variable = backend === 'postgres' ? 'PERCOLATOR_POSTGRES_URL' : 'PERCOLATOR_MYSQL_URL';
      expect(await failure(backend, { env: { [variable]: url } })).toContain(`from ${variable})`);
    }
    // DynamoDB said neither where it connected nor where that came from.
    const dynamo = await failure('dynamodb', { url: 'http://127.0.0.1:8999' });
    expect(dynamo).toContain(
      '(connecting to http://127.0.0.1:8999 table percolator_test, from the url option)',
    );
    // A Redis Cluster said "the redis client passed in" (connect made it) and no origin, and
    // told a user who had passed a URL to set the variable (found by a new user).
    const nodes = '127.0.0.1:7199';
    const cluster = (options: Parameters<typeof openStore>[1]) =>
      openStore('redis-cluster', options).then(
        () => undefined,
        (e: unknown) => (e as Error).message,
      );
    const fromUrl = await cluster({ url: nodes });
    expect(fromUrl).toMatch(
      /^cannot connect to the Redis Cluster at 127\.0\.0\.1:7199, from the url option: /,
    );
    expect(fromUrl).not.toMatch(/passed in|set PERCOLATOR_REDIS_CLUSTER_NODES/);
    expect(await cluster({ env: { PERCOLATOR_REDIS_CLUSTER_NODES: nodes } })).toContain(
      'from PERCOLATOR_REDIS_CLUSTER_NODES: ',
    );
  }, 30_000);
});

describe('storeFactory', () => {
  it('gives each store a fresh namespace and drops it', async () => {
    const factory = await storeFactory('redis', { prefix: 'cf' });
    const [a, b] = await Promise.all([factory.createStore(), factory.createStore()]);
    expect((a as unknown as { namespace: string }).namespace).not.toBe(
      (b as unknown as { namespace: string }).namespace,
    );
    await factory.destroyStore(a);
    await factory.destroyStore(b);
    await expect(factory.destroyStore(new MemoryStore())).rejects.toThrow(/not a store this factory created/);
  });
});

describe('composite config', () => {
  const good = {
    name: 'shop',
    stores: { a: { backend: 'memory' }, b: { backend: 'memory' } },
    routes: [{ table: 'sessions', store: 'b' }],
    default: { shards: ['a', 'b'] },
    counterStore: 'a',
  };

  it('names the mistake', () => {
    const bad = (value: unknown, message: RegExp) =>
      expect(() => parseCompositeConfig(value)).toThrow(message);
    bad([], /must hold a JSON object/);
    bad({ ...good, extra: 1 }, /extra: unknown field/);
    bad({ ...good, stores: {} }, /at least one named store/);
    bad({ ...good, stores: { a: { backend: 'oracle' } } }, /stores\.a\.backend: must be one of/);
    bad(
      { ...good, stores: { a: { backend: 'memory', url: 'x', urlEnv: 'Y' } } },
      /at most one of url and urlEnv/,
    );
    bad({ ...good, routes: [{ table: 't', store: 'zz' }] }, /routes\[0\]\.store: must name a store/);
    bad({ ...good, routes: [{ table: 't', store: 'a', shards: ['a'] }] }, /exactly one of store and shards/);
    bad({ ...good, default: { shards: [] } }, /default\.shards: must be a non-empty array/);
    bad({ ...good, counterStore: undefined }, /counterStore: is required/);
    // Refused before any store is opened (the CompositeStore refused them after every store
    // was opened, and created).
    bad(
      {
        ...good,
        routes: [
          { table: 't', store: 'a' },
          { table: 't', store: 'b' },
        ],
      },
      /routes\[1\]\.table: table t is routed twice/,
    );
    bad({ ...good, default: { shards: ['a', 'a'] } }, /default\.shards: names store a twice/);
    bad({ ...good, routes: [{ table: '', store: 'a' }] }, /routes\[0\]\.table:/);
    bad({ ...good, routes: [], default: undefined }, /needs routes, a default, or both/);
    // A URL where a store name belongs: its text (and password) is not in the message.
    const leak = () => parseCompositeConfig({ ...good, counterStore: 'postgres://app:hunter2@db/shop' });
    expect(leak).toThrow(
      /counterStore: must name a store .*a string that names no store \(\d+ characters, a URL\)/,
    );
    expect(() => leak()).not.toThrow(/hunter2/);
    expect(parseCompositeConfig(good)).toEqual(good);
  });

  it('drops the counter store last, and only once every other store is empty', async () => {
    const config = {
      stores: { c: { backend: 'memory' }, a: { backend: 'memory' }, b: { backend: 'memory' } },
      default: { shards: ['a', 'b'] },
      counterStore: 'c',
    } as const;
    const deployment = await openComposite(parseCompositeConfig(config));
    try {
      const dropped: string[] = [];
      for (const [name, c] of deployment.stores) {
        const original = c.dropNamespace.bind(c);
        (c as { dropNamespace: () => Promise<void> }).dropNamespace = async () => {
          if (name === 'a') throw new Error('store a is unreachable');
          dropped.push(name);
          await original();
        };
      }
      const error = await deployment.dropNamespace().catch((e: unknown) => e);
      expect(String(error)).toMatch(/store a is unreachable; the counter store c was left as it was/);
      // b was tried although a failed first; the counter's store was not touched.
      expect(dropped).toEqual(['b']);
    } finally {
      await deployment.close();
    }
  });

  it('opens a deployment from a file, with urlEnv, and routes rows by it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'connect-'));
    try {
      const file = join(dir, 'deployment.json');
      writeFileSync(
        file,
        JSON.stringify({
          stores: {
            pg: { backend: 'postgres', urlEnv: 'CONNECT_TEST_PG', namespace: 'connect_comp_t' },
            mem: { backend: 'memory' },
          },
          routes: [{ table: 'cache', store: 'mem' }],
          default: 'pg',
          counterStore: 'pg',
        }),
      );
      const config = await readCompositeConfig(file);
      await expect(openComposite(config, { env: {} })).rejects.toThrow(/CONNECT_TEST_PG is not set/);
      const deployment = await openComposite(config, { env: { CONNECT_TEST_PG: postgres.url } });
      try {
        expect(deployment.store).toBeInstanceOf(CompositeStore);
        expect([...deployment.stores.keys()]).toEqual(['pg', 'mem']);
        const db = new Percolator({ store: deployment.store });
        await db.transact(async (tx) => {
          tx.set('accounts', 'alice', 'balance', '10');
          tx.set('cache', 'alice', 'seen', '1');
        });
        await db.close();
        // The routed table lives in the memory store only.
        const mem = deployment.stores.get('mem')!.store;
        expect(await mem.read('cache', 'alice')).not.toBeNull();
        expect(await mem.read('accounts', 'alice')).toBeNull();
      } finally {
        await deployment.dropNamespace();
        await deployment.close();
      }
      await expect(readCompositeConfig(join(dir, 'missing.json'))).rejects.toThrow(InvalidArgumentError);
      writeFileSync(file, '{ not json');
      await expect(readCompositeConfig(file)).rejects.toThrow(/is not JSON/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
