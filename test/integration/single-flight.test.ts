/**
 * Fleet single-flight (issue 13 item 3) with the real pieces: twelve fetch and twelve template
 * function instances (the Lambda composition root `createLambdaDeps` each, over its function's
 * layer: the real runner, vendir and ytt) share one bucket on the S3-compatible server, and
 * twelve Apps of the shared kwok cluster with the same pinned source and template reconcile at
 * once, as a fleet-wide rollout does. Counted at each instance's command runner: vendir and ytt
 * run once in all; the eleven other instances wait on the in-flight marker and hand on the
 * artifact the one run made (stage outcome `cached`). Only the queues are an in-memory sender.
 */
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import { SQSClient } from '@aws-sdk/client-sqs';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import {
  type DeployStageEvent,
  EVENT_TYPES,
  type KappEvent,
  type TemplateStageEvent,
  targetFunction,
} from '../../events/schema.js';
import type { PipelineStage } from '../../functions/lib/api/functions.js';
import { INFLIGHT_PREFIX } from '../../functions/lib/artifact/keys.js';
import { type LambdaContext, makeSqsHandler, type SqsHandler } from '../../functions/lib/entry/handler.js';
import type { CommandRunner } from '../../functions/lib/exec/runner.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { S3Store } from '../../functions/lib/store/index.js';
import { MemoryEventSender } from '../../functions/lib/transport/index.js';
import {
  apply,
  applyCrds,
  appManifest,
  appObjectEvent,
  createTenant,
  deleteNamespaces,
  servers,
  suffix,
} from '../e2e/support.js';
import { firstReceive, functionLayer, inProcessDepsFactory, inProcessFunctionEnv } from '../harness/lambda.js';
import { makeTempDir, removeTempDir } from '../harness/servers/process.js';
import { s3Client } from '../harness/servers/s3.js';

const cluster = inject('cluster');
const kubeconfigPath = inject('kubeconfigPath');
const CLUSTER_ID = `kwok-${cluster.name}`;
const id = suffix();
const ns = `flight-${id}`;
const PREFIX = `single-flight-${id}/`;
/** Apps (and function instances of each stage) reconciling at once. */
const N = 12;
const LONG: LambdaContext = { getRemainingTimeInMillis: () => 170_000 };

const s3 = servers().s3;
const s3c = s3Client(s3);
const sqs = new SQSClient({ region: s3.region });
let tmp: string;
const binDirs = new Map<PipelineStage, string>();
/** Tool runs across every instance, by binary. */
const runs = new Map<string, number>();

function functionEnv(stage: PipelineStage, instance: number): Record<string, string> {
  return inProcessFunctionEnv(stage, {
    s3,
    bucketPrefix: PREFIX,
    kubeconfigPath,
    // Each instance its own /tmp, as each Lambda instance has.
    tmpDir: path.join(tmp, 'scratch', `${stage}-${instance}`),
    binDir: binDirs.get(stage) ?? '',
  });
}

/** The real runner, counting what it starts. */
function counting(runner: CommandRunner): CommandRunner {
  return {
    run: (req) => {
      runs.set(req.cmd, (runs.get(req.cmd) ?? 0) + 1);
      return runner.run(req);
    },
  };
}

/** One instance of `stage`'s function. @returns a delivery of one event as SQS would make it. */
function instance(stage: PipelineStage, i: number) {
  const sender = new MemoryEventSender();
  const log = memoryLogger();
  const deps = inProcessDepsFactory(
    stage,
    functionEnv(stage, i),
    { s3: s3c, sqs },
    { log: log.child({ function: stage }), sender },
  );
  const handler: SqsHandler = makeSqsHandler(stage, () => {
    const d = deps();
    return { ...d, pipeline: { ...d.pipeline, runner: counting(d.pipeline.runner) } };
  });
  return async (event: KappEvent) => {
    expect(targetFunction(event)).toBe(stage);
    const res = await handler(
      { Records: [firstReceive(event, `m-${stage}-${i}`)] },
      { ...LONG, awsRequestId: `m-${stage}-${i}` },
    );
    expect(res).toEqual({ batchItemFailures: [] });
    const outcomes = log.records
      .filter((r) => r.msg === 'stage run' && r.obj.stage === stage)
      .map((r) => r.obj.outcome as string);
    return { sent: sender.sent.map((s) => s.event), outcomes };
  };
}

const names = Array.from({ length: N }, (_, i) => `fleet-${i}`);
const CONFIG = [
  '#@ load("@ytt:data", "data")',
  'apiVersion: v1',
  'kind: ConfigMap',
  'metadata:',
  '  name: #@ data.values.name',
  'data:',
  '  release: one',
  '',
].join('\n');

beforeAll(async () => {
  tmp = await makeTempDir('single-flight');
  await mkdir(path.join(tmp, 'scratch'));
  for (const stage of ['fetch', 'template'] as const) binDirs.set(stage, (await functionLayer(tmp, stage)).binDir);
  await applyCrds();
  await createTenant(ns);
  // The same pinned source (inline paths) and template in every App: one fetch, one render.
  await apply(
    ...names.map((name) =>
      appManifest(ns, name, {
        fetch: [{ inline: { paths: { 'config.yml': CONFIG, 'values.yml': '#@data/values\n---\nname: fleet\n' } } }],
        template: [{ ytt: {} }],
        deploy: [{ kapp: {} }],
      }),
    ),
  );
}, 180_000);

afterAll(async () => {
  await deleteNamespaces([ns]);
  s3c.destroy();
  sqs.destroy();
  if (tmp) await removeTempDir(tmp);
});

describe(`${N} Apps with the same pinned fetch and render, reconciled at once by ${N} function instances`, () => {
  let templates: TemplateStageEvent[] = [];

  it('fetch: vendir runs once; every instance hands on the same artifact', async () => {
    const events = await Promise.all(names.map((name) => appObjectEvent(CLUSTER_ID, ns, name, 'added')));
    const out = await Promise.all(events.map((e, i) => instance('fetch', i)(e)));
    expect(runs.get('vendir')).toBe(1);
    templates = out.map((o) => {
      expect(o.sent.map((e) => e.type)).toEqual([EVENT_TYPES.template]);
      return o.sent[0] as TemplateStageEvent;
    });
    expect(new Set(templates.map((t) => t.data.artifacts.fetchKey)).size).toBe(1);
    const outcomes = out.flatMap((o) => o.outcomes).sort();
    expect(outcomes).toEqual([...Array(N - 1).fill('cached'), 'succeeded']);
  }, 180_000);

  it('template: ytt runs once; every instance hands on the same manifest; no marker is left', async () => {
    expect(templates).toHaveLength(N);
    const out = await Promise.all(templates.map((e, i) => instance('template', i)(e)));
    expect(runs.get('ytt')).toBe(1);
    const deploys = out.map((o) => {
      expect(o.sent.map((e) => e.type)).toEqual([EVENT_TYPES.deploy]);
      return o.sent[0] as DeployStageEvent;
    });
    expect(new Set(deploys.map((d) => d.data.artifacts.manifestKey)).size).toBe(1);
    expect(out.flatMap((o) => o.outcomes).sort()).toEqual([...Array(N - 1).fill('cached'), 'succeeded']);
    const store = new S3Store({ client: s3c, bucket: s3.bucket ?? 'kapp-lambda', prefix: PREFIX });
    expect(await store.list(INFLIGHT_PREFIX)).toEqual([]);
    expect(await store.list('cache/render/')).toHaveLength(1);
  }, 180_000);
});
