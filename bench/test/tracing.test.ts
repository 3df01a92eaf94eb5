import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { InvalidArgumentError } from '@percolator/core';
import { afterAll, describe, expect, test } from 'vitest';
import { tracingNote } from '../src/bench.js';
import { parseOptions } from '../src/options.js';
import type { BenchReport } from '../src/types.js';
import { memoryTransfers, sink } from './helpers.js';

describe('--tracing otel', () => {
  let dir: string | undefined;
  afterAll(async () => {
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  test('accepts "otel", "otel-events", "otel-attributes", "otel-lean", "otel-sampled" and "events"', () => {
    expect(parseOptions(['--tracing', 'otel']).tracing).toEqual(['otel']);
    expect(parseOptions(['--tracing', 'otel-sampled,events']).tracing).toEqual(['otel-sampled', 'events']);
    expect(parseOptions(['--tracing', 'otel,otel-events']).tracing).toEqual(['otel', 'otel-events']);
    expect(parseOptions(['--tracing', 'otel-lean,otel-attributes,otel-lean']).tracing).toEqual([
      'otel-lean',
      'otel-attributes',
    ]);
    expect(parseOptions([]).tracing).toBeUndefined();
    expect(() => parseOptions(['--tracing', 'zipkin'])).toThrow(InvalidArgumentError);
    expect(() => parseOptions(['--tracing', 'otel,jaeger'])).toThrow(InvalidArgumentError);
    expect(() => parseOptions(['--tracing', ','])).toThrow(InvalidArgumentError);
  });

  test('runs Percolator again with OpenTelemetry on, compared with Percolator in the same run', async () => {
    dir = await mkdtemp(join(tmpdir(), 'bench-tracing-'));
    const out = sink();
    let text = '';
    out.on('data', (c: Buffer) => {
      text += c.toString();
    });
    const code = await memoryTransfers(
      dir,
      [
        '--duration',
        '80ms',
        '--warmup',
        '20ms',
        '--concurrency',
        '2',
        '--accounts',
        '32',
        '--tracing',
        'otel,otel-events,otel-lean,otel-sampled,events',
      ],
      out,
    );
    const report = JSON.parse(await readFile(join(dir, 'results.json'), 'utf8')) as BenchReport;
    expect(report.failures).toEqual([]);
    expect(code).toBe(0);
    expect(report.results.map((r) => [r.mode, r.variant])).toEqual([
      ['percolator', 'si'],
      ['percolator', 'si+otel'],
      ['percolator', 'si+otel-events'],
      ['percolator', 'si+otel-lean'],
      ['percolator', 'si+otel-sampled'],
      ['percolator', 'si+events'],
    ]);
    const [plain, ...traced] = report.results;
    for (const result of traced) {
      expect(result.check.ok).toBe(true);
      expect(result.transactions).toBeGreaterThan(0);
      expect(result.ratios.map((r) => r.baseline)).toEqual(['percolator']);
      expect(result.ratios[0]!.throughput).toBeCloseTo(result.throughput / plain!.throughput, 2);
    }
    const note = report.notes.find((n) =>
      n.startsWith('--tracing otel,otel-events,otel-lean,otel-sampled,events'),
    );
    expect(note).toContain('6 interleaved rounds');
    expect(note).toContain(
      '"percolator+events": the library\'s events alone, to a listener that does nothing',
    );
    expect(note).not.toMatch(/otel-attributes/); // not asked for
    expect(Number(/(\d+) spans exported/.exec(note ?? '')?.[1])).toBeGreaterThan(0);
    expect(text).toContain('percolator+otel');
    expect(text).toContain('percolator+otel-events');
    expect(text).toContain('percolator+otel-lean');
    expect(text).toContain('percolator+otel-sampled');
    expect(text).toContain('percolator+events');
  });
});

test('the --tracing note of a run with events only does not claim OpenTelemetry', () => {
  const note = tracingNote(['events'], 0, 4);
  expect(note).not.toMatch(/SDK|spans exported/);
  expect(note).toMatch(/in 4 interleaved rounds/);
});
