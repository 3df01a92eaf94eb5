/**
 * percolator-conformance namespaces --backend postgres|mysql|redis|redis-cluster|dynamodb [--url URL] [--json]
 * percolator-conformance drop-namespace NAME --backend ... [--url URL] --yes
 *
 * Lists the namespaces a store holds (from its own catalog: tables by the adapter's
 * naming rule and shape, Redis keys by SCAN, DynamoDB partition keys by Scan), and drops
 * one. Dropping refuses without --yes (and then says what it would drop), refuses a name
 * that is not there, and prints what it dropped. The name must match the adapters'
 * namespace rule and is never spliced into SQL or Lua: the adapters build identifiers
 * from the validated name and fixed suffixes only.
 *
 * Exit codes: 0 done; 1 refused (no --yes) or not found; 2 bad usage or the store could
 * not be reached (or failed).
 */
import { parseArgs } from 'node:util';
import type * as Connect from '@percolator/connect';
import { BACKENDS, type BackendName, connect } from './backends.js';

export const NAMESPACE_COMMANDS = ['namespaces', 'drop-namespace'] as const;
export type NamespaceCommand = (typeof NAMESPACE_COMMANDS)[number];

/** The adapters' rule for namespaces (NAMESPACE_PATTERN in each adapter). */
export const NAMESPACE_NAME = /^[a-z][a-z0-9_]{0,31}$/;

const BACKEND_LIST = BACKENDS.filter((b) => b !== 'memory').join('|');
export const NAMESPACES_USAGE = `usage: percolator-conformance namespaces --backend <${BACKEND_LIST}> [--url URL] [--json]
       percolator-conformance drop-namespace NAME --backend <${BACKEND_LIST}> [--url URL] --yes
  --url URL        connection URL as for a conformance run (dynamodb: the endpoint, required
                   unless PERCOLATOR_DYNAMODB_ENDPOINT is set)
  --region R       DynamoDB region      --table T   DynamoDB table name (default percolator_test)
  --yes            really drop (without it, drop-namespace only says what it would drop)
  --json           print the namespaces as JSON
Exit codes: 0 done, 1 refused or not found, 2 bad usage or store unreachable.`;

class UsageError extends Error {}

interface NamespaceArgs {
  readonly command: NamespaceCommand;
  readonly name?: string;
  readonly backend: Exclude<BackendName, 'memory'>;
  readonly url?: string;
  readonly region?: string;
  readonly table?: string;
  readonly yes: boolean;
  readonly json: boolean;
}

/** Whether argv asks for a namespace command (its first word). */
export function isNamespaceCommand(argv: readonly string[]): boolean {
  const first = argv.find((a) => a !== '--');
  return first !== undefined && (NAMESPACE_COMMANDS as readonly string[]).includes(first);
}

function parse(argv: readonly string[]): NamespaceArgs | 'help' {
  let values: Record<string, string | boolean | undefined>;
  let positionals: string[];
  try {
    ({ values, positionals } = parseArgs({
      args: argv.filter((a) => a !== '--'),
      allowPositionals: true,
      options: {
        backend: { type: 'string' },
        url: { type: 'string' },
        region: { type: 'string' },
        table: { type: 'string' },
        yes: { type: 'boolean' },
        json: { type: 'boolean' },
        help: { type: 'boolean', short: 'h' },
      },
    }));
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
  if (values.help === true) return 'help';
  const [command, ...rest] = positionals as [NamespaceCommand, ...string[]];
  if (command === 'namespaces' && rest.length > 0)
    throw new UsageError(`namespaces takes no name (got ${rest.join(' ')})`);
  if (command === 'drop-namespace' && rest.length !== 1)
    throw new UsageError('drop-namespace takes exactly one NAME');
  const name = command === 'drop-namespace' ? rest[0]! : undefined;
  if (name !== undefined && !NAMESPACE_NAME.test(name))
    throw new UsageError(
      `not a namespace name: ${JSON.stringify(name)} (a lowercase letter, then up to 31 of [a-z0-9_])`,
    );
  const backend = String(values.backend ?? '');
  if (backend === 'memory')
    throw new UsageError('the memory store lives inside one process: it has no namespaces to list or drop');
  if (!BACKENDS.includes(backend as BackendName))
    throw new UsageError(`--backend must be one of ${BACKEND_LIST.split('|').join(', ')}`);
  if (values.yes === true && command === 'namespaces') throw new UsageError('--yes is for drop-namespace');
  return {
    command,
    name,
    backend: backend as NamespaceArgs['backend'],
    url: values.url as string | undefined,
    region: values.region as string | undefined,
    table: values.table as string | undefined,
    yes: values.yes === true,
    json: values.json === true,
  };
}

type Listed = Connect.ListedNamespace;
export type NamespaceAdmin = Connect.NamespaceAdmin;

export async function openNamespaceAdmin(args: NamespaceArgs): Promise<NamespaceAdmin> {
  if (args.backend === 'dynamodb' && connect.configuredUrl('dynamodb', { url: args.url }) === undefined) {
    // A DynamoDB Local started for this command would be empty.
    throw new UsageError('dynamodb: pass --url (the endpoint) or set PERCOLATOR_DYNAMODB_ENDPOINT');
  }
  return connect.openNamespaceAdmin(args.backend, {
    ...(args.url === undefined ? {} : { url: args.url }),
    ...(args.region === undefined ? {} : { region: args.region }),
    ...(args.table === undefined ? {} : { table: args.table }),
  });
}

export interface NamespaceIo {
  readonly out: (text: string) => void;
  readonly err: (text: string) => void;
}

/** Runs `namespaces` or `drop-namespace`; resolves to the exit code (0 done, 1 refused / not found, 2 usage / store). */
export async function runNamespaceCli(argv: readonly string[], io: NamespaceIo): Promise<number> {
  let args: NamespaceArgs | 'help';
  let admin: NamespaceAdmin;
  try {
    args = parse(argv);
    if (args === 'help') {
      io.out(`${NAMESPACES_USAGE}\n`);
      return 0;
    }
    admin = await openNamespaceAdmin(args);
  } catch (error) {
    if (error instanceof UsageError) {
      io.err(`${error.message}\n\n${NAMESPACES_USAGE}\n`);
      return 2;
    }
    io.err(`cannot open backend: ${(error as Error).message}\n`);
    return 2;
  }
  const where = `${args.backend} at ${admin.target}`;
  try {
    let listed: Listed[];
    try {
      listed = await admin.list();
    } catch (error) {
      io.err(`cannot list namespaces on ${where}: ${(error as Error).message}\n`);
      return 2;
    }
    if (args.command === 'namespaces') {
      if (args.json) {
        io.out(
          `${JSON.stringify(
            listed.map((l) => l.record),
            null,
            2,
          )}\n`,
        );
        return 0;
      }
      io.out(`${listed.length} namespace${listed.length === 1 ? '' : 's'} on ${where}\n`);
      const width = Math.max(0, ...listed.map((l) => l.namespace.length));
      for (const l of listed) io.out(`  ${l.namespace.padEnd(width)}  ${l.detail}\n`);
      return 0;
    }
    const name = args.name!;
    const found = listed.find((l) => l.namespace === name);
    if (found === undefined) {
      io.err(`namespace ${name} not found on ${where}; nothing dropped\n`);
      return 1;
    }
    if (!args.yes) {
      io.err(
        `refusing to drop namespace ${name} on ${where} without --yes.\n` +
          `  it holds: ${found.detail}\n` +
          `  run again with --yes to drop it (all of its data, for every client using it)\n`,
      );
      return 1;
    }
    let dropped: string | undefined;
    try {
      dropped = await admin.drop(name);
    } catch (error) {
      io.err(`dropping namespace ${name} on ${where} failed: ${(error as Error).message}\n`);
      return 2;
    }
    if (dropped === undefined) {
      io.err(`namespace ${name} was gone by the time it was dropped (on ${where}); nothing dropped\n`);
      return 1;
    }
    io.out(`dropped namespace ${name} on ${where}: ${dropped}\n`);
    return 0;
  } finally {
    await admin.close().catch(() => undefined);
  }
}
