/**
 * The set-up the PostgreSQL adapter's test files share: the server (started if it is
 * down), an admin pool, one store in a namespace of its own, and the stores a test opens,
 * each dropped and closed after the file. Vitest gives every test file its own copy of
 * this module, so these bindings are that file's.
 */
import { randomBytes } from 'node:crypto';
import { createPostgresStore, type PostgresStore } from '@percolator/postgres';
import { ensurePostgres, type TestServer } from '@percolator/testkit/postgres';
import pg from 'pg';
import { afterAll, beforeAll } from 'vitest';

let server: TestServer | undefined;
let prefix = 't';
const opened: PostgresStore[] = [];
export let url: string;
export let admin: pg.Pool;
/** The file's store, in a namespace of its own (set in beforeAll). */
export let store: PostgresStore;

/** A namespace no other test uses: the file's prefix and 12 random hex digits. */
export const uniqueNamespace = () => `${prefix}_${randomBytes(6).toString('hex')}`;

/** A store on the test server, dropped and closed after the file. */
export async function openStore(
  options: Parameters<typeof createPostgresStore>[0] = {},
): Promise<PostgresStore> {
  // A pool of the caller's brings its own connection settings: no URL beside it.
  const s = await createPostgresStore(options.pool ? options : { connectionString: url, ...options });
  opened.push(s);
  return s;
}

/** Registers the file's beforeAll / afterAll; namespaces start with `namespacePrefix`. */
export function usePostgresFixture(namespacePrefix: string): void {
  prefix = namespacePrefix;
  beforeAll(async () => {
    server = await ensurePostgres();
    url = server.url;
    admin = new pg.Pool({ connectionString: url, max: 4 });
    admin.on('error', () => {});
    store = await openStore({ namespace: uniqueNamespace() });
  });
  afterAll(async () => {
    for (const s of opened) {
      await s.dropNamespace().catch(() => {});
      await s.close();
    }
    await admin?.end();
    await server?.stop();
  });
}
