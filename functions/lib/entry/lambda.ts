/**
 * The Lambda composition root: from a {@link LambdaConfig} to the {@link EntryDeps} of one
 * stage function. The entry files (`functions/<stage>/index.ts`) call these once per process;
 * nothing here reads the environment.
 *
 * Ports on Lambda: S3 ({@link S3Store}) for artifacts, SQS FIFO ({@link SqsEventSender}) for
 * hand-offs, the command runner over the layer's tools at `/opt/bin` (allow-list: the
 * stage's tools only, `STAGE_TOOLS`), pino to stdout (CloudWatch Logs), and a cluster registry
 * (the fleet's documents in S3, {@link fleetClusterRegistry}, or a kubeconfig file) narrowed to
 * what the stage may do ({@link stageClusterRegistry}, {@link FUNCTION_ACCESS}), and with
 * `KAPP_LAMBDA_SENDER_CHECK=registry` the check that an event naming a cluster came from that
 * cluster's forwarder or a fleet function ({@link senderCheckOf}, `./sender.ts`).
 *
 * @module
 */

import { existsSync } from 'node:fs';
import path from 'node:path';
import { targetFunction } from '../../../events/schema.js';
import { sessionReadsKey } from '../../../infra/aws/run-policy.js';
import type { PipelineStage } from '../api/functions.js';
import type { ClusterKeyring } from '../artifact/keyring.js';
import type { OrphanSweeper } from '../exec/orphans.js';
import { dirBinResolver, STAGE_TOOLS } from '../exec/runner.js';
import { type BearerSource, DirSecretStore, SecretsManagerSecretStore } from '../kube/bearer.js';
import { StoreClusterRegistry } from '../kube/fleet-registry.js';
import { kubeconfigFileRegistry, UnsupportedKubeconfigError } from '../kube/kubeconfig-plain.js';
import { type ClusterRegistry, UnknownClusterError } from '../kube/port.js';
import { RunLeases, StageShares } from '../lease/index.js';
import type { Logger } from '../log.js';
import { EmfReconcileMetrics } from '../observe/metrics.js';
import { createPipelineDeps } from '../pipeline/compose.js';
import type { DispatchDeps } from '../pipeline/deps.js';
import { ReportingRollouts, type RolloutReports } from '../rollout/access.js';
import { domainScopedStore } from '../store/domain.js';
import { LocalDirStore } from '../store/local.js';
import type { ObjectStore } from '../store/port.js';
import { S3Store } from '../store/s3.js';
import { type EventSender, type MessageRequeuer, sendAll } from '../transport/port.js';
import { SqsEventSender, SqsMessageDeleter, SqsMessageRequeuer, SqsRecordProver } from '../transport/sqs.js';
import {
  type ClusterRegistryConfig,
  CONTROLLER_VERSION,
  ConfigError,
  type LambdaConfig,
  SHARING_NEEDS_DISPATCHED,
} from './config.js';
import type { RunCredentialHolder } from './dispatched.js';
import { type AwsClients, createLambdaLogger, lazyDefaultProvider, lazySendClient } from './lambda-base.js';
import { type SenderPolicy, senderRefusal, sendingAs } from './sender.js';
import type { EntryDeps } from './stage-handler.js';

export { type AwsClients, createLambdaLogger, lazyAwsClients, lazySendClient } from './lambda-base.js';

/** What a function may do in the clusters it serves, beyond the FetchView every function holds. */
export interface FunctionAccess {
  /** The DeployView: finalizers, ServiceAccount TokenRequests, objects of any kind it deploys. */
  deployView: boolean;
  /**
   * The InstallView: list Packages, write Apps and placeholder Secrets, finalizers and status
   * of PackageInstalls, the server version (`kubernetesVersionSelection`). No tokens, no watch.
   */
  installView: boolean;
}

/**
 * Per function, what it may do (DESIGN.md "Credentials"): fetch and template get only the
 * FetchView (kapp-controller's sidecar boundary); deploy also the DeployView (kapp with the App's
 * own ServiceAccount); index-repo the DeployView (kapp with a token of the runtime namespace's
 * `kapp-lambda-pkgr`, where upstream deploys a PackageRepository's packages as the controller:
 * `NewKappPrivilegedForPackageRepository`) and the InstallView for one call, creating the
 * repository's placeholder Secret `<name>-fetch-0` (upstream's controller creates it with its
 * own identity); install only the InstallView (it writes the App; the App's own ServiceAccount
 * deploys it). No function hands its own identity to a tool.
 */
export const FUNCTION_ACCESS: Readonly<Record<PipelineStage, FunctionAccess>> = {
  fetch: { deployView: false, installView: false },
  template: { deployView: false, installView: false },
  deploy: { deployView: true, installView: false },
  'index-repo': { deployView: true, installView: true },
  install: { deployView: false, installView: true },
};

/**
 * Narrows a registry to what a stage function may use ({@link FUNCTION_ACCESS}): every function
 * gets `fetchView` (read the object and its referenced Secrets/ConfigMaps, write status); deploy
 * and index-repo also get `deployView`, install and index-repo `installView`. No function gets `client` or
 * `watchView`. A denied call throws `Error('the <stage> function may not use <what>')`, which
 * fails the record (a registry without an install view leaves `installView` absent).
 */
export function stageClusterRegistry(registry: ClusterRegistry, stage: PipelineStage): ClusterRegistry {
  const deny = (what: string) => (): never => {
    throw new Error(`the ${stage} function may not use ${what}`);
  };
  const installView = registry.installView?.bind(registry);
  return {
    clusterIds: () => registry.clusterIds(),
    ...(registry.prepare ? { prepare: registry.prepare.bind(registry) } : {}),
    // Every function reports its reconciles as Events on the object (`../observe/`).
    ...(registry.eventWriter ? { eventWriter: registry.eventWriter.bind(registry) } : {}),
    fetchView: (clusterId) => registry.fetchView(clusterId),
    deployView: FUNCTION_ACCESS[stage].deployView
      ? (clusterId) => registry.deployView(clusterId)
      : deny('deploy credentials'),
    client: deny('a full cluster client'),
    watchView: deny('the watch view'),
    ...(installView
      ? { installView: FUNCTION_ACCESS[stage].installView ? installView : deny('the install view') }
      : {}),
    // What the install function checks the global namespace's Packages against (a fact, no access).
    ...(registry.packagingGlobalNamespaceUid
      ? { packagingGlobalNamespaceUid: registry.packagingGlobalNamespaceUid.bind(registry) }
      : {}),
  };
}

/**
 * Narrows a registry to one cluster, for a function of a cell (`KAPP_LAMBDA_CELL_CLUSTER`): its
 * views of any other cluster id throw {@link UnknownClusterError}, `clusterIds` lists at most that
 * one, and `prepare` of another id loads nothing (so the source poll skips another cluster's
 * members without reading its document, which the cell's role may not read). The sender check
 * refuses an event naming another cluster before any of this is reached; this keeps the
 * fleet-wide paths (the source poll's members) to the cell as well.
 */
export function cellClusterRegistry(registry: ClusterRegistry, clusterId: string): ClusterRegistry {
  return oneClusterRegistry(registry, () => clusterId);
}

/**
 * Narrows a registry to the cluster of a stage function behind the dispatcher: the one its
 * {@link RunCredentialHolder} took from the first batch (tenant isolation keeps an environment to
 * one cluster). As {@link cellClusterRegistry}, but the id is read on each call: before a batch
 * was accepted every id is unknown ({@link UnknownClusterError}), after it every id but that one.
 */
export function tenantClusterRegistry(
  registry: ClusterRegistry,
  holder: Pick<RunCredentialHolder, 'clusterId'>,
): ClusterRegistry {
  return oneClusterRegistry(registry, () => holder.clusterId);
}

/** {@link cellClusterRegistry} with the one cluster's id read on each call (`undefined`: none yet). */
function oneClusterRegistry(registry: ClusterRegistry, served: () => string | undefined): ClusterRegistry {
  const only =
    <T>(view: (id: string) => T) =>
    (id: string): T => {
      if (id !== served()) throw new UnknownClusterError(id);
      return view(id);
    };
  const installView = registry.installView?.bind(registry);
  const eventWriter = registry.eventWriter?.bind(registry);
  const prepare = registry.prepare?.bind(registry);
  const globalUid = registry.packagingGlobalNamespaceUid?.bind(registry);
  return {
    clusterIds: () => registry.clusterIds().filter((id) => id === served()),
    client: only((id) => registry.client(id)),
    fetchView: only((id) => registry.fetchView(id)),
    deployView: only((id) => registry.deployView(id)),
    watchView: only((id) => registry.watchView(id)),
    ...(installView ? { installView: only(installView) } : {}),
    ...(eventWriter ? { eventWriter: only(eventWriter) } : {}),
    ...(prepare ? { prepare: async (id: string) => (id === served() ? await prepare(id) : undefined) } : {}),
    ...(globalUid ? { packagingGlobalNamespaceUid: only(globalUid) } : {}),
  };
}

/**
 * The clusters a function serves: every context (or `clusterContexts`) of the kubeconfig at
 * `kubeconfigPath`, cluster id = context name, each over the plain transports
 * (`../kube/kubeconfig-plain.ts`: no client-node in the function bundles). They speak client
 * certificates, tokens and token files, exec plugins, basic auth, impersonation and an
 * `auth-provider`'s stored token; `proxy-url` is refused at start.
 *
 * This is the local and emulator setup; a fleet uses {@link fleetClusterRegistry} instead
 * (`KAPP_LAMBDA_CLUSTER_REGISTRY`). Whatever the source, fetch and template only ever see the
 * FetchView ({@link stageClusterRegistry}).
 *
 * @throws Error `loading kubeconfig <path>` when the file cannot be read or parsed (its
 *   contents are never quoted).
 * @throws ConfigError `KAPP_LAMBDA_KUBECONFIG: context "<name>" uses <feature>, which the
 *   functions do not support` (the feature's field name only).
 */
export function kubeconfigClusterRegistry(
  config: Pick<LambdaConfig, 'stage' | 'kubeconfigPath' | 'clusterContexts'>,
): ClusterRegistry {
  try {
    return kubeconfigFileRegistry(config.kubeconfigPath, config.clusterContexts);
  } catch (e) {
    if (!(e instanceof UnsupportedKubeconfigError)) throw e;
    throw new ConfigError(config.stage, [
      `KAPP_LAMBDA_KUBECONFIG: context ${JSON.stringify(e.context)} uses ${e.feature}, which the functions do not support`,
    ]);
  }
}

/**
 * The clusters a function serves from the fleet's cluster registry
 * (`KAPP_LAMBDA_CLUSTER_REGISTRY`, `../kube/fleet-registry.ts`), as the function's own stage
 * identity: on EKS the function role (the SDK's default credentials, or `clients.credentials`;
 * mapped in each cluster by an access entry to `kapp-lambda:<stage>`), or behind the dispatcher
 * `eksTokens`, the token its batch carries (the dispatcher's role's, D15), otherwise the stage's ServiceAccount token from Secrets Manager (or a
 * directory), read with `clients.credentials` likewise. Documents are read from S3 with the
 * function's S3 client (any bucket the role may read), or from a local directory.
 */
export function fleetClusterRegistry(
  config: Pick<LambdaConfig, 'stage' | 'region' | 's3Endpoint' | 'secretsManagerEndpoint'> & {
    clusterRegistry: ClusterRegistryConfig;
  },
  clients: Pick<AwsClients, 's3' | 'credentials'>,
  eksTokens?: BearerSource,
): StoreClusterRegistry {
  const { location, secrets, ttlMs } = config.clusterRegistry;
  return new StoreClusterRegistry({
    store:
      location.kind === 's3'
        ? new S3Store({ client: clients.s3, bucket: location.bucket, prefix: location.prefix })
        : new LocalDirStore(location.root),
    stage: config.stage,
    // Behind the dispatcher an `eks` cluster's token is the batch's, and nothing here signs one.
    ...(eksTokens ? { eksTokens } : { credentials: clients.credentials ?? lazyDefaultProvider() }),
    secrets:
      secrets.kind === 'dir'
        ? new DirSecretStore(secrets.root)
        : new SecretsManagerSecretStore(
            lazySendClient(async () =>
              (await import('./secrets-client.js')).createSecretsManagerClient(config, clients.credentials),
            ),
          ),
    ttlMs,
  });
}

/** Overrides of {@link createLambdaDeps} (tests, or a different cluster source). */
export interface LambdaDepsOverrides {
  /** Default {@link createLambdaLogger}. */
  log?: Logger;
  /** Default {@link kubeconfigClusterRegistry} (un-narrowed; narrowing is always applied). */
  clusters?: ClusterRegistry;
  /** Default an {@link SqsEventSender} over `clients.sqs` and `config.queueUrls`. */
  sender?: EventSender;
  /** Default `() => new Date()`. */
  now?: () => Date;
  /**
   * Keys sealing private artifacts. Default none: a run that would store content made from
   * Secrets then fails (never stores it in the clear). `lambdaEntry` (`./main.ts`) passes one to
   * every function that `usesArtifactKey`.
   */
  keyring?: ClusterKeyring;
  /**
   * Kills what tool runs leave outside their process groups (`../exec/orphans.ts`). Default none;
   * `lambdaEntry` passes the process's one sweeper, having made the process the child subreaper.
   */
  orphans?: OrphanSweeper;
  /**
   * Sends parked and postponed records back to the function's own queue (the fair shares,
   * `../lease/shares.ts`; the records the function deadline held back). Default the SQS adapter
   * over the function's own queue URL (`SqsMessageRequeuer`); without either the function runs
   * with no shares, whatever `KAPP_LAMBDA_CLUSTER_SHARE` says.
   */
  requeuer?: MessageRequeuer;
  /**
   * The run credential holder of a stage behind the dispatcher (`config.dispatched`): the
   * registry is narrowed to its cluster ({@link tenantClusterRegistry}), and with
   * `config.sharing` `cluster` the store to its sharing domain (`domainTag`); an `eks` cluster's
   * token is its `eksToken` (the registry signs none). Required then.
   */
  tenant?: Pick<RunCredentialHolder, 'clusterId' | 'domainTag' | 'eksToken' | 'rolloutView'>;
  /**
   * Where the dispatched install stage notes its rollout reports (`ReportingRollouts`, which reads
   * `tenant.rolloutView`): the answer's `rollouts`. Without it the stage reads and writes the
   * rollout records in its store (`StoreRollouts`), as a function on its own role does.
   */
  rolloutReports?: RolloutReports;
}

/**
 * The functions an App's run spans, which take its run lease (`../lease/`): fetch, template and
 * deploy. index-repo and install run their objects in one function each, ordered by its FIFO group.
 */
export const LEASED_STAGES: readonly PipelineStage[] = Object.freeze(['fetch', 'template', 'deploy']);

export { removeLeftoverScratch } from '../exec/scratch.js';
export {
  ARTIFACT_ROOT_KEY_SECRET_ENV,
  artifactKeyringFromEnv,
  LEGACY_ARTIFACT_ROOT_KEY_ENV,
  usesArtifactKey,
} from './artifact-key.js';

/**
 * Builds the dependencies of one stage function (the deps factory of `lambdaEntry`'s handler) with
 * `createPipelineDeps`: the stage's tools in the layer's bin dir, S3, the stage-narrowed
 * registry (discovery uses the un-narrowed one), the SQS sender, the records run at once
 * (`recordConcurrency`) and, given the function's own queue URL, the early delete of handled
 * records ({@link SqsMessageDeleter}) and the postponement of the records the function deadline
 * held back ({@link SqsMessageRequeuer}).
 *
 * Behind the dispatcher (`config.dispatched`, docs/decisions.md D15): no record proof, sender
 * check, fair shares nor early delete (the dispatcher's), the registry narrowed to the holder's
 * cluster ({@link tenantClusterRegistry}, `overrides.tenant`), and only `overrides.requeuer` (the
 * collecting one of `./dispatched.ts`), never one that sends; the keyring and the clients'
 * credentials are the caller's (`RunCredentialHolder`).
 *
 * @throws Error when the kubeconfig cannot be loaded (see {@link kubeconfigClusterRegistry}), or
 *   in the dispatched mode without `overrides.tenant`.
 */
export function createLambdaDeps(
  config: LambdaConfig,
  clients: AwsClients,
  overrides: LambdaDepsOverrides = {},
): EntryDeps {
  const log = overrides.log ?? createLambdaLogger(config);
  // Behind the dispatcher the record proof, sender check, fair shares and early delete are the
  // dispatcher's (`./dispatched.ts`); the run's session could do none of them.
  const dispatched = config.dispatched === true;
  if (dispatched && !overrides.tenant) {
    throw new Error('the dispatched mode needs the run credential holder (overrides.tenant)');
  }
  const fleet =
    overrides.clusters || !config.clusterRegistry
      ? undefined
      : fleetClusterRegistry(
          { ...config, clusterRegistry: config.clusterRegistry },
          clients,
          dispatched ? overrides.tenant?.eksToken : undefined,
        );
  const all = overrides.clusters ?? fleet ?? kubeconfigClusterRegistry(config);
  const cell = config.senderCheck?.cell;
  const registry = overrides.tenant
    ? tenantClusterRegistry(all, overrides.tenant)
    : cell === undefined
      ? all
      : cellClusterRegistry(all, cell);
  const tenant = dispatched ? overrides.tenant : undefined;
  const store = sharingStore(
    config,
    new S3Store({
      client: clients.s3,
      bucket: config.bucket,
      prefix: config.bucketPrefix,
      // The run's session may read, not list, the shared blobs: S3 answers a missing one 403.
      ...(tenant ? { absentWhenDenied: (key: string) => tenantReadsKey(config, tenant, key) } : {}),
    }),
    overrides.tenant,
  );
  const pipeline: DispatchDeps = createPipelineDeps({
    clusters: stageClusterRegistry(registry, config.stage),
    discovery: registry,
    store,
    ...(overrides.keyring ? { keyring: overrides.keyring } : {}),
    log,
    ...(overrides.now ? { now: overrides.now } : {}),
    stage: config.stage,
    // kapp-controller's reconcile metrics, per cluster, as CloudWatch EMF lines in the function's log.
    ...(config.metrics === 'off'
      ? {}
      : { metrics: new EmfReconcileMetrics({ perObject: config.metrics === 'object' }) }),
    tools: {
      allow: STAGE_TOOLS[config.stage],
      resolveBin: dirBinResolver(config.binDir),
      tmpDir: config.tmpDir,
      // Shipped in every layer's bin/ (layers/build.ts): tools die with the function's process.
      launcher: path.join(config.binDir, 'kl-launch'),
      ...(overrides.orphans ? { orphans: overrides.orphans } : {}),
      // Shipped beside git (fetch, index-repo): git:// goes through the egress proxy.
      ...(existsSync(path.join(config.binDir, 'kl-connect'))
        ? { connector: path.join(config.binDir, 'kl-connect') }
        : {}),
    },
    config: {
      tmpRoot: config.tmpDir,
      toolVersions: config.toolVersions,
      controllerVersion: CONTROLLER_VERSION,
      kappDeployRawOptions: config.kappDeployRawOptions,
      kubeApi: config.kubeApi,
      timer: config.timer,
      urlPolicy: config.urlPolicy,
      ...(config.dangerousSkipTLSVerify ? { dangerousSkipTLSVerify: config.dangerousSkipTLSVerify } : {}),
      ...(config.toolTimeoutMs === undefined ? {} : { toolTimeoutMs: config.toolTimeoutMs }),
      ...(config.maxDeployWaitMs === undefined ? {} : { maxDeployWaitMs: config.maxDeployWaitMs }),
      ...(config.maxInlineBytes === undefined ? {} : { maxInlineBytes: config.maxInlineBytes }),
      ...(config.fetchStall ? { fetchStall: config.fetchStall } : {}),
      ...(config.controllerConfigNamespace ? { controllerConfigNamespace: config.controllerConfigNamespace } : {}),
    },
    ...(config.controllerConfigTtlMs === undefined ? {} : { controllerConfigTtlMs: config.controllerConfigTtlMs }),
  });
  // Behind the dispatcher, install runs gate with the view their batch brought and report the rest.
  if (tenant && config.stage === 'install' && overrides.rolloutReports) {
    const view = tenant;
    pipeline.rollouts = new ReportingRollouts(() => view.rolloutView, store, overrides.rolloutReports);
  }
  // Deduplication ids keyed per cluster (`dedupId`, ../transport/sqs.ts): the registry document's
  // `eventKey`, so no other cluster's forwarder can predict one and spend it first.
  const sender =
    overrides.sender ??
    new SqsEventSender({
      client: clients.sqs,
      queueUrls: config.queueUrls,
      ...(fleet ? { dedupKeyOf: (clusterId: string) => fleet.eventKeyOf(clusterId) } : {}),
    });
  const checkSender = dispatched ? undefined : senderCheckOf(config, fleet);
  // The fan-outs (install, the source poll) send only what their function sends, as hand-offs do.
  const emitter = sendingAs(config.stage, sender);
  pipeline.emit = async (events) => {
    // A source poll's pokes of many members leave as SendMessageBatch requests (10 a request).
    await sendAll(
      emitter,
      events.map((event) => ({ stage: targetFunction(event), event })),
    );
  };
  // A registry that looks clusters up at run time loads the record's cluster before the stage.
  const prepare = registry.prepare?.bind(registry);
  // The functions of an App's run share its run lease (in the artifact bucket).
  const leases = LEASED_STAGES.includes(config.stage)
    ? new RunLeases({ store, ...(overrides.now ? { now: overrides.now } : {}) })
    : undefined;
  // With its own queue's URL the function deletes what it handled before the invocation returns,
  // sends back there what the function deadline held back (postponed, not failed), and proves
  // each record is that queue's before the sender check trusts its SenderId (the configuration
  // requires the URL with the check).
  const ownQueue = config.queueUrls[config.stage];
  // Every stage function shares its slots fairly across clusters and their namespaces (parked
  // records and the per-cluster documents live in the artifact bucket, under state/shares/).
  const requeuer =
    overrides.requeuer ?? (ownQueue && !dispatched ? new SqsMessageRequeuer(clients.sqs, ownQueue) : undefined);
  const shares =
    config.shares && requeuer && !dispatched
      ? new StageShares({
          store,
          requeuer,
          clusterShare: config.shares.cluster,
          namespaceShare: config.shares.namespace,
          ...(overrides.now ? { now: () => (overrides.now as () => Date)().getTime() } : {}),
        })
      : undefined;
  return {
    pipeline,
    sender,
    log,
    maxAttempts: config.maxReceiveCount,
    recordConcurrency: config.recordConcurrency,
    ...(ownQueue && !dispatched ? { deleter: new SqsMessageDeleter(clients.sqs, ownQueue) } : {}),
    ...(requeuer && (ownQueue || dispatched) ? { requeuer } : {}),
    ...(prepare ? { prepare } : {}),
    ...(checkSender && ownQueue ? { checkSender, prover: new SqsRecordProver(clients.sqs, ownQueue) } : {}),
    // The senders above key each cluster's groups with its registry document's key: so does the check.
    ...(fleet ? { groupKeyOf: (clusterId: string) => fleet.eventKeyOf(clusterId) } : {}),
    ...(config.acceptUnkeyedGroups ? { acceptUnkeyed: true } : {}),
    ...(leases ? { leases } : {}),
    ...(shares ? { shares } : {}),
  };
}

/**
 * Whether the dispatched stage's run session may read `key` of the artifact bucket
 * (`sessionReadsKey`, `infra/aws/run-policy.ts`) for the cluster whose batch it holds: a 403 on
 * such a key is a missing key. None before a batch brought the cluster (no session yet), and none
 * under a bucket prefix the session policy does not know of.
 */
function tenantReadsKey(
  config: Pick<LambdaConfig, 'stage' | 'sharing' | 'bucketPrefix'>,
  tenant: Pick<RunCredentialHolder, 'clusterId' | 'domainTag'>,
  key: string,
): boolean {
  const { clusterId, domainTag } = tenant;
  if (clusterId === undefined || domainTag === undefined || config.bucketPrefix) return false;
  return sessionReadsKey(config.stage, clusterId, domainTag, config.sharing ?? 'fleet')(key);
}

/**
 * The stage's store in its sharing domain (docs/decisions.md D17): with `config.sharing`
 * `cluster`, `store` seen through {@link domainScopedStore} under the holder's keyring tag (the
 * claims under `d/<tag>/`, which the run's session policy alone grants it); else `store` itself.
 * The tag is read on each operation: an operation on a claim before a batch brought sealing keys
 * (none yet, or a dispatcher that derives none) rejects.
 *
 * @throws ConfigError when `cluster` is asked for outside the dispatched mode (no session fences
 *   the domain there: every cluster's runs share one role), or without the holder.
 */
export function sharingStore(
  config: Pick<LambdaConfig, 'stage' | 'sharing' | 'dispatched'>,
  store: ObjectStore,
  tenant: Pick<RunCredentialHolder, 'domainTag'> | undefined,
): ObjectStore {
  if (config.sharing !== 'cluster') return store;
  if (config.dispatched !== true || !tenant) {
    throw new ConfigError(config.stage, [SHARING_NEEDS_DISPATCHED]);
  }
  return domainScopedStore(store, () => {
    const tag = tenant.domainTag;
    if (tag === undefined) throw new Error("no sharing domain: no batch has brought its cluster's keys");
    return tag;
  });
}

/**
 * The handler's sender check (`./sender.ts`) for `KAPP_LAMBDA_SENDER_CHECK=registry`: the
 * configured function role ids, each bound to the functions it runs (a role shared by two
 * functions may send what either sends; the function's own role, besides, its postponed copies),
 * and each cluster's forwarder from the fleet registry.
 *
 * @throws ConfigError when the check is asked for but the function's clusters do not come from
 *   the fleet registry (an override): it would otherwise silently take every sender.
 */
export function senderCheckOf(
  config: Pick<LambdaConfig, 'stage' | 'senderCheck'>,
  fleet: Pick<StoreClusterRegistry, 'forwarderOf'> | undefined,
): EntryDeps['checkSender'] {
  if (!config.senderCheck) return undefined;
  if (!fleet) {
    throw new ConfigError(config.stage, ['KAPP_LAMBDA_SENDER_CHECK: registry needs the fleet cluster registry']);
  }
  const functionSenders = new Map<string, PipelineStage[]>();
  for (const { stage, roleId } of config.senderCheck.functionSenders) {
    functionSenders.set(roleId, [...(functionSenders.get(roleId) ?? []), stage]);
  }
  const policy: SenderPolicy = {
    functionSenders,
    // Its own role may send it its postponed copies (`./sender.ts`).
    receiver: config.stage,
    ...(config.senderCheck.cell === undefined ? {} : { cell: config.senderCheck.cell }),
    forwarderOf: (clusterId) => fleet.forwarderOf(clusterId),
  };
  return (event, senderId) => senderRefusal(policy, event, senderId);
}
