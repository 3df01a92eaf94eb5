import { InvalidArgumentError, MemoryStore } from '@percolator/core';
import { describe, expect, it } from 'vitest';
import { runConformance } from '../src/index.js';
import { scaleOf } from '../src/runner.js';

describe('conformance options', () => {
  it('a scale that is not a positive number is refused, not run as zero-sized workloads that pass', async () => {
    for (const scale of [Number.NaN, 0, -1, Number.POSITIVE_INFINITY]) {
      expect(() => scaleOf({ scale })).toThrow(InvalidArgumentError);
      await expect(
        runConformance({
          name: 'memory',
          createStore: async () => new MemoryStore(),
          scale,
          parts: ['history'],
        }),
      ).rejects.toBeInstanceOf(InvalidArgumentError);
    }
    // What an unset or misspelt variable gives: Number(undefined ?? 0.5) is fine, Number('x') is NaN.
    expect(() => scaleOf({ scale: Number('0.25x') })).toThrow(/positive number, got NaN/);
    expect(scaleOf({ scale: 0.25 })).toBe(0.25);
    expect(scaleOf({})).toBe(1);
  });
});
