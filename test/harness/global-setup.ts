/**
 * vitest globalSetup of the `integration` project (integration and e2e tests): starts one
 * shared local cluster (`./cluster.ts`) and the test servers (`./servers.ts`: S3, OCI
 * registry, git, static HTTP), provides their coordinates to tests, and stops everything
 * when the run ends. Tests read them with `inject('kubeconfigPath')`, `inject('cluster')`,
 * `inject('servers')` from 'vitest'.
 *
 * The cluster is also torn down when the vitest process dies without running teardown
 * (Ctrl-C, SIGTERM, SIGKILL): see the reaper in `./cluster.ts`.
 */
import type { TestProject } from 'vitest/node';
import { startCluster } from './cluster.js';
import { requireFixtures } from './fixtures.js';
import { type ServersInfo, startAllServers } from './servers.js';

/** Serialisable facts about the shared cluster, as provided to tests. */
export interface ProvidedCluster {
  /** kwokctl cluster name. */
  readonly name: string;
  /** Admin kubeconfig (certificates embedded, `system:masters`). Never log its contents. */
  readonly kubeconfigPath: string;
  /** API server URL, `https://127.0.0.1:<port>`. */
  readonly server: string;
  /** Locally built kubectl to run against it. */
  readonly kubectlPath: string;
  /** kwok fake Node names. */
  readonly nodeNames: readonly string[];
}

declare module 'vitest' {
  export interface ProvidedContext {
    /** Admin kubeconfig path of the shared cluster. */
    kubeconfigPath: string;
    /** The shared cluster. */
    cluster: ProvidedCluster;
    /** The shared test servers (S3, OCI registry, git, static HTTP) and their fixtures. */
    servers: ServersInfo;
  }
}

/**
 * Starts the shared cluster and the servers (in parallel) and provides them.
 * @returns the teardown vitest runs after the last test.
 * @throws Error when the cluster or the servers cannot start (whatever started is stopped).
 */
export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  // Global setup runs in vitest's main process, which the config's `test.env` does not reach:
  // the pinned AWS SDK works on Node 20, and its notice about future releases is noise here.
  process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= 'true';
  requireFixtures();
  const log = (m: string) => console.error(`[global-setup] ${m}`);
  const started = Date.now();
  const [cluster, servers] = await Promise.allSettled([startCluster({ log }), startAllServers()]);
  const teardown = async () => {
    if (servers.status === 'fulfilled') await servers.value.stop().catch((e: Error) => log(`teardown: ${e.message}`));
    if (cluster.status === 'fulfilled') await cluster.value.stop();
  };
  if (cluster.status === 'rejected' || servers.status === 'rejected') {
    await teardown();
    throw cluster.status === 'rejected' ? cluster.reason : (servers as PromiseRejectedResult).reason;
  }
  const c = cluster.value;
  project.provide('kubeconfigPath', c.kubeconfigPath);
  project.provide('cluster', {
    name: c.name,
    kubeconfigPath: c.kubeconfigPath,
    server: c.server,
    kubectlPath: c.kubectlPath,
    nodeNames: c.nodeNames,
  });
  const { stop: _stop, ...info } = servers.value;
  project.provide('servers', info);
  log(`ready in ${Date.now() - started}ms (cluster ${c.name} at ${c.server})`);
  return teardown;
}
