/**
 * The embedded default: forwarder and functions in one process (`npm start`, `npm run demo`,
 * the e2e tests). The composition root: builds the ports (kubeconfig cluster registry, local
 * directory object store, the cached tools, pino logger), hands them to `createPipelineDeps`
 * (the builder the Lambda functions share) and wires one forwarder per cluster into the
 * in-process {@link EmbeddedPipeline}. The same stage handlers run unchanged on Lambda, where
 * each entry file brings its own ports.
 *
 * Per cluster, a Lease election (`leadership.ts`) decides which of several runtimes pointed at
 * it acts: only the leader runs that cluster's forwarder and starts its stages.
 */

import { randomBytes } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync } from 'node:fs';
import { hostname } from 'node:os';
import path from 'node:path';
import { Counter } from 'prom-client';
import { Forwarder } from '../../events/forwarder/forwarder.js';
import { type WatchedKindName, watchedKinds } from '../../events/forwarder/kinds.js';
import type { LeaderElector } from '../../events/forwarder/leader.js';
import { ClusterLeadership, DEFAULT_LEASE_NAMESPACE, leaseNameFor } from '../../events/forwarder/leadership.js';
import type { Transport } from '../../events/forwarder/transport.js';
import { COMPONENTS } from '../../layers/manifest.js';
import {
  CONNECTOR_NAME,
  connectorPath,
  hardenAddonPath,
  LAUNCHER_NAME,
  launcherPath,
  SSH_PASSWD_NAME,
} from '../../layers/native.js';
import { type ClusterKeyring, fileKeyring } from '../lib/artifact/keyring.js';
import { CONTROLLER_VERSION } from '../lib/entry/config.js';
import { hardenProcess } from '../lib/exec/harden.js';
import { createToolMetrics, type ToolMetrics } from '../lib/exec/metrics.js';
import { TOOL_NAMES } from '../lib/exec/runner.js';
import { canSwitchUid, DEFAULT_UID_POOL, ensureTraversable, stageBinaries } from '../lib/exec/sandbox.js';
import type { PlainConnection } from '../lib/kube/kubeconfig-auth.js';
import type { ObjectWatcher } from '../lib/kube/port.js';
import { KubeConfigClusterRegistry } from '../lib/kube/registry.js';
import type { Logger } from '../lib/log.js';
import { PrometheusReconcileMetrics } from '../lib/observe/prometheus.js';
import { createPipelineDeps } from '../lib/pipeline/compose.js';
import type { DispatchDeps, PipelineConfig } from '../lib/pipeline/deps.js';
import { DEFAULT_CONTROLLER_CONFIG_NAMESPACE } from '../lib/reconcile/controller-config.js';
import type { TimerConfig } from '../lib/reconcile/timer.js';
import { LocalDirStore } from '../lib/store/local.js';
import type { ObjectStore } from '../lib/store/port.js';
import { cacheBinResolver } from './bins.js';
import { leaderGatedRegistry } from './leadership.js';
import { EmbeddedPipeline } from './pipeline.js';
import { startRolloutChecker } from './rollout-checker.js';
import { startSourcePoller } from './source-poller.js';

export { CONTROLLER_VERSION };

/** Pinned tool versions (without `v`), keyed by binary, from `layers/manifest.ts`. */
export function pinnedToolVersions(): Record<string, string> {
  const out: Record<string, string> = {};
  for (const c of COMPONENTS) for (const b of c.binaries) out[b.bin] = c.version.replace(/^v/, '');
  return out;
}

/** Kinds the embedded runtime watches by default: those it has a function for. */
export const EMBEDDED_KINDS: readonly WatchedKindName[] = Object.freeze(['App', 'PackageInstall', 'PackageRepository']);

/**
 * Default life of a cached `kapp-controller-config` in the embedded runtime, ms: 5 min. The
 * forwarder's watch invalidates it on change, so reads are only a fallback; with the Lambda
 * default (10 s) a quiet cluster read it twice per 10 s, about 12 API requests a minute.
 */
export const EMBEDDED_CONTROLLER_CONFIG_TTL_MS = 300_000;

/** Options of {@link startEmbedded}. */
export interface EmbeddedOptions {
  /**
   * Kubeconfig whose contexts are the clusters served (cluster id = context name). Required
   * unless {@link inCluster} is given.
   */
  kubeconfigPath?: string;
  /** Serve only these contexts; default all. */
  contexts?: readonly string[];
  /**
   * Serve the cluster this process runs in instead of a kubeconfig's contexts: the connection of
   * `inClusterConnection` (`functions/lib/kube/kubeconfig-auth.ts`, what a Pod gets: the
   * `KUBERNETES_SERVICE_*` address and the ServiceAccount's token and CA), cluster id
   * `IN_CLUSTER_ID` (`in-cluster`). Wins over {@link kubeconfigPath}.
   */
  inCluster?: PlainConnection;
  /** Namespaces to watch; default all. */
  namespaces?: readonly string[];
  /**
   * Kinds the forwarders watch. Default {@link EMBEDDED_KINDS} (`App`, `PackageInstall`, `PackageRepository`:
   * the kinds this runtime has functions for).
   */
  kinds?: readonly WatchedKindName[];
  /** Object store; default a {@link LocalDirStore} at `storeDir`. */
  store?: ObjectStore;
  /** Local object store root when `store` is not given. */
  storeDir?: string;
  /** Tool cache root (`~/.cache/kapp-lambda`). */
  cacheRoot: string;
  /**
   * Keys sealing private artifacts (content made from Secrets), per cluster. Default: keys
   * derived from the root key file `<cacheRoot>/keys/artifact-root.key`, created 0600 on first
   * use (outside the store directory, so no object key can name it).
   */
  keyring?: ClusterKeyring;
  /** Scratch directory root. */
  tmpRoot: string;
  log: Logger;
  /** Objects reconciled at once. Default 4. */
  concurrency?: number;
  /**
   * Forwarder tuning (coalescing window, watchdog), ms. `wrapWatcher` is a fault hook for tests:
   * it wraps each cluster's watch view (e.g. to make some watches fail, as lost RBAC would).
   */
  forwarder?: {
    coalesceWindowMs?: number;
    stallTimeoutMs?: number;
    watchTimeoutSeconds?: number;
    wrapWatcher?: (view: ObjectWatcher) => ObjectWatcher;
    /**
     * Health after deploy (`events/forwarder/health.ts`): the App condition
     * `kapp-lambda.carvel.dev/Healthy`, mirrored on PackageInstalls. Default true; false keeps
     * the drift watches metadata only and adds no condition.
     */
    health?: boolean;
    /** Wait between a workload's health change and its check, ms. Default 1000. */
    healthDebounceMs?: number;
  };
  /** Overrides of the pipeline configuration. */
  config?: Partial<PipelineConfig>;
  /**
   * How long a cluster's `kapp-controller-config` is used before an event reads it again, ms
   * (`0`: every event reads it). Default {@link EMBEDDED_CONTROLLER_CONFIG_TTL_MS} (5 min): each
   * cluster's forwarder watches the object and drops the cached copy on every change (and after
   * each first list), so the TTL is only a bound; the Lambda functions, which have no such watch,
   * keep `DEFAULT_CONTROLLER_CONFIG_TTL_MS` (10 s).
   */
  controllerConfigTtlMs?: number;
  /** Crash retry backoff, ms. */
  retry?: { baseRetryMs?: number; maxRetryMs?: number };
  /**
   * Run each tool under its own unprivileged uid (see `functions/lib/exec/sandbox.ts`).
   * Default: on when this process is root, the only case where it is possible.
   */
  isolateTools?: boolean;
  /** The hardening addon (`functions/lib/exec/harden.ts`); default the one `npm run setup` builds. */
  hardenAddon?: string;
  /** Wraps the dispatch deps (tests inject crashes here). Stages are gated by leadership after this. */
  wrapDeps?: (deps: DispatchDeps) => DispatchDeps;
  /**
   * Leader election per cluster (see `leadership.ts`). Default on, with the defaults of
   * {@link LeaderElectionOptions}. `false` acts on every cluster unconditionally (only safe
   * when nothing else can serve the same clusters).
   */
  leaderElection?: false | LeaderElectionOptions;
  /**
   * The fleet's source poll (`functions/lib/pipeline/source-poll.ts`): a timer that, every
   * `config.sourcePollPeriodMs` (default 60 s), resolves each polled PackageRepository source
   * whose record is older than the period (one registry `HEAD` or `git ls-remote` per source;
   * several runtimes sharing a store resolve each source once) and reconciles the repositories of
   * the clusters this runtime leads that are behind; between polls, every
   * `config.sourceCheckPeriodMs` (default 2 s), it reads the records only and pokes its
   * repositories behind them (`./source-poller.ts`). Default on; `false` turns the timers off
   * (the repositories' own runs still poll when they are due).
   */
  sourcePoll?: boolean;
  /**
   * Period of the rollout check (`./rollout-checker.ts`), in milliseconds: store reads that poke
   * this runtime's PackageInstalls of a rollout wave another runtime released, and release a wave
   * whose soak ended. Default 1000; 0 turns it off.
   */
  rolloutCheckPeriodMs?: number;
  /**
   * kapp-controller's reconcile metrics (`../lib/observe/prometheus.ts`). Default a new
   * {@link PrometheusReconcileMetrics} (with a `cluster` label when more than one cluster is
   * served); serve its registry with `startMetricsServer` (`./metrics-server.ts`).
   */
  metrics?: PrometheusReconcileMetrics;
}

/** Options of the per-cluster leader election. Times in milliseconds. */
export interface LeaderElectionOptions {
  /** Namespace of the Lease (must exist). Default `kapp-lambda` ({@link DEFAULT_LEASE_NAMESPACE}). */
  namespace?: string;
  /** Lease name. Default {@link leaseNameFor}(`namespaces`): `kapp-lambda-forwarder[-<scope hash>]`. */
  name?: string;
  /** Holder identity. Default `<hostname>_<8 random hex>`, new per runtime. */
  identity?: string;
  /** Default 15 000 (controller-runtime). */
  leaseDurationMs?: number;
  /** Default 10 000 (controller-runtime). */
  renewDeadlineMs?: number;
  /** Default 2 000 (controller-runtime). */
  retryPeriodMs?: number;
}

/** `<hostname>_<8 random hex>`: client-go's identity shape (`hostname + "_" + uuid`), unique per process. */
export function defaultIdentity(): string {
  return `${hostname()}_${randomBytes(4).toString('hex')}`;
}

/** A running embedded runtime. */
export interface EmbeddedRuntime {
  pipeline: EmbeddedPipeline;
  /** The running forwarders: one per cluster this runtime leads now (all clusters without election). */
  readonly forwarders: Forwarder[];
  /** Per cluster id, its election; empty when election is off. */
  electors: ReadonlyMap<string, LeaderElector>;
  /** Cluster ids this runtime acts for now, sorted. */
  leading(): string[];
  registry: KubeConfigClusterRegistry;
  store: ObjectStore;
  /** Tool runs and time per tool since start. */
  toolMetrics: ToolMetrics;
  /** kapp-controller's reconcile series (`registry` is what `/metrics` serves). */
  metrics: PrometheusReconcileMetrics;
  /**
   * Stops the forwarders (dropping what they hold), lets running stages end (still holding the
   * leases), then stops the elections, releasing the leases so another runtime takes over at once.
   */
  stop(): Promise<void>;
}

/** The clusters served: the in-cluster one, else the kubeconfig's contexts. */
function clustersOf(opts: EmbeddedOptions): KubeConfigClusterRegistry {
  if (opts.inCluster) return KubeConfigClusterRegistry.inCluster(opts.inCluster);
  if (opts.kubeconfigPath === undefined)
    throw new Error('startEmbedded: no kubeconfigPath and no inCluster connection');
  return KubeConfigClusterRegistry.fromFile(opts.kubeconfigPath, { contexts: opts.contexts });
}

/**
 * Starts forwarders and the in-process pipeline.
 * @throws Error when the kubeconfig cannot be loaded, or neither a kubeconfig nor an in-cluster
 *   connection is given.
 */
export function startEmbedded(opts: EmbeddedOptions): EmbeddedRuntime {
  const registry = clustersOf(opts);
  const store = opts.store ?? new LocalDirStore(opts.storeDir ?? `${opts.cacheRoot}/store`);
  const toolMetrics = createToolMetrics();
  const metrics = opts.metrics ?? new PrometheusReconcileMetrics({ clusterLabel: registry.clusterIds().length > 1 });
  // A tool must not read this process's environment or memory, even under the same uid.
  hardenProcess(opts.hardenAddon ?? hardenAddonPath(opts.cacheRoot));
  const isolate = opts.isolateTools ?? canSwitchUid();
  const cached = cacheBinResolver(opts.cacheRoot);
  const launcherFile = launcherPath(opts.cacheRoot);
  const connectorFile = connectorPath(opts.cacheRoot);
  const helpers: Record<string, string> = {
    [LAUNCHER_NAME]: launcherFile,
    [CONNECTOR_NAME]: connectorFile,
    ssh: path.join(path.dirname(connectorFile), 'ssh'),
    // Preloaded into ssh by the wrapper from its own directory (`layers/native/passwd.c`).
    [SSH_PASSWD_NAME]: path.join(path.dirname(connectorFile), SSH_PASSWD_NAME),
  };
  // The launcher and the connector (with its `ssh` wrapper) are resolved like tools so that
  // they are staged with them (not on the allow-list).
  let resolveBin = (name: string) => helpers[name] ?? cached(name);
  if (isolate) {
    // Runs under other uids must reach their scratch directories and execute the tools,
    // which sit in root's private home: stage them beside the scratch root.
    ensureTraversable(opts.tmpRoot);
    // The root key's directory is the runtime's alone (in a Pod an emptyDir, 0777): a run that
    // could write there could replace the key and forge sealed artifacts after a restart.
    if (!opts.keyring) {
      const keys = path.join(opts.cacheRoot, 'keys');
      mkdirSync(keys, { recursive: true, mode: 0o700 });
      chmodSync(keys, 0o700);
    }
    resolveBin = stageBinaries([...TOOL_NAMES, ...Object.keys(helpers)], resolveBin, path.join(opts.tmpRoot, 'bin'));
  }
  // `npm run setup` builds it; a cache from before it existed runs git:// and ssh unproxied.
  let connector: string | undefined;
  try {
    connector = resolveBin(CONNECTOR_NAME);
    if (!existsSync(connector)) connector = undefined;
  } catch {
    connector = undefined;
  }
  // Tool uids that processes left behind still ran under after their run's end kept killing
  // them (`../lib/exec/uid-leases.ts`): never leased again, so the pool shrinks by each.
  const quarantinedUids =
    (metrics.registry.getSingleMetric('kapp_lambda_tool_uids_quarantined_total') as Counter | undefined) ??
    new Counter({
      name: 'kapp_lambda_tool_uids_quarantined_total',
      help: 'Tool uids never leased again: processes a run left behind could not be killed',
      registers: [metrics.registry],
    });
  const onUidQuarantined = (uid: number, left: readonly number[]) => {
    quarantinedUids.inc();
    opts.log.warn(
      { uid, pids: left, poolSize: DEFAULT_UID_POOL.size },
      'tool uid quarantined: processes a run left behind could not be killed; it is never leased again',
    );
  };
  const composed = createPipelineDeps({
    clusters: registry,
    store,
    keyring: opts.keyring ?? fileKeyring(path.join(opts.cacheRoot, 'keys', 'artifact-root.key')),
    log: opts.log,
    tools: {
      allow: TOOL_NAMES,
      resolveBin,
      tmpDir: opts.tmpRoot,
      metrics: toolMetrics,
      ...(isolate ? { uidPool: DEFAULT_UID_POOL, onUidQuarantined } : {}),
      launcher: resolveBin(LAUNCHER_NAME),
      ...(connector ? { connector } : {}),
    },
    metrics,
    controllerConfigTtlMs: opts.controllerConfigTtlMs ?? EMBEDDED_CONTROLLER_CONFIG_TTL_MS,
    config: {
      tmpRoot: opts.tmpRoot,
      toolVersions: pinnedToolVersions(),
      controllerVersion: CONTROLLER_VERSION,
      ...opts.config,
    },
  });
  const base: DispatchDeps = composed;
  const wrapped = opts.wrapDeps ? opts.wrapDeps(base) : base;
  const leaderships = new Map<string, ClusterLeadership>();
  const acting = (clusterId: string) => opts.leaderElection === false || !!leaderships.get(clusterId)?.isLeader();
  const deps: DispatchDeps = { ...wrapped, clusters: leaderGatedRegistry(wrapped.clusters, acting) };
  const pipeline = new EmbeddedPipeline(deps, {
    concurrency: opts.concurrency,
    ...opts.retry,
    // Losing a cluster's Lease cancels the tools of its running stages (`leadership.ts`).
    stageSignal: (clusterId) => leaderships.get(clusterId)?.termSignal,
    // A stage refused for leadership waits for this runtime's next term instead of being dropped.
    acting,
  });
  // Fan-out events (a repository's new versions → its PackageInstalls) join the same queue.
  deps.emit = (events) => pipeline.send(events);
  // Each cluster's forwarder watches its kapp-controller-config (reference §1.3: upstream
  // reloads on change): a change drops the cached config, so the next event reads it again
  // without waiting for the cache's TTL, and the App timer takes the cluster's sync periods
  // (objects already scheduled keep their due time until their next status change).
  const appTimers = new Map<string, TimerConfig | undefined>();
  const followControllerConfig = (clusterId: string) => {
    composed.invalidateControllerConfig(clusterId);
    deps.controllerConfig?.(clusterId).then(
      (cc) => appTimers.set(clusterId, { ...deps.config.timer, ...cc.timer }),
      (err: Error) =>
        opts.log.warn(
          { clusterId, error: err.message },
          'reading kapp-controller-config for the App timer failed; the previous sync periods apply',
        ),
    );
  };
  // Drift the forwarders saw and sent (their own counters restart with each leadership term).
  // A registry passed in by the caller may hold it already (a runtime started again on it).
  const driftTotal =
    (metrics.registry.getSingleMetric('kapp_lambda_drift_total') as Counter<'cluster'> | undefined) ??
    new Counter({
      name: 'kapp_lambda_drift_total',
      help: 'Hand edits and deletions of what Apps deployed, each sent as a reconcile (reconcile by exception)',
      labelNames: ['cluster'],
      registers: [metrics.registry],
    });
  const { wrapWatcher, ...forwarderTuning } = opts.forwarder ?? {};
  const makeForwarder = (clusterId: string, transport: Transport) =>
    new Forwarder({
      onDrift: () => driftTotal.inc({ cluster: clusterId }),
      clusterId,
      watcher: wrapWatcher ? wrapWatcher(registry.watchView(clusterId)) : registry.watchView(clusterId),
      transport,
      kinds: watchedKinds(opts.kinds ?? EMBEDDED_KINDS, () => appTimers.get(clusterId) ?? deps.config.timer),
      namespaces: opts.namespaces,
      logger: opts.log,
      controllerConfig: {
        namespace: deps.config.controllerConfigNamespace ?? DEFAULT_CONTROLLER_CONFIG_NAMESPACE,
        onChange: () => followControllerConfig(clusterId),
      },
      ...forwarderTuning,
    });
  const fixed: Forwarder[] = [];
  if (opts.leaderElection === false) {
    for (const clusterId of registry.clusterIds()) fixed.push(makeForwarder(clusterId, pipeline));
    for (const f of fixed) f.start();
  } else {
    const election = opts.leaderElection ?? {};
    const identity = election.identity ?? defaultIdentity();
    for (const clusterId of registry.clusterIds()) {
      const leadership = new ClusterLeadership({
        clusterId,
        election: {
          lease: registry.leaseView(clusterId),
          namespace: election.namespace ?? DEFAULT_LEASE_NAMESPACE,
          name: election.name ?? leaseNameFor(opts.namespaces),
          identity,
          ...(election.leaseDurationMs === undefined ? {} : { leaseDurationMs: election.leaseDurationMs }),
          ...(election.renewDeadlineMs === undefined ? {} : { renewDeadlineMs: election.renewDeadlineMs }),
          ...(election.retryPeriodMs === undefined ? {} : { retryPeriodMs: election.retryPeriodMs }),
          logger: opts.log,
        },
        makeForwarder: (transport) => makeForwarder(clusterId, transport),
        transport: pipeline,
        onTermStarted: () => pipeline.resume(clusterId),
        logger: opts.log,
      });
      leaderships.set(clusterId, leadership);
    }
    for (const l of leaderships.values()) l.start();
  }
  const electors = new Map([...leaderships].map(([id, l]) => [id, l.elector] as const));
  const poller = opts.sourcePoll === false ? undefined : startSourcePoller(deps);
  const rolloutChecker = startRolloutChecker(deps, opts.rolloutCheckPeriodMs);
  return {
    pipeline,
    get forwarders() {
      if (opts.leaderElection === false) return [...fixed];
      return [...leaderships.values()].flatMap((l) => (l.forwarder ? [l.forwarder] : []));
    },
    electors,
    leading: () => registry.clusterIds().filter(acting),
    registry,
    store,
    toolMetrics,
    metrics,
    async stop() {
      await poller?.stop();
      await rolloutChecker.stop();
      await Promise.all([
        ...fixed.map((f) => f.stop({ drain: false, timeoutMs: 5000 })),
        ...[...leaderships.values()].map((l) => l.stopForwarding()),
      ]);
      pipeline.close();
      await pipeline.idle();
      await composed.closeEgressProxy();
      await Promise.all([...leaderships.values()].map((l) => l.stop()));
    },
  };
}
