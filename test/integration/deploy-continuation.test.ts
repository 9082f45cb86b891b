/**
 * A deploy longer than one invocation (issue 11 item 6a) with the real pieces: the Lambda
 * composition root (`createLambdaDeps`) of the fetch, template and deploy functions over each
 * function's layer (the real runner and the real vendir, ytt and kapp), the S3-compatible server
 * for artifacts and run leases, the shared kwok cluster, and the SQS handler with a Lambda-like
 * context whose remaining time is short, so the function deadline cuts `kapp deploy` while it
 * waits. Only the queues are an in-memory sender (what a function sends is read back from it).
 *
 * - cut: a Deployment whose Pod no node can take (its nodeSelector) keeps kapp waiting; the
 *   deadline stops kapp, the App stays `Reconciling` with `status.deploy` unfinished, and the
 *   deploy function queues its own continuation;
 * - continued: a kwok node gets the label, the Pod runs, and the continuation's kapp ends the run
 *   `ReconcileSucceeded` with `status.deploy` finished (exit code 0, the first kapp's start);
 * - canceled meanwhile: the continuation runs no kapp and ends as upstream's cancel of a waiting
 *   kapp (`ReconcileFailed`, `Deploying: Process was canceled`); the canceled spec's reconcile
 *   then marks `Canceled/paused`.
 */
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import { SQSClient } from '@aws-sdk/client-sqs';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { type DeployStageEvent, EVENT_TYPES, type KappEvent, targetFunction } from '../../events/schema.js';
import type { PipelineStage } from '../../functions/lib/api/functions.js';
import { type LambdaContext, makeSqsHandler, type SqsHandler } from '../../functions/lib/entry/handler.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { MemoryEventSender } from '../../functions/lib/transport/index.js';
import {
  apply,
  applyCrds,
  appManifest,
  appObjectEvent,
  createTenant,
  deleteNamespaces,
  getApp,
  getObject,
  k,
  pendingDeployment,
  RFC3339,
  servers,
  suffix,
} from '../e2e/support.js';
import { firstReceive, functionLayer, inProcessDepsFactory, inProcessFunctionEnv } from '../harness/lambda.js';
import { makeTempDir, removeTempDir } from '../harness/servers/process.js';
import { s3Client } from '../harness/servers/s3.js';

const cluster = inject('cluster');
const kubeconfigPath = inject('kubeconfigPath');
/** The kubeconfig context of the shared cluster: the cluster id the functions serve. */
const CLUSTER_ID = `kwok-${cluster.name}`;
const id = suffix();
const ns = `cont-${id}`;
/** The label the stuck Deployment's Pod asks for; no node has it until the test labels one. */
const NODE_LABEL = `kapp-lambda.test/continuation-${id}`;
const NODE = cluster.nodeNames[0] ?? 'kwok-node-0';
/** Time before the invocation's limit when the deadline cuts kapp (the handler's margin), ms. */
const MARGIN_MS = 4000;
/**
 * A short invocation: the deadline cuts kapp 15 s in, long after it started waiting (kapp needs
 * a second or two to apply here, a few on a loaded machine).
 */
const SHORT: LambdaContext = { getRemainingTimeInMillis: () => 19_000 };
/** A long invocation (the continuation, the other stages): the deadline never comes. */
const LONG: LambdaContext = { getRemainingTimeInMillis: () => 170_000 };

const s3 = servers().s3;
const s3c = s3Client(s3);
const sqs = new SQSClient({ region: s3.region });
let tmp: string;
const binDirs = new Map<PipelineStage, string>();

/** The environment of one function as the stack gives it (queues unused: the sender is in memory). */
function functionEnv(stage: PipelineStage): Record<string, string> {
  return inProcessFunctionEnv(stage, {
    s3,
    bucketPrefix: `deploy-cont-${id}/`,
    kubeconfigPath,
    tmpDir: path.join(tmp, 'scratch'),
    binDir: binDirs.get(stage) ?? '',
  });
}

/** The fetch, template and deploy functions of one App (its own processes), and what they send. */
function functions() {
  const sender = new MemoryEventSender();
  const log = memoryLogger();
  const handlers = new Map<PipelineStage, SqsHandler>();
  for (const stage of ['fetch', 'template', 'deploy'] as const) {
    const deps = inProcessDepsFactory(
      stage,
      functionEnv(stage),
      { s3: s3c, sqs },
      { log: log.child({ function: stage }), sender },
    );
    handlers.set(
      stage,
      makeSqsHandler(stage, () => ({ ...deps(), deadlineMarginMs: MARGIN_MS })),
    );
  }
  let seq = 0;
  /** Delivers one event to its function as SQS would; @returns the response and the events it sent. */
  const deliver = async (event: KappEvent, context: LambdaContext) => {
    const stage = targetFunction(event);
    const handler = handlers.get(stage);
    if (!handler) throw new Error(`no ${stage} function here`);
    const before = sender.sent.length;
    const messageId = `m-${++seq}`;
    const res = await handler({ Records: [firstReceive(event, messageId)] }, { ...context, awsRequestId: messageId });
    const stageRuns = log.records
      .filter((r) => r.msg === 'stage run' && r.obj.messageId === messageId)
      .map((r) => r.obj as { stage: string; outcome: string; tools?: { runs: number } });
    return { res, sent: sender.sent.slice(before).map((s) => s.event), stageRuns };
  };
  return { deliver };
}

/** The object event the forwarder sends for the App as it is now. */
function appEvent(name: string, reason: 'added' | 'modified'): Promise<KappEvent> {
  return appObjectEvent(CLUSTER_ID, ns, name, reason);
}

/** An App deploying one Deployment whose Pod needs a node labelled `selector` (none is, yet). */
function stuckApp(name: string, selector: string): object {
  const deployment = pendingDeployment(`${name}-web`, name, selector);
  return appManifest(ns, name, {
    fetch: [{ inline: { paths: { 'deployment.yml': deployment } } }],
    template: [{ ytt: {} }],
    deploy: [{ kapp: {} }],
  });
}

/**
 * Runs a new App's reconcile through fetch and template, then its deploy in a short invocation
 * whose deadline cuts kapp. @returns the continuation the deploy function queued.
 */
async function deployCut(fns: ReturnType<typeof functions>, name: string): Promise<DeployStageEvent> {
  let event = await appEvent(name, 'added');
  for (const stage of ['fetch', 'template'] as const) {
    const { res, sent, stageRuns } = await fns.deliver(event, LONG);
    expect(res, stage).toEqual({ batchItemFailures: [] });
    expect(stageRuns.map((r) => r.outcome).at(-1), stage).toBe('succeeded');
    expect(sent, stage).toHaveLength(1);
    event = sent[0] as KappEvent;
  }
  expect(event.type).toBe(EVENT_TYPES.deploy);
  const { res, sent, stageRuns } = await fns.deliver(event, SHORT);
  expect(res).toEqual({ batchItemFailures: [] });
  expect(stageRuns.map((r) => [r.stage, r.outcome])).toEqual([['deploy', 'continued']]);
  expect(sent.map((e) => [e.type, e.source])).toEqual([[EVENT_TYPES.deploy, '/kapp-lambda/functions/deploy']]);
  const next = sent[0] as DeployStageEvent;
  expect(next.data.continuation).toEqual({ count: 1, deployStartedAt: expect.stringMatching(RFC3339) });
  expect(next.data.run).toEqual((event as DeployStageEvent).data.run);
  return next;
}

beforeAll(async () => {
  tmp = await makeTempDir('deploy-cont');
  await mkdir(path.join(tmp, 'scratch'));
  for (const stage of ['fetch', 'template', 'deploy'] as const) {
    binDirs.set(stage, (await functionLayer(tmp, stage)).binDir);
  }
  await applyCrds();
  await createTenant(ns);
}, 180_000);

afterAll(async () => {
  await k(['label', 'node', NODE, `${NODE_LABEL}-`], undefined, false);
  await deleteNamespaces([ns]);
  s3c.destroy();
  sqs.destroy();
  if (tmp) await removeTempDir(tmp);
});

describe('a deploy the function deadline cuts while kapp waits', () => {
  type Case = { name: string; fns: ReturnType<typeof functions>; next?: DeployStageEvent };
  const waits = { name: `waits-${id}` } as Case;
  const canceled = { name: `canceled-${id}` } as Case;

  beforeAll(async () => {
    // Built once the layers are laid out (the outer beforeAll).
    waits.fns = functions();
    canceled.fns = functions();
    await apply(stuckApp(waits.name, NODE_LABEL), stuckApp(canceled.name, `${NODE_LABEL}-never`));
    // Two Apps, two invocations at once (as two function instances would run them).
    [waits.next, canceled.next] = await Promise.all([
      deployCut(waits.fns, waits.name),
      deployCut(canceled.fns, canceled.name),
    ]);
  }, 180_000);

  it('stays Reconciling with kapp output in an unfinished status.deploy', async () => {
    for (const { name, next } of [waits, canceled]) {
      const app = await getApp(ns, name);
      expect(app?.status?.conditions).toEqual([{ type: 'Reconciling', status: 'True' }]);
      expect(app?.status?.friendlyDescription).toBe('Reconciling');
      expect(app?.status?.deploy).toMatchObject({
        finished: false,
        exitCode: 0,
        startedAt: next?.data.continuation?.deployStartedAt,
      });
      // kapp had created the Deployment and was waiting for it when the deadline came.
      expect(app?.status?.deploy?.stdout).toContain(`${name}-web`);
      expect(await getObject('deployment', ns, `${name}-web`)).toBeDefined();
    }
  });

  it('continues once the Pod can run: ReconcileSucceeded, kapp finished with exit code 0', async () => {
    await k(['label', 'node', NODE, `${NODE_LABEL}=true`, '--overwrite']);
    const { res, sent, stageRuns } = await waits.fns.deliver(waits.next as KappEvent, LONG);
    expect(res).toEqual({ batchItemFailures: [] });
    expect(stageRuns.map((r) => [r.stage, r.outcome, r.tools?.runs])).toEqual([['deploy', 'succeeded', 1]]);
    expect(sent).toEqual([]);
    const app = await getApp(ns, waits.name);
    expect(app?.status?.conditions).toEqual([{ type: 'ReconcileSucceeded', status: 'True' }]);
    expect(app?.status?.friendlyDescription).toBe('Reconcile succeeded');
    expect(app?.status?.observedGeneration).toBe(1);
    expect(app?.status?.deploy).toMatchObject({
      finished: true,
      exitCode: 0,
      startedAt: waits.next?.data.continuation?.deployStartedAt,
    });
    expect(app?.status?.deploy?.stdout).toContain('Succeeded');
    const deployment = await getObject<{ status?: { availableReplicas?: number } }>(
      'deployment',
      ns,
      `${waits.name}-web`,
    );
    expect(deployment?.status?.availableReplicas).toBe(1);
  });

  it("canceled meanwhile: no kapp, ends as upstream's cancel does (ReconcileFailed, then Canceled/paused)", async () => {
    await k(['patch', 'app', canceled.name, '-n', ns, '--type=merge', '-p', '{"spec":{"canceled":true}}']);
    const { res, sent, stageRuns } = await canceled.fns.deliver(canceled.next as KappEvent, LONG);
    expect(res).toEqual({ batchItemFailures: [] });
    expect(stageRuns.map((r) => [r.stage, r.outcome, r.tools?.runs])).toEqual([['deploy', 'failed', 0]]);
    expect(sent).toEqual([]);
    const message = 'Deploying: Process was canceled';
    const ended = await getApp(ns, canceled.name);
    expect(ended?.status?.conditions).toEqual([{ type: 'ReconcileFailed', status: 'True', message }]);
    expect(ended?.status?.deploy).toMatchObject({
      finished: true,
      exitCode: -1,
      error: message,
      startedAt: canceled.next?.data.continuation?.deployStartedAt,
    });
    expect(ended?.status?.deploy?.stdout).toContain(`${canceled.name}-web`);

    // The forwarder's event for the canceled spec: upstream's next reconcile takes the
    // canceled branch (observedGeneration, Canceled/paused, the condition left as it is).
    const modified = await canceled.fns.deliver(await appEvent(canceled.name, 'modified'), LONG);
    expect(modified.res).toEqual({ batchItemFailures: [] });
    expect(modified.sent).toEqual([]);
    const app = await getApp(ns, canceled.name);
    expect(app?.status?.observedGeneration).toBe(2);
    expect(app?.status?.friendlyDescription).toBe('Canceled/paused');
    expect(app?.status?.conditions).toEqual([{ type: 'ReconcileFailed', status: 'True', message }]);
    expect(app?.status?.deploy).toMatchObject({ finished: true, exitCode: -1, error: message });
  });
});
