/**
 * Each event runs with its cluster's own `kapp-controller-config` (reference §1.3): the
 * runtimes call {@link withClusterConfig} once per event (`dispatchWithRetryBound`), after the
 * cluster is loaded, so every stage sees the configuration of the cluster it works for through
 * the same {@link PipelineDeps.config} fields it always read.
 *
 * Precedence, per key: the cluster's object when it sets the key, else the runtime-wide value
 * (the environment of the function or the embedded runtime), else kapp-controller's default.
 * `caCerts` and the proxy keys exist only per cluster ({@link PipelineDeps.clusterConfig}).
 * The client-side limit on the cluster's API requests (`kappLambdaKubeAPIQPS` / `Burst`) is set
 * on the process's bucket of the cluster ({@link CLUSTER_RATE_LIMITS}), as each event runs.
 *
 * @module
 */
import { KubeApiError } from '../kube/port.js';
import {
  CLUSTER_RATE_LIMITS,
  type ClusterRateLimits,
  DEFAULT_KUBE_API_RATE,
  type KubeApiRate,
} from '../kube/rate-limit.js';
import {
  type ClusterControllerConfig,
  ControllerConfigCache,
  DEFAULT_CONTROLLER_CONFIG_NAMESPACE,
  describeControllerConfig,
  EMPTY_CONTROLLER_CONFIG,
  readControllerConfig,
} from '../reconcile/controller-config.js';
import type { PipelineDeps } from './deps.js';

/** Default life of a cached cluster configuration in a function, ms (a change is seen within it). */
export const DEFAULT_CONTROLLER_CONFIG_TTL_MS = 10_000;

/**
 * `deps` for one event of `clusterId`: the cluster's configuration read (cached) and laid over
 * `deps.config`, the proxy password (if any) added to the run's secret mask. Without
 * `deps.controllerConfig`, `deps` itself. Either way the cluster's bucket in `limits` gets its
 * rate ({@link kubeApiRateOf}).
 *
 * @throws the API errors of the read
 */
export async function withClusterConfig<D extends PipelineDeps>(
  deps: D,
  clusterId: string,
  limits: ClusterRateLimits = CLUSTER_RATE_LIMITS,
): Promise<D> {
  if (!deps.controllerConfig) {
    limits.configure(clusterId, kubeApiRateOf(deps.config?.kubeApi, undefined));
    return deps;
  }
  const cc = await deps.controllerConfig(clusterId);
  limits.configure(clusterId, kubeApiRateOf(deps.config?.kubeApi, cc.kubeApi));
  for (const url of [cc.proxy?.httpProxy, cc.proxy?.httpsProxy]) {
    const password = url ? passwordOf(url) : undefined;
    if (password) deps.secretMask?.addValue(password);
  }
  return {
    ...deps,
    clusterConfig: cc,
    config: {
      ...deps.config,
      ...(cc.dangerousSkipTLSVerify !== undefined ? { dangerousSkipTLSVerify: cc.dangerousSkipTLSVerify } : {}),
      ...(cc.kappDeployRawOptions !== undefined ? { kappDeployRawOptions: cc.kappDeployRawOptions } : {}),
      timer: { ...deps.config.timer, ...cc.timer },
    },
  };
}

/**
 * A cluster's client-side rate: per key its `kapp-controller-config`'s, else the runtime-wide
 * one, else kapp-controller's ({@link DEFAULT_KUBE_API_RATE}).
 */
export function kubeApiRateOf(
  runtime: KubeApiRate | undefined,
  cluster: ClusterControllerConfig['kubeApi'],
): KubeApiRate {
  const base = runtime ?? DEFAULT_KUBE_API_RATE;
  return { qps: cluster?.qps ?? base.qps, burst: cluster?.burst ?? base.burst };
}

function hostOf(url: string): string {
  try {
    return new URL(url).hostname.replace(/^\[|\]$/g, '');
  } catch {
    return '';
  }
}

function passwordOf(url: string): string | undefined {
  try {
    const p = new URL(url).password;
    return p ? decodeURIComponent(p) : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The {@link PipelineDeps.controllerConfig} of a runtime: each cluster's object read through
 * its fetch view (get of one Secret and, when absent, one ConfigMap), cached for `ttlMs`; an
 * unparseable object is logged (its error, never its values) and the cluster's last good
 * configuration kept. `invalidate` makes the next event of a cluster read again (the embedded
 * runtime's forwarder calls it when it sees the object change).
 */
export function clusterConfigSource(
  deps: Pick<PipelineDeps, 'clusters' | 'log' | 'config'>,
  opts: { ttlMs?: number; now?: () => number } = {},
): {
  get: (clusterId: string) => Promise<import('../reconcile/controller-config.js').ClusterControllerConfig>;
  invalidate: (clusterId: string) => void;
} {
  const ns = deps.config.controllerConfigNamespace ?? DEFAULT_CONTROLLER_CONFIG_NAMESPACE;
  const cache = new ControllerConfigCache({
    ttlMs: opts.ttlMs ?? DEFAULT_CONTROLLER_CONFIG_TTL_MS,
    ...(opts.now ? { now: opts.now } : {}),
    read: async (clusterId) => {
      const view = deps.clusters.fetchView(clusterId);
      // noProxy's KAPPCTRL_KUBERNETES_SERVICE_HOST: the host of this cluster's API server, known
      // where the deploy view is. Fetch and template hold none (the cloud functions' registry
      // refuses it) and their tools never call the API server: there it becomes empty, as for
      // a pod without the variable.
      let server = '';
      try {
        server = deps.clusters.deployView(clusterId).apiServer().server;
      } catch {
        server = '';
      }
      let config: ClusterControllerConfig;
      try {
        config = await readControllerConfig(view, ns, server ? hostOf(server) : '');
      } catch (err) {
        // A function whose cluster role may not read the object (install and index-repo today)
        // runs with the runtime-wide settings rather than failing every event.
        if (!(err instanceof KubeApiError) || err.statusCode !== 403) throw err;
        deps.log.warn(
          { clusterId, namespace: ns },
          'kapp-controller-config not readable by this function (403); runtime-wide settings apply',
        );
        return EMPTY_CONTROLLER_CONFIG;
      }
      deps.log.debug({ clusterId, controllerConfig: describeControllerConfig(config) }, 'read kapp-controller-config');
      return config;
    },
    onInvalid: (clusterId, err) =>
      deps.log.error(
        { clusterId, namespace: ns, error: err.message },
        'Getting kapp-controller config: keeping the last valid configuration',
      ),
  });
  return { get: (id) => cache.get(id), invalidate: (id) => cache.invalidate(id) };
}
