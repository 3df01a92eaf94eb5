/**
 * The one list of backends every tool opens by name (conformance CLI, bench, examples,
 * the operator CLI, the tests), and where each one's connection comes from.
 */
export const BACKENDS = ['memory', 'postgres', 'mysql', 'redis', 'redis-cluster', 'dynamodb'] as const;
export type BackendName = (typeof BACKENDS)[number];

export function isBackendName(value: unknown): value is BackendName {
  return typeof value === 'string' && (BACKENDS as readonly string[]).includes(value);
}

/**
 * The environment variable each backend reads when no URL is given (the adapters read
 * the same ones). DynamoDB also reads AWS_REGION / AWS_DEFAULT_REGION and
 * PERCOLATOR_DYNAMODB_TABLE.
 */
export const BACKEND_ENV: Readonly<Record<Exclude<BackendName, 'memory'>, string>> = Object.freeze({
  postgres: 'PERCOLATOR_POSTGRES_URL',
  mysql: 'PERCOLATOR_MYSQL_URL',
  redis: 'PERCOLATOR_REDIS_URL',
  'redis-cluster': 'PERCOLATOR_REDIS_CLUSTER_NODES',
  dynamodb: 'PERCOLATOR_DYNAMODB_ENDPOINT',
});

/** The npm package that implements each backend (an optional peer dependency of this package). */
export const ADAPTER_PACKAGES: Readonly<Record<Exclude<BackendName, 'memory'>, string>> = Object.freeze({
  postgres: '@percolator/postgres',
  mysql: '@percolator/mysql',
  redis: '@percolator/redis',
  'redis-cluster': '@percolator/redis',
  dynamodb: '@percolator/dynamodb',
});
