/**
 * percolator-conformance --backend memory|postgres|mysql|redis|redis-cluster|dynamodb [--url URL]
 *   [--parts store,protocol,history,faults,observers] [--scale N] [--seed N] [--grep TEXT]
 *   [--region R] [--table T] [--json]
 *
 * Runs the conformance suite against one backend, prints a pass/fail table per part, and
 * exits 1 if any case failed (2 on a usage or connection error). In this repository:
 * `pnpm conformance -- --backend ...` (builds first).
 *
 * Operator commands (inspect, dump, locks, resolve, gc, namespaces, drop-namespace) are in the
 * `percolator` CLI (@percolator/cli, docs/operations.md).
 */
import { realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { BACKENDS, type Backend, type BackendName, DEFAULT_SCALES, openBackend } from './backends.js';
import { defaultSeed } from './random.js';
import { runConformance } from './runner.js';
import { PARTS, type Part, type Report } from './types.js';

const USAGE = `usage: percolator-conformance --backend <${BACKENDS.join('|')}> [options]
       (in this repository: pnpm conformance -- --backend <name> [options])
  --url URL        connection URL (postgres://, mysql://, redis://; redis-cluster: host:port,host:port;
                   dynamodb: endpoint). Default: the adapter's env variable or local default
  --parts LIST     comma-separated parts: ${PARTS.join(',')} (default: all)
  --scale N        workload size multiplier (default per backend, memory 1)
  --seed N         seed for every random choice (default PERCOLATOR_SEED or a fixed seed)
  --grep TEXT      only cases whose "part: name" contains TEXT
  --region R       DynamoDB region      --table T   DynamoDB table name
  --json           print the report as JSON after the table
To look inside a deployment (inspect, dump, locks, resolve, gc, namespaces, drop-namespace),
use the operator CLI: percolator --help (@percolator/cli; in this repository pnpm percolator).`;

/** Operator commands that moved to @percolator/cli. */
const MOVED_COMMANDS = ['dump', 'inspect', 'namespaces', 'drop-namespace', 'locks', 'resolve', 'gc'];

class UsageError extends Error {}

export interface CliArgs {
  readonly backend: BackendName;
  readonly url?: string;
  readonly region?: string;
  readonly table?: string;
  readonly parts?: Part[];
  readonly grep?: string;
  readonly json: boolean;
  readonly help: boolean;
  readonly scale: number;
  readonly seed: number;
}

export function parseCliArgs(argv: readonly string[]): CliArgs {
  let values: Record<string, string | boolean | undefined>;
  try {
    ({ values } = parseArgs({
      // `pnpm conformance -- --backend x` passes the "--" through.
      args: argv.filter((a) => a !== '--'),
      options: {
        backend: { type: 'string' },
        url: { type: 'string' },
        parts: { type: 'string' },
        scale: { type: 'string' },
        seed: { type: 'string' },
        grep: { type: 'string' },
        region: { type: 'string' },
        table: { type: 'string' },
        json: { type: 'boolean' },
        help: { type: 'boolean', short: 'h' },
      },
    }));
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
  const help = values.help === true;
  const backend = String(values.backend ?? (help ? 'memory' : ''));
  if (!BACKENDS.includes(backend as BackendName))
    throw new UsageError(`--backend must be one of ${BACKENDS.join(', ')}`);
  const parts =
    values.parts === undefined
      ? undefined
      : String(values.parts)
          .split(',')
          .map((p) => p.trim());
  for (const part of parts ?? [])
    if (!PARTS.includes(part as Part)) throw new UsageError(`unknown part "${part}"`);
  const scale = values.scale === undefined ? DEFAULT_SCALES[backend as BackendName] : Number(values.scale);
  if (!(scale > 0)) throw new UsageError('--scale must be a positive number');
  const seed = values.seed === undefined ? defaultSeed() : Number(values.seed);
  if (!Number.isInteger(seed) || seed < 0) throw new UsageError('--seed must be a non-negative integer');
  return {
    backend: backend as BackendName,
    url: values.url as string | undefined,
    region: values.region as string | undefined,
    table: values.table as string | undefined,
    parts: parts as Part[] | undefined,
    grep: values.grep as string | undefined,
    json: values.json === true,
    help,
    scale,
    seed,
  };
}

function seconds(ms: number): string {
  return `${(ms / 1000).toFixed(1)}s`;
}

export function formatTable(report: Report): string {
  const rows = [['part', 'pass', 'fail', 'not declared', 'time']];
  let pass = 0;
  let failed = 0;
  let notDeclared = 0;
  for (const part of PARTS) {
    const s = report.parts[part];
    if (s === undefined) continue;
    rows.push([part, String(s.pass), String(s.fail), String(s.notDeclared), seconds(s.durationMs)]);
    pass += s.pass;
    failed += s.fail;
    notDeclared += s.notDeclared;
  }
  rows.push(['total', String(pass), String(failed), String(notDeclared), seconds(report.durationMs)]);
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  const line = (r: string[]) =>
    r.map((cell, i) => (i === 0 ? cell.padEnd(widths[i]!) : cell.padStart(widths[i]!))).join('  ');
  const rule = widths.map((w) => '-'.repeat(w)).join('  ');
  return [line(rows[0]!), rule, ...rows.slice(1, -1).map(line), rule, line(rows[rows.length - 1]!)].join(
    '\n',
  );
}

export interface CliIo {
  readonly out: (text: string) => void;
  readonly err: (text: string) => void;
  /** Replaces the backend factories (tests). */
  readonly openBackend?: typeof openBackend;
}

const processIo: CliIo = {
  out: (text) => process.stdout.write(text),
  err: (text) => process.stderr.write(text),
};

/** Runs the CLI; resolves to the exit code: 0 all passed, 1 a case failed, 2 usage or connection error. */
export async function runCli(argv: readonly string[], io: CliIo = processIo): Promise<number> {
  const moved = argv.find((a) => a !== '--');
  if (moved !== undefined && MOVED_COMMANDS.includes(moved)) {
    io.err(
      `percolator-conformance runs the conformance suite only; "${moved}" is a command of the operator CLI: percolator ${moved} --help (@percolator/cli)\n`,
    );
    return 2;
  }
  let args: CliArgs;
  try {
    args = parseCliArgs(argv);
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    io.err(`${error.message}\n\n${USAGE}\n`);
    return 2;
  }
  if (args.help) {
    io.out(`${USAGE}\n`);
    return 0;
  }
  let backend: Backend;
  try {
    backend = await (io.openBackend ?? openBackend)(args.backend, args);
  } catch (error) {
    io.err(`cannot open backend ${args.backend}: ${(error as Error).message}\n`);
    return 2;
  }
  io.out(
    `percolator conformance: ${args.backend} at ${backend.target} (seed ${args.seed}, scale ${args.scale})\n`,
  );
  let report: Report;
  try {
    report = await runConformance({
      name: args.backend,
      createStore: () => backend.createStore(),
      destroyStore: (store) => backend.destroyStore(store),
      parts: args.parts,
      grep: args.grep,
      scale: args.scale,
      seed: args.seed,
      onResult: (r) => {
        const mark = r.status === 'pass' ? 'ok  ' : r.status === 'fail' ? 'FAIL' : 'n/a ';
        io.out(`${mark} ${r.part}: ${r.name} (${r.durationMs} ms)\n`);
        for (const note of r.notes) io.out(`       ${note.split('\n').join('\n       ')}\n`);
        if (r.error) io.out(`       ${r.error.split('\n').join('\n       ')}\n`);
      },
    });
  } catch (error) {
    io.err(`the conformance run could not start: ${(error as Error).message}\n`);
    return 2;
  } finally {
    await backend.close().catch(() => undefined);
  }
  io.out(`\n${formatTable(report)}\n\n`);
  const failed = report.results.filter((r) => r.status === 'fail');
  if (failed.length > 0) {
    io.out(`FAILED: ${failed.length} case(s) on ${args.backend} (seed ${report.seed}):\n`);
    for (const r of failed) io.out(`  - ${r.part}: ${r.name}\n`);
  } else {
    io.out(`PASSED: ${args.backend} (seed ${report.seed})\n`);
  }
  if (args.json) io.out(`${JSON.stringify(report, null, 2)}\n`);
  return report.ok ? 0 : 1;
}

/** Runs the CLI on this process's arguments and exits with its code. `bin.js` calls it. */
export async function main(argv: readonly string[] = process.argv.slice(2)): Promise<never> {
  let code: number;
  try {
    code = await runCli(argv);
  } catch (error) {
    process.stderr.write(`percolator-conformance: ${(error as Error).stack ?? String(error)}\n`);
    code = 2;
  }
  // Adapters may hold sockets (pools, clients) open; the verdict is in the exit code.
  process.exit(code);
}

/**
 * Whether `file` (process.argv[1]) is this module. Both sides are real paths: an installed
 * bin is a symlink (node_modules/.bin/percolator-conformance -> ../@percolator/conformance/
 * dist/bin.js, and pnpm links the package itself), while import.meta.url is always the
 * resolved file, so comparing the raw paths is false there and the CLI would do nothing.
 */
export function isMainModule(file: string | undefined, moduleUrl: string = import.meta.url): boolean {
  if (file === undefined) return false;
  try {
    return realpathSync(file) === realpathSync(fileURLToPath(moduleUrl));
  } catch {
    return false;
  }
}

// `node conformance/dist/cli.js ...` still works; the package's bin is dist/bin.js.
if (isMainModule(process.argv[1])) await main();
