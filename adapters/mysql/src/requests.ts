import {
  type CasRequest,
  InvalidArgumentError,
  type RowRef,
  RowTooLargeError,
  validateRowKey,
  validateTable,
} from '@percolator/core';

/** Namespaces become part of SQL identifiers, so only this shape is accepted. */
export const NAMESPACE_PATTERN = /^[a-z][a-z0-9_]{0,31}$/;
export const DEFAULT_NAMESPACE = 'percolator';

export function validateNamespace(namespace: unknown): string {
  if (namespace === undefined) return DEFAULT_NAMESPACE;
  if (typeof namespace !== 'string' || !NAMESPACE_PATTERN.test(namespace)) {
    throw new InvalidArgumentError(
      `namespace must match ${NAMESPACE_PATTERN} (lowercase letter, then up to 31 of [a-z0-9_]), got ${JSON.stringify(namespace)}`,
    );
  }
  return namespace;
}

/** Versions are BIGINT UNSIGNED values, printed without leading zeros. */
const CANONICAL_VERSION = /^(0|[1-9][0-9]{0,19})$/;
export const MAX_UNSIGNED_BIGINT = 18446744073709551615n;

/** Whether `version` is a token this store could have issued (else it matches no row). */
export function isIssuableVersion(version: string): boolean {
  return CANONICAL_VERSION.test(version) && BigInt(version) <= MAX_UNSIGNED_BIGINT;
}

export function utf8(text: string): Buffer {
  return Buffer.from(text, 'utf8');
}

/** A copy as a plain Uint8Array (driver buffers may be views of a shared slab). */
export function toBytes(buffer: Buffer): Uint8Array {
  return new Uint8Array(buffer);
}

export interface EncodedRef {
  readonly tbl: Buffer;
  readonly key: Buffer;
}

export function encodeRef(ref: RowRef): EncodedRef {
  validateTable(ref.table);
  validateRowKey(ref.key);
  return { tbl: utf8(ref.table), key: utf8(ref.key) };
}

/** What one CAS asks the database to do, decided before anything is sent. */
export type CasPlan = EncodedRef &
  (
    | { readonly kind: 'create'; readonly state: Buffer; readonly notified: boolean }
    | {
        readonly kind: 'update';
        readonly expected: string;
        readonly state: Buffer;
        readonly notified: boolean;
      }
    | { readonly kind: 'delete'; readonly expected: string }
    /** expected absent and delete: succeeds exactly when the row is absent. */
    | { readonly kind: 'ensureAbsent' }
    /** expected is no token this store issues: fails without a write. */
    | { readonly kind: 'unmatchable' }
  );

export function planCas(request: CasRequest, maxStateBytes: number): CasPlan {
  if (typeof request !== 'object' || request === null) {
    throw new InvalidArgumentError('a check-and-set request must be an object');
  }
  const ref = encodeRef(request);
  const { expected, state } = request;
  if (expected !== null && typeof expected !== 'string') {
    throw new InvalidArgumentError('expected version must be a string or null');
  }
  if (state !== null && !(state instanceof Uint8Array)) {
    throw new InvalidArgumentError('state must be a Uint8Array or null');
  }
  if (request.notified !== undefined && typeof request.notified !== 'boolean') {
    throw new InvalidArgumentError('notified must be a boolean when given');
  }
  if (state !== null && state.byteLength > maxStateBytes) {
    // Checked before sending: the database would reject it later and less clearly.
    throw new RowTooLargeError(
      `state of ${request.table}/${JSON.stringify(request.key).slice(0, 80)} is ${state.byteLength} bytes; ` +
        `this store accepts at most ${maxStateBytes} (capabilities.maxStateBytes)`,
    );
  }
  const notified = request.notified === true;
  const stateBuffer = state === null ? null : Buffer.from(state.buffer, state.byteOffset, state.byteLength);
  if (expected === null) {
    return stateBuffer === null
      ? { ...ref, kind: 'ensureAbsent' }
      : { ...ref, kind: 'create', state: stateBuffer, notified };
  }
  if (!isIssuableVersion(expected)) return { ...ref, kind: 'unmatchable' };
  return stateBuffer === null
    ? { ...ref, kind: 'delete', expected }
    : { ...ref, kind: 'update', expected, state: stateBuffer, notified };
}

/** Scan bounds are any well-formed strings (they need not be valid keys). */
export function encodeBound(name: string, value: unknown): Buffer | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== 'string' || !value.isWellFormed()) {
    throw new InvalidArgumentError(`scan option ${name} must be a well-formed string`);
  }
  return utf8(value);
}

export function validateLimit(limit: unknown): number {
  if (typeof limit !== 'number' || !Number.isSafeInteger(limit) || limit < 0) {
    throw new InvalidArgumentError(`limit must be a non-negative integer, got ${String(limit)}`);
  }
  return limit;
}

export const MAX_COUNTER_NAME_BYTES = 1024;

export function encodeCounterName(name: unknown): Buffer {
  if (typeof name !== 'string' || name.length === 0 || !name.isWellFormed()) {
    throw new InvalidArgumentError('counter name must be a non-empty, well-formed string');
  }
  const bytes = utf8(name);
  if (bytes.length > MAX_COUNTER_NAME_BYTES) {
    throw new InvalidArgumentError(
      `counter name is ${bytes.length} bytes; the limit is ${MAX_COUNTER_NAME_BYTES}`,
    );
  }
  return bytes;
}

export function validateDelta(delta: unknown): number {
  if (typeof delta !== 'number' || !Number.isSafeInteger(delta) || delta < 1) {
    throw new InvalidArgumentError(`counter delta must be an integer >= 1, got ${String(delta)}`);
  }
  return delta;
}

export function toSafeCounter(text: string, name: string): number {
  const value = Number(text);
  if (!Number.isSafeInteger(value)) {
    // Not bad input: the increment happened; the value just cannot be a JS number.
    throw new RangeError(`counter ${JSON.stringify(name)} reached ${text}, beyond Number.MAX_SAFE_INTEGER`);
  }
  return value;
}
