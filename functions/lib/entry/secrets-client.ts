/**
 * The functions' Secrets Manager client, apart from the entry's cold path (`./main.ts` imports
 * it when it starts reading the artifact root key): the AWS SDK is the Lambda runtime's, loaded
 * only when used, so a bundle started without it still reports its configuration errors.
 *
 * @module
 */
import { SecretsManagerClient } from '@aws-sdk/client-secrets-manager';
import type { LambdaConfig } from './config.js';

/**
 * A Secrets Manager client of the function (the artifact root key, `token` clusters'
 * ServiceAccount tokens): the config's region, and `secretsManagerEndpoint` when set (a
 * compatible server in tests). Credentials from the SDK's default provider chain.
 */
export function createSecretsManagerClient(
  config: Pick<LambdaConfig, 'region' | 'secretsManagerEndpoint'>,
): SecretsManagerClient {
  return new SecretsManagerClient({
    region: config.region,
    ...(config.secretsManagerEndpoint ? { endpoint: config.secretsManagerEndpoint } : {}),
  });
}
