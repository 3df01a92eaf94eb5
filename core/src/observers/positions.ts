/**
 * Where a scanner starts (the paper's answer to "bus clumping"). Row keys are arbitrary
 * strings with no known distribution, so a uniformly random string would land before or
 * after almost every key. Instead each worker keeps a small uniform sample of notified
 * keys it has seen per table and starts just after a random one; with an empty sample
 * it starts at the beginning.
 */
export class StartPositions {
  private readonly samples = new Map<string, { keys: string[]; seen: number }>();

  constructor(
    private readonly capacity = 128,
    private readonly random: () => number = Math.random,
  ) {}

  /** Reservoir sampling: every key seen has the same chance to be kept. */
  observe(table: string, key: string): void {
    let sample = this.samples.get(table);
    if (!sample) {
      sample = { keys: [], seen: 0 };
      this.samples.set(table, sample);
    }
    sample.seen++;
    if (sample.keys.length < this.capacity) sample.keys.push(key);
    else {
      const i = Math.floor(this.random() * sample.seen);
      if (i < this.capacity) sample.keys[i] = key;
    }
  }

  /** A random `after` position for a scan of `table` (undefined = the beginning). */
  pick(table: string): string | undefined {
    const keys = this.samples.get(table)?.keys;
    if (!keys || keys.length === 0) return undefined;
    // Sometimes start at the very beginning, so keys before every sampled one are reached early too.
    const i = Math.floor(this.random() * (keys.length + 1));
    return i === keys.length ? undefined : keys[i];
  }
}
