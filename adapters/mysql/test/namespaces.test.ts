import { randomBytes } from 'node:crypto';
import { InvalidArgumentError } from '@percolator/core';
import { createMySqlStore, dropMySqlNamespace, listMySqlNamespaces } from '@percolator/mysql';
import { ensureMySql, type TestServer } from '@percolator/testkit/mysql';
import { createPool, type Pool, type RowDataPacket } from 'mysql2/promise';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const fresh = () => `t_ns_${randomBytes(5).toString('hex')}`;

let server: TestServer | undefined;
let url: string;
let admin: Pool;
const appTables: string[] = [];

async function exists(name: string): Promise<boolean> {
  const [rows] = await admin.query<RowDataPacket[]>(
    `SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?
     UNION ALL SELECT 1 FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME = ?`,
    [name, name],
  );
  return rows.length > 0;
}

async function appTable(name: string, columns: string): Promise<void> {
  appTables.push(name);
  await admin.query(`CREATE TABLE \`${name}\` (${columns})`);
}

beforeAll(async () => {
  server = await ensureMySql();
  url = server.url;
  admin = createPool({ uri: url, connectionLimit: 2 });
});

afterAll(async () => {
  for (const name of appTables) await admin.query(`DROP TABLE IF EXISTS \`${name}\``).catch(() => {});
  await admin?.end();
  await server?.stop();
});

describe('mysql namespaces: list and drop', () => {
  it('lists a namespace with its objects, drops exactly those, and then it is gone', async () => {
    const ns = fresh();
    const store = await createMySqlStore({ uri: url, namespace: ns });
    await store.close();
    const listed = (await listMySqlNamespaces({ uri: url })).find((n) => n.namespace === ns);
    expect(listed?.complete).toBe(true);
    expect(listed?.objects).toEqual([
      ...[16, 2, 4, 8].map((slots) => expect.stringMatching(new RegExp(`^${ns}_cas_slots${slots}_v\\d+$`))),
      expect.stringMatching(new RegExp(`^${ns}_cas_stamped_many_v\\d+$`)),
      `${ns}_counters`,
      `${ns}_rows`,
      expect.stringMatching(new RegExp(`^${ns}_stamped_cas_v\\d+$`)),
      expect.stringMatching(new RegExp(`^${ns}_stamped_read_v\\d+$`)),
      `${ns}_version_blocks`,
    ]);
    // An application table that shares the prefix is no part of it.
    await appTable(`${ns}_audit`, 'id int');

    const dropped = await dropMySqlNamespace(ns, { uri: url });
    expect(dropped?.objects).toEqual(listed?.objects);
    expect((await listMySqlNamespaces({ uri: url })).map((n) => n.namespace)).not.toContain(ns);
    for (const name of listed!.objects) expect(await exists(name)).toBe(false);
    expect(await exists(`${ns}_audit`)).toBe(true);
    expect(await dropMySqlNamespace(ns, { uri: url })).toBeUndefined();
  });

  it('ignores application tables that only end like ours: neither listed nor dropped', async () => {
    const ns = fresh();
    await appTable(`${ns}_rows`, 'id int, payload text');
    await appTable(`${ns}_counters`, 'counter text');
    expect((await listMySqlNamespaces({ uri: url })).map((n) => n.namespace)).not.toContain(ns);
    expect(await dropMySqlNamespace(ns, { uri: url })).toBeUndefined();
    expect(await exists(`${ns}_rows`)).toBe(true);
    expect(await exists(`${ns}_counters`)).toBe(true);
  });

  it('lists a half-dropped namespace as incomplete and drops what is left', async () => {
    const ns = fresh();
    const store = await createMySqlStore({ uri: url, namespace: ns });
    await store.close();
    await admin.query(`DROP TABLE \`${ns}_counters\`, \`${ns}_version_blocks\``);
    const listed = (await listMySqlNamespaces({ uri: url })).find((n) => n.namespace === ns);
    expect(listed?.complete).toBe(false);
    expect(listed?.objects).toHaveLength(8); // rows and the seven procedures
    expect((await dropMySqlNamespace(ns, { uri: url }))?.objects).toEqual(listed?.objects);
    for (const name of listed!.objects) expect(await exists(name)).toBe(false);
  });

  it('works on a pool you pass, and leaves it open', async () => {
    const ns = fresh();
    const pool = createPool({ uri: url, connectionLimit: 1, multipleStatements: true });
    try {
      const store = await createMySqlStore({ pool, namespace: ns });
      await store.close();
      expect((await listMySqlNamespaces({ pool })).map((n) => n.namespace)).toContain(ns);
      expect((await dropMySqlNamespace(ns, { pool }))?.namespace).toBe(ns);
      const [rows] = await pool.query<RowDataPacket[]>('SELECT 1 AS one');
      expect(rows[0]!.one).toBe(1);
      // Many calls on the pool's one connection leave no listener behind.
      const errorListeners = async () => {
        const c = await pool.getConnection();
        const n = c.connection.listenerCount('error');
        c.release();
        return n;
      };
      const before = await errorListeners();
      for (let i = 0; i < 12; i++) await listMySqlNamespaces({ pool });
      expect(await errorListeners()).toBe(before);
    } finally {
      await pool.end();
    }
  });

  it('rejects names that break the namespace rule before connecting', async () => {
    for (const bad of ['x`; DROP TABLE y; --', 'Upper', '1abc', '', `a${'b'.repeat(32)}`, 'a-b']) {
      await expect(
        dropMySqlNamespace(bad, { uri: 'mysql://nobody@127.0.0.1:1/none' }),
      ).rejects.toBeInstanceOf(InvalidArgumentError);
    }
  });
});
