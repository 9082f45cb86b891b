/**
 * Joining a cluster is a data change, never a stack change: the stack synthesized before and
 * after 1,000 clusters join (their registry documents written by the code `npm run cluster --
 * join` writes them with, in a directory registry; no cluster, no AWS) is the same template,
 * with the fleet-wide outputs only. The forwarder roles `join` creates get the stack's one
 * managed policy, which may only send to the entry queues. Code and layer directories are small
 * stand-ins, as in `cells.test.ts`.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { App, aws_lambda as lambda } from 'aws-cdk-lib';
import { Template } from 'aws-cdk-lib/assertions';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PIPELINE_STAGES } from '../../functions/lib/api/functions.js';
import { LocalDirStore } from '../../functions/lib/store/local.js';
import type { stageAssets } from '../../infra/aws/assets.js';
import { fleetSettings } from '../../infra/aws/fleet.js';
import { KappLambdaStack } from '../../infra/aws/stack.js';
import { FORWARDER_STAGES } from '../../infra/aws/stages.js';
import { writeJoinDocument } from '../../scripts/cluster-join.js';
import { clusterSummaries } from '../../scripts/cluster-registry.js';
import { standInAssets } from './template-env.js';

type Json = Record<string, unknown>;
const CLUSTERS = 1000;
/** A CA bundle the document validation accepts (its content is not checked beyond PEM). */
const CA = '-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n';

let tmp: string;
let assets: ReturnType<typeof stageAssets>;

/** The template of a fresh app with the operator's context (no cluster in it: clusters are data). */
function synth(): { json: Json; stack: KappLambdaStack } {
  const app = new App({
    outdir: path.join(tmp, `cdk.out-${Math.random()}`),
    context: { 'aws:cdk:disable-asset-staging': true },
  });
  const stack = new KappLambdaStack(app, 'KappLambda', {
    assets,
    dispatcherCodeDir: assets.fetch.codeDir,
    architecture: lambda.Architecture.ARM_64,
    fleet: fleetSettings(() => undefined),
  });
  return { json: Template.fromStack(stack).toJSON() as Json, stack };
}

beforeAll(async () => {
  for (const k of Object.keys(process.env)) if (k.startsWith('AWS_') || k.startsWith('CDK_')) delete process.env[k];
  tmp = await mkdtemp(path.join(tmpdir(), 'kapp-lambda-join-scale-'));
  assets = await standInAssets(tmp);
}, 120_000);

afterAll(async () => {
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

describe('cluster join at fleet scale', () => {
  it('1,000 joined clusters leave the template as it was, with fleet-wide outputs only', async () => {
    const before = synth().json;
    const store = new LocalDirStore(path.join(tmp, 'registry'));
    for (let i = 0; i < CLUSTERS; i++) {
      const id = `cluster-${String(i).padStart(4, '0')}`;
      await writeJoinDocument(
        store,
        {
          id,
          endpoint: `https://${id}.example.com`,
          caPem: CA,
          auth: { kind: 'eks', clusterName: id, region: 'eu-west-1' },
          // An IAM role id: AROA and 17 upper-case letters or digits, one per cluster.
          forwarderRoleId: `AROA${String(i).padStart(17, '0')}`,
        },
        { checkForwarder: false },
      );
    }
    const summaries = await clusterSummaries(store);
    expect(summaries).toHaveLength(CLUSTERS);
    expect(summaries.filter((s) => 'invalid' in s)).toEqual([]);
    expect(summaries.every((s) => 'forwarderRoleId' in s && s.forwarderRoleId?.startsWith('AROA'))).toBe(true);

    const after = synth().json;
    expect(after).toEqual(before);
    const outputs = Object.keys(after.Outputs as Json).sort();
    expect(outputs.length).toBeLessThan(200);
    expect(outputs).toEqual(
      [
        'BucketName',
        'ClusterRegistry',
        'ForwarderPolicyArn',
        'Region',
        ...PIPELINE_STAGES.flatMap((s) => {
          const p = s.replace(/(^|-)([a-z])/g, (_, __, c: string) => c.toUpperCase());
          return [`QueueUrl${p}`, `FunctionRoleArn${p}`];
        }),
      ].sort(),
    );
  }, 300_000);

  it("the forwarders' managed policy may only send to the entry queues", () => {
    const { json, stack } = synth();
    const policy = stack.forwarderPolicy;
    expect(policy).toBeDefined();
    const id = stack.resolve(stack.getLogicalId(policy!.node.defaultChild as never)) as string;
    const resources = json.Resources as Record<string, { Type: string; Properties: Json }>;
    expect(resources[id]?.Type).toBe('AWS::IAM::ManagedPolicy');
    expect((resources[id]!.Properties.PolicyDocument as Json).Statement).toEqual([
      {
        Effect: 'Allow',
        Action: 'sqs:SendMessage',
        Resource: FORWARDER_STAGES.map((s) => ({
          'Fn::GetAtt': [stack.resolve(stack.getLogicalId(stack.stages[s].queue.node.defaultChild as never)), 'Arn'],
        })),
      },
    ]);
    expect((json.Outputs as Record<string, Json>).ForwarderPolicyArn?.Value).toEqual({ Ref: id });
  });
});
