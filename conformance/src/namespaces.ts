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
import { BACKENDS, type BackendName, load } from './backends.js';

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

/** One namespace as listed: its name, a one-line description, and the adapter's record. */
interface Listed {
  readonly namespace: string;
  readonly detail: string;
  readonly record: unknown;
}

/** What the CLI needs of an adapter: list, drop (undefined when not there), close. */
export interface NamespaceAdmin {
  /** Where it connects, with any password hidden. */
  readonly target: string;
  list(): Promise<Listed[]>;
  drop(namespace: string): Promise<string | undefined>;
  close(): Promise<void>;
}

function redact(url: string): string {
  return url.replace(/\/\/([^:@/]*):[^@/]*@/, '//$1:***@');
}

type Fn = (...args: never[]) => Promise<unknown>;

function exported<T extends Fn>(module: Record<string, unknown>, name: string, specifier: string): T {
  const fn = module[name];
  if (typeof fn !== 'function')
    throw new Error(`${specifier} does not export ${name}() (is it built and current?)`);
  return fn as T;
}

interface SqlRecord {
  readonly namespace: string;
  readonly objects: string[];
  readonly complete: boolean;
}

function sqlDetail(r: SqlRecord): string {
  return `${r.objects.join(', ')}${r.complete ? '' : '  (incomplete)'}`;
}

async function sqlAdmin(
  specifier: string,
  listName: string,
  dropName: string,
  options: Record<string, unknown>,
  target: string,
): Promise<NamespaceAdmin> {
  const module = await load(specifier);
  const list = exported<(o: unknown) => Promise<SqlRecord[]>>(module, listName, specifier);
  const drop = exported<(n: string, o: unknown) => Promise<SqlRecord | undefined>>(
    module,
    dropName,
    specifier,
  );
  return {
    target,
    list: async () =>
      (await list(options)).map((r) => ({ namespace: r.namespace, detail: sqlDetail(r), record: r })),
    drop: async (namespace) => {
      const dropped = await drop(namespace, options);
      return dropped === undefined ? undefined : dropped.objects.join(', ');
    },
    close: async () => {},
  };
}

interface KeyRecord {
  readonly namespace: string;
  readonly keys?: number;
  readonly items?: number;
  readonly kinds: Record<string, number>;
}

function countDetail(r: KeyRecord, unit: string): string {
  const total = r.keys ?? r.items ?? 0;
  const kinds = Object.entries(r.kinds)
    .filter(([, n]) => n > 0)
    .map(([kind, n]) => `${kind} ${n}`)
    .join(', ');
  return `${total} ${unit}${total === 1 ? '' : 's'} (${kinds})`;
}

interface QuittableClient {
  quit(): Promise<unknown>;
  on(event: 'error', listener: (error: unknown) => void): unknown;
}

async function redisAdmin(args: NamespaceArgs): Promise<NamespaceAdmin> {
  const spec = '@percolator/redis';
  const module = await load(spec);
  const list = exported<(o: unknown) => Promise<KeyRecord[]>>(module, 'listRedisNamespaces', spec);
  const drop = exported<(n: string, o: unknown) => Promise<{ keys: number } | undefined>>(
    module,
    'dropRedisNamespace',
    spec,
  );
  let options: Record<string, unknown>;
  let target: string;
  let client: QuittableClient | undefined;
  if (args.backend === 'redis') {
    const url = args.url ?? (module.defaultRedisUrl as () => string)();
    options = { url };
    target = redact(url);
  } else {
    const { createRedisClusterClient, parseNodes, defaultClusterNodes } = module as unknown as {
      createRedisClusterClient: (nodes: unknown) => QuittableClient;
      parseNodes: (list: string, source?: string) => unknown;
      defaultClusterNodes: () => unknown;
    };
    const list = args.url?.replace(/^rediss?:\/\//, '');
    const nodes = list ? parseNodes(list, '--url') : defaultClusterNodes();
    client = createRedisClusterClient(nodes);
    client.on('error', () => undefined);
    options = { client };
    target = JSON.stringify(nodes);
  }
  return {
    target,
    list: async () =>
      (await list(options)).map((r) => ({
        namespace: r.namespace,
        detail: countDetail(r, 'key'),
        record: r,
      })),
    drop: async (namespace) => {
      const dropped = await drop(namespace, options);
      return dropped === undefined ? undefined : `${dropped.keys} key${dropped.keys === 1 ? '' : 's'}`;
    },
    close: async () => {
      await client?.quit().catch(() => undefined);
    },
  };
}

async function dynamoDbAdmin(args: NamespaceArgs): Promise<NamespaceAdmin> {
  const spec = '@percolator/dynamodb';
  const endpoint = args.url ?? process.env.PERCOLATOR_DYNAMODB_ENDPOINT;
  if (!endpoint) {
    // A DynamoDB Local started for this command would be empty.
    throw new UsageError('dynamodb: pass --url (the endpoint) or set PERCOLATOR_DYNAMODB_ENDPOINT');
  }
  const module = await load(spec);
  const list = exported<(o: unknown) => Promise<KeyRecord[]>>(module, 'listDynamoDbNamespaces', spec);
  const drop = exported<(n: string, o: unknown) => Promise<{ items: number } | undefined>>(
    module,
    'dropDynamoDbNamespace',
    spec,
  );
  const region = args.region ?? (process.env.AWS_REGION || process.env.AWS_DEFAULT_REGION || 'us-east-1');
  const tableName = args.table ?? (process.env.PERCOLATOR_DYNAMODB_TABLE || 'percolator_test');
  // DynamoDB Local wants some credentials, whatever they are.
  const loopback = /^https?:\/\/(127\.0\.0\.1|localhost|\[::1\])[:/]/.test(endpoint);
  let credentials: unknown;
  if (loopback && !process.env.AWS_ACCESS_KEY_ID) {
    const local = (await load(`${spec}/local`)) as { LOCAL_CREDENTIALS?: Record<string, string> };
    credentials = local.LOCAL_CREDENTIALS ? { ...local.LOCAL_CREDENTIALS } : undefined;
  }
  const options = { endpoint, region, tableName, ...(credentials ? { credentials } : {}) };
  return {
    target: `${endpoint} table ${tableName}`,
    list: async () =>
      (await list(options)).map((r) => ({
        namespace: r.namespace,
        detail: countDetail(r, 'item'),
        record: r,
      })),
    drop: async (namespace) => {
      const dropped = await drop(namespace, options);
      return dropped === undefined ? undefined : `${dropped.items} item${dropped.items === 1 ? '' : 's'}`;
    },
    close: async () => {},
  };
}

export async function openNamespaceAdmin(args: NamespaceArgs): Promise<NamespaceAdmin> {
  switch (args.backend) {
    case 'postgres': {
      const url = args.url ?? process.env.PERCOLATOR_POSTGRES_URL;
      return sqlAdmin(
        '@percolator/postgres',
        'listPostgresNamespaces',
        'dropPostgresNamespace',
        url === undefined ? {} : { connectionString: url },
        redact(url ?? 'postgres://postgres@127.0.0.1:5432/test'),
      );
    }
    case 'mysql': {
      const url = args.url ?? process.env.PERCOLATOR_MYSQL_URL;
      return sqlAdmin(
        '@percolator/mysql',
        'listMySqlNamespaces',
        'dropMySqlNamespace',
        url === undefined ? {} : { uri: url },
        redact(url ?? 'mysql://root@127.0.0.1:3306/test'),
      );
    }
    case 'redis':
    case 'redis-cluster':
      return redisAdmin(args);
    case 'dynamodb':
      return dynamoDbAdmin(args);
  }
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
