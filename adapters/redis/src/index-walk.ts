import { InvalidArgumentError } from '@percolator/core';
import type { Cluster, Redis } from 'ioredis';
import { toStoreError } from './errors.js';
import { lexAfterKey, lexBeforeKey, lexFromKeyInclusive, memberKey } from './keys.js';

type RedisClient = Redis | Cluster;

/** Index members fetched per ZRANGEBYLEX at most. */
const SCAN_BATCH = 256;

/**
 * Walks an index in key order within the bounds, handing each batch of distinct keys to
 * `visit` until `wanted()` drops to 0 or the index is exhausted.
 */
export async function walkIndex(
  client: RedisClient,
  index: string,
  bounds: { start?: string; end?: string; after?: string },
  wanted: () => number,
  visit: (keys: string[]) => Promise<void>,
): Promise<void> {
  const { start, end, after } = bounds;
  for (const [name, bound] of [
    ['start', start],
    ['end', end],
    ['after', after],
  ] as const) {
    if (bound !== undefined && (typeof bound !== 'string' || !bound.isWellFormed())) {
      throw new InvalidArgumentError(`scan ${name} must be a well-formed string`);
    }
  }
  let min: Buffer | string = start === undefined ? '-' : lexFromKeyInclusive(start);
  if (after !== undefined) {
    const afterBound = lexAfterKey(after);
    // Both bounds are "greater than" conditions: keep the stricter one.
    if (typeof min === 'string' || Buffer.compare(afterBound.subarray(1), min.subarray(1)) >= 0)
      min = afterBound;
  }
  const max: Buffer | string = end === undefined ? '+' : lexBeforeKey(end);
  while (wanted() > 0) {
    // Usually one member per key; a little slack covers keys with extra entries.
    const batch = Math.min(SCAN_BATCH, wanted() + 8);
    let members: Buffer[];
    try {
      members = await client.zrangebylexBuffer(index, min, max, 'LIMIT', 0, batch);
    } catch (error) {
      throw toStoreError(error, 'scan', 'read');
    }
    const keys: string[] = [];
    for (const m of members) {
      const k = memberKey(m);
      if (keys[keys.length - 1] !== k) keys.push(k);
    }
    if (keys.length > 0) await visit(keys);
    if (members.length < batch) return;
    min = lexAfterKey(keys[keys.length - 1]!);
  }
}
