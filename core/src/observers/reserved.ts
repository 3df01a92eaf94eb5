/**
 * Columns the framework keeps in user rows. They start with a NUL and a fixed word, are
 * hidden from `tx.scan`, and user code cannot write them (`tx.set` rejects the prefix).
 */
export const RESERVED_COLUMN_PREFIX = '\u0000percolator:';

export function isReservedColumn(column: string): boolean {
  return column.startsWith(RESERVED_COLUMN_PREFIX);
}

/**
 * `ack[c][observer]` (docs/protocol.md section 8): an ordinary MVCC cell in the observed row,
 * holding the startTs of the observer's last successful run. Because it is written by the
 * run's own transaction, two concurrent runs conflict on it like any other write.
 */
export function ackColumn(observer: string, column: string): string {
  return `${RESERVED_COLUMN_PREFIX}ack\u0000${observer}\u0000${column}`;
}

/** The observer and column an ack column belongs to (the inverse of ackColumn), or undefined. */
export function parseAckColumn(name: string): { observer: string; column: string } | undefined {
  const prefix = `${RESERVED_COLUMN_PREFIX}ack\u0000`;
  if (!name.startsWith(prefix)) return undefined;
  // Observer names never hold a NUL (validateObservers); columns may.
  const end = name.indexOf('\u0000', prefix.length);
  if (end < 0) return undefined;
  return { observer: name.slice(prefix.length, end), column: name.slice(end + 1) };
}
