import type { RowStore, StoredRow } from './store.js';

/** Rows per `readMany` call: stores split further if they must (DynamoDB takes 100). */
const MAX_BATCH = 512;

/**
 * Coalesces the row reads a client issues in the same tick (a `Promise.all` of `tx.get`,
 * say) into one `readMany` round trip, on stores that declare `batchRead`. A batch is a set
 * of independent linearizable reads, so each read still happens after the caller asked
 * for it, which is all snapshot reads need. Reads change nothing: a failed batch is
 * retried row by row by `readOne`, with its usual retries.
 */
export class RowReader {
  private pending: Array<{
    readonly table: string;
    readonly key: string;
    readonly resolve: (row: StoredRow | null) => void;
    readonly reject: (error: unknown) => void;
  }> = [];

  constructor(
    private readonly store: RowStore,
    private readonly readOne: (table: string, key: string) => Promise<StoredRow | null>,
  ) {}

  read(table: string, key: string): Promise<StoredRow | null> {
    if (!this.store.capabilities.batchRead || !this.store.readMany) return this.readOne(table, key);
    return new Promise((resolve, reject) => {
      if (this.pending.length === 0) queueMicrotask(() => this.flush());
      this.pending.push({ table, key, resolve, reject });
    });
  }

  private flush(): void {
    const waiting = this.pending;
    this.pending = [];
    for (let i = 0; i < waiting.length; i += MAX_BATCH) void this.readBatch(waiting.slice(i, i + MAX_BATCH));
  }

  private async readBatch(batch: RowReader['pending']): Promise<void> {
    if (batch.length === 1) {
      const [one] = batch;
      return this.readOne(one!.table, one!.key).then(one!.resolve, one!.reject);
    }
    let rows: (StoredRow | null)[] | undefined;
    try {
      rows = await this.store.readMany!(batch.map(({ table, key }) => ({ table, key })));
    } catch {
      rows = undefined;
    }
    // A reply of the wrong length is a broken store: never take a missing entry for "absent".
    if (rows?.length !== batch.length) {
      for (const r of batch) this.readOne(r.table, r.key).then(r.resolve, r.reject);
      return;
    }
    for (const [i, r] of batch.entries()) r.resolve(rows[i]!);
  }
}
