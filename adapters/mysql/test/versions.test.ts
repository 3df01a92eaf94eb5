import { describe, expect, it } from 'vitest';
import { VersionAllocator } from '../src/versions.js';

// The allocator alone (no server): blocks of 2^2 versions make the block edges easy to hit.
describe('mysql version allocator', () => {
  it('hands out every version once, reserving one block per 2^bits versions', async () => {
    let reserved = 0;
    const allocator = new VersionAllocator(async () => BigInt(++reserved), 2);
    await allocator.prepare();
    const versions = await Promise.all(Array.from({ length: 10 }, () => allocator.nextVersion()));
    expect(new Set(versions).size).toBe(10);
    expect(versions.map(Number).sort((a, b) => a - b)).toEqual([4, 5, 6, 7, 8, 9, 10, 11, 12, 13]);
    expect(reserved).toBe(3);
  });

  it('never hands out a version when reserving a block fails, and recovers', async () => {
    let fail = true;
    let reserved = 0;
    const allocator = new VersionAllocator(async () => {
      if (fail) throw new Error('server gone');
      return BigInt(++reserved);
    }, 2);
    await expect(allocator.nextVersion()).rejects.toThrow('server gone');
    fail = false;
    expect(await allocator.nextVersion()).toBe('4');
  });

  it('refuses a block id whose versions would not fit BIGINT UNSIGNED', async () => {
    const allocator = new VersionAllocator(async () => 1n << 62n, 2);
    await expect(allocator.nextVersion()).rejects.toThrow(RangeError);
  });
});
