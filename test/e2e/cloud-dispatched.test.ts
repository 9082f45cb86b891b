/**
 * The shared mode as it ships (docs/decisions.md D15), on this machine: forwarder → SQS →
 * dispatcher → stage function in tenant isolation, for two clusters.
 *
 * - Per stage of an App's run (fetch, template, deploy), the dispatcher bundle
 *   (`functions/dispatch/index.ts`) under the Lambda Runtime Interface Emulator consumes the
 *   stage's FIFO queue through the event source mapping's stand-in (`../harness/sqs-poller.ts`).
 *   It assumes the stage's run role in moto's STS (the roles are made in moto's IAM; session
 *   name = the cluster id) and invokes the stage function through Lambda's Invoke API with the
 *   cluster as `TenantId`.
 * - That API is `../harness/tenant-router.ts`: one emulator of the stage function bundle per
 *   (function, tenant), started on the tenant's first invoke, as Lambda's tenant isolation mode
 *   does; an invoke without a tenant id is refused as Lambda refuses it.
 * - The stage functions run with `KAPP_LAMBDA_DISPATCHED=true` and no AWS credentials of their own:
 *   their S3 and SQS requests are signed with the run session's credentials each batch brings.
 *   The suite's S3 server (versitygw) would refuse credentials moto's STS issued, so this file's
 *   artifact bucket and cluster registry are in moto's S3, which (without IAM enforcement)
 *   accepts any signed request: what a run session may reach is not shown here but by
 *   `../integration/run-confinement.test.ts`, with IAM enforced.
 * - The dispatchers run the sender check (`KAPP_LAMBDA_SENDER_CHECK=registry`,
 *   `KAPP_LAMBDA_FUNCTION_SENDERS` = the run roles' ids): moto's SQS, through the suite's wrapper
 *   (`../harness/servers/moto_sqs.py`), sets a message's `SenderId` from an STS session's
 *   credentials as SQS does, `<run role id>:<cluster id>` for a stage run's hand-off. Each
 *   cluster's forwarder signs with a session of its own forwarder role (made in moto's IAM, its id
 *   in the cluster's registry document, `--forwarder-role-id`), as the stack's per-cluster role.
 * - Two cluster ids in the registry point at the suite's shared control plane, each served by
 *   a forwarder of its own limited to its namespace (`FORWARDER_NAMESPACES`), as two clusters.
 *   The emulators run without `cloud.test.ts`'s sandbox (host tool directories hidden), one
 *   instance per dispatcher: this file is about the dispatch path, that one about the layers.
 *
 * Asserted: an App of each cluster reaches ReconcileSucceeded; each stage function environment
 * served one cluster only (one per (stage, tenant), no batch refused by its holder); the events
 * a stage run sent carried `SenderId` `<run role id>:<cluster id>` and passed the next
 * dispatcher's check.
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { CreateRoleCommand, IAMClient } from '@aws-sdk/client-iam';
import { ListObjectsV2Command } from '@aws-sdk/client-s3';
import type { SQSClient } from '@aws-sdk/client-sqs';
import { AssumeRoleCommand, STSClient } from '@aws-sdk/client-sts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PIPELINE_STAGES, type PipelineStage, queueUrlEnv } from '../../functions/lib/api/functions.js';
import { DEFAULT_MAX_ATTEMPTS } from '../../functions/lib/pipeline/retry-bound.js';
import {
  DISPATCHER_MEMORY_MIB,
  dispatcherTimeoutSeconds,
  STAGE_SIZING,
  stageTimeoutSeconds,
} from '../../infra/aws/stages.js';
import { bundleEntry, bundleFunctions } from '../../layers/bundle.js';
import { functionLayer, invokeRie, type Rie, rieLogLines, startRie } from '../harness/lambda.js';
import { makeTempDir, removeTempDir, type ServerProcess } from '../harness/servers/process.js';
import { createBucket, type S3Info, s3Client } from '../harness/servers/s3.js';
import { createFifoQueue, sqsClient } from '../harness/servers/sqs.js';
import { EventSourceMapping, type SqsEventRecord } from '../harness/sqs-poller.js';
import { startTenantRouter, type TenantRouter } from '../harness/tenant-router.js';
import {
  type CloudFleet,
  createRootKeySecret,
  keyCluster,
  registerCluster,
  registryUrl,
  stageFunctionEnv,
  startForwarder,
} from './cloud-support.js';
import {
  type AppObject,
  expectSucceededStatus,
  inlineConfigMapApp,
  STATUS_KEYS,
  servers,
  shared,
  kubeconfigPath as sharedKubeconfigPath,
  succeededAt,
  waitFor,
} from './support.js';

const id = randomBytes(3).toString('hex');
/** The stages an App's run passes through: each has a dispatcher and a stage function here. */
const STAGES = ['fetch', 'template', 'deploy'] as const satisfies readonly PipelineStage[];
type Stage = (typeof STAGES)[number];
/** The two cluster ids (two registry documents, one control plane), each with its namespace. */
const CLUSTERS = [`disp-a-${id}`, `disp-b-${id}`] as const;
/** The queues' visibility timeout here, seconds (see `sqs-poller.ts`). */
const VISIBILITY_SECONDS = 5;
/** moto's default account, where its IAM makes the roles. */
const ACCOUNT = '123456789012';
const stageFunctionName = (stage: Stage) => `kapp-lambda-${id}-${stage}`;

interface Dispatcher {
  stage: Stage;
  rie: Rie;
  mapping: EventSourceMapping;
  /** Every record the mapping handed the dispatcher, as received (with `SenderId`). */
  records: SqsEventRecord[];
}

let tmp: string;
let fleet: CloudFleet;
let sqs: SQSClient;
let router: TenantRouter | undefined;
const dispatchers: Dispatcher[] = [];
const forwarders: ServerProcess[] = [];
/** Each cluster's event key (base64), in its registry document and its forwarder's environment. */
const eventKeys = new Map<string, string>();
/** Each cluster's forwarder role id and the credentials of a session of it, which its forwarder signs with. */
const forwarderRoles = new Map<
  string,
  { id: string; credentials: { accessKeyId: string; secretAccessKey: string; sessionToken: string } }
>();
/** Each stage's run role id (`AROA…`), which SQS names as the sender of what its runs send. */
const runRoleIds = new Map<Stage, string>();

/** Creates IAM role `name` in moto, trusted by the account; its ARN and id. */
async function createRole(iam: IAMClient, name: string): Promise<{ arn: string; id: string }> {
  const trust = {
    Version: '2012-10-17',
    Statement: [{ Effect: 'Allow', Principal: { AWS: `arn:aws:iam::${ACCOUNT}:root` }, Action: 'sts:AssumeRole' }],
  };
  const r = await iam.send(
    new CreateRoleCommand({
      RoleName: name,
      AssumeRolePolicyDocument: JSON.stringify(trust),
      MaxSessionDuration: 3600,
    }),
  );
  if (!r.Role?.Arn || !r.Role.RoleId) throw new Error(`create role ${name}: no ARN or id in the answer`);
  return { arn: r.Role.Arn, id: r.Role.RoleId };
}

beforeAll(async () => {
  tmp = await makeTempDir('cloud-dispatched');
  const moto = servers().sqs;
  sqs = sqsClient(moto);
  const bucket = `kapp-disp-${id}`;
  const motoS3: S3Info = { ...moto, bucket, dir: tmp };
  await createBucket(motoS3, bucket);
  fleet = { tmp, s3: motoS3, bucket, registryPrefix: 'registry/', moto };
  const bundles = path.join(tmp, 'bundles');
  const [dirs] = await Promise.all([
    bundleFunctions([...STAGES, 'dispatch'], bundles),
    bundleEntry(
      fileURLToPath(new URL('../../events/forwarder/main.ts', import.meta.url)),
      path.join(bundles, 'forwarder.mjs'),
    ),
  ]);
  // Every stage's queue (a stage function's configuration names them all); only the three an
  // App's run passes have a dispatcher.
  const queues = Object.fromEntries(
    await Promise.all(
      PIPELINE_STAGES.map(async (stage) => {
        const dlq = await createFifoQueue(moto, `${id}-${stage}-dlq`);
        const q = await createFifoQueue(moto, `${id}-${stage}`, {
          visibilityTimeoutSeconds: VISIBILITY_SECONDS,
          deadLetter: { arn: dlq.arn, maxReceiveCount: DEFAULT_MAX_ATTEMPTS },
        });
        return [stage, q] as const;
      }),
    ),
  ) as Record<PipelineStage, { url: string; arn: string }>;
  const queueUrls = Object.fromEntries(PIPELINE_STAGES.map((st) => [queueUrlEnv(st), queues[st].url]));
  const rootKeySecretArn = await createRootKeySecret(moto, `kapp-disp-${id}/artifact-root-key`);
  const iam = new IAMClient({
    endpoint: moto.endpoint,
    region: moto.region,
    credentials: { accessKeyId: moto.accessKeyId, secretAccessKey: moto.secretAccessKey },
  });
  const sts = new STSClient({
    endpoint: moto.endpoint,
    region: moto.region,
    credentials: { accessKeyId: moto.accessKeyId, secretAccessKey: moto.secretAccessKey },
  });
  const runRoles = new Map<Stage, string>();
  const receiverRoleIds = new Map<Stage, string>();
  try {
    for (const stage of STAGES) {
      const run = await createRole(iam, `kapp-disp-${id}-${stage}-run`);
      runRoles.set(stage, run.arn);
      runRoleIds.set(stage, run.id);
      receiverRoleIds.set(stage, (await createRole(iam, `kapp-disp-${id}-${stage}-dispatcher`)).id);
    }
    // Each cluster's forwarder role (the stack's ForwarderRoleId<Id>), as a session of it.
    for (const cluster of CLUSTERS) {
      const role = await createRole(iam, `kapp-disp-${id}-forwarder-${cluster}`);
      const session = (
        await sts.send(
          new AssumeRoleCommand({ RoleArn: role.arn, RoleSessionName: 'forwarder', DurationSeconds: 3600 }),
        )
      ).Credentials;
      if (!session?.AccessKeyId || !session.SecretAccessKey || !session.SessionToken) {
        throw new Error(`assume the forwarder role of ${cluster}: no credentials`);
      }
      forwarderRoles.set(cluster, {
        id: role.id,
        credentials: {
          accessKeyId: session.AccessKeyId,
          secretAccessKey: session.SecretAccessKey,
          sessionToken: session.SessionToken,
        },
      });
    }
  } finally {
    iam.destroy();
    sts.destroy();
  }
  await shared.applyCrds();
  for (const cluster of CLUSTERS) {
    const role = forwarderRoles.get(cluster) as { id: string };
    await registerCluster(fleet, shared, sharedKubeconfigPath, cluster, ['--forwarder-role-id', role.id]);
    // As join does: the cluster's event key, which keys its message groups and deduplication ids.
    eventKeys.set(cluster, await keyCluster(fleet, cluster));
  }

  // The stage functions, behind the tenant router: no credentials of their own, no root key.
  const functions = new Map(
    await Promise.all(
      STAGES.map(async (stage) => {
        const layer = await functionLayer(tmp, stage);
        return [
          stageFunctionName(stage),
          {
            bundle: path.join(dirs[stage], 'index.mjs'),
            env: {
              ...stageFunctionEnv(fleet, stage, layer, { bucketPrefix: '', queueUrls, dispatched: true }),
              KAPP_LAMBDA_DISPATCHED: 'true',
              // The shared stack's default (context `sharing`): claims in each cluster's domain.
              KAPP_LAMBDA_SHARING: 'cluster',
            },
            cwd: path.join(tmp, 'fn', stage),
            timeoutSeconds: stageTimeoutSeconds(stage, true),
            memoryMiB: STAGE_SIZING[stage].memoryMiB,
          },
        ] as const;
      }),
    ),
  );
  router = await startTenantRouter(functions, (name, tenant) => {
    // Each environment its own /tmp, as on Lambda.
    const dir = path.join(tmp, 'scratch', name, tenant);
    mkdirSync(dir, { recursive: true });
    return { KAPP_LAMBDA_TMP_DIR: dir };
  });
  const senders = STAGES.map((st) => `${st}=${runRoleIds.get(st)}`).join(',');
  for (const stage of STAGES) {
    const cwd = path.join(tmp, 'dispatch', stage);
    await mkdir(cwd, { recursive: true });
    const rie = await startRie({
      bundle: path.join(dirs.dispatch, 'index.mjs'),
      cwd,
      timeoutSeconds: dispatcherTimeoutSeconds(stage),
      memoryMiB: DISPATCHER_MEMORY_MIB,
      env: {
        AWS_REGION: moto.region,
        AWS_ACCESS_KEY_ID: moto.accessKeyId,
        AWS_SECRET_ACCESS_KEY: moto.secretAccessKey,
        AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true',
        KAPP_LAMBDA_DISPATCH_STAGE: stage,
        KAPP_LAMBDA_RUN_ROLE_ARN: runRoles.get(stage) ?? '',
        KAPP_LAMBDA_STAGE_FUNCTION: stageFunctionName(stage),
        KAPP_LAMBDA_STS_ENDPOINT: moto.endpoint,
        KAPP_LAMBDA_LAMBDA_ENDPOINT: router.endpoint,
        KAPP_LAMBDA_BUCKET: bucket,
        KAPP_LAMBDA_S3_ENDPOINT: moto.endpoint,
        KAPP_LAMBDA_SQS_ENDPOINT: moto.endpoint,
        KAPP_LAMBDA_SECRETSMANAGER_ENDPOINT: moto.endpoint,
        [queueUrlEnv(stage)]: queues[stage].url,
        KAPP_LAMBDA_CLUSTER_REGISTRY: registryUrl(fleet),
        KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET: rootKeySecretArn,
        KAPP_LAMBDA_MAX_RECEIVE_COUNT: String(DEFAULT_MAX_ATTEMPTS),
        KAPP_LAMBDA_SENDER_CHECK: 'registry',
        KAPP_LAMBDA_FUNCTION_SENDERS: senders,
        KAPP_LAMBDA_RECEIVER_ROLE_ID: receiverRoleIds.get(stage) ?? '',
        KAPP_LAMBDA_SHARING: 'cluster',
      },
    });
    const records: SqsEventRecord[] = [];
    const mapping = new EventSourceMapping({
      name: `${stage} dispatcher`,
      client: sqs,
      queueUrl: queues[stage].url,
      queueArn: queues[stage].arn,
      region: moto.region,
      batchSize: STAGE_SIZING[stage].batchSize,
      visibilityTimeoutSeconds: VISIBILITY_SECONDS,
      invoke: async (event) => {
        records.push(...event.Records);
        return await invokeRie(rie, event);
      },
    });
    mapping.start();
    dispatchers.push({ stage, rie, mapping, records });
  }
  for (const cluster of CLUSTERS) {
    forwarders.push(
      await startForwarder(
        fleet,
        `forwarder-${cluster}`,
        sharedKubeconfigPath,
        {
          FORWARDER_KINDS: 'App',
          FORWARDER_CLUSTER_ID: cluster,
          FORWARDER_NAMESPACES: cluster,
          KAPP_LAMBDA_QUEUE_URL_FETCH: queues.fetch.url,
          FORWARDER_EVENT_KEY: eventKeys.get(cluster) as string,
        },
        forwarderRoles.get(cluster)?.credentials,
      ),
    );
  }
}, 180_000);

afterAll(async () => {
  await Promise.all(forwarders.map((f) => f.stop()));
  await Promise.all(dispatchers.map((d) => d.mapping.stop()));
  await Promise.all(dispatchers.map((d) => d.rie.proc.stop()));
  await router?.stop();
  sqs?.destroy();
  // The Apps' finalizers, which no function is left to remove, then their namespaces.
  for (const ns of CLUSTERS) {
    await shared.k(
      ['-n', ns, 'patch', 'app', `app-${ns}`, '--type=merge', '-p', '{"metadata":{"finalizers":null}}'],
      undefined,
      false,
    );
  }
  await shared.deleteNamespaces([...CLUSTERS]);
  if (tmp) await removeTempDir(tmp);
});

describe('the shared mode: forwarder → SQS → dispatcher → stage function per tenant, under the emulators', () => {
  it('reconciles an App of each of two clusters, each cluster in stage environments of its own, the hand-offs sent as its run session', {
    timeout: 120_000,
  }, async () => {
    await Promise.all(CLUSTERS.map((ns) => shared.createTenant(ns)));
    await shared.apply(...CLUSTERS.map((ns) => inlineConfigMapApp(ns, `app-${ns}`, `hello ${ns}`)));
    const apps = await Promise.all(
      CLUSTERS.map(async (ns) => {
        let last: AppObject | undefined;
        return await waitFor(
          `App ${ns}/app-${ns}`,
          async () => {
            last = await shared.getApp(ns, `app-${ns}`);
            return last && succeededAt(1)(last) ? last : undefined;
          },
          {
            timeoutMs: 90_000,
            intervalMs: 500,
            describe: () =>
              `${JSON.stringify(last?.status ?? null, null, 1)}\n${dispatchers
                .map((d) => `${d.stage}: ${String(d.mapping.error ?? '')} ${d.rie.proc.output().slice(-1500)}`)
                .join('\n')}`,
          },
        );
      }),
    );
    for (const app of apps) expectSucceededStatus(app, STATUS_KEYS);
    for (const ns of CLUSTERS) {
      const cm = await shared.getObject<{ data?: Record<string, string> }>('configmap', ns, `app-${ns}-config`);
      expect(cm?.data).toEqual({ greeting: `hello ${ns}` });
    }

    // One environment per (stage function, cluster), each started for its tenant only.
    const r = router as TenantRouter;
    expect(r.environments.map((e) => `${e.functionName} ${e.tenantId}`).sort()).toEqual(
      STAGES.flatMap((st) => CLUSTERS.map((c) => `${stageFunctionName(st)} ${c}`)).sort(),
    );
    // Every invoke named its tenant and ran; no holder refused a batch (a batch of another cluster).
    expect(r.invokes.filter((i) => i.tenantId === undefined || i.status !== 200 || i.functionError)).toEqual([]);
    for (const e of r.environments) {
      const refused = rieLogLines(e.rie).filter((l) => l.outcome === 'refused');
      expect(refused, `${e.functionName} ${e.tenantId}`).toEqual([]);
    }

    // The hand-offs (fetch → template → deploy) were sent as the sending stage's run session of
    // the App's cluster, and the receiving dispatcher's sender check took them.
    const previous: Record<Exclude<Stage, 'fetch'>, Stage> = { template: 'fetch', deploy: 'template' };
    for (const d of dispatchers) {
      // Every sender (forwarder and run sessions) keyed the groups under the cluster's event key.
      const unkeyed = d.records.filter(
        (rec) => !/^[a-z0-9-]+\/[0-9a-f]{64}$/.test(rec.attributes.MessageGroupId ?? ''),
      );
      expect(unkeyed.map((rec) => rec.attributes.MessageGroupId)).toEqual([]);
      if (d.stage === 'fetch') {
        // The fetch queue's events: the cluster's forwarder (a session of its own role), and the
        // run's follow-ups (a stage's run session of that cluster); the first came from the forwarder.
        for (const cluster of CLUSTERS) {
          const senders = d.records
            .filter((rec) => rec.attributes.MessageGroupId?.startsWith(`${cluster}/`))
            .map((rec) => rec.attributes.SenderId);
          expect(senders[0], `the first fetch record of ${cluster}`).toBe(
            `${forwarderRoles.get(cluster)?.id}:forwarder`,
          );
          const runs = STAGES.map((st) => `${runRoleIds.get(st)}:${cluster}`);
          expect(senders.filter((id) => id !== senders[0] && !runs.includes(id ?? ''))).toEqual([]);
        }
        continue;
      }
      const from = previous[d.stage];
      for (const cluster of CLUSTERS) {
        const mine = d.records.filter((rec) => rec.attributes.MessageGroupId?.startsWith(`${cluster}/`));
        expect(mine.length, `${d.stage} records of ${cluster}`).toBeGreaterThan(0);
        expect(new Set(mine.map((rec) => rec.attributes.SenderId))).toEqual(
          new Set([`${runRoleIds.get(from)}:${cluster}`]),
        );
      }
      expect(
        rieLogLines(d.rie).filter((l) => l.outcome === 'refused'),
        `${d.stage} dispatcher`,
      ).toEqual([]);
      expect(d.mapping.invocations.filter((i) => i.outcome !== 'ok' || i.failed.length > 0)).toEqual([]);
    }
    // Cluster sharing (docs/decisions.md D17): the runs' claims (the render cache records, the
    // in-flight markers) are under each cluster's domain `d/<tag>/`, two domains for two clusters,
    // and none under the fleet's `cache/` or `inflight/`; the content-addressed manifests are shared.
    const keys: string[] = [];
    const listed = s3Client(fleet.s3);
    for (let token: string | undefined; ; ) {
      const page = await listed.send(
        new ListObjectsV2Command({ Bucket: fleet.bucket, ...(token ? { ContinuationToken: token } : {}) }),
      );
      keys.push(...(page.Contents ?? []).map((o) => o.Key ?? ''));
      token = page.NextContinuationToken;
      if (!token) break;
    }
    listed.destroy();
    const domains = new Set(
      keys.filter((k) => /^d\/[0-9a-f]{32}\/cache\/render\//.test(k)).map((k) => k.split('/')[1]),
    );
    expect(domains.size, keys.join('\n')).toBe(CLUSTERS.length);
    expect(keys.filter((k) => k.startsWith('cache/') || k.startsWith('inflight/'))).toEqual([]);
    expect(keys.some((k) => k.startsWith('artifacts/template/sha256/'))).toBe(true);
    // A stage function refuses an invoke without a tenant, as Lambda does for a tenant-isolated function.
    const untenanted = await fetch(`${r.endpoint}/2015-03-31/functions/${stageFunctionName('fetch')}/invocations`, {
      method: 'POST',
      body: '{}',
    });
    expect([untenanted.status, untenanted.headers.get('x-amzn-errortype')]).toEqual([
      400,
      'InvalidParameterValueException',
    ]);
  });
});
