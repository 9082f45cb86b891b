/**
 * The AWS SDK clients of a Lambda function, made with the SDK (the Lambda runtime's, `NODE_PATH`).
 * Loaded only when a client is first used (`lazyAwsClients` of `./lambda.ts` imports this
 * module on the first `send`), so the SDK's modules (80–200 ms to load) are not part of a
 * function's start nor of a first call that sends nothing.
 *
 * @module
 */
import { S3Client } from '@aws-sdk/client-s3';
import { SQSClient } from '@aws-sdk/client-sqs';
import type { AwsCredentialIdentityProvider } from '@smithy/types';
import type { LambdaConfig } from './config.js';

/** The SDK clients of one function process. */
export interface SdkClients {
  /** Artifacts, render cache, receipts. */
  s3: S3Client;
  /** Hand-offs to the next stage's queue. */
  sqs: SQSClient;
}

/**
 * Creates the SDK clients. Credentials come from `credentials` when given (a stage behind the
 * dispatcher: `RunCredentialHolder.credentials` of `./dispatched.ts`, the run session's of each
 * invocation, docs/decisions.md D15), else from the SDK's default provider chain
 * (on Lambda: the function role's temporary credentials); an `s3Endpoint` switches S3 to
 * path-style addressing (S3-compatible servers).
 */
export function createAwsClients(
  config: Pick<LambdaConfig, 'region' | 's3Endpoint' | 'sqsEndpoint'>,
  credentials?: AwsCredentialIdentityProvider,
): SdkClients {
  const signing = credentials ? { credentials } : {};
  return {
    s3: new S3Client({
      region: config.region,
      ...signing,
      ...(config.s3Endpoint ? { endpoint: config.s3Endpoint, forcePathStyle: true } : {}),
    }),
    sqs: new SQSClient({
      region: config.region,
      ...signing,
      ...(config.sqsEndpoint ? { endpoint: config.sqsEndpoint } : {}),
    }),
  };
}
