import { createHash, randomBytes } from 'node:crypto';
import { backoffMs, sleep } from '../backoff.js';
import { StoreError } from '../errors.js';
import { utf8Length } from '../names.js';
import type { RowStore, StoredRow } from '../store.js';

/**
 * Advisory per-row leases (the paper's "lightweight lock service"): they stop two workers
 * running the same row at once, which would only waste work, since correctness comes from
 * the ack conflicts. A lease is a plain row in table `__lease`, taken and released by the
 * store's CAS (no transaction), holding its owner and an expiry in wall-clock ms. Other
 * workers judge expiry with their own clock, so the clocks of the worker machines must
 * agree to well within the lease duration; a lease whose holder died is taken over after
 * it expires.
 */
export const LEASE_TABLE = '__lease';

interface LeaseState {
  readonly owner: string;
  /** Differs per acquisition, so a re-read after an ambiguous CAS recognises our own write. */
  readonly token: string;
  readonly expiresAt: number;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder('utf-8', { ignoreBOM: true });

function encode(state: LeaseState): Uint8Array {
  return encoder.encode(JSON.stringify(state));
}

function decode(row: StoredRow): LeaseState | undefined {
  try {
    const value = JSON.parse(decoder.decode(row.state)) as LeaseState;
    return typeof value.owner === 'string' && Number.isFinite(value.expiresAt) ? value : undefined;
  } catch {
    return undefined; // not a lease we understand: treat it as expired
  }
}

/** Whether `row` is the lease of acquisition `token` (ours, if the token is ours). */
function holds(row: StoredRow | null | undefined, token: string): row is StoredRow {
  return !!row && decode(row)?.token === token;
}

/** One lease row per (table, row); keys that would pass the 1024-byte limit are hashed. */
export function leaseKey(table: string, row: string): string {
  const key = `${table}\u0000${row}`;
  if (utf8Length(key) <= 1024) return key;
  return `${table}\u0000#${createHash('sha256').update(row).digest('hex')}`;
}

export class Lease {
  private lost = false;
  /** Renewals and the release run one at a time, so a late renewal cannot outlive the release. */
  private chain: Promise<unknown> = Promise.resolve();
  constructor(
    private readonly leases: Leases,
    readonly key: string,
    private version: string,
    private readonly state: LeaseState,
  ) {}

  /** Pushes the expiry forward. Returns false once the lease was lost (expired and taken over). */
  renew(): Promise<boolean> {
    const next = this.chain.then(() => this.renewNow());
    this.chain = next;
    return next;
  }

  /** Deletes the lease row if it is still ours. Best effort: an orphan simply expires. */
  release(): Promise<void> {
    const next = this.chain.then(() => this.releaseNow());
    this.chain = next;
    return next;
  }

  private async renewNow(): Promise<boolean> {
    if (this.lost) return false;
    const state = { ...this.state, expiresAt: this.leases.clock() + this.leases.durationMs };
    try {
      const result = await this.leases.store.checkAndSet({
        table: LEASE_TABLE,
        key: this.key,
        expected: this.version,
        state: encode(state),
      });
      if (result.ok) this.version = result.version;
      else {
        // Refused: taken over, or an earlier renewal whose reply was lost landed (the row
        // then holds our token at a version we never heard of: still ours).
        const current =
          result.current === undefined ? await this.leases.store.read(LEASE_TABLE, this.key) : result.current;
        if (holds(current, this.state.token)) this.version = current.version;
        else this.lost = true;
      }
    } catch {
      // Unknown outcome (or the read after a refusal failed): the next renewal finds out.
    }
    return !this.lost;
  }

  private async releaseNow(): Promise<void> {
    if (this.lost) return;
    this.lost = true;
    const { store } = this.leases;
    try {
      const result = await store.checkAndSet({
        table: LEASE_TABLE,
        key: this.key,
        expected: this.version,
        state: null,
      });
      if (result.ok) return;
      // Refused: taken over, or a renewal whose reply was lost landed after all (the row
      // holds our token at a version we never heard of). Ours still: delete it at that
      // version, or every worker, this one too, keeps off the row until it expires.
      const current = result.current === undefined ? await store.read(LEASE_TABLE, this.key) : result.current;
      if (holds(current, this.state.token)) {
        await store.checkAndSet({
          table: LEASE_TABLE,
          key: this.key,
          expected: current.version,
          state: null,
        });
      }
    } catch {
      // Best effort: an orphan simply expires.
    }
  }
}

export class Leases {
  /** Identifies this worker in lease rows. */
  readonly owner = randomBytes(8).toString('hex');

  constructor(
    readonly store: RowStore,
    readonly durationMs: number,
    readonly clock: () => number,
  ) {}

  /**
   * Takes the lease of (table, row), or returns undefined if another worker holds a live
   * one. Tries the common case first (no lease row: one CAS), then takes over an expired one.
   */
  async acquire(table: string, row: string): Promise<Lease | undefined> {
    const key = leaseKey(table, row);
    const state: LeaseState = {
      owner: this.owner,
      token: randomBytes(6).toString('hex'),
      expiresAt: this.clock() + this.durationMs,
    };
    const bytes = encode(state);
    let current: StoredRow | null | undefined = null;
    for (let attempt = 0; attempt < 6; attempt++) {
      if (current === undefined) current = await this.store.read(LEASE_TABLE, key);
      if (current) {
        const holder = decode(current);
        if (holder?.token === state.token) return new Lease(this, key, current.version, state);
        if (holder && holder.expiresAt >= this.clock()) return undefined;
      }
      try {
        const result = await this.store.checkAndSet({
          table: LEASE_TABLE,
          key,
          expected: current?.version ?? null,
          state: bytes,
        });
        if (result.ok) return new Lease(this, key, result.version, state);
        current = result.current;
      } catch (error) {
        // Re-read: the token tells whether an ambiguous CAS landed.
        current = undefined;
        if (attempt >= 3 && error instanceof StoreError && error.applied === 'no') throw error;
        await sleep(backoffMs(attempt, 2, 50));
      }
    }
    // The last attempt's outcome unknown: it may have landed, and a lease of ours nobody
    // knows of would keep every worker (this one too) off the row until it expires.
    if (current === undefined) {
      const row = await this.store.read(LEASE_TABLE, key).catch(() => undefined);
      if (holds(row, state.token)) return new Lease(this, key, row.version, state);
    }
    return undefined;
  }
}
