/**
 * e2e: kapp-lambda installed as an operator installs it (README "Install"), on a control plane
 * of its own (the uninstall deletes the `kapp-lambda` namespace, where the other files' runtimes
 * keep their Leases):
 *
 * 1. `kapp deploy -a kapp-lambda -f release/kapp-lambda-<version>.yml` on the empty cluster (no
 *    CRD applied by the test), then the embedded runtime reconciles the demo's inline App
 *    (`examples/rbac.yml`, `examples/inline-app.yml`) to ReconcileSucceeded;
 * 2. the uninstall: `kubectl delete -f <release> -l 'kapp-lambda.carvel.dev/uninstall!=keep'`
 *    (in a server dry run) would delete neither a CRD nor the global packaging namespace, and
 *    `kapp delete -a kapp-lambda` leaves the App, what it deployed, kapp's record of it, the
 *    CRDs and the global namespace in place;
 * 3. the Carvel package of kapp-lambda installs itself: the release applied again
 *    (`kubectl apply`, the CRDs and identities a PackageRepository needs), the package's bundle
 *    (`release/package/bundle`) and a repository holding its Package pushed to the local
 *    registry, a PackageRepository and a PackageInstall of `kapp-lambda.carvel.dev` with fleet
 *    values: the runtime reconciles it to ReconcileSucceeded, its kapp owning the forwarder
 *    Deployment (image from the values) and writing the fleet ConfigMap.
 *
 * The cluster has one kwok Node, which reports the forwarder's Pods Running and Ready (no
 * container runs), so kapp's wait rules for the Deployment hold as on a real cluster with the
 * fleet ConfigMap in place.
 */
import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULT_PACKAGING_GLOBAL_NAMESPACE } from '../../functions/lib/api/constants.js';
import {
  FORWARDER_FLEET_CONFIGMAP,
  KEEP_ON_UNINSTALL_LABEL,
  PACKAGE_DIR,
  PACKAGE_REF_NAME,
  packageFiles,
  packageVersion,
  RELEASE_DIR,
  RELEASE_NAMESPACE,
  releaseFileName,
} from '../../scripts/release.js';
import { type Cluster, startCluster } from '../harness/cluster.js';
import { pushBundle, REPO_ROOT, toolBin, toolEnv } from '../harness/fixtures.js';
import { PKGR } from './packaging-support.js';
import {
  type E2ECluster,
  type E2ERuntime,
  e2eCluster,
  servers,
  startRuntime,
  succeededAt,
  waitFor,
} from './support.js';

const execFileAsync = promisify(execFile);

const version = await packageVersion();
const RELEASE_FILE = path.join(RELEASE_DIR, releaseFileName(version));
/** The demo App this file installs, as `examples/inline-app.yml` names it. */
const DEMO = { ns: 'demo-inline', name: 'inline-app', configMap: 'inline-app-config' };
/** Namespace of the PackageRepository and PackageInstall of kapp-lambda itself. */
const PKG_NS = 'kapp-lambda-install';
const PKGI = 'packageinstalls.packaging.carvel.dev';
const CRDS = [
  'apps.kappctrl.k14s.io',
  'packageinstalls.packaging.carvel.dev',
  'packagerepositories.packaging.carvel.dev',
  'packages.data.packaging.carvel.dev',
  'packagemetadatas.data.packaging.carvel.dev',
];

let own: Cluster | undefined;
let cluster: E2ECluster;
let rt: E2ERuntime | undefined;

beforeAll(async () => {
  own = await startCluster({ nodes: 1, log: (m) => process.stderr.write(`[release-install] ${m}\n`) });
  cluster = e2eCluster(own.kubeconfigPath);
}, 180_000);
afterAll(async () => {
  await rt?.dispose();
  await own?.stop();
});

/** Runs the pinned kapp against the file's cluster (argv only): its stdout and stderr (the change table, then its progress and `Succeeded`); throws with its output when it fails. */
async function kapp(args: string[]): Promise<string> {
  try {
    const r = await execFileAsync(toolBin('kapp'), [...args, '--kubeconfig', cluster.kubeconfigPath, '--tty=false'], {
      env: toolEnv(),
      timeout: 120_000,
      maxBuffer: 16 * 1024 * 1024,
    });
    return `${r.stdout}${r.stderr}`;
  } catch (e) {
    const { stdout, stderr } = e as { stdout?: string; stderr?: string };
    throw new Error(`kapp ${args.join(' ')} failed: ${stderr ?? ''}\n${(stdout ?? '').slice(-4000)}`, { cause: e });
  }
}

/** Whether `kind/name` exists (cluster-scoped with `ns` undefined). */
async function exists(kind: string, name: string, ns?: string): Promise<boolean> {
  const r = await cluster.k(['get', kind, name, ...(ns ? ['-n', ns] : []), '-o', 'name'], undefined, false);
  if (r.code === 0) return true;
  if (/NotFound|not found/.test(r.stderr)) return false;
  throw new Error(`kubectl get ${kind} ${name}: ${r.stderr.trim()}`);
}

interface PkgiView {
  metadata: { generation: number };
  status?: { observedGeneration?: number; conditions?: Array<{ type: string; message?: string }>; version?: string };
}

describe('release install, uninstall and the package of kapp-lambda', () => {
  it('kapp deploy of the release on an empty cluster: the demo App reconciles', async () => {
    expect(await exists('crd', CRDS[0]!)).toBe(false);
    // kapp exits 0 only when every change applied and its wait rules held: the Deployment's too.
    await kapp(['deploy', '-a', 'kapp-lambda', '-f', RELEASE_FILE, '-y', '--wait-timeout=90s']);
    const forwarder = await cluster.getObject<{ status: { availableReplicas?: number } }>(
      'deployment',
      RELEASE_NAMESPACE,
      'kapp-lambda-forwarder',
    );
    expect(forwarder?.status.availableReplicas).toBe(2);
    for (const crd of CRDS) expect(await exists('crd', crd)).toBe(true);

    rt = await startRuntime([DEMO.ns, PKG_NS], {}, cluster);
    await cluster.k(['apply', '-f', path.join(REPO_ROOT, 'examples', 'rbac.yml')]);
    await cluster.k(['apply', '-f', path.join(REPO_ROOT, 'examples', 'inline-app.yml')]);
    const app = await rt.waitForApp(DEMO.ns, DEMO.name, succeededAt(1), 'ReconcileSucceeded', 60_000);
    expect(app.status?.conditions).toEqual([{ type: 'ReconcileSucceeded', status: 'True' }]);
    const cm = await cluster.getObject<{ data: Record<string, string> }>('configmap', DEMO.ns, DEMO.configMap);
    expect(cm?.data).toEqual({ greeting: 'hello from an inline App' });
  }, 180_000);

  it('uninstall leaves the Apps, their resources, the CRDs and the global namespace in place', async () => {
    // kubectl's way (README): the label selector leaves out what the uninstall keeps.
    const dry = await cluster.k([
      'delete',
      '--dry-run=server',
      '-f',
      RELEASE_FILE,
      '-l',
      `${KEEP_ON_UNINSTALL_LABEL}!=keep`,
    ]);
    const deleted = dry.stdout.trim().split('\n');
    expect(deleted).toContain(`namespace "${RELEASE_NAMESPACE}" deleted (server dry run)`);
    expect(deleted).toContain(
      `deployment.apps "kapp-lambda-forwarder" deleted from ${RELEASE_NAMESPACE} namespace (server dry run)`,
    );
    expect(deleted.filter((l) => /customresourcedefinition|packaging-global/.test(l))).toEqual([]);

    // kapp's way: the forwarder goes first in a real cluster; here the runtime stands for it.
    await rt!.stop();
    await kapp(['delete', '-a', 'kapp-lambda', '-y']);
    expect(await exists('namespace', RELEASE_NAMESPACE)).toBe(false);
    for (const crd of CRDS) expect(await exists('crd', crd)).toBe(true);
    expect(await exists('namespace', DEFAULT_PACKAGING_GLOBAL_NAMESPACE)).toBe(true);
    const app = await cluster.getApp(DEMO.ns, DEMO.name);
    expect(app?.metadata.deletionTimestamp).toBeUndefined();
    expect(app?.status?.conditions).toEqual([{ type: 'ReconcileSucceeded', status: 'True' }]);
    expect(await exists('configmap', DEMO.configMap, DEMO.ns)).toBe(true);
    expect(await exists('configmap', `${DEMO.name}.app`, DEMO.ns)).toBe(true);
  }, 180_000);

  it('the Carvel package of kapp-lambda installs itself', async () => {
    await cluster.k(['apply', '-f', RELEASE_FILE]);
    const registry = servers().registry;
    const bundle = await pushBundle(
      registry,
      `kapp-lambda/package:${version}`,
      path.join(RELEASE_DIR, PACKAGE_DIR, 'bundle'),
    );
    const repoPrefix = `${PACKAGE_DIR}/repository/`;
    const repoFiles = Object.fromEntries(
      [...(await packageFiles(version, bundle.digestRef))]
        .filter(([name]) => name.startsWith(repoPrefix))
        .map(([name, text]) => [name.slice(repoPrefix.length), text]),
    );
    expect(Object.keys(repoFiles).sort()).toEqual([
      '.imgpkg/images.yml',
      `packages/${PACKAGE_REF_NAME}/${version}.yml`,
      `packages/${PACKAGE_REF_NAME}/metadata.yml`,
    ]);
    // The repository's own ImagesLock lists the package's bundle by digest (pushBundle keeps it),
    // so the PackageRepository's kbld step resolves it from the lock.
    expect(repoFiles['.imgpkg/images.yml']).toContain(`image: ${bundle.digestRef}\n`);
    const repo = await pushBundle(registry, `kapp-lambda/repository:${version}`, repoFiles);
    const sa = 'kapp-lambda-installer';
    const values = [
      'forwarder:',
      '  image: registry.invalid/kapp-lambda/forwarder:e2e',
      '  replicas: 1',
      'fleet:',
      '  clusterId: e2e-cluster',
      '  region: eu-west-1',
      '  queueUrls:',
      '    fetch: https://sqs.eu-west-1.amazonaws.com/000000000000/fetch.fifo',
      '',
    ].join('\n');
    await cluster.apply(
      { apiVersion: 'v1', kind: 'Namespace', metadata: { name: PKG_NS } },
      { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: sa, namespace: PKG_NS } },
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'ClusterRoleBinding',
        metadata: { name: `${PKG_NS}:${sa}` },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'cluster-admin' },
        subjects: [{ kind: 'ServiceAccount', name: sa, namespace: PKG_NS }],
      },
      {
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name: 'kapp-lambda-values', namespace: PKG_NS },
        stringData: { 'values.yml': values },
      },
      {
        apiVersion: 'packaging.carvel.dev/v1alpha1',
        kind: 'PackageRepository',
        metadata: { name: 'kapp-lambda', namespace: PKG_NS },
        spec: { fetch: { imgpkgBundle: { image: repo.digestRef } } },
      },
      {
        apiVersion: 'packaging.carvel.dev/v1alpha1',
        kind: 'PackageInstall',
        metadata: { name: 'kapp-lambda', namespace: PKG_NS },
        spec: {
          serviceAccountName: sa,
          packageRef: { refName: PACKAGE_REF_NAME, versionSelection: { constraints: version } },
          values: [{ secretRef: { name: 'kapp-lambda-values' } }],
        },
      },
    );
    rt!.restart();

    let last: PkgiView | undefined;
    const pkgi = await waitFor(
      `PackageInstall ${PKG_NS}/kapp-lambda: ReconcileSucceeded`,
      async () => {
        last = await cluster.getObject<PkgiView>(PKGI, PKG_NS, 'kapp-lambda');
        const s = last?.status;
        return s?.observedGeneration === last?.metadata.generation &&
          s?.conditions?.some((c) => c.type === 'ReconcileSucceeded')
          ? last
          : undefined;
      },
      {
        timeoutMs: 60_000,
        intervalMs: 1000,
        describe: async () =>
          `last: ${JSON.stringify(last ?? null, null, 1)}\nrepository: ${JSON.stringify(
            (await cluster.getObject(PKGR, PKG_NS, 'kapp-lambda'))?.status ?? null,
          )}\napp: ${JSON.stringify((await cluster.getApp(PKG_NS, 'kapp-lambda'))?.status ?? null)}`,
      },
    );
    expect(pkgi.status?.version).toBe(version);

    const dep = await cluster.getObject<{
      metadata: { labels: Record<string, string> };
      spec: { replicas: number; template: { spec: { containers: Array<{ image: string }> } } };
    }>('deployment', RELEASE_NAMESPACE, 'kapp-lambda-forwarder');
    expect(dep?.spec.template.spec.containers.map((c) => c.image)).toEqual([
      'registry.invalid/kapp-lambda/forwarder:e2e',
    ]);
    expect(dep?.spec.replicas).toBe(1);
    const app = await cluster.getApp(PKG_NS, 'kapp-lambda');
    const label = app?.status?.deploy?.kapp?.associatedResources?.label ?? '';
    expect(label).toMatch(/^kapp\.k14s\.io\/app=\d+$/);
    expect(`kapp.k14s.io/app=${dep?.metadata.labels['kapp.k14s.io/app']}`).toBe(label);
    const fleet = await cluster.getObject<{ data: Record<string, string> }>(
      'configmap',
      RELEASE_NAMESPACE,
      FORWARDER_FLEET_CONFIGMAP,
    );
    expect(fleet?.data).toEqual({
      FORWARDER_CLUSTER_ID: 'e2e-cluster',
      AWS_REGION: 'eu-west-1',
      KAPP_LAMBDA_QUEUE_URL_FETCH: 'https://sqs.eu-west-1.amazonaws.com/000000000000/fetch.fifo',
    });
    // The package holds no CRD: they stay the release's, outside the PackageInstall's App.
    const crd = JSON.parse((await cluster.k(['get', 'crd', CRDS[0]!, '-o', 'json'])).stdout) as {
      metadata: { labels?: Record<string, string> };
    };
    expect(`kapp.k14s.io/app=${crd.metadata.labels?.['kapp.k14s.io/app']}`).not.toBe(label);
  }, 180_000);
});
