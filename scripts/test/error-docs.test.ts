/**
 * The READMEs' error lists name every error code core throws: each `super('CODE', ...)` of a
 * PercolatorError subclass in core/src, and StoreError's two codes.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return sources(path);
    return entry.name.endsWith('.ts') ? [path] : [];
  });
}

/** class name -> codes, from `class X extends PercolatorError` ... `super('CODE'` */
function thrownCodes(): Map<string, string[]> {
  const found = new Map<string, string[]>();
  for (const file of sources(join(root, 'core', 'src'))) {
    const text = readFileSync(file, 'utf8');
    const classes = text.matchAll(/export class (\w+) extends PercolatorError \{([\s\S]*?)\n\}/g);
    for (const [, name, body] of classes) {
      const codes = [...body!.matchAll(/'([A-Z][A-Z_]+)'/g)].map((m) => m[1]!);
      found.set(name!, codes);
    }
  }
  return found;
}

describe('error lists in the READMEs', () => {
  const codes = thrownCodes();

  it('finds the error classes in core/src', () => {
    expect(codes.get('ConflictError')).toEqual(['CONFLICT']);
    expect(codes.get('StoreError')).toEqual(['STORE_UNAVAILABLE', 'STORE_AMBIGUOUS']);
    expect(codes.size).toBeGreaterThanOrEqual(10);
  });

  for (const readme of ['README.md', 'core/README.md']) {
    it(`${readme} names every error class and code`, () => {
      const text = readFileSync(join(root, readme), 'utf8');
      for (const [name, list] of codes) {
        expect(text, `${readme} lacks ${name}`).toContain(`\`${name}\``);
        for (const code of list) expect(text, `${readme} lacks ${code}`).toContain(`\`${code}\``);
      }
    });
  }
});
