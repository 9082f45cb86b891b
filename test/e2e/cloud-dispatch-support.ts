/**
 * The shared mode's stack (docs/decisions.md D15) on this machine, for the e2e files that run it
 * (`cloud-dispatched.test.ts`, `cloud-rollout.test.ts`): forwarder → moto's SQS → a dispatcher per
 * stage (the `dispatch` bundle under the Lambda Runtime Interface Emulator, fed by the event
 * source mapping's stand-in `../harness/sqs-poller.ts`) → the stage function per tenant
 * (`../harness/tenant-router.ts`), for several cluster ids registered on the suite's shared
 * control plane, each served by a forwarder of its own limited to its namespace (the cluster
 * id), as separate clusters.
 *
 * - Roles are made in moto's IAM: per stage a run role (the dispatcher assumes it in moto's STS,
 *   session name = the cluster id) and a dispatcher role, per cluster a forwarder role (its id in
 *   the cluster's registry document). Each dispatcher and each forwarder signs with a session of
 *   its own role, as on AWS, so the `SenderId` moto's SQS gives what they send (through the
 *   suite's wrapper, `../harness/servers/moto_sqs.py`) is that role's: the dispatchers' sender
 *   check (`KAPP_LAMBDA_SENDER_CHECK=registry`) sees a forwarder, a run session or the
 *   dispatcher's own role (`KAPP_LAMBDA_RECEIVER_ROLE_ID`) as the stack's would.
 * - The artifact bucket and the registry are in moto's S3: the suite's S3 server would refuse the
 *   credentials moto's STS issues. moto enforces no IAM, so what a run session may reach is not
 *   shown by this stack (`../integration/run-confinement.test.ts` does, with IAM enforced); a
 *   test can watch a cluster's runs' S3 requests instead ({@link DispatchedStackOptions.tenantEnv}
 *   with `../harness/s3-recorder.ts`).
 * - The emulators run without `cloud.test.ts`'s sandbox (host tool directories hidden), one
 *   instance per dispatcher.
 *
 * @module
 */
import { mkdirSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { CreateRoleCommand, IAMClient } from '@aws-sdk/client-iam';
import type { SQSClient } from '@aws-sdk/client-sqs';
import { AssumeRoleCommand, STSClient } from '@aws-sdk/client-sts';
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
import { createBucket, type S3Info } from '../harness/servers/s3.js';
import { createFifoQueue, type SqsInfo, sqsClient } from '../harness/servers/sqs.js';
import { EventSourceMapping, type SqsEventRecord } from '../harness/sqs-poller.js';
import { startTenantRouter, type TenantInvokeBody, type TenantRouter } from '../harness/tenant-router.js';
import {
  type CloudFleet,
  createRootKeySecret,
  keyCluster,
  registerCluster,
  registryUrl,
  stageFunctionEnv,
  startForwarder,
} from './cloud-support.js';
import { servers, shared, kubeconfigPath as sharedKubeconfigPath } from './support.js';

/** The queues' visibility timeout here, seconds (see `sqs-poller.ts`). */
export const VISIBILITY_SECONDS = 5;
/** moto's default account, where its IAM makes the roles. */
const ACCOUNT = '123456789012';

/** Temporary credentials of an STS session (never logged). */
export interface SessionCredentials {
  readonly accessKeyId: string;
  readonly secretAccessKey: string;
  readonly sessionToken: string;
}

/** One stage's dispatcher: its emulator, the mapping feeding it, and what it was handed. */
export interface Dispatcher<S extends PipelineStage = PipelineStage> {
  readonly stage: S;
  readonly rie: Rie;
  readonly mapping: EventSourceMapping;
  /** Every record the mapping handed the dispatcher, as received (with `SenderId`). */
  readonly records: SqsEventRecord[];
}

/** What {@link startDispatchedStack} builds. */
export interface DispatchedStackOptions<S extends PipelineStage> {
  /** Names the stack's roles, queues, bucket and functions (a test file's random suffix). */
  readonly id: string;
  /** The stages that get a dispatcher and a stage function (every stage gets a queue). */
  readonly stages: readonly S[];
  /** The cluster ids, each registered on the shared control plane with its namespace of the same name. */
  readonly clusters: readonly string[];
  /** `FORWARDER_KINDS` of each cluster's forwarder. */
  readonly forwarderKinds: string;
  /**
   * Laid over the environment of the stage function of `functionName` serving `tenantId` (a
   * cluster id), e.g. an S3 endpoint of its own; each environment gets its own `/tmp` anyway.
   */
  readonly tenantEnv?: (functionName: string, tenantId: string) => Record<string, string>;
  /**
   * Watches every invoke of a stage function (request and answer bodies as sent; the request
   * holds the run session's credentials: never log it).
   */
  readonly onInvoke?: (invoke: TenantInvokeBody) => void;
}

/** A running stack ({@link startDispatchedStack}). */
export interface DispatchedStack<S extends PipelineStage> {
  readonly fleet: CloudFleet;
  readonly sqs: SQSClient;
  readonly router: TenantRouter;
  readonly dispatchers: readonly Dispatcher<S>[];
  /** Every stage's queue. */
  readonly queues: Readonly<Record<PipelineStage, { url: string; arn: string }>>;
  /** Each cluster's forwarder role id, as its registry document names it. */
  readonly forwarderRoleIds: ReadonlyMap<string, string>;
  /** Each stage's run role id (`AROA…`), which SQS names as the sender of what its runs send. */
  readonly runRoleIds: ReadonlyMap<S, string>;
  /** Each stage's dispatcher role id, the sender of what its dispatcher sends. */
  readonly dispatcherRoleIds: ReadonlyMap<S, string>;
  /** The stage function's name of `stage` (the router's, the dispatcher's `KAPP_LAMBDA_STAGE_FUNCTION`). */
  stageFunctionName(stage: S): string;
  /** Each dispatcher's mapping error and last `lines` log lines (default 12), for a wait's failure message. */
  describe(lines?: number): string;
  /** Stops the forwarders, the mappings, the emulators and the router; removes the work directory. */
  stop(): Promise<void>;
}

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

/** A session of role `arn` in moto's STS, named `session`, for an hour. */
async function assumeRole(sts: STSClient, arn: string, session: string): Promise<SessionCredentials> {
  const c = (await sts.send(new AssumeRoleCommand({ RoleArn: arn, RoleSessionName: session, DurationSeconds: 3600 })))
    .Credentials;
  if (!c?.AccessKeyId || !c.SecretAccessKey || !c.SessionToken) throw new Error(`assume ${arn}: no credentials`);
  return { accessKeyId: c.AccessKeyId, secretAccessKey: c.SecretAccessKey, sessionToken: c.SessionToken };
}

/** moto's clients of IAM and STS, as its administrator. */
function motoAdminClients(moto: SqsInfo): { iam: IAMClient; sts: STSClient } {
  const config = {
    endpoint: moto.endpoint,
    region: moto.region,
    credentials: { accessKeyId: moto.accessKeyId, secretAccessKey: moto.secretAccessKey },
  };
  return { iam: new IAMClient(config), sts: new STSClient(config) };
}

/**
 * Builds and starts the stack (see the module comment): the bundles, every stage's FIFO queue
 * and dead-letter queue, the root key, the roles, the CRDs, each cluster registered (`npm run
 * cluster -- add`, RBAC applied, tokens stored) and keyed, the stage functions behind the tenant
 * router, a dispatcher per stage with its mapping started, then each cluster's forwarder.
 * Does not create the clusters' namespaces.
 *
 * @throws whatever a step throws (the caller's `afterAll` should still call `stop` when it got the stack;
 *   a failed start leaves its processes to the suite's teardown)
 */
export async function startDispatchedStack<S extends PipelineStage>(
  opts: DispatchedStackOptions<S>,
): Promise<DispatchedStack<S>> {
  const { id, stages, clusters } = opts;
  const tmp = await makeTempDir(`cloud-dispatch-${id}`);
  const moto = servers().sqs;
  const sqs = sqsClient(moto);
  const dispatchers: Dispatcher<S>[] = [];
  const forwarders: ServerProcess[] = [];
  let router: TenantRouter | undefined;
  const stop = async () => {
    await Promise.all(forwarders.map((f) => f.stop()));
    await Promise.all(dispatchers.map((d) => d.mapping.stop()));
    await Promise.all(dispatchers.map((d) => d.rie.proc.stop()));
    await router?.stop();
    sqs.destroy();
    await removeTempDir(tmp);
  };
  try {
    return await build();
  } catch (err) {
    await stop().catch(() => {});
    throw err;
  }

  async function build(): Promise<DispatchedStack<S>> {
    const bucket = `kapp-disp-${id}`;
    const motoS3: S3Info = { ...moto, bucket, dir: tmp };
    await createBucket(motoS3, bucket);
    const fleet: CloudFleet = { tmp, s3: motoS3, bucket, registryPrefix: 'registry/', moto };
    const stageFunctionName = (stage: S) => `kapp-lambda-${id}-${stage}`;
    const bundles = path.join(tmp, 'bundles');
    const [dirs] = await Promise.all([
      bundleFunctions([...stages, 'dispatch'], bundles),
      bundleEntry(
        fileURLToPath(new URL('../../events/forwarder/main.ts', import.meta.url)),
        path.join(bundles, 'forwarder.mjs'),
      ),
    ]);
    // Every stage's queue (a stage function's configuration names them all).
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

    const runRoles = new Map<S, string>();
    const runRoleIds = new Map<S, string>();
    const dispatcherRoleIds = new Map<S, string>();
    const dispatcherSessions = new Map<S, SessionCredentials>();
    const forwarderRoleIds = new Map<string, string>();
    const forwarderSessions = new Map<string, SessionCredentials>();
    const { iam, sts } = motoAdminClients(moto);
    try {
      for (const stage of stages) {
        const run = await createRole(iam, `kapp-disp-${id}-${stage}-run`);
        runRoles.set(stage, run.arn);
        runRoleIds.set(stage, run.id);
        const dispatcher = await createRole(iam, `kapp-disp-${id}-${stage}-dispatcher`);
        dispatcherRoleIds.set(stage, dispatcher.id);
        dispatcherSessions.set(stage, await assumeRole(sts, dispatcher.arn, `dispatch-${stage}`));
      }
      // Each cluster's forwarder role (the stack's ForwarderRoleId<Id>), as a session of it.
      for (const cluster of clusters) {
        const role = await createRole(iam, `kapp-disp-${id}-forwarder-${cluster}`);
        forwarderRoleIds.set(cluster, role.id);
        forwarderSessions.set(cluster, await assumeRole(sts, role.arn, 'forwarder'));
      }
    } finally {
      iam.destroy();
      sts.destroy();
    }
    await shared.applyCrds();
    /** Each cluster's event key (base64), in its registry document and its forwarder's environment. */
    const eventKeys = new Map<string, string>();
    for (const cluster of clusters) {
      await registerCluster(fleet, shared, sharedKubeconfigPath, cluster, [
        '--forwarder-role-id',
        forwarderRoleIds.get(cluster) as string,
      ]);
      // As join does: the cluster's event key, which keys its message groups and deduplication ids.
      eventKeys.set(cluster, await keyCluster(fleet, cluster));
    }

    // The stage functions, behind the tenant router: no credentials of their own, no root key.
    const functions = new Map(
      await Promise.all(
        stages.map(async (stage) => {
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
    const started = await startTenantRouter(
      functions,
      (name, tenant) => {
        // Each environment its own /tmp, as on Lambda.
        const dir = path.join(tmp, 'scratch', name, tenant);
        mkdirSync(dir, { recursive: true });
        return { KAPP_LAMBDA_TMP_DIR: dir, ...opts.tenantEnv?.(name, tenant) };
      },
      opts.onInvoke,
    );
    router = started;
    const senders = stages.map((st) => `${st}=${runRoleIds.get(st)}`).join(',');
    for (const stage of stages) {
      const cwd = path.join(tmp, 'dispatch', stage);
      await mkdir(cwd, { recursive: true });
      const session = dispatcherSessions.get(stage) as SessionCredentials;
      const rie = await startRie({
        bundle: path.join(dirs.dispatch, 'index.mjs'),
        cwd,
        timeoutSeconds: dispatcherTimeoutSeconds(stage),
        memoryMiB: DISPATCHER_MEMORY_MIB,
        env: {
          AWS_REGION: moto.region,
          AWS_ACCESS_KEY_ID: session.accessKeyId,
          AWS_SECRET_ACCESS_KEY: session.secretAccessKey,
          AWS_SESSION_TOKEN: session.sessionToken,
          AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true',
          KAPP_LAMBDA_DISPATCH_STAGE: stage,
          KAPP_LAMBDA_RUN_ROLE_ARN: runRoles.get(stage) ?? '',
          KAPP_LAMBDA_STAGE_FUNCTION: stageFunctionName(stage),
          KAPP_LAMBDA_STS_ENDPOINT: moto.endpoint,
          KAPP_LAMBDA_LAMBDA_ENDPOINT: started.endpoint,
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
          KAPP_LAMBDA_RECEIVER_ROLE_ID: dispatcherRoleIds.get(stage) ?? '',
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
    for (const cluster of clusters) {
      forwarders.push(
        await startForwarder(
          fleet,
          `forwarder-${cluster}`,
          sharedKubeconfigPath,
          {
            FORWARDER_KINDS: opts.forwarderKinds,
            FORWARDER_CLUSTER_ID: cluster,
            FORWARDER_NAMESPACES: cluster,
            // The forwarder reads the queue URLs of the stages its kinds' events go to.
            ...queueUrls,
            FORWARDER_EVENT_KEY: eventKeys.get(cluster) as string,
          },
          forwarderSessions.get(cluster),
        ),
      );
    }
    return {
      fleet,
      sqs,
      router: started,
      dispatchers,
      queues,
      forwarderRoleIds,
      runRoleIds,
      dispatcherRoleIds,
      stageFunctionName,
      describe: (lines = 12) =>
        dispatchers
          .map(
            (d) =>
              `${d.stage} dispatcher: ${String(d.mapping.error ?? '')}\n${rieLogLines(d.rie)
                .slice(-lines)
                .map((l) => JSON.stringify(l))
                .join('\n')}`,
          )
          .join('\n'),
      stop,
    };
  }
}
