/**
 * The plain runner: runs the suite's cases against a store factory and returns a report.
 * The CLI uses it; so does the suite's own self-test against broken stores.
 */
import { checkedStore, InvalidArgumentError, type RowStore, type StoreCapabilities } from '@percolator/core';
import { allCases } from './cases/index.js';
import { effectiveCase } from './cases/undeclared.js';
import { defaultSeed, Random } from './random.js';
import type {
  CaseContext,
  CaseResult,
  ConformanceCase,
  ConformanceOptions,
  Part,
  PartSummary,
  Report,
} from './types.js';
import { PARTS } from './types.js';
import { errorText } from './util.js';

export const DEFAULT_CASE_TIMEOUT_MS = 30_000;

/** The cases an options object selects, in run order. */
/**
 * The workload size multiplier, checked: a positive finite number. A scale of NaN (a
 * misspelt PERCOLATOR_CONFORMANCE_SCALE, say) would run every scaled loop zero times, and
 * the cases would pass without exercising the store.
 */
export function scaleOf(options: Pick<ConformanceOptions, 'scale'>): number {
  const scale = options.scale ?? 1;
  if (typeof scale !== 'number' || !Number.isFinite(scale) || scale <= 0) {
    throw new InvalidArgumentError(`conformance scale must be a positive number, got ${String(scale)}`);
  }
  return scale;
}

export function selectCases(options: Pick<ConformanceOptions, 'parts' | 'grep'>): ConformanceCase[] {
  const parts = new Set<Part>(options.parts ?? PARTS);
  for (const part of parts) {
    if (!PARTS.includes(part)) throw new Error(`unknown part "${part}"; parts are ${PARTS.join(', ')}`);
  }
  const grep = options.grep?.toLowerCase();
  return allCases().filter(
    (c) => parts.has(c.part) && (grep === undefined || `${c.part}: ${c.name}`.toLowerCase().includes(grep)),
  );
}

/** Time limit of one case at a given scale: big workloads get more time on slow stores. */
export function caseTimeout(c: ConformanceCase, scale: number): number {
  return Math.round((c.timeoutMs ?? DEFAULT_CASE_TIMEOUT_MS) * Math.max(1, scale));
}

/**
 * Runs one case with its own stores and cleanups. Resolves with the result; never throws.
 * `capabilities` decides whether the case applies.
 */
export async function runCase(
  c: ConformanceCase,
  options: ConformanceOptions,
  capabilities: StoreCapabilities,
  seed: number,
): Promise<CaseResult> {
  const started = performance.now();
  const notes: string[] = [];
  const undeclared = c.requires !== undefined && !capabilities[c.requires] ? c.requires : undefined;
  // An undeclared capability's case checks instead that the core leaves that method alone.
  c = effectiveCase(c, capabilities);
  const base = { part: c.part, name: c.name, notes, ...(undeclared ? { undeclared } : {}) };
  const { ctx, cleanup } = caseContext(c, options, capabilities, seed, notes);
  const timeoutMs = caseTimeout(c, ctx.scale);
  let timer: NodeJS.Timeout | undefined;
  let error: unknown;
  try {
    await Promise.race([
      c.run(ctx),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`timed out after ${timeoutMs} ms`)), timeoutMs);
      }),
    ]);
  } catch (e) {
    error = e;
  } finally {
    clearTimeout(timer);
  }
  const cleanupError = await cleanup();
  error ??= cleanupError;
  const durationMs = Math.round(performance.now() - started);
  if (error === undefined) return { ...base, status: 'pass', durationMs };
  return { ...base, status: 'fail', durationMs, error: failureMessage(error, seed) };
}

export function failureMessage(error: unknown, seed: number): string {
  return `${errorText(error)}\n(seed ${seed}: rerun with PERCOLATOR_SEED=${seed} or --seed ${seed})`;
}

/** Builds a case's context; `cleanup` destroys its stores and runs deferred work. */
export function caseContext(
  c: ConformanceCase,
  options: ConformanceOptions,
  capabilities: StoreCapabilities,
  seed: number,
  notes: string[],
): { ctx: CaseContext; cleanup: () => Promise<unknown> } {
  const scale = scaleOf(options);
  const deferred: Array<() => unknown> = [];
  const stores: RowStore[] = [];
  const destroy = options.destroyStore ?? ((s: RowStore) => s.close());
  const ctx: CaseContext = {
    seed,
    scale,
    capabilities,
    random: new Random(seed).fork(`${c.part}: ${c.name}`),
    async createStore() {
      const store = await options.createStore();
      stores.push(store);
      // Cases meet the store as the core does: behind the one contract check.
      return checkedStore(store);
    },
    scaled: (n, min = 1) => Math.max(min, Math.round(n * scale)),
    note: (message) => {
      notes.push(message);
    },
    defer: (fn) => {
      deferred.push(fn);
    },
  };
  const cleanup = async () => {
    let first: unknown;
    // Clients first (they may still be finishing background work), then the stores.
    for (const fn of deferred.reverse()) {
      try {
        await fn();
      } catch (e) {
        first ??= e;
      }
    }
    for (const store of stores) {
      try {
        await destroy(store);
      } catch (e) {
        first ??= e;
      }
    }
    return first;
  };
  return { ctx, cleanup };
}

/** Creates one store to learn what the stores of this factory declare. */
export async function probeCapabilities(options: ConformanceOptions): Promise<StoreCapabilities> {
  const store = await options.createStore();
  try {
    return { ...store.capabilities };
  } finally {
    await (options.destroyStore ?? ((s: RowStore) => s.close()))(store);
  }
}

/** Runs the selected cases one after another and summarises them per part. */
export async function runConformance(
  options: ConformanceOptions & { onResult?: (result: CaseResult) => void },
): Promise<Report> {
  const started = performance.now();
  const seed = options.seed ?? defaultSeed();
  const scale = scaleOf(options);
  const cases = selectCases(options);
  const capabilities = await probeCapabilities(options);
  const results: CaseResult[] = [];
  for (const c of cases) {
    const result = await runCase(c, options, capabilities, seed);
    results.push(result);
    options.onResult?.(result);
  }
  return {
    name: options.name,
    seed,
    scale,
    ok: results.every((r) => r.status !== 'fail'),
    durationMs: Math.round(performance.now() - started),
    results,
    parts: summarise(results),
  };
}

export function summarise(results: readonly CaseResult[]): Partial<Record<Part, PartSummary>> {
  const parts: Partial<Record<Part, PartSummary>> = {};
  for (const r of results) {
    const s = parts[r.part] ?? { pass: 0, fail: 0, notDeclared: 0, durationMs: 0 };
    parts[r.part] = {
      pass: s.pass + (r.status === 'pass' ? 1 : 0),
      fail: s.fail + (r.status === 'fail' ? 1 : 0),
      notDeclared: s.notDeclared + (r.undeclared !== undefined || r.status === 'not declared' ? 1 : 0),
      durationMs: s.durationMs + r.durationMs,
    };
  }
  return parts;
}
