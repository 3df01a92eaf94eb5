/** Small helpers shared by the cases. */
import { isDeepStrictEqual } from 'node:util';

const encoder = new TextEncoder();
const decoder = new TextDecoder('utf-8', { ignoreBOM: true });

export function bytes(text: string): Uint8Array {
  return encoder.encode(text);
}

export function text(data: Uint8Array): string {
  return decoder.decode(data);
}

export function sameBytes(a: Uint8Array | null | undefined, b: Uint8Array | null | undefined): boolean {
  if (a == null || b == null) return a == null && b == null;
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** A readable description of bytes for messages. */
export function show(data: Uint8Array | null | undefined): string {
  if (data == null) return String(data);
  if (data.length > 48) return `<${data.length} bytes>`;
  return `<${[...data].map((b) => b.toString(16).padStart(2, '0')).join(' ')}>`;
}

/** A failed expectation of the suite. */
export class ConformanceFailure extends Error {
  override name = 'ConformanceFailure';
}

export function check(condition: unknown, message: string | (() => string)): asserts condition {
  if (!condition) throw new ConformanceFailure(typeof message === 'string' ? message : message());
}

export function checkEqual<T>(actual: T, expected: T, what: string): void {
  if (!isDeepStrictEqual(actual, expected)) {
    throw new ConformanceFailure(`${what}: expected ${format(expected)}, got ${format(actual)}`);
  }
}

export function format(value: unknown): string {
  if (value instanceof Uint8Array) return show(value);
  try {
    const json = JSON.stringify(value);
    if (json === undefined) return String(value);
    return json.length > 300 ? `${json.slice(0, 300)}...` : json;
  } catch {
    return String(value);
  }
}

/** Awaits `fn`, expecting it to throw; returns the error. */
export async function rejection(fn: () => Promise<unknown> | unknown, what: string): Promise<unknown> {
  try {
    await fn();
  } catch (error) {
    return error;
  }
  throw new ConformanceFailure(`${what}: expected an error, but it succeeded`);
}

/** Runs `tasks` with at most `limit` in flight; results in order. */
export async function pool<T>(count: number, limit: number, task: (i: number) => Promise<T>): Promise<T[]> {
  const results = new Array<T>(count);
  let next = 0;
  const worker = async () => {
    while (next < count) {
      const i = next++;
      results[i] = await task(i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, count) }, worker));
  return results;
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Polls `condition` every few ms until it holds or `timeoutMs` passes. */
export async function waitFor(condition: () => boolean, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline)
      throw new ConformanceFailure(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(2);
  }
}

export function errorText(error: unknown): string {
  if (error instanceof Error) return `${error.name}: ${error.message}`;
  return String(error);
}

/** A promise plus its resolve function, for pausing a hook until the test says go. */
export function gate(): { promise: Promise<void>; open: () => void } {
  let open!: () => void;
  const promise = new Promise<void>((resolve) => (open = resolve));
  return { promise, open };
}

/** Awaits `promise`, failing the case if it takes longer than `ms` (a hung store or client). */
export async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new ConformanceFailure(`timed out after ${ms} ms waiting for ${what}`)),
          ms,
        );
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}
