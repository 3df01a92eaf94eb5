// Moving money from a PostgreSQL account to a DynamoDB wallet, atomically.
//
//   pnpm example:transfer                         (builds first)
//   node examples/transfer-across-stores.mjs      (after `pnpm build`)
//
// Needs PostgreSQL (PERCOLATOR_POSTGRES_URL, default postgres://postgres@127.0.0.1:5432/test)
// and Java 17+: it starts DynamoDB Local itself, in memory, and stops it at the end.
// The `accounts` table lives in PostgreSQL, `wallets` in DynamoDB; one CompositeStore routes
// each row to its store, and PostgreSQL's counter is the timestamp oracle of both. The
// deployment is written as @percolator/connect's composite config; DynamoDB Local comes
// from @percolator/testkit.
import { freshNamespace, openComposite } from '@percolator/connect';
import { Percolator } from '@percolator/core';
import { startDynamoDbLocal } from '@percolator/testkit/dynamodb';

const namespace = freshNamespace('example');

console.log('starting DynamoDB Local ...');
const dynamoLocal = await startDynamoDbLocal();
let deployment;
const clients = [];
let ok = false;
try {
  // The deployment as a config file would write it (@percolator/connect, "Composite deployments").
  deployment = await openComposite({
    stores: {
      postgres: { backend: 'postgres', namespace }, // PERCOLATOR_POSTGRES_URL or the local default
      dynamo: {
        backend: 'dynamodb',
        url: dynamoLocal.endpoint,
        dynamoTable: 'percolator_example',
        namespace,
      },
    },
    routes: [
      { table: 'accounts', store: 'postgres' },
      { table: 'wallets', store: 'dynamo' },
    ],
    counterStore: 'postgres',
  });
  const { store } = deployment;
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
  // Each step runs whatever the one before did: a failed close must not leave DynamoDB
  // Local (a Java process) running.
  try {
    await Promise.allSettled(clients.map((c) => c.close()));
    await deployment?.dropNamespace().catch(() => undefined);
    await deployment?.close();
  } finally {
    await dynamoLocal.stop();
  }
}
if (!ok) process.exit(1);
