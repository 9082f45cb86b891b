/**
 * The fleet page next to the cloud mode (`infra/aws/fleet-page.ts`), synthesized offline: its
 * function (the real bundle of `functions/fleet-page/index.ts`) behind a Function URL with
 * `AuthType: AWS_IAM` only, a role that reads the fleet view's prefixes and writes nothing, a
 * viewers' policy that invokes it through the URL, cdk-nag clean; absent unless asked for. And
 * the grants hold the view: every key the fleet view lists or reads lies under
 * `FLEET_PAGE_READS`.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { App, aws_lambda as lambda } from 'aws-cdk-lib';
import { Template } from 'aws-cdk-lib/assertions';
import { AwsSolutionsChecks } from 'cdk-nag';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildFleetView } from '../../functions/lib/fleet/view.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import type { ObjectStore } from '../../functions/lib/store/port.js';
import { fleetSettings } from '../../infra/aws/fleet.js';
import { FLEET_PAGE_READS, fleetPageContext } from '../../infra/aws/fleet-page.js';
import { FUNCTION_RUNTIME, KappLambdaStack } from '../../infra/aws/stack.js';
import { bundleFunctions } from '../../layers/bundle.js';
import { putFleetFixture } from '../harness/fleet-fixture.js';
import { standInAssets } from './template-env.js';

type Json = Record<string, unknown>;
type Resource = { Type: string; Properties: Json };

let tmp: string;
let app: App;
let withPage: KappLambdaStack;
/** As `cdk deploy` synthesizes it: with an account and region. */
let deployed: KappLambdaStack;
let without: KappLambdaStack;
let resources: Record<string, Resource>;

const ofType = (rs: Record<string, Resource>, type: string) => Object.entries(rs).filter(([, r]) => r.Type === type);
const logicalId = (s: KappLambdaStack, c: { node: { defaultChild?: unknown } }) =>
  s.resolve(s.getLogicalId(c.node.defaultChild as never)) as string;
const list = <T>(v: T | T[]): T[] => (Array.isArray(v) ? v : [v]);

beforeAll(async () => {
  for (const k of Object.keys(process.env)) if (k.startsWith('AWS_') || k.startsWith('CDK_')) delete process.env[k];
  tmp = await mkdtemp(path.join(tmpdir(), 'kapp-lambda-fleet-page-'));
  const assets = await standInAssets(tmp);
  const { 'fleet-page': fleetPageCodeDir } = await bundleFunctions(['fleet-page'], path.join(tmp, 'bundles'));
  app = new App({ outdir: path.join(tmp, 'cdk.out'), context: { 'aws:cdk:disable-asset-staging': true } });
  const props = {
    assets,
    dispatcherCodeDir: assets.fetch.codeDir,
    architecture: lambda.Architecture.ARM_64,
    fleet: fleetSettings(() => undefined),
  };
  withPage = new KappLambdaStack(app, 'KappLambdaPage', { ...props, fleetPageCodeDir });
  deployed = new KappLambdaStack(app, 'KappLambdaPageDeployed', {
    ...props,
    fleetPageCodeDir,
    env: { account: '111122223333', region: 'eu-west-1' },
  });
  without = new KappLambdaStack(app, 'KappLambdaNoPage', props);
  resources = Template.fromStack(withPage).toJSON().Resources as Record<string, Resource>;
}, 300_000);

afterAll(async () => {
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

describe('context fleetPage', () => {
  it('is off unless true', () => {
    expect(fleetPageContext(undefined)).toBe(false);
    expect(fleetPageContext('false')).toBe(false);
    expect(fleetPageContext(false)).toBe(false);
    expect(fleetPageContext('true')).toBe(true);
    expect(fleetPageContext(true)).toBe(true);
    expect(() => fleetPageContext('yes')).toThrow('fleetPage: expected true or false, not "yes"');
  });

  it('without the page, the stack has no Function URL and no page function', () => {
    expect(without.fleetPage).toBeUndefined();
    const rs = Template.fromStack(without).toJSON().Resources as Record<string, Resource>;
    expect(ofType(rs, 'AWS::Lambda::Url')).toEqual([]);
    expect(Template.fromStack(without).toJSON().Outputs).not.toHaveProperty('FleetPageUrl');
  });
});

describe('the fleet page', () => {
  it('is one Function URL with AuthType AWS_IAM on the page function, and no public permission', () => {
    const page = withPage.fleetPage!;
    const urls = ofType(resources, 'AWS::Lambda::Url');
    expect(urls).toHaveLength(1);
    expect(urls[0]![1].Properties).toEqual({
      AuthType: 'AWS_IAM',
      TargetFunctionArn: { 'Fn::GetAtt': [logicalId(withPage, page.fn), 'Arn'] },
    });
    // No resource policy lets anyone in (a NONE URL needs one naming principal *).
    for (const [, p] of ofType(resources, 'AWS::Lambda::Permission')) {
      expect(p.Properties.Principal).not.toBe('*');
      expect(p.Properties.FunctionUrlAuthType).toBeUndefined();
    }
    const fn = resources[logicalId(withPage, page.fn)]!.Properties;
    expect(fn).toMatchObject({
      Handler: 'index.handler',
      Runtime: FUNCTION_RUNTIME.name,
      Architectures: ['arm64'],
      MemorySize: 256,
      Timeout: 30,
      Environment: { Variables: { KAPP_LAMBDA_BUCKET: { Ref: logicalId(withPage, withPage.bucket) } } },
    });
    expect(fn.VpcConfig).toBeUndefined();
    expect(Template.fromStack(withPage).toJSON().Outputs).toMatchObject({
      FleetPageUrl: { Value: { 'Fn::GetAtt': [logicalId(withPage, page.url), 'FunctionUrl'] } },
      FleetPageViewerPolicyArn: { Value: { Ref: logicalId(withPage, page.viewerPolicy) } },
    });
  });

  it("its role reads the view's prefixes, lists them only, decrypts through S3 only, and writes nothing", () => {
    const page = withPage.fleetPage!;
    const roleId = logicalId(withPage, page.role);
    const role = resources[roleId]!.Properties;
    expect(role.ManagedPolicyArns).toBeUndefined();
    const statements = ofType(resources, 'AWS::IAM::Policy')
      .filter(([, p]) => (p.Properties.Roles as Json[]).some((r) => r.Ref === roleId))
      .flatMap(([, p]) => (p.Properties.PolicyDocument as { Statement: Json[] }).Statement);
    const bucketArn = { 'Fn::GetAtt': [logicalId(withPage, withPage.bucket), 'Arn'] };
    const keyArn = { 'Fn::GetAtt': [logicalId(withPage, withPage.artifactKey as never), 'Arn'] };
    const bySid = (action: string) => statements.filter((s) => list(s.Action as string | string[]).includes(action));
    expect(bySid('s3:GetObject')).toEqual([
      {
        Effect: 'Allow',
        Action: 's3:GetObject',
        Resource: FLEET_PAGE_READS.map((p) => ({ 'Fn::Join': ['', [bucketArn, `/${p}*`]] })),
      },
    ]);
    expect(bySid('s3:ListBucket')).toEqual([
      {
        Effect: 'Allow',
        Action: 's3:ListBucket',
        Resource: bucketArn,
        Condition: { StringLike: { 's3:prefix': FLEET_PAGE_READS.map((p) => `${p}*`) } },
      },
    ]);
    expect(bySid('kms:Decrypt')).toEqual([
      {
        Effect: 'Allow',
        Action: 'kms:Decrypt',
        Resource: keyArn,
        Condition: {
          StringEquals: { 'kms:ViaService': { 'Fn::Join': ['', ['s3.', { Ref: 'AWS::Region' }, '.amazonaws.com']] } },
        },
      },
    ]);
    const actions = statements.flatMap((s) => list(s.Action as string | string[]));
    // Nothing else but its logs.
    expect(actions.filter((a) => !a.startsWith('logs:'))).toEqual(['s3:GetObject', 's3:ListBucket', 'kms:Decrypt']);
    expect(
      actions.filter((a) => /Put|Delete|Create|GenerateDataKey|Send|Invoke|Secret/.test(a) && !a.startsWith('logs:')),
    ).toEqual([]);
  });

  it("the viewers' policy invokes the page function through its IAM-authorized URL, nothing else", () => {
    const page = withPage.fleetPage!;
    const policy = resources[logicalId(withPage, page.viewerPolicy)]!.Properties;
    const fnArn = { 'Fn::GetAtt': [logicalId(withPage, page.fn), 'Arn'] };
    expect((policy.PolicyDocument as { Statement: Json[] }).Statement).toEqual([
      {
        Effect: 'Allow',
        Action: 'lambda:InvokeFunctionUrl',
        Resource: fnArn,
        Condition: { StringEquals: { 'lambda:FunctionUrlAuthType': 'AWS_IAM' } },
      },
      { Effect: 'Allow', Action: 'lambda:InvokeFunction', Resource: fnArn },
    ]);
  });

  it('cdk-nag AwsSolutions reports nothing unacknowledged', () => {
    for (const s of [withPage, deployed]) {
      const report = new AwsSolutionsChecks(app).validateScope(s);
      expect(report.violations.map((v) => `${v.ruleName} ${JSON.stringify(v.violatingResources)}`)).toEqual([]);
      expect(report.success).toBe(true);
    }
  });
});

describe('FLEET_PAGE_READS', () => {
  it('holds every key the fleet view lists or reads', async () => {
    const inner = new MemoryStore();
    await putFleetFixture(inner);
    const touched: string[] = [];
    const seen = <T>(key: string, v: T) => {
      touched.push(key);
      return v;
    };
    const store: ObjectStore = {
      get: (k, o) => seen(k, inner.get(k, o)),
      head: (k) => seen(k, inner.head(k)),
      getVersioned: (k, o) => seen(k, inner.getVersioned(k, o)),
      list: (p, o) => seen(p, inner.list(p, o)),
      put: () => Promise.reject(new Error('write')),
      putIfAbsent: () => Promise.reject(new Error('write')),
      putIfMatch: () => Promise.reject(new Error('write')),
      delete: () => Promise.reject(new Error('write')),
    };
    const view = await buildFleetView(store);
    // The fixture was read whole: an index entry with its receipt, and a rollout.
    expect(view.installs[0]?.lastReconcile).toBeDefined();
    expect(view.rollouts).toHaveLength(1);
    expect(touched.length).toBeGreaterThan(3);
    expect(touched.filter((k) => !FLEET_PAGE_READS.some((p) => k.startsWith(p)))).toEqual([]);
  });
});
