import { mkdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import type { BenchReport } from '../types.js';
import { htmlReport } from './html.js';
import { summaryMarkdown } from './summary.js';
import { markdownReport } from './text.js';

export interface WrittenFiles {
  readonly json: string;
  readonly markdown: string;
  readonly html: string;
  /** README-ready: command, machine, date and the one table. */
  readonly summary: string;
}

/** Writes results.json, results.md, summary.md and report.html into `dir` (created if missing). */
export async function writeReports(report: BenchReport, dir: string): Promise<WrittenFiles> {
  const out = resolve(dir);
  await mkdir(out, { recursive: true });
  const files = {
    json: join(out, 'results.json'),
    markdown: join(out, 'results.md'),
    html: join(out, 'report.html'),
    summary: join(out, 'summary.md'),
  };
  await writeFile(files.json, `${JSON.stringify(report, null, 2)}\n`);
  await writeFile(files.markdown, markdownReport(report));
  await writeFile(files.html, htmlReport(report));
  await writeFile(files.summary, summaryMarkdown(report));
  return files;
}
