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
  notificationsCommand,
  resolveCommand,
} from './commands.js';
export { EXIT, type ExitCode, NotFoundError, UsageError } from './errors.js';
export {
  BACKENDS,
  type BackendName,
  type CompositeConfig,
  loadCompositeConfig,
  NamespaceNotFoundError,
  type OpenedStore,
  openBackend,
  openComposite,
  parseCompositeConfig,
  type StoreTarget,
  UnreachableError,
} from './open.js';
