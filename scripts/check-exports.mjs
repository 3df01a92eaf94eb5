// Proves that every package's built `exports` map resolves under plain Node (no vitest
// aliases) and that each export points at emitted JavaScript and type declarations.
import { existsSync, readFileSync, realpathSync } from 'node:fs';
import { join } from 'node:path';

const packages = {
  '@percolator/core': [
    'Percolator',
    'MemoryStore',
    'CounterOracle',
    'ConflictError',
    'CommitUnknownError',
    'redactUrl',
  ],
  '@percolator/connect': ['BACKENDS', 'openStore', 'openComposite', 'redactUrl', 'storeFactory'],
  '@percolator/testkit': ['ensureTestServer', 'uniqueNamespace'],
  '@percolator/conformance': ['conformanceSuite'],
  '@percolator/postgres': ['createPostgresStore'],
  '@percolator/mysql': ['createMySqlStore'],
  '@percolator/redis': ['createRedisStore'],
  '@percolator/dynamodb': ['createDynamoDbStore'],
  '@percolator/bench': [],
  '@percolator/cli': ['runCli', 'inspectCommand', 'resolveCommand'],
  '@percolator/opentelemetry': ['PercolatorTelemetry'],
};
let failed = 0;
for (const [name, names] of Object.entries(packages)) {
  try {
    const dir = realpathSync(join('node_modules', name));
    const manifest = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'));
    for (const [subpath, target] of Object.entries(manifest.exports)) {
      for (const file of [target.types, target.import]) {
        if (!file || !existsSync(join(dir, file))) throw new Error(`${subpath}: ${file} was not emitted`);
      }
      await import(subpath === '.' ? name : `${name}/${subpath.slice(2)}`);
    }
    const mod = await import(name);
    for (const n of names) if (!(n in mod)) throw new Error(`missing export ${n}`);
    console.log(`exports ok: ${name}`);
  } catch (error) {
    failed++;
    console.error(`exports BROKEN: ${name}: ${error.message}`);
  }
}
process.exit(failed ? 1 : 0);
