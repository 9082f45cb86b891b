/**
 * e2e: a package repository is indexed once for the fleet (issue 9 item 2). Two cluster ids, each
 * served by its own embedded runtime (its own forwarder, leader election and tools), share one
 * object store, as a fleet shares one bucket; both ids are contexts of the shared control plane,
 * each watching its own namespace. Both get a PackageRepository of the same imgpkg bundle,
 * pinned by digest (pushed to the local registry with the real imgpkg; its `.imgpkg/images.yml`
 * relocates the Package's bundle image, so kbld runs), under different names.
 *
 * Counted from the runtimes' command runners (`toolMetrics`): one vendir run and one template
 * pipeline (its three ytt runs and one kbld) in total; the second cluster runs kapp only. Both
 * clusters get the Packages and PackageMetadata, annotated with their own repository, and
 * upstream's ReconcileSucceeded status.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { pushBundle } from '../harness/fixtures.js';
import { fleetKubeconfig, PKGR_STATUS_KEYS, type RepoObject, waitRepo } from './packaging-support.js';
import {
  apply,
  applyCrds,
  createTenant,
  deleteNamespaces,
  type E2ERuntime,
  expectSucceededStatus,
  getObject,
  servers,
  startRuntime,
  suffix,
} from './support.js';

const id = suffix();
const CLUSTERS = [
  { context: `fleet-a-${id}`, ns: `e2e-pkgr-fleet-a-${id}`, name: `fleet-${id}` },
  { context: `fleet-b-${id}`, ns: `e2e-pkgr-fleet-b-${id}`, name: `mirror-${id}` },
] as const;

const REF_NAME = 'fleet-app.corp.com';
const VERSION = '1.0.0';
const APP_IMAGE_TAG = 'registry.invalid/fleet-app:1.0.0';
const APP_IMAGE_DIGEST = `registry.invalid/fleet-app@sha256:${'a'.repeat(64)}`;

const PKG = 'packages.data.packaging.carvel.dev';
const PKGM = 'packagemetadatas.data.packaging.carvel.dev';
interface PackagingObject {
  metadata: { annotations?: Record<string, string> };
  spec: { template?: { spec?: { fetch?: Array<{ imgpkgBundle?: { image?: string } }> } } };
}

/** The repository bundle: one PackageMetadata, one Package whose bundle image the lock relocates. */
const BUNDLE = {
  [`packages/${REF_NAME}/metadata.yml`]: stringify({
    apiVersion: 'data.packaging.carvel.dev/v1alpha1',
    kind: 'PackageMetadata',
    metadata: { name: REF_NAME },
    spec: { displayName: 'Fleet App' },
  }),
  [`packages/${REF_NAME}/${VERSION}.yml`]: stringify({
    apiVersion: 'data.packaging.carvel.dev/v1alpha1',
    kind: 'Package',
    metadata: { name: `${REF_NAME}.${VERSION}` },
    spec: {
      refName: REF_NAME,
      version: VERSION,
      template: {
        spec: {
          fetch: [{ imgpkgBundle: { image: APP_IMAGE_TAG } }],
          template: [{ ytt: {} }],
          deploy: [{ kapp: {} }],
        },
      },
    },
  }),
  '.imgpkg/images.yml': stringify({
    apiVersion: 'imgpkg.carvel.dev/v1alpha1',
    kind: 'ImagesLock',
    images: [{ image: APP_IMAGE_DIGEST, annotations: { 'kbld.carvel.dev/id': APP_IMAGE_TAG } }],
  }),
};

let dir = '';
const runtimes: E2ERuntime[] = [];
let bundleRef = '';

beforeAll(async () => {
  await applyCrds();
  await Promise.all(CLUSTERS.map((c) => createTenant(c.ns)));
  dir = await mkdtemp(path.join(tmpdir(), 'kapp-lambda-e2e-fleet-'));
  const kubeconfig = path.join(dir, 'kubeconfig');
  await fleetKubeconfig(
    kubeconfig,
    CLUSTERS.map((c) => c.context),
  );
  bundleRef = (await pushBundle(servers().registry, `pkgr-fleet-${id}:v1`, BUNDLE)).digestRef;
  for (const c of CLUSTERS) {
    runtimes.push(
      await startRuntime([c.ns], {
        kubeconfigPath: kubeconfig,
        contexts: [c.context],
        storeDir: path.join(dir, 'store'),
      }),
    );
  }
});

afterAll(async () => {
  for (const r of runtimes) await r.dispose();
  if (dir) await rm(dir, { recursive: true, force: true });
  await deleteNamespaces(CLUSTERS.map((c) => c.ns));
});

/** Runs per tool of one runtime's command runner. */
function toolRuns(rt: E2ERuntime): Record<string, number> {
  const snapshot = rt.runtime.toolMetrics.snapshot();
  return Object.fromEntries(Object.entries(snapshot).map(([tool, s]) => [tool, s.count]));
}

describe('PackageRepository: indexed once for the fleet', () => {
  it('two clusters, one pinned bundle: one fetch and one template pipeline in total, both get the Packages', async () => {
    const repos: RepoObject[] = [];
    for (const [i, c] of CLUSTERS.entries()) {
      await apply({
        apiVersion: 'packaging.carvel.dev/v1alpha1',
        kind: 'PackageRepository',
        metadata: { name: c.name, namespace: c.ns },
        spec: { syncPeriod: '10m', fetch: { imgpkgBundle: { image: bundleRef } } },
      });
      repos.push(await waitRepo(runtimes[i]!, c.ns, c.name));
    }

    // The first cluster fetched and templated (one pipeline: one ytt run and kbld); the
    // second found the pinned bundle indexed and ran kapp only.
    const [first, second] = runtimes.map(toolRuns);
    expect(first).toEqual({ vendir: 1, ytt: 1, kbld: 1, kapp: 1 });
    expect(second).toEqual({ kapp: 1 });

    for (const [i, c] of CLUSTERS.entries()) {
      const repo = repos[i]!;
      const s = expectSucceededStatus(repo, PKGR_STATUS_KEYS);
      // The index hit reports the recorded vendir lock config and kbld output, as a cached App does.
      expect(s.fetch?.stdout, c.context).toContain('kind: LockConfig');
      expect(s.fetch?.stdout, c.context).toContain(bundleRef.slice(bundleRef.indexOf('@') + 1));
      expect(repo.status?.template?.stderr, c.context).toContain(`resolve | final: ${APP_IMAGE_TAG}`);

      const annotation = { 'packaging.carvel.dev/package-repository-ref': `${c.ns}/${c.name}` };
      const meta = await getObject<PackagingObject>(PKGM, c.ns, REF_NAME);
      expect(meta?.metadata.annotations, `${c.context} PackageMetadata`).toMatchObject(annotation);
      const pkg = await getObject<PackagingObject>(PKG, c.ns, `${REF_NAME}.${VERSION}`);
      expect(pkg?.metadata.annotations, `${c.context} Package`).toMatchObject(annotation);
      // kbld relocated the Package's bundle image through the bundle's images.yml.
      expect(pkg?.spec.template?.spec?.fetch?.[0]?.imgpkgBundle?.image).toBe(APP_IMAGE_DIGEST);
    }
    expect(repos[1]!.status?.template?.stderr).toBe(repos[0]!.status?.template?.stderr);
  });
});
