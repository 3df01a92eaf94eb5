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

import { DEFAULT_CLUSTER_NODES, parseNodes } from '@percolator/redis';
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

export default async function setup(project: TestProject) {
  project.provide('redisClusterSetupError', '');
  const fail = (why: string) => project.provide('redisClusterSetupError', why);
  let nodes: { host: string; port: number }[];
  try {
    nodes = parseNodes(process.env.PERCOLATOR_REDIS_CLUSTER_NODES || DEFAULT_CLUSTER_NODES);
  } catch (error) {
    fail((error as Error).message);
    return;
  }
  // The script runs nodes on 127.0.0.1 only.
  if (!nodes.every((n) => n.host === '127.0.0.1')) return;
  const ports = nodes.map((n) => n.port);
  try {
    await clusterScript('acquire', ports);
  } catch (error) {
    fail(`testkit/redis-cluster.sh could not start it: ${(error as Error).message}`);
    return;
  }
  return async () => {
    // Not a test failure: the cluster is left running, and the next run reuses it.
    await clusterScript('release', ports).catch((error: Error) =>
      console.warn(`redis-cluster.sh release failed: ${error.message}`),
    );
  };
}
