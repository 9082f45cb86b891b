/**
 * The local environment `npm run demo` and `npm start` (without a kubeconfig) stand on: a
 * kwok control plane, the project's CRDs, and the fixture servers on 127.0.0.1 (git, helm
 * repository and archives over HTTP, OCI registry with imgpkg bundles, S3).
 */
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { type Cluster, startCluster } from '../test/harness/cluster.js';
import { requireFixtures } from '../test/harness/fixtures.js';
import { kubectl } from '../test/harness/kube.js';
import { type AllServers, startAllServers } from '../test/harness/servers.js';

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
export const APP_EXAMPLES = [
  'inline-app.yml',
  'simple-app-git.yml',
  'simple-app-http.yml',
  'simple-app-bundle.yml',
  'podinfo-helm.yml',
];
/** What the demo applies first: `rbac.yml`, the Apps, the kadras repository. */
export const EXAMPLES = ['rbac.yml', ...APP_EXAMPLES, 'kadras-repository.yml'];
/**
 * Applied once the repository reconciled, as a user runs `kctrl package install` after `kctrl
 * package repository add` (kctrl waits for the repository): a PackageInstall applied before its
 * Packages exist fails `Package ... not found` until the repository's reconcile re-triggers it
 * (event-driven upgrades, docs/decisions.md D8).
 */
export const INSTALL_EXAMPLE = 'kadras-metrics-server-install.yml';

/** Placeholder → value, for the example manifests (see examples/README.md). */
export function examplePlaceholders(servers: Omit<AllServers, 'stop'>): Record<string, string> {
  return {
    __GIT_URL__: servers.git.baseUrl,
    __HELM_REPO_URL__: servers.http.helmRepo?.url ?? `${servers.http.baseUrl}/charts`,
    __REGISTRY__: servers.registry.host,
    __HTTP_URL__: servers.http.baseUrl,
  };
}

/** Reads an example manifest with its placeholders replaced. */
export async function renderExample(file: string, placeholders: Record<string, string>): Promise<string> {
  let text = await readFile(path.join(REPO_ROOT, 'examples', file), 'utf8');
  for (const [k, v] of Object.entries(placeholders)) text = text.split(k).join(v);
  return text;
}

/** A started local environment. */
export interface LocalEnvironment {
  cluster: Cluster;
  servers: AllServers;
  /** Stops servers and cluster; never throws. */
  stop(): Promise<void>;
}

/**
 * Starts cluster and servers in parallel and applies the CRDs.
 * @throws Error when something cannot start (what did start is stopped).
 */
export async function startLocalEnvironment(log: (m: string) => void): Promise<LocalEnvironment> {
  requireFixtures();
  const [c, s] = await Promise.allSettled([startCluster({ log }), startAllServers()]);
  const stop = async () => {
    if (s.status === 'fulfilled') await s.value.stop().catch(() => undefined);
    if (c.status === 'fulfilled') await c.value.stop().catch(() => undefined);
  };
  if (c.status === 'rejected' || s.status === 'rejected') {
    await stop();
    throw c.status === 'rejected' ? c.reason : (s as PromiseRejectedResult).reason;
  }
  try {
    await applyCrds(c.value.kubeconfigPath);
  } catch (err) {
    await stop();
    throw err;
  }
  return { cluster: c.value, servers: s.value, stop };
}
