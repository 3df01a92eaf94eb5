/**
 * Seeded randomness, so a run's key choices can be repeated: a small PRNG, uniform keys,
 * and YCSB's Zipfian generator.
 */

/** A source of uniform numbers in [0, 1). */
export type Random = () => number;

/** mulberry32: tiny, fast, good enough for picking keys (not for anything secret). */
export function seededRandom(seed: number): Random {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** An integer in [0, n). */
export function randomInt(random: Random, n: number): number {
  return Math.floor(random() * n);
}

/** Something that picks item indexes in [0, n). */
export interface KeyChooser {
  readonly n: number;
  next(): number;
}

export function uniformChooser(n: number, random: Random): KeyChooser {
  return { n, next: () => randomInt(random, n) };
}

/** The YCSB default skew: a few keys get most of the traffic. */
export const DEFAULT_ZIPF_THETA = 0.99;

/** sum_{i=1..n} 1 / i^theta: the normalising constant of the Zipfian distribution. */
export function zeta(n: number, theta: number): number {
  let sum = 0;
  for (let i = 1; i <= n; i++) sum += 1 / i ** theta;
  return sum;
}

/**
 * Zipfian over ranks [0, n): rank i is chosen with probability (1 / (i+1)^theta) / zeta(n).
 * Gray et al., "Quickly Generating Billion-Record Synthetic Databases" (SIGMOD 1994), as
 * used by YCSB's ZipfianGenerator: O(1) per sample after an O(n) setup.
 */
export class ZipfianChooser implements KeyChooser {
  private readonly zetan: number;
  private readonly alpha: number;
  private readonly eta: number;
  private readonly half: number;

  constructor(
    readonly n: number,
    private readonly random: Random,
    readonly theta: number = DEFAULT_ZIPF_THETA,
  ) {
    if (!Number.isInteger(n) || n < 2) throw new RangeError('a Zipfian chooser needs n >= 2 items');
    if (!(theta > 0 && theta < 1)) throw new RangeError('theta must be in (0, 1)');
    this.zetan = zeta(n, theta);
    const zeta2 = zeta(2, theta);
    this.alpha = 1 / (1 - theta);
    this.eta = (1 - (2 / n) ** (1 - theta)) / (1 - zeta2 / this.zetan);
    this.half = 1 + 0.5 ** theta;
  }

  /** The exact probability of rank i (for tests and reports). */
  probability(rank: number): number {
    return 1 / (rank + 1) ** this.theta / this.zetan;
  }

  next(): number {
    const u = this.random();
    const uz = u * this.zetan;
    if (uz < 1) return 0;
    if (uz < this.half) return 1;
    const rank = Math.floor(this.n * (this.eta * u - this.eta + 1) ** this.alpha);
    return Math.min(rank, this.n - 1);
  }
}

/**
 * Zipfian ranks mapped through a fixed random permutation, so the hot keys are spread
 * over the key space instead of all sitting at its start (YCSB scrambles them too; a
 * permutation keeps the distribution exact where YCSB's hash may collide).
 */
export function scrambledZipfianChooser(
  n: number,
  random: Random,
  permutationSeed: number,
  theta = DEFAULT_ZIPF_THETA,
): KeyChooser {
  const zipf = new ZipfianChooser(n, random, theta);
  const permutation = shuffledRange(n, seededRandom(permutationSeed));
  return { n, next: () => permutation[zipf.next()]! };
}

/** 0..n-1 in a random order (Fisher-Yates). */
export function shuffledRange(n: number, random: Random): number[] {
  const out = Array.from({ length: n }, (_, i) => i);
  for (let i = n - 1; i > 0; i--) {
    const j = randomInt(random, i + 1);
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

/** `count` distinct indexes drawn from `chooser` (count must be <= chooser.n). */
export function distinctChoices(chooser: KeyChooser, count: number): number[] {
  if (count > chooser.n) throw new RangeError(`cannot pick ${count} distinct keys out of ${chooser.n}`);
  const picked = new Set<number>();
  // Skewed choosers repeat hot keys often; cap the tries and fill up sequentially.
  for (let tries = 0; picked.size < count && tries < count * 50; tries++) picked.add(chooser.next());
  for (let i = 0; picked.size < count; i++) picked.add(i);
  return [...picked];
}
