import { type Part, type Report, runConformance } from '@percolator/conformance';
import { MemoryStore, type RowStore } from '@percolator/core';
import { describe, expect, it } from 'vitest';
import {
  CreateOnlyNotificationsStore,
  IgnoresVersionStore,
  ReusesVersionsStore,
  StaleReadStore,
  Utf16ScanStore,
} from './broken-stores.js';

// The suite proves itself: run through the plain runner, it must fail each broken store
// (in the parts that should notice) and pass the correct one.

function run(createStore: () => RowStore, parts: Part[], scale = 0.3): Promise<Report> {
  return runConformance({ name: 'self-check', createStore: async () => createStore(), parts, scale });
}

function failed(report: Report): string[] {
  return report.results.filter((r) => r.status === 'fail').map((r) => `${r.part}: ${r.name}`);
}

describe('the conformance suite catches broken stores', () => {
  it('a CAS that ignores the version fails the store contract and the history check', async () => {
    const report = await run(() => new IgnoresVersionStore(), ['store', 'protocol', 'history']);
    expect(report.ok).toBe(false);
    const names = failed(report);
    expect(names).toContain('store: a stale version fails and changes nothing');
    expect(names).toContain('store: concurrent CAS on one row: exactly one winner per version');
    expect(names.some((n) => n.startsWith('history:'))).toBe(true);
    expect(names).toContain(
      'protocol: lost update: concurrent increments with transact give the exact total',
    );
    const history = report.results.find((r) => r.part === 'history')!;
    expect(history.error).toMatch(/lost-update|G-single|incompatible-order|G0|G1/);
    expect(history.error).toContain(`seed ${report.seed}`);
  }, 120_000);

  it('a read that returns a stale state fails the store contract and the history check', async () => {
    const report = await run(() => new StaleReadStore(), ['store', 'history']);
    expect(report.ok).toBe(false);
    const names = failed(report);
    expect(names).toContain('store: create, read, check-and-set, delete');
    expect(names.some((n) => n.startsWith('history:'))).toBe(true);
  }, 120_000);

  it('versions that restart after a delete fail the ABA case', async () => {
    const report = await run(() => new ReusesVersionsStore(), ['store']);
    expect(failed(report)).toContain('store: a version is never reused after delete and re-create (ABA)');
    const scan = report.results.find((r) => r.name.startsWith('scan returns rows'))!;
    expect(scan.status).toBe('not declared');
  }, 60_000);

  it('a scan in UTF-16 order fails the scan case', async () => {
    const report = await run(() => new Utf16ScanStore(), ['store']);
    expect(failed(report)).toEqual([
      'store: scan returns rows in compareKeys (UTF-8 byte) order with start/end/after/limit',
    ]);
  }, 60_000);

  it('a notification index that misses updated rows fails the observer cases', async () => {
    const report = await run(() => new CreateOnlyNotificationsStore(), ['store', 'observers']);
    const names = failed(report);
    expect(names).toContain('store: scanNotified returns every notified row, in key order');
    expect(names.filter((n) => n.startsWith('observers:')).length).toBeGreaterThan(0);
  }, 60_000);

  it('the correct memory store passes every part, and the report sums up per part', async () => {
    const report = await run(() => new MemoryStore(), ['store', 'history', 'faults'], 0.2);
    expect(failed(report)).toEqual([]);
    expect(report.ok).toBe(true);
    expect(report.parts.store?.fail).toBe(0);
    expect(report.parts.store?.pass).toBe(report.results.filter((r) => r.part === 'store').length);
    expect(report.parts.protocol).toBeUndefined();
  }, 120_000);
});
