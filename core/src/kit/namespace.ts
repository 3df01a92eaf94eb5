import { InvalidArgumentError } from '../errors.js';

/**
 * Namespaces isolate one deployment's data from another's in one database. They become
 * part of SQL identifiers, Redis key prefixes and DynamoDB partition keys, so every
 * adapter accepts only this shape: a lowercase letter, then up to 31 of [a-z0-9_].
 */
export const NAMESPACE_PATTERN = /^[a-z][a-z0-9_]{0,31}$/;
export const DEFAULT_NAMESPACE = 'percolator';

/** The namespace to use: the default when none is given; InvalidArgumentError for any other shape. */
export function validateNamespace(namespace: unknown): string {
  if (namespace === undefined) return DEFAULT_NAMESPACE;
  if (typeof namespace !== 'string' || !NAMESPACE_PATTERN.test(namespace)) {
    throw new InvalidArgumentError(
      `namespace must match ${NAMESPACE_PATTERN} (lowercase letter, then up to 31 of [a-z0-9_]), got ${JSON.stringify(namespace)}`,
    );
  }
  return namespace;
}
