import { InvalidArgumentError } from './errors.js';

/**
 * Every key an options type accepts, as a record so the compiler proves the list complete:
 * a key added to the type and not here (or here and not in the type) does not compile.
 */
export type OptionKeys<T> = { readonly [K in keyof Required<T>]: true };

/**
 * Rejects anything but a plain object of known keys, for every options object of the
 * library (clients, stores, adapters), so they all answer a typo the same way. A misspelt option (`connectionstring`,
 * `uri` for `url`) would otherwise be ignored and the store would quietly use its default.
 */
export function checkOptionKeys<T>(what: string, options: unknown, keys: OptionKeys<T>): void {
  if (typeof options !== 'object' || options === null || Array.isArray(options)) {
    throw new InvalidArgumentError(`${what} options must be an object, got ${describe(options)}`);
  }
  // Runs for every transaction (`transact`'s options): no array of the accepted keys unless
  // a key is wrong.
  for (const key of Object.keys(options)) {
    if (Object.hasOwn(keys, key)) continue;
    const accepted = Object.keys(keys);
    const near = accepted.find((k) => k.toLowerCase() === key.toLowerCase());
    throw new InvalidArgumentError(
      `${what}: unknown option ${JSON.stringify(key)}${near ? ` (did you mean "${near}"?)` : ''}; ` +
        `the options are ${accepted.join(', ')}`,
    );
  }
}

/**
 * The longest delay Node's timers keep: a longer one (setTimeout, AbortSignal.timeout) fires
 * after 1 ms instead, with a TimeoutOverflowWarning. Every option that ends up as a timer's
 * delay stays at or below it (about 24.8 days).
 */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** An `AbortSignal` option: anything else would be ignored, or read as aborted by its `aborted` field. */
export function checkSignal(what: string, signal: unknown): asserts signal is AbortSignal | undefined {
  if (signal !== undefined && !(signal instanceof AbortSignal))
    throw new InvalidArgumentError(`${what}: signal must be an AbortSignal, got ${describe(signal)}`);
}

/**
 * A whole number from `min` to `max` (a count, a size, milliseconds): NaN, a string or a
 * fraction would quietly change what the option bounds (`lockWaitMs: NaN` removed the bound
 * on lock waits).
 */
export function checkInteger(what: string, value: unknown, min: number, max = Number.MAX_SAFE_INTEGER): void {
  if (typeof value === 'number' && Number.isInteger(value) && value >= min && value <= max) return;
  const range =
    max < Number.MAX_SAFE_INTEGER
      ? `an integer from ${min} to ${max}`
      : min === 0
        ? 'a non-negative integer'
        : min === 1
          ? 'a positive integer'
          : `an integer of at least ${min}`;
  throw new InvalidArgumentError(`${what} must be ${range}, got ${shown(value)}`);
}

/** Boolean flags: a truthy string ("false") would otherwise turn one on. */
export function checkBooleans<T extends object>(
  what: string,
  options: T,
  ...keys: (keyof T & string)[]
): void {
  for (const key of keys) {
    const value = options[key];
    if (value !== undefined && typeof value !== 'boolean')
      throw new InvalidArgumentError(`${what}: ${key} must be a boolean, got ${shown(value)}`);
  }
}

/** A function option: anything else would fail later, in the middle of a commit, as a TypeError. */
export function checkFunction(what: string, value: unknown): void {
  if (typeof value !== 'function')
    throw new InvalidArgumentError(`${what} must be a function, got ${shown(value)}`);
}

/**
 * A user's wall clock, checked on every reading: its value goes into locks and records
 * (their wall times) and lease expiries. Unchecked, Infinity looped the encoder for ever,
 * a negative value wrote a row no later read could decode, and NaN made every lock look
 * expired at once. A fraction is rounded down (performance.timeOrigin + performance.now()
 * is a fine clock); anything but a number from 0 to 2^53 - 1 is an InvalidArgumentError,
 * thrown before the reading is used.
 */
export function checkedClock(what: string, clock: () => number): () => number {
  return () => {
    const now = clock();
    if (typeof now !== 'number' || !(now >= 0 && now <= Number.MAX_SAFE_INTEGER))
      throw new InvalidArgumentError(
        `${what} returned ${shown(now)}: a wall time must be milliseconds, a number from 0 to 2^53 - 1`,
      );
    return Math.floor(now);
  };
}

function shown(value: unknown): string {
  if (typeof value === 'number') return String(value);
  if (typeof value === 'string')
    return JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}...` : value);
  return describe(value);
}

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return typeof value;
}
