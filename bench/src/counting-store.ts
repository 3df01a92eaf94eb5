import type {
  CasRequest,
  CasResult,
  NotificationScanOptions,
  RowRef,
  RowStore,
  ScannedStoredRow,
  ScanOptions,
  StoredRow,
} from '@percolator/core';

/** Calls per RowStore method, as counted by a CountingStore. */
export type CallCounts = Record<
  | 'read'
  | 'checkAndSet'
  | 'readMany'
  | 'checkAndSetMany'
  | 'scan'
  | 'incrementCounter'
  | 'scanNotified'
  | 'checkAndSetStamped',
  number
>;

function zeroCounts(): CallCounts {
  return {
    read: 0,
    checkAndSet: 0,
    readMany: 0,
    checkAndSetMany: 0,
    scan: 0,
    incrementCounter: 0,
    scanNotified: 0,
    checkAndSetStamped: 0,
  };
}

/**
 * A RowStore that forwards every call to `inner` and counts it, so round trips per
 * transaction are measured rather than estimated. One call is one round trip for every
 * method the store declares as a capability (a batch method is one call however many rows
 * it carries). Optional methods exist only where `inner` has them, so the core sees the
 * same capabilities.
 */
export class CountingStore implements RowStore {
  readonly name: string;
  readonly capabilities: RowStore['capabilities'];
  readonly calls: CallCounts = zeroCounts();
  readMany?: RowStore['readMany'];
  checkAndSetMany?: RowStore['checkAndSetMany'];
  scan?: RowStore['scan'];
  incrementCounter?: RowStore['incrementCounter'];
  scanNotified?: RowStore['scanNotified'];
  checkAndSetStamped?: RowStore['checkAndSetStamped'];

  constructor(readonly inner: RowStore) {
    this.name = inner.name;
    this.capabilities = inner.capabilities;
    if (inner.readMany) {
      this.readMany = (rows: readonly RowRef[]): Promise<(StoredRow | null)[]> => {
        this.calls.readMany++;
        return inner.readMany!(rows);
      };
    }
    if (inner.checkAndSetMany) {
      this.checkAndSetMany = (requests: readonly CasRequest[]): Promise<CasResult[]> => {
        // Without the capability the adapter sends one request per CAS (DynamoDB): count those.
        this.calls.checkAndSetMany += inner.capabilities.batchCheckAndSet ? 1 : requests.length;
        return inner.checkAndSetMany!(requests);
      };
    }
    if (inner.scan) {
      this.scan = (table: string, options: ScanOptions): Promise<ScannedStoredRow[]> => {
        this.calls.scan++;
        return inner.scan!(table, options);
      };
    }
    if (inner.incrementCounter) {
      this.incrementCounter = (name: string, delta: number): Promise<number> => {
        this.calls.incrementCounter++;
        return inner.incrementCounter!(name, delta);
      };
    }
    if (inner.scanNotified) {
      this.scanNotified = (table: string, options: NotificationScanOptions): Promise<string[]> => {
        this.calls.scanNotified++;
        return inner.scanNotified!(table, options);
      };
    }
    if (inner.checkAndSetStamped) {
      this.checkAndSetStamped = (request, counter, build) => {
        this.calls.checkAndSetStamped++;
        return inner.checkAndSetStamped!(request, counter, build);
      };
    }
  }

  read(table: string, key: string): Promise<StoredRow | null> {
    this.calls.read++;
    return this.inner.read(table, key);
  }

  checkAndSet(request: CasRequest): Promise<CasResult> {
    this.calls.checkAndSet++;
    return this.inner.checkAndSet(request);
  }

  /** All calls so far. */
  get total(): number {
    let sum = 0;
    for (const n of Object.values(this.calls)) sum += n;
    return sum;
  }

  close(): Promise<void> {
    return this.inner.close();
  }
}

/**
 * A counted CompositeStore: `parts` are the counted stores the composite routes to, and
 * `total` is the sum of their calls, so a composite call that fans out to three stores
 * counts as the three round trips it makes (the composite's own calls are not added).
 */
export class CompositeCountingStore extends CountingStore {
  constructor(
    composite: RowStore,
    readonly parts: readonly CountingStore[],
  ) {
    super(composite);
  }

  override get total(): number {
    let sum = 0;
    for (const part of this.parts) sum += part.total;
    return sum;
  }
}
