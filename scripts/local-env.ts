/**
 * The local environment `npm run demo` stands on: a kwok control plane, the project's CRDs, and
 * the servers its examples are fetched from, on 127.0.0.1 (git over smart HTTP, static HTTP for
 * archives and the helm repository, OCI registry for imgpkg bundles). They start empty: the demo
 * publishes the project's own examples to them (`./demo-examples.ts`); no S3 or SQS server, which
 * only the tests need.
 */
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { type Cluster, startCluster } from '../test/harness/cluster.js';
import { kubectl } from '../test/harness/kube.js';
import { type GitServer, startGitServer } from '../test/harness/servers/git.js';
import { type HttpServer, startHttpServer } from '../test/harness/servers/http.js';
import { type RegistryServer, startRegistry } from '../test/harness/servers/registry.js';

/** Repository root. */
export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** The namespace of the runtimes' leader-election Leases (`events/forwarder/leadership.ts`). */
export const LEASE_NAMESPACE_MANIFEST = JSON.stringify({
  apiVersion: 'v1',
  kind: 'Namespace',
  metadata: { name: 'kapp-lambda' },
});

/**
 * The RBAC of a PackageRepository's kapp (the ServiceAccount `kapp-lambda-pkgr` in `kapp-lambda`,
 * the runtime's namespace), relative to the repository root: every cluster a runtime serves
 * needs it (`functions/lib/deploy/run.ts` `packageRepositoryKubeconfig`).
 */
export const PKGR_KAPP_RBAC_FILE = 'infra/rbac/package-repository-kapp.yml';

/**
 * Applies the generated CRDs and waits until they are established; creates the `kapp-lambda`
 * namespace, where the runtime's leader-election Lease lives, and the identity a
 * PackageRepository's kapp runs as there ({@link PKGR_KAPP_RBAC_FILE}).
 */
export async function applyCrds(kubeconfigPath: string): Promise<void> {
  await kubectl(kubeconfigPath, ['apply', '--server-side', '-f', path.join(REPO_ROOT, 'infra', 'crds', 'crds.yaml')]);
  await kubectl(kubeconfigPath, ['apply', '-f', '-'], { input: LEASE_NAMESPACE_MANIFEST });
  await kubectl(kubeconfigPath, ['apply', '-f', path.join(REPO_ROOT, PKGR_KAPP_RBAC_FILE)]);
  await kubectl(kubeconfigPath, ['wait', '--for=condition=Established', '--timeout=60s', 'crd', '--all']);
}

/** The example Apps of `npm run demo` (and the cloud-mode e2e), each file one App. */
export const APP_EXAMPLES = ['inline-app.yml', 'hello-git.yml', 'hello-http.yml', 'hello-bundle.yml', 'hello-helm.yml'];
/** What the demo applies first: `rbac.yml`, the Apps, the examples' package repository. */
export const EXAMPLES = ['rbac.yml', ...APP_EXAMPLES, 'package-repository.yml'];
/**
 * Applied once the repository reconciled, as a user runs `kctrl package install` after `kctrl
 * package repository add` (kctrl waits for the repository): a PackageInstall applied before its
 * Packages exist fails `Package ... not found` until the repository's reconcile re-triggers it
 * (event-driven upgrades, docs/decisions.md D8).
 */
export const INSTALL_EXAMPLE = 'package-install.yml';

/** Reads an example manifest with its placeholders replaced. */
export async function renderExample(file: string, placeholders: Record<string, string>): Promise<string> {
  let text = await readFile(path.join(REPO_ROOT, 'examples', file), 'utf8');
  for (const [k, v] of Object.entries(placeholders)) text = text.split(k).join(v);
  return text;
}

/** The demo's servers, started empty. */
export interface LocalServers {
  readonly registry: RegistryServer;
  readonly git: GitServer;
  readonly http: HttpServer;
}

/** A started local environment. */
export interface LocalEnvironment {
  cluster: Cluster;
  servers: LocalServers;
  /** Stops servers and cluster; never throws. */
  stop(): Promise<void>;
}

/**
 * Starts cluster and servers in parallel and applies the CRDs.
 * @throws Error when something cannot start (what did start is stopped).
 */
export async function startLocalEnvironment(log: (m: string) => void): Promise<LocalEnvironment> {
  const started = await Promise.allSettled([
    startCluster({ log }),
    startRegistry(),
    startGitServer(),
    startHttpServer(),
  ]);
  const stop = async () => {
    // servers first, the cluster last (as they were started: the cluster is the slow one)
    for (const r of [...started.slice(1), started[0]]) {
      if (r.status === 'fulfilled') await r.value.stop().catch(() => undefined);
    }
  };
  const failed = started.find((r) => r.status === 'rejected');
  if (failed) {
    await stop();
    throw (failed as PromiseRejectedResult).reason;
  }
  const [c, registry, git, http] = started.map((r) => (r as PromiseFulfilledResult<unknown>).value) as [
    Cluster,
    RegistryServer,
    GitServer,
    HttpServer,
  ];
  try {
    await applyCrds(c.kubeconfigPath);
  } catch (err) {
    await stop();
    throw err;
  }
  return { cluster: c, servers: { registry, git, http }, stop };
}
