/**
 * The whole flow in cloud mode, on this machine (issue 11, item 5): the forwarder as its own
 * process (the bundle of `events/forwarder/main.ts`) sends to SQS FIFO queues of moto's server,
 * each function runs as its bundled handler under the Lambda Runtime Interface Emulator with
 * only its own layer's tools (the host's tool directories hidden, `../harness/lambda.ts`), a
 * poller per queue stands in for the event source mapping (`../harness/sqs-poller.ts`: batch
 * size of `STAGE_SIZING`, partial batch failures; the queues' redrive policy dead-letters after
 * `DEFAULT_MAX_ATTEMPTS` receives, as deployed), and the artifacts go to the S3 server
 * (versitygw). The control plane is this file's own kwok cluster: the demo's examples have
 * fixed namespaces and metrics-server's cluster-wide objects, which must not meet the other
 * files' (package-install.test.ts installs metrics-server too).
 *
 * The functions reach that cluster as a fleet's do (issue 11 item 4): through the cluster
 * registry in S3 (`s3://<bucket>/<prefix>registry/`, where the CDK stack puts it), the cluster
 * registered by `npm run cluster -- add --auth token` (the CLI as a process), the RBAC it prints
 * (`infra/rbac/`) applied, and each function holding only its own stage's ServiceAccount token
 * (a TokenRequest) in a secret directory of its own. The artifact root key is a secret in
 * moto's Secrets Manager, named by ARN in the functions' variables and read at cold start, as the
 * stack deploys it. No function has a kubeconfig in its environment, and the control planes' admin kubeconfigs and the other functions' tokens are
 * hidden from its sandbox: every status below is written with the stage's least RBAC.
 *
 * The forwarder acts as the identity the project ships for it: a token of the ServiceAccount of
 * `infra/forwarder/rbac.yml` (read-only ClusterRole, a Role on its Lease), not the admin kubeconfig.
 *
 * The sender check (item 6d) stays off, and the cluster is registered without a forwarder role
 * (`--no-sender-check`): the forwarders here sign with moto's static keys, for which moto 5.2.1
 * gives every message the same `SenderId` (its constant `AIDAIT2UOQQY3AUEKVGXU`), so a forwarder
 * and a stranger cannot be told apart. (The suite's wrapper sets it from an STS session's
 * credentials, `moto_sqs.py`: `cloud-dispatched.test.ts` runs the check with role sessions.)
 *
 * - every App of `npm run demo`, its PackageRepository and its PackageInstall reach the status
 *   the embedded e2e checks (`expectSucceededStatus`, `expectRepoSucceeded`); the git App's source
 *   through the git the fetch layer ships (`layers/git.ts`), with the host's git hidden;
 * - a second control plane joins the fleet with `npm run cluster -- join --auth token` (the CLI as
 *   a process: the release, the functions' RBAC and the fleet ConfigMap applied, the document
 *   written), its functions' tokens stored as join prints, and a second forwarder run as the
 *   release's ServiceAccount with its ConfigMaps' settings: an App there is reconciled by the same
 *   functions and deployed in that cluster only;
 * - a deploy function killed while its kapp runs: the record comes back after the visibility
 *   timeout and the App converges;
 * - a poison message (an event naming a cluster the functions do not serve): failed on every
 *   receive, logged with the reason, and moved to the dead-letter queue by the redrive policy;
 * - a record whose stage fails on every receive for a cause in the cluster (an admission policy
 *   refusing the App's status writes unless they report a failure): on its last allowed receive
 *   the function writes `ReconcileFailed` with the cause, and the record still ends in the
 *   dead-letter queue (`retry-bound.ts`: status for the App's owner, the queue for the operator);
 * - fair shares (issue 27): every function runs with a share per cluster and namespace one
 *   below its instances (`KAPP_LAMBDA_CLUSTER_SHARE`, `_NAMESPACE_SHARE`: fetch and deploy 2 of 3,
 *   template and index-repo 1 of 2, install 1 of 1), a 5 s fetch stall window and a 5 s maximum
 *   deploy wait. Once the other tests are done, cluster A (this
 *   file's) gets ten Apps fetching over http from a tarpit (a byte a second), ten whose Deployment is
 *   never available (their `--wait-timeout` longer than the fleet's maximum) and five PackageRepositories
 *   on the tarpit; an App of the joined cluster B reaches `ReconcileSucceeded`, its fetch started
 *   before most of A's tarpit fetches (B does not wait behind them; with the shares off all ten
 *   started before it, and B's App took 54 s instead of 2), and each of A's then ends `ReconcileFailed` with
 *   the stall rule's note or the fleet wait cut's, and is deleted (finalizers removed). B's App's
 *   time on the idle fleet and beside the load are printed, not asserted.
 *
 * It prints each function's bundle and layer size, and the cold-start and warm invoke times
 * under the emulator (an empty batch: the runtime's own cost), and the median record time of
 * each stage in this run.
 */

import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { mkdir, readFile, stat, writeFile } from 'node:fs/promises';
import { createServer } from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { ListObjectsV2Command } from '@aws-sdk/client-s3';
import { type Message, ReceiveMessageCommand, SendMessageCommand, type SQSClient } from '@aws-sdk/client-sqs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { objectEvent, serializeEvent } from '../../events/schema.js';
import { PIPELINE_STAGES, type PipelineStage, queueUrlEnv } from '../../functions/lib/api/functions.js';
import { fleetWaitCutNote } from '../../functions/lib/deploy/kapp.js';
import { DEFAULT_FETCH_STALL_MIN_BYTES, stallNote } from '../../functions/lib/fetch/stall.js';
import { clusterDocKey } from '../../functions/lib/kube/cluster-doc.js';
import { DEFAULT_MAX_ATTEMPTS } from '../../functions/lib/pipeline/retry-bound.js';
import { messageGroupId } from '../../functions/lib/transport/sqs.js';
import { FORWARDER_SERVICE_ACCOUNT, STAGE_SIZING } from '../../infra/aws/stages.js';
import { bundleEntry, bundleFunctions } from '../../layers/bundle.js';
import { cacheRoot } from '../../layers/gobuild.js';
import { stageServiceAccount } from '../../scripts/cluster-registry.js';
import { publishExamples } from '../../scripts/demo-examples.js';
import { APP_EXAMPLES, EXAMPLES, INSTALL_EXAMPLE, renderExample } from '../../scripts/local-env.js';
import { FORWARDER_EVENT_KEY_SECRET, FORWARDER_FLEET_CONFIGMAP, RELEASE_NAMESPACE } from '../../scripts/release.js';
import { type Cluster, startCluster } from '../harness/cluster.js';
import { kubectl, loadKubeConfig, writeTokenKubeconfig } from '../harness/kube.js';
import {
  type FunctionLayer,
  functionLayer,
  invokeRie,
  type Rie,
  rieLogLines,
  runtimePidOf,
  startRieInstances,
} from '../harness/lambda.js';
import { LOOPBACK, makeTempDir, removeTempDir, type ServerProcess } from '../harness/servers/process.js';
import { s3Client } from '../harness/servers/s3.js';
import { createFifoQueue, sqsClient } from '../harness/servers/sqs.js';
import { EventSourceMapping, type SqsEventRecord } from '../harness/sqs-poller.js';
import {
  type CloudFleet,
  clusterCli,
  createRootKeySecret,
  IDENTITY_NAMESPACE,
  registerCluster as registerFleetCluster,
  registryUrl,
  secretsDir as sharedSecretsDir,
  stageFunctionEnv,
  startForwarder as startFleetForwarder,
  storeStageTokens,
} from './cloud-support.js';
import { kappProcesses, slowApp } from './faults-support.js';
import { expectRepoSucceeded, type RepoObject, repositoryManifest } from './packaging-support.js';
import {
  type AppObject,
  appManifest,
  type E2ECluster,
  e2eCluster,
  expectSucceededStatus,
  failedAt,
  inlineConfigMapApp,
  kappConditions,
  STATUS_KEYS,
  servers,
  kubeconfigPath as sharedKubeconfigPath,
  succeededAt,
  waitFor,
} from './support.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const id = randomBytes(3).toString('hex');
/** The queues' visibility timeout here, seconds (see `sqs-poller.ts` for why not the deployed one). */
const VISIBILITY_SECONDS = 5;
const PREFIX = `cloud-${id}/`;
/** The fleet's cluster registry: in the artifact bucket under `registry/`, the CDK stack's default. */
const REGISTRY_PREFIX = `${PREFIX}registry/`;
/**
 * Instances of each function, and the poller's `maxConcurrency` (one batch per instance): with a
 * share one below the instances per cluster ({@link CLUSTER_SHARE}), a second cluster always finds a slot.
 */
const INSTANCES: Readonly<Record<PipelineStage, number>> = {
  fetch: 3,
  template: 2,
  deploy: 3,
  'index-repo': 2,
  install: 1,
};
/**
 * Fair shares of each function (`KAPP_LAMBDA_CLUSTER_SHARE`, and `_NAMESPACE_SHARE` the same):
 * one slot fewer than its instances, so another cluster always finds one; two where cluster A's
 * load queues longest (fetch and deploy), so it ends sooner.
 */
const CLUSTER_SHARE: Readonly<Record<PipelineStage, number>> = {
  fetch: 2,
  template: 1,
  deploy: 2,
  'index-repo': 1,
  install: 1,
};
/** The fetch's stall window here, seconds (`KAPP_LAMBDA_FETCH_STALL_SECONDS`; 60 deployed). */
const STALL_SECONDS = 5;
/** The fleet's maximum deploy wait here, seconds (`KAPP_LAMBDA_MAX_DEPLOY_WAIT_SECONDS`; an hour deployed). */
const MAX_DEPLOY_WAIT_SECONDS = 5;

interface StageHost {
  stage: PipelineStage;
  bundle: string;
  bundleBytes: number;
  layer: FunctionLayer;
  /** Its instances (execution environments), `INSTANCES[stage]` of them; the figures' cold and warm are the first's. */
  ries: Rie[];
  queue: { url: string; arn: string };
  dlq: { url: string; arn: string };
  mapping: EventSourceMapping;
  coldMs: number;
  warmMs: number[];
}

let tmp: string;
let fleet: CloudFleet;
let cluster: Cluster;
let kube: E2ECluster;
let clusterId: string;
let sqs: SQSClient;
let forwarder: ServerProcess | undefined;
/** The second control plane, which joins the fleet with `npm run cluster -- join`, and its forwarder. */
let joining: Cluster;
let joiningForwarder: ServerProcess | undefined;
/** The second control plane as the tests use it once it joined (cluster B of the fair-share test). */
let joinedCluster: E2ECluster | undefined;

/**
 * The tests the fair-share test waits for, by name, each settled when it ends: the join (its
 * cluster B), and those whose records are on cluster A, which the fair-share test fills past its
 * share. Their records would be parked behind that load (slowing the demo a lot), and the crash and
 * refusal tests follow their records by id. Only the tests that run are here (`-t` may leave some
 * out); the fair-share test is the file's last, so it starts after them.
 */
const running = new Map<string, Promise<void>>();
/** Adds the calling test to {@link running}, settled by `onTestFinished`. */
function tracked(name: string, onTestFinished: (fn: () => void) => void): void {
  running.set(
    name,
    new Promise<void>((resolve) => {
      onTestFinished(resolve);
    }),
  );
}
/** The forwarder's kubeconfig: a token of its own ServiceAccount ({@link forwarderIdentity}), nothing more. */
let forwarderKubeconfig: string;
/** `system:serviceaccount:<namespace>:<name>` of the forwarder's ServiceAccount in `infra/forwarder/rbac.yml`. */
let forwarderUser: string;
/** The artifact root key's secret in moto's Secrets Manager (the stack's `ArtifactRootKey`). */
let rootKeySecretArn: string;
const hosts = new Map<PipelineStage, StageHost>();
const host = (stage: PipelineStage): StageHost => {
  const h = hosts.get(stage);
  if (!h) throw new Error(`no function for ${stage}`);
  return h;
};

/** A function's secret directory: only its own stage's token (as its IAM role reads only its own secrets). */
const secretsDir = (stage: PipelineStage) => sharedSecretsDir(fleet, stage);

/** Registers the test's cluster (`registerCluster`); the functions here run without the sender check (see the module comment). */
const registerCluster = () =>
  registerFleetCluster(fleet, kube, cluster.kubeconfigPath, clusterId, ['--no-sender-check']);

/**
 * The forwarder's identity as a cluster gives it: the objects of `infra/forwarder/rbac.yml` (its
 * ServiceAccount, the read-only ClusterRole and binding, the Role on its Lease) applied as they
 * ship, and a kubeconfig holding only a token of that ServiceAccount (what the Deployment's Pod
 * would mount), so the forwarder watches and leads with exactly what the manifests grant.
 */
async function forwarderIdentity(): Promise<void> {
  const docs = parseAllDocuments(await readFile(path.join(ROOT, 'infra/forwarder/rbac.yml'), 'utf8')).map(
    (d) => d.toJS() as { kind: string; metadata: { name: string; namespace: string } },
  );
  await kube.apply(...docs);
  const sa = docs.find((d) => d.kind === 'ServiceAccount');
  if (!sa) throw new Error('infra/forwarder/rbac.yml has no ServiceAccount');
  forwarderUser = `system:serviceaccount:${sa.metadata.namespace}:${sa.metadata.name}`;
  forwarderKubeconfig = await serviceAccountKubeconfig(
    kube,
    cluster.kubeconfigPath,
    sa.metadata,
    path.join(tmp, 'forwarder.kubeconfig'),
  );
}

/**
 * A kubeconfig at `out` holding only a token of ServiceAccount `sa` of the cluster of
 * `adminKubeconfig` (what a Pod running as it would mount).
 */
async function serviceAccountKubeconfig(
  on: E2ECluster,
  adminKubeconfig: string,
  sa: { namespace: string; name: string },
  out: string,
): Promise<string> {
  const token = (await on.k(['-n', sa.namespace, 'create', 'token', sa.name, '--duration=2h'])).stdout.trim();
  return await writeTokenKubeconfig(adminKubeconfig, token, out);
}

const startForwarder = (name: string, kubeconfig: string, settings: Record<string, string>) =>
  startFleetForwarder(fleet, name, kubeconfig, settings);

/** Who may write each status: the stage functions that own it (`infra/rbac/`). */
const STATUS_WRITERS: Readonly<Record<string, readonly PipelineStage[]>> = {
  'kappctrl.k14s.io/apps/status': ['fetch', 'template', 'deploy'],
  'packaging.carvel.dev/packagerepositories/status': ['index-repo'],
  'packaging.carvel.dev/packageinstalls/status': ['install'],
};

/**
 * A ValidatingAdmissionPolicy and its binding denying the status `UPDATE`s of `resources`
 * (`<group>/<resource>/status`, any version) that fail one of `validations` (CEL).
 */
function statusPolicy(
  name: string,
  resources: readonly string[],
  validations: readonly { expression: string; message: string }[],
): object[] {
  const resourceRules = resources.map((key) => {
    const [group, resource, sub] = key.split('/');
    return { apiGroups: [group], apiVersions: ['*'], operations: ['UPDATE'], resources: [`${resource}/${sub}`] };
  });
  return [
    {
      apiVersion: 'admissionregistration.k8s.io/v1',
      kind: 'ValidatingAdmissionPolicy',
      metadata: { name },
      spec: { failurePolicy: 'Fail', matchConstraints: { resourceRules }, validations },
    },
    {
      apiVersion: 'admissionregistration.k8s.io/v1',
      kind: 'ValidatingAdmissionPolicyBinding',
      metadata: { name },
      spec: { policyName: name, validationActions: ['Deny'] },
    },
  ];
}

/**
 * The policy refusing every status write not made by the stage identity that owns it
 * ({@link STATUS_WRITERS}): a function acting with any other credential (an admin kubeconfig,
 * another stage's token) would leave its object without the status the tests wait for.
 */
function statusWriterPolicy(): object[] {
  const user = (stage: PipelineStage) => `system:serviceaccount:${IDENTITY_NAMESPACE}:${stageServiceAccount(stage)}`;
  return statusPolicy(
    'kapp-lambda-status-writers',
    Object.keys(STATUS_WRITERS),
    Object.entries(STATUS_WRITERS).map(([key, stages]) => {
      const [group, resource] = key.split('/');
      return {
        expression: `request.resource.group != '${group}' || request.resource.resource != '${resource}' || request.userInfo.username in ${JSON.stringify(stages.map(user))}`,
        message: `${key} is written only by the ${stages.join(', ')} functions' identities`,
      };
    }),
  );
}

function functionEnv(stage: PipelineStage, layer: FunctionLayer): Record<string, string> {
  const s = servers();
  const queueUrls = Object.fromEntries([...hosts.values()].map((h) => [queueUrlEnv(h.stage), h.queue.url]));
  return {
    ...stageFunctionEnv(fleet, stage, layer, { bucketPrefix: PREFIX, queueUrls }),
    AWS_ACCESS_KEY_ID: s.s3.accessKeyId,
    AWS_SECRET_ACCESS_KEY: s.s3.secretAccessKey,
    // The root key by its secret's ARN, read from Secrets Manager (moto) as on AWS.
    KAPP_LAMBDA_SECRETSMANAGER_ENDPOINT: s.sqs.endpoint,
    KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET: rootKeySecretArn,
    // Issue 27's limits, shortened so that the noisy neighbour's objects end within the test.
    KAPP_LAMBDA_CLUSTER_SHARE: String(CLUSTER_SHARE[stage]),
    KAPP_LAMBDA_NAMESPACE_SHARE: String(CLUSTER_SHARE[stage]),
    KAPP_LAMBDA_FETCH_STALL_SECONDS: String(STALL_SECONDS),
    KAPP_LAMBDA_MAX_DEPLOY_WAIT_SECONDS: String(MAX_DEPLOY_WAIT_SECONDS),
  };
}

const getApp = (ns: string, name: string) => kube.getApp(ns, name);

async function waitApp(ns: string, name: string, pred: (a: AppObject) => boolean, timeoutMs = 150_000) {
  let last: AppObject | undefined;
  return await waitFor(
    `App ${ns}/${name}`,
    async () => {
      last = await getApp(ns, name);
      return last && pred(last) ? last : undefined;
    },
    { timeoutMs, intervalMs: 1000, describe: () => JSON.stringify(last?.status ?? null, null, 1) },
  );
}

const final = (o: { metadata: { generation?: number }; status?: AppObject['status'] }) =>
  o.status?.observedGeneration === o.metadata.generation &&
  (o.status?.conditions?.some((c) => c.type === 'ReconcileSucceeded' || c.type === 'ReconcileFailed') ?? false);

/** The Apps of the demo's examples (the other tests' Apps are in namespaces `cloud-…`). */
async function demoApps(): Promise<AppObject[]> {
  const all = (JSON.parse((await kube.k(['get', 'apps', '-A', '-o', 'json'])).stdout) as { items: AppObject[] }).items;
  return all.filter((a) => !a.metadata.namespace.startsWith('cloud-'));
}

beforeAll(async () => {
  tmp = await makeTempDir('cloud-e2e');
  const s = servers();
  fleet = { tmp, s3: s.s3, bucket: s.s3.bucket ?? 'kapp-lambda', registryPrefix: REGISTRY_PREFIX, moto: s.sqs };
  sqs = sqsClient(s.sqs);
  const startedCluster = startCluster({ log: (m) => process.stderr.write(`[cloud] ${m}\n`) });
  // The second control plane, which joins the fleet in its test: started beside the first, so
  // its admin kubeconfig can be hidden from the functions as the first one's is.
  const startedJoining = startCluster({ log: (m) => process.stderr.write(`[cloud] second: ${m}\n`) });
  const bundles = path.join(tmp, 'bundles');
  const dirs = await bundleFunctions(PIPELINE_STAGES, bundles);
  await bundleEntry(path.join(ROOT, 'events/forwarder/main.ts'), path.join(bundles, 'forwarder.mjs'));
  for (const stage of PIPELINE_STAGES) {
    const dlq = await createFifoQueue(s.sqs, `${id}-${stage}-dlq`);
    const queue = await createFifoQueue(s.sqs, `${id}-${stage}`, {
      visibilityTimeoutSeconds: VISIBILITY_SECONDS,
      deadLetter: { arn: dlq.arn, maxReceiveCount: DEFAULT_MAX_ATTEMPTS },
    });
    const bundle = path.join(dirs[stage], 'index.mjs');
    for (let i = 0; i < INSTANCES[stage]; i++)
      await mkdir(path.join(tmp, 'scratch', stage, String(i)), { recursive: true });
    hosts.set(stage, {
      stage,
      bundle,
      bundleBytes: (await stat(bundle)).size,
      layer: await functionLayer(tmp, stage),
      queue,
      dlq,
      coldMs: 0,
      warmMs: [],
    } as unknown as StageHost);
  }
  rootKeySecretArn = await createRootKeySecret(s.sqs, `kapp-lambda-${id}/artifact-root-key`);
  const [first, second] = await Promise.allSettled([startedCluster, startedJoining]);
  if (second.status === 'fulfilled') joining = second.value;
  if (first.status === 'rejected') throw first.reason;
  cluster = first.value;
  if (second.status === 'rejected') throw second.reason;
  kube = e2eCluster(cluster.kubeconfigPath);
  clusterId = `kwok-${cluster.name}`;
  await kube.applyCrds();
  await registerCluster();
  await forwarderIdentity();
  await kube.apply(...statusWriterPolicy());
  for (const h of hosts.values()) {
    const sizing = STAGE_SIZING[h.stage];
    h.ries = await startRieInstances(
      {
        bundle: h.bundle,
        env: functionEnv(h.stage, h.layer),
        cwd: path.join(tmp, 'fn', h.stage),
        timeoutSeconds: sizing.timeoutSeconds,
        memoryMiB: sizing.memoryMiB,
        isolate: {
          bundles,
          // No admin kubeconfig (this file's control plane, the shared one) and no other
          // function's token is there to be read.
          hide: [
            cluster.workdir,
            joining.workdir,
            path.dirname(sharedKubeconfigPath),
            ...PIPELINE_STAGES.filter((st) => st !== h.stage).map(secretsDir),
          ],
        },
      },
      INSTANCES[h.stage],
      // Each environment its own /tmp, as on Lambda.
      (i) => ({ KAPP_LAMBDA_TMP_DIR: path.join(tmp, 'scratch', h.stage, String(i)) }),
    );
    // Cold start, then warm: an empty batch measures the runtime, not a stage.
    const colds = await Promise.all(h.ries.map((rie) => invokeRie(rie, { Records: [] })));
    for (const [i, cold] of colds.entries()) {
      expect(cold, `${h.stage} cold invoke: ${h.ries[i]?.proc.output().slice(-2000)}`).toMatchObject({
        status: 200,
        body: { batchItemFailures: [] },
      });
    }
    h.coldMs = colds[0]?.ms ?? 0;
    const first = h.ries[0] as Rie;
    for (let i = 0; i < 3; i++) h.warmMs.push((await invokeRie(first, { Records: [] })).ms);
    h.mapping = new EventSourceMapping({
      name: h.stage,
      client: sqs,
      queueUrl: h.queue.url,
      queueArn: h.queue.arn,
      region: s.sqs.region,
      batchSize: sizing.batchSize,
      visibilityTimeoutSeconds: VISIBILITY_SECONDS,
      invoke: h.ries.map((rie) => (event: { Records: SqsEventRecord[] }) => invokeRie(rie, event)),
      maxConcurrency: h.ries.length,
    });
    h.mapping.start();
  }

  forwarder = await startForwarder('forwarder', forwarderKubeconfig, {
    KAPP_LAMBDA_QUEUE_URL_FETCH: host('fetch').queue.url,
    KAPP_LAMBDA_QUEUE_URL_INSTALL: host('install').queue.url,
    KAPP_LAMBDA_QUEUE_URL_INDEX_REPO: host('index-repo').queue.url,
    FORWARDER_CLUSTER_ID: clusterId,
  });
}, 300_000);

afterAll(async () => {
  await forwarder?.stop();
  await joiningForwarder?.stop();
  for (const h of hosts.values()) await h.mapping?.stop();
  for (const h of hosts.values()) await Promise.all((h.ries ?? []).map((rie) => rie.proc.stop()));
  sqs?.destroy();
  await cluster?.stop();
  await joining?.stop();
  if (tmp) await removeTempDir(tmp);
  if (hosts.size > 0) {
    process.stderr.write(figures().text);
    await writeFile(FIGURES_FILE, `${JSON.stringify(figures().rows, null, 2)}\n`).catch(() => undefined);
  }
});

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? (s[Math.floor((s.length - 1) / 2)] ?? 0) : 0;
};
const mib = (n: number) => `${(n / 1_048_576).toFixed(1)} MiB`;

/** Where the last run's figures are kept (beside `layers/sizes.json` of `npm run build:layers`). */
const FIGURES_FILE = path.join(cacheRoot(), 'cloud-e2e-figures.json');

/** One function's figures: sizes in bytes, times in ms. */
interface FunctionFigures {
  stage: PipelineStage;
  bundleBytes: number;
  layerBytes: number;
  /** First invoke of a fresh emulator (init + an empty batch). */
  coldMs: number;
  /** Median of three invokes after it (an empty batch). */
  warmMs: number;
  /** Invocations with records that the function settled, and their median round trip. */
  invocations: number;
  medianInvocationMs: number;
}

/** The figures the closing note reports: sizes, cold and warm invokes, record times. */
function figures(): { rows: FunctionFigures[]; text: string } {
  const rows = [...hosts.values()].map((h): FunctionFigures => {
    const records = h.mapping?.invocations.filter((i) => i.outcome === 'ok' && i.messageIds.length > 0) ?? [];
    return {
      stage: h.stage,
      bundleBytes: h.bundleBytes,
      layerBytes: h.layer.bytes,
      coldMs: Math.round(h.coldMs),
      warmMs: Math.round(median(h.warmMs)),
      invocations: records.length,
      medianInvocationMs: Math.round(median(records.map((r) => r.ms))),
    };
  });
  const line = (r: FunctionFigures) =>
    [
      r.stage.padEnd(10),
      mib(r.bundleBytes).padStart(9),
      mib(r.layerBytes).padStart(10),
      `${r.coldMs} ms`.padStart(8),
      `${r.warmMs} ms`.padStart(8),
      String(r.invocations).padStart(7),
      `${r.medianInvocationMs} ms`.padStart(9),
    ].join(' ');
  const text = [
    '',
    '[cloud] function     bundle      layer     cold     warm  invokes  median/invoke (records of this run)',
    ...rows.map((r) => `[cloud] ${line(r)}`),
    `[cloud] (also in ${FIGURES_FILE})`,
    '',
  ].join('\n');
  return { rows, text };
}

/** What a function logged about one message id. */
const logsOf = (stage: PipelineStage, messageId: string) =>
  host(stage)
    .ries.flatMap((rie) => rieLogLines(rie))
    .filter((l) => l.messageId === messageId);

// The three run at once: the crash and the poison wait mostly on visibility timeouts, and each
// uses its own FIFO groups and objects (the crash its own namespace, the poison its own cluster id).
describe.concurrent('cloud mode: forwarder → SQS → functions under the Runtime Interface Emulator → S3', () => {
  it('the forwarder runs as its own ServiceAccount, with the read-only access infra/forwarder/rbac.yml grants', async () => {
    const as = (args: string[]) => kubectl(forwarderKubeconfig, args, { check: false });
    expect((await as(['auth', 'whoami', '-o', 'jsonpath={.status.userInfo.username}'])).stdout).toBe(forwarderUser);
    const can = async (verb: string, resource: string, ...where: string[]) =>
      `${verb} ${resource}: ${(await as(['auth', 'can-i', verb, resource, ...where])).stdout.trim()}`;
    expect(
      await Promise.all([
        can('watch', 'apps.kappctrl.k14s.io'),
        can('list', 'packageinstalls.packaging.carvel.dev'),
        can('update', 'leases.coordination.k8s.io', '-n', IDENTITY_NAMESPACE),
        can('patch', 'apps.kappctrl.k14s.io'),
        can('update', 'apps.kappctrl.k14s.io/status'),
        can('create', 'serviceaccounts/token', '-n', IDENTITY_NAMESPACE),
      ]),
    ).toEqual([
      'watch apps.kappctrl.k14s.io: yes',
      'list packageinstalls.packaging.carvel.dev: yes',
      'update leases.coordination.k8s.io: yes',
      'patch apps.kappctrl.k14s.io: no',
      'update apps.kappctrl.k14s.io/status: no',
      'create serviceaccounts/token: no',
    ]);
  });

  it('a second control plane joins with `npm run cluster -- join`; the fleet reconciles an App there', {
    timeout: 180_000,
  }, async ({ onTestFinished }) => {
    tracked('join', onTestFinished);
    const s = servers();
    const took: string[] = [];
    const timed = async <T>(what: string, run: () => Promise<T>): Promise<T> => {
      const t0 = Date.now();
      try {
        return await run();
      } finally {
        took.push(`${what} ${Date.now() - t0} ms`);
      }
    };
    const joinedId = `kwok-${joining.name}`;
    const second = e2eCluster(joining.kubeconfigPath);
    joinedCluster = second;
    // The stack's outputs as `cdk deploy --outputs-file` writes them: this fleet's entry queues.
    // No forwarder role is made (--auth token, --no-sender-check: see the module comment), so the
    // policy is never attached; join only reads its account.
    const outputs = path.join(tmp, 'outputs.json');
    await writeFile(
      outputs,
      JSON.stringify({
        KappLambda: {
          Region: s.sqs.region,
          ForwarderPolicyArn: 'arn:aws:iam::123456789012:policy/kapp-lambda-forwarders',
          QueueUrlFetch: host('fetch').queue.url,
          QueueUrlInstall: host('install').queue.url,
          QueueUrlIndexRepo: host('index-repo').queue.url,
        },
      }),
    );
    const context = loadKubeConfig(joining.kubeconfigPath).getCurrentContext();
    const joined = await timed('join', () =>
      clusterCli(
        fleet,
        [
          'join',
          context,
          '--id',
          joinedId,
          '--fleet',
          outputs,
          '--registry',
          registryUrl(fleet),
          '--kubeconfig',
          joining.kubeconfigPath,
          '--auth',
          'token',
          '--no-sender-check',
        ],
        { KUBECTL: joining.kubectlPath },
      ),
    );
    expect(joined.stderr).toContain(`wrote ${clusterDocKey(joinedId)}`);
    // The steps join printed: each function's token where the document names it.
    expect(joined.stdout).toContain(`kubectl -n ${IDENTITY_NAMESPACE} get secret`);
    await timed('tokens', () => storeStageTokens(fleet, second, joinedId));
    // The forwarder as the release's Deployment runs it: as its ServiceAccount, with the settings
    // of its two ConfigMaps (the release's and the fleet one join wrote) and of the event key's
    // Secret join wrote (the functions take its events only in the groups that key gives).
    const settings = await timed('forwarder', async () => {
      const data = async (kind: 'configmap' | 'secret', name: string) => {
        const obj = JSON.parse((await second.k(['-n', RELEASE_NAMESPACE, 'get', kind, name, '-o', 'json'])).stdout) as {
          data?: Record<string, string>;
        };
        const entries = Object.entries(obj.data ?? {});
        return Object.fromEntries(
          kind === 'secret' ? entries.map(([k, v]) => [k, Buffer.from(v, 'base64').toString('utf8')]) : entries,
        );
      };
      const env = {
        ...(await data('configmap', 'kapp-lambda-forwarder')),
        ...(await data('configmap', FORWARDER_FLEET_CONFIGMAP)),
        ...(await data('secret', FORWARDER_EVENT_KEY_SECRET)),
      };
      expect(env.FORWARDER_EVENT_KEY).toMatch(/^[A-Za-z0-9+/]{43}=$/);
      const kubeconfig = await serviceAccountKubeconfig(
        second,
        joining.kubeconfigPath,
        FORWARDER_SERVICE_ACCOUNT,
        path.join(tmp, 'joined-forwarder.kubeconfig'),
      );
      joiningForwarder = await startForwarder('forwarder-joined', kubeconfig, env);
      return env;
    });
    expect(settings.FORWARDER_CLUSTER_ID).toBe(joinedId);

    const ns = `cloud-joined-${id}`;
    const name = `joined-${id}`;
    await second.createTenant(ns);
    await second.apply(inlineConfigMapApp(ns, name, 'from the fleet'));
    let last: AppObject | undefined;
    const app = await timed('reconcile', () =>
      waitFor(
        `App ${ns}/${name} in the joined cluster`,
        async () => {
          last = await second.getApp(ns, name);
          return last && succeededAt(1)(last) ? last : undefined;
        },
        { timeoutMs: 120_000, intervalMs: 500, describe: () => JSON.stringify(last?.status ?? null, null, 1) },
      ),
    );
    process.stderr.write(
      `[cloud] joined ${joinedId}: ${took.join(', ')}\n${joined.steps.map((l) => `[cloud]   join ${l}\n`).join('')}`,
    );
    expectSucceededStatus(app, STATUS_KEYS);
    const deployed = await second.getObject<{ data?: Record<string, string> }>('configmap', ns, `${name}-config`);
    expect(deployed?.data).toEqual({ greeting: 'from the fleet' });
    expect(await kube.getObject('configmap', ns, `${name}-config`)).toBeUndefined();
    // Its records named the joined cluster: they came through the second forwarder, in the
    // object's group under the event key join wrote.
    const group = messageGroupId(Buffer.from(settings.FORWARDER_EVENT_KEY ?? '', 'base64'), {
      clusterId: joinedId,
      kind: 'App',
      namespace: ns,
      name,
    });
    expect(host('fetch').mapping.invocations.some((i) => i.groupIds.includes(group))).toBe(true);
  });

  it('reconciles every App of the demo, its PackageRepository and PackageInstall as the embedded runtime does', {
    timeout: 300_000,
  }, async ({ onTestFinished }) => {
    tracked('demo', onTestFinished);
    const s = servers();
    const placeholders = await publishExamples(s);
    for (const file of EXAMPLES) {
      await kube.k(['apply', '-f', '-'], await renderExample(file, placeholders));
    }
    const repo = await waitFor(
      'PackageRepository examples',
      async () => {
        const r = await kube.getObject<RepoObject>('packagerepositories', 'demo-packages', 'examples');
        return r && final(r) ? r : undefined;
      },
      { timeoutMs: 120_000, intervalMs: 1000 },
    );
    expectRepoSucceeded(repo);
    await kube.k(['apply', '-f', '-'], await renderExample(INSTALL_EXAMPLE, placeholders));

    const apps = await waitFor(
      'every App reconciled',
      async () => {
        const all = await demoApps();
        return all.length === APP_EXAMPLES.length + 1 && all.every(final) ? all : undefined;
      },
      {
        timeoutMs: 150_000,
        intervalMs: 1000,
        describe: async () =>
          JSON.stringify(
            (await demoApps()).filter((a) => !final(a)).map((a) => [a.metadata.namespace, a.metadata.name, a.status]),
            null,
            1,
          ),
      },
    );
    const byName = new Map(apps.map((a) => [`${a.metadata.namespace}/${a.metadata.name}`, a]));
    expect([...byName.keys()].sort()).toEqual([
      'demo-bundle/hello-bundle',
      'demo-git/hello-git',
      'demo-helm/hello-helm',
      'demo-http/hello-http',
      'demo-inline/inline-app',
      'demo-packages/hello',
    ]);
    for (const app of byName.values()) expectSucceededStatus(app, STATUS_KEYS);
    // The git App's source came through the git the fetch layer ships (`layers/git.ts`; the
    // host's git is hidden): vendir's lock output reaches status as it does in the embedded e2e.
    const git = byName.get('demo-git/hello-git');
    expect(git?.status?.fetch?.stdout ?? '').toMatch(/sha: [0-9a-f]{40}/);

    const pkgi = await waitFor(
      'PackageInstall hello',
      async () => {
        const p = await kube.getObject<RepoObject>('packageinstalls', 'demo-packages', 'hello');
        return p && final(p) ? p : undefined;
      },
      { timeoutMs: 60_000, intervalMs: 1000 },
    );
    expect(kappConditions(pkgi.status?.conditions)).toEqual([{ type: 'ReconcileSucceeded', status: 'True' }]);
    // Those statuses came from the stage identities: the policy that held every write to them
    // refuses the same write from the admin.
    const byAdmin = await kube.k(
      [
        'patch',
        'app',
        'inline-app',
        '-n',
        'demo-inline',
        '--subresource=status',
        '--type=merge',
        '-p',
        '{"status":{"friendlyDescription":"admin"}}',
      ],
      undefined,
      false,
    );
    expect(byAdmin.code).not.toBe(0);
    expect(byAdmin.stderr).toContain(
      "kappctrl.k14s.io/apps/status is written only by the fetch, template, deploy functions' identities",
    );

    // The artifacts are in S3 under this run's prefix: fetched trees and rendered manifests.
    const client = s3Client(s.s3);
    try {
      const listed = await client.send(new ListObjectsV2Command({ Bucket: s.s3.bucket, Prefix: PREFIX }));
      const keys = (listed.Contents ?? []).map((o) => (o.Key ?? '').slice(PREFIX.length));
      expect(keys.some((k) => k.startsWith('artifacts/fetch/'))).toBe(true);
      expect(keys.some((k) => k.startsWith('artifacts/template/'))).toBe(true);
      // hello-http's render takes values from a Secret: sealed under the private prefix with
      // keys from the root key the functions read from (moto's) Secrets Manager at cold start.
      expect(keys.some((k) => k.startsWith('private/'))).toBe(true);
    } finally {
      client.destroy();
    }
    // Every function took records from its queue, through the poller.
    for (const h of hosts.values()) {
      expect(
        h.mapping.invocations.some((i) => i.outcome === 'ok' && i.messageIds.length > 0),
        h.stage,
      ).toBe(true);
      expect(Math.max(...h.mapping.invocations.map((i) => i.messageIds.length))).toBeLessThanOrEqual(
        STAGE_SIZING[h.stage].batchSize,
      );
    }
  });

  it('a deploy function killed while kapp runs: the record comes back after its visibility timeout and the App converges', async ({
    onTestFinished,
  }) => {
    tracked('crash', onTestFinished);
    const ns = `cloud-crash-${id}`;
    await kube.createTenant(ns);
    const name = `crash-${id}`;
    const deploy = host('deploy');
    const before = deploy.mapping.invocations.length;
    await kube.apply(slowApp(ns, name, 4));
    // kapp of this App runs under the deploy function: kill the function's runtime (node).
    const kapp = await waitFor('kapp deploying crash-app', async () => kappProcesses().get(name)?.[0], {
      timeoutMs: 120_000,
      intervalMs: 100,
    });
    // The instance running it, of the function's several.
    const pid = runtimePidOf(deploy.bundle, kapp);
    expect(pid).toBeDefined();
    process.kill(pid as number, 'SIGKILL');

    const app = await waitApp(ns, name, succeededAt(1));
    expectSucceededStatus(app, STATUS_KEYS);
    const group = `${clusterId}/App/${ns}/${name}`;
    const crashed = deploy.mapping.invocations
      .slice(before)
      .find((i) => i.outcome === 'error' && i.groupIds.includes(group));
    expect(crashed, JSON.stringify(deploy.mapping.invocations.slice(before))).toBeDefined();
    const messageId = crashed?.messageIds[crashed.groupIds.indexOf(group)] ?? '';
    // Delivered again (its receive count one higher) and then handled. The function writes the
    // status before it returns and the poller records the invocation after, so wait for it.
    const again = await waitFor(
      'the redelivered record handled',
      async () => {
        const mine = deploy.mapping.invocations.slice(before).filter((i) => i.messageIds.includes(messageId));
        return mine.some((i) => i.outcome === 'ok') ? mine : undefined;
      },
      { timeoutMs: 30_000, intervalMs: 100 },
    );
    // A batch may hold other records: read this record's receive count at its place.
    expect(again.map((i) => [i.outcome, i.receiveCounts[i.messageIds.indexOf(messageId)]])).toEqual([
      ['error', 1],
      ['ok', 2],
    ]);
    // The Deployment kapp was waiting on is there; no kapp of the killed runtime is left.
    expect(await kube.getObject('deployment', ns, `${name}-slow`)).toBeDefined();
    expect(kappProcesses().get(name) ?? []).toEqual([]);
  });

  /** Waits for message `which` (its id, or a test of it) in the dead-letter queue at `dlqUrl` and returns it. */
  const deadLettered = (dlqUrl: string, which: string | ((m: Message) => boolean), what: string) =>
    waitFor(
      `${what} in the dead-letter queue`,
      async () => {
        const r = await sqs.send(
          new ReceiveMessageCommand({
            QueueUrl: dlqUrl,
            // Left visible: the tests run at once and each looks for its own message here.
            VisibilityTimeout: 0,
            WaitTimeSeconds: 1,
            MaxNumberOfMessages: 10,
            MessageSystemAttributeNames: ['All'],
          }),
        );
        return r.Messages?.find((m) => (typeof which === 'string' ? m.MessageId === which : which(m)));
      },
      { timeoutMs: 240_000, intervalMs: 500 },
    );

  it('a poison message fails on every receive, says why in the log, and ends in the dead-letter queue', async () => {
    const fetch = host('fetch');
    const event = objectEvent(
      {
        clusterId: 'not-a-served-cluster',
        kind: 'App',
        apiVersion: 'kappctrl.k14s.io/v1alpha1',
        namespace: 'n',
        name: 'poison',
        uid: '00000000-0000-0000-0000-000000000001',
        generation: 1,
        resourceVersion: '1',
      },
      'added',
      { time: new Date() },
    );
    const body = serializeEvent(event);
    const sent = await sqs.send(
      new SendMessageCommand({
        QueueUrl: fetch.queue.url,
        MessageBody: body,
        MessageGroupId: `not-a-served-cluster/App/n/poison`,
        MessageDeduplicationId: event.id,
      }),
    );
    const messageId = sent.MessageId ?? '';
    const dead = await deadLettered(fetch.dlq.url, messageId, 'the poison message');
    expect(dead.Body).toBe(body);
    const tries = fetch.mapping.invocations.filter((i) => i.messageIds.includes(messageId));
    expect(tries.map((i) => [i.outcome, i.failed.includes(messageId)])).toEqual(
      Array.from({ length: DEFAULT_MAX_ATTEMPTS }, () => ['ok', true]),
    );
    const lines = logsOf('fetch', messageId);
    expect(lines.filter((l) => l.outcome === 'failed').length).toBeGreaterThanOrEqual(1);
    expect(String(lines.at(-1)?.error)).toContain('not-a-served-cluster');
  });

  it('a stage that fails on every receive ends its run on the last one: ReconcileFailed says why, the record is dead-lettered', {
    // five receives 5 s apart, each a function run on a machine busy with the other tests
    timeout: 360_000,
  }, async ({ onTestFinished }) => {
    tracked('refused', onTestFinished);
    // The cluster refuses this App's status writes (an admission policy, as a policy engine
    // would) unless the status reports a failure: every receive of its fetch record fails,
    // until the last allowed one (`DEFAULT_MAX_ATTEMPTS`) writes the final ReconcileFailed.
    const ns = `cloud-refused-${id}`;
    const name = `refused-${id}`;
    const probe = `policy-probe-${id}`;
    await kube.createTenant(ns);
    await kube.apply({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: probe, namespace: ns } });
    const [policy, binding] = statusPolicy(
      name,
      ['kappctrl.k14s.io/apps/status'],
      [
        {
          expression: `object.metadata.name != '${name}' || (has(object.status) && has(object.status.conditions) && object.status.conditions.exists(c, c.type == 'ReconcileFailed'))`,
          message: 'status writes of this App are refused by policy',
        },
        // The probe below: the API server enforces a new policy a moment after it is stored.
        { expression: `object.metadata.name != '${probe}'`, message: 'policy probe refused' },
      ],
    ) as [{ spec: { matchConstraints: { resourceRules: object[] } } }, object];
    policy.spec.matchConstraints.resourceRules.push({
      apiGroups: [''],
      apiVersions: ['v1'],
      operations: ['UPDATE'],
      resources: ['configmaps'],
    });
    await kube.apply(policy, binding);
    // The App is created only once the policy refuses an update of the probe: before, its
    // first fetch could write its Reconciling status and pass on to template.
    await waitFor('the status policy to be enforced', async () => {
      const r = await kube.k(
        ['-n', ns, 'patch', 'configmap', probe, '--dry-run=server', '--type=merge', '-p', '{"data":{"x":"1"}}'],
        undefined,
        false,
      );
      return r.code !== 0 && r.stderr.includes('policy probe refused') ? true : undefined;
    });
    const fetch = host('fetch');
    const before = fetch.mapping.invocations.length;
    await kube.apply(
      appManifest(ns, name, {
        fetch: [{ inline: { paths: { 'cm.yml': 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n' } } }],
        template: [{ ytt: {} }],
        deploy: [{ kapp: {} }],
      }),
    );
    const app = await waitApp(ns, name, failedAt(1));
    expect(app.status?.usefulErrorMessage).toContain('status writes of this App are refused by policy');
    expect(kappConditions(app.status?.conditions)).toEqual([
      expect.objectContaining({
        type: 'ReconcileFailed',
        status: 'True',
        // The first run fails at fetch (its Reconciling write is refused). The timer's re-run
        // after the failure backoff may already have replaced that status: a resync's fetch
        // writes no status, so that run fails at the template stage's write instead.
        message: expect.stringMatching(/^(Fetching resources|Templating): .*refused by policy/),
      }),
    ]);
    // Its record: failed on every receive, the last one after ending the run with that status,
    // so the redrive policy moved it to the dead-letter queue.
    // A batch may hold other tests' records too: take this App's record of it. Found by its
    // group: a receive that found the cluster over its fair share parked the record, and its
    // copy (a new message) went on from receive 1.
    const group = `${clusterId}/App/${ns}/${name}`;
    const dead = await deadLettered(
      fetch.dlq.url,
      (m) => m.Attributes?.MessageGroupId === group,
      "the refused App's fetch record",
    );
    const messageId = dead.MessageId ?? '';
    expect(
      fetch.mapping.invocations.slice(before).some((i) => i.messageIds.includes(messageId)),
      JSON.stringify(fetch.mapping.invocations.slice(before)),
    ).toBe(true);
    const tries = fetch.mapping.invocations.filter((i) => i.messageIds.includes(messageId));
    // Batches of 10: a try's batch may hold other records (a later event of this App, skipped
    // behind it, or another test's), so each try is read at this record's place.
    expect(
      tries.map((i) => {
        const at = i.messageIds.indexOf(messageId);
        return [i.receiveCounts[at], i.failed.includes(messageId)];
      }),
    ).toEqual(Array.from({ length: DEFAULT_MAX_ATTEMPTS }, (_, n) => [n + 1, true]));
    await kube.k(['delete', 'validatingadmissionpolicybinding,validatingadmissionpolicy', name]);
  });
  it("fair shares: an App of cluster B is served beside cluster A's ten tarpit fetches, ten endless waits and five slow repositories, which end with clear statuses", {
    timeout: 300_000,
  }, async () => {
    // The fleet is idle once the other tests are done (see `running`).
    await Promise.all(running.values());
    const b = joinedCluster;
    if (!b) throw new Error('cluster B is the one the join test makes: run it too');
    // Every path: a 200 whose body comes a byte a second, for as long as the client stays.
    const trickles = new Set<NodeJS.Timeout>();
    const tarpit = createServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/gzip' });
      res.flushHeaders();
      const t = setInterval(() => res.write('#'), 1000);
      trickles.add(t);
      res.once('close', () => {
        clearInterval(t);
        trickles.delete(t);
      });
    });
    tarpit.listen(0, LOOPBACK);
    await once(tarpit, 'listening');
    const tarpitHost = `${LOOPBACK}:${(tarpit.address() as { port: number }).port}`;
    const label = { 'kapp-lambda.test/fair': id };
    const labelled = <T extends object>(o: T) => {
      const m = o as { metadata: { labels?: Record<string, string> } };
      m.metadata.labels = { ...m.metadata.labels, ...label };
      return o;
    };
    const stall = stallNote(tarpitHost, { windowMs: STALL_SECONDS * 1000, minBytes: DEFAULT_FETCH_STALL_MIN_BYTES });
    const cut = fleetWaitCutNote('Timed out waiting after', MAX_DEPLOY_WAIT_SECONDS * 1000) ?? '';
    // Cluster A's objects, each in its own namespace, and the note its failure must carry.
    const load = [
      // The waits first: their fetches (inline, quick) go ahead of the tarpits' in A's fetch share,
      // so their deploys run beside the tarpit fetches and A's load ends sooner.
      // kapp waits for a Deployment not available for 500 s (under its 600 s progress deadline); the App asks 180 s.
      ...Array.from({ length: 10 }, (_, i) => ({
        kind: 'apps',
        ns: `cloud-fair-a-${id}-wait-${i}`,
        name: `wait-${i}`,
        note: cut,
        manifest: (ns: string, name: string) => slowApp(ns, name, 500),
      })),
      ...Array.from({ length: 10 }, (_, i) => ({
        kind: 'apps',
        ns: `cloud-fair-a-${id}-tarpit-${i}`,
        name: `tarpit-${i}`,
        note: stall,
        manifest: (ns: string, name: string) =>
          appManifest(ns, name, {
            fetch: [{ http: { url: `http://${tarpitHost}/${name}.tgz` } }],
            template: [{ ytt: {} }],
            deploy: [{ kapp: {} }],
          }),
      })),
      ...Array.from({ length: 5 }, (_, i) => ({
        kind: 'packagerepositories',
        ns: `cloud-fair-a-${id}-repo-${i}`,
        name: `repo-${i}`,
        note: stall,
        manifest: (ns: string, name: string) =>
          repositoryManifest(ns, name, { http: { url: `http://${tarpitHost}/${name}.tgz` } }),
      })),
    ];
    const keyOf = (kind: string, ns: string, name: string) => `${kind} ${ns}/${name}`;
    /** When each of A's objects was first seen at its clear status (failed with its note), ms after the load. */
    const ends = new Map<string, number>();
    const deletes: Promise<unknown>[] = [];
    /** A's objects of this test (by their label), `-o <output>`. */
    const listLoad = (output: string) =>
      kube.k(['get', 'apps,packagerepositories', '-A', '-l', `kapp-lambda.test/fair=${id}`, '-o', output]);
    let last: RepoObject[] = [];
    /** Reads A's objects, notes those at their clear end and deletes them (their finalizers must go too). */
    const poll = async (since: number) => {
      const listed = await listLoad('json');
      last = (JSON.parse(listed.stdout) as { items: (RepoObject & { kind: string })[] }).items;
      for (const o of last as (RepoObject & { kind: string })[]) {
        const kind = o.kind === 'App' ? 'apps' : 'packagerepositories';
        const key = keyOf(kind, o.metadata.namespace, o.metadata.name);
        const want = load.find((l) => keyOf(l.kind, l.ns, l.name) === key);
        if (!want || ends.has(key) || !failedAt(1)(o as unknown as AppObject)) continue;
        if (!(o.status?.usefulErrorMessage ?? '').includes(want.note)) continue;
        ends.set(key, Date.now() - since);
        deletes.push(kube.k(['-n', o.metadata.namespace, 'delete', kind, o.metadata.name, '--wait=false']));
      }
    };
    const timeB = async (name: string) => {
      const started = Date.now();
      await b.apply(inlineConfigMapApp(bNs, name, 'beside a noisy neighbour'));
      let got: AppObject | undefined;
      const app = await waitFor(
        `App ${bNs}/${name} in cluster B`,
        async () => {
          got = await b.getApp(bNs, name);
          return got && succeededAt(1)(got) ? got : undefined;
        },
        { timeoutMs: 120_000, intervalMs: 250, describe: () => JSON.stringify(got?.status ?? null, null, 1) },
      );
      const ms = Date.now() - started;
      expectSucceededStatus(app, STATUS_KEYS);
      return { ms, fetchedAt: app.status?.fetch?.startedAt ?? '' };
    };
    const bNs = `cloud-fair-b-${id}`;
    try {
      await Promise.all([b.createTenant(bNs), ...load.map((l) => kube.createTenant(l.ns))]);
      const { ms: idleMs } = await timeB(`idle-${id}`);

      const loaded = Date.now();
      await kube.apply(...load.map((l) => labelled(l.manifest(l.ns, l.name))));
      // Under way: A's fetch share is taken (a tarpit App is being fetched).
      await waitFor(
        "cluster A's load under way",
        async () => {
          await poll(loaded);
          return last.some(
            (o) => o.metadata.name.startsWith('tarpit-') && o.status?.conditions?.some((c) => c.type === 'Reconciling'),
          )
            ? true
            : undefined;
        },
        { timeoutMs: 60_000, intervalMs: 250 },
      );
      const { ms: loadedMs, fetchedAt } = await timeB(`loaded-${id}`);
      await poll(loaded);
      // B did not wait behind A: when B's fetch started, A's tarpit Apps had started fetching in
      // at most a few rounds of A's fetch share (each round a stall window, STALL_SECONDS). A's
      // were created first, so without shares B's record queues behind every one of them (the
      // ten tarpits' fetches, then the waits'), and all ten tarpits start fetching before B's.
      expect(fetchedAt, "B's App has no status.fetch.startedAt").toMatch(/^\d{4}-/);
      const tarpitsBefore = last.filter(
        (o) => o.metadata.name.startsWith('tarpit-') && (o.status?.fetch?.startedAt ?? '9') < fetchedAt,
      ).length;
      process.stderr.write(
        `[cloud] fair shares: B's App ${idleMs} ms on the idle fleet, ${loadedMs} ms beside A's load (${(loadedMs / idleMs).toFixed(2)}×); ${ends.size} of A's ${load.length} objects had ended then, ${tarpitsBefore} of its 10 tarpit Apps had started fetching before B's\n`,
      );
      expect(
        tarpitsBefore,
        "B's fetch started after most of A's tarpit fetches: B waited behind A's load",
      ).toBeLessThan(8);
      await waitFor(
        'every object of cluster A at its clear status',
        async () => {
          await poll(loaded);
          return ends.size === load.length ? true : undefined;
        },
        {
          timeoutMs: 180_000,
          intervalMs: 1000,
          describe: () =>
            JSON.stringify(
              last
                .filter(
                  (o) =>
                    !ends.has(
                      keyOf(
                        (o as { kind?: string }).kind === 'App' ? 'apps' : 'packagerepositories',
                        o.metadata.namespace,
                        o.metadata.name,
                      ),
                    ),
                )
                .map((o) => [o.metadata.namespace, o.metadata.name, o.status]),
              null,
              1,
            ),
        },
      );
      process.stderr.write(
        `[cloud] fair shares: A's objects ended within ${Math.max(...ends.values())} ms of their creation\n`,
      );
    } finally {
      for (const t of trickles) clearInterval(t);
      tarpit.closeAllConnections();
      tarpit.close();
    }
    // Deleted as each ended: every finalizer is removed, nothing is left.
    await Promise.all(deletes);
    await waitFor(
      "cluster A's objects deleted",
      async () => {
        const left = await listLoad('name');
        return left.stdout.trim() === '' ? true : undefined;
      },
      { timeoutMs: 120_000, intervalMs: 1000 },
    );
  });
});
