// Moving money from a PostgreSQL account to a DynamoDB wallet, atomically.
//
//   pnpm example:transfer                         (builds first)
//   node examples/transfer-across-stores.mjs      (after `pnpm build`)
//
// Needs PostgreSQL (PERCOLATOR_POSTGRES_URL, default postgres://postgres@127.0.0.1:5432/test)
// and Java 17+: it starts DynamoDB Local itself, in memory, and stops it at the end.
// The `accounts` table lives in PostgreSQL, `wallets` in DynamoDB; one CompositeStore routes
// each row to its store, and PostgreSQL's counter is the timestamp oracle of both.
import { randomBytes } from 'node:crypto';
import { CompositeStore, Percolator } from '@percolator/core';
import { createDynamoDbStore } from '@percolator/dynamodb';
import { LOCAL_CREDENTIALS, LOCAL_REGION, startDynamoDbLocal } from '@percolator/dynamodb/local';
import { createPostgresStore } from '@percolator/postgres';

const namespace = `example_${randomBytes(4).toString('hex')}`;
const postgresUrl = process.env.PERCOLATOR_POSTGRES_URL || 'postgres://postgres@127.0.0.1:5432/test';

console.log('starting DynamoDB Local ...');
const dynamoLocal = await startDynamoDbLocal();
let postgres;
let dynamo;
let store;
const clients = [];
let ok = false;
try {
  postgres = await createPostgresStore({ connectionString: postgresUrl, namespace });
  dynamo = await createDynamoDbStore({
    endpoint: dynamoLocal.endpoint,
    region: LOCAL_REGION,
    credentials: { ...LOCAL_CREDENTIALS },
    tableName: 'percolator_example',
    namespace,
    createTable: true,
  });
  store = new CompositeStore({
    routes: [
      { table: 'accounts', store: postgres },
      { table: 'wallets', store: dynamo },
    ],
    counterStore: postgres,
  });
  // Three clients, as if three processes: they share the stores and so the oracle.
  for (let i = 0; i < 3; i++) clients.push(new Percolator({ store }));
  const db = clients[0];

  await db.transact(async (tx) => {
    tx.set('accounts', 'alice', 'balance', '100');
    tx.set('wallets', 'alice', 'balance', '0');
  });

  const balance = async (tx, table) => Number(await tx.getString(table, 'alice', 'balance'));

  /** One transaction: debit the PostgreSQL row, credit the DynamoDB item, or neither. */
  const transfer = (client, amount) =>
    client.transact(async (tx) => {
      const account = await balance(tx, 'accounts');
      if (account < amount) throw new Error(`insufficient funds: ${account} < ${amount}`);
      tx.set('accounts', 'alice', 'balance', String(account - amount));
      tx.set('wallets', 'alice', 'balance', String((await balance(tx, 'wallets')) + amount));
    });

  // An auditor reads both stores in one snapshot while transfers run: the sum never moves.
  let auditing = true;
  const audits = [];
  const auditor = (async () => {
    while (auditing) {
      audits.push(
        await db.transact(async (tx) => (await balance(tx, 'accounts')) + (await balance(tx, 'wallets'))),
      );
    }
  })();

  // 18 transfers of 5 from three clients at once; conflicts are retried automatically.
  await Promise.all(
    clients.map(async (client) => {
      for (let i = 0; i < 6; i++) await transfer(client, 5);
    }),
  );
  // A transfer the account cannot cover fails as a whole: nothing is debited.
  const refused = await transfer(db, 1000).then(
    () => 'accepted',
    (error) => error.message,
  );
  auditing = false;
  await auditor;

  const [account, wallet] = await db.transact(async (tx) => [
    await balance(tx, 'accounts'),
    await balance(tx, 'wallets'),
  ]);
  console.table({
    'accounts/alice (PostgreSQL)': { balance: account },
    'wallets/alice (DynamoDB)': { balance: wallet },
  });
  console.log(`transfer of 1000: ${refused}`);
  const badAudits = audits.filter((total) => total !== 100).length;
  console.log(`${audits.length} concurrent audits of both stores, ${badAudits} saw a total other than 100`);
  ok = account === 10 && wallet === 90 && badAudits === 0 && refused.startsWith('insufficient');
  console.log(ok ? 'OK: every transfer was atomic across PostgreSQL and DynamoDB' : 'BROKEN');
} finally {
  await Promise.all(clients.map((c) => c.close()));
  await postgres?.dropNamespace().catch(() => undefined);
  await dynamo?.dropNamespace().catch(() => undefined);
  if (store) await store.close();
  else await Promise.all([postgres?.close(), dynamo?.close()]);
  await dynamoLocal.stop();
}
if (!ok) process.exit(1);
