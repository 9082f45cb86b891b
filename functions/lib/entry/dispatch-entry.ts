/**
 * The composition of a dispatcher function (the shared mode, docs/decisions.md D15;
 * `functions/dispatch/index.ts`): from its environment ({@link parseDispatcherEnv}) to
 * {@link makeDispatcher}'s ports on AWS. The artifact root key is read at cold start (the
 * dispatcher derives each cluster's sealing keys and tag from it); the AWS SDK's modules load on
 * the first call that sends (`./lambda-base.ts`, `./dispatch-clients.ts`).
 *
 * What it holds, and what it does not: its role's own credentials (its queue, the registry's
 * documents, `state/shares/`, for index-repo the source poll records (read), for fetch and
 * index-repo the poll members (`state/poll-members/`, `cluster` sharing), the root key (not
 * install's), `sts:AssumeRole` on the run role, the invoke of the
 * stage function). For an `eks` cluster it signs the run's EKS token with its own role
 * ({@link eksTokenMinter}: in the shared stack the clusters' access entries map the dispatcher
 * roles, not the run roles, so a run session cannot sign a token any cluster accepts); it never
 * reads a `token` cluster's ServiceAccount token: its registry reads documents only (the sender
 * check's forwarders, the `eks` clusters' names), with a secret store and AWS credentials that
 * refuse. It runs no tool and loads none of the pipeline (`test/unit/dispatch-entry.test.ts`
 * holds its bundle to that).
 *
 * @module
 */
import type { AwsCredentialIdentityProvider } from '@smithy/types';
import type { PipelineStage } from '../api/functions.js';
import type { ClusterKeyring } from '../artifact/keyring.js';
import { signEksToken } from '../kube/bearer.js';
import { StoreClusterRegistry } from '../kube/fleet-registry.js';
import { StageShares } from '../lease/shares.js';
import type { Logger } from '../log.js';
import { S3Store } from '../store/s3.js';
import { SqsEventSender, SqsMessageDeleter, SqsMessageRequeuer, SqsRecordProver } from '../transport/sqs.js';
import { artifactKeyringFromEnv, usesArtifactKey } from './artifact-key.js';
import { type DispatcherConfig, parseDispatcherEnv } from './config.js';
import {
  type DispatcherDeps,
  type EksTokenMinter,
  makeDispatcher,
  POLL_MEMBER_STAGES,
  StorePollMembers,
  sourcePollClusters,
} from './dispatch.js';
import { LambdaStageInvoker, StsRunCredentials } from './dispatch-aws.js';
import type { DispatchSdk } from './dispatch-clients.js';
import { RolloutCoordinator } from './dispatch-rollouts.js';
import { type AwsClients, createLambdaLogger, lazyAwsClients, lazyDefaultProvider } from './lambda-base.js';
import { lambdaBootstrap } from './runtime-api.js';
import { senderRefusal } from './sender.js';

/** Overrides of {@link createDispatcherDeps} (tests). */
export interface DispatcherDepsOverrides {
  /** Default {@link createLambdaLogger} with `dispatcher: true` on every line. */
  log?: Logger;
  /** Default the clients of `./dispatch-clients.ts`, made on the first call. */
  sdk?: DispatchSdk;
  /** The dispatcher role's own credentials, which sign `eks` clusters' tokens. Default the SDK's default chain. */
  credentials?: AwsCredentialIdentityProvider;
}

/**
 * The {@link EksTokenMinter} of a dispatcher: the cluster's `eks` auth from its registry
 * document (`StoreClusterRegistry.eksAuthOf`), signed at each call with `credentials` (the
 * dispatcher role's) by `signEksToken` (local SigV4 presigning; `GetCallerIdentity` needs no IAM
 * permission). A `token` cluster (or an unknown one) gets none.
 */
export function eksTokenMinter(
  registry: Pick<StoreClusterRegistry, 'eksAuthOf'>,
  credentials: AwsCredentialIdentityProvider,
  now: () => Date = () => new Date(),
): EksTokenMinter {
  return {
    tokenFor: async (clusterId) => {
      const auth = await registry.eksAuthOf(clusterId);
      if (!auth) return undefined;
      return signEksToken(await credentials(), auth.clusterName, auth.region, now());
    },
  };
}

/** The dispatcher's STS and Lambda calls, their SDK module loaded on the first call. */
function lazyDispatchSdk(config: DispatcherConfig): DispatchSdk {
  let sdk: Promise<DispatchSdk> | undefined;
  const made = () => (sdk ??= import('./dispatch-clients.js').then((m) => m.createDispatchSdk(config)));
  return {
    assumeRole: async (input) => await (await made()).assumeRole(input),
    invoke: async (input) => await (await made()).invoke(input),
  };
}

/**
 * The `private/` tag every cluster gets from {@link UNSEALED_KEYRING}: 32 zeros. No cluster's
 * real tag (an HMAC of its id under the root key) is expected to be it, and the session it names
 * reaches no bucket key anyway.
 */
export const UNSEALED_TAG = '0'.repeat(32);

/**
 * The keyring of the dispatcher of a stage that seals nothing (install, `usesArtifactKey`): each
 * cluster's keys are {@link UNSEALED_TAG} and no key bytes. Such a stage's run session names no
 * key a tag fences (`runSessionPolicy`: install's reaches its cluster's `state/fleet/<id>/` and
 * `receipts/<id>/` and the shared renders, none under `private/` or `d/`), and the batch
 * carries no sealing keys (`makeDispatcher`): so that dispatcher never reads the artifact root
 * key, and the stack gives it neither the key's variable nor its secret.
 */
export const UNSEALED_KEYRING: ClusterKeyring = {
  keysFor: async () => ({ tag: UNSEALED_TAG, encKey: Buffer.alloc(0), macKey: Buffer.alloc(0) }),
};

/** Refuses every ask: the dispatcher holds no cluster's identity. */
const NO_CLUSTER_IDENTITY = async (): Promise<never> => {
  throw new Error("the dispatcher reads no cluster's credentials (a run session of the cluster does)");
};

/**
 * Builds the ports of a dispatcher: its stage's queue (record proof, early delete, requeue), the
 * fair shares in the artifact bucket, the sender check over the registry's documents (run roles'
 * sessions bound to their cluster, the dispatcher's own role as the sender of its copies), the
 * run sessions (`StsRunCredentials` of the run role, under `runSessionPolicy` of the bucket and
 * registry configured), the stage function's invoke, for index-repo the source poll's member
 * clusters, in `cluster` sharing, for fetch and index-repo, the poll membership the runs answer,
 * and the `eks` clusters' run tokens ({@link eksTokenMinter} with the dispatcher's credentials).
 */
export function createDispatcherDeps(
  config: DispatcherConfig,
  clients: AwsClients,
  keyring: ClusterKeyring,
  overrides: DispatcherDepsOverrides = {},
): DispatcherDeps {
  const log = overrides.log ?? createLambdaLogger(config).child({ dispatcher: true });
  const sdk = overrides.sdk ?? lazyDispatchSdk(config);
  const store = new S3Store({ client: clients.s3, bucket: config.bucket, prefix: config.bucketPrefix });
  const { location } = config.clusterRegistry;
  const registry = new StoreClusterRegistry({
    store: new S3Store({ client: clients.s3, bucket: location.bucket, prefix: location.prefix }),
    stage: config.stage,
    credentials: NO_CLUSTER_IDENTITY,
    secrets: { read: NO_CLUSTER_IDENTITY },
    ttlMs: config.clusterRegistry.ttlMs,
  });
  const requeuer = new SqsMessageRequeuer(clients.sqs, config.queueUrl);
  const check = config.senderCheck;
  const functionSenders = new Map<string, PipelineStage[]>();
  for (const { stage, roleId } of check?.functionSenders ?? []) {
    functionSenders.set(roleId, [...(functionSenders.get(roleId) ?? []), stage]);
  }
  return {
    log,
    keyring,
    eksTokens: eksTokenMinter(registry, overrides.credentials ?? lazyDefaultProvider()),
    credentials: new StsRunCredentials({
      assumeRole: (input) => sdk.assumeRole(input),
      roleArn: () => config.runRoleArn,
      target: {
        partition: config.partition,
        region: config.region,
        account: config.account,
        bucket: config.bucket,
        registry: { bucket: location.bucket, prefix: location.prefix },
        ...(config.sharing ? { sharing: config.sharing } : {}),
      },
    }),
    invoker: new LambdaStageInvoker({ invoke: (input) => sdk.invoke(input), functionName: () => config.stageFunction }),
    requeuer,
    deleter: new SqsMessageDeleter(clients.sqs, config.queueUrl),
    // The senders key each cluster's groups with its registry document's key: so does the check.
    groupKeyOf: (clusterId: string) => registry.eventKeyOf(clusterId),
    ...(config.acceptUnkeyedGroups ? { acceptUnkeyed: true } : {}),
    ...(check
      ? {
          prover: new SqsRecordProver(clients.sqs, config.queueUrl),
          checkSender: (event, senderId) =>
            senderRefusal(
              {
                functionSenders,
                receiver: config.stage,
                receiverRoleId: check.receiverRoleId,
                runSessions: true,
                forwarderOf: (clusterId) => registry.forwarderOf(clusterId),
              },
              event,
              senderId,
            ),
        }
      : {}),
    ...(config.shares
      ? {
          shares: new StageShares({
            store,
            requeuer,
            clusterShare: config.shares.cluster,
            namespaceShare: config.shares.namespace,
          }),
        }
      : {}),
    ...(config.stage === 'index-repo' ? { pollClusters: () => sourcePollClusters(store, config.sharing) } : {}),
    // The fleet's rollouts: install runs report, this dispatcher starts, evaluates and pokes.
    ...(config.stage === 'install'
      ? {
          rollouts: new RolloutCoordinator({
            store,
            log,
            poke: async (events) => {
              await new SqsEventSender({
                client: clients.sqs,
                queueUrls: { install: config.queueUrl },
                dedupKeyOf: (clusterId) => registry.eventKeyOf(clusterId),
              }).sendMany('install', events);
            },
          }),
        }
      : {}),
    // `cluster` sharing: the member clusters are what the fetch and index-repo runs answered.
    ...(config.sharing === 'cluster' && POLL_MEMBER_STAGES.includes(config.stage)
      ? {
          pollMembers: new StorePollMembers(store),
          registered: async (clusterId: string) => (await registry.forwarderOf(clusterId)) !== undefined,
        }
      : {}),
  };
}

/**
 * Everything the dispatcher's entry file does: install the bootstrap (when the bundle is its own
 * process), read the configuration once from `env`, read the artifact root key (cold start; not
 * for install, which seals nothing: {@link UNSEALED_KEYRING}), build the handler, and start the Runtime API loop when the bundle is the main module. The ports
 * ({@link createDispatcherDeps}) are made on the first invocation.
 *
 * @throws ConfigError (via the bootstrap's fatal handler when main) for a bad configuration.
 */
export function dispatcherEntry(
  moduleUrl: string,
  argv1: string | undefined,
  env: Readonly<Record<string, string | undefined>>,
): ReturnType<typeof makeDispatcher> {
  const bootstrap = lambdaBootstrap({ moduleUrl, argv1, runtimeApi: env.AWS_LAMBDA_RUNTIME_API });
  const config = parseDispatcherEnv(env);
  // A sealing stage's run session is fenced by its cluster's tag (`private/<tag>/`) and gets the
  // cluster's keys, both derived from the root key; install's reaches no bucket key and gets none.
  const rootKeyring = usesArtifactKey(config.stage)
    ? artifactKeyringFromEnv(config.stage, env, async () =>
        (await import('./secrets-client.js')).createSecretsManagerClient(config),
      )
    : undefined;
  rootKeyring?.warm();
  const keyring = rootKeyring ?? UNSEALED_KEYRING;
  let dispatch: ReturnType<typeof makeDispatcher> | undefined;
  const handler: ReturnType<typeof makeDispatcher> = async (event, context) => {
    dispatch ??= makeDispatcher(config.stage, createDispatcherDeps(config, lazyAwsClients(config), keyring));
    return await dispatch(event, context);
  };
  bootstrap.start(handler);
  return handler;
}
