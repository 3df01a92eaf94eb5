import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';

const here = (path: string) => fileURLToPath(new URL(path, import.meta.url));

export default defineConfig({
  resolve: {
    // Tests run against the TypeScript sources; `pnpm build` + `scripts/check-exports.mjs`
    // separately prove that the built `exports` maps resolve under plain Node.
    alias: [
      { find: /^@percolator\/core$/, replacement: here('./core/src/index.ts') },
      { find: /^@percolator\/core\/kit$/, replacement: here('./core/src/kit/index.ts') },
      { find: /^@percolator\/conformance$/, replacement: here('./conformance/src/index.ts') },
      { find: /^@percolator\/bench$/, replacement: here('./bench/src/index.ts') },
      { find: /^@percolator\/cli$/, replacement: here('./cli/src/index.ts') },
      { find: /^@percolator\/opentelemetry$/, replacement: here('./opentelemetry/src/index.ts') },
      { find: /^@percolator\/connect$/, replacement: here('./connect/src/index.ts') },
      { find: /^@percolator\/testkit$/, replacement: here('./testkit/src/index.ts') },
      // Subpath exports (`@percolator/testkit/postgres`, `@percolator/testkit/dynamodb`, ...).
      { find: /^@percolator\/testkit\/([a-z-]+)$/, replacement: here('./testkit/src/$1.ts') },
      {
        find: /^@percolator\/(postgres|mysql|redis|dynamodb)$/,
        replacement: here('./adapters/$1/src/index.ts'),
      },
    ],
  },
  test: {
    include: ['**/test/**/*.test.ts'],
    exclude: ['**/node_modules/**', '**/dist/**'],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // Backends are shared servers and the machine has 2 cores: run test files one at a
    // time so protocol tests that depend on lock expiry are not starved.
    fileParallelism: false,
    // Starts the local Redis Cluster once per run (and stops it only if it started it).
    globalSetup: ['scripts/vitest-global-setup.ts'],
  },
});
