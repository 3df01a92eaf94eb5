/**
 * vitest globalSetup: the local Redis Cluster is started at most once per run, before any
 * test file, and test files only check that it answers (adapters/redis/test/helpers.ts,
 * integration/test/support/backends.ts).
 *
 * For nodes on 127.0.0.1 (the default 127.0.0.1:7001-7003, or PERCOLATOR_REDIS_CLUSTER_NODES)
 * this takes a lease with `testkit/redis-cluster.sh acquire <pid>`: that starts the cluster
 * if nothing answers, and `release` at teardown stops it only if `acquire` started it and no
 * other live run still holds a lease. A remote cluster is never started or stopped.
 *
 * A failure here does not fail the whole run (most test files need no cluster): it is
 * handed to the cluster test files, which fail with it.
 */

import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DEFAULT_CLUSTER_NODES, parseNodes } from '@percolator/redis';
import { killListedGroups, PRIVATE_GROUPS_ENV } from '@percolator/testkit/private';
import { runClusterScript } from '@percolator/testkit/redis';
import type { TestProject } from 'vitest/node';

declare module 'vitest' {
  export interface ProvidedContext {
    /** Why the globalSetup could not provide the Redis Cluster ('' if it had no trouble). */
    redisClusterSetupError: string;
  }
}

async function clusterScript(command: 'acquire' | 'release', ports: number[]): Promise<void> {
  await runClusterScript(command, process.pid, { ports });
}

/**
 * The run's list of private-server process groups (testkit/src/private.ts): workers
 * inherit the variable; the teardown SIGKILLs whatever a worker stopped by a signal left.
 */
function listPrivateGroups(): () => void {
  const dir = mkdtempSync(join(tmpdir(), 'percolator-groups-'));
  process.env[PRIVATE_GROUPS_ENV] = dir;
  return () => {
    const killed = killListedGroups(dir);
    if (killed > 0)
      console.warn(`killed ${killed} private server process group(s) left running by a test worker`);
  };
}

export default async function setup(project: TestProject) {
  const killLeftovers = listPrivateGroups();
  project.provide('redisClusterSetupError', '');
  const fail = (why: string) => project.provide('redisClusterSetupError', why);
  let nodes: { host: string; port: number }[];
  try {
    nodes = parseNodes(process.env.PERCOLATOR_REDIS_CLUSTER_NODES || DEFAULT_CLUSTER_NODES);
  } catch (error) {
    fail((error as Error).message);
    return killLeftovers;
  }
  // The script runs nodes on 127.0.0.1 only.
  if (!nodes.every((n) => n.host === '127.0.0.1')) return killLeftovers;
  const ports = nodes.map((n) => n.port);
  try {
    await clusterScript('acquire', ports);
  } catch (error) {
    fail(`testkit/redis-cluster.sh could not start it: ${(error as Error).message}`);
    return killLeftovers;
  }
  return async () => {
    killLeftovers();
    // Not a test failure: the cluster is left running, and the next run reuses it.
    await clusterScript('release', ports).catch((error: Error) =>
      console.warn(`redis-cluster.sh release failed: ${error.message}`),
    );
  };
}
