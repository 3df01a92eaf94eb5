// Option parsing needs no server: every case here fails before anything connects.
import { InvalidArgumentError } from '@percolator/core';
import { startDynamoDbLocal } from '@percolator/testkit/dynamodb';
import { describe, expect, it } from 'vitest';
import { createDynamoDbStore, type DynamoDbStoreOptions } from '../src/store.js';

const reject = (options: unknown) => createDynamoDbStore(options as DynamoDbStoreOptions).catch((e) => e);

describe('createDynamoDbStore options', () => {
  it('rejects a misspelt key, naming it, the likely one and every accepted key', async () => {
    const error = await reject({ tableName: 'percolator', endPoint: 'http://127.0.0.1:1' });
    expect(error).toBeInstanceOf(InvalidArgumentError);
    expect(error.message).toContain('unknown option "endPoint"');
    expect(error.message).toContain('did you mean "endpoint"?');
    for (const key of [
      'client',
      'endpoint',
      'region',
      'credentials',
      'requestTimeoutMs',
      'tableName',
      'namespace',
      'createTable',
      'tableWaitTimeoutMs',
      'retry',
    ])
      expect(error.message).toContain(key);
  });

  it('rejects unknown retry keys, missing and non-object options', async () => {
    const error = await reject({ tableName: 'percolator', retry: { attempts: 3 } });
    expect(error).toBeInstanceOf(InvalidArgumentError);
    expect(error.message).toContain('unknown option "attempts"');
    expect(error.message).toContain('maxAttempts');
    expect(await reject(undefined)).toBeInstanceOf(InvalidArgumentError);
    expect(await reject(null)).toBeInstanceOf(InvalidArgumentError);
  });

  it('rejects a client that is not a DynamoDBClient and a createTable that is not a boolean, before any call', async () => {
    for (const client of [null, {}, 'http://127.0.0.1:8000'])
      expect(await reject({ tableName: 'percolator', client }), String(client)).toMatchObject({
        name: 'InvalidArgumentError',
        message: expect.stringContaining('client must be a DynamoDBClient'),
      });
    expect(
      await reject({ tableName: 'percolator', endpoint: 'http://127.0.0.1:1', createTable: 'true' }),
    ).toMatchObject({
      name: 'InvalidArgumentError',
      message: expect.stringContaining('createTable must be a boolean'),
    });
  });

  it('startDynamoDbLocal rejects unknown options before starting anything', async () => {
    const error = await startDynamoDbLocal({ prot: 8000 } as never).catch((e) => e);
    expect(error).toBeInstanceOf(InvalidArgumentError);
    expect(error.message).toContain('unknown option "prot"');
  });
});
