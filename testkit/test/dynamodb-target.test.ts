import { describe, expect, it } from 'vitest';
import { dynamoDbTarget, LOCAL_CREDENTIALS } from '../src/dynamodb.js';

/**
 * `dynamoDbTarget` with PERCOLATOR_DYNAMODB_ENDPOINT set (no server is started or reached):
 * an endpoint on this machine with no AWS credentials in the environment gets DynamoDB
 * Local's, as @percolator/connect and the CLI give; real AWS keeps the default chain.
 */
describe('dynamoDbTarget with an endpoint of ones own', () => {
  it("a loopback endpoint without AWS_ACCESS_KEY_ID: DynamoDB Local's credentials", async () => {
    for (const endpoint of ['http://127.0.0.1:8000', 'http://localhost:8123']) {
      const target = await dynamoDbTarget({ PERCOLATOR_DYNAMODB_ENDPOINT: endpoint });
      expect(target.credentials).toEqual(LOCAL_CREDENTIALS);
      expect(target.storeOptions('ns')).toMatchObject({ endpoint, credentials: LOCAL_CREDENTIALS });
    }
  });

  it('credentials in the environment, or an endpoint elsewhere: the default chain (none given)', async () => {
    for (const env of [
      { PERCOLATOR_DYNAMODB_ENDPOINT: 'http://127.0.0.1:8000', AWS_ACCESS_KEY_ID: 'AKIA...' },
      { PERCOLATOR_DYNAMODB_ENDPOINT: 'https://dynamodb.eu-west-1.amazonaws.com', AWS_REGION: 'eu-west-1' },
    ]) {
      const target = await dynamoDbTarget(env);
      expect(target.credentials).toBeUndefined();
      expect(target.storeOptions('ns')).not.toHaveProperty('credentials');
    }
  });
});
