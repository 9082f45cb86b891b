/**
 * The dispatcher's STS and Lambda clients (`@aws-sdk/client-sts`, `@aws-sdk/client-lambda`, the
 * Lambda runtime's, `NODE_PATH`), as the one call each adapter of `./dispatch-aws.ts` makes.
 * Loaded only when the first record of a cluster needs a run session (`./dispatch-entry.ts`
 * imports this module on first use), so a cold start loads neither client, as `./aws-clients.ts`.
 *
 * @module
 */
import { InvokeCommand, LambdaClient } from '@aws-sdk/client-lambda';
import { AssumeRoleCommand, STSClient } from '@aws-sdk/client-sts';
import type { DispatcherConfig } from './config.js';
import type { AssumeRoleInput, AssumeRoleOutput, InvokeInput, InvokeOutput } from './dispatch-aws.js';

/** The two SDK calls of a dispatcher. */
export interface DispatchSdk {
  /** `sts:AssumeRole` (`StsRunCredentialsOptions.assumeRole`). */
  assumeRole(input: AssumeRoleInput): Promise<AssumeRoleOutput>;
  /** `lambda:InvokeFunction` (`LambdaStageInvokerOptions.invoke`). */
  invoke(input: InvokeInput): Promise<InvokeOutput>;
}

/**
 * Creates the clients: the config's region, `stsEndpoint` and `lambdaEndpoint` when set (emulators),
 * credentials from the SDK's default provider chain (on Lambda: the dispatcher role's).
 */
export function createDispatchSdk(
  config: Pick<DispatcherConfig, 'region' | 'stsEndpoint' | 'lambdaEndpoint'>,
): DispatchSdk {
  const sts = new STSClient({
    region: config.region,
    ...(config.stsEndpoint ? { endpoint: config.stsEndpoint } : {}),
  });
  const lambda = new LambdaClient({
    region: config.region,
    ...(config.lambdaEndpoint ? { endpoint: config.lambdaEndpoint } : {}),
  });
  return {
    assumeRole: async (input) => await sts.send(new AssumeRoleCommand(input)),
    invoke: async (input) => await lambda.send(new InvokeCommand(input)),
  };
}
