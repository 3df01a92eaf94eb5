import { randomBytes } from 'node:crypto';
import { createRedisClient } from '@percolator/redis';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { BackendUnavailable, loadData, openBackend } from '../src/backends.js';
import { interleavedGroups, runBench } from '../src/bench.js';
import type { CompositeCountingStore } from '../src/counting-store.js';
import { loadDriver } from '../src/drivers.js';
import type { PercolatorEngine } from '../src/engines/percolator.js';
import { parseOptions } from '../src/options.js';
import { SharedServices } from '../src/services.js';
import type { BenchReport } from '../src/types.js';
import { workloadByName } from '../src/workloads.js';

/**
 * Every real backend, named explicitly: an unreachable one is a failure (its message names
 * the variable to set: PERCOLATOR_POSTGRES_URL, PERCOLATOR_MYSQL_URL, PERCOLATOR_REDIS_URL,
 * PERCOLATOR_REDIS_CLUSTER_NODES, PERCOLATOR_DYNAMODB_ENDPOINT), never a skip. `mixed` is
 * PostgreSQL + Redis + DynamoDB behind one CompositeStore.
 */
const BACKENDS = 'postgres,mysql,redis,redis-cluster,dynamodb,mixed';

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
    expect(natives('postgres')).toEqual(['read-committed', 'repeatable-read', 'serializable']);
    expect(natives('mysql')).toEqual(['read-committed', 'repeatable-read', 'serializable']);
    expect(natives('redis')).toEqual(['watch-multi-exec']);
    expect(natives('redis-cluster')).toEqual([]);
    expect(natives('dynamodb')).toEqual(['transact-items']);
    expect(natives('mixed')).toEqual([]);
    expect(report.skipped).toContainEqual({
      backend: 'mixed',
      mode: 'native',
      reason: 'no native transaction spans PostgreSQL, Redis and DynamoDB',
    });
    const rt = (backend: string, workload: string, variant: string) =>
      report.results.find((r) => r.backend === backend && r.workload === workload && r.variant === variant)!;
    // SQL transfer: BEGIN, SELECT, UPDATE, COMMIT (more only when a retry happened).
    expect(rt('postgres', 'transfer', 'serializable').roundTrips).toBeGreaterThanOrEqual(4);
    expect(rt('mysql', 'read', 'repeatable-read').roundTrips).toBe(3);
    // Redis: WATCH and MGET sent together (one round trip, two commands), then
    // MULTI/MSET/EXEC in one round trip of three commands.
    const redisTransfer = rt('redis', 'transfer', 'watch-multi-exec');
    expect(redisTransfer.roundTrips).toBeGreaterThanOrEqual(2);
    expect(redisTransfer.commands - redisTransfer.roundTrips).toBeGreaterThanOrEqual(3);
    expect(redisTransfer.criticalPath?.roundTrips).toBe(2);
    // DynamoDB: TransactGetItems + TransactWriteItems.
    expect(rt('dynamodb', 'read', 'transact-items').roundTrips).toBe(1);
    expect(rt('dynamodb', 'transfer', 'transact-items').roundTrips).toBeGreaterThanOrEqual(2);
  });

  test('mixed runs the transfer across stores in percolator and raw modes, totals checked', () => {
    const transfer = (mode: string) =>
      report.results.find((r) => r.backend === 'mixed' && r.workload === 'transfer' && r.mode === mode)!;
    for (const mode of ['percolator', 'raw']) {
      expect(transfer(mode).check.detail).toMatch(/^total \d+ unchanged/);
      expect(transfer(mode).transactions).toBeGreaterThan(0);
    }
    // Raw: two legs of read + CAS, each counted at the store it went to.
    expect(transfer('raw').roundTrips).toBeGreaterThanOrEqual(4);
    // A start timestamp, reads, prewrites, the primary's and the secondary's commits at least.
    expect(transfer('percolator').roundTrips).toBeGreaterThanOrEqual(5);
    expect(transfer('percolator').ratios.map((r) => r.baseline)).toEqual(['raw']);
  });

  test('skipped cells use the results vocabulary for modes', () => {
    for (const s of report.skipped) {
      if (s.mode !== undefined) expect(['percolator', 'raw', 'native']).toContain(s.mode);
    }
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

/** A backend's settings for a test that opens it alone (a fresh run id). */
function settingsFor(services: SharedServices) {
  return {
    runId: randomBytes(4).toString('hex'),
    maxConcurrency: 2,
    maxAttempts: 10,
    startServices: true,
    services,
  };
}

test.each(['postgres', 'mysql'] as const)(
  '%s: every isolation level has data of its own, so all its cells take turns with Percolator',
  async (name) => {
    const services = new SharedServices();
    const settings = settingsFor(services);
    try {
      const backend = await openBackend(name, settings);
      try {
        const keys = backend.engines.map((e) => e.dataKey);
        expect(new Set(keys).size).toBe(keys.length);
        const transfer = workloadByName('transfer')!;
        const cells = backend.engines.map((e) => [transfer, 8, e] as const);
        // One group: Percolator, raw and the three levels, measured in interleaved slices.
        expect(interleavedGroups(cells, 4)).toHaveLength(1);
      } finally {
        await backend.close();
      }
    } finally {
      await services.stop();
    }
  },
);

test('mixed spreads rows over PostgreSQL, Redis and DynamoDB; the oracle is the PostgreSQL counter', async () => {
  const services = new SharedServices();
  const settings = settingsFor(services);
  try {
    const backend = await openBackend('mixed', settings);
    try {
      await loadData(backend, { records: 4, accounts: 30, valueBytes: 16 }, ['acct']);
      const percolator = backend.engines.find((e) => e.mode === 'percolator') as PercolatorEngine;
      const store = percolator.store as CompositeCountingStore;
      expect(store.parts.map((p) => p.inner.name)).toEqual([
        expect.stringMatching(/postgres/i),
        expect.stringMatching(/redis/i),
        expect.stringMatching(/dynamo/i),
      ]);
      for (const part of store.parts) {
        const rows = await part.inner.scan!('acct', { limit: 100 });
        expect(rows.length, part.inner.name).toBeGreaterThan(0);
      }
      expect(store.parts.map((p) => p.calls.incrementCounter > 0)).toEqual([true, false, false]);
    } finally {
      await backend.close();
    }
  } finally {
    await services.stop();
  }
}, 120_000);

test('an unreachable DynamoDB endpoint is skipped with that reason, not a credentials error', async () => {
  const saved = process.env.PERCOLATOR_DYNAMODB_ENDPOINT;
  // Port 9 (discard) on loopback: nothing listens there.
  process.env.PERCOLATOR_DYNAMODB_ENDPOINT = 'http://127.0.0.1:9';
  const services = new SharedServices();
  const settings = { runId: 'x', maxConcurrency: 1, maxAttempts: 1, startServices: true, services };
  try {
    for (const name of ['dynamodb', 'mixed'] as const) {
      const error = await openBackend(name, settings).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(BackendUnavailable);
      expect((error as BackendUnavailable).reason).toMatch(
        /nothing answers at PERCOLATOR_DYNAMODB_ENDPOINT=http:\/\/127\.0\.0\.1:9/,
      );
    }
  } finally {
    if (saved === undefined) delete process.env.PERCOLATOR_DYNAMODB_ENDPOINT;
    else process.env.PERCOLATOR_DYNAMODB_ENDPOINT = saved;
    await services.stop();
  }
});
