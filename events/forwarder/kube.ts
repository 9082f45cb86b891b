/**
 * The forwarder's cluster client: the plain `node:https` transports of
 * `functions/lib/kube/plain.ts` (its connection from `functions/lib/kube/kubeconfig-auth.ts`), never `@kubernetes/client-node`, whose module graph alone is
 * ≈ 14 MB of the forwarder's RSS (events/forwarder/README.md, "Memory"). In a Pod it reads with
 * its ServiceAccount; with `KUBECONFIG`, a context whose user has a client certificate, a token,
 * a token file or an `exec` plugin.
 *
 * @module
 */

import { inClusterConnection, plainConnectionOf } from '../../functions/lib/kube/kubeconfig-auth.js';
import { plainClient } from '../../functions/lib/kube/plain.js';
import type { KubeClient } from '../../functions/lib/kube/port.js';

/**
 * The forwarder's client for a kubeconfig context, or for the in-cluster ServiceAccount when no
 * kubeconfig is given.
 *
 * @param source.kubeconfig - kubeconfig file; absent: in-cluster.
 * @param source.context - its context; default the file's current context.
 * @param source.clusterId - the cluster's id: its requests wait on the client-side limit
 *   (`functions/lib/kube/rate-limit.ts`, kapp-controller's 20 QPS / burst 30 by default).
 * @throws Error when the kubeconfig cannot be loaded, its context needs what the plain transport
 *   does not speak (`auth-provider`, basic auth, impersonation, `proxy-url`: named in the
 *   message), or, without a kubeconfig, the process is not in a cluster.
 */
export async function forwarderKube(source: {
  kubeconfig?: string;
  context?: string;
  clusterId?: string;
}): Promise<KubeClient> {
  if (!source.kubeconfig) return plainClient(inClusterConnection(), source.clusterId);
  const plain = await plainConnectionOf(source.kubeconfig, source.context);
  if ('unsupported' in plain) {
    throw new Error(`kubeconfig ${source.kubeconfig}: the forwarder does not support ${plain.unsupported}`);
  }
  return plainClient(plain.connection, source.clusterId);
}
