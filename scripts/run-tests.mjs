// Runs vitest and ends with one plain closing line, "N passed, N failed", for CI.
import { spawnSync } from 'node:child_process';
import { readFileSync, rmSync } from 'node:fs';

const out = '.vitest-results.json';
rmSync(out, { force: true });
const run = spawnSync(
  'pnpm',
  [
    'exec',
    'vitest',
    'run',
    '--reporter=default',
    '--reporter=json',
    `--outputFile=${out}`,
    ...process.argv.slice(2),
  ],
  { stdio: 'inherit' },
);
let passed = 0;
let failed = 0;
let skipped = 0;
try {
  const results = JSON.parse(readFileSync(out, 'utf8'));
  passed = results.numPassedTests;
  failed = results.numFailedTests + (results.numFailedTestSuites ?? 0);
  skipped = results.numPendingTests + results.numTodoTests;
} catch {
  failed = Math.max(failed, 1);
}
const code = run.status === 0 && failed === 0 && passed > 0 ? 0 : 1;
console.log(`\n${passed} passed, ${failed} failed, ${skipped} skipped`);
process.exit(code);
