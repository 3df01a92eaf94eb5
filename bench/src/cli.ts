#!/usr/bin/env node
/**
 * pnpm bench -- [--backends LIST] [--workloads LIST] [--duration TIME] [--concurrency LIST] ...
 *
 * Runs the benchmark, prints a table on stdout (progress goes to stderr), writes
 * results.json, results.md, summary.md (README-ready) and report.html, and exits 1 if any correctness check failed
 * or any cell had errors (2 on bad arguments). SIGINT or SIGTERM stops the run, drops what
 * it created and exits 130 or 143 without writing a report; a second signal exits at once.
 */
import { constants, realpathSync } from 'node:fs';
import { access, mkdir } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { InvalidArgumentError } from '@percolator/core';
import { type BenchDeps, runBench } from './bench.js';
import { parseOptions, USAGE } from './options.js';
import { stderrProgress } from './progress.js';
import { shellArgs } from './report/format.js';
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
  let report: Awaited<ReturnType<typeof runBench>>;
  try {
    // The report's directory before the run: a bad --out found after it lost the run.
    await usableOutDir(options.outDir);
    report = await runBench(options, stderrProgress(stderr), { command: shellArgs(argv), ...io });
  } catch (error) {
    // Bad arguments found once the run starts (--tracing without the OpenTelemetry packages).
    if (!(error instanceof InvalidArgumentError)) throw error;
    stderr.write(`${error.message}\n`);
    return 2;
  }
  if (report.interrupted) {
    stderr.write(
      `\n${report.interrupted}: stopped; dropped what run ${report.runId} created` +
        `${report.failures.length > 0 ? ` (with ${report.failures.length} failure(s): ${report.failures.join('; ')})` : ''}` +
        '; no report written\n',
    );
    return report.interrupted === 'SIGTERM' ? 143 : 130;
  }
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

/** Makes `dir` (and its parents) if needed, and checks that reports can be written in it. */
async function usableOutDir(dir: string): Promise<void> {
  try {
    await mkdir(dir, { recursive: true });
    await access(dir, constants.W_OK);
  } catch (error) {
    throw new InvalidArgumentError(
      `--out ${JSON.stringify(dir)}: cannot write reports there (${(error as NodeJS.ErrnoException).code ?? String(error)})`,
    );
  }
}

/**
 * Runs the CLI as this process: sets the exit code, and on SIGINT or SIGTERM stops the run
 * and drops everything it created before exiting (a second signal exits at once).
 */
export async function runAsProcess(argv: readonly string[] = process.argv.slice(2)): Promise<void> {
  const controller = new AbortController();
  const onSignal = (signal: NodeJS.Signals) => {
    if (controller.signal.aborted) {
      process.stderr.write(`\n${signal} again: exiting without cleaning up\n`);
      process.exit(signal === 'SIGTERM' ? 143 : 130);
    }
    process.stderr.write(
      `\n${signal}: stopping after the transactions in flight, then dropping what this run created ` +
        '(send it again to exit at once)\n',
    );
    controller.abort(signal);
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  try {
    process.exitCode = await main(argv, { signal: controller.signal });
  } catch (error) {
    process.stderr.write(
      `bench crashed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`,
    );
    process.exitCode = 1;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

/**
 * True when `moduleUrl` is the script node was started with, also through a symlink (an
 * installed bin link): node runs the real file, while argv[1] names the link.
 */
export function isMainModule(moduleUrl: string, script: string | undefined = process.argv[1]): boolean {
  if (!script) return false;
  try {
    return realpathSync(fileURLToPath(moduleUrl)) === realpathSync(script);
  } catch {
    return false;
  }
}

if (isMainModule(import.meta.url)) await runAsProcess();
