// Option parsing needs no server: every case here fails before anything connects.
import { InvalidArgumentError } from '@percolator/core';
import { createMySqlStore, MYSQL_URL_ENV, type MySqlStoreOptions } from '@percolator/mysql';
import { afterEach, describe, expect, it, vi } from 'vitest';

const reject = (options: unknown) => createMySqlStore(options as MySqlStoreOptions).catch((e) => e);

describe('createMySqlStore options', () => {
  afterEach(() => {
    vi.unstubAllEnvs();
  });

  it('rejects a misspelt key, naming it, the likely one and every accepted key', async () => {
    const error = await reject({ URI: 'mysql://root@127.0.0.1:1/test' });
    expect(error).toBeInstanceOf(InvalidArgumentError);
    expect(error.message).toContain('unknown option "URI"');
    expect(error.message).toContain('did you mean "uri"?');
    for (const key of ['uri', 'pool', 'namespace', 'createSchema', 'maxConnections', 'queryTimeoutMs'])
      expect(error.message).toContain(key);
  });

  it('rejects keys of other adapters and non-object options', async () => {
    const error = await reject({ connectionString: 'mysql://root@127.0.0.1:1/test' });
    expect(error).toBeInstanceOf(InvalidArgumentError);
    expect(error.message).toContain('unknown option "connectionString"');
    expect(await reject(null)).toBeInstanceOf(InvalidArgumentError);
    expect(await reject([])).toBeInstanceOf(InvalidArgumentError);
  });

  it('names the uri option, not the environment variable, when that server is unreachable', async () => {
    vi.stubEnv(MYSQL_URL_ENV, 'mysql://root@127.0.0.1:2/elsewhere');
    const error = await reject({ uri: 'mysql://root:secret@127.0.0.1:1/test' });
    expect(error.message).toContain('127.0.0.1:1');
    expect(error.message).toContain('the uri option');
    expect(error.message).not.toContain(MYSQL_URL_ENV);
    expect(error.message).not.toContain('secret');
  });
  it('rejects a pool size, createSchema or pool of the wrong type before connecting (nothing to a driver)', async () => {
    for (const maxConnections of [-1, 0, 1.5, Number.NaN, '10'])
      expect(await reject({ uri: 'mysql://root@127.0.0.1:1/test', maxConnections })).toMatchObject({
        name: 'InvalidArgumentError',
        message: expect.stringContaining(
          'createMySqlStore: maxConnections must be an integer from 1 to 100000',
        ),
      });
    const schema = await reject({ uri: 'mysql://root@127.0.0.1:1/test', createSchema: 'false' });
    expect(schema).toBeInstanceOf(InvalidArgumentError);
    expect(schema.message).toContain('createSchema must be a boolean, got "false"');
    for (const pool of [null, 'pool', 3])
      expect(await reject({ pool })).toMatchObject({
        name: 'InvalidArgumentError',
        message: expect.stringContaining("pool must be the driver's pool object"),
      });
  });

  it('rejects a pool that is not a mysql2 Pool, a pool with a URL beside it, an empty URL, and a URL mysql2 cannot parse (without its password)', async () => {
    expect(await reject({ pool: {} })).toMatchObject({
      name: 'InvalidArgumentError',
      message: expect.stringContaining('pool must be a mysql2/promise Pool'),
    });
    const pool = { getConnection() {}, query() {}, end() {} };
    expect(await reject({ pool, uri: 'mysql://root@127.0.0.1:1/test' })).toMatchObject({
      name: 'InvalidArgumentError',
      message: expect.stringContaining('give either pool or uri'),
    });
    expect(await reject({ uri: '' })).toMatchObject({ name: 'InvalidArgumentError' });
    // A bare % in the password: mysql2's decodeURIComponent threw a raw URIError.
    const bad = await reject({ uri: 'mysql://root:50%off@127.0.0.1:1/test' });
    expect(bad).toBeInstanceOf(InvalidArgumentError);
    expect(bad.message).toContain('not a usable MySQL URL?');
    expect(bad.message).not.toContain('50%off');
  });
});
