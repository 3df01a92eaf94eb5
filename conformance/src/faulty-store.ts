/**
 * A RowStore wrapper that injects the failures a real network store produces, on command
 * or at random from a seed:
 *
 * - `before`: the call fails before it reaches the store (StoreError, applied 'no');
 * - `after`: the store applies the call, then the caller gets StoreError 'unknown' (the
 *   ambiguous case: a timeout after the write landed);
 * - `delay`: the call waits before it reaches the store;
 * - `late`: the caller gets StoreError 'unknown' at once (its timeout), while the call is
 *   still on its way: it reaches the store later (after `delayMs`, or when the rule's
 *   `until` settles) and is applied or refused then; `settle()` waits for such calls;
 * - `hold`: the call waits until the test releases it (to order events exactly).
 *
 * Every injected failure's message names the seed and call number, so a failing random run
 * can be repeated with the same seed.
 */
import {
  type CasRequest,
  type CasResult,
  type NotificationScanOptions,
  type RowRef,
  type RowStore,
  type ScannedStoredRow,
  type ScanOptions,
  type StampedManyResult,
  type StoreCapabilities,
  type StoredRow,
  StoreError,
  UnsupportedOperationError,
} from '@percolator/core';
import { Random } from './random.js';
import { sleep } from './util.js';

export type StoreOperation =
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
  | 'readPeeked';

export const WRITE_OPERATIONS: readonly StoreOperation[] = [
  'checkAndSet',
  'checkAndSetMany',
  'incrementCounter',
  'checkAndSetStamped',
  'checkAndSetStampedMany',
];

/** One call through the wrapper, as rules and listeners see it. */
export interface StoreCall {
  /** 1, 2, 3, ... in the order calls arrived. */
  readonly number: number;
  readonly operation: StoreOperation;
  /** Table (or counter name) and key, when the call names one row. */
  readonly table?: string;
  readonly key?: string;
  /** The request, for CAS calls. */
  readonly request?: CasRequest;
  /** Every row of a batch call (readMany, checkAndSetMany). */
  readonly rows?: readonly RowRef[];
}

/** Whether `call` reads or writes row (table, key), alone or in a batch. */
export function touches(call: StoreCall, table: string, key: string): boolean {
  if (call.rows !== undefined) return call.rows.some((r) => r.table === table && r.key === key);
  return call.table === table && call.key === key;
}

/**
 * 'before': the call never reaches the store, and the caller is told so ('no'). 'after':
 * it is applied, then reported failed ('unknown'). 'delay': it is slow. 'late': it is
 * reported failed at once ('unknown', as after a timeout), while it is still on its way:
 * it reaches the store `delayMs` later and is applied then, or refused, like any call.
 */
export type FaultKind = 'before' | 'after' | 'delay' | 'late';

export interface RandomFaults {
  /** Probability that a call fails before it reaches the store. */
  readonly failBefore?: number;
  /** Probability that a call is applied and then reported as failed (ambiguous). */
  readonly failAfter?: number;
  /** Probability that a call is delayed, by 0..maxDelayMs. */
  readonly delay?: number;
  readonly maxDelayMs?: number;
  /** Probability that a call is reported failed ('unknown') and reaches the store 0..maxLateMs later. */
  readonly late?: number;
  readonly maxLateMs?: number;
  /** Operations eligible for random faults (default: all). */
  readonly operations?: readonly StoreOperation[];
}

export interface FaultRule {
  readonly kind: FaultKind;
  /** Which calls: by operation and/or a predicate. Default: any call. */
  readonly operation?: StoreOperation | readonly StoreOperation[];
  readonly match?: (call: StoreCall) => boolean;
  /** How many matching calls to affect (default 1). */
  readonly times?: number;
  /** For `delay` and `late`. */
  readonly delayMs?: number;
  /** For `late`: the call lands when this settles (instead of after `delayMs`). */
  readonly until?: Promise<unknown>;
}

export interface FaultEvent {
  readonly call: StoreCall;
  readonly kind: FaultKind;
  readonly delayMs?: number;
}

export interface Hold {
  /** Resolves with the first call that was held. */
  readonly reached: Promise<StoreCall>;
  /** Lets the held calls continue to the store; later calls are no longer held. */
  release(): void;
  /**
   * Fails the held calls, and every later matching call, before they reach the store
   * (StoreError 'no'): the client's messages never arrive, as after a crash.
   */
  fail(): void;
}

export interface FaultyStoreOptions {
  /** Seed for random faults (default 1). */
  readonly seed?: number;
  /** Random faults, off when absent. */
  readonly random?: RandomFaults;
}

export type CallListener = (
  call: StoreCall,
  outcome: { ok: boolean; error?: unknown; result?: unknown },
) => void;

interface ActiveRule {
  rule: FaultRule;
  left: number;
}

interface ActiveHold {
  match: (call: StoreCall) => boolean;
  released: boolean;
  failing: boolean;
  gate: Promise<void>;
  open: () => void;
  reached: (call: StoreCall) => void;
}

const MAX_LOG = 2000;

export class FaultyStore implements RowStore {
  readonly seed: number;
  /** Faults injected so far (the first 2000). */
  readonly log: FaultEvent[] = [];
  /**
   * writesFailedAfter: the failedAfter calls that wrote rows (WRITE_OPERATIONS but
   * incrementCounter, whose lost reply loses only a timestamp, and only where the store
   * applied something: a refused CAS wrote nothing): the ambiguous writes.
   */
  readonly stats = {
    calls: 0,
    failedBefore: 0,
    failedAfter: 0,
    writesFailedAfter: 0,
    delayed: 0,
    /** Calls reported failed while still on their way ('late'), and those of them that then wrote. */
    late: 0,
    writesLate: 0,
  };
  /** The 'late' calls still on their way (see `settle`). */
  private readonly inFlight = new Set<Promise<unknown>>();
  private randomFaults: RandomFaults | undefined;
  private readonly random: Random;
  private readonly rules: ActiveRule[] = [];
  private readonly holds: ActiveHold[] = [];
  private readonly listeners = new Set<CallListener>();

  constructor(
    readonly inner: RowStore,
    options: FaultyStoreOptions = {},
  ) {
    this.seed = options.seed ?? 1;
    this.random = new Random(this.seed);
    this.randomFaults = options.random;
  }

  get capabilities(): StoreCapabilities {
    return this.inner.capabilities;
  }

  get name(): string {
    return `faulty(${this.inner.name})`;
  }

  /** Turns random faults on (or off with undefined). */
  setRandom(faults: RandomFaults | undefined): void {
    this.randomFaults = faults;
  }

  /** Injects a fault into the next matching call(s). */
  inject(rule: FaultRule): void {
    this.rules.push({ rule, left: rule.times ?? 1 });
  }

  failBefore(
    match?: (call: StoreCall) => boolean,
    operation?: StoreOperation | readonly StoreOperation[],
  ): void {
    this.inject({ kind: 'before', match, operation });
  }

  failAfter(
    match?: (call: StoreCall) => boolean,
    operation?: StoreOperation | readonly StoreOperation[],
  ): void {
    this.inject({ kind: 'after', match, operation });
  }

  /** Holds matching calls before they reach the store until `release()`. */
  hold(match: (call: StoreCall) => boolean): Hold {
    let open!: () => void;
    let reached!: (call: StoreCall) => void;
    const gate = new Promise<void>((resolve) => (open = resolve));
    const reachedPromise = new Promise<StoreCall>((resolve) => (reached = resolve));
    const hold: ActiveHold = { match, released: false, failing: false, gate, open, reached };
    this.holds.push(hold);
    return {
      reached: reachedPromise,
      release: () => {
        hold.released = true;
        const i = this.holds.indexOf(hold);
        if (i >= 0) this.holds.splice(i, 1);
        open();
      },
      fail: () => {
        hold.failing = true;
        open();
      },
    };
  }

  /** Calls `listener` after every call completes; returns an unsubscribe function. */
  onCall(listener: CallListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Drops pending rules, holds (releasing them) and random faults. */
  clearFaults(): void {
    this.rules.length = 0;
    for (const hold of [...this.holds]) {
      hold.released = true;
      hold.open();
    }
    this.holds.length = 0;
    this.randomFaults = undefined;
  }

  read(table: string, key: string): Promise<StoredRow | null> {
    return this.call({ operation: 'read', table, key }, () => this.inner.read(table, key));
  }

  checkAndSet(request: CasRequest): Promise<CasResult> {
    return this.call(
      { operation: 'checkAndSet', table: request.table, key: request.key, request },
      () => this.inner.checkAndSet(request),
      () => {
        const copy = copied(request);
        return () => this.inner.checkAndSet(copy);
      },
    );
  }

  readMany(rows: readonly RowRef[]): Promise<(StoredRow | null)[]> {
    const inner = this.inner;
    if (inner.readMany === undefined) return Promise.reject(unsupported('readMany'));
    const parts = rows.map(({ table, key }) => ({ operation: 'read' as const, table, key }));
    if (this.splitsBatch(parts)) return this.split(rows, (r) => this.read(r.table, r.key), false);
    return this.call({ operation: 'readMany', table: rows[0]?.table, key: rows[0]?.key, rows }, () =>
      inner.readMany!(rows),
    );
  }

  readStamped(
    rows: readonly RowRef[],
    counter: string,
  ): Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }> {
    const inner = this.inner;
    if (inner.readStamped === undefined) return Promise.reject(unsupported('readStamped'));
    return this.call({ operation: 'readStamped', table: rows[0]?.table, key: rows[0]?.key, rows }, () =>
      inner.readStamped!(rows, counter),
    );
  }

  readPeeked(
    rows: readonly RowRef[],
    counter: string,
  ): Promise<{ readonly timestamp: number; readonly rows: (StoredRow | null)[] }> {
    const inner = this.inner;
    if (inner.readPeeked === undefined) return Promise.reject(unsupported('readPeeked'));
    return this.call({ operation: 'readPeeked', table: rows[0]?.table, key: rows[0]?.key, rows }, () =>
      inner.readPeeked!(rows, counter),
    );
  }

  checkAndSetMany(requests: readonly CasRequest[]): Promise<CasResult[]> {
    const inner = this.inner;
    if (inner.checkAndSetMany === undefined) return Promise.reject(unsupported('checkAndSetMany'));
    const parts = requests.map((request) => ({
      operation: 'checkAndSet' as const,
      table: request.table,
      key: request.key,
      request,
    }));
    if (this.splitsBatch(parts)) return this.split(requests, (r) => this.checkAndSet(r), true);
    const rows = requests.map(({ table, key }) => ({ table, key }));
    return this.call(
      { operation: 'checkAndSetMany', table: requests[0]?.table, key: requests[0]?.key, rows },
      () => inner.checkAndSetMany!(requests),
      () => {
        const copy = requests.map(copied);
        return () => inner.checkAndSetMany!(copy);
      },
    );
  }

  /**
   * A batch is many independent single-row calls (the store contract). When a hold or rule
   * aims at one of its rows, the batch is sent as those single-row calls, so the fault hits
   * just that row's part, as a partly failed batch does on a real store. With random faults
   * on, half the batches (chosen by the seed) are split too, so that parts of one batch
   * fail while others land.
   */
  private splitsBatch(parts: readonly Omit<StoreCall, 'number'>[]): boolean {
    if (parts.length > 1 && this.randomFaults !== undefined && this.random.next() < 0.5) return true;
    const asCall = (part: Omit<StoreCall, 'number'>): StoreCall => ({ ...part, number: this.stats.calls });
    return parts.some(
      (part) =>
        this.holds.some((hold) => !hold.released && hold.match(asCall(part))) ||
        this.rules.some(({ rule }) => matches(rule, asCall(part))),
    );
  }

  /** Runs a batch as single-row calls; if any fails, fails the whole batch as a store would. */
  private async split<R, T>(
    items: readonly R[],
    one: (item: R) => Promise<T>,
    writes: boolean,
  ): Promise<T[]> {
    const settled = await Promise.allSettled(items.map(one));
    const failures = settled.filter((s): s is PromiseRejectedResult => s.status === 'rejected');
    if (failures.length === 0) return settled.map((s) => (s as PromiseFulfilledResult<T>).value);
    // Some parts may have been applied: a write batch is then an unknown outcome.
    const certain = failures.every((f) => f.reason instanceof StoreError && f.reason.applied === 'no');
    const applied = writes && (failures.length < settled.length || !certain) ? 'unknown' : 'no';
    throw new StoreError(
      `injected fault: ${failures.length} of ${settled.length} parts of a batch failed [FaultyStore seed ${this.seed}]`,
      applied,
      { cause: failures[0]!.reason },
    );
  }

  scan(table: string, options: ScanOptions): Promise<ScannedStoredRow[]> {
    const inner = this.inner;
    if (inner.scan === undefined) return Promise.reject(unsupported('scan'));
    return this.call({ operation: 'scan', table }, () => inner.scan!(table, options));
  }

  incrementCounter(name: string, delta: number): Promise<number> {
    const inner = this.inner;
    if (inner.incrementCounter === undefined) return Promise.reject(unsupported('incrementCounter'));
    return this.call({ operation: 'incrementCounter', table: name }, () =>
      inner.incrementCounter!(name, delta),
    );
  }

  scanNotified(table: string, options: NotificationScanOptions): Promise<string[]> {
    const inner = this.inner;
    if (inner.scanNotified === undefined) return Promise.reject(unsupported('scanNotified'));
    return this.call({ operation: 'scanNotified', table }, () => inner.scanNotified!(table, options));
  }

  checkAndSetStamped(
    request: CasRequest & { readonly state: Uint8Array },
    counter: string,
  ): Promise<CasResult & { timestamp?: number }> {
    const inner = this.inner;
    if (inner.checkAndSetStamped === undefined) return Promise.reject(unsupported('checkAndSetStamped'));
    return this.call(
      { operation: 'checkAndSetStamped', table: request.table, key: request.key, request },
      () => inner.checkAndSetStamped!(request, counter),
      () => {
        const copy = copied(request);
        return () => inner.checkAndSetStamped!(copy, counter);
      },
    );
  }

  /**
   * One atomic call, so a fault aimed at any of its rows hits all of it (never split: a
   * store applies it to every row or none).
   */
  checkAndSetStampedMany(
    requests: readonly (CasRequest & { readonly state: Uint8Array })[],
    counter: string,
  ): Promise<StampedManyResult> {
    const inner = this.inner;
    if (inner.checkAndSetStampedMany === undefined)
      return Promise.reject(unsupported('checkAndSetStampedMany'));
    const rows = requests.map(({ table, key }) => ({ table, key }));
    return this.call(
      { operation: 'checkAndSetStampedMany', table: requests[0]?.table, key: requests[0]?.key, rows },
      () => inner.checkAndSetStampedMany!(requests, counter),
      () => {
        const copy = requests.map(copied);
        return () => inner.checkAndSetStampedMany!(copy, counter);
      },
    );
  }

  /**
   * Waits until every 'late' call has reached the store and been applied or refused, so a
   * final check sees everything that will ever land.
   */
  async settle(): Promise<void> {
    while (this.inFlight.size > 0) await Promise.all([...this.inFlight]);
  }

  /** Closes the wrapped store, once the 'late' calls have landed. */
  async close(): Promise<void> {
    this.clearFaults();
    await this.settle();
    return this.inner.close();
  }

  /**
   * `later`, for calls that carry bytes: makes the call on copies of them, taken now, for a
   * call that lands later ('late'): the caller may reuse its buffers once the call failed,
   * while a real network has sent the bytes already.
   */
  private async call<T>(
    partial: Omit<StoreCall, 'number'>,
    run: () => Promise<T>,
    later?: () => () => Promise<T>,
  ): Promise<T> {
    const call: StoreCall = { ...partial, number: ++this.stats.calls };
    try {
      const result = await this.faulted(call, run, later);
      this.notify(call, { ok: true, result });
      return result;
    } catch (error) {
      this.notify(call, { ok: false, error });
      throw error;
    }
  }

  private async faulted<T>(
    call: StoreCall,
    run: () => Promise<T>,
    later?: () => () => Promise<T>,
  ): Promise<T> {
    for (const hold of [...this.holds]) {
      if (hold.released || !hold.match(call)) continue;
      hold.reached(call);
      await hold.gate;
      if (hold.failing) {
        this.stats.failedBefore++;
        this.record({ call, kind: 'before' });
        throw new StoreError(this.message(call, 'was held and then dropped before reaching the store'), 'no');
      }
    }
    const fault = this.chooseFault(call);
    if (fault?.kind === 'delay') {
      this.stats.delayed++;
      this.record({ call, kind: 'delay', delayMs: fault.delayMs });
      await sleep(fault.delayMs ?? 0);
      return run();
    }
    if (fault?.kind === 'late') {
      this.stats.late++;
      this.record({ call, kind: 'late', delayMs: fault.delayMs });
      const land = later ? later() : run;
      const landing = (fault.until ?? sleep(fault.delayMs ?? 0))
        .then(land)
        .then(
          (result) => {
            if (WRITE_OPERATIONS.includes(call.operation) && wroteSomething(result)) this.stats.writesLate++;
          },
          () => undefined, // refused or failed on arrival: nobody is waiting for it
        )
        .finally(() => this.inFlight.delete(landing));
      this.inFlight.add(landing);
      throw new StoreError(
        this.message(call, 'is still on its way (reported failed, it lands later)'),
        'unknown',
      );
    }
    if (fault?.kind === 'before') {
      this.stats.failedBefore++;
      this.record({ call, kind: 'before' });
      throw new StoreError(this.message(call, 'failed before reaching the store'), 'no');
    }
    const result = await run();
    if (fault?.kind === 'after') {
      this.stats.failedAfter++;
      if (
        call.operation !== 'incrementCounter' &&
        WRITE_OPERATIONS.includes(call.operation) &&
        wroteSomething(result)
      )
        this.stats.writesFailedAfter++;
      this.record({ call, kind: 'after' });
      throw new StoreError(this.message(call, 'was applied, then reported as failed (ambiguous)'), 'unknown');
    }
    return result;
  }

  private chooseFault(
    call: StoreCall,
  ): { kind: FaultKind; delayMs?: number; until?: Promise<unknown> } | undefined {
    const index = this.rules.findIndex(({ rule }) => matches(rule, call));
    if (index >= 0) {
      const active = this.rules[index]!;
      if (--active.left <= 0) this.rules.splice(index, 1);
      return { kind: active.rule.kind, delayMs: active.rule.delayMs, until: active.rule.until };
    }
    const faults = this.randomFaults;
    if (faults === undefined) return undefined;
    if (faults.operations !== undefined && !faults.operations.includes(call.operation)) return undefined;
    // Always draw the same number of values per call, so the sequence depends only on the seed
    // and the order of calls.
    const roll = this.random.next();
    const delayRoll = this.random.next();
    const before = faults.failBefore ?? 0;
    const after = faults.failAfter ?? 0;
    const delay = faults.delay ?? 0;
    const late = faults.late ?? 0;
    if (roll < before) return { kind: 'before' };
    if (roll < before + after) return { kind: 'after' };
    if (roll < before + after + delay) {
      return { kind: 'delay', delayMs: Math.floor(delayRoll * ((faults.maxDelayMs ?? 5) + 1)) };
    }
    if (roll < before + after + delay + late) {
      return { kind: 'late', delayMs: Math.floor(delayRoll * ((faults.maxLateMs ?? 5) + 1)) };
    }
    return undefined;
  }

  private message(call: StoreCall, what: string): string {
    const target =
      call.key !== undefined ? `(${call.table}, ${JSON.stringify(call.key)})` : `(${call.table ?? ''})`;
    return `injected fault: ${call.operation}${target} ${what} [FaultyStore seed ${this.seed}, call #${call.number}]`;
  }

  private record(event: FaultEvent): void {
    if (this.log.length < MAX_LOG) this.log.push(event);
  }

  private notify(call: StoreCall, outcome: { ok: boolean; error?: unknown; result?: unknown }): void {
    for (const listener of this.listeners) listener(call, outcome);
  }
}

function matches(rule: FaultRule, call: StoreCall): boolean {
  if (rule.operation !== undefined) {
    const ops = typeof rule.operation === 'string' ? [rule.operation] : rule.operation;
    if (!ops.includes(call.operation)) return false;
  }
  return rule.match === undefined || rule.match(call);
}

function unsupported(operation: string): UnsupportedOperationError {
  return new UnsupportedOperationError(`the wrapped store does not offer ${operation}`);
}

/** Whether a write's result says the store applied it (a CAS, or any CAS of a batch, `ok`). */
/** A request with a copy of its state, for a call made later. */
function copied<R extends CasRequest>(request: R): R {
  return { ...request, state: request.state ? request.state.slice() : request.state };
}

function wroteSomething(result: unknown): boolean {
  if (Array.isArray(result)) return result.some((r) => (r as { ok?: unknown }).ok === true);
  return (result as { ok?: unknown } | undefined)?.ok === true;
}
