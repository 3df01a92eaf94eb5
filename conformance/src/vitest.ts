/**
 * The vitest binding: a store's own test file calls `conformanceSuite(...)` at top level,
 * like `@keyv/test-suite`, and gets one `it` per case, grouped by part.
 */
import type { StoreCapabilities } from '@percolator/core';
import { CAPABILITY_METHODS, effectiveCase } from './cases/undeclared.js';
import { defaultSeed } from './random.js';
import {
  caseContext,
  caseTimeout,
  failureMessage,
  probeCapabilities,
  scaleOf,
  selectCases,
} from './runner.js';
import type { ConformanceOptions } from './types.js';
import { PARTS } from './types.js';

// Loaded lazily: importing `vitest` outside a vitest run throws, and this package's main
// entry must still load in plain Node (the CLI, scripts, `runConformance`).
const vitest = await import('vitest').catch(() => undefined);

export function conformanceSuite(options: ConformanceOptions): void {
  if (vitest === undefined) {
    throw new Error('conformanceSuite() registers vitest tests: call it from a test file run by vitest');
  }
  const { beforeAll, describe, it } = vitest;
  const seed = options.seed ?? defaultSeed();
  const scale = scaleOf(options);
  const cases = selectCases(options);
  describe(`${options.name} conformance (seed ${seed}, scale ${scale})`, () => {
    let capabilities: StoreCapabilities | undefined;
    beforeAll(async () => {
      capabilities = await probeCapabilities(options);
    });
    for (const part of PARTS) {
      const inPart = cases.filter((c) => c.part === part);
      if (inPart.length === 0) continue;
      describe(part, () => {
        for (const c of inPart) {
          // Titles are fixed before the store's capabilities are known (beforeAll), so a
          // capability case names both checks; its annotation says which one ran.
          const title = c.requires
            ? `[${c.requires}] if declared: ${c.name}; if not: the core never calls ${CAPABILITY_METHODS[c.requires]}`
            : c.name;
          it(
            title,
            async (testContext) => {
              if (capabilities === undefined) throw new Error('store capabilities were not probed');
              const run = effectiveCase(c, capabilities);
              const notes: string[] = run === c ? [] : [`ran: ${run.name}`];
              const { ctx, cleanup } = caseContext(run, options, capabilities, seed, notes);
              // Also after a timeout, so the case's namespaces are dropped either way.
              let cleaned: Promise<unknown> | undefined;
              const cleanupOnce = () => (cleaned ??= cleanup());
              testContext.onTestFinished(async () => {
                await cleanupOnce();
              });
              let error: unknown;
              try {
                await run.run(ctx);
              } catch (e) {
                error = e;
              }
              const cleanupError = await cleanupOnce();
              for (const note of notes) {
                // The CLI prints them; under vitest they are annotations, printed too on request.
                if (process.env.PERCOLATOR_CONFORMANCE_NOTES) console.log(`${c.name}: ${note}`);
                await testContext.annotate(note);
              }
              error ??= cleanupError;
              if (error !== undefined) {
                const failure = new Error(failureMessage(error, seed), { cause: error });
                if (error instanceof Error && error.stack)
                  failure.stack = `${failure.message}\n${error.stack}`;
                throw failure;
              }
            },
            caseTimeout(c, scale),
          );
        }
      });
    }
  });
}
