/**
 * Cluster registries: which API servers this runtime serves, by cluster id.
 *
 * {@link MapClusterRegistry} holds ready clients (tests pass fakes here);
 * {@link KubeConfigClusterRegistry} builds one {@link KubeApiClient} per kubeconfig
 * context with `@kubernetes/client-node` (the embedded default: every context of the
 * current kubeconfig is a cluster id). Clients and views are created once and reused.
 *
 * @module
 */

import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { KubeConfig } from '@kubernetes/client-node';
import { KubeApiClient } from './client.js';
import type { ApiServerInfo, KubeClient } from './port.js';
import { ClientNodeRestTransport, ClientNodeWatchTransport, type RestTransport } from './transport.js';
import { MapClusterRegistry } from './views-registry.js';

export { type ClusterViews, clusterViewsOf, MapClusterRegistry, ViewsClusterRegistry } from './views-registry.js';

/** Options of {@link KubeConfigClusterRegistry.fromFile}. */
export interface FromFileOptions {
  /** Contexts to serve (each becomes a cluster id); default every context in the file. */
  contexts?: readonly string[];
}

/**
 * Server address and CA of a KubeConfig's current cluster, for {@link ApiServerInfo}.
 * Reads `certificate-authority` from disk when the kubeconfig names a file.
 *
 * @throws Error when the current context has no cluster or the CA file cannot be read
 *   (the message names the context and file, never contents).
 */
export function apiServerInfoOf(kubeConfig: KubeConfig): ApiServerInfo {
  const cluster = kubeConfig.getCurrentCluster();
  if (!cluster) {
    throw new Error(`kubeconfig context ${JSON.stringify(kubeConfig.currentContext)} has no cluster`);
  }
  const info: ApiServerInfo = { server: cluster.server };
  if (cluster.caData) {
    info.caData = cluster.caData;
  } else if (cluster.caFile) {
    try {
      info.caData = readFileSync(cluster.caFile).toString('base64');
    } catch (cause) {
      throw new Error(`reading certificate-authority ${cluster.caFile}`, { cause });
    }
  }
  if (cluster.tlsServerName) info.tlsServerName = cluster.tlsServerName;
  if (cluster.skipTLSVerify) info.insecureSkipTlsVerify = true;
  return info;
}

/** A {@link KubeApiClient} for a KubeConfig's current context. */
export function clientForKubeConfig(kubeConfig: KubeConfig): KubeApiClient {
  const apiServer = apiServerInfoOf(kubeConfig);
  return new KubeApiClient({
    rest: kubeConfig.makeApiClient(ClientNodeRestTransport),
    watch: new ClientNodeWatchTransport(kubeConfig),
    apiServer,
  });
}

/** The kubeconfig narrowed to one current context (shares the parsed entries). */
function withContext(base: KubeConfig, context: string): KubeConfig {
  const kubeConfig = new KubeConfig();
  kubeConfig.loadFromOptions({
    clusters: base.clusters,
    users: base.users,
    contexts: base.contexts,
    currentContext: context,
  });
  return kubeConfig;
}

/**
 * Loads a kubeconfig file.
 *
 * @throws Error `loading kubeconfig <path>` when the file cannot be read (the fs error as
 *   `cause`) or `loading kubeconfig <path>: not a valid kubeconfig` when it cannot be parsed
 *   (parse errors are not attached: they may quote the file).
 */
function loadKubeConfigFile(path: string): KubeConfig {
  const base = new KubeConfig();
  try {
    base.loadFromFile(path);
  } catch (cause) {
    const fsError = cause instanceof Error && 'code' in cause;
    throw new Error(
      `loading kubeconfig ${path}${fsError ? '' : ': not a valid kubeconfig'}`,
      fsError ? { cause } : undefined,
    );
  }
  return base;
}

/** {@link ClusterRegistry} over kubeconfig contexts, with client-node clients. */
export class KubeConfigClusterRegistry extends MapClusterRegistry {
  /**
   * One cluster per context of the kubeconfig at `path` (cluster id = context name).
   *
   * @throws Error `loading kubeconfig <path>` when the file cannot be read or parsed
   *   (parse errors are not attached: they may quote the file), or when a requested
   *   context does not exist or has no cluster.
   */
  static fromFile(path: string, options: FromFileOptions = {}): KubeConfigClusterRegistry {
    const base = loadKubeConfigFile(path);
    const names = options.contexts ?? base.contexts.map((c) => c.name);
    const configs = new Map<string, KubeConfig>();
    for (const name of names) {
      if (!base.getContextObject(name)) {
        throw new Error(`loading kubeconfig ${path}: no context ${JSON.stringify(name)}`);
      }
      configs.set(name, withContext(base, name));
    }
    return KubeConfigClusterRegistry.fromKubeConfigs(configs);
  }

  /**
   * One cluster per given KubeConfig (its current context), keyed by cluster id.
   *
   * @throws Error when a KubeConfig's current context has no cluster.
   */
  static fromKubeConfigs(
    configs: ReadonlyMap<string, KubeConfig> | Readonly<Record<string, KubeConfig>>,
  ): KubeConfigClusterRegistry {
    const pairs = configs instanceof Map ? [...configs.entries()] : Object.entries(configs);
    const clients = new Map<string, KubeClient>();
    for (const [id, kubeConfig] of pairs) clients.set(id, clientForKubeConfig(kubeConfig));
    return new KubeConfigClusterRegistry(clients);
  }
}

/**
 * The kubeconfig of a context's own identity, self-contained (certificate and key files read
 * into `*-data`), for a tool that acts as this runtime: kapp deploying PackageRepositories
 * (upstream: as the controller's ServiceAccount). Only the context, its cluster and its user
 * are kept. The result holds credentials: hand it only to a tool's environment.
 *
 * @param base - the loaded kubeconfig.
 * @param context - the context (cluster id).
 * @returns the kubeconfig as JSON (valid YAML).
 * @throws Error when the context or its cluster is missing, or a referenced file cannot be read
 *   (the message names the context and file, never contents).
 */
export function selfContainedKubeconfig(base: KubeConfig, context: string): string {
  const ctx = base.getContextObject(context);
  const cluster = ctx && base.getCluster(ctx.cluster);
  if (!ctx || !cluster) throw new Error(`kubeconfig context ${JSON.stringify(context)} has no cluster`);
  const read = (file: string | undefined, what: string): string | undefined => {
    if (!file) return undefined;
    try {
      return readFileSync(file).toString('base64');
    } catch (cause) {
      throw new Error(`reading ${what} ${file} of context ${JSON.stringify(context)}`, { cause });
    }
  };
  const user = ctx.user ? base.getUser(ctx.user) : null;
  const out = new KubeConfig();
  out.loadFromOptions({
    clusters: [
      { ...cluster, caFile: undefined, caData: cluster.caData ?? read(cluster.caFile, 'certificate-authority') },
    ],
    users: user
      ? [
          {
            ...user,
            certFile: undefined,
            keyFile: undefined,
            certData: user.certData ?? read(user.certFile, 'client-certificate'),
            keyData: user.keyData ?? read(user.keyFile, 'client-key'),
          },
        ]
      : [],
    contexts: [ctx],
    currentContext: context,
  });
  return out.exportConfig();
}

/**
 * The runtime's own identity per cluster, from the kubeconfig file at `kubeconfigPath`: for each
 * context (cluster id) its {@link selfContainedKubeconfig}, made on first use and kept for the
 * life of the process (the file is read once, on the first call). What kapp deploys
 * PackageRepositories with, in the embedded runtime and in the index-repo function alike.
 *
 * @returns the lookup; it throws what {@link selfContainedKubeconfig} throws, or what
 *   loading the file throws (`loading kubeconfig <path>[: not a valid kubeconfig]`).
 */
export function runtimeKubeconfigs(kubeconfigPath: string): (clusterId: string) => string {
  const made = new Map<string, string>();
  let base: KubeConfig | undefined;
  return (clusterId) => {
    let yaml = made.get(clusterId);
    if (yaml === undefined) {
      if (!base) {
        base = loadKubeConfigFile(kubeconfigPath);
      }
      yaml = selfContainedKubeconfig(base, clusterId);
      made.set(clusterId, yaml);
    }
    return yaml;
  };
}

/** App-identity transports {@link restTransportForKubeconfig} keeps open at most; the oldest is closed first. */
export const APP_READER_TRANSPORTS = 64;

/** Kept App-identity transports by the digest of their kubeconfig (in memory only: it holds a token). */
const appReaders = new Map<string, ClientNodeRestTransport>();

/**
 * A {@link RestTransport} acting as the identity of a kubeconfig given as YAML (the restricted
 * kubeconfig kapp gets for an App: its ServiceAccount token, or its kubeconfig Secret), for the
 * deploy stage's reads of the App's resources as the App itself. The same kubeconfig (the
 * ServiceAccount's token is cached, so one App's deploys hand the same one) gets the same
 * transport, and with it its kept connections; at most {@link APP_READER_TRANSPORTS} are kept,
 * the least recently asked for is closed first. A new token makes a new transport.
 *
 * @throws Error when the YAML is not a kubeconfig (its text is never quoted: it holds credentials).
 */
export function restTransportForKubeconfig(yaml: string): RestTransport {
  const key = createHash('sha256').update(yaml).digest('hex');
  const kept = appReaders.get(key);
  if (kept) {
    appReaders.delete(key);
    appReaders.set(key, kept);
    return kept;
  }
  const kubeConfig = new KubeConfig();
  try {
    kubeConfig.loadFromString(yaml);
  } catch {
    throw new Error('the App kubeconfig is not a valid kubeconfig');
  }
  const transport = kubeConfig.makeApiClient(ClientNodeRestTransport);
  appReaders.set(key, transport);
  while (appReaders.size > APP_READER_TRANSPORTS) {
    const [oldest, closing] = appReaders.entries().next().value as [string, ClientNodeRestTransport];
    appReaders.delete(oldest);
    closing.close();
  }
  return transport;
}
