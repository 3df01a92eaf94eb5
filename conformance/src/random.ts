/**
 * A small seeded PRNG (mulberry32). Every random choice the suite makes comes from one of
 * these, so a failing run can be repeated by passing the seed it printed.
 */
export class Random {
  private state: number;

  constructor(readonly seed: number) {
    this.state = seed >>> 0;
  }

  /** A float in [0, 1). */
  next(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  /** An integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.next() * n);
  }

  /** An integer in [min, max]. */
  between(min: number, max: number): number {
    return min + this.int(max - min + 1);
  }

  chance(p: number): boolean {
    return this.next() < p;
  }

  pick<T>(items: readonly T[]): T {
    if (items.length === 0) throw new Error('Random.pick on an empty list');
    return items[this.int(items.length)] as T;
  }

  shuffle<T>(items: readonly T[]): T[] {
    const out = [...items];
    for (let i = out.length - 1; i > 0; i--) {
      const j = this.int(i + 1);
      [out[i], out[j]] = [out[j] as T, out[i] as T];
    }
    return out;
  }

  /** A new generator whose sequence depends only on this one's seed and `label`. */
  fork(label: string): Random {
    let h = this.seed ^ 0x9e3779b9;
    for (let i = 0; i < label.length; i++) h = Math.imul(h ^ label.charCodeAt(i), 0x01000193);
    return new Random(h >>> 0);
  }
}

/** The seed used when none is given, so runs repeat exactly. */
export const DEFAULT_SEED = 20_100_101;

/** A seed from the environment (PERCOLATOR_SEED) or the fixed default. */
export function defaultSeed(): number {
  const fromEnv = process.env.PERCOLATOR_SEED;
  if (fromEnv !== undefined && /^\d+$/.test(fromEnv)) return Number(fromEnv) >>> 0;
  return DEFAULT_SEED;
}
