import {
  type CasRequest,
  type CasResult,
  type NotificationScanOptions,
  type RowRef,
  type RowStore,
  type ScanOptions,
  type StoreCapabilities,
  type StoredRow,
  StoreError,
} from '@percolator/core';

/**
 * A real store behind a switch: while `down`, every call fails before it reaches the
 * store (StoreError 'no'), as when the network to it is cut. `dropReplyOnce()` lets the
 * next CAS reach the store and be applied, then cuts the network before the reply (the
 * caller sees StoreError 'unknown').
 */
export class SwitchableStore implements RowStore {
  readonly name: string;
  readonly capabilities: StoreCapabilities;
  down = false;
  private dropReply = false;

  constructor(readonly inner: RowStore) {
    this.name = `${inner.name} (switchable)`;
    this.capabilities = inner.capabilities;
  }

  dropReplyOnce(): void {
    this.dropReply = true;
  }

  private reachable(): void {
    if (this.down) throw new StoreError(`${this.inner.name} is unreachable (switched off by the test)`, 'no');
  }

  async read(table: string, key: string): Promise<StoredRow | null> {
    this.reachable();
    return this.inner.read(table, key);
  }
  async checkAndSet(request: CasRequest): Promise<CasResult> {
    this.reachable();
    const result = await this.inner.checkAndSet(request);
    if (this.dropReply) {
      this.dropReply = false;
      this.down = true;
      throw new StoreError(`${this.inner.name}: connection lost after the request was sent`, 'unknown');
    }
    return result;
  }
  async readMany(rows: readonly RowRef[]) {
    this.reachable();
    return this.inner.readMany!(rows);
  }
  async checkAndSetMany(requests: readonly CasRequest[]) {
    this.reachable();
    return this.inner.checkAndSetMany!(requests);
  }
  async scan(table: string, options: ScanOptions) {
    this.reachable();
    return this.inner.scan!(table, options);
  }
  async scanNotified(table: string, options: NotificationScanOptions) {
    this.reachable();
    return this.inner.scanNotified!(table, options);
  }
  async incrementCounter(name: string, delta: number) {
    this.reachable();
    return this.inner.incrementCounter!(name, delta);
  }
  async close(): Promise<void> {
    await this.inner.close();
  }
}
