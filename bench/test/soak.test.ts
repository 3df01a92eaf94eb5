import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import {
  type DynamoDbLocal,
  LOCAL_CREDENTIALS,
  LOCAL_REGION,
  startDynamoDbLocal,
} from '@percolator/testkit/dynamodb';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { SoakReport } from '../src/soak/soak.js';

/**
 * The soak command, as a process, for 70 s against every store at once (they run
 * concurrently, so this file costs about 80 s of wall time, not 7 × 70 s; it ran 2
 * minutes until CI's total neared its 20-minute budget): each must
 * exit 0 with a JSON report that shows the checks really ran. A modest load (2 workers
 * and 5 transactions/s per workload) keeps 7 processes within 2 shared cores. The 1-hour
 * runs are in docs/reliability.md. Runs the built files (`pnpm build` first; `pnpm test` does).
 */
const CLI = fileURLToPath(new URL('../dist/soak/cli.js', import.meta.url));
const BACKENDS = ['memory', 'postgres', 'mysql', 'redis', 'redis-cluster', 'dynamodb', 'composite'] as const;
const ARGS = [
  '--duration',
  '70s',
  '--interval',
  '4s',
  '--warmup',
  '15s',
  '--concurrency',
  '2',
  '--rate',
  '5',
  '--window',
  '100',
  '--gc-interval',
  '15s',
  '--retention',
  '5s',
  '--json',
];

interface Run {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

function soak(backend: string, env: NodeJS.ProcessEnv): Promise<Run> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, ['--expose-gc', CLI, '--backend', backend, ...ARGS], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env,
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => {
      stdout += c.toString();
    });
    child.stderr.on('data', (c: Buffer) => {
      stderr += c.toString();
    });
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

describe('pnpm soak, 70 s per store', () => {
  // One DynamoDB Local for the dynamodb and composite soaks (each in its own namespace),
  // unless PERCOLATOR_DYNAMODB_ENDPOINT names one: two JVMs starting at once next to
  // five busy soaks can miss their start timeout on 2 cores.
  let dynamo: DynamoDbLocal | undefined;
  const env: NodeJS.ProcessEnv = { ...process.env };
  beforeAll(async () => {
    if (env.PERCOLATOR_DYNAMODB_ENDPOINT) return;
    dynamo = await startDynamoDbLocal({ startTimeoutMs: 120_000 });
    env.PERCOLATOR_DYNAMODB_ENDPOINT = dynamo.endpoint;
    // An endpoint from the environment gets the SDK's credential chain: DynamoDB Local
    // wants some credentials, whatever they are.
    env.AWS_ACCESS_KEY_ID ??= LOCAL_CREDENTIALS.accessKeyId;
    env.AWS_SECRET_ACCESS_KEY ??= LOCAL_CREDENTIALS.secretAccessKey;
    env.AWS_REGION ??= LOCAL_REGION;
  }, 150_000);
  afterAll(async () => {
    await dynamo?.stop();
  });

  test('every store: exits 0, every check ran, no metric grows', { timeout: 8 * 60_000 }, async () => {
    const runs = await Promise.all(
      BACKENDS.map(async (backend) => ({ backend, run: await soak(backend, env) })),
    );
    // Every store's problems at once, not only the first store's.
    const problems: string[] = [];
    for (const { backend, run } of runs) {
      const context = `${backend} (exit ${run.code}):\n${run.stderr.slice(-3000)}`;
      let report: SoakReport;
      try {
        report = JSON.parse(run.stdout) as SoakReport;
      } catch {
        problems.push(`no JSON report from ${context}\n${run.stdout.slice(-2000)}`);
        continue;
      }
      const judged = report.growth.filter((v) => v.judged).length;
      const wanted: [string, boolean][] = [
        ['no failures', report.failures.length === 0 && report.ok],
        ['exit code 0', run.code === 0],
        // The checks ran: commits in every workload, windows checked, totals read, samples judged.
        ['commits in every workload', Object.values(report.totals).every((n) => n > 0)],
        ['a list-append window checked', report.checks.lists.windows > 0 && report.checks.lists.ok > 0],
        ['conservation checked > 10 times', report.checks.transfers.conservationChecks > 10],
        ['observers drained', report.checks.observers.drained],
        ['gc ran', report.checks.gc.rows > 0],
        ['>= 8 samples', report.samples.length >= 8],
        ['>= 8 metrics judged', judged >= 8],
        [
          'server-side connections counted',
          !['postgres', 'mysql', 'redis', 'composite'].includes(backend) ||
            report.samples.every((s) => s.connections > 0),
        ],
      ];
      const missing = wanted.filter(([, ok]) => !ok).map(([what]) => what);
      if (missing.length > 0)
        problems.push(`${missing.join(', ')}: ${JSON.stringify(report.failures.slice(0, 8))}\n${context}`);
    }
    expect(problems).toEqual([]);
  });
});
