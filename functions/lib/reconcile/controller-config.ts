/**
 * kapp-controller's controller configuration, per cluster: the Secret, else the ConfigMap,
 * `kapp-controller-config` in the cluster's configuration namespace (reference §1.3,
 * `pkg/config/config.go`). Each cluster's own object configures that cluster's runs only: it is
 * written by that cluster's admin, so nothing read from it (its CA bundle, its proxy, the hosts
 * it skips TLS verification for) ever applies to another cluster's fetch.
 *
 * The Secret's values may be sensitive (a proxy URL with a password): a
 * {@link ClusterControllerConfig} is never logged or written to status; {@link describeControllerConfig}
 * is what logs may show (which keys are set, the object's kind and version).
 *
 * @module
 */
import { createHash } from 'node:crypto';
import type { SettingDoc } from '../api/env.js';
import type { KubeReader } from '../kube/port.js';
import { MIN_CLUSTER_KUBE_API_QPS } from '../kube/rate-limit.js';
import { type ControllerSyncConfig, parseControllerSyncConfig } from './timer.js';

/** Name of the Secret or ConfigMap (upstream `kcConfigName`). */
export const CONTROLLER_CONFIG_NAME = 'kapp-controller-config';

/**
 * Default namespace of {@link CONTROLLER_CONFIG_NAME} in a cluster: the forwarder's own
 * (kapp-controller reads its pod's namespace). Configurable per runtime
 * (`KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE`, `FORWARDER_CONTROLLER_CONFIG_NAMESPACE`).
 */
export const DEFAULT_CONTROLLER_CONFIG_NAMESPACE = 'kapp-lambda';

/**
 * The key of a cluster's `kapp-controller-config` recording the `metadata.uid` of its packaging
 * global namespace, for clusters without a registry document naming one (the embedded and
 * in-cluster runtimes): its Packages are trusted only while the live namespace has this uid
 * (`../packaging/global-trust.ts`). Only the admin writes the `kapp-lambda` namespace.
 */
export const GLOBAL_NAMESPACE_UID_KEY = 'kappLambdaPackagingGlobalNamespaceUID';

/**
 * The keys of a cluster's `kapp-controller-config` that {@link parseControllerConfigData} reads:
 * kapp-controller's (reference §1.3) and kapp-lambda's own (`ours`), with defaults and meanings.
 * The `kapp-controller-config` table of `docs/configuration.md` is generated from it
 * (`npm run gen:config`); a key read without a row fails `test/unit/config-reference.test.ts`.
 */
export const CONTROLLER_CONFIG_KEY_DOCS: readonly SettingDoc[] = [
  {
    name: 'caCerts',
    default: 'none',
    meaning: 'PEM bundle trusted by vendir, imgpkg, helm, git and the http downloads, beside the system roots',
    readBy: 'every function and the embedded runtime (`functions/lib/reconcile/controller-config.ts`)',
  },
  {
    name: ['httpProxy', 'httpsProxy', 'noProxy'],
    default: 'none',
    meaning:
      'proxy for the tools and http downloads while the URL policy is off; `KAPPCTRL_KUBERNETES_SERVICE_HOST` in `noProxy` becomes the API server host',
    readBy: 'same',
  },
  {
    name: 'dangerousSkipTLSVerify',
    default: '`KAPP_LAMBDA_DANGEROUS_SKIP_TLS_VERIFY`',
    meaning: 'comma list of hosts or `host:port` whose TLS is not verified',
    readBy: 'same',
  },
  {
    name: 'kappDeployRawOptions',
    default: '`KAPP_LAMBDA_KAPP_DEPLOY_RAW_OPTIONS` (`[]`)',
    meaning: 'JSON array of kapp deploy flags for every App (allow-listed)',
    readBy: 'same',
  },
  {
    name: 'appDefaultSyncPeriod',
    default: '`KAPP_LAMBDA_APP_DEFAULT_SYNC_PERIOD` (30s)',
    meaning: 'sync period of Apps without one',
    readBy: "same, and the forwarders' App timer",
  },
  {
    name: 'appMinimumSyncPeriod',
    default: '`KAPP_LAMBDA_APP_MINIMUM_SYNC_PERIOD` (30s)',
    meaning: 'the shortest sync period an App gets',
    readBy: "same, and the forwarders' App timer",
  },
  {
    name: 'packageInstallDefaultSyncPeriod',
    default: '10m',
    meaning: 'sync period of the Apps PackageInstalls generate',
    readBy: 'same',
  },
  {
    name: 'kappLambdaSyncMode',
    ours: true,
    default: '`exception`',
    meaning:
      "`periodic`: every App, PackageRepository and PackageInstall of the cluster keeps upstream's timer (a reconcile every `syncPeriod`; a PackageInstall's is its App's); `exception`: one whose inputs the forwarder watches is quiet at its sync period ([reconcile by exception](../events/forwarder/README.md#reconcile-by-exception)); the annotation `kapp-lambda.carvel.dev/sync-mode` on an App or PackageRepository overrides it per object, on a PackageInstall it is copied to its App; in `periodic` mode a run that changed nothing still writes its status, as upstream",
    readBy: "the forwarders' App and PackageRepository timers, and the stages' status write",
  },
  {
    name: 'kappLambdaSafetySyncPeriod',
    ours: true,
    default: '10m',
    meaning:
      "how often a quiet App or PackageRepository still reconciles fully (only longer than its sync period means anything: a repository's default 10m never is quiet with it); the annotation `kapp-lambda.carvel.dev/safety-sync-period` overrides it per object (on a PackageInstall: copied to its App)",
    readBy: "the forwarders' App and PackageRepository timers",
  },
  {
    name: ['kappLambdaKubeAPIQPS', 'kappLambdaKubeAPIBurst'],
    ours: true,
    default: "the runtime's (`KAPP_LAMBDA_KUBE_API_QPS` / `_BURST`, `startEmbedded`'s `config.kubeApi`), else 20 / 30",
    meaning:
      "the cluster's client-side limit on API requests (QPS 0, no limit, or at least 1: a slower rate would hold a function invocation, and for install the other clusters' events in its batch, past its time limit): requests wait for a token (client-go's token bucket), a watch takes one when opened; one bucket per cluster id per process, shared by the stages and (embedded) the forwarders. Upstream's is fixed in its binary at 20 / 30 (controller-runtime's default); kapp's own `--kube-api-qps` / `--kube-api-burst` are separate",
    readBy: "every stage's API client",
  },
  {
    name: GLOBAL_NAMESPACE_UID_KEY,
    ours: true,
    default: "the registry document's `packagingGlobalNamespaceUid`, else none",
    meaning:
      "the `metadata.uid` of the packaging global namespace (`kubectl get namespace kapp-controller-packaging-global -o jsonpath='{.metadata.uid}'` right after the release created it): its Packages are trusted only while the live namespace has this uid; another uid (a namespace a tenant created first, or one deleted and created again) makes them absent, with a note in the PackageInstall's status; none recorded: trusted, with a warning logged once",
    readBy: 'the install function and the embedded runtime',
  },
];

/** The proxy keys of the configuration, verbatim (upstream `ProxyOpts`). */
export interface ControllerProxy {
  httpProxy?: string;
  httpsProxy?: string;
  noProxy?: string;
}

/** One cluster's parsed `kapp-controller-config`; every key optional (unset = not configured). */
export interface ClusterControllerConfig {
  /** `caCerts`: PEM bundle trusted by every fetch in addition to the system roots. */
  caCerts?: string;
  /** `httpProxy`/`httpsProxy`/`noProxy` (with `KAPPCTRL_KUBERNETES_SERVICE_HOST` replaced). */
  proxy?: ControllerProxy;
  /** `dangerousSkipTLSVerify`: comma-separated hosts or `host:port`. */
  dangerousSkipTLSVerify?: string;
  /** `kappDeployRawOptions`: JSON array of kapp deploy flags for every App. */
  kappDeployRawOptions?: string[];
  /** `appDefaultSyncPeriod`, `appMinimumSyncPeriod`, `packageInstallDefaultSyncPeriod`, ms. */
  timer: ControllerSyncConfig;
  /**
   * Ours: `kappLambdaKubeAPIQPS` (0: no limit, else a number ≥ `MIN_CLUSTER_KUBE_API_QPS`, 1)
   * and `kappLambdaKubeAPIBurst` (integer ≥ 1), the cluster's client-side limit on API requests
   * (`../kube/rate-limit.ts`; upstream's is fixed at 20 / 30 in its binary). A key left out keeps
   * the runtime-wide value.
   */
  kubeApi?: { qps?: number; burst?: number };
  /** Ours: {@link GLOBAL_NAMESPACE_UID_KEY}, the recorded uid of the packaging global namespace. */
  packagingGlobalNamespaceUid?: string;
  /** Which object it came from, `Secret/<resourceVersion>` or `ConfigMap/<rv>`; absent: neither exists. */
  source?: string;
}

/** The configuration of a cluster that has neither object: every setting cleared (upstream `Reload`). */
export const EMPTY_CONTROLLER_CONFIG: ClusterControllerConfig = Object.freeze({ timer: Object.freeze({}) });

/** A `kapp-controller-config` whose values cannot be parsed (upstream `addDataToConfig`'s errors). */
export class ControllerConfigError extends Error {
  override readonly name = 'ControllerConfigError';
}

/**
 * Parses the data of the Secret (decoded) or ConfigMap like `Config.addDataToConfig`: empty
 * values are unset; `noProxy`'s `KAPPCTRL_KUBERNETES_SERVICE_HOST` becomes `kubernetesServiceHost`
 * (the cluster's API server host), first occurrence only, as upstream's `strings.Replace(..., 1)`.
 *
 * @param data - key → value
 * @param kubernetesServiceHost - the API server host of the cluster (`KUBERNETES_SERVICE_HOST`
 *   inside it); `''` when unknown
 * @throws ControllerConfigError `Unmarshaling <key> as duration: ...` or
 *   `Unmarshaling kappDeployRawOptions as JSON: ...` or `Parsing kappLambdaKubeAPIQPS|Burst: ...`
 *   (never echoing other keys' values)
 */
export function parseControllerConfigData(
  data: Readonly<Record<string, string>>,
  kubernetesServiceHost = '',
): ClusterControllerConfig {
  const set = (k: string): string | undefined => (data[k] ? data[k] : undefined);
  let timer: ControllerSyncConfig;
  try {
    timer = parseControllerSyncConfig({
      appDefaultSyncPeriod: set('appDefaultSyncPeriod'),
      appMinimumSyncPeriod: set('appMinimumSyncPeriod'),
      packageInstallDefaultSyncPeriod: set('packageInstallDefaultSyncPeriod'),
      kappLambdaSyncMode: set('kappLambdaSyncMode'),
      kappLambdaSafetySyncPeriod: set('kappLambdaSafetySyncPeriod'),
    });
  } catch (err) {
    throw new ControllerConfigError((err as Error).message, { cause: err });
  }
  const out: ClusterControllerConfig = { timer };
  const qps = set('kappLambdaKubeAPIQPS');
  const burst = set('kappLambdaKubeAPIBurst');
  if (qps !== undefined || burst !== undefined) {
    out.kubeApi = {};
    if (qps !== undefined) {
      const n = Number(qps);
      if (qps.trim() === '' || !Number.isFinite(n) || n < 0 || (n > 0 && n < MIN_CLUSTER_KUBE_API_QPS)) {
        throw new ControllerConfigError(
          `Parsing kappLambdaKubeAPIQPS: expected 0 (no limit) or a number ≥ ${MIN_CLUSTER_KUBE_API_QPS}`,
        );
      }
      out.kubeApi.qps = n;
    }
    if (burst !== undefined) {
      const n = Number(burst);
      if (!/^\s*\d+\s*$/.test(burst) || !Number.isSafeInteger(n) || n < 1) {
        throw new ControllerConfigError('Parsing kappLambdaKubeAPIBurst: expected an integer ≥ 1');
      }
      out.kubeApi.burst = n;
    }
  }
  const raw = set('kappDeployRawOptions');
  if (raw !== undefined) {
    let opts: unknown;
    try {
      opts = JSON.parse(raw);
    } catch (err) {
      throw new ControllerConfigError(`Unmarshaling kappDeployRawOptions as JSON: ${(err as Error).message}`);
    }
    if (!Array.isArray(opts) || !opts.every((o) => typeof o === 'string')) {
      throw new ControllerConfigError(
        'Unmarshaling kappDeployRawOptions as JSON: json: cannot unmarshal into Go value of type []string',
      );
    }
    out.kappDeployRawOptions = opts;
  }
  const globalUid = set('kappLambdaPackagingGlobalNamespaceUID')?.trim();
  if (globalUid) out.packagingGlobalNamespaceUid = globalUid;
  const caCerts = set('caCerts');
  if (caCerts !== undefined) out.caCerts = caCerts;
  const skip = set('dangerousSkipTLSVerify');
  if (skip !== undefined) out.dangerousSkipTLSVerify = skip;
  const proxy: ControllerProxy = {};
  const httpProxy = set('httpProxy');
  const httpsProxy = set('httpsProxy');
  const noProxy = set('noProxy')?.replace('KAPPCTRL_KUBERNETES_SERVICE_HOST', kubernetesServiceHost);
  if (httpProxy) proxy.httpProxy = httpProxy;
  if (httpsProxy) proxy.httpsProxy = httpsProxy;
  if (noProxy) proxy.noProxy = noProxy;
  if (proxy.httpProxy || proxy.httpsProxy || proxy.noProxy) out.proxy = proxy;
  return out;
}

/**
 * Reads a cluster's configuration as `Config.Reload` does: the Secret first; only when it is
 * NotFound the ConfigMap; neither: {@link EMPTY_CONTROLLER_CONFIG}.
 *
 * @param kube - reads Secrets and ConfigMaps of the cluster
 * @param namespace - where the object lives
 * @param kubernetesServiceHost - see {@link parseControllerConfigData}
 * @throws ControllerConfigError for unparseable values; the API errors of the reads
 */
export async function readControllerConfig(
  kube: Pick<KubeReader, 'getSecret' | 'getConfigMap'>,
  namespace: string,
  kubernetesServiceHost = '',
): Promise<ClusterControllerConfig> {
  const secret = await kube.getSecret(namespace, CONTROLLER_CONFIG_NAME);
  if (secret) {
    const data: Record<string, string> = {};
    for (const [k, v] of Object.entries(secret.data)) data[k] = v.toString('utf8');
    return {
      ...parseControllerConfigData(data, kubernetesServiceHost),
      source: `Secret/${secret.metadata.resourceVersion}`,
    };
  }
  const cm = await kube.getConfigMap(namespace, CONTROLLER_CONFIG_NAME);
  if (cm) {
    return {
      ...parseControllerConfigData(cm.data, kubernetesServiceHost),
      source: `ConfigMap/${cm.metadata.resourceVersion}`,
    };
  }
  return EMPTY_CONTROLLER_CONFIG;
}

/**
 * What a log line may say about a configuration: its source and which keys are set, never a
 * value (a proxy URL may hold a password, the Secret is the admin's).
 */
export function describeControllerConfig(c: ClusterControllerConfig): { source: string; keys: string[] } {
  const keys: string[] = [];
  if (c.caCerts) keys.push('caCerts');
  if (c.proxy?.httpProxy) keys.push('httpProxy');
  if (c.proxy?.httpsProxy) keys.push('httpsProxy');
  if (c.proxy?.noProxy) keys.push('noProxy');
  if (c.dangerousSkipTLSVerify) keys.push('dangerousSkipTLSVerify');
  if (c.kappDeployRawOptions) keys.push('kappDeployRawOptions');
  if (c.packagingGlobalNamespaceUid) keys.push(GLOBAL_NAMESPACE_UID_KEY);
  for (const k of Object.keys(c.timer)) keys.push(k.replace(/Ms$/, ''));
  return { source: c.source ?? 'none', keys };
}

/**
 * Digest of what of a configuration changes a fetch's output (its CA bundle, proxy and skipped
 * hosts): part of a pinned fetch's cache key, so content fetched through one cluster's trust
 * and proxy is never served to a cluster configured otherwise. `''` when none is set (the key
 * of an unconfigured cluster stays what it was).
 */
export function fetchConfigDigest(
  c: Pick<ClusterControllerConfig, 'caCerts' | 'proxy' | 'dangerousSkipTLSVerify'>,
): string {
  if (!c.caCerts && !c.proxy && !c.dangerousSkipTLSVerify) return '';
  return createHash('sha256')
    .update(
      JSON.stringify([
        c.caCerts ?? '',
        c.proxy?.httpProxy ?? '',
        c.proxy?.httpsProxy ?? '',
        c.proxy?.noProxy ?? '',
        c.dangerousSkipTLSVerify ?? '',
      ]),
    )
    .digest('hex');
}

/** Options of {@link ControllerConfigCache}. */
export interface ControllerConfigCacheOptions {
  /** Reads a cluster's configuration now (e.g. {@link readControllerConfig} on its views). */
  read: (clusterId: string) => Promise<ClusterControllerConfig>;
  /** How long a read is used before the next run reads again, ms. */
  ttlMs: number;
  /** Clock, ms since the epoch. Default `Date.now`. */
  now?: () => number;
  /** Told (without values) when a configuration cannot be parsed and the last good one is kept. */
  onInvalid?: (clusterId: string, err: ControllerConfigError) => void;
}

/**
 * Per-cluster cache of configurations: read at most once per `ttlMs` per cluster, and at once
 * after {@link invalidate} (the forwarder saw the object change). An unparseable configuration
 * keeps the cluster's last good one (upstream's reconciler logs and keeps its config); with none
 * yet, {@link EMPTY_CONTROLLER_CONFIG}. API errors are thrown (the run is retried).
 */
export class ControllerConfigCache {
  private readonly entries = new Map<string, { config: ClusterControllerConfig; readAt: number }>();
  private readonly pending = new Map<string, Promise<ClusterControllerConfig>>();
  constructor(private readonly opts: ControllerConfigCacheOptions) {}

  /**
   * The cluster's configuration (cached, or read now).
   * @throws what `read` throws, except {@link ControllerConfigError}
   */
  async get(clusterId: string): Promise<ClusterControllerConfig> {
    const now = (this.opts.now ?? Date.now)();
    const hit = this.entries.get(clusterId);
    if (hit && now - hit.readAt < this.opts.ttlMs) return hit.config;
    const inFlight = this.pending.get(clusterId);
    if (inFlight) return await inFlight;
    const p = (async () => {
      try {
        const config = await this.opts.read(clusterId);
        this.entries.set(clusterId, { config, readAt: now });
        return config;
      } catch (err) {
        if (!(err instanceof ControllerConfigError)) throw err;
        this.opts.onInvalid?.(clusterId, err);
        const kept = hit?.config ?? EMPTY_CONTROLLER_CONFIG;
        this.entries.set(clusterId, { config: kept, readAt: now });
        return kept;
      }
    })();
    this.pending.set(clusterId, p);
    try {
      return await p;
    } finally {
      this.pending.delete(clusterId);
    }
  }

  /** Makes the next {@link get} of `clusterId` read again (the object changed). */
  invalidate(clusterId: string): void {
    const e = this.entries.get(clusterId);
    if (e) e.readAt = Number.NEGATIVE_INFINITY;
  }
}
