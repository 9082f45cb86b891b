/**
 * What the cloud-mode e2e files share (`cloud.test.ts`, `cloud-dispatched.test.ts`,
 * `cloud-rollout.test.ts`): a fleet's cluster registry in S3 filled by the `npm run cluster` CLI
 * as a process (and `npm run fleet` on its store), each stage's token where the registry document
 * names it, the forwarder bundle as its own process over moto's SQS, the artifact root key in
 * moto's Secrets Manager, and the environment the stack gives a stage function.
 *
 * @module
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { CreateSecretCommand, SecretsManagerClient } from '@aws-sdk/client-secrets-manager';
import { parseAllDocuments } from 'yaml';
import { PIPELINE_STAGES, type PipelineStage } from '../../functions/lib/api/functions.js';
import { clusterDocKey, MAX_CLUSTER_DOC_BYTES, parseClusterDoc } from '../../functions/lib/kube/cluster-doc.js';
import { apiServerInfoOf } from '../../functions/lib/kube/registry.js';
import { DEFAULT_MAX_ATTEMPTS } from '../../functions/lib/pipeline/retry-bound.js';
import { S3Store } from '../../functions/lib/store/s3.js';
import { toolTimeoutMs } from '../../infra/aws/stages.js';
import { layerToolVersions } from '../../layers/build.js';
import { hardenAddonPath } from '../../layers/native.js';
import { newEventKey } from '../../scripts/cluster-join.js';
import { putCluster, recordedClusterDoc, stageServiceAccount } from '../../scripts/cluster-registry.js';
import { loadKubeConfig } from '../harness/kube.js';
import type { FunctionLayer } from '../harness/lambda.js';
import { freePort, httpAnswers, LOOPBACK, startProcess } from '../harness/servers/process.js';
import { type S3Info, s3Client } from '../harness/servers/s3.js';
import type { SqsInfo } from '../harness/servers/sqs.js';
import type { E2ECluster } from './support.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** Namespace of the functions' ServiceAccounts (`npm run cluster -- add`'s default). */
export const IDENTITY_NAMESPACE = 'kapp-lambda';

/** Where one test file's fleet keeps its things. */
export interface CloudFleet {
  /** The file's work directory: `HOME` of the CLI and forwarder processes, `<tmp>/bundles/forwarder.mjs`, `<tmp>/secrets/<stage>/`. */
  readonly tmp: string;
  /** The S3 server of the artifact bucket and the registry. */
  readonly s3: S3Info;
  readonly bucket: string;
  /** Key prefix of the cluster registry in `bucket` (`registry/` under the fleet's prefix, as the stack puts it). */
  readonly registryPrefix: string;
  /** moto's server: SQS, Secrets Manager (and STS, IAM, S3). */
  readonly moto: SqsInfo;
}

/** `s3://<bucket>/<registry prefix>`: the fleet's cluster registry. */
export const registryUrl = (fleet: CloudFleet): string => `s3://${fleet.bucket}/${fleet.registryPrefix}`;

/** A function's secret directory: only its own stage's tokens (as its IAM role reads only its own secrets). */
export const secretsDir = (fleet: CloudFleet, stage: PipelineStage): string => path.join(fleet.tmp, 'secrets', stage);

/** What a CLI process printed: `steps`, each line it wrote on stderr with the milliseconds since its start. */
export interface CliOutput {
  stdout: string;
  stderr: string;
  steps: string[];
}

/**
 * Runs `npm run cluster -- <args>` as a process (`tsx scripts/cluster-registry.ts`) against the
 * fleet's S3 server. `steps`: each line the CLI wrote on stderr (what it did, in order) with the
 * milliseconds since its start when it came.
 * @throws Error (with the process's output) when it exits other than 0
 */
export const clusterCli = (fleet: CloudFleet, args: string[], env: Record<string, string> = {}): Promise<CliOutput> =>
  scriptCli(fleet, 'scripts/cluster-registry.ts', args, env);

/**
 * Runs `npm run fleet -- <args>` as a process (`tsx scripts/fleet.ts`) against the fleet's S3
 * server (give it `--store s3://<bucket>/`), as {@link clusterCli}.
 */
export const fleetCli = (fleet: CloudFleet, args: string[], env: Record<string, string> = {}): Promise<CliOutput> =>
  scriptCli(fleet, 'scripts/fleet.ts', args, env);

/** Runs `tsx <script> <args>` (a CLI of `scripts/`) as {@link clusterCli} describes. */
async function scriptCli(
  fleet: CloudFleet,
  script: string,
  args: string[],
  env: Record<string, string>,
): Promise<CliOutput> {
  const started = Date.now();
  const steps: string[] = [];
  const run = promisify(execFile)(path.join(ROOT, 'node_modules/.bin/tsx'), [script, ...args], {
    cwd: ROOT,
    env: {
      PATH: process.env.PATH,
      HOME: fleet.tmp,
      AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true',
      AWS_REGION: fleet.s3.region,
      AWS_ACCESS_KEY_ID: fleet.s3.accessKeyId,
      AWS_SECRET_ACCESS_KEY: fleet.s3.secretAccessKey,
      KAPP_LAMBDA_S3_ENDPOINT: fleet.s3.endpoint,
      ...env,
    },
  });
  run.child.stderr?.on('data', (d: Buffer) => {
    for (const line of d.toString().split('\n')) if (line) steps.push(`+${Date.now() - started} ms ${line}`);
  });
  return { ...(await run), steps };
}

/**
 * Gives each function its token for cluster `id` where the registry document names it: a
 * TokenRequest for the stage's ServiceAccount in `on` (instead of the long-lived token Secrets
 * the printed steps copy), in that function's own secret directory ({@link secretsDir}).
 * @throws Error when the document is missing, not `token` auth, or names no token of a stage.
 */
export async function storeStageTokens(fleet: CloudFleet, on: E2ECluster, id: string): Promise<void> {
  const client = s3Client(fleet.s3);
  try {
    const store = new S3Store({ client, bucket: fleet.bucket, prefix: fleet.registryPrefix });
    const key = clusterDocKey(id);
    const body = await store.get(key, { maxBytes: MAX_CLUSTER_DOC_BYTES });
    const doc = parseClusterDoc(key, body ?? '');
    if (doc.auth.kind !== 'token') throw new Error(`registered ${id} with ${doc.auth.kind} auth`);
    for (const stage of PIPELINE_STAGES) {
      const name = doc.auth.secrets[stage];
      if (!name) throw new Error(`the document names no ${stage} token`);
      const token = (
        await on.k(['-n', IDENTITY_NAMESPACE, 'create', 'token', stageServiceAccount(stage), '--duration=2h'])
      ).stdout.trim();
      const file = path.join(secretsDir(fleet, stage), name);
      await mkdir(path.dirname(file), { recursive: true });
      await writeFile(file, token, { mode: 0o600 });
    }
  } finally {
    client.destroy();
  }
}

/**
 * Registers the control plane of `kubeconfigPath` as cluster `id` as a fleet's administrator
 * does: `npm run cluster -- add <id> --auth token <extraArgs>` (the CLI as a process) writes the
 * document to the registry and prints the RBAC (`infra/rbac/`), which is applied to `on`; then
 * each function's token goes where the document names it ({@link storeStageTokens}).
 */
export async function registerCluster(
  fleet: CloudFleet,
  on: E2ECluster,
  kubeconfigPath: string,
  id: string,
  extraArgs: readonly string[] = [],
): Promise<void> {
  const api = apiServerInfoOf(loadKubeConfig(kubeconfigPath));
  const caFile = path.join(fleet.tmp, `ca-${id}.pem`);
  await writeFile(caFile, Buffer.from(api.caData ?? '', 'base64'));
  const added = await clusterCli(fleet, [
    'add',
    id,
    '--registry',
    registryUrl(fleet),
    '--endpoint',
    api.server,
    '--ca-file',
    caFile,
    ...(api.tlsServerName ? ['--tls-server-name', api.tlsServerName] : []),
    '--auth',
    'token',
    ...extraArgs,
  ]);
  const manifests = parseAllDocuments(added.stdout)
    .map((d) => d.toJS() as { kind: string })
    // The token Secrets the legacy token controller would fill: the tokens here are requested.
    .filter((m) => m.kind !== 'Secret');
  await on.apply(...manifests);
  await storeStageTokens(fleet, on, id);
}

/**
 * Gives registered cluster `id` an event key as `npm run cluster -- join` does (`add` makes none):
 * a new key into its registry document.
 * @returns the key (base64), for the forwarder's `FORWARDER_EVENT_KEY`.
 * @throws Error when the cluster is not registered.
 */
export async function keyCluster(fleet: CloudFleet, id: string): Promise<string> {
  const client = s3Client(fleet.s3);
  try {
    const store = new S3Store({ client, bucket: fleet.bucket, prefix: fleet.registryPrefix });
    const doc = await recordedClusterDoc(store, id);
    if (!doc) throw new Error(`cluster ${id} is not registered`);
    const eventKey = newEventKey();
    await putCluster(store, { ...doc, eventKey });
    return eventKey;
  } finally {
    client.destroy();
  }
}

/**
 * Starts the forwarder bundle (`<tmp>/bundles/forwarder.mjs`) as its own process watching the
 * cluster of `kubeconfig`, with `settings` (cluster id, queue URLs, namespaces: what the
 * Deployment's ConfigMaps give it) over moto's SQS; its HTTP port is a free loopback one
 * whatever `settings` say. It signs with `credentials` (e.g. a forwarder role's session from
 * moto's STS), by default moto's throw-away pair.
 * @throws Error when it is not ready within a minute.
 */
export async function startForwarder(
  fleet: CloudFleet,
  name: string,
  kubeconfig: string,
  settings: Record<string, string>,
  credentials: { accessKeyId: string; secretAccessKey: string; sessionToken?: string } = fleet.moto,
) {
  const port = await freePort();
  return await startProcess(name, [process.execPath, path.join(fleet.tmp, 'bundles', 'forwarder.mjs')], {
    env: {
      FORWARDER_KINDS: 'App,PackageInstall,PackageRepository',
      ...settings,
      PATH: process.env.PATH,
      HOME: fleet.tmp,
      AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true',
      AWS_ACCESS_KEY_ID: credentials.accessKeyId,
      AWS_SECRET_ACCESS_KEY: credentials.secretAccessKey,
      ...(credentials.sessionToken ? { AWS_SESSION_TOKEN: credentials.sessionToken } : {}),
      AWS_REGION: fleet.moto.region,
      KAPP_LAMBDA_SQS_ENDPOINT: fleet.moto.endpoint,
      KUBECONFIG: kubeconfig,
      FORWARDER_HTTP_HOST: LOOPBACK,
      FORWARDER_HTTP_PORT: String(port),
    },
    ready: () => httpAnswers(`http://${LOOPBACK}:${port}/readyz`, (st) => st === 200),
    timeoutMs: 60_000,
  });
}

/**
 * Creates a fleet's artifact root key as the stack does (a Secrets Manager secret named `name`,
 * base64 of random bytes) on moto's server, which serves Secrets Manager beside SQS.
 * @returns the secret's ARN.
 * @throws Error when moto answers without an ARN.
 */
export async function createRootKeySecret(moto: SqsInfo, name: string): Promise<string> {
  const client = new SecretsManagerClient({
    endpoint: moto.endpoint,
    region: moto.region,
    credentials: { accessKeyId: moto.accessKeyId, secretAccessKey: moto.secretAccessKey },
  });
  try {
    const created = await client.send(
      new CreateSecretCommand({ Name: name, SecretString: randomBytes(48).toString('base64') }),
    );
    if (!created.ARN) throw new Error('create secret: no ARN in the answer');
    return created.ARN;
  } finally {
    client.destroy();
  }
}

/**
 * The environment the stack gives `stage`'s function over the fleet's servers, without AWS
 * credentials and without the root key (the caller adds what its mode gives): the bucket under
 * `bucketPrefix`, the queues of `queueUrls` (`KAPP_LAMBDA_QUEUE_URL_*`), the registry with the
 * stage's own secret directory, its layer's tools and their timeout (`dispatched`: the shared
 * mode's shorter stage timeout), `/tmp` under `<tmp>/scratch/<stage>`, loopback URLs allowed (the
 * fixture servers), and the receive bound as deployed.
 */
export function stageFunctionEnv(
  fleet: CloudFleet,
  stage: PipelineStage,
  layer: FunctionLayer,
  opts: { bucketPrefix: string; queueUrls: Record<string, string>; dispatched?: boolean },
): Record<string, string> {
  const toolTimeout = toolTimeoutMs(stage, opts.dispatched);
  return {
    AWS_REGION: fleet.s3.region,
    AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true',
    KAPP_LAMBDA_BUCKET: fleet.bucket,
    ...(opts.bucketPrefix ? { KAPP_LAMBDA_BUCKET_PREFIX: opts.bucketPrefix } : {}),
    KAPP_LAMBDA_S3_ENDPOINT: fleet.s3.endpoint,
    KAPP_LAMBDA_SQS_ENDPOINT: fleet.moto.endpoint,
    ...opts.queueUrls,
    // The cluster comes from the registry, authenticated as this stage only.
    KAPP_LAMBDA_CLUSTER_REGISTRY: registryUrl(fleet),
    KAPP_LAMBDA_CLUSTER_SECRETS: `file://${secretsDir(fleet, stage)}`,
    KAPP_LAMBDA_TMP_DIR: path.join(fleet.tmp, 'scratch', stage),
    KAPP_LAMBDA_BIN_DIR: layer.binDir,
    KAPP_LAMBDA_HARDEN_ADDON: hardenAddonPath(),
    KAPP_LAMBDA_TOOL_VERSIONS: JSON.stringify(layerToolVersions(stage)),
    ...(toolTimeout ? { KAPP_LAMBDA_TOOL_TIMEOUT_MS: String(toolTimeout) } : {}),
    KAPP_LAMBDA_MAX_RECEIVE_COUNT: String(DEFAULT_MAX_ATTEMPTS),
    // The fixture servers are on loopback: allowed as a fleet allows its private registries.
    KAPP_LAMBDA_URL_ALLOW: '127.0.0.0/8',
  };
}
