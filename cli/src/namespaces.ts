/**
 * `percolator namespaces` and `percolator drop-namespace NAME --yes` (moved here from the
 * conformance CLI): a store's namespaces from its own catalog (tables by the adapter's
 * naming rule, Redis keys by SCAN, DynamoDB partition keys by Scan), and dropping one.
 * Dropping refuses without --yes (and says what it would drop), refuses a name that is
 * not there, and prints what it dropped. The name must match the adapters' namespace rule
 * and is never spliced into SQL or Lua.
 */
import type { NamespaceAdmin } from '@percolator/connect';
import type { CommandResult } from './commands.js';
import { EXIT, NotFoundError, UsageError } from './errors.js';
import { plural } from './format.js';
import { NAMESPACE_NAME } from './open.js';

export async function namespacesCommand(admin: NamespaceAdmin): Promise<CommandResult<unknown[]>> {
  const listed = await admin.list();
  const width = Math.max(0, ...listed.map((l) => l.namespace.length));
  return {
    code: EXIT.ok,
    data: listed.map((l) => l.record),
    text: [
      `${plural(listed.length, 'namespace')}`,
      ...listed.map((l) => `  ${l.namespace.padEnd(width)}  ${l.detail}`),
    ].join('\n'),
  };
}

export async function dropNamespaceCommand(
  admin: NamespaceAdmin,
  args: { name: string; yes: boolean },
): Promise<
  CommandResult<{ namespace: string; dropped: string | undefined; refused?: string; holds?: string }>
> {
  if (!NAMESPACE_NAME.test(args.name))
    throw new UsageError(
      `not a namespace name: ${JSON.stringify(args.name)} (a lowercase letter, then up to 31 of [a-z0-9_])`,
    );
  const found = (await admin.list()).find((l) => l.namespace === args.name);
  if (found === undefined) throw new NotFoundError(`namespace ${args.name} not found (nothing dropped)`);
  if (!args.yes)
    return {
      code: EXIT.found,
      refused: true,
      // --json says as much as the text: why nothing was dropped, and what would be.
      data: {
        namespace: args.name,
        dropped: undefined,
        refused: 'without --yes: nothing dropped; run again with --yes to drop all of its data',
        holds: found.detail,
      },
      text:
        `refusing to drop namespace ${args.name} without --yes.\n` +
        `  it holds: ${found.detail}\n` +
        '  run again with --yes to drop it (all of its data, for every client using it)',
    };
  const dropped = await admin.drop(args.name);
  if (dropped === undefined)
    throw new NotFoundError(`namespace ${args.name} was gone by the time it was dropped (nothing dropped)`);
  return {
    code: EXIT.ok,
    data: { namespace: args.name, dropped },
    text: `dropped namespace ${args.name}: ${dropped}`,
  };
}
