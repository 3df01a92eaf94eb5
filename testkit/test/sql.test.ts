import { StoreError } from '@percolator/core';
import { MYSQL_URL_ENV, resolveMySqlUrl } from '@percolator/mysql';
import { POSTGRES_URL_ENV, resolvePostgresUrl } from '@percolator/postgres';
import type { EnsureOptions, TestServer } from '@percolator/testkit';
import { ensureMySql } from '@percolator/testkit/mysql';
import { ensurePostgres } from '@percolator/testkit/postgres';
import { describe, expect, it } from 'vitest';

/**
 * The choice itself (variable, local default, Docker, message) is tested once, in
 * testkit/test/test-server.test.ts. Here: that each SQL server plugs in its own variable
 * and a probe that really talks to the server.
 */
const SERVERS: {
  readonly product: string;
  readonly ensure: (options: EnsureOptions) => Promise<TestServer>;
  readonly variable: string;
  readonly local: string;
  readonly nothingListens: string;
}[] = [
  {
    product: 'PostgreSQL',
    ensure: ensurePostgres,
    variable: POSTGRES_URL_ENV,
    local: resolvePostgresUrl(),
    nothingListens: 'postgres://postgres:secret@127.0.0.1:1/test',
  },
  {
    product: 'MySQL/MariaDB',
    ensure: ensureMySql,
    variable: MYSQL_URL_ENV,
    local: resolveMySqlUrl(),
    nothingListens: 'mysql://root:secret@127.0.0.1:1/test',
  },
];

describe.each(SERVERS)('ensure $product', ({ product, ensure, variable, local, nothingListens }) => {
  it(`uses $${variable} when it is set and answers`, async () => {
    const server = await ensure({ env: { [variable]: local }, localUrl: nothingListens });
    expect(server.url).toBe(local);
  });

  it(`with nothing to use, fails with a message naming $${variable} and hiding the password`, async () => {
    const error = await ensure({
      env: {},
      localUrl: nothingListens,
      dockerAvailable: async () => false,
    }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).message).toContain(variable);
    expect((error as StoreError).message).toContain(product);
    expect((error as StoreError).message).not.toContain('secret');
  });
});
