/**
 * The bundled Lambda functions under the real AWS Lambda Runtime Interface Emulator: the
 * esbuild bundle (`layers/bundle.ts`, as `layers/build.ts` makes it) is its own bootstrap
 * (`node fetch.mjs`, the Runtime API client of `functions/lib/entry/runtime-api.ts`), invoked
 * with SQS-shaped events over RIE's invoke endpoint on 127.0.0.1.
 *
 * - invalid and misrouted records are dropped (logged with the field path), a record whose
 *   stage throws fails alone (`batchItemFailures`), the process survives all of it;
 * - an invalid configuration ends init with one JSON line, not a dump of the bundle;
 * - a real fetch of an inline App in the shared cluster: artifact in S3 (versitygw), status
 *   written, and the template hand-off sent with the real SQS adapter to a recording
 *   SQS endpoint (there is no SQS-compatible server among the test components; the endpoint
 *   speaks just enough of SQS's JSON protocol for `SendMessage` and records each request);
 * - the index-repo function (its own layer: vendir, imgpkg, ytt, kbld, kapp) reconciling an
 *   inline PackageRepository: fetched tree in S3, Packages and PackageMetadata deployed by kapp
 *   as the function's own identity, `ReconcileSucceeded`, nothing sent on; then its delete
 *   event removes them and the finalizer;
 * - the deploy function with the sender check on (a file registry naming the cluster's
 *   forwarder, `KAPP_LAMBDA_FUNCTION_SENDERS` as the CDK app writes it): a deploy naming a
 *   manifest is refused from the fetch function's role and from the forwarder, what fetch does
 *   send (an inspect after its failure) is taken.
 */
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { mkdir, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import path from 'node:path';
import { HeadObjectCommand, ListObjectsV2Command } from '@aws-sdk/client-s3';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { stringify } from 'yaml';
import {
  deployEvent,
  EVENT_TYPES,
  objectEvent,
  objectRefOf,
  orderingKey,
  parseEvent,
  serializeEvent,
  templateEvent,
} from '../../events/schema.js';
import type { PipelineStage } from '../../functions/lib/api/functions.js';
import { layerToolVersions } from '../../layers/build.js';
import { bundleFunction } from '../../layers/bundle.js';
import { hardenAddonPath } from '../../layers/native.js';
import { applyCrds } from '../e2e/support.js';
import { kubectl } from '../harness/kube.js';
import { functionLayer, invokeRie, type Rie, rieLogLines, startRie } from '../harness/lambda.js';
import { LOOPBACK, makeTempDir, removeTempDir } from '../harness/servers/process.js';
import { type S3Info, s3Client } from '../harness/servers/s3.js';
import type { ServersInfo } from '../harness/servers.js';

const kubeconfigPath = inject('kubeconfigPath');
const cluster = inject('cluster');
const CLUSTER_ID = `kwok-${cluster.name}`;
const ns = `lambda-${randomBytes(3).toString('hex')}`;
const k = (args: string[], input?: string) => kubectl(kubeconfigPath, args, { input, kubectl: cluster.kubectlPath });
const TEMPLATE_QUEUE = 'template.fifo';
const INSTALL_QUEUE = 'install.fifo';
const DEPLOY_QUEUE = 'deploy.fifo';
// Named for the config of fetch, template and deploy (the run lease's follow-up goes there); this file sends none.
const FETCH_QUEUE = 'fetch.fifo';
// Named for index-repo's config (the source poll's fan-out goes there); this file sends none.
const INDEX_REPO_QUEUE = 'index-repo.fifo';

/** Bundles `functions/<stage>/index.ts` exactly as `layers/build.ts` does. */
async function bundle(stage: string, outDir: string): Promise<string> {
  const outfile = path.join(outDir, `${stage}.mjs`);
  await bundleFunction(stage, outfile);
  return outfile;
}

/** One SendMessage request as the recording SQS endpoint received it. */
interface SqsRequest {
  target: string;
  body: Record<string, unknown>;
}

/**
 * A recording stand-in for SQS's JSON protocol: answers SendMessage, DeleteMessageBatch (a
 * function's early delete of the records it handled) and ChangeMessageVisibilityBatch (the sender
 * check's proof that a record is its queue's: handles `rh-…` of {@link sqsRecord} are in flight,
 * any other is refused as SQS refuses one it did not issue), records every request.
 */
async function startRecordingSqs(): Promise<{ url: string; requests: SqsRequest[]; server: Server }> {
  const requests: SqsRequest[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const target = String(req.headers['x-amz-target'] ?? '');
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}') as Record<string, unknown>;
      requests.push({ target, body });
      res.setHeader('content-type', 'application/x-amz-json-1.0');
      if (target === 'AmazonSQS.DeleteMessageBatch') {
        const entries = (body.Entries ?? []) as { Id: string }[];
        res.end(JSON.stringify({ Successful: entries.map((e) => ({ Id: e.Id })), Failed: [] }));
        return;
      }
      if (target === 'AmazonSQS.ChangeMessageVisibilityBatch') {
        const entries = (body.Entries ?? []) as { Id: string; ReceiptHandle: string }[];
        const issued = (e: { ReceiptHandle: string }) => e.ReceiptHandle.startsWith('rh-');
        res.end(
          JSON.stringify({
            Successful: entries.filter(issued).map((e) => ({ Id: e.Id })),
            Failed: entries
              .filter((e) => !issued(e))
              .map((e) => ({ Id: e.Id, SenderFault: true, Code: 'ReceiptHandleIsInvalid', Message: 'invalid' })),
          }),
        );
        return;
      }
      if (target !== 'AmazonSQS.SendMessage') {
        res.statusCode = 400;
        res.end(JSON.stringify({ __type: 'com.amazon.coral.service#UnknownOperationException' }));
        return;
      }
      const md5 = createHash('md5')
        .update(String(body.MessageBody ?? ''))
        .digest('hex');
      res.end(JSON.stringify({ MessageId: randomUUID(), MD5OfMessageBody: md5 }));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, LOOPBACK, resolve));
  const addr = server.address();
  const port = typeof addr === 'object' && addr ? addr.port : 0;
  return { url: `http://${LOOPBACK}:${port}`, requests, server };
}

const startFunction = (bundlePath: string, env: Record<string, string>, cwd: string) =>
  startRie({ bundle: bundlePath, env, cwd });
const invoke = async (rie: Rie, payload: unknown) => {
  const { status, body } = await invokeRie(rie, payload);
  return { status, body };
};
const logLines = rieLogLines;

const sqsRecord = (messageId: string, body: string, group: string) => ({
  messageId,
  receiptHandle: `rh-${messageId}`,
  body,
  attributes: {
    ApproximateReceiveCount: '1',
    SentTimestamp: '1735787045000',
    MessageGroupId: group,
    MessageDeduplicationId: messageId,
    SequenceNumber: '18849496460467696128',
  },
  messageAttributes: {},
  md5OfBody: createHash('md5').update(body).digest('hex'),
  eventSource: 'aws:sqs',
  eventSourceARN: 'arn:aws:sqs:us-east-1:000000000000:fetch.fifo',
  awsRegion: 'us-east-1',
});

let tmp: string;
let s3: S3Info;
let sqs: Awaited<ReturnType<typeof startRecordingSqs>>;
let fetchRie: Rie;
const started: Rie[] = [];

/** A function's layer as `layers/build.ts` lays it out: its tools and the launcher flat in one bin dir. */
async function layerBinDir(stage: PipelineStage): Promise<string> {
  return (await functionLayer(tmp, stage)).binDir;
}

function functionEnv(binDir: string, stage: PipelineStage = 'fetch'): Record<string, string> {
  return {
    AWS_REGION: s3.region,
    AWS_ACCESS_KEY_ID: s3.accessKeyId,
    AWS_SECRET_ACCESS_KEY: s3.secretAccessKey,
    KAPP_LAMBDA_BUCKET: s3.bucket ?? 'kapp-lambda',
    KAPP_LAMBDA_BUCKET_PREFIX: `lambda-it-${ns}/`,
    KAPP_LAMBDA_S3_ENDPOINT: s3.endpoint,
    KAPP_LAMBDA_SQS_ENDPOINT: sqs.url,
    KAPP_LAMBDA_QUEUE_URL_FETCH: `${sqs.url}/000000000000/${FETCH_QUEUE}`,
    KAPP_LAMBDA_QUEUE_URL_TEMPLATE: `${sqs.url}/000000000000/${TEMPLATE_QUEUE}`,
    KAPP_LAMBDA_QUEUE_URL_DEPLOY: `${sqs.url}/000000000000/${DEPLOY_QUEUE}`,
    KAPP_LAMBDA_QUEUE_URL_INSTALL: `${sqs.url}/000000000000/${INSTALL_QUEUE}`,
    KAPP_LAMBDA_QUEUE_URL_INDEX_REPO: `${sqs.url}/000000000000/${INDEX_REPO_QUEUE}`,
    KAPP_LAMBDA_KUBECONFIG: kubeconfigPath,
    KAPP_LAMBDA_TMP_DIR: path.join(tmp, 'scratch'),
    KAPP_LAMBDA_BIN_DIR: binDir,
    KAPP_LAMBDA_HARDEN_ADDON: hardenAddonPath(),
    KAPP_LAMBDA_TOOL_VERSIONS: JSON.stringify(layerToolVersions(stage)),
    KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET: `file://${path.join(tmp, 'artifact-root.key')}`,
  };
}

beforeAll(async () => {
  tmp = await makeTempDir('lambda-it');
  await mkdir(path.join(tmp, 'scratch'));
  await writeFile(path.join(tmp, 'artifact-root.key'), Buffer.alloc(32, 7).toString('base64'), { mode: 0o600 });
  const provided = inject('servers') as unknown as ServersInfo | null;
  if (!provided) throw new Error('the integration global setup provides no servers (test/harness/servers.ts)');
  s3 = provided.s3;
  sqs = await startRecordingSqs();
  const bundles = path.join(tmp, 'bundles');
  await mkdir(bundles);
  const fetchBundle = await bundle('fetch', bundles);
  fetchRie = await startFunction(fetchBundle, functionEnv(await layerBinDir('fetch')), tmp);
  started.push(fetchRie);

  // The CRDs, and kapp-lambda/kapp-lambda-pkgr, the identity the index-repo function's kapp runs as.
  await applyCrds();
  await k(['create', 'namespace', ns]);
}, 180_000);

afterAll(async () => {
  for (const r of started) await r.proc.stop();
  await new Promise<void>((resolve) => (sqs ? sqs.server.close(() => resolve()) : resolve()));
  await k(['delete', 'namespace', ns, '--wait=false']).catch(() => undefined);
  if (tmp) await removeTempDir(tmp);
});

const appRef = (name: string, meta: { uid: string; generation: number; resourceVersion: string }) => ({
  clusterId: CLUSTER_ID,
  kind: 'App' as const,
  apiVersion: 'kappctrl.k14s.io/v1alpha1',
  namespace: ns,
  name,
  ...meta,
});

describe('fetch function under the Runtime Interface Emulator', () => {
  it('drops invalid and misrouted records, fails only the record that throws, and keeps serving', async () => {
    const time = new Date().toISOString();
    const valid = objectEvent(appRef('ghost', { uid: 'u-1', generation: 1, resourceVersion: '1' }), 'added', { time });
    const invalid = JSON.parse(serializeEvent(valid));
    invalid.data.generation = 'one';
    const forTemplate = templateEvent(
      {
        object: appRef('ghost', { uid: 'u-1', generation: 1, resourceVersion: '1' }),
        run: { generation: 1, runId: 'r-1', startedAt: time },
        artifacts: { fetchKey: `artifacts/fetch/sha256/${'a'.repeat(64)}.tgz` },
      },
      { time },
    );
    const otherCluster = objectEvent(
      { ...appRef('ghost', { uid: 'u-2', generation: 1, resourceVersion: '1' }), clusterId: 'not-served' },
      'added',
      { time },
    );
    const res = await invoke(fetchRie, {
      Records: [
        sqsRecord('bad-1', JSON.stringify(invalid), 'g-1'),
        sqsRecord('bad-2', 'this is not JSON', 'g-2'),
        sqsRecord('misrouted-1', serializeEvent(forTemplate), 'g-3'),
        sqsRecord('unknown-cluster-1', serializeEvent(otherCluster), orderingKey(objectRefOf(otherCluster))),
      ],
    });
    expect(res).toEqual({ status: 200, body: { batchItemFailures: [{ itemIdentifier: 'unknown-cluster-1' }] } });

    const lines = logLines(fetchRie);
    const byMessage = (id: string) => lines.filter((l) => l.messageId === id);
    expect(byMessage('bad-1')).toEqual([
      expect.objectContaining({
        level: 40,
        function: 'fetch',
        stage: 'fetch',
        outcome: 'invalid',
        error: 'data.generation: expected number, received string',
        msg: 'invalid event; dropped',
      }),
    ]);
    expect(byMessage('bad-2')).toEqual([
      expect.objectContaining({ outcome: 'invalid', error: '(root): not valid JSON', msg: 'invalid event; dropped' }),
    ]);
    expect(byMessage('misrouted-1')).toEqual([
      expect.objectContaining({
        outcome: 'misrouted',
        target: 'template',
        type: 'dev.kapp-lambda.stage.template.v1',
        msg: 'event is for another function; dropped',
      }),
    ]);
    expect(byMessage('unknown-cluster-1')).toEqual([
      expect.objectContaining({ level: 50, outcome: 'failed', msg: 'event failed; will be retried' }),
    ]);
    expect(String(byMessage('unknown-cluster-1')[0]?.error)).toContain('not-served');
    // Nothing sent. The records dropped while another still ran were deleted early from the
    // fetch queue (each lane as it ended: the first ends long before the one that fails, which
    // loads its stage); never the one that failed.
    expect(sqs.requests.length).toBeGreaterThan(0);
    for (const r of sqs.requests) {
      expect(r.target).toBe('AmazonSQS.DeleteMessageBatch');
      expect(r.body.QueueUrl).toBe(`${sqs.url}/000000000000/${FETCH_QUEUE}`);
      for (const e of r.body.Entries as { ReceiptHandle: string }[]) {
        expect(['rh-bad-1', 'rh-bad-2', 'rh-misrouted-1']).toContain(e.ReceiptHandle);
      }
    }
    expect(lines.filter((l) => String(l.msg).startsWith('could not delete'))).toEqual([]);
    sqs.requests.length = 0;

    // Still the same process, still serving: an empty batch succeeds.
    expect(await invoke(fetchRie, { Records: [] })).toEqual({ status: 200, body: { batchItemFailures: [] } });
    expect(fetchRie.proc.output()).not.toContain('Runtime.ExitError');
  });

  it('fetches an inline App: artifact in S3, status written, template hand-off sent to the template queue', async () => {
    const name = 'inline-app';
    await k(
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'kappctrl.k14s.io/v1alpha1',
        kind: 'App',
        metadata: { name, namespace: ns },
        spec: {
          serviceAccountName: 'deployer',
          fetch: [{ inline: { paths: { 'cm.yml': 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n' } } }],
          template: [{ ytt: {} }],
          deploy: [{ kapp: {} }],
        },
      }),
    );
    const meta = JSON.parse((await k(['get', 'app', name, '-n', ns, '-o', 'json'])).stdout).metadata as {
      uid: string;
      generation: number;
      resourceVersion: string;
    };
    const ev = objectEvent(
      appRef(name, { uid: meta.uid, generation: meta.generation, resourceVersion: meta.resourceVersion }),
      'added',
      { time: new Date() },
    );
    const before = sqs.requests.length;
    const res = await invoke(fetchRie, {
      Records: [sqsRecord('fetch-1', serializeEvent(ev), `${CLUSTER_ID}/App/${ns}/${name}`)],
    });
    expect(res).toEqual({ status: 200, body: { batchItemFailures: [] } });

    const sent = sqs.requests.slice(before);
    expect(sent.map((r) => r.target)).toEqual(['AmazonSQS.SendMessage']);
    const input = sent[0]?.body ?? {};
    expect(Object.keys(input).sort()).toEqual(['MessageBody', 'MessageDeduplicationId', 'MessageGroupId', 'QueueUrl']);
    expect(input.QueueUrl).toBe(`${sqs.url}/000000000000/${TEMPLATE_QUEUE}`);
    expect(input.MessageGroupId).toBe(`${CLUSTER_ID}/App/${ns}/${name}`);
    const parsed = parseEvent(String(input.MessageBody));
    if (!parsed.ok) throw new Error(`the sent body is not a valid event: ${parsed.error}`);
    const next = parsed.event;
    expect(input.MessageDeduplicationId).toBe(next.id);
    expect(next.type).toBe('dev.kapp-lambda.stage.template.v1');
    if (next.type !== 'dev.kapp-lambda.stage.template.v1') return;
    expect(next.source).toBe('/kapp-lambda/functions/fetch');
    const { reason: _reason, ...ref } = ev.data;
    expect(next.data.object).toEqual(ref);
    expect(next.data.run.generation).toBe(meta.generation);
    expect(next.data.artifacts.fetchKey).toMatch(/^artifacts\/fetch\/sha256\/[0-9a-f]{64}\.tgz$/);
    expect(next.data.fetchStatus?.exitCode).toBe(0);

    const client = s3Client(s3);
    try {
      const head = await client.send(
        new HeadObjectCommand({ Bucket: s3.bucket, Key: `lambda-it-${ns}/${next.data.artifacts.fetchKey}` }),
      );
      expect(head.ContentLength).toBeGreaterThan(0);
    } finally {
      client.destroy();
    }

    const app = JSON.parse((await k(['get', 'app', name, '-n', ns, '-o', 'json'])).stdout) as {
      status?: { friendlyDescription?: string; conditions?: { type: string; status: string }[] };
    };
    expect(app.status?.friendlyDescription).toBe('Reconciling');
    expect(app.status?.conditions).toEqual([expect.objectContaining({ type: 'Reconciling', status: 'True' })]);

    const line = logLines(fetchRie).find((l) => l.messageId === 'fetch-1' && l.outcome === 'forwarded');
    expect(line).toEqual(
      expect.objectContaining({
        function: 'fetch',
        to: 'template',
        next: 'dev.kapp-lambda.stage.template.v1',
        nextId: next.id,
      }),
    );
  });
});

describe('index-repo function under the Runtime Interface Emulator', () => {
  const REF_NAME = 'simple.lambda.example.com';
  const VERSIONS = ['1.0.0', '1.1.0'];
  const paths: Record<string, string> = {
    [`packages/${REF_NAME}/metadata.yml`]: stringify({
      apiVersion: 'data.packaging.carvel.dev/v1alpha1',
      kind: 'PackageMetadata',
      metadata: { name: REF_NAME },
      spec: { displayName: 'Simple App' },
    }),
  };
  for (const version of VERSIONS) {
    paths[`packages/${REF_NAME}/${version}.yml`] = stringify({
      apiVersion: 'data.packaging.carvel.dev/v1alpha1',
      kind: 'Package',
      metadata: { name: `${REF_NAME}.${version}` },
      spec: {
        refName: REF_NAME,
        version,
        template: { spec: { fetch: [{ inline: {} }], template: [{ ytt: {} }], deploy: [{ kapp: {} }] } },
      },
    });
  }
  interface Repo {
    metadata: { uid: string; generation: number; resourceVersion: string; finalizers?: string[] };
    status?: {
      observedGeneration?: number;
      friendlyDescription?: string;
      conditions?: { type: string; status: string }[];
      fetch?: { exitCode?: number };
      template?: { exitCode?: number };
      deploy?: { exitCode?: number };
    };
  }
  const repoEvent = (name: string, m: Repo['metadata'], reason: 'added' | 'modified') =>
    objectEvent(
      {
        clusterId: CLUSTER_ID,
        kind: 'PackageRepository',
        apiVersion: 'packaging.carvel.dev/v1alpha1',
        namespace: ns,
        name,
        uid: m.uid,
        generation: m.generation,
        resourceVersion: m.resourceVersion,
      },
      reason,
      { time: new Date() },
    );
  /** The keys of fetched trees in this file's bucket prefix. */
  const fetchKeys = async (): Promise<string[]> => {
    const client = s3Client(s3);
    try {
      const listed = await client.send(
        new ListObjectsV2Command({ Bucket: s3.bucket, Prefix: `lambda-it-${ns}/artifacts/fetch/` }),
      );
      return (listed.Contents ?? []).map((o) => o.Key ?? '');
    } finally {
      client.destroy();
    }
  };
  const names = async (resource: string) =>
    (await k(['get', resource, '-n', ns, '-o', 'jsonpath={.items[*].metadata.name}'])).stdout
      .split(' ')
      .filter(Boolean);

  it('reconciles an inline PackageRepository into Packages (ReconcileSucceeded), then deletes them with the repository', async () => {
    const indexRie = await startFunction(
      await bundle('index-repo', path.join(tmp, 'bundles')),
      functionEnv(await layerBinDir('index-repo'), 'index-repo'),
      tmp,
    );
    started.push(indexRie);
    const name = 'inline-repo';
    await k(
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'packaging.carvel.dev/v1alpha1',
        kind: 'PackageRepository',
        metadata: { name, namespace: ns },
        spec: { fetch: { inline: { paths } } },
      }),
    );
    const getRepo = async () => JSON.parse((await k(['get', 'pkgr', name, '-n', ns, '-o', 'json'])).stdout) as Repo;
    const group = `${CLUSTER_ID}/PackageRepository/${ns}/${name}`;
    const before = sqs.requests.length;
    const keysBefore = await fetchKeys();
    const added = repoEvent(name, (await getRepo()).metadata, 'added');
    expect(await invoke(indexRie, { Records: [sqsRecord('repo-1', serializeEvent(added), group)] })).toEqual({
      status: 200,
      body: { batchItemFailures: [] },
    });

    const repo = await getRepo();
    expect(repo.status?.conditions).toEqual([{ type: 'ReconcileSucceeded', status: 'True' }]);
    expect(repo.status?.friendlyDescription).toBe('Reconcile succeeded');
    expect(repo.status?.observedGeneration).toBe(repo.metadata.generation);
    expect([repo.status?.fetch?.exitCode, repo.status?.template?.exitCode, repo.status?.deploy?.exitCode]).toEqual([
      0, 0, 0,
    ]);
    expect(repo.metadata.finalizers).toContain('finalizers.packagerepository.packaging.carvel.dev/delete');
    expect((await names('packages.data.packaging.carvel.dev')).sort()).toEqual(VERSIONS.map((v) => `${REF_NAME}.${v}`));
    expect(await names('packagemetadatas.data.packaging.carvel.dev')).toEqual([REF_NAME]);
    // kapp's app record of `<name>.pkgr`: deployed by the function as its own identity.
    expect(await names('configmaps')).toContain(`${name}.pkgr`);
    // The fetched tree went to S3 (content-addressed).
    expect((await fetchKeys()).filter((key) => !keysBefore.includes(key))).toEqual([
      expect.stringMatching(/\/artifacts\/fetch\/sha256\/[0-9a-f]{64}\.tgz$/),
    ]);
    // A first deploy: every version is new, so the PackageInstalls that may move are told
    // through the install function's queue (`repo.indexed`).
    const sent = sqs.requests.slice(before);
    expect(sent.map((r) => [r.target, r.body?.QueueUrl])).toEqual([
      ['AmazonSQS.SendMessage', `${sqs.url}/000000000000/${INSTALL_QUEUE}`],
    ]);
    const indexed = parseEvent(String(sent[0]?.body?.MessageBody));
    if (!indexed.ok) throw new Error(`the sent body is not a valid event: ${indexed.error}`);
    expect(indexed.event.type).toBe(EVENT_TYPES.repoIndexed);
    expect(indexed.event.data).toMatchObject({
      changes: [{ refName: REF_NAME, versions: expect.arrayContaining(VERSIONS) }],
    });
    // One stage-run line each for the decision and the run (with its tool runs), then the record's.
    const lines = logLines(indexRie).filter((l) => l.messageId === 'repo-1' && l.outcome !== undefined);
    expect(lines.map((l) => [l.msg, l.stage, l.outcome])).toEqual([
      ['stage run', 'reconcile', 'succeeded'],
      ['stage run', 'index-repo', 'succeeded'],
      ['event handled; next stage queued', 'index-repo', 'forwarded'],
    ]);
    expect(lines.every((l) => l.function === 'index-repo')).toBe(true);

    // Deleted: the function's delete (kapp delete of `<name>.pkgr`) removes the packages, then
    // the finalizers, so the repository goes.
    await k(['delete', 'pkgr', name, '-n', ns, '--wait=false']);
    const deleted = repoEvent(name, (await getRepo()).metadata, 'modified');
    expect(await invoke(indexRie, { Records: [sqsRecord('repo-2', serializeEvent(deleted), group)] })).toEqual({
      status: 200,
      body: { batchItemFailures: [] },
    });
    expect(await names('packages.data.packaging.carvel.dev')).toEqual([]);
    expect(await names('packagemetadatas.data.packaging.carvel.dev')).toEqual([]);
    expect(await names('packagerepositories.packaging.carvel.dev')).toEqual([]);
  });
});

describe('a function with an invalid configuration under the emulator', () => {
  it('ends init with one JSON line naming the bad variables, and the invoke fails', async () => {
    const bundles = path.join(tmp, 'bundles');
    const deployBundle = await bundle('deploy', bundles);
    const rie = await startFunction(deployBundle, { AWS_REGION: 'us-east-1' }, tmp);
    started.push(rie);
    // RIE answers a failed init with 502 and an empty body (Lambda: Runtime.ExitError).
    expect(await invoke(rie, { Records: [] })).toEqual({ status: 502, body: '' });
    const fatal = logLines(rie).filter((l) => l.level === 'fatal');
    expect(fatal.length).toBeGreaterThanOrEqual(1);
    // (RIE may run init once more in the invoke phase; every attempt reports the same line.)
    expect(fatal).toEqual(
      fatal.map(() => ({
        level: 'fatal',
        msg: 'function failed',
        error: {
          errorType: 'ConfigError',
          errorMessage:
            'invalid configuration of the deploy function: KAPP_LAMBDA_BUCKET: required; ' +
            'KAPP_LAMBDA_KUBECONFIG: required (path of a kubeconfig file); ' +
            'KAPP_LAMBDA_TOOL_VERSIONS: required (JSON object of tool versions); ' +
            'KAPP_LAMBDA_QUEUE_URL_DEPLOY: required (the deploy function sends to it); ' +
            'KAPP_LAMBDA_QUEUE_URL_FETCH: required (the deploy function sends to it)',
        },
      })),
    );
    // node's default report would quote the failing (minified, megabytes long) source line
    expect(rie.proc.output().length).toBeLessThan(8 * 1024);
  });
});

describe('the sender check under the emulator', () => {
  it('refuses a deploy naming a manifest from the fetch role and from the forwarder, takes what fetch sends', async () => {
    const FETCH_ROLE = 'AROAFETCHFUNCTIONIT01';
    const TEMPLATE_ROLE = 'AROATEMPLATEFUNCTION1';
    const DEPLOY_ROLE = 'AROADEPLOYFUNCTIONIT1';
    const FORWARDER_ROLE = 'AROAFORWARDERROLEIT01';
    const registry = path.join(tmp, 'sender-registry');
    await mkdir(path.join(registry, 'clusters'), { recursive: true });
    await mkdir(path.join(tmp, 'sender-tokens'), { recursive: true });
    // A token the function loads with the document (the API server behind it is not reachable).
    await writeFile(path.join(tmp, 'sender-tokens', 'sender-it-deploy'), 'not-a-real-token', { mode: 0o600 });
    const pem = '-----BEGIN CERTIFICATE-----\nMIIBdzCCAR2gAwIBAgIU\n-----END CERTIFICATE-----\n';
    await writeFile(
      path.join(registry, 'clusters', `${CLUSTER_ID}.json`),
      JSON.stringify({
        apiVersion: 'kapp-lambda/v1',
        kind: 'Cluster',
        id: CLUSTER_ID,
        endpoint: 'https://127.0.0.1:1',
        caData: Buffer.from(pem).toString('base64'),
        auth: { kind: 'token', secrets: { deploy: 'sender-it-deploy' } },
        forwarder: { roleId: FORWARDER_ROLE },
      }),
    );
    const { KAPP_LAMBDA_KUBECONFIG: _, ...env } = functionEnv(await layerBinDir('deploy'), 'deploy');
    const rie = await startFunction(
      await bundle('deploy', path.join(tmp, 'bundles')),
      {
        ...env,
        KAPP_LAMBDA_CLUSTER_REGISTRY: `file://${registry}`,
        KAPP_LAMBDA_CLUSTER_SECRETS: `file://${path.join(tmp, 'sender-tokens')}`,
        KAPP_LAMBDA_SENDER_CHECK: 'registry',
        KAPP_LAMBDA_FUNCTION_SENDERS: `fetch=${FETCH_ROLE},template=${TEMPLATE_ROLE},deploy=${DEPLOY_ROLE}`,
      },
      tmp,
    );
    started.push(rie);
    const time = new Date().toISOString();
    const object = appRef('forged', { uid: 'u-forged', generation: 1, resourceVersion: '1' });
    const run = { generation: 1, runId: 'r-forged', startedAt: time };
    const forged = deployEvent(
      { object, run, artifacts: { manifestKey: `artifacts/template/sha256/${'e'.repeat(64)}.yaml` } },
      { time },
    );
    const inspect = deployEvent({ object, run, artifacts: {}, afterFailure: 'fetch' }, { time });
    const from = (messageId: string, event: typeof forged, senderRole: string) => {
      const r = sqsRecord(messageId, serializeEvent(event), orderingKey(object));
      return { ...r, attributes: { ...r.attributes, SenderId: `${senderRole}:awslambda_it` } };
    };
    const sends = () => sqs.requests.filter((r) => r.target !== 'AmazonSQS.ChangeMessageVisibilityBatch').length;
    const sentBefore = sends();
    const proofsBefore = sqs.requests.length - sentBefore;
    // A direct invoke's record claiming the fetch role: its receipt handle is not the queue's.
    const invented = { ...from('invented-handle', inspect, FETCH_ROLE), receiptHandle: 'made-up-by-the-invoker' };
    const res = await invoke(rie, {
      Records: [
        from('forged-by-fetch', forged, FETCH_ROLE),
        from('forged-by-forwarder', forged, FORWARDER_ROLE),
        from('fetch-inspect', inspect, FETCH_ROLE),
        invented,
      ],
    });
    expect(res.status).toBe(200);
    // Refused records are acknowledged (never valid by redelivery); the taken one runs (its
    // cluster's API server is not reachable here, so it fails and would be retried).
    const failed = (res.body as { batchItemFailures: { itemIdentifier: string }[] }).batchItemFailures;
    expect(failed.map((f) => f.itemIdentifier)).not.toContain('forged-by-fetch');
    expect(failed.map((f) => f.itemIdentifier)).not.toContain('forged-by-forwarder');
    const lines = logLines(rie);
    const refused = (id: string) => lines.filter((l) => l.messageId === id && l.outcome === 'refused');
    expect(refused('forged-by-fetch')).toEqual([
      expect.objectContaining({
        level: 40,
        stage: 'deploy',
        type: 'dev.kapp-lambda.stage.deploy.v1',
        clusterId: CLUSTER_ID,
        senderId: `${FETCH_ROLE}:awslambda_it`,
        reason: `sender ${FETCH_ROLE} is the role of the fetch function, which never sends dev.kapp-lambda.stage.deploy.v1 (deploy)`,
      }),
    ]);
    expect(refused('forged-by-forwarder')).toEqual([
      expect.objectContaining({
        reason: `sender ${FORWARDER_ROLE} is the forwarder of cluster ${CLUSTER_ID}, which never sends dev.kapp-lambda.stage.deploy.v1 (deploy)`,
      }),
    ]);
    expect(refused('fetch-inspect')).toEqual([]);
    expect(lines.some((l) => l.messageId === 'fetch-inspect' && l.outcome !== undefined)).toBe(true);
    expect(failed.map((f) => f.itemIdentifier)).not.toContain('invented-handle');
    expect(refused('invented-handle')).toEqual([
      expect.objectContaining({ reason: "the queue refused the record's receipt handle" }),
    ]);
    // Nothing else of that record ran or was logged (not its handle, body or event).
    expect(lines.filter((l) => l.messageId === 'invented-handle')).toHaveLength(1);
    expect(JSON.stringify(lines)).not.toContain('made-up-by-the-invoker');
    // One proof for the batch, on the function's own queue; nothing sent.
    const proofs = sqs.requests.filter((r) => r.target === 'AmazonSQS.ChangeMessageVisibilityBatch');
    expect(proofs.length - proofsBefore).toBe(1);
    expect(proofs.at(-1)?.body.QueueUrl).toBe(`${sqs.url}/000000000000/${DEPLOY_QUEUE}`);
    expect(sends()).toBe(sentBefore);
  }, 120_000);
});
