import { connect } from 'node:net';
import type { DynamoDbTarget } from '@percolator/testkit/dynamodb';
import { runClusterScript as runScript } from '@percolator/testkit/redis';

/** Local helpers for services the default run may start itself. */

/** True if a Redis server answers PING at host:port within `timeoutMs`. */
export function redisAnswers(host: string, port: number, timeoutMs = 1000): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host, port });
    let reply = '';
    const done = (ok: boolean) => {
      clearTimeout(timer);
      socket.destroy();
      resolve(ok);
    };
    const timer = setTimeout(() => done(false), timeoutMs);
    socket.once('connect', () => socket.write('PING\r\n'));
    socket.on('data', (chunk) => {
      reply += chunk.toString();
      if (reply.includes('\r\n')) done(reply.startsWith('+PONG'));
    });
    socket.once('error', () => done(false));
  });
}

/** The local Redis Cluster's script (@percolator/testkit/redis): start, stop or status. */
export function runClusterScript(command: 'start' | 'stop' | 'status', timeoutMs = 60_000): Promise<string> {
  return runScript(command, undefined, { timeoutMs });
}

/**
 * Holds a lease on the local Redis Cluster for process `pid` (starting it if down), so a
 * test run that started it does not stop it under a long run; `release` drops it.
 */
export async function clusterLease(command: 'acquire' | 'release', pid = process.pid): Promise<void> {
  await runScript(command, pid);
}

/** True if anything answers HTTP at `endpoint` (DynamoDB answers a bare GET with 400). */
export async function httpAnswers(endpoint: string, timeoutMs = 2000): Promise<boolean> {
  try {
    const response = await fetch(endpoint, { signal: AbortSignal.timeout(timeoutMs) });
    await response.arrayBuffer();
    return true;
  } catch {
    return false;
  }
}

/**
 * Services one run shares between backends: DynamoDB Local is started at most once (the
 * `dynamodb` and `mixed` backends both use it; each in its own namespace) and stopped by
 * `stop()` at the end of the run.
 */
export class SharedServices {
  private dynamo: Promise<DynamoDbTarget> | undefined;

  /** $PERCOLATOR_DYNAMODB_ENDPOINT if set, else DynamoDB Local started on first use. */
  dynamoDb(): Promise<DynamoDbTarget> {
    this.dynamo ??= import('@percolator/testkit/dynamodb').then((m) => m.dynamoDbTarget());
    return this.dynamo;
  }

  async stop(): Promise<void> {
    const dynamo = this.dynamo;
    this.dynamo = undefined;
    if (dynamo) await (await dynamo.catch(() => undefined))?.stop();
  }
}
