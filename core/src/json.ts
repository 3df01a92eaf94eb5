import { InvalidArgumentError } from './errors.js';

/**
 * JSON values for `tx.setJson` / `tx.getJson`: exactly what survives a round trip through
 * JSON unchanged. Anything else (undefined, NaN, Infinity, -0, bigint, functions, symbols,
 * class instances such as Date or Map, cycles, lone surrogates, an array's named properties,
 * non-enumerable properties) is refused with InvalidArgumentError before anything is
 * buffered, rather than silently changed; so is nesting deeper than MAX_JSON_DEPTH. What
 * is written is a copy made of what was checked, each property read once, so a getter,
 * a Proxy or a `toJSON` method (a function: refused on a plain object; never called on
 * an array or its items) cannot change it after the check.
 */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

/**
 * The deepest nesting of arrays and objects `setJson` takes. The check and JSON.stringify
 * recurse once per level: past a few thousand levels the stack overflows with an untyped
 * RangeError, so deeper values are refused with InvalidArgumentError well before.
 */
export const MAX_JSON_DEPTH = 1000;

const encoder = new TextEncoder();
const decoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

export function encodeJson(value: unknown): Uint8Array {
  // The copy, not the value, is serialised: every property (a getter, a Proxy's trap) is
  // read once, so what was checked is what is written.
  const copy = checked(value, '$', new Set(), 0);
  let text: string;
  try {
    text = JSON.stringify(copy);
  } catch (error) {
    // A text longer than a JavaScript string can be (about 512 MiB): V8's RangeError.
    throw new InvalidArgumentError(`the value is too large to write as JSON (${String(error)})`);
  }
  return encoder.encode(text);
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

/**
 * `value` checked, as a plain copy made of what was checked (arrays and plain objects
 * copied, each property read exactly once; primitives as they are).
 */
function checked(value: unknown, path: string, seen: Set<object>, depth: number): unknown {
  switch (typeof value) {
    case 'boolean':
      return value;
    case 'string':
      if (!value.isWellFormed()) throw new InvalidArgumentError(`${path} is a string with a lone surrogate`);
      return value;
    case 'number':
      if (!Number.isFinite(value))
        throw new InvalidArgumentError(`${path} is ${value}, which JSON cannot hold`);
      if (Object.is(value, -0)) throw new InvalidArgumentError(`${path} is -0, which JSON reads back as 0`);
      return value;
    case 'object': {
      if (value === null) return null;
      let copy: unknown;
      if (seen.has(value)) throw new InvalidArgumentError(`${path} refers back to itself (a cycle)`);
      if (depth >= MAX_JSON_DEPTH) {
        throw new InvalidArgumentError(
          `JSON value nests arrays and objects deeper than ${MAX_JSON_DEPTH} levels (at ${path.slice(0, 40)}...)`,
        );
      }
      seen.add(value);
      if (Object.getOwnPropertySymbols(value).length > 0) {
        throw new InvalidArgumentError(`${path} has symbol keys, which JSON drops`);
      }
      if (Array.isArray(value)) {
        const items: unknown[] = [];
        for (let i = 0; i < value.length; i++) {
          if (!(i in value))
            throw new InvalidArgumentError(`${path}[${i}] is a hole, which JSON reads back as null`);
          items.push(checked(value[i], `${path}[${i}]`, seen, depth + 1));
        }
        copy = items;
        // Its indexes (no hole, checked above) and `length`: anything else JSON drops.
        const names = Object.getOwnPropertyNames(value);
        if (names.length !== value.length + 1) {
          const extra = names.find((name) => name !== 'length' && String(Number(name) >>> 0) !== name);
          throw new InvalidArgumentError(
            `${path} is an array with a named property ${JSON.stringify(extra)}, which JSON drops`,
          );
        }
      } else {
        const proto = Object.getPrototypeOf(value);
        if (proto !== Object.prototype && proto !== null) {
          throw new InvalidArgumentError(
            `${path} is a ${proto?.constructor?.name ?? 'class instance'}, not a plain object: convert it first`,
          );
        }
        const fields: Record<string, unknown> = {};
        for (const key of Object.getOwnPropertyNames(value)) {
          if (!Object.prototype.propertyIsEnumerable.call(value, key))
            throw new InvalidArgumentError(`${path}.${key} is not enumerable, which JSON drops`);
          if (!key.isWellFormed()) throw new InvalidArgumentError(`${path} has a key with a lone surrogate`);
          const field = checked((value as Record<string, unknown>)[key], `${path}.${key}`, seen, depth + 1);
          // An own key named __proto__ (JSON.parse makes one) stays an own key: an assignment
          // would set the copy's prototype instead.
          if (key === '__proto__')
            Object.defineProperty(fields, key, {
              value: field,
              enumerable: true,
              writable: true,
              configurable: true,
            });
          else fields[key] = field;
        }
        copy = fields;
      }
      seen.delete(value);
      return copy;
    }
    default:
      throw new InvalidArgumentError(`${path} is ${typeof value}, which JSON cannot hold`);
  }
}
