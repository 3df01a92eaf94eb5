import { mkdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import type { BenchReport } from '../types.js';
import { htmlReport } from './html.js';
import { markdownReport } from './text.js';

export interface WrittenFiles {
  readonly json: string;
  readonly markdown: string;
  readonly html: string;
}

/** Writes results.json, results.md and report.html into `dir` (created if missing). */
export async function writeReports(report: BenchReport, dir: string): Promise<WrittenFiles> {
  const out = resolve(dir);
  await mkdir(out, { recursive: true });
  const files = {
    json: join(out, 'results.json'),
    markdown: join(out, 'results.md'),
    html: join(out, 'report.html'),
  };
  await writeFile(files.json, `${JSON.stringify(report, null, 2)}\n`);
  await writeFile(files.markdown, markdownReport(report));
  await writeFile(files.html, htmlReport(report));
  return files;
}
