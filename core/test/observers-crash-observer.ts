import type { Observer } from '@percolator/core';

/** Where the observer of observers-crash.test.ts counts its committed runs. */
export const TALLY = { table: 'crash_tally', row: 'all', column: 'runs' } as const;

/**
 * Copies <table>/<row>/in to out and adds one to the tally: two rows, so a run commits in
 * two phases, and the tally shows how many runs committed in all. `beforeWrites` lets the
 * crashing child stop inside the handler.
 */
export function crashObserver(table: string, beforeWrites: (row: string) => Promise<void>): Observer {
  return {
    name: 'crash-copy',
    table,
    column: 'in',
    handler: async (tx, { row }) => {
      const value = await tx.getString(table, row, 'in');
      const tally = Number((await tx.getString(TALLY.table, TALLY.row, TALLY.column)) ?? '0');
      await beforeWrites(row);
      tx.set(table, row, 'out', value ?? '');
      tx.set(TALLY.table, TALLY.row, TALLY.column, String(tally + 1));
    },
  };
}
