/**
 * Adapters are optional peer dependencies: a user installs the ones for the stores they
 * run. Each is imported only when chosen, by a computed specifier, so this package works
 * for the memory store with no adapter installed, and a missing adapter is a clear error
 * for that backend only.
 */
export async function loadAdapter<T>(specifier: string): Promise<T> {
  try {
    return (await import(/* @vite-ignore */ specifier)) as T;
  } catch (error) {
    const code = (error as { code?: string }).code;
    const missing =
      (code === 'ERR_MODULE_NOT_FOUND' || code === 'MODULE_NOT_FOUND') &&
      String((error as Error).message).includes(specifier);
    throw new Error(
      missing
        ? `cannot load ${specifier}: install it next to @percolator/connect (npm install ${specifier}); ` +
            `in the percolator repository run \`pnpm build\` (${(error as Error).message})`
        : `cannot load ${specifier} (is it built? run \`pnpm build\`): ${(error as Error).message}`,
      { cause: error },
    );
  }
}
