/**
 * The dispatcher's configuration (`parseDispatcherEnv`, `functions/lib/entry/config.ts`) and its
 * bundle (`functions/dispatch/index.ts`): its own variables and the stage functions' it shares,
 * and a bundle that carries none of the pipeline or of the tools, only the AWS SDK's clients
 * from the runtime.
 */
import { describe, expect, it } from 'vitest';
import { DerivedKeyring } from '../../functions/lib/artifact/keyring.js';
import { ConfigError, parseDispatcherEnv } from '../../functions/lib/entry/config.js';
import { makeDispatcher } from '../../functions/lib/entry/dispatch.js';
import type { AssumeRoleInput, InvokeInput } from '../../functions/lib/entry/dispatch-aws.js';
import {
  createDispatcherDeps,
  dispatcherEntry,
  UNSEALED_KEYRING,
  UNSEALED_TAG,
} from '../../functions/lib/entry/dispatch-entry.js';
import type { AwsClients } from '../../functions/lib/entry/lambda-base.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { runSessionPolicy } from '../../infra/aws/run-policy.js';
import { FUNCTION_BUNDLE_MAX_BYTES, functionBundleFacts } from '../../layers/bundle.js';
import { clusterDocJson } from './support/cluster-doc.js';
import { clusterInstallRecord } from './support/cluster-records.js';
import { decodeEksToken, signedFor } from './support/eks-token.js';

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

  it('needs its own role id with the sender check, its queue, a role ARN, an s3 registry, a stage, no bucket prefix', () => {
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
    expect(problems({ ...ENV, KAPP_LAMBDA_BUCKET_PREFIX: 'kapp/' })).toEqual(['KAPP_LAMBDA_BUCKET_PREFIX']);
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
        // The rollout state machine compares versions (`packaging/versions.ts`, `semver.ts`: pure).
        /^functions\/lib\/(deploy|template|packaging\/(?!versions|semver)|reconcile\/(?!redact|result|secret-mask|timer))/.test(
          f,
        ),
      ),
    ).toEqual([]);
    expect(inputs.filter((f) => /^node_modules\/(tar|@kubernetes|@aws-sdk|@smithy)\//.test(f))).toEqual([]);
    expect(inputs).toEqual(
      expect.arrayContaining(['lambda-runtime:@aws-sdk/client-sts', 'lambda-runtime:@aws-sdk/client-lambda']),
    );
  }, 60_000);
});

/** The dispatcher role's own credentials (what signs the eks clusters' tokens). */
const DISPATCHER_CREDENTIALS = {
  accessKeyId: 'AKIADISPATCHER',
  secretAccessKey: 'dispatcher-secret',
  sessionToken: 'dispatcher-session',
};

describe('createDispatcherDeps', () => {
  const FORWARDER = 'AROAFORWARDERALPHA01';
  /** A cluster document: `eks` auth, cluster alpha's forwarder. */
  const doc = (id: string) =>
    clusterDocJson(
      id,
      { kind: 'eks', clusterName: id, region: 'eu-west-1' },
      id === 'alpha' ? { forwarder: { roleId: FORWARDER } } : {},
    );

  /** Fake S3 (the registry's documents) and SQS (every receipt handle proven) clients; fake STS and Lambda calls. */
  function setup() {
    const reads: string[] = [];
    const s3 = {
      async send(cmd: { constructor: { name: string }; input: { Bucket?: string; Key?: string; Prefix?: string } }) {
        reads.push(`${cmd.constructor.name} ${cmd.input.Bucket}/${cmd.input.Key ?? cmd.input.Prefix}`);
        // The artifact bucket holds no rollout policy: the install dispatcher's listing finds none.
        if (cmd.constructor.name === 'ListObjectsV2Command') return { Contents: [], IsTruncated: false };
        const m = /^registry\/clusters\/([a-z0-9-]+)\.json$/.exec(cmd.input.Key ?? '');
        if (cmd.constructor.name !== 'GetObjectCommand' || cmd.input.Bucket !== 'fleet-registry' || !m) {
          throw Object.assign(new Error('NoSuchKey'), { name: 'NoSuchKey' });
        }
        const body = Buffer.from(doc(m[1] as string));
        return {
          Body: (async function* () {
            yield body;
          })(),
          ETag: '"1"',
          ContentLength: body.length,
        };
      },
    };
    const sqs = {
      async send(cmd: { input: { Entries?: { Id: string }[] } }) {
        return { Successful: (cmd.input.Entries ?? []).map((e) => ({ Id: e.Id })), Failed: [] };
      },
    };
    const assumed: AssumeRoleInput[] = [];
    const log = memoryLogger();
    const invoked: InvokeInput[] = [];
    const config = parseDispatcherEnv({
      ...ENV,
      KAPP_LAMBDA_DISPATCH_STAGE: 'install',
      KAPP_LAMBDA_QUEUE_URL_INSTALL: 'https://sqs.eu-west-1.amazonaws.com/123456789012/install.fifo',
      KAPP_LAMBDA_CLUSTER_SHARE: undefined,
    });
    const deps = createDispatcherDeps(
      config,
      { s3, sqs } as unknown as AwsClients,
      new DerivedKeyring(Buffer.alloc(32, 9)),
      {
        log,
        credentials: async () => DISPATCHER_CREDENTIALS,
        sdk: {
          async assumeRole(input) {
            assumed.push(input);
            return {
              Credentials: {
                AccessKeyId: 'AKIA',
                SecretAccessKey: 's',
                SessionToken: 't',
                Expiration: new Date(2_000_000_000_000),
              },
            };
          },
          async invoke(input) {
            invoked.push(input);
            return { StatusCode: 200, Payload: new TextEncoder().encode(JSON.stringify({ batchItemFailures: [] })) };
          },
        },
      },
    );
    return { dispatch: makeDispatcher('install', deps), reads, assumed, invoked, log };
  }

  it("runs a forwarder's record as its cluster's run session, invoking the stage function as the cluster's tenant", async () => {
    const t = setup();
    const alpha = clusterInstallRecord('alpha', 'pi', 'm1');
    alpha.attributes = { ...alpha.attributes, SenderId: `${FORWARDER}:pod` };
    const beta = clusterInstallRecord('beta', 'pi', 'm2');
    beta.attributes = { ...beta.attributes, SenderId: `${FORWARDER}:pod` };
    const answer = await t.dispatch({ Records: [alpha, beta] });
    expect(answer).toEqual({ batchItemFailures: [] });
    // beta's forwarder is not alpha's: refused before any session.
    expect(t.assumed.map((a) => [a.RoleArn, a.RoleSessionName])).toEqual([[ENV.KAPP_LAMBDA_RUN_ROLE_ARN, 'alpha']]);
    expect(t.assumed[0]?.Policy).toContain('arn:aws-us-gov:s3:::fleet-registry/registry/clusters/alpha.json');
    expect(t.invoked.map((i) => [i.FunctionName, i.TenantId, i.InvocationType])).toEqual([
      ['kapp-lambda-deploy', 'alpha', 'RequestResponse'],
    ]);
    const payload = JSON.parse(new TextDecoder().decode(t.invoked[0]?.Payload));
    expect(payload).toMatchObject({ clusterId: 'alpha', credentials: { accessKeyId: 'AKIA' } });
    expect(payload.records.map((r: { messageId: string }) => r.messageId)).toEqual(['m1']);
    // alpha is an eks cluster: the run gets a token the dispatcher signed with its own role, for alpha.
    const url = decodeEksToken(payload.eksToken.token);
    const token = url.searchParams;
    expect(token.get('X-Amz-Credential')).toMatch(/^AKIADISPATCHER\//);
    expect(token.get('X-Amz-Security-Token')).toBe('dispatcher-session');
    expect(signedFor(url, 'alpha', DISPATCHER_CREDENTIALS)).toBe(true);
    expect(signedFor(url, 'beta', DISPATCHER_CREDENTIALS)).toBe(false);
    // The registry is read for documents only: no token, no secret; the artifact bucket for the
    // rollout policies only (none here: the batch carries no view).
    expect(t.reads.filter((r) => !r.startsWith('GetObjectCommand fleet-registry/registry/clusters/'))).toEqual([
      'ListObjectsV2Command fleet-artifacts/state/rollout-policies/',
    ]);
    expect(payload.rollouts).toBeUndefined();
  });
});

describe('dispatcherEntry: the artifact root key', () => {
  const INSTALL = {
    ...ENV,
    KAPP_LAMBDA_DISPATCH_STAGE: 'install',
    KAPP_LAMBDA_QUEUE_URL_INSTALL: 'https://sqs.eu-west-1.amazonaws.com/123456789012/install.fifo',
  };

  it("is read by a sealing stage's dispatcher: without its variable the start fails", () => {
    expect(() => dispatcherEntry('file:///var/task/index.mjs', undefined, ENV)).toThrow(
      'KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET',
    );
  });

  it("is not read by install's, which the stack gives neither the variable nor the secret: its runs reach no sealed or domain key", async () => {
    expect(typeof dispatcherEntry('file:///var/task/index.mjs', undefined, INSTALL)).toBe('function');
    const keys = await UNSEALED_KEYRING.keysFor('alpha');
    expect(keys.tag).toBe(UNSEALED_TAG);
    for (const sharing of ['fleet', 'cluster'] as const) {
      const doc = runSessionPolicy('install', 'alpha', keys.tag, {
        partition: 'aws',
        region: 'eu-west-1',
        account: '123456789012',
        bucket: 'fleet-artifacts',
        registry: { bucket: 'fleet-registry', prefix: 'registry/' },
        sharing,
      });
      // Its cluster's fleet index entries and receipts, and the shared renders (issue 28): no key a tag fences.
      const objects = doc.Statement.flatMap((st) => st.Resource).filter((r) =>
        r.startsWith('arn:aws:s3:::fleet-artifacts/'),
      );
      expect(objects).toEqual([
        'arn:aws:s3:::fleet-artifacts/state/fleet/alpha/*',
        'arn:aws:s3:::fleet-artifacts/receipts/alpha/*',
        'arn:aws:s3:::fleet-artifacts/artifacts/*',
      ]);
      expect(JSON.stringify(doc)).not.toContain(UNSEALED_TAG);
    }
  });
});
