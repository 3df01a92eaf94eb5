/**
 * Deliberately broken stores, each wrong in one way a real adapter could be, to prove the
 * suite notices. They wrap the correct MemoryStore.
 */
import {
  type CasRequest,
  type CasResult,
  compareKeys,
  MemoryStore,
  type RowRef,
  type RowStore,
  type ScannedStoredRow,
  type ScanOptions,
  type StampedManyResult,
  type StoreCapabilities,
  type StoredRow,
  writeStamp,
} from '@percolator/core';

abstract class Wrapper implements RowStore {
  readonly inner = new MemoryStore();
  abstract readonly name: string;
  get capabilities(): StoreCapabilities {
    return this.inner.capabilities;
  }
  read(table: string, key: string): Promise<StoredRow | null> {
    return this.inner.read(table, key);
  }
  checkAndSet(request: CasRequest): Promise<CasResult> {
    return this.inner.checkAndSet(request);
  }
  incrementCounter(name: string, delta: number): Promise<number> {
    return this.inner.incrementCounter(name, delta);
  }
  scan(table: string, options: ScanOptions): Promise<ScannedStoredRow[]> {
    return this.inner.scan(table, options);
  }
  close(): Promise<void> {
    return this.inner.close();
  }
}

/** Only the basics plus a counter and scans, so every write goes through checkAndSet. */
const BASIC: Omit<StoreCapabilities, 'maxStateBytes'> = {
  batchRead: false,
  batchCheckAndSet: false,
  orderedScan: true,
  atomicCounter: true,
  notificationIndex: false,
  stampedCheckAndSet: false,
};

/** A "CAS" that ignores the expected version: last writer wins. */
export class IgnoresVersionStore extends Wrapper {
  readonly name = 'broken: CAS ignores the version';
  override get capabilities(): StoreCapabilities {
    return { ...BASIC, maxStateBytes: this.inner.capabilities.maxStateBytes };
  }
  override async checkAndSet(request: CasRequest): Promise<CasResult> {
    for (;;) {
      const current = await this.inner.read(request.table, request.key);
      const result = await this.inner.checkAndSet({ ...request, expected: current?.version ?? null });
      if (result.ok) return result;
    }
  }
}

/**
 * Reads come from a replica that lags: for a few milliseconds after a write, a read still
 * returns the row as it was before that write.
 */
export class StaleReadStore extends Wrapper {
  readonly name = 'broken: reads lag behind writes';
  private readonly previous = new Map<string, { row: StoredRow | null; until: number }>();
  constructor(private readonly lagMs = 3) {
    super();
  }
  override get capabilities(): StoreCapabilities {
    return { ...BASIC, maxStateBytes: this.inner.capabilities.maxStateBytes };
  }
  override async read(table: string, key: string): Promise<StoredRow | null> {
    const stale = this.previous.get(`${table}\u0000${key}`);
    if (stale !== undefined && performance.now() < stale.until) return stale.row;
    return this.inner.read(table, key);
  }
  override async checkAndSet(request: CasRequest): Promise<CasResult> {
    const id = `${request.table}\u0000${request.key}`;
    const before = await this.inner.read(request.table, request.key);
    const result = await this.inner.checkAndSet(request);
    // The replica keeps the oldest state it has not caught up with yet.
    const lagging = this.previous.get(id);
    const row = lagging !== undefined && performance.now() < lagging.until ? lagging.row : before;
    if (result.ok) this.previous.set(id, { row, until: performance.now() + this.lagMs });
    return result;
  }
}

/** Versions count per key and restart after a delete: the ABA hazard. */
export class ReusesVersionsStore extends Wrapper {
  readonly name = 'broken: versions restart after delete';
  private readonly rows = new Map<string, { version: number; state: Uint8Array }>();
  override get capabilities(): StoreCapabilities {
    return { ...BASIC, orderedScan: false, maxStateBytes: this.inner.capabilities.maxStateBytes };
  }
  override async read(table: string, key: string): Promise<StoredRow | null> {
    const row = this.rows.get(`${table}\u0000${key}`);
    return row ? { version: String(row.version), state: row.state.slice() } : null;
  }
  override async checkAndSet(request: CasRequest): Promise<CasResult> {
    const id = `${request.table}\u0000${request.key}`;
    const row = this.rows.get(id);
    if ((row ? String(row.version) : null) !== request.expected) return { ok: false };
    if (request.state === null) {
      this.rows.delete(id);
      return { ok: true, version: '0' };
    }
    const version = (row?.version ?? 0) + 1;
    this.rows.set(id, { version, state: request.state.slice() });
    return { ok: true, version: String(version) };
  }
}

/** Scans in JavaScript string order (UTF-16 code units), not UTF-8 byte order. */
export class Utf16ScanStore extends Wrapper {
  readonly name = 'broken: scans in UTF-16 order';
  override get capabilities(): StoreCapabilities {
    return { ...BASIC, maxStateBytes: this.inner.capabilities.maxStateBytes };
  }
  override async scan(table: string, options: ScanOptions): Promise<ScannedStoredRow[]> {
    const all = await this.inner.scan(table, { limit: Number.MAX_SAFE_INTEGER });
    return all
      .sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0))
      .filter(
        (r) =>
          (options.start === undefined || r.key >= options.start) &&
          (options.end === undefined || r.key < options.end) &&
          (options.after === undefined || r.key > options.after),
      )
      .slice(0, options.limit);
  }
}

/** A notification index that only learns about rows when they are created. */
export class CreateOnlyNotificationsStore extends Wrapper {
  readonly name = 'broken: notifications only on create';
  private readonly flagged = new Set<string>();
  override get capabilities(): StoreCapabilities {
    return { ...BASIC, notificationIndex: true, maxStateBytes: this.inner.capabilities.maxStateBytes };
  }
  override async checkAndSet(request: CasRequest): Promise<CasResult> {
    const result = await this.inner.checkAndSet(request);
    const id = `${request.table}\u0000${request.key}`;
    if (result.ok && request.expected === null && request.notified) this.flagged.add(id);
    if (result.ok && request.expected !== null && !request.notified) this.flagged.delete(id);
    return result;
  }
  async scanNotified(table: string, options: { after?: string; limit: number }): Promise<string[]> {
    const keys = [...this.flagged]
      .filter((id) => id.startsWith(`${table}\u0000`))
      .map((id) => id.slice(table.length + 1))
      .filter((k) => options.after === undefined || compareKeys(k, options.after) > 0)
      .sort(compareKeys);
    return keys.slice(0, options.limit);
  }
}

/**
 * A correct store that declares no optional capability, though it has every method (of
 * the MemoryStore it wraps): the core must still never call them.
 */
export class MinimalStore extends Wrapper {
  readonly name = 'correct: no optional capability declared';
  override get capabilities(): StoreCapabilities {
    return {
      batchRead: false,
      batchCheckAndSet: false,
      orderedScan: false,
      atomicCounter: false,
      notificationIndex: false,
      stampedCheckAndSet: false,
      maxStateBytes: this.inner.capabilities.maxStateBytes,
    };
  }
  readMany(rows: readonly RowRef[]): Promise<(StoredRow | null)[]> {
    return this.inner.readMany(rows);
  }
  checkAndSetMany(requests: readonly CasRequest[]): Promise<CasResult[]> {
    return this.inner.checkAndSetMany(requests);
  }
  scanNotified(table: string, options: { after?: string; limit: number }): Promise<string[]> {
    return this.inner.scanNotified(table, options);
  }
}

/**
 * A read-only snapshot one commit old once the counter is past 100: readPeeked reads the
 * current rows but answers the counter minus one, so the core's snapshot rule hides the
 * latest commit. Each snapshot is consistent, only stale in real time, and only under load
 * (a replica that lags when busy): a sequential probe on a fresh store misses it.
 */
export class StalePeekStore extends MemoryStore {
  stale = 0;
  /** How many counter values behind the peek answers (1: the subtlest, and the hardest to catch). */
  constructor(private readonly lag = 1) {
    super();
  }
  override async readPeeked(
    refs: readonly RowRef[],
    counter: string,
  ): Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }> {
    const result = await super.readPeeked(refs, counter);
    if (result.timestamp <= 20) return result;
    this.stale++;
    return { ...result, timestamp: result.timestamp - this.lag };
  }
}

/**
 * The one-step commit of several rows (`checkAndSetStampedMany`) ignores the expected
 * versions: last writer wins. Every other method is the memory store's own, so the broken
 * path is the one the core takes for multi-row commits on stores that have it.
 */
export class IgnoresVersionStampedStore extends MemoryStore {
  override readonly name = 'broken: the stamped step of several rows ignores the versions';
  override async checkAndSetStampedMany(
    requests: readonly (CasRequest & { readonly state: Uint8Array })[],
    counter: string,
  ): ReturnType<MemoryStore['checkAndSetStampedMany']> {
    for (;;) {
      const current = await Promise.all(requests.map((r) => this.read(r.table, r.key)));
      const result = await super.checkAndSetStampedMany(
        requests.map((r, i) => ({ ...r, expected: current[i]?.version ?? null })),
        counter,
      );
      if (result.ok) return result;
    }
  }
}

/**
 * The batch check-and-set (`checkAndSetMany`) ignores the expected versions: last writer
 * wins. Without the stamped capabilities, the core prewrites and commits the rows of a
 * multi-row transaction with it (two phases), so that is the path broken.
 */
export class IgnoresVersionBatchStore extends MemoryStore {
  override readonly name = 'broken: the batch check-and-set ignores the versions';
  constructor() {
    super();
    (this as { capabilities: StoreCapabilities }).capabilities = {
      ...this.capabilities,
      stampedCheckAndSet: false,
      stampedCheckAndSetMany: false,
      stampedRead: false,
      stampedManyForOneRow: false,
    };
  }
  override async checkAndSetMany(requests: readonly CasRequest[]): Promise<CasResult[]> {
    const results: CasResult[] = [];
    for (const request of requests) {
      for (;;) {
        const current = await this.read(request.table, request.key);
        if (current === null && request.state === null) {
          results.push(await super.checkAndSet(request));
          break;
        }
        const result = await super.checkAndSet({ ...request, expected: current?.version ?? null });
        if (result.ok) {
          results.push(result);
          break;
        }
      }
    }
    return results;
  }
}

/**
 * The stamped step of several rows done in moves, as an adapter without a server-side
 * transaction might: check every row's version, draw from the counter, then write each row
 * with a CAS of its own. A reader that draws between the draw and the writes misses a write
 * stamped below it, and two steps over the same rows can each win some of them.
 */
export class SplitStampedManyStore extends MemoryStore {
  override readonly name = 'broken: the stamped step of several rows draws, then writes row by row';
  override async checkAndSetStampedMany(
    requests: readonly (CasRequest & { readonly state: Uint8Array })[],
    counter: string,
  ): Promise<StampedManyResult> {
    const current = await Promise.all(requests.map((r) => this.read(r.table, r.key)));
    if (requests.some((r, i) => (current[i]?.version ?? null) !== r.expected)) return { ok: false, current };
    const timestamp = await this.incrementCounter(counter, 1);
    const versions: string[] = [];
    for (const r of requests) {
      await new Promise((resolve) => setImmediate(resolve));
      const result = await this.checkAndSet({ ...r, state: writeStamp(r.state, timestamp) });
      if (!result.ok) return { ok: false };
      versions.push(result.version);
    }
    return { ok: true, versions, timestamp };
  }
}

/**
 * A stamped read that reads its rows, then draws (a moment later), on a store without the
 * stamped CAS: the read misses writes acknowledged before its value was drawn.
 */
export class ReadsBeforeDrawStore extends MemoryStore {
  override readonly name = 'broken: readStamped reads, then draws (no stamped CAS)';
  constructor() {
    super();
    (this as { capabilities: StoreCapabilities }).capabilities = {
      ...this.capabilities,
      stampedCheckAndSet: false,
      stampedCheckAndSetMany: false,
      stampedManyForOneRow: false,
    };
  }
  override async readStamped(
    refs: readonly RowRef[],
    counter: string,
  ): Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }> {
    const rows = await this.readMany(refs);
    await new Promise((resolve) => setTimeout(resolve, 2));
    return { timestamp: await this.incrementCounter(counter, 1), rows };
  }
}
