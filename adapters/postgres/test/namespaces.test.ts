import { randomBytes } from 'node:crypto';
import { InvalidArgumentError } from '@percolator/core';
import { createPostgresStore, dropPostgresNamespace, listPostgresNamespaces } from '@percolator/postgres';
import { ensurePostgres, type TestServer } from '@percolator/testkit/postgres';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const fresh = () => `t_ns_${randomBytes(5).toString('hex')}`;

let server: TestServer | undefined;
let url: string;
let admin: pg.Pool;
const appTables: string[] = [];

async function exists(relname: string): Promise<boolean> {
  const result = await admin.query('SELECT 1 FROM pg_class WHERE relname = $1', [relname]);
  return result.rows.length === 1;
}

async function functionExists(name: string): Promise<boolean> {
  const result = await admin.query('SELECT 1 FROM pg_proc WHERE proname = $1', [name]);
  return result.rows.length > 0;
}

/** Every object the schema creates for `ns`, as listed (sorted). */
const allObjects = (ns: string) => [
  `${ns}_cas_stamped_many`,
  `${ns}_counters`,
  `${ns}_read_stamped`,
  `${ns}_rows`,
  `${ns}_version_seq`,
];

async function appTable(name: string, columns: string): Promise<void> {
  appTables.push(name);
  await admin.query(`CREATE TABLE "${name}" (${columns})`);
}

beforeAll(async () => {
  server = await ensurePostgres();
  url = server.url;
  admin = new pg.Pool({ connectionString: url, max: 2 });
  admin.on('error', () => {});
});

afterAll(async () => {
  for (const name of appTables) await admin.query(`DROP TABLE IF EXISTS "${name}"`).catch(() => {});
  await admin?.end();
  await server?.stop();
});

describe('postgres namespaces: list and drop', () => {
  it('lists a namespace with its objects, drops exactly those, and then it is gone', async () => {
    const ns = fresh();
    const store = await createPostgresStore({ connectionString: url, namespace: ns });
    await store.close();
    const listed = (await listPostgresNamespaces({ connectionString: url })).find((n) => n.namespace === ns);
    // The functions too: the drop removes them, and it drops exactly what is listed (they
    // were dropped but not listed, found by a user).
    expect(listed).toEqual({ namespace: ns, objects: allObjects(ns), complete: true });
    // An application table that shares the prefix is no part of it.
    await appTable(`${ns}_audit`, 'id int');

    const dropped = await dropPostgresNamespace(ns, { connectionString: url });
    expect(dropped?.objects).toEqual(allObjects(ns));
    expect(await functionExists(`${ns}_read_stamped`)).toBe(false);
    expect(await functionExists(`${ns}_cas_stamped_many`)).toBe(false);
    expect((await listPostgresNamespaces({ connectionString: url })).map((n) => n.namespace)).not.toContain(
      ns,
    );
    for (const suffix of ['rows', 'counters', 'version_seq'])
      expect(await exists(`${ns}_${suffix}`)).toBe(false);
    expect(await exists(`${ns}_audit`)).toBe(true);
    expect(await dropPostgresNamespace(ns, { connectionString: url })).toBeUndefined();
  });

  it('ignores application tables that only end like ours: neither listed nor dropped', async () => {
    const ns = fresh();
    await appTable(`${ns}_rows`, 'id int, payload text');
    await appTable(`${ns}_counters`, 'counter text');
    expect((await listPostgresNamespaces({ connectionString: url })).map((n) => n.namespace)).not.toContain(
      ns,
    );
    expect(await dropPostgresNamespace(ns, { connectionString: url })).toBeUndefined();
    expect(await exists(`${ns}_rows`)).toBe(true);
    expect(await exists(`${ns}_counters`)).toBe(true);
  });

  it('lists a half-dropped namespace as incomplete and drops what is left', async () => {
    const ns = fresh();
    const store = await createPostgresStore({ connectionString: url, namespace: ns });
    await store.close();
    await admin.query(`DROP TABLE "${ns}_counters"`);
    await admin.query(`DROP SEQUENCE "${ns}_version_seq"`);
    await admin.query(`DROP FUNCTION "${ns}_read_stamped"(bytea, bytea[], bytea[])`);
    const left = [`${ns}_cas_stamped_many`, `${ns}_rows`];
    const listed = (await listPostgresNamespaces({ connectionString: url })).find((n) => n.namespace === ns);
    expect(listed).toEqual({ namespace: ns, objects: left, complete: false });
    expect((await dropPostgresNamespace(ns, { connectionString: url }))?.objects).toEqual(left);
    expect(await exists(`${ns}_rows`)).toBe(false);
    expect(await functionExists(`${ns}_cas_stamped_many`)).toBe(false);
  });

  it("lists and drops no application function that only shares a name with the schema's", async () => {
    const ns = fresh();
    const store = await createPostgresStore({ connectionString: url, namespace: ns });
    await store.close();
    // Same name as the schema's read function, other arguments: an application's.
    await admin.query(
      `CREATE FUNCTION "${ns}_read_stamped"(integer) RETURNS integer LANGUAGE sql AS 'SELECT 1'`,
    );
    try {
      const listed = (await listPostgresNamespaces({ connectionString: url })).find(
        (n) => n.namespace === ns,
      );
      expect(listed?.objects).toEqual(allObjects(ns));
      await dropPostgresNamespace(ns, { connectionString: url });
      const left = await admin.query(
        'SELECT oidvectortypes(proargtypes) AS args FROM pg_proc WHERE proname = $1',
        [`${ns}_read_stamped`],
      );
      expect(left.rows.map((r) => r.args)).toEqual(['integer']);
    } finally {
      await admin.query(`DROP FUNCTION IF EXISTS "${ns}_read_stamped"(integer)`);
    }
  });

  it('works on a pool you pass, and leaves it open', async () => {
    const ns = fresh();
    const pool = new pg.Pool({ connectionString: url, max: 1 });
    pool.on('error', () => {});
    try {
      const store = await createPostgresStore({ pool, namespace: ns });
      await store.close();
      expect((await listPostgresNamespaces({ pool })).map((n) => n.namespace)).toContain(ns);
      expect((await dropPostgresNamespace(ns, { pool }))?.namespace).toBe(ns);
      expect((await pool.query('SELECT 1 AS one')).rows[0].one).toBe(1);
    } finally {
      await pool.end();
    }
  });

  it('rejects names that break the namespace rule before connecting', async () => {
    for (const bad of ['x"; DROP TABLE y; --', 'Upper', '1abc', '', `a${'b'.repeat(32)}`, 'a-b']) {
      await expect(
        dropPostgresNamespace(bad, { connectionString: 'postgres://nobody@127.0.0.1:1/none' }),
      ).rejects.toBeInstanceOf(InvalidArgumentError);
    }
    await expect(
      listPostgresNamespaces({ connectionString: url, connectionstring: url } as never),
    ).rejects.toBeInstanceOf(InvalidArgumentError);
  });
});
