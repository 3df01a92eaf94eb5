import { createRedisClient } from '@percolator/redis';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { runBench } from '../src/bench.js';
import { loadDriver } from '../src/drivers.js';
import { parseOptions } from '../src/options.js';
import type { BenchReport } from '../src/types.js';

/**
 * Every real backend, named explicitly: an unreachable one is a failure (its message names
 * the variable to set: PERCOLATOR_POSTGRES_URL, PERCOLATOR_MYSQL_URL, PERCOLATOR_REDIS_URL,
 * PERCOLATOR_REDIS_CLUSTER_NODES, PERCOLATOR_DYNAMODB_ENDPOINT), never a skip.
 */
const BACKENDS = 'postgres,mysql,redis,redis-cluster,dynamodb';

describe('native baselines and cleanup on the real stores', () => {
  let report: BenchReport;

  beforeAll(async () => {
    const options = parseOptions(
      ['--backends', BACKENDS, '--workloads', 'read,write,transfer,ycsb-a-zipf', '--duration', '40ms'].concat(
        ['--warmup', '0', '--concurrency', '3', '--records', '24', '--accounts', '6', '--ops', '3'],
      ),
    );
    report = await runBench(options);
  }, 120_000);

  test('every backend ran and every check passed', () => {
    expect(report.failures, report.failures.join('\n')).toEqual([]);
    expect(new Set(report.results.map((r) => r.backend))).toEqual(new Set(BACKENDS.split(',')));
    for (const r of report.results) {
      expect(r.check.ok, `${r.backend} ${r.workload} ${r.mode}:${r.variant}: ${r.check.detail}`).toBe(true);
      expect(r.transactions).toBeGreaterThan(0);
    }
  });

  test('each backend has its native baselines, with counted statements/commands', () => {
    const natives = (backend: string) =>
      [
        ...new Set(
          report.results.filter((r) => r.backend === backend && r.mode === 'native').map((r) => r.variant),
        ),
      ].sort();
    expect(natives('postgres')).toEqual(['repeatable-read', 'serializable']);
    expect(natives('mysql')).toEqual(['repeatable-read', 'serializable']);
    expect(natives('redis')).toEqual(['watch-multi-exec']);
    expect(natives('redis-cluster')).toEqual([]);
    expect(natives('dynamodb')).toEqual(['transact-items']);
    const rt = (backend: string, workload: string, variant: string) =>
      report.results.find((r) => r.backend === backend && r.workload === workload && r.variant === variant)!;
    // SQL transfer: BEGIN, SELECT, UPDATE, COMMIT (more only when a retry happened).
    expect(rt('postgres', 'transfer', 'serializable').roundTrips).toBeGreaterThanOrEqual(4);
    expect(rt('mysql', 'read', 'repeatable-read').roundTrips).toBe(3);
    // Redis: WATCH, MGET, then MULTI/MSET/EXEC in one round trip of three commands.
    const redisTransfer = rt('redis', 'transfer', 'watch-multi-exec');
    expect(redisTransfer.roundTrips).toBeGreaterThanOrEqual(3);
    expect(redisTransfer.commands - redisTransfer.roundTrips).toBeGreaterThanOrEqual(2);
    // DynamoDB: TransactGetItems + TransactWriteItems.
    expect(rt('dynamodb', 'read', 'transact-items').roundTrips).toBe(1);
    expect(rt('dynamodb', 'transfer', 'transact-items').roundTrips).toBeGreaterThanOrEqual(2);
  });

  describe('nothing the run created is left behind', () => {
    let pg: {
      query(text: string, values?: unknown[]): Promise<{ rows: Record<string, unknown>[] }>;
      end(): Promise<void>;
    };
    beforeAll(() => {
      const { Client } = loadDriver<{
        Client: new (o: { connectionString: string }) => typeof pg & { connect(): Promise<void> };
      }>('postgres', 'pg');
      const client = new Client({
        connectionString: process.env.PERCOLATOR_POSTGRES_URL || 'postgres://postgres@127.0.0.1:5432/test',
      });
      pg = client;
      return client.connect();
    });
    afterAll(() => pg.end());

    test('postgres', async () => {
      const like = `bench\\_${report.runId}%`;
      const schemas = await pg.query('SELECT nspname FROM pg_namespace WHERE nspname LIKE $1', [like]);
      const tables = await pg.query('SELECT relname FROM pg_class WHERE relname LIKE $1', [like]);
      expect([...schemas.rows, ...tables.rows]).toEqual([]);
    });

    test('mysql', async () => {
      const mysql = loadDriver<{
        createConnection(o: {
          uri: string;
        }): Promise<{ query(s: string, v: unknown[]): Promise<[unknown[]]>; end(): Promise<void> }>;
      }>('mysql', 'mysql2/promise');
      const conn = await mysql.createConnection({
        uri: process.env.PERCOLATOR_MYSQL_URL || 'mysql://root@127.0.0.1:3306/test',
      });
      try {
        const [rows] = await conn.query(
          'SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE ?',
          [`bench\\_${report.runId}%`],
        );
        expect(rows).toEqual([]);
      } finally {
        await conn.end();
      }
    });

    test('redis', async () => {
      const client = createRedisClient();
      await client.connect();
      try {
        expect(await client.keys(`bench_${report.runId}*`)).toEqual([]);
      } finally {
        client.disconnect();
      }
    });
  });
});
