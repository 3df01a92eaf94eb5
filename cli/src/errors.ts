/**
 * Exit codes (docs/operations.md), so scripts can tell the cases apart:
 * 0 done, nothing wrong found; 1 a problem found or left (locks listed, a live lock not
 * settled or waited out, commit records gc could not settle, a row that cannot be decoded);
 * 2 bad usage (arguments, names, config file); 3 the store could not be reached
 * or failed; 4 not there (no such row, a table with no rows, a namespace that does not exist).
 */
export const EXIT = { ok: 0, found: 1, usage: 2, unreachable: 3, notFound: 4 } as const;
export type ExitCode = (typeof EXIT)[keyof typeof EXIT];

/** Bad arguments: printed with the command's usage, exit 2. */
export class UsageError extends Error {
  override readonly name = 'UsageError';
}

/** Nothing there to work on: exit 4. */
export class NotFoundError extends Error {
  override readonly name = 'NotFoundError';
}

/**
 * A command that failed part way, after it had changed something (gc freed some rows,
 * resolve settled some locks): `done` says what, and is printed before the failure, whose
 * exit code stands. Those changes stay made: running the command again carries on.
 */
export class IncompleteError extends Error {
  override readonly name = 'IncompleteError';
  constructor(
    readonly done: string,
    override readonly cause: unknown,
  ) {
    super(cause instanceof Error ? cause.message : String(cause));
  }
}
