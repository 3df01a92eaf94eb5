#!/usr/bin/env node
/**
 * pnpm soak -- --backend NAME [--duration 1h] [--interval 10s] [--json] ...
 * pnpm soak -- summarize RUN.json...   (the docs table of finished runs)
 *
 * Runs the soak (soak.ts) against one backend, prints a line per sample on stderr and the
 * report on stdout (a table, or JSON with --json), and exits 0 when every check passed,
 * 1 when one failed or a metric grew without bound, 2 on bad arguments. SIGINT or SIGTERM
 * stops the workloads early; the final checks and cleanup still run, and it exits 130/143.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { InvalidArgumentError } from '@percolator/core';
import { isMainModule } from '../cli.js';
import { parseSoakOptions, SOAK_USAGE } from './options.js';
import { sampleLine, soakGrowthTable, soakSummaryTable, soakTable } from './report.js';
import { judgeMetrics, runSoak, type SoakReport, soakFailures } from './soak.js';

/**
 * `summarize FILE...`: the docs table of finished runs from their --out JSON files, with
 * each run judged again by the current rule (soakSummaryTable).
 */
function summarize(files: readonly string[]): number {
  const runs = files.map((file) => {
    const report = JSON.parse(readFileSync(file, 'utf8')) as SoakReport;
    const growth = judgeMetrics(report.samples, report.options.warmupMs, report.options.observedRows);
    const rejudged = soakFailures({
      checks: report.checks,
      growth,
      samples: report.samples,
      ranMs: report.ranMs,
      totals: report.totals,
      ...(report.interrupted ? { interrupted: report.interrupted } : {}),
    });
    return { report, rejudged, growth };
  });
  process.stdout.write(`${soakSummaryTable(runs)}\n\n${soakGrowthTable(runs)}\n`);
  return 0;
}

export async function soakMain(argv: readonly string[], signal?: AbortSignal): Promise<number> {
  if (argv[0] === 'summarize' || (argv[0] === '--' && argv[1] === 'summarize'))
    return summarize(argv.slice(argv.indexOf('summarize') + 1));
  let options: ReturnType<typeof parseSoakOptions>;
  try {
    options = parseSoakOptions(argv);
  } catch (error) {
    if (!(error instanceof InvalidArgumentError)) throw error;
    process.stderr.write(`${error.message}\n\n${SOAK_USAGE}\n`);
    return 2;
  }
  if (options.help) {
    process.stdout.write(`${SOAK_USAGE}\n`);
    return 0;
  }
  const report = await runSoak(options, {
    ...(signal ? { signal } : {}),
    log: (line) => process.stderr.write(`${line}\n`),
    onSample: (sample) => process.stderr.write(`${sampleLine(sample)}\n`),
  });
  const json = `${JSON.stringify(report, null, 2)}\n`;
  if (options.out) writeFileSync(options.out, json);
  process.stdout.write(options.json ? json : soakTable(report));
  if (report.interrupted) return report.interrupted === 'SIGTERM' ? 143 : 130;
  return report.ok ? 0 : 1;
}

export async function runSoakProcess(argv: readonly string[] = process.argv.slice(2)): Promise<void> {
  const controller = new AbortController();
  const onSignal = (signal: NodeJS.Signals) => {
    if (controller.signal.aborted) {
      process.stderr.write(`\n${signal} again: exiting without cleaning up\n`);
      process.exit(signal === 'SIGTERM' ? 143 : 130);
    }
    process.stderr.write(`\n${signal}: stopping the workloads, then the final checks and cleanup\n`);
    controller.abort(signal);
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  try {
    process.exitCode = await soakMain(argv, controller.signal);
  } catch (error) {
    process.stderr.write(
      `soak crashed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`,
    );
    process.exitCode = 1;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

if (isMainModule(import.meta.url)) await runSoakProcess();
