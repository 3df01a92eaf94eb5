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
// A skipped test is a defect here (a backend that cannot be reached must fail the run, not
// skip): any skip or todo fails it, unless a name filter (-t) skipped the tests it left out.
const args = process.argv.slice(2);
const filtered = args.some((a) => a === '-t' || a.startsWith('-t=') || a.startsWith('--testNamePattern'));
const code = run.status === 0 && failed === 0 && passed > 0 && (skipped === 0 || filtered) ? 0 : 1;
console.log(`\n${passed} passed, ${failed} failed, ${skipped} skipped`);
if (skipped > 0 && !filtered) console.log('FAILED: tests were skipped; a skipped test is not allowed');
process.exit(code);
