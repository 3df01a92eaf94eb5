/**
 * Version tokens without a per-statement counter: MySQL cannot draw from a sequence inside
 * an UPDATE, so each store instance reserves a block of 2^20 versions at a time
 * (one AUTO_INCREMENT id = one block) and hands them out locally. A version is
 * `block * 2^20 + n`; every token is issued once, so a version is never reused for a key,
 * not even after a delete and re-create, and a CAS stays a single statement that binds
 * its new version as a parameter.
 */
export const VERSION_BLOCK_BITS = 20;

export class VersionAllocator {
  private readonly blockBits: bigint;
  private readonly blockSize: bigint;
  /** The largest block whose versions still fit BIGINT UNSIGNED. */
  private readonly maxBlock: bigint;
  private block: bigint | undefined;
  private next = 0n;
  private refilling: Promise<void> | undefined;

  constructor(
    private readonly reserveBlock: () => Promise<bigint>,
    blockBits = VERSION_BLOCK_BITS,
  ) {
    this.blockBits = BigInt(blockBits);
    this.blockSize = 1n << this.blockBits;
    this.maxBlock = (1n << (64n - this.blockBits)) - 1n;
  }

  /** A token no other call, process or earlier run has been or will be given. */
  async nextVersion(): Promise<string> {
    for (;;) {
      if (this.block !== undefined && this.next < this.blockSize) {
        return ((this.block << this.blockBits) | this.next++).toString();
      }
      await this.refill();
    }
  }

  /** Reserve the first block ahead of time, so the first CAS is one round trip too. */
  async prepare(): Promise<void> {
    if (this.block === undefined) await this.refill();
  }

  private refill(): Promise<void> {
    this.refilling ??= this.reserveBlock()
      .then((block) => {
        if (block < 1n || block > this.maxBlock)
          throw new RangeError(`version block ${block} is out of range`);
        this.block = block;
        this.next = 0n;
      })
      .finally(() => {
        this.refilling = undefined;
      });
    return this.refilling;
  }
}
