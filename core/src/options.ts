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

function describe(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return typeof value;
}
