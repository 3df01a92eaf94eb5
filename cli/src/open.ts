/**
 * Opening what an operator points at, through @percolator/connect (the one backend list):
 * one backend's store from `--backend`/`--url` (or the adapters' environment variables), a
 * composite deployment from `--config FILE`, or a backend's namespace catalog. Stores are
 * opened without creating anything (`create: false`: SQL `createSchema: false`, DynamoDB
 * without `createTable`), so pointing the CLI at the wrong place never leaves a schema
 * behind. Adapters are loaded only when asked for: they are optional peers.
 */
import {
  BACKENDS as ALL_BACKENDS,
  type CompositeConfig,
  openComposite as connectComposite,
  openNamespaceAdmin as connectNamespaceAdmin,
  type NamespaceAdmin,
  openStore,
  readCompositeConfig,
} from '@percolator/connect';
import { InvalidArgumentError, type RowStore } from '@percolator/core';
import { UsageError } from './errors.js';

/** What the CLI can reach from outside a process: every backend but the in-process memory store. */
export const BACKENDS = ALL_BACKENDS.filter((b) => b !== 'memory') as readonly Exclude<
  (typeof ALL_BACKENDS)[number],
  'memory'
>[];
export type BackendName = (typeof BACKENDS)[number];

/** The adapters' rule for namespaces. */
export const NAMESPACE_NAME = /^[a-z][a-z0-9_]{0,31}$/;
export const DEFAULT_NAMESPACE = 'percolator';

export interface StoreTarget {
  readonly backend: BackendName;
  readonly url?: string;
  readonly namespace?: string;
  /** DynamoDB region and table. */
  readonly region?: string;
  readonly dynamoTable?: string;
}

/** A store opened for the CLI, and how to let go of it. */
export interface OpenedStore {
  readonly store: RowStore;
  /** Where it connects, with any password hidden. */
  readonly target: string;
  close(): Promise<void>;
}

/** The store could not be reached or opened. */
export class UnreachableError extends Error {
  override readonly name = 'UnreachableError';
}

/** The namespace is not there (a SQL store opened without creating its schema). */
export class NamespaceNotFoundError extends Error {
  override readonly name = 'NamespaceNotFoundError';
}

function checkNamespace(namespace: string): string {
  if (!NAMESPACE_NAME.test(namespace))
    throw new UsageError(
      `not a namespace name: ${JSON.stringify(namespace)} (a lowercase letter, then up to 31 of [a-z0-9_])`,
    );
  return namespace;
}

function connectOptions(t: Omit<StoreTarget, 'backend' | 'namespace'>) {
  return {
    ...(t.url === undefined ? {} : { url: t.url }),
    ...(t.region === undefined ? {} : { region: t.region }),
    ...(t.dynamoTable === undefined ? {} : { table: t.dynamoTable }),
  };
}

/**
 * A message of @percolator/connect in the CLI's words: connect names its own `url` option
 * as where a URL came from; here the user passed --url (found in review: "from the
 * connectionString option"). A URL from an environment variable or a config file is named
 * as such by connect already.
 */
export function cliWords(message: string, urlGiven: boolean): string {
  if (!urlGiven) return message;
  return message.replace(/\bfrom the url option\b/g, 'from --url').replace(/^url(?=[ :])/, '--url');
}

/**
 * The DynamoDB table the options name is not there: the adapter's DynamoDbTableNotFoundError
 * anywhere in the causes (found by its name: the adapters are optional peers), as
 * NamespaceNotFoundError (exit 4, "not there", as for a SQL namespace; it was a usage error,
 * exit 2, that told the user to pass an option of the library's API, found by a new user's
 * walkthrough). `store`: the composite config's store it belongs to.
 */
export function dynamoTableNotFound(error: unknown, store?: string): NamespaceNotFoundError | undefined {
  for (let e: unknown = error, depth = 0; e instanceof Object && depth < 8; depth++) {
    if ((e as Error).name === 'DynamoDbTableNotFoundError') {
      const table = (e as { tableName?: unknown }).tableName;
      return new NamespaceNotFoundError(
        `${store === undefined ? '' : `store ${store}: `}DynamoDB table ${typeof table === 'string' ? table : '(unnamed)'} not found: the CLI creates nothing; name the table your clients use (${store === undefined ? '--dynamodb-table or PERCOLATOR_DYNAMODB_TABLE' : 'its table in the config'})`,
      );
    }
    e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}

/** Bad settings are usage errors; anything else while connecting means the store is not reachable. */
async function classify(error: unknown, t: StoreTarget, namespace: string): Promise<Error> {
  if (error instanceof UsageError) return error;
  const noTable = dynamoTableNotFound(error);
  if (noTable) return noTable;
  const urlGiven = t.url !== undefined;
  if (error instanceof InvalidArgumentError) return new UsageError(cliWords(error.message, urlGiven));
  if (
    (t.backend === 'postgres' || t.backend === 'mysql') &&
    missingTable(error) &&
    (await namespaceMissing(t, namespace))
  )
    return new NamespaceNotFoundError(`namespace ${namespace} not found on ${t.backend}`);
  return new UnreachableError(
    `cannot open ${t.backend} namespace ${namespace}: ${cliWords((error as Error).message, urlGiven)}`,
  );
}

/** Opens one backend's store on one namespace. */
export async function openBackend(t: StoreTarget): Promise<OpenedStore> {
  if (!(BACKENDS as readonly string[]).includes(t.backend))
    throw new UsageError(`unknown backend ${JSON.stringify(t.backend)}: one of ${BACKENDS.join(', ')}`);
  const namespace = checkNamespace(t.namespace ?? DEFAULT_NAMESPACE);
  try {
    const opened = await openStore(t.backend, {
      ...connectOptions(t),
      namespace,
      create: false,
      // A small pool for the SQL stores (the others have no pool to size).
      ...(t.backend === 'postgres' || t.backend === 'mysql' ? { maxConnections: 4 } : {}),
    });
    return {
      store: opened.store,
      target: `${t.backend} ${opened.target} namespace ${namespace}`,
      close: () => opened.close(),
    };
  } catch (error) {
    throw await classify(error, t, namespace);
  }
}

/**
 * Whether opening failed on a table or function that is not there (PostgreSQL 42P01 or
 * 42883, MySQL ER_NO_SUCH_TABLE or ER_SP_DOES_NOT_EXIST), anywhere in the causes: only
 * then is the namespace worth looking for. After a connection that was refused or timed
 * out, the look opened a second connection and waited out a second timeout (20 s for one
 * unreachable store, found in review).
 */
export function missingTable(error: unknown): boolean {
  for (let e: unknown = error, depth = 0; e instanceof Object && depth < 8; depth++) {
    const code = (e as { code?: unknown }).code;
    if (
      code === '42P01' ||
      code === '42883' ||
      code === 'ER_NO_SUCH_TABLE' ||
      code === 'ER_SP_DOES_NOT_EXIST'
    )
      return true;
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}

/** After a failed open of a SQL store: whether the server answers and has no such namespace. */
async function namespaceMissing(t: StoreTarget, namespace: string): Promise<boolean> {
  let admin: NamespaceAdmin | undefined;
  try {
    admin = await connectNamespaceAdmin(t.backend, connectOptions(t));
    return !(await admin.list()).some((l) => l.namespace === namespace);
  } catch {
    return false;
  } finally {
    await admin?.close().catch(() => undefined);
  }
}

/** Opens a backend's namespace catalog (namespaces, drop-namespace). */
export async function openNamespaceAdmin(t: Omit<StoreTarget, 'namespace'>): Promise<NamespaceAdmin> {
  if (!(BACKENDS as readonly string[]).includes(t.backend))
    throw new UsageError(`unknown backend ${JSON.stringify(t.backend)}: one of ${BACKENDS.join(', ')}`);
  try {
    return await connectNamespaceAdmin(t.backend, connectOptions(t));
  } catch (error) {
    const urlGiven = t.url !== undefined;
    if (error instanceof InvalidArgumentError) throw new UsageError(cliWords(error.message, urlGiven));
    throw new UnreachableError(`cannot open ${t.backend}: ${cliWords((error as Error).message, urlGiven)}`);
  }
}

// ---------------------------------------------------------------------------------------
// Composite deployments: connect's config file (docs/operations.md)

/**
 * Opens every store of a composite deployment (each never creating anything) and the
 * composite over them, exactly as the file names them (a store without a namespace gets
 * the adapters' default, as in the application).
 */
export async function openComposite(config: CompositeConfig): Promise<OpenedStore> {
  const memory = Object.entries(config.stores).find(([, s]) => s.backend === 'memory');
  if (memory) {
    // As for --backend memory (cli.ts): it would open an empty store of the CLI's own.
    throw new UsageError(
      `composite config: store ${memory[0]} is a memory store, which lives inside one process: nothing outside it can reach it (in code, call the command functions of @percolator/cli on it)`,
    );
  }
  // Exactly the stores the file names, as the application opens them, only never creating.
  const readOnly: CompositeConfig = {
    ...config,
    stores: Object.fromEntries(
      Object.entries(config.stores).map(([name, s]) => [name, { ...s, create: false }]),
    ),
  };
  try {
    const opened = await connectComposite(readOnly);
    return { store: opened.store, target: `composite of ${opened.target}`, close: () => opened.close() };
  } catch (error) {
    if (error instanceof UsageError) throw error;
    for (const [name, s] of Object.entries(config.stores)) {
      const noTable = s.backend === 'dynamodb' ? dynamoTableNotFound(error, name) : undefined;
      if (noTable && (error as Error).message.includes(`stores.${name}:`)) throw noTable;
    }
    if (error instanceof InvalidArgumentError)
      // connect's own messages about the file start with "composite config:" already
      // (it was said twice, found in review).
      throw new UsageError(
        error.message.startsWith('composite config') ? error.message : `composite config: ${error.message}`,
      );
    // A SQL store whose namespace is not there is "not found" (exit 4), as for one backend,
    // not "unreachable" (exit 3, which a script would retry).
    for (const [name, s] of Object.entries(config.stores)) {
      if ((s.backend !== 'postgres' && s.backend !== 'mysql') || !missingTable(error)) continue;
      const url = s.url ?? (s.urlEnv === undefined ? undefined : process.env[s.urlEnv]);
      const namespace = s.namespace ?? DEFAULT_NAMESPACE;
      if (await namespaceMissing({ backend: s.backend, ...(url === undefined ? {} : { url }) }, namespace))
        throw new NamespaceNotFoundError(`store ${name}: namespace ${namespace} not found on ${s.backend}`);
    }
    throw new UnreachableError(`cannot open the composite deployment: ${(error as Error).message}`);
  }
}

export async function loadCompositeConfig(file: string): Promise<CompositeConfig> {
  try {
    return await readCompositeConfig(file);
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
}
