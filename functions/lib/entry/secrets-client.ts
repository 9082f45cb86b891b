/**
 * The functions' Secrets Manager client, apart from the entry's cold path (`./main.ts` imports
 * it when it starts reading the artifact root key): the AWS SDK is the Lambda runtime's, loaded
 * only when used, so a bundle started without it still reports its configuration errors.
 *
 * @module
 */
import { SecretsManagerClient } from '@aws-sdk/client-secrets-manager';
import type { AwsCredentialIdentityProvider } from '@smithy/types';
import type { LambdaConfig } from './config.js';

/**
 * A Secrets Manager client of the function (the artifact root key, `token` clusters'
 * ServiceAccount tokens): the config's region, and `secretsManagerEndpoint` when set (a
 * compatible server in tests). Credentials from `credentials` when given (a stage behind the
 * dispatcher: the run session's, `RunCredentialHolder.credentials`), else the SDK's default chain.
 */
export function createSecretsManagerClient(
  config: Pick<LambdaConfig, 'region' | 'secretsManagerEndpoint'>,
  credentials?: AwsCredentialIdentityProvider,
): SecretsManagerClient {
  return new SecretsManagerClient({
    region: config.region,
    ...(credentials ? { credentials } : {}),
    ...(config.secretsManagerEndpoint ? { endpoint: config.secretsManagerEndpoint } : {}),
  });
}
