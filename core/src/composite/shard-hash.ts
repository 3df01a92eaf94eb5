/**
 * Which shard a row key belongs to. This function is part of the on-disk layout of a
 * sharded deployment: every client must compute the same answer forever, so it is fixed
 * here and documented (docs/multi-store.md). Changing it, or the number of shards, moves
 * rows and needs a migration.
 *
 * key -> FNV-1a 64 over the key's UTF-8 bytes -> jump consistent hash (Lamping & Veach,
 * 2014) over `shardCount` buckets. Jump hashing moves only 1/(n+1) of the keys when a
 * shard is appended, so growing from n to n+1 shards migrates as few rows as possible.
 */
export function shardOf(key: string, shardCount: number): number {
  if (!Number.isInteger(shardCount) || shardCount < 1) {
    throw new RangeError(`shardCount must be a positive integer, got ${shardCount}`);
  }
  if (shardCount === 1) return 0;
  return jumpHash(fnv1a64(key), shardCount);
}

const MASK_64 = (1n << 64n) - 1n;
const JUMP_MULTIPLIER = 2862933555777941757n;

function jumpHash(key: bigint, buckets: number): number {
  let b = -1;
  let j = 0;
  let k = key;
  while (j < buckets) {
    b = j;
    k = (k * JUMP_MULTIPLIER + 1n) & MASK_64;
    j = Math.floor((b + 1) * (2 ** 31 / (Number(k >> 33n) + 1)));
  }
  return b;
}

/**
 * FNV-1a 64 of the UTF-8 encoding of `text`, computed on two 32-bit halves so a 1 KiB
 * key costs no BigInt arithmetic per byte. The FNV prime is 2^40 + 0x1b3.
 */
export function fnv1a64(text: string): bigint {
  let hi = 0xcbf29ce4;
  let lo = 0x84222325;
  const mix = (byte: number) => {
    lo = (lo ^ byte) >>> 0;
    const low = lo * 0x1b3; // < 2^41: exact
    const high = hi * 0x1b3 + Math.floor(low / 0x1_0000_0000) + ((lo << 8) >>> 0);
    lo = low >>> 0;
    hi = high >>> 0;
  };
  for (let i = 0; i < text.length; i++) {
    let c = text.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff && i + 1 < text.length) {
      const d = text.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        c = 0x10000 + ((c - 0xd800) << 10) + (d - 0xdc00);
        i++;
      }
    }
    if (c < 0x80) mix(c);
    else if (c < 0x800) {
      mix(0xc0 | (c >> 6));
      mix(0x80 | (c & 0x3f));
    } else if (c < 0x10000) {
      mix(0xe0 | (c >> 12));
      mix(0x80 | ((c >> 6) & 0x3f));
      mix(0x80 | (c & 0x3f));
    } else {
      mix(0xf0 | (c >> 18));
      mix(0x80 | ((c >> 12) & 0x3f));
      mix(0x80 | ((c >> 6) & 0x3f));
      mix(0x80 | (c & 0x3f));
    }
  }
  return (BigInt(hi) << 32n) | BigInt(lo);
}
