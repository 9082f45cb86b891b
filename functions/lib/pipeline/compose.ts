/**
 * The one builder of the stage handlers' dependencies, shared by the two composition roots:
 * the Lambda functions (`../entry/lambda.ts`, one stage per process, S3, a stage-narrowed
 * registry, the layer's tools) and the embedded runtime (`functions/embedded/runtime.ts`, every
 * stage in one process, a local store, a leader-gated registry, the cached tools). Each root
 * brings its own adapters; the command runner, its tool environment and the template stage's
 * cluster discovery are made here, once.
 *
 * @module
 */

import type { PipelineStage } from '../api/functions.js';
import type { ClusterKeyring } from '../artifact/keyring.js';
import { PkgrAdmissionCache } from '../deploy/pkgr-admission.js';
import { type CommandRunnerOptions, createCommandRunner, minimalEnv } from '../exec/runner.js';
import { withEgressProxy } from '../fetch/egress-proxy.js';
import { UrlPolicyChecker } from '../fetch/url-policy.js';
import { discoverApiGroupVersions, discoverServerVersion } from '../kube/client.js';
import { restTransportForKubeconfig } from '../kube/kubeconfig-plain.js';
import type { ClusterRegistry } from '../kube/port.js';
import type { RestTransport } from '../kube/transport.js';
import type { Logger } from '../log.js';
import { ReconcileEventRecorder } from '../observe/events.js';
import type { ReconcileMetrics } from '../observe/metrics.js';
import type { ObjectStore } from '../store/port.js';
import { clusterConfigSource } from './cluster-config.js';
import type { ClusterInfoSource, PipelineConfig, PipelineDeps } from './deps.js';

/** Upstream's prefix of a failed version lookup (`pkg/app/app_template.go`). */
export const KUBERNETES_VERSION_ERROR_PREFIX = 'Unable to get kubernetes version: ';

/** Upstream's prefix of a failed API group/version lookup (`pkg/app/app_template.go`). */
export const KUBERNETES_APIS_ERROR_PREFIX = 'Unable to list all server apigroups/version: ';

/**
 * Live cluster values for templates (helm `--kube-version`/`--api-versions`, downward API):
 * discovery calls only (`GET /version`, `/api`, `/apis`), which every authenticated identity
 * may make, to the App's destination cluster: the App's own (`registry.client(clusterId)`),
 * or, when the template stage hands a kubeconfig (an App with `cluster.kubeconfigSecretRef`),
 * the cluster it names, over {@link restTransportForKubeconfig}. Upstream reads the version
 * there too (`ComponentInfo.KubernetesVersion`) but the API groups always from its own cluster
 * (`KubernetesAPIs`, no cluster argument); here both come from the destination, the cluster
 * the manifests are rendered for (docs/decisions.md D10). A failed lookup is passed to the template stage as
 * its value, an `Error` with upstream's prefix ({@link KUBERNETES_VERSION_ERROR_PREFIX},
 * {@link KUBERNETES_APIS_ERROR_PREFIX}), which decides what it means for the App.
 *
 * @param registry - A registry whose `client` may be used (not a stage-narrowed one).
 * @param controllerVersion - Reported as `kappControllerVersion`.
 * @param transportFor - Transport for a destination kubeconfig; default {@link restTransportForKubeconfig}.
 * @returns The source the template stage calls per run.
 */
export function clusterInfoSource(
  registry: ClusterRegistry,
  controllerVersion: string,
  transportFor: (kubeconfigYaml: string) => RestTransport = restTransportForKubeconfig,
): ClusterInfoSource {
  return async (clusterId, needs, destination) => {
    const lookup = async <T>(
      needed: boolean,
      prefix: string,
      own: () => Promise<T>,
      remote: (rest: RestTransport) => Promise<T>,
    ): Promise<T | Error | undefined> => {
      if (!needed) return undefined;
      if (destination instanceof Error) return new Error(`${prefix}${destination.message}`, { cause: destination });
      try {
        return destination === undefined ? await own() : await remote(transportFor(destination));
      } catch (e) {
        return new Error(`${prefix}${(e as Error).message}`, { cause: e });
      }
    };
    return {
      kubernetesVersion: await lookup(
        needs.kubernetesVersion,
        KUBERNETES_VERSION_ERROR_PREFIX,
        () => registry.client(clusterId).serverVersion(),
        discoverServerVersion,
      ),
      kubernetesAPIs: await lookup(
        needs.kubernetesAPIs,
        KUBERNETES_APIS_ERROR_PREFIX,
        () => registry.client(clusterId).apiGroupVersions(),
        discoverApiGroupVersions,
      ),
      kappControllerVersion: controllerVersion,
    };
  };
}

/**
 * The base environment of the tools: `minimalEnv` (PATH = the tools' directories, then the
 * system dirs; HOME and TMPDIR = the scratch root), plus, when the runner serves the fetch
 * stage, `VENDIR_HELM_BINARY` = the allowed `helm`: without it vendir runs `helm3` for
 * `helmVersion: "3"` charts, which neither the layers nor the tool cache ship
 * (`pkg/vendir/fetch/helmchart/sync.go`).
 *
 * @param stage - The one stage the runner serves (a Lambda function), or `undefined` for a
 *   runner serving every stage (the embedded runtime).
 * @param tools - Allow-list, resolver and scratch root of the runner.
 * @returns A new environment object.
 */
export function toolEnv(
  stage: PipelineStage | undefined,
  tools: Pick<CommandRunnerOptions, 'allow' | 'resolveBin' | 'tmpDir' | 'connector'>,
): Record<string, string> {
  const env = minimalEnv(tools);
  if (stage === undefined || stage === 'fetch') env.VENDIR_HELM_BINARY = tools.resolveBin('helm');
  return env;
}

/**
 * The stage handlers' dependencies with the template stage's cluster discovery, and
 * `closeEgressProxy`, which stops the tools' egress proxy if one was started (a no-op
 * otherwise; the composition root calls it on shutdown).
 */
export type ComposedPipelineDeps = PipelineDeps & {
  clusterInfo: ClusterInfoSource;
  /** The admission-policy check of a PackageRepository's kapp, kept 10 s per cluster. */
  pkgrAdmission: PkgrAdmissionCache;
  closeEgressProxy: () => Promise<void>;
  /** Makes the next event of the cluster read its `kapp-controller-config` again (it changed). */
  invalidateControllerConfig: (clusterId: string) => void;
};

/** What a composition root brings to {@link createPipelineDeps}. */
export interface PipelineAdapters {
  /** The registry the stages use, already narrowed (Lambda) or not (embedded). */
  clusters: ClusterRegistry;
  /** The registry cluster discovery uses (`client` must work). Default `clusters`. */
  discovery?: ClusterRegistry;
  /** Artifacts, render cache and receipts. */
  store: ObjectStore;
  /** Keys sealing private artifacts. Default none (a run that would store secrets then fails). */
  keyring?: ClusterKeyring;
  log: Logger;
  /** Wall clock. Default `() => new Date()`. */
  now?: () => Date;
  /** The one stage this process serves (see {@link toolEnv}); `undefined` for every stage. */
  stage?: PipelineStage;
  /**
   * The command runner's options without `baseEnv` ({@link toolEnv} of them is used): the
   * allow-list, the resolver, the scratch root, the launcher, and the embedded runtime's
   * metrics and uid pool.
   */
  tools: Omit<CommandRunnerOptions, 'baseEnv'>;
  /** The pipeline configuration, as is. */
  config: PipelineConfig;
  /** Reconcile metrics (`PipelineDeps.metrics`). Default none. */
  metrics?: ReconcileMetrics;
  /** Reconcile Events: default a {@link ReconcileEventRecorder} with its defaults; `false`: none. */
  events?: ReconcileEventRecorder | false;
  /**
   * How long a cluster's `kapp-controller-config` is used before an event reads it again, ms.
   * Default `DEFAULT_CONTROLLER_CONFIG_TTL_MS` (10 s); a runtime whose forwarder watches the
   * object (the embedded one) may use a long one and invalidate on change.
   */
  controllerConfigTtlMs?: number;
}

/**
 * Builds the dependencies of the stage handlers from a composition root's adapters: the one
 * command runner (over `tools`, with {@link toolEnv}), the wall clock, and
 * {@link clusterInfoSource} over `discovery` with `config.controllerVersion`. While
 * `config.urlPolicy` is enforced, the runner's network tools go through the process's egress
 * proxy (`withEgressProxy`, `../fetch/egress-proxy.ts`), started at the first such run, and
 * `egressProxyUrl` hands the same proxy to the deploy stage for kubeconfig Secret clusters.
 * Each event reads its cluster's `kapp-controller-config` (cached, `./cluster-config.ts`).
 *
 * @param adapters - The root's ports and configuration.
 * @returns The deps every stage handler (and the in-process dispatcher) takes.
 */
export function createPipelineDeps(adapters: PipelineAdapters): ComposedPipelineDeps {
  const { tools, config } = adapters;
  const direct = createCommandRunner({ ...tools, baseEnv: toolEnv(adapters.stage, tools) });
  const proxied =
    config.urlPolicy?.mode === 'enforce'
      ? withEgressProxy(direct, {
          checker: new UrlPolicyChecker(config.urlPolicy),
          ...(config.fetchStall ? { stall: config.fetchStall } : {}),
          ...(tools.connector ? { connector: tools.connector } : {}),
        })
      : undefined;
  const clusterConfigs = clusterConfigSource(
    { clusters: adapters.clusters, log: adapters.log, config },
    adapters.controllerConfigTtlMs !== undefined ? { ttlMs: adapters.controllerConfigTtlMs } : {},
  );
  return {
    clusters: adapters.clusters,
    controllerConfig: clusterConfigs.get,
    invalidateControllerConfig: clusterConfigs.invalidate,
    pkgrAdmission: new PkgrAdmissionCache(),
    store: adapters.store,
    ...(adapters.keyring ? { keyring: adapters.keyring } : {}),
    runner: proxied ?? direct,
    closeEgressProxy: async () => await proxied?.close(),
    ...(proxied ? { egressProxyUrl: () => proxied.url() } : {}),
    appReader: restTransportForKubeconfig,
    now: adapters.now ?? (() => new Date()),
    log: adapters.log,
    clusterInfo: clusterInfoSource(adapters.discovery ?? adapters.clusters, config.controllerVersion),
    config,
    ...(adapters.metrics ? { metrics: adapters.metrics } : {}),
    ...(adapters.events === false ? {} : { events: adapters.events ?? new ReconcileEventRecorder() }),
  };
}
