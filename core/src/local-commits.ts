/**
 * The commits this client has in flight, by start timestamp: a reader of the same client
 * that meets one of their locks waits for that commit to finish instead of polling the
 * primary with backoff (docs/protocol.md section 5, "A lock of this client"). One process
 * with many concurrent transactions is the common deployment, so most locks a reader
 * meets are its own client's. Waiting decides nothing: when the commit has finished (its
 * locks committed or rolled back, or left behind by a failure), the reader reads the row
 * again and resolves whatever it finds the usual way.
 */
export class LocalCommits {
  private readonly inFlight = new Map<
    number,
    { promise: Promise<void>; resolve: () => void; settling: boolean; rows: readonly string[] }
  >();
  /** Rows (by row id) where a settling commit may still hold a lock, and its start timestamp. */
  private readonly settlingRows = new Map<string, number>();

  /** A commit at `startTs` takes its first lock; call the returned function once it holds none. */
  begin(startTs: number): () => void {
    let resolve!: () => void;
    const promise = new Promise<void>((r) => {
      resolve = r;
    });
    const entry = { promise, resolve, settling: false, rows: [] as readonly string[] };
    this.inFlight.set(startTs, entry);
    return () => {
      if (this.inFlight.get(startTs) === entry) this.inFlight.delete(startTs);
      for (const id of entry.rows) if (this.settlingRows.get(id) === startTs) this.settlingRows.delete(id);
      resolve();
    };
  }

  /**
   * The commit at `startTs` is past its commit point (committing its secondaries) or rolling
   * back: what is left of it waits for no other transaction. `rows` (row ids) are the rows
   * where it may still hold a lock.
   */
  settling(startTs: number, rows: readonly string[]): void {
    const entry = this.inFlight.get(startTs);
    if (!entry) return;
    entry.settling = true;
    entry.rows = rows;
    for (const id of rows) this.settlingRows.set(id, startTs);
  }

  /** Settles when the commit at `startTs` finishes, if this client has it in flight. */
  finished(startTs: number): Promise<void> | undefined {
    return this.inFlight.get(startTs)?.promise;
  }

  /**
   * `finished`, only for a commit that is `settling`: what a prewrite may wait for. A
   * prewrite holds locks of its own, so waiting for a commit that is still prewriting could
   * wait in a circle; a settling one finishes without waiting for anyone.
   */
  finishedSettling(startTs: number): Promise<void> | undefined {
    const entry = this.inFlight.get(startTs);
    return entry?.settling ? entry.promise : undefined;
  }

  /**
   * Settles when every settling commit that may still hold a lock on one of `rows` has
   * finished; undefined if none may. A prewrite waits for this before it sends its batch,
   * so it meets no lock of this client's previous commit on the same rows.
   */
  settlingOn(rows: readonly string[]): Promise<unknown> | undefined {
    if (this.settlingRows.size === 0) return undefined;
    let waits: Promise<void>[] | undefined;
    for (const id of rows) {
      const startTs = this.settlingRows.get(id);
      const entry = startTs === undefined ? undefined : this.inFlight.get(startTs);
      if (entry && !waits?.includes(entry.promise)) (waits ??= []).push(entry.promise);
    }
    return waits && (waits.length === 1 ? waits[0] : Promise.all(waits));
  }

  get size(): number {
    return this.inFlight.size;
  }
}
