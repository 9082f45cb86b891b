/**
 * The stack in `isolation: cell`, synthesized offline for a fleet of two clusters `a` and `b`:
 * each cluster's functions, queues, root key and forwarder confined to that cluster. The code
 * and layer directories are small stand-ins (what is checked is how they are wired, and that
 * both cells use the same ones); `stack.test.ts` synthesizes the real bundles in shared mode.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { App, CfnResource, aws_iam as iam, aws_lambda as lambda } from 'aws-cdk-lib';
import { Template } from 'aws-cdk-lib/assertions';
import { AwsSolutionsChecks } from 'cdk-nag';
import type { IConstruct } from 'constructs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PIPELINE_STAGES, queueUrlEnv } from '../../functions/lib/api/functions.js';
import { parseLambdaEnv } from '../../functions/lib/entry/config.js';
import { ARTIFACT_ROOT_KEY_SECRET_ENV, usesArtifactKey } from '../../functions/lib/entry/lambda.js';
import { SHARES_PREFIX } from '../../functions/lib/lease/shares.js';
import type { stageAssets } from '../../infra/aws/assets.js';
import { fleetSettings } from '../../infra/aws/fleet.js';
import { type Cell, functionSenders, KappLambdaStack, sendQueues } from '../../infra/aws/stack.js';
import { FORWARDER_STAGES, PER_CLUSTER_PREFIXES } from '../../infra/aws/stages.js';
import { concreteEnv, standInAssets, standInRoleId } from './template-env.js';

type Json = Record<string, unknown>;
type Resource = { Type: string; Properties: Json };

const eks = (name: string) => `arn:aws:eks:eu-west-1:123456789012:cluster/${name}`;
const CONTEXT: Record<string, unknown> = {
  isolation: 'cell',
  forwarders: JSON.stringify({ a: { eksClusterArn: eks('a') }, b: { eksClusterArn: eks('b') } }),
};

let tmp: string;
let app: App;
let assets: ReturnType<typeof stageAssets>;
let stack: KappLambdaStack;
/** The same fleet with an account and region, as `cdk deploy` synthesizes it. */
let deployed: KappLambdaStack;
let resources: Record<string, Resource>;

const logicalId = (c: IConstruct) => stack.resolve(stack.getLogicalId(c.node.defaultChild as never)) as string;
const list = <T>(v: T | T[]): T[] => (Array.isArray(v) ? v : [v]);
const statementsOf = (roleId: string): Json[] =>
  Object.values(resources)
    .filter((r) => r.Type === 'AWS::IAM::Policy')
    .filter((p) => (p.Properties.Roles as Json[]).some((r) => r.Ref === roleId))
    .flatMap((p) => (p.Properties.PolicyDocument as { Statement: Json[] }).Statement);
const envOf = (fn: lambda.Function) =>
  (resources[logicalId(fn)]!.Properties.Environment as { Variables: Record<string, unknown> }).Variables;
const cell = (id: string): Cell => stack.cells[id]!;
/** The key pattern (`/<keys>`) of a bucket object ARN (`Fn::Join` of the bucket's ARN and it), else undefined. */
const objectKey = (r: unknown): string | undefined => {
  const k = (r as { 'Fn::Join'?: [string, unknown[]] })['Fn::Join']?.[1]?.[1];
  return typeof k === 'string' && k.startsWith('/') ? k : undefined;
};
/** Logical ids of every resource of a cell (under the construct `Cell<Id>`). */
const idsOf = (id: string) =>
  stack.node
    .findChild(`Cell${id.toUpperCase()}`)
    .node.findAll()
    .filter((c): c is CfnResource => c instanceof CfnResource)
    .map((c) => stack.resolve(stack.getLogicalId(c)) as string);

beforeAll(async () => {
  for (const k of Object.keys(process.env)) if (k.startsWith('AWS_') || k.startsWith('CDK_')) delete process.env[k];
  tmp = await mkdtemp(path.join(tmpdir(), 'kapp-lambda-cells-'));
  assets = await standInAssets(tmp);
  app = new App({ outdir: path.join(tmp, 'cdk.out'), context: { 'aws:cdk:disable-asset-staging': true } });
  const props = {
    assets,
    dispatcherCodeDir: assets.fetch.codeDir,
    architecture: lambda.Architecture.ARM_64,
    fleet: fleetSettings((k) => CONTEXT[k]),
  };
  stack = new KappLambdaStack(app, 'KappLambdaCells', props);
  deployed = new KappLambdaStack(app, 'KappLambdaCellsDeployed', {
    ...props,
    env: { account: '111122223333', region: 'eu-west-1' },
  });
  resources = Template.fromStack(stack).toJSON().Resources as Record<string, Resource>;
}, 300_000);

afterAll(async () => {
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

describe('isolation: cell', () => {
  it('makes one cell per cluster of forwarders and no fleet-wide set of functions', () => {
    expect(Object.keys(stack.cells)).toEqual(['a', 'b']);
    expect(() => stack.stages).toThrow('isolation: cell: the stack has one set of functions per cluster (cells)');
    // No rollout check: a cell's installs are not gated (the two schedules are the cells' source polls).
    expect(() => stack.rolloutCheck).toThrow("isolation: cell: no rollout check (a cell's installs are not gated)");
    const count = (type: string) => Object.values(resources).filter((r) => r.Type === type).length;
    const n = PIPELINE_STAGES.length;
    expect(count('AWS::Lambda::Function')).toBe(2 * n);
    expect(count('AWS::SQS::Queue')).toBe(4 * n);
    expect(count('AWS::SecretsManager::Secret')).toBe(2);
    expect(count('AWS::Scheduler::Schedule')).toBe(2);
    // One layer per stage, one bucket and key: what the cells share.
    expect(count('AWS::Lambda::LayerVersion')).toBe(n);
    expect(count('AWS::S3::Bucket')).toBe(1);
    expect(count('AWS::KMS::Key')).toBe(1);
  });

  it("a's roles read only a's registry document and a's stage tokens: nothing of b, no wildcard over cluster ids", () => {
    for (const stage of PIPELINE_STAGES) {
      const st = statementsOf(logicalId(cell('a').stages[stage].role));
      const text = JSON.stringify(st);
      expect(text).toContain('/registry/clusters/a.json');
      expect(text).not.toContain('clusters/b');
      expect(text).not.toContain('clusters/*');
      const secrets = st
        .filter((s) => list(s.Action as string[]).includes('secretsmanager:GetSecretValue'))
        .flatMap((s) => list(s.Resource as unknown[]))
        .map((r) => JSON.stringify(r));
      const tokens = secrets.filter((r) => r.includes(':secret:'));
      expect(tokens).toHaveLength(1);
      expect(tokens[0]).toContain(`:secret:kapp-lambda/a/${stage}-??????`);
      expect(text).not.toMatch(/kapp-lambda\/(\*|b)\//);
      // No resource of b's cell is named by any of a's statements.
      const ofB = idsOf('b');
      expect(ofB.length).toBeGreaterThan(PIPELINE_STAGES.length);
      for (const id of ofB) expect(text, id).not.toContain(`"${id}"`);
    }
  });

  it("a's root key secret is not b's, and a's functions are given and may read a's only", () => {
    const [a, b] = [logicalId(cell('a').rootKey), logicalId(cell('b').rootKey)];
    expect(a).not.toBe(b);
    for (const stage of PIPELINE_STAGES) {
      const st = statementsOf(logicalId(cell('a').stages[stage].role));
      const rootKeyReads = st
        .filter((s) => list(s.Action as string[]).includes('secretsmanager:GetSecretValue'))
        .flatMap((s) => list(s.Resource as unknown[]))
        .filter((r) => (r as Json).Ref !== undefined);
      expect(rootKeyReads).toEqual(usesArtifactKey(stage) ? [{ Ref: a }] : []);
      expect(envOf(cell('a').stages[stage].fn)[ARTIFACT_ROOT_KEY_SECRET_ENV]).toEqual(
        usesArtifactKey(stage) ? { Ref: a } : undefined,
      );
    }
  });

  it("a's forwarder may send only to a's entry queues", () => {
    const st = statementsOf(logicalId(stack.forwarderRoles.a!));
    expect(st).toEqual([
      {
        Effect: 'Allow',
        Action: 'sqs:SendMessage',
        Resource: FORWARDER_STAGES.map((s) => ({ 'Fn::GetAtt': [logicalId(cell('a').stages[s].queue), 'Arn'] })),
      },
    ]);
    expect(() => stack.addClusterForwarder('c', new iam.AccountRootPrincipal())).toThrow(
      'forwarder: c has no cell (addCell first)',
    );
  });

  it.each(PIPELINE_STAGES)(
    "%s: a's function is told its cluster, sends to a's queues, takes a's functions as senders",
    (stage) => {
      const { fn } = cell('a').stages[stage];
      const env = envOf(fn);
      expect(env.KAPP_LAMBDA_CELL_CLUSTER).toBe('a');
      expect(envOf(cell('b').stages[stage].fn).KAPP_LAMBDA_CELL_CLUSTER).toBe('b');
      for (const next of sendQueues(stage)) {
        expect(env[queueUrlEnv(next)]).toEqual({ Ref: logicalId(cell('a').stages[next].queue) });
      }
      // What the function's configuration parser makes of it: a sender check for cluster a only,
      // taking from a's functions that send to this one, each bound to its role.
      const concrete = concreteEnv(env);
      expect(parseLambdaEnv(stage, { ...concrete, AWS_REGION: 'eu-west-1' }).senderCheck).toEqual({
        cell: 'a',
        functionSenders: functionSenders(stage).map((s) => ({
          stage: s,
          roleId: standInRoleId(logicalId(cell('a').stages[s].role)),
        })),
      });
      // The same code and layer as b's function: one bundle and one layer upload for the fleet.
      const [pa, pb] = [fn, cell('b').stages[stage].fn].map((f) => resources[logicalId(f)]!.Properties);
      expect(pa!.Code).toEqual(pb!.Code);
      expect(pa!.Layers).toEqual(pb!.Layers);
    },
  );

  it("a's functions write the per-cluster prefixes of the bucket under a/ only", () => {
    const keys = PIPELINE_STAGES.flatMap((stage) => statementsOf(logicalId(cell('a').stages[stage].role)))
      .flatMap((s) => list(s.Resource as unknown[]))
      .map((r) => (r as { 'Fn::Join'?: [string, unknown[]] })['Fn::Join']?.[1]?.[1])
      .filter((k): k is string => typeof k === 'string' && k.startsWith('/'));
    for (const prefix of PER_CLUSTER_PREFIXES) {
      const under = keys.filter((k) => k.startsWith(`/${prefix}`));
      expect(under.length, prefix).toBeGreaterThan(0);
      expect([...new Set(under)], prefix).toEqual([`/${prefix}a/*`]);
    }
    // Each function's fair shares: its cluster's document and parked records only (not `a*`,
    // which would match a cluster whose id begins with a).
    const shares = keys.filter((k) => k.startsWith(`/${SHARES_PREFIX}`));
    expect([...new Set(shares)].sort()).toEqual(
      PIPELINE_STAGES.flatMap((st) => [`/${SHARES_PREFIX}${st}/a.json`, `/${SHARES_PREFIX}${st}/a/*`]).sort(),
    );
  });

  it("a's install function writes a's fleet index entries and reads a's receipts, and no rollout policy or record", () => {
    const objects = statementsOf(logicalId(cell('a').stages.install.role))
      .filter((s) => list(s.Resource as unknown[]).some((r) => typeof objectKey(r) === 'string'))
      .map((s) => ({ keys: objectKey(s.Resource), actions: list(s.Action as string[]) }));
    expect(objects).toEqual([
      { keys: '/state/fleet/a/*', actions: ['s3:GetObject', 's3:PutObject', 's3:DeleteObject'] },
      { keys: '/receipts/a/*', actions: ['s3:GetObject'] },
      { keys: '/artifacts/template/*', actions: ['s3:GetObject'] },
      { keys: '/state/shares/install/a.json', actions: ['s3:GetObject', 's3:PutObject', 's3:DeleteObject'] },
      { keys: '/state/shares/install/a/*', actions: ['s3:GetObject', 's3:PutObject', 's3:DeleteObject'] },
      { keys: '/registry/clusters/a.json', actions: ['s3:GetObject'] },
    ]);
  });

  it("each cell's source poll invokes that cell's index-repo function", () => {
    for (const id of ['a', 'b']) {
      const schedule = resources[logicalId(cell(id).sourcePoll)]!.Properties;
      expect((schedule.Target as Json).Arn).toEqual({
        'Fn::GetAtt': [logicalId(cell(id).stages['index-repo'].fn), 'Arn'],
      });
    }
  });

  it('outputs each cell its queues and function roles', () => {
    const outputs = Object.keys(Template.fromStack(stack).toJSON().Outputs as Json);
    for (const id of ['A', 'B']) {
      for (const stage of PIPELINE_STAGES) {
        const s = stage.replace(/(^|-)([a-z])/g, (_, __, c: string) => c.toUpperCase());
        expect(outputs).toContain(`QueueUrl${s}${id}`);
        expect(outputs).toContain(`FunctionRoleArn${s}${id}`);
      }
      expect(outputs).toContain(`ForwarderRoleId${id}`);
    }
    expect(outputs).not.toContain('QueueUrlFetch');
  });

  it('is refused where it cannot confine: a shared stack gets no cell, a cluster access without a registry no cell stack', () => {
    const other = new App({
      outdir: path.join(tmp, 'cdk.out.other'),
      context: { 'aws:cdk:disable-asset-staging': true },
    });
    const shared = new KappLambdaStack(other, 'Shared', {
      assets,
      dispatcherCodeDir: assets.fetch.codeDir,
      architecture: lambda.Architecture.ARM_64,
      fleet: fleetSettings(() => undefined),
    });
    expect(() => shared.addCell('a')).toThrow("cell: a: the stack's isolation is shared");
    expect(() => stack.addCell('a')).toThrow('cell: a already has one');
    expect(
      () =>
        new KappLambdaStack(other, 'NoRegistry', {
          assets,
          dispatcherCodeDir: assets.fetch.codeDir,
          architecture: lambda.Architecture.ARM_64,
          fleet: fleetSettings((k) => CONTEXT[k]),
          clusterAccess: { environment: { KAPP_LAMBDA_KUBECONFIG: '/var/task/kubeconfig' }, grant: () => undefined },
        }),
    ).toThrow("isolation: cell: the stack's clusterAccess locates no cluster registry");
  });

  it('cdk-nag AwsSolutions reports nothing unacknowledged', () => {
    for (const s of [stack, deployed]) {
      const report = new AwsSolutionsChecks(app).validateScope(s);
      expect(report.violations.map((v) => `${v.ruleName} ${JSON.stringify(v.violatingResources)}`)).toEqual([]);
      expect(report.success).toBe(true);
    }
  });
});
