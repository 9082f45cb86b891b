/**
 * The dispatcher's configuration (`parseDispatcherEnv`, `functions/lib/entry/config.ts`) and its
 * bundle (`functions/dispatch/index.ts`): its own variables and the stage functions' it shares,
 * and a bundle that carries none of the pipeline or of the tools, only the AWS SDK's clients
 * from the runtime.
 */
import { describe, expect, it } from 'vitest';
import { ConfigError, parseDispatcherEnv } from '../../functions/lib/entry/config.js';
import { FUNCTION_BUNDLE_MAX_BYTES, functionBundleFacts } from '../../layers/bundle.js';

const ENV = {
  AWS_REGION: 'eu-west-1',
  KAPP_LAMBDA_BUCKET: 'fleet-artifacts',
  KAPP_LAMBDA_CLUSTER_REGISTRY: 's3://fleet-registry/registry/',
  KAPP_LAMBDA_DISPATCH_STAGE: 'deploy',
  KAPP_LAMBDA_RUN_ROLE_ARN: 'arn:aws-us-gov:iam::123456789012:role/kapp/run-deploy',
  KAPP_LAMBDA_STAGE_FUNCTION: 'kapp-lambda-deploy',
  KAPP_LAMBDA_QUEUE_URL_DEPLOY: 'https://sqs.eu-west-1.amazonaws.com/123456789012/deploy.fifo',
  KAPP_LAMBDA_SENDER_CHECK: 'registry',
  KAPP_LAMBDA_FUNCTION_SENDERS: 'fetch=AROARUNFETCH00000001,template=AROARUNTEMPLATE00001',
  KAPP_LAMBDA_RECEIVER_ROLE_ID: 'AROADISPATCHDEPLOY01',
  KAPP_LAMBDA_CLUSTER_SHARE: '4',
  KAPP_LAMBDA_STS_ENDPOINT: 'http://127.0.0.1:5000',
};

describe('parseDispatcherEnv', () => {
  it("reads the stage, the run role's partition and account, the stage function, its queue and the sender check", () => {
    const c = parseDispatcherEnv(ENV);
    expect(c).toMatchObject({
      stage: 'deploy',
      partition: 'aws-us-gov',
      account: '123456789012',
      runRoleArn: ENV.KAPP_LAMBDA_RUN_ROLE_ARN,
      stageFunction: 'kapp-lambda-deploy',
      queueUrl: ENV.KAPP_LAMBDA_QUEUE_URL_DEPLOY,
      stsEndpoint: 'http://127.0.0.1:5000',
      clusterRegistry: { location: { kind: 's3', bucket: 'fleet-registry', prefix: 'registry/' } },
      senderCheck: {
        receiverRoleId: 'AROADISPATCHDEPLOY01',
        functionSenders: [
          { stage: 'fetch', roleId: 'AROARUNFETCH00000001' },
          { stage: 'template', roleId: 'AROARUNTEMPLATE00001' },
        ],
      },
      shares: { cluster: 4, namespace: 2 },
      maxReceiveCount: 5,
    });
    expect(c.lambdaEndpoint).toBeUndefined();
  });

  it('needs its own role id with the sender check, its queue, a role ARN, an s3 registry and a stage', () => {
    const problems = (env: Record<string, string | undefined>) => {
      try {
        parseDispatcherEnv(env);
      } catch (e) {
        expect(e).toBeInstanceOf(ConfigError);
        return (e as ConfigError).problems.map((p) => p.slice(0, p.indexOf(':')));
      }
      return [];
    };
    expect(problems({ ...ENV, KAPP_LAMBDA_RECEIVER_ROLE_ID: undefined })).toEqual(['KAPP_LAMBDA_RECEIVER_ROLE_ID']);
    expect(problems({ ...ENV, KAPP_LAMBDA_SENDER_CHECK: 'off', KAPP_LAMBDA_RECEIVER_ROLE_ID: undefined })).toEqual([]);
    expect(problems({ ...ENV, KAPP_LAMBDA_QUEUE_URL_DEPLOY: undefined })).toEqual(['KAPP_LAMBDA_QUEUE_URL_DEPLOY']);
    expect(problems({ ...ENV, KAPP_LAMBDA_RUN_ROLE_ARN: 'arn:aws:iam::123:user/x' })).toEqual([
      'KAPP_LAMBDA_RUN_ROLE_ARN',
    ]);
    expect(problems({ ...ENV, KAPP_LAMBDA_CLUSTER_REGISTRY: 'file:///registry' })).toEqual([
      'KAPP_LAMBDA_CLUSTER_REGISTRY',
    ]);
    expect(problems({ ...ENV, KAPP_LAMBDA_DISPATCH_STAGE: 'forwarder' })).toContain('KAPP_LAMBDA_DISPATCH_STAGE');
    expect(problems({ ...ENV, KAPP_LAMBDA_STAGE_FUNCTION: undefined })).toEqual(['KAPP_LAMBDA_STAGE_FUNCTION']);
  });
});

describe('the dispatcher bundle', () => {
  it('holds none of the pipeline, of the stages or of the tools, and loads the AWS SDK from the runtime', async () => {
    const { inputs, bytes } = await functionBundleFacts('dispatch');
    expect(bytes).toBeLessThanOrEqual(FUNCTION_BUNDLE_MAX_BYTES);
    expect(inputs).toContain('functions/lib/entry/dispatch.ts');
    // `pipeline/attempts.ts` is a constant (the default receive count).
    expect(inputs.filter((f) => f.startsWith('functions/lib/pipeline/') && !f.endsWith('/attempts.ts'))).toEqual([]);
    expect(
      inputs.filter((f) =>
        /^functions\/lib\/(deploy|template|packaging|reconcile\/(?!redact|result|secret-mask|timer))/.test(f),
      ),
    ).toEqual([]);
    expect(inputs.filter((f) => /^node_modules\/(tar|@kubernetes|@aws-sdk|@smithy)\//.test(f))).toEqual([]);
    expect(inputs).toEqual(
      expect.arrayContaining(['lambda-runtime:@aws-sdk/client-sts', 'lambda-runtime:@aws-sdk/client-lambda']),
    );
  }, 60_000);
});
