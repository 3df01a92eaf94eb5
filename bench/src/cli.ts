#!/usr/bin/env node
/**
 * pnpm bench -- [--backends LIST] [--workloads LIST] [--duration TIME] [--concurrency LIST] ...
 *
 * Runs the benchmark, prints a table on stdout (progress goes to stderr), writes
 * results.json, results.md, summary.md (README-ready) and report.html, and exits 1 if any correctness check failed
 * or any cell had errors (2 on bad arguments).
 */
import { pathToFileURL } from 'node:url';
import { InvalidArgumentError } from '@percolator/core';
import { type BenchDeps, runBench } from './bench.js';
import { parseOptions, USAGE } from './options.js';
import { stderrProgress } from './progress.js';
import { markdownReport, terminalTable } from './report/text.js';
import { writeReports } from './report/write.js';

export interface CliIo extends BenchDeps {
  readonly stdout?: NodeJS.WritableStream;
  readonly stderr?: NodeJS.WriteStream;
}

export async function main(argv: readonly string[], io: CliIo = {}): Promise<number> {
  const stdout = io.stdout ?? process.stdout;
  const stderr = io.stderr ?? process.stderr;
  let options: ReturnType<typeof parseOptions>;
  try {
    options = parseOptions(argv);
  } catch (error) {
    if (!(error instanceof InvalidArgumentError)) throw error;
    stderr.write(`${error.message}\n\n${USAGE}\n`);
    return 2;
  }
  if (options.help) {
    stdout.write(`${USAGE}\n`);
    return 0;
  }
  const report = await runBench(options, stderrProgress(stderr), { command: argv.join(' '), ...io });
  stdout.write(`\n${terminalTable(report)}`);
  if (options.markdown) stdout.write(`\n${markdownReport(report)}`);
  const files = await writeReports(report, options.outDir);
  stderr.write(
    `\nwrote ${files.json}\n      ${files.markdown}\n      ${files.html}\n      ${files.summary} (for the README)\n`,
  );
  if (report.failures.length > 0) {
    stderr.write(
      `\n${report.failures.length} FAILURE(S):\n${report.failures.map((f) => `  - ${f}`).join('\n')}\n`,
    );
    return 1;
  }
  return 0;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  main(process.argv.slice(2)).then(
    (code) => {
      process.exitCode = code;
    },
    (error: unknown) => {
      process.stderr.write(
        `bench crashed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`,
      );
      process.exitCode = 1;
    },
  );
}
