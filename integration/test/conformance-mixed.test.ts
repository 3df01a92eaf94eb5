import { conformanceSuite } from '@percolator/conformance';
import { CompositeStore } from '@percolator/core';
import { createDynamoDbStore } from '@percolator/dynamodb';
import { type DynamoDbTarget, dynamoDbTarget } from '@percolator/testkit/dynamodb';
import { afterAll, beforeAll } from 'vitest';
import { postgresPool, postgresStore, postgresUrl, redisStore, uniqueNamespace } from './support/backends.js';
import { destroyComposite } from './support/composite.js';

// (b) PostgreSQL, Redis and DynamoDB in one store: every table sharded by row key across
// the three (so every case's transactions span them), one table routed to DynamoDB alone
// and one to PostgreSQL alone; the oracle is PostgreSQL's counter. DynamoDB Local is
// started once for this file (or PERCOLATOR_DYNAMODB_ENDPOINT is used).
const pool = postgresPool(await postgresUrl());
let dynamo: DynamoDbTarget | undefined;
beforeAll(async () => {
  dynamo = await dynamoDbTarget();
});
afterAll(async () => {
  await pool.end();
  await dynamo?.stop();
});

conformanceSuite({
  name: 'composite(postgres + redis + dynamodb)',
  // DynamoDB Local round trips take milliseconds, like the DynamoDB adapter's own run.
  scale: Number(process.env.PERCOLATOR_CONFORMANCE_SCALE ?? 0.1),
  createStore: async () => {
    if (!dynamo) throw new Error('DynamoDB Local did not start (see beforeAll)');
    const [pg, redis, ddb] = await Promise.all([
      postgresStore(pool, 'mix'),
      redisStore('mix'),
      createDynamoDbStore(dynamo.storeOptions(uniqueNamespace('mix'))),
    ]);
    return new CompositeStore({
      routes: [
        { table: 'conf.other-table_2', store: ddb },
        { table: 'o_other', store: pg },
      ],
      default: { shards: [pg, redis, ddb] },
      counterStore: pg,
    });
  },
  destroyStore: destroyComposite,
});
