import { StoreError } from '@percolator/core';
import { POSTGRES_URL_ENV, resolvePostgresUrl } from '@percolator/postgres';
import { ensurePostgres } from '@percolator/testkit/postgres';
import { describe, expect, it } from 'vitest';

/**
 * The choice itself (variable, local default, Docker, message) is tested once, in
 * testkit/test/test-server.test.ts. Here: that this adapter plugs in its own variable and a
 * probe that really talks to the server.
 */
const NOTHING_LISTENS = 'postgres://postgres:secret@127.0.0.1:1/test';
const local = resolvePostgresUrl();

describe('ensurePostgres', () => {
  it('uses $POSTGRES_URL_ENV when it is set and answers', async () => {
    const server = await ensurePostgres({ env: { [POSTGRES_URL_ENV]: local }, localUrl: NOTHING_LISTENS });
    expect(server.url).toBe(local);
  });

  it('with nothing to use, fails with a message naming $POSTGRES_URL_ENV and hiding the password', async () => {
    const error = await ensurePostgres({
      env: {},
      localUrl: NOTHING_LISTENS,
      dockerAvailable: async () => false,
    }).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(StoreError);
    expect((error as StoreError).message).toContain(POSTGRES_URL_ENV);
    expect((error as StoreError).message).toContain('PostgreSQL');
    expect((error as StoreError).message).not.toContain('secret');
  });
});
