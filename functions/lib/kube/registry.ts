/**
 * Cluster registries: which API servers this runtime serves, by cluster id.
 *
 * {@link MapClusterRegistry} holds ready clients (tests pass fakes here);
 * {@link KubeConfigClusterRegistry} builds one {@link KubeApiClient} per kubeconfig
 * context with `@kubernetes/client-node` (the embedded default: every context of the
 * current kubeconfig is a cluster id). Clients and views are created once and reused. The Lambda
 * functions read kubeconfigs without client-node (`./kubeconfig-plain.ts`, re-exported here).
 *
 * @module
 */

import { readFileSync } from 'node:fs';
import { KubeConfig } from '@kubernetes/client-node';
import { KubeApiClient } from './client.js';
import type { PlainConnection } from './kubeconfig-auth.js';
import type { ApiServerInfo, KubeClient } from './port.js';
import { rateLimited } from './rate-limit.js';
import { ClientNodeRestTransport, ClientNodeWatchTransport } from './transport.js';
import { MapClusterRegistry } from './views-registry.js';

export {
  APP_READER_TRANSPORTS,
  restTransportForKubeconfig,
} from './kubeconfig-plain.js';
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

/**
 * A {@link KubeApiClient} for a KubeConfig's current context.
 *
 * @param clusterId - when given, its requests wait on that cluster's client-side limit
 *   (`./rate-limit.ts`, shared by every client of the id in the process); absent: no limit
 *   (tools, the bench's observer and tests that are not a runtime).
 */
export function clientForKubeConfig(kubeConfig: KubeConfig, clusterId?: string): KubeApiClient {
  const apiServer = apiServerInfoOf(kubeConfig);
  const transports = {
    rest: kubeConfig.makeApiClient(ClientNodeRestTransport),
    watch: new ClientNodeWatchTransport(kubeConfig),
  };
  return new KubeApiClient({
    ...(clusterId === undefined ? transports : rateLimited(clusterId, transports)),
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

/**
 * Cluster id of the cluster a runtime serves from inside it: there is no kubeconfig, so no
 * context name to take (kapp-controller, always in-cluster, has no cluster id at all).
 */
export const IN_CLUSTER_ID = 'in-cluster';

/**
 * A KubeConfig for an in-cluster connection (`inClusterConnection` of `./kubeconfig-auth.ts`:
 * client-go's `rest.InClusterConfig`), so the embedded runtime in a Pod speaks through the same
 * client-node transports as from a kubeconfig. The token stays a file (client-node's `tokenFile`
 * provider reads it again every 60 s, as the kubelet rotates the projected token); the CA is
 * inlined. client-node's own `loadFromCluster` is not used: it can only prefix the fixed mount
 * path, and a test (or an unusual mount) names another directory.
 *
 * @param conn - server, CA and token file; other credentials of a {@link PlainConnection} are
 *   not carried (an in-cluster connection has none).
 */
export function inClusterKubeConfig(conn: PlainConnection): KubeConfig {
  const kubeConfig = new KubeConfig();
  kubeConfig.loadFromClusterAndUser(
    {
      name: IN_CLUSTER_ID,
      server: conn.server,
      skipTLSVerify: false,
      ...(conn.ca ? { caData: Buffer.from(conn.ca).toString('base64') } : {}),
    },
    {
      name: IN_CLUSTER_ID,
      ...(conn.tokenFile ? { authProvider: { name: 'tokenFile', config: { tokenFile: conn.tokenFile } } } : {}),
    },
  );
  return kubeConfig;
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
   * The one cluster this process runs in ({@link inClusterKubeConfig}), as {@link IN_CLUSTER_ID}.
   *
   * @param conn - `inClusterConnection()`'s connection (which throws outside a Pod).
   */
  static inCluster(conn: PlainConnection): KubeConfigClusterRegistry {
    return KubeConfigClusterRegistry.fromKubeConfigs(new Map([[IN_CLUSTER_ID, inClusterKubeConfig(conn)]]));
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
    for (const [id, kubeConfig] of pairs) clients.set(id, clientForKubeConfig(kubeConfig, id));
    return new KubeConfigClusterRegistry(clients);
  }
}
