import { compareKeys } from '../names.js';
import { shardOf } from './shard-hash.js';

/**
 * One page of a sharded table in key order, merged from every shard (a k-way merge by
 * compareKeys). Each shard is asked for `limit` keys after the same position, so the first
 * `limit` of the union are among the answers.
 *
 * A row found on a shard that does not own its key (left behind by a migration) is
 * skipped, so a scan shows exactly what point reads see. Skipping can leave a shard's page
 * short although the shard has more rows; such a shard is asked again after its last key,
 * so a page shorter than `limit` still means every shard is exhausted (the core relies on
 * that).
 */
export async function mergeShards<T>(
  shardCount: number,
  fetch: (shard: number, after: string | undefined, limit: number) => Promise<readonly T[]>,
  keyOf: (item: T) => string,
  limit: number,
): Promise<T[]> {
  const shards = Array.from({ length: shardCount }, (_, shard) => ({
    shard,
    buffer: [] as T[],
    /** Last key the shard returned (owned or not); undefined before the first page. */
    cursor: undefined as string | undefined,
    exhausted: false,
  }));
  const out: T[] = [];
  let first = true;
  for (;;) {
    const want = first ? limit : limit - out.length;
    const refill = shards.filter((s) => s.buffer.length === 0 && !s.exhausted);
    await Promise.all(
      refill.map(async (s) => {
        const page = await fetch(s.shard, s.cursor, want);
        if (page.length < want || page.length === 0) s.exhausted = true;
        if (page.length > 0) {
          const last = keyOf(page[page.length - 1]!);
          // A store that ignores `after` would make this loop forever.
          if (s.cursor !== undefined && compareKeys(last, s.cursor) <= 0) {
            throw new Error(`shard ${s.shard} returned keys out of order or ignored "after"`);
          }
          s.cursor = last;
        }
        for (const item of page) if (shardOf(keyOf(item), shardCount) === s.shard) s.buffer.push(item);
      }),
    );
    first = false;
    // Every shard now has a buffered head or is exhausted, so the smallest head is next overall.
    while (out.length < limit) {
      let next: (typeof shards)[number] | undefined;
      for (const s of shards) {
        const head = s.buffer[0];
        if (head === undefined) {
          if (!s.exhausted) break;
          continue;
        }
        if (next === undefined || compareKeys(keyOf(head), keyOf(next.buffer[0]!)) < 0) next = s;
      }
      const blocked = shards.some((s) => s.buffer.length === 0 && !s.exhausted);
      if (blocked || next === undefined) break;
      out.push(next.buffer.shift()!);
    }
    if (out.length >= limit || shards.every((s) => s.buffer.length === 0 && s.exhausted)) return out;
  }
}
