/**
 * @percolator/testkit: where tests, benchmarks and the conformance CLI find or start
 * local servers. The backend-specific parts are subpaths, each needing its adapter:
 * `/postgres` (ensurePostgres), `/mysql` (ensureMySql), `/redis` (Redis Cluster, private
 * redis-server), `/dynamodb` (DynamoDB Local), `/private` (private servers a test may
 * SIGKILL and restart: PostgreSQL, MariaDB, Redis, a Redis Cluster, DynamoDB Local).
 */
import { randomBytes } from 'node:crypto';

export { freePort } from './ports.js';
export {
  type ContainerSpec,
  dockerInfoSucceeds,
  type EnsureOptions,
  ensureTestServer,
  startContainer,
  type TestServer,
  type TestServerSpec,
  untilReachable,
} from './test-server.js';

/**
 * A namespace per test, `label` + "_" + 10 random hex, cut to the adapters' 32 characters
 * (/^[a-z][a-z0-9_]{0,31}$/ for a label of lower-case letters and digits), so concurrent
 * runs never share data.
 */
export function uniqueNamespace(label = 't'): string {
  return `${label}_${randomBytes(5).toString('hex')}`.slice(0, 32);
}
