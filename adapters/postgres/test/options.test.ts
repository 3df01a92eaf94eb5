// Option parsing needs no server: every case here fails before anything connects.
import { InvalidArgumentError } from '@percolator/core';
import { createPostgresStore, POSTGRES_URL_ENV, type PostgresStoreOptions } from '@percolator/postgres';
import { afterEach, describe, expect, it, vi } from 'vitest';

const reject = (options: unknown) => createPostgresStore(options as PostgresStoreOptions).catch((e) => e);

describe('createPostgresStore options', () => {
  afterEach(() => {
    vi.unstubAllEnvs();
  });

  it('rejects a misspelt key, naming it, the likely one and every accepted key', async () => {
    const error = await reject({ connectionstring: 'postgres://postgres@127.0.0.1:1/test' });
    expect(error).toBeInstanceOf(InvalidArgumentError);
    expect(error.message).toContain('unknown option "connectionstring"');
    expect(error.message).toContain('did you mean "connectionString"?');
    for (const key of [
      'connectionString',
      'pool',
      'namespace',
      'createSchema',
      'maxConnections',
      'queryTimeoutMs',
    ])
      expect(error.message).toContain(key);
  });

  it('rejects unknown keys even when their value is undefined, and non-object options', async () => {
    expect(await reject({ namespace: 'x', url: undefined })).toBeInstanceOf(InvalidArgumentError);
    expect((await reject({ namespace: 'x', url: undefined })).message).toContain('"url"');
    expect(await reject(null)).toBeInstanceOf(InvalidArgumentError);
    expect(await reject('postgres://x')).toBeInstanceOf(InvalidArgumentError);
  });

  it('names the connectionString option, not the environment variable, when that server is unreachable', async () => {
    vi.stubEnv(POSTGRES_URL_ENV, 'postgres://postgres@127.0.0.1:2/elsewhere');
    const error = await reject({ connectionString: 'postgres://postgres:secret@127.0.0.1:1/test' });
    expect(error.message).toContain('127.0.0.1:1');
    expect(error.message).toContain('the connectionString option');
    expect(error.message).not.toContain(POSTGRES_URL_ENV);
    expect(error.message).not.toContain('secret');
  });

  it('names the environment variable when the URL came from it', async () => {
    vi.stubEnv(POSTGRES_URL_ENV, 'postgres://postgres@127.0.0.1:1/test');
    const error = await reject({});
    expect(error.message).toContain(`$${POSTGRES_URL_ENV}`);
  });
  it('rejects a pool size, createSchema or pool of the wrong type before connecting (nothing to a driver)', async () => {
    for (const maxConnections of [-1, 0, 1.5, Number.NaN, '10'])
      expect(
        await reject({ connectionString: 'postgres://postgres@127.0.0.1:1/test', maxConnections }),
      ).toMatchObject({
        name: 'InvalidArgumentError',
        message: expect.stringContaining(
          'createPostgresStore: maxConnections must be an integer from 1 to 100000',
        ),
      });
    const schema = await reject({
      connectionString: 'postgres://postgres@127.0.0.1:1/test',
      createSchema: 'false',
    });
    expect(schema).toBeInstanceOf(InvalidArgumentError);
    expect(schema.message).toContain('createSchema must be a boolean, got "false"');
    for (const pool of [null, 'pool', 3])
      expect(await reject({ pool })).toMatchObject({
        name: 'InvalidArgumentError',
        message: expect.stringContaining("pool must be the driver's pool object"),
      });
  });

  it('rejects a pool that is not a pg Pool, a pool with a URL or size beside it, and an empty URL (typed, before any connection)', async () => {
    expect(await reject({ pool: {} })).toMatchObject({
      name: 'InvalidArgumentError',
      message: expect.stringContaining('pool must be a pg Pool'),
    });
    const pool = { connect() {}, query() {}, on() {}, end() {} };
    for (const extra of [{ connectionString: 'postgres://postgres@127.0.0.1:1/test' }, { maxConnections: 5 }])
      expect(await reject({ pool, ...extra })).toMatchObject({
        name: 'InvalidArgumentError',
        message: expect.stringContaining('give either pool or'),
      });
    for (const connectionString of ['', '  ', 42])
      expect(await reject({ connectionString })).toMatchObject({
        name: 'InvalidArgumentError',
        message: expect.stringContaining('connectionString must be a non-empty connection URL string'),
      });
  });
});
