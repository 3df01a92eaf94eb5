import { InvalidArgumentError } from './errors.js';

/**
 * JSON values for `tx.setJson` / `tx.getJson`: exactly what survives a round trip through
 * JSON unchanged. Anything else (undefined, NaN, Infinity, -0, bigint, functions, symbols,
 * class instances such as Date or Map, cycles, lone surrogates) is refused with
 * InvalidArgumentError before anything is buffered, rather than silently changed.
 */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

const encoder = new TextEncoder();
const decoder = new TextDecoder('utf-8', { fatal: true });

export function encodeJson(value: unknown): Uint8Array {
  check(value, '$', new Set());
  return encoder.encode(JSON.stringify(value));
}

export function decodeJson(bytes: Uint8Array, where: string): JsonValue {
  let text: string;
  try {
    text = decoder.decode(bytes);
    return JSON.parse(text) as JsonValue;
  } catch {
    throw new InvalidArgumentError(`${where} does not hold JSON (written with set, not setJson?)`);
  }
}

function check(value: unknown, path: string, seen: Set<object>): void {
  switch (typeof value) {
    case 'boolean':
      return;
    case 'string':
      if (!value.isWellFormed()) throw new InvalidArgumentError(`${path} is a string with a lone surrogate`);
      return;
    case 'number':
      if (!Number.isFinite(value))
        throw new InvalidArgumentError(`${path} is ${value}, which JSON cannot hold`);
      if (Object.is(value, -0)) throw new InvalidArgumentError(`${path} is -0, which JSON reads back as 0`);
      return;
    case 'object': {
      if (value === null) return;
      if (seen.has(value)) throw new InvalidArgumentError(`${path} refers back to itself (a cycle)`);
      seen.add(value);
      if (Array.isArray(value)) {
        for (let i = 0; i < value.length; i++) {
          if (!(i in value))
            throw new InvalidArgumentError(`${path}[${i}] is a hole, which JSON reads back as null`);
          check(value[i], `${path}[${i}]`, seen);
        }
      } else {
        const proto = Object.getPrototypeOf(value);
        if (proto !== Object.prototype && proto !== null) {
          throw new InvalidArgumentError(
            `${path} is a ${proto?.constructor?.name ?? 'class instance'}, not a plain object: convert it first`,
          );
        }
        if (Object.getOwnPropertySymbols(value).length > 0) {
          throw new InvalidArgumentError(`${path} has symbol keys, which JSON drops`);
        }
        for (const [key, v] of Object.entries(value)) {
          if (!key.isWellFormed()) throw new InvalidArgumentError(`${path} has a key with a lone surrogate`);
          check(v, `${path}.${key}`, seen);
        }
      }
      seen.delete(value);
      return;
    }
    default:
      throw new InvalidArgumentError(`${path} is ${typeof value}, which JSON cannot hold`);
  }
}
