/**
 * The CDK app's stack, synthesized offline: no AWS credentials, no network, no lookups. The
 * functions' code is the real esbuild bundles (`bundleFunctions`, the project's one recipe); the
 * layers are one small directory instead of `npm run build:layers` output: the tool layers are
 * 100+ MB of Go binaries per stage that would have to be built (minutes) and copied for a test
 * that only checks how a layer directory is wired, which a small directory shows as well.
 */
import { readFileSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { App, aws_iam as iam, aws_lambda as lambda, type aws_s3_assets as s3assets, Validations } from 'aws-cdk-lib';
import { Match, Template } from 'aws-cdk-lib/assertions';
import { AwsSolutionsChecks } from 'cdk-nag';
import type { IConstruct } from 'constructs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROLLOUT_CHECK_EVENT_TYPE, SOURCE_POLL_EVENT_TYPE } from '../../events/schema.js';
import { PIPELINE_STAGES, type PipelineStage, queueUrlEnv } from '../../functions/lib/api/functions.js';
import { fetchCacheKey, INFLIGHT_PREFIX, inflightKey, renderCacheKey } from '../../functions/lib/artifact/keys.js';
import {
  NEXT_STAGES,
  parseFunctionSender,
  parseLambdaEnv,
  STAGE_RECORD_CONCURRENCY,
} from '../../functions/lib/entry/config.js';
import {
  ARTIFACT_ROOT_KEY_SECRET_ENV,
  artifactKeyringFromEnv,
  LEGACY_ARTIFACT_ROOT_KEY_ENV,
  usesArtifactKey,
} from '../../functions/lib/entry/lambda.js';
import { STAGE_TOOLS } from '../../functions/lib/exec/runner.js';
import { LEASE_PREFIX, leaseKey } from '../../functions/lib/lease/index.js';
import { repoPointerKey } from '../../functions/lib/packaging/repo-index.js';
import { DEFAULT_MAX_ATTEMPTS } from '../../functions/lib/pipeline/retry-bound.js';
import { SOURCE_POLL_PREFIX } from '../../functions/lib/pipeline/source-poll.js';
import { domainKey } from '../../functions/lib/store/domain.js';
import { stageAssets } from '../../infra/aws/assets.js';
import { fleetSettings, URL_POLICY_STAGES } from '../../infra/aws/fleet.js';
import { KappLambdaStack, runSenders } from '../../infra/aws/stack.js';
import {
  dispatcherTimeoutSeconds,
  EXPIRING_PREFIXES,
  FORWARDER_STAGES,
  INFLIGHT_EXPIRY_DAYS,
  LEASE_EXPIRY_DAYS,
  PER_CLUSTER_PREFIXES,
  PRIVATE_EXPIRY_DAYS,
  registryPrefixProblem,
  STAGE_OBJECTS,
  STAGE_SIZING,
  stageTimeoutSeconds,
  tokenSecretPattern,
} from '../../infra/aws/stages.js';
import { layerToolVersions } from '../../layers/build.js';
import { bundleFunctions } from '../../layers/bundle.js';
import { HARDEN_ADDON_NAME } from '../../layers/native.js';
import { forwarderTrustPolicy } from '../../scripts/cluster-join.js';
import { concreteEnv, standInRoleId } from './template-env.js';

type Json = Record<string, unknown>;

/** The EKS cluster of the one forwarder the test's context declares (cluster id `prod-eu-1`). */
const PROD_CLUSTER_ARN = 'arn:aws:eks:eu-west-1:123456789012:cluster/prod-eu-1';
type Resource = { Type: string; Properties: Json };

let tmp: string;
let app: App;
let stack: KappLambdaStack;
/** The same app with the registry in a bucket of its own (`clusterRegistryBucket`). */
let apart: KappLambdaStack;
/** The same fleet with an account and region, as `cdk deploy` synthesizes it. */
let deployed: KappLambdaStack;
/** A fleet with every operator option: a customer key, reserved concurrency, a VPC. */
let optioned: KappLambdaStack;
/** The functions' code and layer directories every stack of this file is built from. */
let assets: ReturnType<typeof stageAssets>;
/** The dispatchers' bundle directory (`functions/dispatch/index.ts`). */
let dispatcherCodeDir: string;
let template: Template;
let resources: Record<string, Resource>;

/** Logical id of the CloudFormation resource behind a construct. */
const logicalId = (c: IConstruct) => stack.resolve(stack.getLogicalId(c.node.defaultChild as never)) as string;
const ofType = (type: string) => Object.entries(resources).filter(([, r]) => r.Type === type);
const stageOf = (fnId: string): PipelineStage => {
  const s = PIPELINE_STAGES.find((st) => logicalId(stack.stages[st].fn) === fnId);
  if (!s) throw new Error(`no stage has function ${fnId}`);
  return s;
};
/** Logical id of the one Secrets Manager secret of the stack: the artifact root key. */
const rootKeyId = (): string => {
  const secrets = ofType('AWS::SecretsManager::Secret');
  expect(secrets).toHaveLength(1);
  return secrets[0]![0];
};
/** The statements of the inline policies attached to a role. */
const roleStatements = (roleId: string): Json[] =>
  ofType('AWS::IAM::Policy')
    .filter(([, p]) => (p.Properties.Roles as Json[]).some((r) => r.Ref === roleId))
    .flatMap(([, p]) => (p.Properties.PolicyDocument as { Statement: Json[] }).Statement);
const list = <T>(v: T | T[]): T[] => (Array.isArray(v) ? v : [v]);
/**
 * `schedule` invokes `fn` with `input` at `expression`, no retry, and Lambda's own asynchronous
 * retries of `fn` are off too (the next period is the retry); an event waits `maxAgeSeconds` at most.
 */
const expectScheduleInvokes = (
  schedule: IConstruct,
  fn: IConstruct,
  want: { expression: string; input: Json; maxAgeSeconds: number },
) => {
  const r = resources[logicalId(schedule)]!;
  expect(r.Type).toBe('AWS::Scheduler::Schedule');
  expect(r.Properties).toMatchObject({
    ScheduleExpression: want.expression,
    State: 'ENABLED',
    FlexibleTimeWindow: { Mode: 'OFF' },
    Target: {
      Arn: { 'Fn::GetAtt': [logicalId(fn), 'Arn'] },
      RetryPolicy: { MaximumRetryAttempts: 0, MaximumEventAgeInSeconds: want.maxAgeSeconds },
    },
  });
  expect(JSON.parse((r.Properties.Target as { Input: string }).Input)).toEqual(want.input);
  template.hasResourceProperties('AWS::Lambda::EventInvokeConfig', {
    FunctionName: { Ref: logicalId(fn) },
    MaximumRetryAttempts: 0,
    MaximumEventAgeInSeconds: want.maxAgeSeconds,
  });
};
/** `schedule` runs as a role the scheduler of this account assumes, allowed to invoke `fn` (and its versions) only. */
const expectScheduleRole = (schedule: IConstruct, fn: IConstruct) => {
  const target = resources[logicalId(schedule)]!.Properties.Target as Json;
  const roleId = (target.RoleArn as { 'Fn::GetAtt': string[] })['Fn::GetAtt'][0]!;
  const trust = (resources[roleId]!.Properties.AssumeRolePolicyDocument as { Statement: Json[] }).Statement;
  expect(trust).toHaveLength(1);
  expect(trust[0]).toMatchObject({
    Effect: 'Allow',
    Principal: { Service: 'scheduler.amazonaws.com' },
    Action: 'sts:AssumeRole',
    Condition: { StringEquals: { 'aws:SourceAccount': { Ref: 'AWS::AccountId' } } },
  });
  const fnArn = { 'Fn::GetAtt': [logicalId(fn), 'Arn'] };
  expect(roleStatements(roleId)).toEqual([
    {
      Effect: 'Allow',
      Action: 'lambda:InvokeFunction',
      Resource: [fnArn, { 'Fn::Join': ['', [fnArn, ':*']] }],
    },
  ]);
};
const pascal = (stage: string) => stage.replace(/(^|-)([a-z])/g, (_, __, c: string) => c.toUpperCase());
/** The secret ARN a stage's token statement names (a pattern over this account and region). */
const tokenSecretArn = (stage: PipelineStage) => ({
  'Fn::Join': [
    '',
    [
      'arn:',
      { Ref: 'AWS::Partition' },
      ':secretsmanager:',
      { Ref: 'AWS::Region' },
      ':',
      { Ref: 'AWS::AccountId' },
      `:secret:kapp-lambda/*/${stage}-??????`,
    ],
  ],
});
/** `arn-of-bucket/<suffix>` of an `Fn::Join` object ARN, or undefined for another resource. */
const objectSuffix = (resource: unknown): string | undefined => {
  const parts = (resource as { 'Fn::Join'?: [string, unknown[]] })['Fn::Join']?.[1];
  if (parts?.length !== 2) return undefined;
  const [arn, suffix] = parts as [Json, string];
  return (arn['Fn::GetAtt'] as string[] | undefined)?.[0] === logicalId(stack.bucket) ? suffix : undefined;
};

/** The fleet's URL allow-list of the main stack's context, as `cdk.json` would hold it. */
const URL_ALLOW = ['registry.corp:443', '10.20.0.0/16'];

beforeAll(async () => {
  // No credentials of any kind reach the synth (it must not need them).
  for (const k of Object.keys(process.env)) if (k.startsWith('AWS_') || k.startsWith('CDK_')) delete process.env[k];
  process.env.AWS_EC2_METADATA_DISABLED = 'true';
  tmp = await mkdtemp(path.join(tmpdir(), 'kapp-lambda-cdk-'));
  const { dispatch, ...code } = await bundleFunctions([...PIPELINE_STAGES, 'dispatch'], path.join(tmp, 'code'));
  dispatcherCodeDir = dispatch;
  const layer = path.join(tmp, 'layer');
  await mkdir(path.join(layer, 'lib'), { recursive: true });
  await writeFile(path.join(layer, 'lib', HARDEN_ADDON_NAME), 'stand-in for the hardening addon\n');
  const layers = Object.fromEntries(PIPELINE_STAGES.map((s) => [s, layer])) as Record<PipelineStage, string>;
  assets = stageAssets(code, layers);
  // Asset staging off: the template names the directories in place instead of copying 5 bundles.
  app = new App({ outdir: path.join(tmp, 'cdk.out'), context: { 'aws:cdk:disable-asset-staging': true } });
  const context: Record<string, unknown> = {
    concurrency: '{"deploy": 25}',
    sourcePollMinutes: '2',
    forwarders: JSON.stringify({ 'prod-eu-1': { eksClusterArn: PROD_CLUSTER_ARN } }),
    urlAllow: URL_ALLOW,
  };
  stack = new KappLambdaStack(app, 'KappLambda', {
    assets,
    dispatcherCodeDir,
    architecture: lambda.Architecture.ARM_64,
    fleet: fleetSettings((k) => context[k]),
  });
  const apartContext: Record<string, unknown> = {
    clusterRegistryBucket: 'fleet-registry',
    clusterRegistryPrefix: 'kapp-lambda',
  };
  apart = new KappLambdaStack(app, 'KappLambdaApart', {
    assets,
    dispatcherCodeDir,
    architecture: lambda.Architecture.ARM_64,
    fleet: fleetSettings((k) => apartContext[k]),
  });
  // As `cdk deploy` synthesizes it: with an account and a region (cdk-nag then sees them in ARNs).
  deployed = new KappLambdaStack(app, 'KappLambdaDeployed', {
    env: { account: '111122223333', region: 'eu-west-1' },
    assets,
    dispatcherCodeDir,
    architecture: lambda.Architecture.ARM_64,
    fleet: fleetSettings((k) => context[k]),
  });
  optioned = new KappLambdaStack(app, 'KappLambdaOptioned', {
    env: { account: '111122223333', region: 'eu-west-1' },
    assets,
    dispatcherCodeDir,
    architecture: lambda.Architecture.ARM_64,
    fleet: fleetSettings((k) => OPTIONS[k]),
  });
  template = Template.fromStack(stack);
  resources = template.toJSON().Resources as Record<string, Resource>;
}, 300_000);

/** The context of {@link optioned}. */
const OPTIONS: Record<string, unknown> = {
  kmsKeyArn: 'arn:aws:kms:eu-west-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab',
  reservedConcurrency: '{"deploy": 40, "install": 5}',
  vpcId: 'vpc-0a1b2c3d4e5f60718',
  subnetIds: 'subnet-0a1b2c3d,subnet-0e1f2a3b',
  sharing: 'fleet',
  unkeyedGroups: 'accept',
};

afterAll(async () => {
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

describe('synth', () => {
  it('needs no credentials, account, region or context lookup', () => {
    const assembly = app.synth();
    expect(assembly.manifest.missing ?? []).toEqual([]);
    const artifact = assembly.getStackByName('KappLambda');
    expect(artifact.environment.account).toBe('unknown-account');
    expect(artifact.environment.region).toBe('unknown-region');
  });

  it('holds these resources', () => {
    const counts: Record<string, number> = {};
    for (const r of Object.values(resources)) counts[r.Type] = (counts[r.Type] ?? 0) + 1;
    const n = PIPELINE_STAGES.length;
    expect(counts).toEqual({
      'AWS::KMS::Key': 1,
      'AWS::S3::Bucket': 1,
      'AWS::S3::BucketPolicy': 1,
      'AWS::SecretsManager::Secret': 1,
      'AWS::SQS::Queue': 2 * n,
      'AWS::SQS::QueuePolicy': 2 * n,
      // Per stage a stage function and its dispatcher.
      'AWS::Logs::LogGroup': 2 * n,
      // Per stage the function's, the dispatcher's and the run role; the source poll's, the
      // rollout check's, the forwarder's.
      'AWS::IAM::Role': 3 * n + 3,
      'AWS::IAM::Policy': 3 * n + 3,
      'AWS::IAM::ManagedPolicy': 1,
      'AWS::Lambda::LayerVersion': n,
      'AWS::Lambda::Function': 2 * n,
      'AWS::Lambda::EventSourceMapping': n,
      // The scheduled dispatchers' (index-repo, install): no asynchronous retry.
      'AWS::Lambda::EventInvokeConfig': 2,
      'AWS::CloudWatch::Alarm': 3 * n,
      // The source poll, the rollout check.
      'AWS::Scheduler::Schedule': 2,
    });
    const outputs = Object.keys(template.toJSON().Outputs as Json);
    expect(outputs.sort()).toEqual(
      [
        'BucketName',
        'ClusterRegistry',
        'ForwarderPolicyArn',
        'Region',
        'ForwarderRoleArnProdEu1',
        'ForwarderRoleIdProdEu1',
        ...PIPELINE_STAGES.flatMap((s) => [`QueueUrl${pascal(s)}`, `FunctionRoleArn${pascal(s)}`]),
      ].sort(),
    );
  });

  it.each(PIPELINE_STAGES)(
    "%s: the EKS identity it outputs (what join's access entries map) is its dispatcher's role, not the run role",
    (stage) => {
      const { dispatcherRole, runRole } = stack.stages[stage];
      const out = (template.toJSON().Outputs as Json)[`FunctionRoleArn${pascal(stage)}`] as { Value: unknown };
      expect(out.Value).toEqual({ 'Fn::GetAtt': [logicalId(dispatcherRole!), 'Arn'] });
      expect(out.Value).not.toEqual({ 'Fn::GetAtt': [logicalId(runRole!), 'Arn'] });
    },
  );
});

describe('artifact bucket', () => {
  it('is encrypted with the stack key, refuses customer keys, private, TLS only', () => {
    template.hasResourceProperties('AWS::KMS::Key', { EnableKeyRotation: true });
    template.hasResourceProperties('AWS::S3::Bucket', {
      BucketEncryption: {
        ServerSideEncryptionConfiguration: [
          {
            BucketKeyEnabled: true,
            // No customer-keyed (SSE-C) object: a planted one would answer every other reader 400.
            BlockedEncryptionTypes: { EncryptionType: ['SSE-C'] },
            ServerSideEncryptionByDefault: {
              SSEAlgorithm: 'aws:kms',
              KMSMasterKeyID: { 'Fn::GetAtt': [logicalId(stack.artifactKey), 'Arn'] },
            },
          },
        ],
      },
      PublicAccessBlockConfiguration: {
        BlockPublicAcls: true,
        BlockPublicPolicy: true,
        IgnorePublicAcls: true,
        RestrictPublicBuckets: true,
      },
    });
    template.hasResourceProperties('AWS::S3::BucketPolicy', {
      PolicyDocument: {
        Statement: Match.arrayWith([
          Match.objectLike({
            Effect: 'Deny',
            Principal: { AWS: '*' },
            Condition: { Bool: { 'aws:SecureTransport': 'false' } },
          }),
          Match.objectLike({
            Effect: 'Deny',
            Condition: { NumericLessThan: { 's3:TlsVersion': 1.2 } },
          }),
        ]),
      },
    });
  });

  it('expires artifacts, cache, the sharing domains and receipts after 30 days, sealed objects after their TTL, run leases after 30 days, in-flight markers after 1 day, no other state', () => {
    const bucket = ofType('AWS::S3::Bucket')[0]![1];
    const rules = (bucket.Properties.LifecycleConfiguration as { Rules: Json[] }).Rules;
    const expiry = Object.fromEntries(rules.filter((r) => r.Prefix).map((r) => [r.Prefix, r.ExpirationInDays]));
    expect(expiry).toEqual({
      'artifacts/': 30,
      'cache/': 30,
      'd/': 30,
      'private/': PRIVATE_EXPIRY_DAYS,
      'receipts/': 30,
      'state/leases/': LEASE_EXPIRY_DAYS,
      'inflight/': INFLIGHT_EXPIRY_DAYS,
    });
    expect(INFLIGHT_EXPIRY_DAYS).toBe(1);
    // Fleet in-flight markers of both stages are under the rule (a crashed holder's leftovers go).
    expect(INFLIGHT_PREFIX).toBe('inflight/');
    expect(registryPrefixProblem('inflight/')).toBe('the registry must not be under inflight/, which expires');
    // Each stage takes, renews and deletes the markers of its own cache only.
    const markerGrant = (stage: PipelineStage, key: string) =>
      STAGE_OBJECTS[stage].find((g) => new RegExp(`^${g.keys.replaceAll('*', '.*')}$`).test(key))?.actions;
    const fetchMarker = inflightKey(fetchCacheKey('0'.repeat(64)));
    const renderMarker = inflightKey(renderCacheKey('0'.repeat(64)));
    expect(markerGrant('fetch', fetchMarker)).toEqual(['s3:GetObject', 's3:PutObject', 's3:DeleteObject']);
    expect(markerGrant('template', renderMarker)).toEqual(['s3:GetObject', 's3:PutObject', 's3:DeleteObject']);
    expect(markerGrant('fetch', renderMarker)).toBeUndefined();
    expect(markerGrant('template', fetchMarker)).toBeUndefined();
    expect(PRIVATE_EXPIRY_DAYS).toBe(8);
    expect(LEASE_EXPIRY_DAYS).toBe(30);
    // The leases' rule covers exactly the leases' keys: a repository's deployed versions never expire.
    expect(LEASE_PREFIX).toBe('state/leases/');
    const expiring = (key: string) => rules.some((r) => r.Prefix && key.startsWith(r.Prefix as string));
    expect(expiring(leaseKey({ clusterId: 'prod-eu-1', kind: 'App', namespace: 'ns', name: 'app' }))).toBe(true);
    expect(expiring(repoPointerKey('prod-eu-1', 'ns', 'repo'))).toBe(false);
    expect(expiring(fetchMarker) && expiring(renderMarker)).toBe(true);
    // A sharing domain's claims and markers (D17) go with `d/`: a lifecycle prefix has no wildcard.
    const tag = 'a'.repeat(32);
    expect(expiring(domainKey(tag, fetchMarker)) && expiring(domainKey(tag, renderMarker))).toBe(true);
    expect(expiring(domainKey(tag, fetchCacheKey('0'.repeat(64))))).toBe(true);
    expect(registryPrefixProblem('state/leases/')).toBe('the registry must not be under state/leases/, which expires');
    expect(rules.every((r) => r.Status === 'Enabled')).toBe(true);
    // The only rule over every key aborts unfinished uploads: it expires no object.
    expect(rules.filter((r) => !r.Prefix)).toEqual([
      { Id: 'abort-incomplete-uploads', AbortIncompleteMultipartUpload: { DaysAfterInitiation: 1 }, Status: 'Enabled' },
    ]);
    expect([...EXPIRING_PREFIXES, LEASE_PREFIX, INFLIGHT_PREFIX]).toEqual(Object.keys(expiry));
  });

  it('never expires a cluster registry document, nor lets a function write one', () => {
    const doc = `${stack.clusterRegistry.prefix}clusters/prod-eu-1.json`;
    expect(doc).toBe('registry/clusters/prod-eu-1.json');
    const bucket = ofType('AWS::S3::Bucket')[0]![1];
    const rules = (bucket.Properties.LifecycleConfiguration as { Rules: Json[] }).Rules;
    for (const r of rules) if (r.Prefix) expect(doc.startsWith(r.Prefix as string), r.Prefix as string).toBe(false);
    for (const stage of PIPELINE_STAGES) {
      const writes = roleStatements(logicalId(stack.stages[stage].role)).filter((s) =>
        list(s.Action as string[]).some((a) => a === 's3:PutObject' || a === 's3:DeleteObject'),
      );
      for (const s of writes) {
        const re = new RegExp(`^${objectSuffix(s.Resource)!.slice(1).replaceAll('*', '.*')}$`);
        expect(re.test(doc), `${stage} ${objectSuffix(s.Resource)}`).toBe(false);
      }
    }
  });
});

describe('queues and event source mappings', () => {
  it.each(PIPELINE_STAGES)('%s: a FIFO queue redriving to its FIFO dead-letter queue', (stage) => {
    const { queue, deadLetterQueue } = stack.stages[stage];
    const q = resources[logicalId(queue)]!.Properties;
    const dlq = resources[logicalId(deadLetterQueue)]!.Properties;
    expect(q).toMatchObject({
      FifoQueue: true,
      ContentBasedDeduplication: false,
      SqsManagedSseEnabled: true,
      RedrivePolicy: {
        deadLetterTargetArn: { 'Fn::GetAtt': [logicalId(deadLetterQueue), 'Arn'] },
        maxReceiveCount: DEFAULT_MAX_ATTEMPTS,
      },
    });
    // Its consumer is the dispatcher: Lambda refuses a mapping whose queue's visibility is shorter.
    expect(q.VisibilityTimeout).toBe(dispatcherTimeoutSeconds(stage) + 60);
    expect(dlq).toMatchObject({ FifoQueue: true, SqsManagedSseEnabled: true, MessageRetentionPeriod: 1_209_600 });
  });

  it.each(PIPELINE_STAGES)('%s: its dispatcher reads its queue and reports partial batch failures', (stage) => {
    const { fn, dispatcher, queue } = stack.stages[stage];
    // The stage function has no mapping: a tenant-isolated function takes no event source.
    const mappings = ofType('AWS::Lambda::EventSourceMapping').filter(([, m]) =>
      [logicalId(fn), logicalId(dispatcher!)].includes((m.Properties.FunctionName as { Ref: string }).Ref),
    );
    expect(mappings.map(([, m]) => m.Properties.FunctionName)).toEqual([{ Ref: logicalId(dispatcher!) }]);
    template.hasResourceProperties('AWS::Lambda::EventSourceMapping', {
      FunctionName: { Ref: logicalId(dispatcher!) },
      EventSourceArn: { 'Fn::GetAtt': [logicalId(queue), 'Arn'] },
      FunctionResponseTypes: ['ReportBatchItemFailures'],
      BatchSize: STAGE_SIZING[stage].batchSize,
      ScalingConfig: { MaximumConcurrency: stage === 'deploy' ? 25 : STAGE_SIZING[stage].concurrency },
    });
  });

  it('every function that runs tools takes one record per invocation and runs one at a time (its tools share the uid: issue 7); install takes 10 side by side', () => {
    const toolStages = PIPELINE_STAGES.filter((stage) => STAGE_TOOLS[stage].length > 0);
    expect(toolStages).toEqual(['fetch', 'template', 'deploy', 'index-repo']);
    for (const stage of PIPELINE_STAGES) {
      const [, mapping] = ofType('AWS::Lambda::EventSourceMapping').find(
        ([, m]) => (m.Properties.FunctionName as { Ref?: string }).Ref === logicalId(stack.stages[stage].dispatcher!),
      ) ?? [undefined, undefined];
      const tools = toolStages.includes(stage);
      expect(mapping?.Properties.BatchSize, stage).toBe(tools ? 1 : 10);
      // A FIFO queue takes no batching window.
      expect(mapping?.Properties.MaximumBatchingWindowInSeconds, stage).toBeUndefined();
      const env = (resources[logicalId(stack.stages[stage].fn)]!.Properties.Environment as { Variables: Json })
        .Variables;
      expect(env.KAPP_LAMBDA_RECORD_CONCURRENCY, stage).toBe(String(STAGE_RECORD_CONCURRENCY[stage]));
      const edge = (
        resources[logicalId(stack.stages[stage].dispatcher!)]!.Properties.Environment as { Variables: Json }
      ).Variables;
      // Half the function's slots per cluster, half that per namespace (context clusterShare, namespaceShare).
      const { MaximumConcurrency } = (mapping?.Properties.ScalingConfig ?? {}) as { MaximumConcurrency?: number };
      const slots = (MaximumConcurrency ?? 0) * STAGE_RECORD_CONCURRENCY[stage];
      const share = Math.floor(slots / 2);
      expect([edge.KAPP_LAMBDA_CLUSTER_SHARE, edge.KAPP_LAMBDA_NAMESPACE_SHARE], stage).toEqual([
        String(share),
        String(Math.ceil(share / 2)),
      ]);
      expect(share, stage).toBe({ fetch: 5, template: 5, deploy: 12, 'index-repo': 2, install: 25 }[stage]);
      expect(STAGE_RECORD_CONCURRENCY[stage], stage).toBe(tools ? 1 : 10);
    }
    // No function runs on Lambda Managed Instances (several invocations per execution environment).
    for (const [, fn] of ofType('AWS::Lambda::Function')) {
      expect(Object.keys(fn.Properties).filter((k) => /CapacityProvider/i.test(k))).toEqual([]);
    }
  });

  it('every queue accepts TLS only', () => {
    for (const [, policy] of ofType('AWS::SQS::QueuePolicy')) {
      expect(policy.Properties.PolicyDocument).toMatchObject({
        Statement: [{ Effect: 'Deny', Action: 'sqs:*', Condition: { Bool: { 'aws:SecureTransport': 'false' } } }],
      });
    }
  });
});

describe('functions', () => {
  it.each(PIPELINE_STAGES)(
    '%s: sized for its stage, its layer, its variables; one tenant per cluster, invoked by its dispatcher',
    (stage) => {
      const { fn } = stack.stages[stage];
      const p = resources[logicalId(fn)]!.Properties;
      const sizing = STAGE_SIZING[stage];
      const timeout = stageTimeoutSeconds(stage, true);
      // The dispatcher outlives the stage it waits for: deploy and index-repo drop to 870 s.
      expect(timeout).toBe(Math.min(sizing.timeoutSeconds, 870));
      expect(p).toMatchObject({
        Runtime: 'nodejs24.x',
        Handler: 'index.handler',
        Architectures: ['arm64'],
        MemorySize: sizing.memoryMiB,
        EphemeralStorage: { Size: sizing.ephemeralMiB },
        Timeout: timeout,
        TenancyConfig: { TenantIsolationMode: 'PER_TENANT' },
        KmsKeyArn: { 'Fn::GetAtt': [logicalId(stack.artifactKey), 'Arn'] },
        LoggingConfig: { LogGroup: expect.anything() },
      });
      expect(p.Layers).toHaveLength(1);
      const env = (p.Environment as { Variables: Record<string, unknown> }).Variables;
      expect(env.KAPP_LAMBDA_DISPATCHED).toBe('true');
      // Context sharing's default in isolation shared: each cluster's claims in its own domain (D17).
      expect(env.KAPP_LAMBDA_SHARING).toBe('cluster');
      expect(env.KAPP_LAMBDA_CLUSTER_REGISTRY).toEqual({
        'Fn::Join': ['', ['s3://', { Ref: logicalId(stack.bucket) }, '/registry/']],
      });
      expect(env.KAPP_LAMBDA_KUBECONFIG).toBeUndefined();
      expect(env.KAPP_LAMBDA_CLUSTERS).toBeUndefined();
      const queueVars = Object.keys(env).filter((k) => k.startsWith('KAPP_LAMBDA_QUEUE_URL_'));
      // The queues its runs send to (hand-offs, follow-ups); its postponed copies are its dispatcher's.
      const queues = [...(NEXT_STAGES[stage] ?? [])];
      expect(queueVars.sort()).toEqual(queues.map(queueUrlEnv).sort());
      for (const next of queues) {
        expect(env[queueUrlEnv(next)]).toEqual({ Ref: logicalId(stack.stages[next].queue) });
      }
      expect(env).toMatchObject({
        KAPP_LAMBDA_BUCKET: { Ref: logicalId(stack.bucket) },
        KAPP_LAMBDA_MAX_RECEIVE_COUNT: String(DEFAULT_MAX_ATTEMPTS),
      });
      // The edge is the dispatcher's: no sender check, no shares, no root key.
      for (const v of [
        'KAPP_LAMBDA_SENDER_CHECK',
        'KAPP_LAMBDA_FUNCTION_SENDERS',
        'KAPP_LAMBDA_CLUSTER_SHARE',
        'KAPP_LAMBDA_NAMESPACE_SHARE',
        ARTIFACT_ROOT_KEY_SECRET_ENV,
        LEGACY_ARTIFACT_ROOT_KEY_ENV,
      ]) {
        expect(env[v], v).toBeUndefined();
      }
      // Install runs no tool: no tool versions.
      if (STAGE_TOOLS[stage].length === 0) expect(env.KAPP_LAMBDA_TOOL_VERSIONS).toBeUndefined();
      else expect(env.KAPP_LAMBDA_TOOL_VERSIONS).toBe(JSON.stringify(layerToolVersions(stage)));
      // What the function's configuration parser accepts (template values stand in for the tokens).
      const concrete = concreteEnv(env);
      const config = parseLambdaEnv(stage, { ...concrete, AWS_REGION: 'eu-west-1' });
      expect(config.clusterRegistry?.location).toEqual({
        kind: 's3',
        bucket: 'kapp-lambda-bucket',
        prefix: 'registry/',
      });
      expect(config.kubeconfigPath).toBe('');
      expect(config.senderCheck).toBeUndefined();
      // The fleet's URL allow-list reaches the functions whose URL policy checks something.
      const policed = (URL_POLICY_STAGES as readonly PipelineStage[]).includes(stage);
      expect(env.KAPP_LAMBDA_URL_ALLOW).toBe(policed ? 'registry.corp:443,10.20.0.0/16' : undefined);
      expect(config.urlPolicy).toEqual({
        mode: 'enforce',
        allow: policed ? ['registry.corp:443', '10.20.0.0/16'] : [],
      });
      // The fleet's deploy wait maximum (context maxDeployWaitMinutes, default 60) on deploy only.
      expect(config.maxDeployWaitMs).toBe(stage === 'deploy' ? 60 * 60_000 : undefined);
      if (stage === 'install') expect(env.KAPP_LAMBDA_TOOL_TIMEOUT_MS).toBeUndefined();
      else {
        const toolMs = Number(env.KAPP_LAMBDA_TOOL_TIMEOUT_MS);
        expect(toolMs).toBeGreaterThan(0);
        // Deploy's tool timeout comes after the function deadline (30 s before the limit), which
        // continues a long kapp wait in a follow-up invocation instead of failing it.
        if (stage === 'deploy') {
          expect(toolMs).toBeGreaterThan(timeout * 1000 - 30_000);
          expect(toolMs).toBeLessThan(timeout * 1000);
        } else expect(toolMs).toBeLessThanOrEqual(timeout * 1000 - 60_000);
      }
    },
  );

  it.each(PIPELINE_STAGES)(
    "%s: its dispatcher runs no tool (128 MiB, arm64, its stage's timeout + 30 s, no layer) and holds the edge variables",
    (stage) => {
      const { fn, queue, dispatcher, dispatcherRole, runRole } = stack.stages[stage];
      const p = resources[logicalId(dispatcher!)]!.Properties;
      expect(p).toMatchObject({
        Runtime: 'nodejs24.x',
        Handler: 'index.handler',
        Architectures: ['arm64'],
        MemorySize: 128,
        // the stage's own timeout and the margin for its answer: a short stage keeps a short retry
        Timeout: { fetch: 630, template: 330, deploy: 900, 'index-repo': 900, install: 150 }[stage],
        KmsKeyArn: { 'Fn::GetAtt': [logicalId(stack.artifactKey), 'Arn'] },
        Role: { 'Fn::GetAtt': [logicalId(dispatcherRole!), 'Arn'] },
      });
      expect(p.Layers).toBeUndefined();
      expect(p.TenancyConfig).toBeUndefined();
      expect(p.VpcConfig).toBeUndefined();
      // Its code is the dispatchers' bundle (functions/dispatch/index.ts), as `cdk synth` builds it
      // (infra/aws/app.ts), not its stage's.
      const assetPath = (f: IConstruct) => (f.node.findChild('Code') as s3assets.Asset).assetPath;
      expect(assetPath(dispatcher!)).toBe(dispatcherCodeDir);
      expect(assetPath(fn)).toBe(assets[stage].codeDir);
      expect(readFileSync(path.join(dispatcherCodeDir, 'index.mjs'), 'utf8')).toContain('KAPP_LAMBDA_DISPATCH_STAGE');
      const env = (p.Environment as { Variables: Record<string, unknown> }).Variables;
      expect(env).toMatchObject({
        KAPP_LAMBDA_DISPATCH_STAGE: stage,
        KAPP_LAMBDA_RUN_ROLE_ARN: { 'Fn::GetAtt': [logicalId(runRole!), 'Arn'] },
        KAPP_LAMBDA_STAGE_FUNCTION: { 'Fn::GetAtt': [logicalId(fn), 'Arn'] },
        KAPP_LAMBDA_RECEIVER_ROLE_ID: { 'Fn::GetAtt': [logicalId(dispatcherRole!), 'RoleId'] },
        KAPP_LAMBDA_BUCKET: { Ref: logicalId(stack.bucket) },
        KAPP_LAMBDA_MAX_RECEIVE_COUNT: String(DEFAULT_MAX_ATTEMPTS),
        KAPP_LAMBDA_SENDER_CHECK: 'registry',
        // Its run sessions grant each cluster its sharing domain (`runSessionPolicy`).
        KAPP_LAMBDA_SHARING: 'cluster',
      });
      // Its own queue only (the record proof, the early deletes, its postponed and parked copies).
      expect(Object.keys(env).filter((k) => k.startsWith('KAPP_LAMBDA_QUEUE_URL_'))).toEqual([queueUrlEnv(stage)]);
      expect(env[queueUrlEnv(stage)]).toEqual({ Ref: logicalId(queue) });
      // The stages whose runs send to this queue, each by its run role's id (a run's SenderId is
      // `<run role id>:<cluster id>`).
      expect(runSenders(stage)).toEqual(PIPELINE_STAGES.filter((s) => NEXT_STAGES[s]?.includes(stage)));
      expect(env.KAPP_LAMBDA_FUNCTION_SENDERS).toEqual({
        'Fn::Join': [
          '',
          runSenders(stage).flatMap((s, i) => [
            `${i === 0 ? '' : ','}${s}=`,
            { 'Fn::GetAtt': [logicalId(stack.stages[s].runRole!), 'RoleId'] },
          ]),
        ],
      });
      // The root key's secret by ARN (a Ref of a secret resource is its ARN), never its value.
      expect(env[LEGACY_ARTIFACT_ROOT_KEY_ENV]).toBeUndefined();
      if (usesArtifactKey(stage)) expect(env[ARTIFACT_ROOT_KEY_SECRET_ENV]).toEqual({ Ref: rootKeyId() });
      else expect(env[ARTIFACT_ROOT_KEY_SECRET_ENV]).toBeUndefined();
      // As the functions' own parser reads each entry (the real role ids stand in for the tokens).
      const senders = concreteEnv(env).KAPP_LAMBDA_FUNCTION_SENDERS!.split(',').map(parseFunctionSender);
      expect(senders).toEqual(
        runSenders(stage).map((s) => ({ stage: s, roleId: standInRoleId(logicalId(stack.stages[s].runRole!)) })),
      );
      // Half the slots per cluster, half that per namespace (context clusterShare, namespaceShare).
      const slots = (stage === 'deploy' ? 25 : STAGE_SIZING[stage].concurrency) * STAGE_RECORD_CONCURRENCY[stage];
      const share = Math.floor(slots / 2);
      expect([env.KAPP_LAMBDA_CLUSTER_SHARE, env.KAPP_LAMBDA_NAMESPACE_SHARE]).toEqual([
        String(share),
        String(Math.ceil(share / 2)),
      ]);
      expect(share).toBe({ fetch: 5, template: 5, deploy: 12, 'index-repo': 2, install: 25 }[stage]);
    },
  );

  it('keep their logs 30 days', () => {
    for (const [, group] of ofType('AWS::Logs::LogGroup')) expect(group.Properties.RetentionInDays).toBe(30);
  });

  it('have an alarm on dead letters and one on errors each, the dispatchers too', () => {
    for (const stage of PIPELINE_STAGES) {
      template.hasResourceProperties('AWS::CloudWatch::Alarm', {
        Namespace: 'AWS/SQS',
        MetricName: 'ApproximateNumberOfMessagesVisible',
        Dimensions: [
          { Name: 'QueueName', Value: { 'Fn::GetAtt': [logicalId(stack.stages[stage].deadLetterQueue), 'QueueName'] } },
        ],
        Threshold: 1,
      });
      template.hasResourceProperties('AWS::CloudWatch::Alarm', {
        Namespace: 'AWS/Lambda',
        MetricName: 'Errors',
        Dimensions: [{ Name: 'FunctionName', Value: { Ref: logicalId(stack.stages[stage].fn) } }],
        Threshold: 1,
      });
      template.hasResourceProperties('AWS::CloudWatch::Alarm', {
        Namespace: 'AWS/Lambda',
        MetricName: 'Errors',
        Dimensions: [{ Name: 'FunctionName', Value: { Ref: logicalId(stack.stages[stage].dispatcher!) } }],
        Threshold: 1,
      });
    }
  });
});

describe('IAM', () => {
  const statements = () =>
    ofType('AWS::IAM::Policy').flatMap(([, p]) => (p.Properties.PolicyDocument as { Statement: Json[] }).Statement);

  it('every statement allows named actions on resources of this stack', () => {
    const ids = new Set(Object.keys(resources));
    const named = (r: unknown): boolean => {
      const refs = JSON.stringify(r).match(/"(Ref|Fn::GetAtt)":(\["[A-Za-z0-9]+"|"[A-Za-z0-9]+")/g) ?? [];
      return refs.length > 0 && refs.every((m) => ids.has(m.replace(/^.*:\[?"|"$/g, '')));
    };
    expect(statements().length).toBeGreaterThan(0);
    // Nothing beside these statements: no managed policies, no inline policies on the roles.
    for (const [, role] of ofType('AWS::IAM::Role')) {
      expect(role.Properties.ManagedPolicyArns).toBeUndefined();
      expect(role.Properties.Policies).toBeUndefined();
    }
    for (const s of statements()) {
      expect(s.Effect).toBe('Allow');
      for (const a of list(s.Action as string | string[])) expect(a).toMatch(/^[a-z0-9]+:[A-Za-z]+$/);
      // The token secrets are made per cluster after the deployment: a name pattern per stage.
      if (s.Action === 'secretsmanager:GetSecretValue' && !('Ref' in (s.Resource as Json))) {
        expect(PIPELINE_STAGES.map(tokenSecretArn)).toContainEqual(s.Resource);
        continue;
      }
      for (const r of list(s.Resource)) {
        expect(r).not.toBe('*');
        expect(named(r), JSON.stringify(r)).toBe(true);
      }
    }
  });

  const arnOf = (c: IConstruct) => ({ 'Fn::GetAtt': [logicalId(c), 'Arn'] });
  const viaServices = (s: Json) =>
    list((s.Condition as { StringEquals: Record<string, unknown> }).StringEquals['kms:ViaService']);
  const via = (...services: string[]) =>
    services.map((service) => ({ 'Fn::Join': ['', [`${service}.`, { Ref: 'AWS::Region' }, '.amazonaws.com']] }));
  /** A role's statements, and `take` marking those a test has accounted for. */
  const accounting = (roleId: string) => {
    const st = roleStatements(roleId);
    const covered = new Set<Json>();
    const take = (pred: (s: Json) => boolean) => {
      const found = st.filter(pred);
      for (const s of found) covered.add(s);
      return found;
    };
    return { st, take, rest: () => st.filter((s) => !covered.has(s)) };
  };
  const actionsOf = (s: Json) => list(s.Action as string | string[]);
  /** Its log group, write only. */
  const expectLogs = (take: (pred: (s: Json) => boolean) => Json[], fn: IConstruct) => {
    const logsSt = take((s) => actionsOf(s).every((a) => a.startsWith('logs:')));
    expect(logsSt).toHaveLength(1);
    const logGroupId = (resources[logicalId(fn)]!.Properties.LoggingConfig as { LogGroup: { Ref: string } }).LogGroup
      .Ref;
    expect(logsSt[0]!.Resource).toEqual({ 'Fn::GetAtt': [logGroupId, 'Arn'] });
  };

  it.each(PIPELINE_STAGES)(
    "%s: the stage function's own role holds its logs and its variables' key through Lambda, nothing of any cluster",
    (stage) => {
      const { role, fn } = stack.stages[stage];
      const { st, take, rest } = accounting(logicalId(role));
      expect(st.flatMap(actionsOf).filter((a) => /^(s3|sqs|secretsmanager|sts|lambda):/.test(a))).toEqual([]);
      expectLogs(take, fn);
      const kms = take((s) => actionsOf(s).some((a) => a.startsWith('kms:')));
      expect(kms.map((s) => [s.Action, s.Resource, viaServices(s)])).toEqual([
        ['kms:Decrypt', arnOf(stack.artifactKey), via('lambda')],
      ]);
      expect(rest()).toEqual([]);
      expect(stageOf(logicalId(fn))).toBe(stage);
    },
  );

  it.each(PIPELINE_STAGES)(
    '%s: the run role holds the queues its runs send to, its prefixes but the fair shares, the registry, its tokens, the key through S3; only its dispatcher assumes it, for an hour at most',
    (stage) => {
      const { runRole, dispatcherRole } = stack.stages[stage];
      const runRoleId = logicalId(runRole!);
      const { take, rest } = accounting(runRoleId);
      expect(resources[runRoleId]!.Properties).toMatchObject({
        MaxSessionDuration: 3600,
        AssumeRolePolicyDocument: {
          Version: '2012-10-17',
          Statement: [{ Effect: 'Allow', Action: 'sts:AssumeRole', Principal: { AWS: arnOf(dispatcherRole!) } }],
        },
      });
      const sends = take((s) => actionsOf(s).join() === 'sqs:SendMessage');
      // The hand-offs and follow-ups; a postponed copy is the dispatcher's to send.
      expect(sends.map((s) => s.Resource)).toEqual((NEXT_STAGES[stage] ?? []).map((n) => arnOf(stack.stages[n].queue)));
      const objects = take((s) => list(s.Resource).some((r) => objectSuffix(r) !== undefined));
      // Its claims in the sharing domains (`d/*/…`, D17), no fleet claim (`cache/`, `inflight/`, `artifacts/index/`).
      const scoped = (keys: string) => ['cache/', 'inflight/', 'artifacts/index/'].some((p) => keys.startsWith(p));
      // The shared blobs are create-only: PutObject only with If-None-Match (AWS's documented
      // condition), so no run overwrites another cluster's tarball or manifest (D17).
      const createOnly = { Null: { 's3:if-none-match': 'false' } };
      const statements = objects.map((s) => ({
        keys: objectSuffix(s.Resource)!.slice(1),
        actions: actionsOf(s),
        condition: s.Condition,
      }));
      expect(statements).toEqual([
        ...STAGE_OBJECTS[stage]
          .filter((g) => !g.keys.startsWith('state/shares/'))
          .flatMap((g): { keys: string; actions: string[]; condition?: Json }[] => {
            const keys = scoped(g.keys) ? `d/*/${g.keys}` : g.keys;
            if (!g.createOnly) return [{ keys, actions: [...g.actions] }];
            return [
              { keys, actions: g.actions.filter((a) => a !== 's3:PutObject') },
              { keys, actions: ['s3:PutObject'], condition: createOnly },
            ];
          }),
        // The cluster registry: read only, its documents only.
        { keys: 'registry/clusters/*', actions: ['s3:GetObject'] },
      ]);
      // Exactly the shared blobs' writers: an unconditioned PutObject on them is none.
      const puts = (keys: string) =>
        objects.filter((s) => objectSuffix(s.Resource) === `/${keys}` && actionsOf(s).includes('s3:PutObject'));
      const writesBlobs = (keys: string) =>
        STAGE_OBJECTS[stage].some((g) => g.keys === keys && g.actions.includes('s3:PutObject'));
      for (const keys of ['artifacts/fetch/*', 'artifacts/template/*']) {
        expect(puts(keys).map((s) => s.Condition)).toEqual(writesBlobs(keys) ? [createOnly] : []);
      }
      // A repository index is a claim (under d/ in cluster sharing), not a content-addressed blob.
      expect(STAGE_OBJECTS[stage].some((g) => g.keys === 'artifacts/index/*' && g.createOnly)).toBe(false);
      // Its tokens; never the artifact root key (the dispatcher derives the run's keys).
      const secrets = take((s) => actionsOf(s).some((a) => a.startsWith('secretsmanager:')));
      expect(secrets).toEqual([
        { Effect: 'Allow', Action: 'secretsmanager:GetSecretValue', Resource: tokenSecretArn(stage) },
      ]);
      expect(tokenSecretPattern(stage)).toBe(`kapp-lambda/*/${stage}`);
      const listing = take((s) => actionsOf(s).includes('s3:ListBucket'));
      const hasObjects = objects.length > 1;
      expect(listing.map((s) => s.Resource)).toEqual(hasObjects ? [arnOf(stack.bucket)] : []);
      const kms = take((s) => actionsOf(s).some((a) => a.startsWith('kms:')));
      for (const s of kms) expect(s.Resource).toEqual(arnOf(stack.artifactKey));
      // Through S3 only (the registry documents are in the artifact bucket): no function's variables, no root key.
      expect(kms.map((s) => [s.Action, viaServices(s)])).toEqual([
        ['kms:Decrypt', via('s3')],
        ...(STAGE_OBJECTS[stage].some((g) => !g.keys.startsWith('state/shares/') && g.actions.includes('s3:PutObject'))
          ? [['kms:GenerateDataKey', via('s3')]]
          : []),
      ]);
      expect(rest()).toEqual([]);
    },
  );

  it.each(PIPELINE_STAGES)(
    "%s: the dispatcher's role holds its queue, the registry documents, its fair shares, the root key, its run role and its stage function",
    (stage) => {
      const { dispatcher, dispatcherRole, runRole, queue, fn } = stack.stages[stage];
      const { take, rest } = accounting(logicalId(dispatcherRole!));
      const consume = take((s) => actionsOf(s).includes('sqs:ReceiveMessage'));
      expect(consume.map((s) => s.Resource)).toEqual([arnOf(queue)]);
      expect(actionsOf(consume[0]!)).toEqual(
        expect.arrayContaining(['sqs:DeleteMessage', 'sqs:ChangeMessageVisibility']),
      );
      // Its postponed and parked copies go back to its own queue, and nowhere else.
      const sends = take((s) => actionsOf(s).join() === 'sqs:SendMessage');
      expect(sends.map((s) => s.Resource)).toEqual([arnOf(queue)]);
      expect(take((s) => actionsOf(s).join() === 'sts:AssumeRole').map((s) => s.Resource)).toEqual([arnOf(runRole!)]);
      expect(take((s) => actionsOf(s).join() === 'lambda:InvokeFunction').map((s) => s.Resource)).toEqual([arnOf(fn)]);
      const objects = take((s) => list(s.Resource).some((r) => objectSuffix(r) !== undefined));
      expect(objects.map((s) => ({ keys: objectSuffix(s.Resource)!.slice(1), actions: actionsOf(s) }))).toEqual([
        { keys: 'registry/clusters/*', actions: ['s3:GetObject'] },
        { keys: `state/shares/${stage}/*`, actions: ['s3:GetObject', 's3:PutObject', 's3:DeleteObject'] },
        // fetch's and index-repo's keep the poll members of cluster sharing from their runs' answers.
        ...(stage === 'fetch' || stage === 'index-repo'
          ? [{ keys: 'state/poll-members/*', actions: ['s3:GetObject', 's3:PutObject', 's3:DeleteObject'] }]
          : []),
        // index-repo's lists the source poll's member clusters (`sourcePollClusters`), and writes none.
        ...(stage === 'index-repo' ? [{ keys: 'cache/source-poll/*', actions: ['s3:GetObject'] }] : []),
        // install's coordinates the fleet's rollouts (issue 28): no run holds them.
        ...(stage === 'install'
          ? [
              { keys: 'state/rollout-policies/*', actions: ['s3:GetObject'] },
              { keys: 'state/fleet/*', actions: ['s3:GetObject'] },
              { keys: 'state/rollouts/*', actions: ['s3:GetObject', 's3:PutObject'] },
            ]
          : []),
      ]);
      expect(SOURCE_POLL_PREFIX.startsWith('cache/source-poll/')).toBe(true);
      expect(take((s) => actionsOf(s).includes('s3:ListBucket')).map((s) => s.Resource)).toEqual([arnOf(stack.bucket)]);
      // The artifact root key's secret (not install's), and no cluster's token.
      expect(take((s) => actionsOf(s).some((a) => a.startsWith('secretsmanager:')))).toEqual(
        usesArtifactKey(stage)
          ? [{ Effect: 'Allow', Action: 'secretsmanager:GetSecretValue', Resource: { Ref: rootKeyId() } }]
          : [],
      );
      const kms = take((s) => actionsOf(s).some((a) => a.startsWith('kms:')));
      expect(kms.map((s) => [s.Action, viaServices(s)])).toEqual([
        ['kms:Decrypt', via('s3', 'lambda', ...(usesArtifactKey(stage) ? ['secretsmanager'] : []))],
        ['kms:GenerateDataKey', via('s3')],
      ]);
      expectLogs(take, dispatcher!);
      expect(rest()).toEqual([]);
    },
  );

  it("a run role's policy names no cluster and fits IAM's 10,240 characters of a role's inline policies, whatever the fleet's size", () => {
    // The longest names CloudFormation could resolve the tokens to (aws-us-gov, a 63-character bucket).
    const long: Record<string, string> = {
      'AWS::Partition': 'aws-us-gov',
      'AWS::Region': 'us-gov-west-1',
      'AWS::AccountId': '123456789012',
    };
    const concrete = (v: unknown): unknown => {
      if (Array.isArray(v)) return v.map(concrete);
      if (typeof v !== 'object' || v === null) return v;
      const o = v as Json;
      if ('Ref' in o) return long[o.Ref as string] ?? `${'b'.repeat(63)}`;
      if ('Fn::GetAtt' in o) return `arn:aws-us-gov:sqs:us-gov-west-1:123456789012:${'q'.repeat(80)}.fifo`;
      if ('Fn::Join' in o) {
        const [sep, parts] = o['Fn::Join'] as [string, unknown[]];
        return parts.map(concrete).join(sep);
      }
      return Object.fromEntries(Object.entries(o).map(([k, x]) => [k, concrete(x)]));
    };
    for (const stage of PIPELINE_STAGES) {
      const docs = ofType('AWS::IAM::Policy')
        .filter(([, p]) =>
          (p.Properties.Roles as Json[]).some((r) => r.Ref === logicalId(stack.stages[stage].runRole!)),
        )
        .map(([, p]) => p.Properties.PolicyDocument);
      // IAM counts the policy's characters without whitespace.
      const chars = JSON.stringify(concrete(docs)).length;
      expect(chars, stage).toBeLessThan(10_240);
      // No cluster id in it: the fleet's clusters are wildcards of the tables, so joining more changes nothing.
      expect(JSON.stringify(docs), stage).not.toContain('prod-eu-1');
    }
  });

  it("a cluster's forwarder role may only send to the entry queues, and only its cluster's forwarder ServiceAccount assumes it", () => {
    expect(Object.keys(stack.forwarderRoles)).toEqual(['prod-eu-1']);
    const roleId = logicalId(stack.forwarderRoles['prod-eu-1']!);
    expect(roleStatements(roleId)).toEqual([
      {
        Effect: 'Allow',
        Action: 'sqs:SendMessage',
        Resource: FORWARDER_STAGES.map((s) => ({ 'Fn::GetAtt': [logicalId(stack.stages[s].queue), 'Arn'] })),
      },
    ]);
    expect([...FORWARDER_STAGES].sort()).toEqual(['fetch', 'index-repo', 'install']);
    expect(resources[roleId]!.Properties.AssumeRolePolicyDocument).toEqual({
      Version: '2012-10-17',
      Statement: [
        {
          Effect: 'Allow',
          Principal: { Service: 'pods.eks.amazonaws.com' },
          Action: ['sts:AssumeRole', 'sts:TagSession'],
          Condition: {
            StringEquals: {
              'aws:SourceAccount': { Ref: 'AWS::AccountId' },
              'aws:RequestTag/eks-cluster-arn': PROD_CLUSTER_ARN,
              'aws:RequestTag/kubernetes-namespace': 'kapp-lambda',
              'aws:RequestTag/kubernetes-service-account': 'kapp-lambda-forwarder',
            },
          },
        },
      ],
    });
    // `npm run cluster -- join` creates the same trust with the IAM SDK, without CDK.
    expect(resources[roleId]!.Properties.AssumeRolePolicyDocument).toEqual(
      stack.resolve(forwarderTrustPolicy(stack.account, PROD_CLUSTER_ARN)),
    );
    // What `npm run cluster -- add prod-eu-1 --forwarder-role-id` takes: the role's unique id.
    expect((template.toJSON().Outputs as Record<string, Json>).ForwarderRoleIdProdEu1!.Value).toEqual({
      'Fn::GetAtt': [roleId, 'RoleId'],
    });
  });

  it('no forwarder role without the context, and one more per cluster through addClusterForwarder', () => {
    expect(apart.forwarderRoles).toEqual({});
    const t = Template.fromStack(apart).toJSON() as { Resources: Record<string, Resource> };
    // Per stage the function's, the dispatcher's and the run role; the source poll's, the rollout check's.
    expect(Object.values(t.Resources).filter((r) => r.Type === 'AWS::IAM::Role')).toHaveLength(
      3 * PIPELINE_STAGES.length + 2,
    );
    expect(() => stack.addClusterForwarder('prod-eu-1', new iam.AccountRootPrincipal())).toThrow(
      'forwarder: prod-eu-1 already has one',
    );
    expect(() => stack.addClusterForwarder('Not_A_Label', new iam.AccountRootPrincipal())).toThrow(
      'forwarder: Not_A_Label is not a DNS-1123 label',
    );
  });
});

describe('sender check with another cluster access (clusterAccess)', () => {
  const forwarders = { forwarders: JSON.stringify({ 'prod-eu-1': { eksClusterArn: PROD_CLUSTER_ARN } }) };
  /** A stack of its own app (a refused one must not stay in the shared app) with `environment` as its cluster access. */
  const build = (environment: Record<string, string>, context: Record<string, unknown> = forwarders) =>
    new KappLambdaStack(
      new App({ outdir: path.join(tmp, 'cdk.out.access'), context: { 'aws:cdk:disable-asset-staging': true } }),
      'KappLambdaAccess',
      {
        assets,
        dispatcherCodeDir,
        architecture: lambda.Architecture.ARM_64,
        fleet: fleetSettings((k) => context[k]),
        clusterAccess: { environment, grant: () => undefined },
      },
    );
  /** The variables of the dispatchers, the functions that check senders. */
  const functionEnvs = (s: KappLambdaStack) => {
    const t = Template.fromStack(s).toJSON() as { Resources: Record<string, Resource> };
    return PIPELINE_STAGES.map((stage) => {
      const fnId = s.resolve(s.getLogicalId(s.stages[stage].dispatcher!.node.defaultChild as never)) as string;
      return (t.Resources[fnId]!.Properties.Environment as { Variables: Json }).Variables;
    });
  };

  it('stays on beside forwarder roles when that access reads a registry', () => {
    const s = build({ KAPP_LAMBDA_CLUSTER_REGISTRY: 's3://fleet-registry/kapp-lambda/' });
    expect(s.senderCheck).toBe(true);
    expect(Object.keys(s.forwarderRoles)).toEqual(['prod-eu-1']);
    for (const env of functionEnvs(s)) {
      expect(env).toMatchObject({
        KAPP_LAMBDA_CLUSTER_REGISTRY: 's3://fleet-registry/kapp-lambda/',
        KAPP_LAMBDA_SENDER_CHECK: 'registry',
      });
    }
  });

  it('fails the synth naming the conflict when that access has no registry and forwarder roles are asked for', () => {
    expect(() => build({ KAPP_LAMBDA_KUBECONFIG: '/var/task/kubeconfig' })).toThrow(
      "forwarder: prod-eu-1: the stack's clusterAccess locates no cluster registry (no KAPP_LAMBDA_CLUSTER_REGISTRY), so the functions cannot check that an event naming prod-eu-1 came from its forwarder role",
    );
  });

  it('is off without a registry and without forwarder roles, and no forwarder role can be added later', () => {
    const s = build({ KAPP_LAMBDA_KUBECONFIG: '/var/task/kubeconfig' }, {});
    expect(s.senderCheck).toBe(false);
    for (const env of functionEnvs(s)) {
      expect(env.KAPP_LAMBDA_SENDER_CHECK).toBeUndefined();
      expect(env.KAPP_LAMBDA_FUNCTION_SENDERS).toBeUndefined();
    }
    expect(() => s.addClusterForwarder('edge-9', new iam.AccountRootPrincipal())).toThrow(
      "forwarder: edge-9: the stack's clusterAccess locates no cluster registry",
    );
    expect(s.forwarderRoles).toEqual({});
  });

  it.each([
    ['KAPP_LAMBDA_SENDER_CHECK', 'off'],
    ['KAPP_LAMBDA_FUNCTION_SENDERS', 'fetch=AROAEXAMPLEID1234567'],
  ])('refuses an access whose variables set %s (the stack decides the check)', (name, value) => {
    expect(() => build({ KAPP_LAMBDA_CLUSTER_REGISTRY: 's3://fleet-registry/kapp-lambda/', [name]: value })).toThrow(
      `clusterAccess: ${name} is the stack's to set`,
    );
  });
});

describe('cluster registry in a bucket of its own', () => {
  it('locates it, and grants reading its documents in that bucket only', () => {
    const t = Template.fromStack(apart).toJSON() as { Resources: Record<string, Resource> };
    const id = (c: IConstruct) => apart.resolve(apart.getLogicalId(c.node.defaultChild as never)) as string;
    for (const stage of PIPELINE_STAGES) {
      const env = (t.Resources[id(apart.stages[stage].fn)]!.Properties.Environment as { Variables: Json }).Variables;
      expect(env.KAPP_LAMBDA_CLUSTER_REGISTRY).toBe('s3://fleet-registry/kapp-lambda/');
      // No urlAllow in this context: no exception to the URL policy (the documented default).
      expect(env.KAPP_LAMBDA_URL_ALLOW).toBeUndefined();
      const statementsOf = (role: IConstruct) =>
        Object.values(t.Resources)
          .filter((r) => r.Type === 'AWS::IAM::Policy')
          .filter((p) => (p.Properties.Roles as Json[]).some((r) => r.Ref === id(role)))
          .flatMap((p) => (p.Properties.PolicyDocument as { Statement: Json[] }).Statement);
      // The run role (the stage's tokens and documents) and the dispatcher (the sender check).
      for (const role of [apart.stages[stage].runRole!, apart.stages[stage].dispatcherRole!]) {
        const st = statementsOf(role);
        const registry = st.filter((s) => JSON.stringify(s.Resource).includes('fleet-registry'));
        expect(registry).toEqual([
          {
            Effect: 'Allow',
            Action: 's3:GetObject',
            Resource: {
              'Fn::Join': ['', ['arn:', { Ref: 'AWS::Partition' }, ':s3:::fleet-registry/kapp-lambda/clusters/*']],
            },
          },
        ]);
      }
      // Every run role holds prefixes of the artifact bucket (install's, its fleet index entries
      // and the receipts), so the artifact key through S3, wherever the registry is.
      const runKms = statementsOf(apart.stages[stage].runRole!).filter((s) => String(s.Action).startsWith('kms:'));
      expect(runKms.length > 0).toBe(true);
    }
  });
});

describe('fleet source poll', () => {
  it('invokes the index-repo dispatcher with the poll event every sourcePollMinutes, no retry', () => {
    expectScheduleInvokes(stack.sourcePoll, stack.stages['index-repo'].dispatcher!, {
      expression: 'rate(2 minutes)',
      input: { type: SOURCE_POLL_EVENT_TYPE },
      maxAgeSeconds: 120,
    });
  });

  it('runs as a role the scheduler of this account assumes, allowed to invoke that dispatcher only', () => {
    expectScheduleRole(stack.sourcePoll, stack.stages['index-repo'].dispatcher!);
  });

  it("gives the fetch function its Apps' source poll records (trackAppSources), and no run role the poll members", () => {
    expect(STAGE_OBJECTS.fetch).toContainEqual(
      expect.objectContaining({ keys: 'cache/source-poll/*', actions: ['s3:GetObject', 's3:PutObject'] }),
    );
    const runObjects = PIPELINE_STAGES.flatMap((stage) =>
      roleStatements(logicalId(stack.stages[stage].runRole!)).flatMap((s) =>
        list(s.Resource as string | string[]).map((r) => objectSuffix(r)),
      ),
    );
    // In the default cluster sharing (D17) the claims are each cluster's, under d/<tag>/.
    expect(runObjects).toContain('/d/*/cache/source-poll/*');
    expect(runObjects.filter((k) => k?.startsWith('/state/poll-members'))).toEqual([]);
  });

  it('gives the index-repo function what the poll needs: its records, its own queue, the registry', () => {
    expect(SOURCE_POLL_PREFIX.startsWith('cache/source-poll/')).toBe(true);
    expect(STAGE_OBJECTS['index-repo']).toContainEqual(
      expect.objectContaining({ keys: 'cache/source-poll/*', actions: ['s3:GetObject', 's3:PutObject'] }),
    );
    // The fan-out's ref-changed events of PackageRepositories go to the index-repo queue.
    expect(NEXT_STAGES['index-repo']).toContain('index-repo');
    // Its pokes of Apps on a moved source go to the fetch queue.
    expect(NEXT_STAGES['index-repo']).toContain('fetch');
  });

  it('lets the deploy function read, write and remove the sealed deploy records of its Apps (the no-op resync), and no other sealed state', async () => {
    const { PrivateArtifacts } = await import('../../functions/lib/artifact/sealed.js');
    const { DerivedKeyring } = await import('../../functions/lib/artifact/keyring.js');
    const { MemoryStore } = await import('../../functions/lib/store/memory.js');
    const sealed = new PrivateArtifacts(new MemoryStore(), new DerivedKeyring(Buffer.alloc(32, 1)), {
      now: () => new Date(),
    });
    const key = await sealed.keyFor({ clusterId: 'c', namespace: 'ns' }, 'deploy-record', 'a/uid');
    const grant = STAGE_OBJECTS.deploy.find((g) => g.keys === 'private/*/state/deploy/*');
    expect(grant?.actions).toEqual(['s3:GetObject', 's3:PutObject', 's3:DeleteObject']);
    expect(new RegExp(`^${grant!.keys.replace(/\*/g, '[^]*')}$`).test(key)).toBe(true);
    expect(STAGE_OBJECTS.deploy.filter((g) => g.keys.startsWith('private/')).map((g) => g.keys)).toEqual([
      'private/*/template/*',
      'private/*/state/deploy/*',
    ]);
  });
});

describe('fleet rollout check', () => {
  it('invokes the install dispatcher with the rollout check event every minute, no retry', () => {
    const fn = stack.stages.install.dispatcher!;
    expect(ROLLOUT_CHECK_EVENT_TYPE).toBe('dev.kapp-lambda.rollout.check.v1');
    expectScheduleInvokes(stack.rolloutCheck, fn, {
      expression: 'rate(1 minute)',
      input: { type: ROLLOUT_CHECK_EVENT_TYPE },
      maxAgeSeconds: 60,
    });
    // No other schedule invokes the install dispatcher, and this one invokes nothing else.
    const targets = ofType('AWS::Scheduler::Schedule').map(([, r]) => (r.Properties.Target as Json).Arn);
    expect(targets).toEqual(
      expect.arrayContaining([
        { 'Fn::GetAtt': [logicalId(fn), 'Arn'] },
        { 'Fn::GetAtt': [logicalId(stack.stages['index-repo'].dispatcher!), 'Arn'] },
      ]),
    );
    expect(targets).toHaveLength(2);
  });

  it('runs as a role the scheduler of this account assumes, allowed to invoke the install dispatcher only', () => {
    expectScheduleRole(stack.rolloutCheck, stack.stages.install.dispatcher!);
  });

  it("gives the install dispatcher the fleet's rollouts: policies and fleet index read, records read and written, nothing deleted", () => {
    const st = roleStatements(logicalId(stack.stages.install.dispatcherRole!));
    const objects = st
      .filter((s) => list(s.Resource).some((r) => objectSuffix(r)?.startsWith('/state/') === true))
      .map((s) => ({ keys: objectSuffix(s.Resource)!, actions: list(s.Action as string | string[]) }));
    expect(objects).toEqual([
      { keys: '/state/shares/install/*', actions: ['s3:GetObject', 's3:PutObject', 's3:DeleteObject'] },
      { keys: '/state/rollout-policies/*', actions: ['s3:GetObject'] },
      { keys: '/state/fleet/*', actions: ['s3:GetObject'] },
      { keys: '/state/rollouts/*', actions: ['s3:GetObject', 's3:PutObject'] },
    ]);
    // It lists them (each rollout's members; a missing record is a 404, not a 403).
    expect(st.filter((s) => list(s.Action as string | string[]).includes('s3:ListBucket'))).toEqual([
      { Effect: 'Allow', Action: 's3:ListBucket', Resource: { 'Fn::GetAtt': [logicalId(stack.bucket), 'Arn'] } },
    ]);
    // No other dispatcher holds them, and no run role the policies or the records.
    for (const stage of PIPELINE_STAGES) {
      const keysOf = (role: IConstruct) =>
        roleStatements(logicalId(role)).flatMap((s) => list(s.Resource).map((r) => objectSuffix(r)));
      const rollouts = (k: string | undefined) => k?.startsWith('/state/rollout') === true;
      if (stage !== 'install') expect(keysOf(stack.stages[stage].dispatcherRole!).filter(rollouts), stage).toEqual([]);
      expect(keysOf(stack.stages[stage].runRole!).filter(rollouts), stage).toEqual([]);
      if (stage !== 'install') {
        expect(
          keysOf(stack.stages[stage].runRole!).filter((k) => k?.startsWith('/state/fleet/')),
          stage,
        ).toEqual([]);
      }
    }
  });

  it('gives the install run role the fleet index (read, write, delete), the receipts and rendered manifests (read), and its fair shares to its dispatcher only', () => {
    const st = roleStatements(logicalId(stack.stages.install.runRole!));
    const objects = st
      .filter((s) => list(s.Resource).some((r) => objectSuffix(r) !== undefined))
      .map((s) => ({ keys: objectSuffix(s.Resource)!, actions: list(s.Action as string | string[]) }));
    expect(objects).toEqual([
      { keys: '/state/fleet/*', actions: ['s3:GetObject', 's3:PutObject', 's3:DeleteObject'] },
      { keys: '/receipts/*', actions: ['s3:GetObject'] },
      { keys: '/artifacts/template/*', actions: ['s3:GetObject'] },
      { keys: '/registry/clusters/*', actions: ['s3:GetObject'] },
    ]);
    // Each session narrows the fleet index and the receipts to its cluster (`runSessionPolicy`).
    expect(PER_CLUSTER_PREFIXES).toEqual(expect.arrayContaining(['state/fleet/', 'receipts/']));
  });
});

describe('deploy continuation', () => {
  it('gives the deploy function its own queue for its continuation and the fetch queue for the run lease follow-up: the URLs, SendMessage, and its run role as a sender', () => {
    expect(NEXT_STAGES.deploy).toEqual(['deploy', 'fetch']);
    const { fn, runRole: role, queue } = stack.stages.deploy;
    const fetchQueue = stack.stages.fetch.queue;
    const envOf = (f: IConstruct) =>
      (resources[logicalId(f)]!.Properties.Environment as { Variables: Record<string, unknown> }).Variables;
    const env = envOf(fn);
    expect(env.KAPP_LAMBDA_QUEUE_URL_DEPLOY).toEqual({ Ref: logicalId(queue) });
    expect(env.KAPP_LAMBDA_QUEUE_URL_FETCH).toEqual({ Ref: logicalId(fetchQueue) });
    for (const dispatcher of [stack.stages.deploy.dispatcher!, stack.stages.fetch.dispatcher!]) {
      expect(JSON.stringify(envOf(dispatcher).KAPP_LAMBDA_FUNCTION_SENDERS)).toContain(
        JSON.stringify([logicalId(role!), 'RoleId']),
      );
    }
    const sends = roleStatements(logicalId(role!)).filter(
      (s) => list(s.Action as string[]).join() === 'sqs:SendMessage',
    );
    expect(
      sends
        .flatMap((s) => list(s.Resource as Json | Json[]))
        .map((r) => JSON.stringify(r))
        .sort(),
    ).toEqual(
      [logicalId(queue), logicalId(fetchQueue)].map((q) => JSON.stringify({ 'Fn::GetAtt': [q, 'Arn'] })).sort(),
    );
  });
});

describe('artifact root key', () => {
  it('goes to exactly the functions with sealed prefixes', () => {
    for (const stage of PIPELINE_STAGES) {
      const seals = STAGE_OBJECTS[stage].some((g) => g.keys.startsWith('private/'));
      expect(usesArtifactKey(stage), stage).toBe(seals);
    }
  });

  it("is nowhere in the template: no dynamic reference to a secret's value, its CMK is the artifact key", () => {
    for (const s of [stack, apart, deployed]) {
      const json = JSON.stringify(Template.fromStack(s).toJSON());
      expect(json).not.toContain('resolve:secretsmanager');
      expect(json).not.toContain(`${LEGACY_ARTIFACT_ROOT_KEY_ENV}"`);
    }
    const secret = resources[rootKeyId()]!.Properties;
    expect(secret.KmsKeyId).toEqual({ 'Fn::GetAtt': [logicalId(stack.artifactKey), 'Arn'] });
    expect(secret.SecretString).toBeUndefined();
    expect(secret.GenerateSecretString).toMatchObject({ PasswordLength: 64, ExcludePunctuation: true });
  });

  it('the functions accept the variable the stack gives them and read that secret', async () => {
    const arn = 'arn:aws:secretsmanager:eu-west-1:123456789012:secret:ArtifactRootKey-AbCdEf';
    for (const stage of PIPELINE_STAGES.filter(usesArtifactKey)) {
      const ids: unknown[] = [];
      const send = async (cmd: { input: { SecretId?: string } }) => {
        ids.push(cmd.input.SecretId);
        return { SecretString: Buffer.alloc(32, 1).toString('base64') };
      };
      const ring = artifactKeyringFromEnv(stage, { [ARTIFACT_ROOT_KEY_SECRET_ENV]: arn }, { send } as never);
      expect((await ring.keysFor('c1')).tag).toMatch(/^[0-9a-f]{32}$/);
      expect(ids).toEqual([arn]);
    }
  });
});

describe('operator options (context kmsKeyArn, logEncryption, reservedConcurrency, vpcId, subnetIds)', () => {
  it('encrypts every log group with the stack key, which lets CloudWatch Logs of this account use it', () => {
    const keyId = logicalId(stack.artifactKey as never);
    for (const [, g] of ofType('AWS::Logs::LogGroup')) {
      expect(g.Properties.KmsKeyId).toEqual({ 'Fn::GetAtt': [keyId, 'Arn'] });
    }
    const policy = resources[keyId]?.Properties.KeyPolicy as { Statement: Json[] };
    expect(policy.Statement).toContainEqual(
      expect.objectContaining({
        Principal: { Service: { 'Fn::Join': ['', ['logs.', { Ref: 'AWS::Region' }, '.amazonaws.com']] } },
        Condition: {
          ArnLike: {
            'kms:EncryptionContext:aws:logs:arn': {
              'Fn::Join': [
                '',
                [
                  'arn:',
                  { Ref: 'AWS::Partition' },
                  ':logs:',
                  { Ref: 'AWS::Region' },
                  ':',
                  { Ref: 'AWS::AccountId' },
                  ':log-group:KappLambda-*',
                ],
              ],
            },
          },
        },
      }),
    );
    // No reservation and no VPC unless asked.
    for (const [, f] of ofType('AWS::Lambda::Function')) {
      expect(f.Properties.ReservedConcurrentExecutions).toBeUndefined();
      expect(f.Properties.VpcConfig).toBeUndefined();
    }
  });

  it("takes unkeyed message groups only under unkeyedGroups accept (an upgrade's window), on every dispatcher", () => {
    const variables = (st: KappLambdaStack) =>
      Object.values(Template.fromStack(st).toJSON().Resources as Record<string, Resource>)
        .filter((r) => r.Type === 'AWS::Lambda::Function')
        .map((f) => (f.Properties.Environment as { Variables?: Json } | undefined)?.Variables ?? {});
    const accepting = variables(optioned).filter((v) => v.KAPP_LAMBDA_UNKEYED_GROUPS === 'accept');
    expect(accepting.map((v) => v.KAPP_LAMBDA_DISPATCH_STAGE).sort()).toEqual([...PIPELINE_STAGES].sort());
    expect(variables(stack).filter((v) => v.KAPP_LAMBDA_UNKEYED_GROUPS !== undefined)).toEqual([]);
  });

  it('shares the claims with the fleet under sharing fleet: no domain variable, the run roles hold the fleet claims', () => {
    const t = Template.fromStack(optioned).toJSON().Resources as Record<string, Resource>;
    const fns = Object.values(t).filter((r) => r.Type === 'AWS::Lambda::Function');
    for (const f of fns) {
      expect(
        (f.Properties.Environment as { Variables?: Json } | undefined)?.Variables?.KAPP_LAMBDA_SHARING,
      ).toBeUndefined();
    }
    const runPolicy = JSON.stringify(
      Object.values(t).filter(
        (r) =>
          r.Type === 'AWS::IAM::Policy' &&
          (r.Properties.Roles as Json[]).some(
            (role) =>
              role.Ref ===
              optioned.resolve(optioned.getLogicalId(optioned.stages.template.runRole!.node.defaultChild as never)),
          ),
      ),
    );
    expect(runPolicy).toContain('/cache/render/*');
    expect(runPolicy).not.toContain('/d/*');
  });

  it('uses a customer key for the bucket, the root key secret, the variables and the logs, and creates none', () => {
    const t = Template.fromStack(optioned).toJSON().Resources as Record<string, Resource>;
    const arn = OPTIONS.kmsKeyArn;
    const of = (type: string) => Object.values(t).filter((r) => r.Type === type);
    expect(of('AWS::KMS::Key')).toEqual([]);
    for (const f of of('AWS::Lambda::Function')) expect(f.Properties.KmsKeyArn).toBe(arn);
    for (const g of of('AWS::Logs::LogGroup')) expect(g.Properties.KmsKeyId).toBe(arn);
    expect(of('AWS::SecretsManager::Secret')[0]?.Properties.KmsKeyId).toBe(arn);
    const bucket = of('AWS::S3::Bucket')[0]?.Properties.BucketEncryption as Json;
    expect(JSON.stringify(bucket)).toContain(arn as string);
  });

  it('reserves the concurrency asked per function and runs every function in the subnets given', () => {
    const t = Template.fromStack(optioned).toJSON().Resources as Record<string, Resource>;
    const fns = optioned.stages;
    const props = (st: PipelineStage) =>
      t[optioned.resolve(optioned.getLogicalId(fns[st].fn.node.defaultChild as never)) as string]?.Properties as Json;
    expect(props('deploy').ReservedConcurrentExecutions).toBe(40);
    expect(props('install').ReservedConcurrentExecutions).toBe(5);
    expect(props('fetch').ReservedConcurrentExecutions).toBeUndefined();
    const groups = Object.entries(t).filter(([, r]) => r.Type === 'AWS::EC2::SecurityGroup');
    expect(groups).toHaveLength(1);
    expect(groups[0]?.[1].Properties).toMatchObject({
      VpcId: 'vpc-0a1b2c3d4e5f60718',
      SecurityGroupEgress: [{ CidrIp: '0.0.0.0/0', IpProtocol: '-1' }],
    });
    expect(groups[0]?.[1].Properties.SecurityGroupIngress).toBeUndefined();
    const statements = Object.values(t)
      .filter((r) => r.Type === 'AWS::IAM::Policy')
      .flatMap((p) => (p.Properties.PolicyDocument as { Statement: Json[] }).Statement);
    expect(statements.filter((x) => list(x.Action as string[]).includes('ec2:CreateNetworkInterface'))).toHaveLength(
      PIPELINE_STAGES.length,
    );
    for (const st of PIPELINE_STAGES) {
      // The dispatcher calls AWS APIs only: outside the VPC (no STS or Lambda endpoint needed there).
      const dispatcherId = optioned.resolve(optioned.getLogicalId(fns[st].dispatcher!.node.defaultChild as never));
      expect(t[dispatcherId as string]?.Properties.VpcConfig).toBeUndefined();
      expect(props(st).VpcConfig).toEqual({
        SubnetIds: ['subnet-0a1b2c3d', 'subnet-0e1f2a3b'],
        SecurityGroupIds: [{ 'Fn::GetAtt': [groups[0]?.[0], 'GroupId'] }],
      });
    }
  });
});

describe('cdk-nag AwsSolutions', () => {
  it('reports nothing unacknowledged', () => {
    for (const s of [stack, apart, deployed, optioned]) {
      const report = new AwsSolutionsChecks(app).validateScope(s);
      expect(report.violations.map((v) => `${v.ruleName} ${JSON.stringify(v.violatingResources)}`)).toEqual([]);
      expect(report.success).toBe(true);
    }
  });

  it('every acknowledgment says why', () => {
    const acks = stack.node
      .findAll()
      .flatMap((c) => c.node.metadata.filter((m) => m.type === Validations.ACKNOWLEDGED_RULES_METADATA_KEY))
      .flatMap((m) => Object.entries(m.data as Record<string, string>).map(([id, reason]) => ({ id, reason })));
    expect(acks.length).toBeGreaterThan(0);
    for (const a of acks) expect(a.reason.length, a.id).toBeGreaterThan(40);
    expect(new Set(acks.map((a) => a.id.replace(/^Annotation::/, '').replace(/\[.*$/, '')))).toEqual(
      new Set(['AwsSolutions-S1', 'AwsSolutions-SMG4', 'AwsSolutions-IAM5']),
    );
  });
});
