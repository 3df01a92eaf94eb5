import {
  type CasRequest,
  InvalidArgumentError,
  MAX_KEY_BYTES,
  type NotificationScanOptions,
  type RowRef,
  RowTooLargeError,
  type ScanOptions,
  validateRowKey,
  validateTable,
} from '@percolator/core';
import { MAX_STATE_BYTES } from './layout.js';

export const NAMESPACE = /^[a-z][a-z0-9_]{0,31}$/;
export const DEFAULT_NAMESPACE = 'percolator';

export function validateNamespace(namespace: unknown): asserts namespace is string {
  if (typeof namespace !== 'string' || !NAMESPACE.test(namespace)) {
    throw new InvalidArgumentError(
      `namespace must match ${NAMESPACE} (lowercase letter, then up to 31 of [a-z0-9_]), got ${JSON.stringify(namespace)}`,
    );
  }
}

export function validateRowRef(ref: unknown): asserts ref is RowRef {
  if (typeof ref !== 'object' || ref === null)
    throw new InvalidArgumentError('row reference must be an object');
  const { table, key } = ref as RowRef;
  validateTable(table);
  validateRowKey(key);
}

/** Checks a CAS request completely, so bad input is rejected before anything is sent. */
export function validateCasRequest(request: unknown): asserts request is CasRequest {
  validateRowRef(request);
  const { expected, state, notified } = request as CasRequest;
  if (expected !== null && (typeof expected !== 'string' || expected.length === 0)) {
    throw new InvalidArgumentError('expected version must be a non-empty string or null');
  }
  if (state !== null && !(state instanceof Uint8Array)) {
    throw new InvalidArgumentError('state must be a Uint8Array or null');
  }
  if (notified !== undefined && typeof notified !== 'boolean') {
    throw new InvalidArgumentError('notified must be a boolean when given');
  }
  if (state !== null && state.byteLength > MAX_STATE_BYTES) {
    // DynamoDB items are limited to 400 KB; we refuse before sending anything.
    throw new RowTooLargeError(
      `row state is ${state.byteLength} bytes; the DynamoDB store holds at most ${MAX_STATE_BYTES} bytes per row (400 KB item limit)`,
    );
  }
}

/** Scan bounds may be empty strings (an empty lower bound means "from the first key"). */
function validateBound(name: string, value: unknown): asserts value is string | undefined {
  if (value === undefined || value === '') return;
  if (typeof value !== 'string') throw new InvalidArgumentError(`${name} must be a string`);
  if (!value.isWellFormed()) throw new InvalidArgumentError(`${name} contains a lone surrogate`);
  if (Buffer.byteLength(value, 'utf8') > MAX_KEY_BYTES) {
    throw new InvalidArgumentError(`${name} is longer than ${MAX_KEY_BYTES} UTF-8 bytes`);
  }
}

function validateLimit(limit: unknown): asserts limit is number {
  if (typeof limit !== 'number' || !Number.isSafeInteger(limit) || limit < 0) {
    throw new InvalidArgumentError(`limit must be a non-negative integer, got ${String(limit)}`);
  }
}

export function validateScanOptions(table: unknown, options: unknown): asserts options is ScanOptions {
  validateTable(table);
  if (typeof options !== 'object' || options === null)
    throw new InvalidArgumentError('scan options are required');
  const { start, end, after, limit } = options as ScanOptions;
  validateBound('start', start);
  validateBound('end', end);
  validateBound('after', after);
  validateLimit(limit);
}

export function validateNotificationScanOptions(
  table: unknown,
  options: unknown,
): asserts options is NotificationScanOptions {
  validateTable(table);
  if (typeof options !== 'object' || options === null)
    throw new InvalidArgumentError('scan options are required');
  const { after, limit } = options as NotificationScanOptions;
  validateBound('after', after);
  validateLimit(limit);
}

export function validateCounter(name: unknown, delta: unknown): asserts name is string {
  if (typeof name !== 'string' || name.length === 0 || !name.isWellFormed()) {
    throw new InvalidArgumentError('counter name must be a non-empty, well-formed string');
  }
  if (Buffer.byteLength(name, 'utf8') > MAX_KEY_BYTES) {
    throw new InvalidArgumentError(`counter name is longer than ${MAX_KEY_BYTES} UTF-8 bytes`);
  }
  if (typeof delta !== 'number' || !Number.isSafeInteger(delta) || delta < 1) {
    throw new InvalidArgumentError(`counter delta must be an integer >= 1, got ${String(delta)}`);
  }
}
