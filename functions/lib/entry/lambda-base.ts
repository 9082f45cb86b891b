/**
 * What every Lambda function's composition shares, kept apart from the stage functions' own
 * (`./lambda.ts`, which brings the pipeline) so that the dispatcher's (`./dispatch-entry.ts`)
 * carries none of it: the lazily made AWS clients and the logger.
 *
 * @module
 */
import type { S3Client } from '@aws-sdk/client-s3';
import type { AwsCredentialIdentityProvider } from '@smithy/types';
import pino from 'pino';
import type { Logger } from '../log.js';
import type { SqsSendClient } from '../transport/sqs.js';
import type { LambdaConfig } from './config.js';

/** The AWS clients of one function process: what the ports send their commands through. */
export interface AwsClients {
  /** Artifacts, render cache, receipts. */
  s3: Pick<S3Client, 'send'>;
  /** Hand-offs to the next stage's queue. */
  sqs: SqsSendClient;
  /**
   * What the clients sign with, and so the fleet registry's Secrets Manager client and EKS tokens
   * too: a stage behind the dispatcher passes the run session's (`RunCredentialHolder.credentials`).
   * Default the SDK's default chain (the function role).
   */
  credentials?: AwsCredentialIdentityProvider;
}

/**
 * A client whose SDK module is loaded, and the client made, on the first `send` (`make` runs
 * once; concurrent first sends share it).
 */
export function lazySendClient<C extends { send: (...args: never[]) => Promise<unknown> }>(
  make: () => Promise<C>,
): Pick<C, 'send'> {
  let made: Promise<C> | undefined;
  const send = async (...args: unknown[]): Promise<unknown> => {
    made ??= make();
    return await ((await made).send as (...a: unknown[]) => Promise<unknown>)(...args);
  };
  return { send: send as unknown as C['send'] };
}

/**
 * The function's S3 and SQS clients (`createAwsClients` of `./aws-clients.ts`), each made on its
 * first `send`: a cold start loads none of the SDK's modules, a first call that sends nothing
 * (an empty batch, a record for a cluster this function does not serve) none either.
 */
export function lazyAwsClients(
  config: Pick<LambdaConfig, 'region' | 's3Endpoint' | 'sqsEndpoint'>,
  credentials?: AwsCredentialIdentityProvider,
): AwsClients {
  let sdk: Promise<import('./aws-clients.js').SdkClients> | undefined;
  const clients = () => (sdk ??= import('./aws-clients.js').then((m) => m.createAwsClients(config, credentials)));
  return {
    s3: lazySendClient(async () => (await clients()).s3),
    sqs: lazySendClient(async () => (await clients()).sqs),
    ...(credentials ? { credentials } : {}),
  };
}

/**
 * The function's logger: pino, JSON lines on stdout (Lambda ships them to CloudWatch Logs),
 * written synchronously so nothing is lost when Lambda freezes the process after a response.
 * Every line carries `function: <stage>`.
 */
export function createLambdaLogger(config: Pick<LambdaConfig, 'stage' | 'logLevel'>): Logger {
  return pino(
    { level: config.logLevel, base: { function: config.stage }, timestamp: pino.stdTimeFunctions.isoTime },
    pino.destination({ fd: 1, sync: true }),
  );
}

/** The SDK's default credential chain (`@aws-sdk/credential-provider-node`), loaded on the first ask. */
export function lazyDefaultProvider(): AwsCredentialIdentityProvider {
  let provider: Promise<AwsCredentialIdentityProvider> | undefined;
  return async (props) => {
    provider ??= import('@aws-sdk/credential-provider-node').then((m) => m.defaultProvider());
    return await (await provider)(props);
  };
}
