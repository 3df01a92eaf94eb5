export { type CliIo, COMMANDS, main, runCli, USAGE } from './cli.js';
export {
  type CommandResult,
  formatInspected,
  gcCommand,
  type InspectedCell,
  type InspectedRow,
  inspectCommand,
  inspectRow,
  locksCommand,
  type NotifiedColumn,
  notificationsCommand,
  resolveCommand,
} from './commands.js';
export {
  type DumpArgs,
  type DumpedCell,
  type DumpSink,
  dumpCommand,
  dumpTable,
  dumpTo,
  type ReadCommittedOptions,
  readCommitted,
  showValue,
} from './dump.js';
export { EXIT, type ExitCode, IncompleteError, NotFoundError, UsageError } from './errors.js';
export { dropNamespaceCommand, namespacesCommand } from './namespaces.js';
export {
  BACKENDS,
  type BackendName,
  loadCompositeConfig,
  NamespaceNotFoundError,
  type OpenedStore,
  openBackend,
  openComposite,
  openNamespaceAdmin,
  type StoreTarget,
  UnreachableError,
} from './open.js';
