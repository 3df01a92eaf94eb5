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
import { ROW_STORE_MEMBERS } from '@percolator/core';
import { trackCall } from './critical-path.js';

/** `readStamped` (a timestamp and reads in one round trip), where a store has it. */
interface StampedReader {
  readStamped(
    rows: readonly RowRef[],
    counter: string,
  ): Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }>;
  /** `readPeeked` (a counter's value and reads in one round trip, writing nothing). */
  readPeeked(
    rows: readonly RowRef[],
    counter: string,
  ): Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }>;
}

/** Calls per RowStore method, as counted by a CountingStore. */
export type CallCounts = Record<
  | 'read'
  | 'checkAndSet'
  | 'readMany'
  | 'checkAndSetMany'
  | 'scan'
  | 'incrementCounter'
  | 'scanNotified'
  | 'checkAndSetStamped'
  | 'checkAndSetStampedMany'
  | 'readStamped'
  | 'readPeeked'
  /** Calls to methods this proxy does not know (a store method added after it was written). */
  | 'other',
  number
>;

/**
 * What went through the store, by direction. `reads` and `writes` are calls (round trips:
 * a batch is one call where the store batches); rows and bytes count every row in them.
 * Bytes are row state bytes (what the store keeps for a row), not keys or framing: read
 * bytes are the rows the store returned (a failed check-and-set that returns the current
 * row counts as read), written bytes the states sent in check-and-sets.
 */
export interface IoCounts {
  /** read, readMany, readStamped, readPeeked, scan and scanNotified calls. */
  readonly reads: number;
  /** checkAndSet, checkAndSetMany, checkAndSetStamped(Many) and incrementCounter calls. */
  readonly writes: number;
  readonly rowsRead: number;
  readonly rowsWritten: number;
  readonly bytesRead: number;
  readonly bytesWritten: number;
}

export function zeroIo(): IoCounts {
  return { reads: 0, writes: 0, rowsRead: 0, rowsWritten: 0, bytesRead: 0, bytesWritten: 0 };
}

/** `a + b` field by field (`sign` -1: `a - b`). */
export function addIo(a: IoCounts, b: IoCounts, sign: 1 | -1 = 1): IoCounts {
  return {
    reads: a.reads + sign * b.reads,
    writes: a.writes + sign * b.writes,
    rowsRead: a.rowsRead + sign * b.rowsRead,
    rowsWritten: a.rowsWritten + sign * b.rowsWritten,
    bytesRead: a.bytesRead + sign * b.bytesRead,
    bytesWritten: a.bytesWritten + sign * b.bytesWritten,
  };
}

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
    checkAndSetStampedMany: 0,
    readStamped: 0,
    readPeeked: 0,
    other: 0,
  };
}

/** Every method name of `object` and its prototypes (Object.prototype excluded). */
export function methodNames(object: object): string[] {
  const names = new Set<string>();
  for (let o: object | null = object; o && o !== Object.prototype; o = Object.getPrototypeOf(o)) {
    for (const name of Object.getOwnPropertyNames(o)) {
      const descriptor = Object.getOwnPropertyDescriptor(o, name);
      if (descriptor && typeof descriptor.value === 'function') names.add(name);
    }
  }
  return [...names];
}

/**
 * A RowStore that forwards every call to `inner` and counts it, so round trips and bytes
 * per transaction are measured rather than estimated. One call is one round trip for every
 * method the store declares as a capability (a batch method is one call however many rows
 * it carries). Optional methods exist only where `inner` has them, so the core sees the
 * same capabilities. Methods of `inner` this proxy does not know are forwarded too and
 * counted as `other` calls (bytes unknown), so a store method added to the core later is
 * neither hidden from it nor left out of the round trips. Every call is also recorded as a
 * round trip of the traced transaction running it, if any (critical-path.ts).
 */
export class CountingStore implements RowStore {
  readonly name: string;
  readonly capabilities: RowStore['capabilities'];
  readonly calls: CallCounts = zeroCounts();
  private readonly counted = {
    rowsRead: 0,
    rowsWritten: 0,
    bytesRead: 0,
    bytesWritten: 0,
  };
  readMany?: RowStore['readMany'];
  checkAndSetMany?: RowStore['checkAndSetMany'];
  scan?: RowStore['scan'];
  incrementCounter?: RowStore['incrementCounter'];
  scanNotified?: RowStore['scanNotified'];
  checkAndSetStamped?: RowStore['checkAndSetStamped'];
  checkAndSetStampedMany?: RowStore['checkAndSetStampedMany'];

  constructor(readonly inner: RowStore) {
    this.name = inner.name;
    this.capabilities = inner.capabilities;
    if (inner.readMany) {
      this.readMany = async (rows: readonly RowRef[]): Promise<(StoredRow | null)[]> => {
        this.calls.readMany++;
        this.counted.rowsRead += rows.length;
        const found = await trackCall(() => inner.readMany!(rows));
        for (const row of found) this.readBytes(row);
        return found;
      };
    }
    if (inner.checkAndSetMany) {
      this.checkAndSetMany = async (requests: readonly CasRequest[]): Promise<CasResult[]> => {
        // Without the capability the adapter sends one request per CAS (DynamoDB): count those.
        this.calls.checkAndSetMany += inner.capabilities.batchCheckAndSet ? 1 : requests.length;
        for (const request of requests) this.written(request.state);
        const results = await trackCall(() => inner.checkAndSetMany!(requests));
        for (const result of results) this.casResult(result);
        return results;
      };
    }
    if (inner.scan) {
      this.scan = async (table: string, options: ScanOptions): Promise<ScannedStoredRow[]> => {
        this.calls.scan++;
        const rows = await trackCall(() => inner.scan!(table, options));
        this.counted.rowsRead += rows.length;
        for (const { row } of rows) this.readBytes(row);
        return rows;
      };
    }
    if (inner.incrementCounter) {
      this.incrementCounter = (name: string, delta: number): Promise<number> => {
        this.calls.incrementCounter++;
        return trackCall(() => inner.incrementCounter!(name, delta));
      };
    }
    if (inner.scanNotified) {
      this.scanNotified = (table: string, options: NotificationScanOptions): Promise<string[]> => {
        this.calls.scanNotified++;
        return trackCall(() => inner.scanNotified!(table, options));
      };
    }
    if (inner.checkAndSetStamped) {
      this.checkAndSetStamped = async (request, counter) => {
        this.calls.checkAndSetStamped++;
        this.written(request.state);
        const result = await trackCall(() => inner.checkAndSetStamped!(request, counter));
        this.casResult(result);
        return result;
      };
    }
    if (inner.checkAndSetStampedMany) {
      this.checkAndSetStampedMany = async (requests, counter) => {
        this.calls.checkAndSetStampedMany++;
        for (const request of requests) this.written(request.state);
        const result = await trackCall(() => inner.checkAndSetStampedMany!(requests, counter));
        if (!result.ok) for (const row of result.current ?? []) if (row) this.readBytes(row);
        return result;
      };
    }
    const stampedRead = (inner as Partial<StampedReader>).readStamped;
    if (stampedRead) {
      // A start timestamp and a batch of reads in one round trip (a read call).
      Object.defineProperty(this, 'readStamped', {
        value: async (rows: readonly RowRef[], counter: string) => {
          this.calls.readStamped++;
          this.counted.rowsRead += rows.length;
          const out = await trackCall(() => stampedRead.call(inner, rows, counter));
          for (const row of out.rows) this.readBytes(row);
          return out;
        },
        enumerable: false,
      });
    }
    const peekedRead = (inner as Partial<StampedReader>).readPeeked;
    if (peekedRead) {
      // A counter's value and a batch of reads in one round trip (a read call).
      Object.defineProperty(this, 'readPeeked', {
        value: async (rows: readonly RowRef[], counter: string) => {
          this.calls.readPeeked++;
          this.counted.rowsRead += rows.length;
          const out = await trackCall(() => peekedRead.call(inner, rows, counter));
          for (const row of out.rows) this.readBytes(row);
          return out;
        },
        enumerable: false,
      });
    }
    for (const method of methodNames(inner)) {
      if (ROW_STORE_MEMBERS.has(method) || method in this) continue;
      const fn = (inner as unknown as Record<string, (...args: unknown[]) => unknown>)[method]!;
      Object.defineProperty(this, method, {
        value: (...args: unknown[]) => {
          this.calls.other++;
          return trackCall(() => fn.apply(inner, args));
        },
        enumerable: false,
      });
    }
  }

  private readBytes(row: StoredRow | null | undefined): void {
    if (row) this.counted.bytesRead += row.state.byteLength;
  }

  private written(state: Uint8Array | null): void {
    this.counted.rowsWritten++;
    if (state) this.counted.bytesWritten += state.byteLength;
  }

  private casResult(result: CasResult): void {
    if (!result.ok) this.readBytes(result.current);
  }

  async read(table: string, key: string): Promise<StoredRow | null> {
    this.calls.read++;
    this.counted.rowsRead++;
    const row = await trackCall(() => this.inner.read(table, key));
    this.readBytes(row);
    return row;
  }

  async checkAndSet(request: CasRequest): Promise<CasResult> {
    this.calls.checkAndSet++;
    this.written(request.state);
    const result = await trackCall(() => this.inner.checkAndSet(request));
    this.casResult(result);
    return result;
  }

  /** All calls so far. */
  get total(): number {
    let sum = 0;
    for (const n of Object.values(this.calls)) sum += n;
    return sum;
  }

  /** Calls, rows and bytes so far, by direction. */
  get io(): IoCounts {
    const c = this.calls;
    return {
      reads: c.read + c.readMany + c.scan + c.scanNotified + c.readStamped + c.readPeeked,
      writes:
        c.checkAndSet +
        c.checkAndSetMany +
        c.checkAndSetStamped +
        c.checkAndSetStampedMany +
        c.incrementCounter,
      ...this.counted,
    };
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

  override get io(): IoCounts {
    return this.parts.reduce((sum, part) => addIo(sum, part.io), zeroIo());
  }
}
