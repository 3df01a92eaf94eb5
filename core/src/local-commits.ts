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
  private readonly inFlight = new Map<number, { promise: Promise<void>; resolve: () => void }>();

  /** A commit at `startTs` takes its first lock; call the returned function once it holds none. */
  begin(startTs: number): () => void {
    let resolve!: () => void;
    const promise = new Promise<void>((r) => {
      resolve = r;
    });
    const entry = { promise, resolve };
    this.inFlight.set(startTs, entry);
    return () => {
      if (this.inFlight.get(startTs) === entry) this.inFlight.delete(startTs);
      resolve();
    };
  }

  /** Settles when the commit at `startTs` finishes, if this client has it in flight. */
  finished(startTs: number): Promise<void> | undefined {
    return this.inFlight.get(startTs)?.promise;
  }

  get size(): number {
    return this.inFlight.size;
  }
}
