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
import { existsSync } from 'node:fs';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { TestProject } from 'vitest/node';
import { startCluster } from './cluster.js';

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

/**
 * Coordinates of the test servers as `startAllServers()` of `./servers.ts` returns them,
 * without `stop` (only JSON-serialisable values cross to test workers).
 * TODO(servers.ts): replace with
 *   `Omit<Awaited<ReturnType<typeof import('./servers.js').startAllServers>>, 'stop'>`
 * once test/harness/servers.ts exists.
 */
export type ProvidedServers = Readonly<Record<'s3' | 'registry' | 'git' | 'http', Record<string, unknown>>>;

declare module 'vitest' {
  export interface ProvidedContext {
    /** Admin kubeconfig path of the shared cluster. */
    kubeconfigPath: string;
    /** The shared cluster. */
    cluster: ProvidedCluster;
    /** The shared test servers; null while test/harness/servers.ts does not exist. */
    servers: ProvidedServers | null;
  }
}

/** Shape this module expects from `./servers.ts`. */
interface ServersModule {
  startAllServers(): Promise<{ stop(): Promise<void> } & Record<string, unknown>>;
}

/**
 * Starts the shared cluster and servers and provides them.
 * @returns the teardown vitest runs after the last test.
 * @throws Error when the cluster or the servers cannot start (whatever started is stopped).
 */
export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const log = (m: string) => console.error(`[global-setup] ${m}`);
  const started = Date.now();
  const cluster = await startCluster({ log });
  const stops: Array<() => Promise<void>> = [() => cluster.stop()];
  const teardown = async () => {
    for (const stop of stops.reverse()) await stop().catch((e: Error) => log(`teardown: ${e.message}`));
  };
  try {
    project.provide('kubeconfigPath', cluster.kubeconfigPath);
    project.provide('cluster', {
      name: cluster.name,
      kubeconfigPath: cluster.kubeconfigPath,
      server: cluster.server,
      kubectlPath: cluster.kubectlPath,
      nodeNames: cluster.nodeNames,
    });

    // TODO(servers.ts): switch to a static `import { startAllServers } from './servers.js'`
    // once test/harness/servers.ts exists; until then it is loaded only if present.
    const serversFile = fileURLToPath(new URL('./servers.ts', import.meta.url));
    if (existsSync(serversFile)) {
      const mod = (await import(pathToFileURL(serversFile).href)) as ServersModule;
      const servers = await mod.startAllServers();
      stops.push(() => servers.stop());
      const { stop: _stop, ...info } = servers;
      project.provide('servers', JSON.parse(JSON.stringify(info)) as ProvidedServers);
    } else {
      log('test/harness/servers.ts not found: servers not started');
      project.provide('servers', null);
    }
  } catch (err) {
    await teardown();
    throw err;
  }
  log(`ready in ${Date.now() - started}ms (cluster ${cluster.name} at ${cluster.server})`);
  return teardown;
}
