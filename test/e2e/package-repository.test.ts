/**
 * e2e: PackageRepository through the whole index-repo flow (forwarder → vendir fetch → the fixed
 * repository template with ytt → `kapp deploy <name>.pkgr`) against the shared control plane and
 * the real tools (reference §3.12): an inline repository becomes Packages and PackageMetadatas
 * with upstream's status, one without `packages/` fails with upstream's exact text, and deleting
 * a repository removes its packages and then the repository.
 */
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import {
  packageDoc as authorPackageDoc,
  cleanUpAnnotations,
  expectRepoSucceeded,
  inlineRepositoryManifest,
  type PackagingObject,
  PKG,
  PKGM,
  PKGR,
  PKGR_STATUS_KEYS,
  packagesByRefName,
  waitRepo,
  waitRepoGone,
} from './packaging-support.js';
import { apply, getObject, k, RFC3339, suffix, useE2ERuntime } from './support.js';

const id = suffix();
const NS = {
  inline: `e2e-pkgr-inline-${id}`,
  failing: `e2e-pkgr-failing-${id}`,
  delete: `e2e-pkgr-delete-${id}`,
};

const REF_NAME = 'simple-app.corp.com';
const VERSIONS = ['1.0.0', '1.1.0+build.7'] as const;
/** The object names kapp-lambda stores them under (`packageObjectName`: `+` written `--`). */
const PACKAGE_NAMES = [`${REF_NAME}.1.0.0`, `${REF_NAME}.1.1.0--build.7`] as const;

/** A Package document with release notes and a foreign namespace (removed by the clean-up overlay). */
function packageDoc(version: string): object {
  const doc = authorPackageDoc(REF_NAME, version, { spec: { releaseNotes: `release ${version}` } }) as {
    metadata: Record<string, unknown>;
  };
  return { ...doc, metadata: { ...doc.metadata, namespace: 'somewhere-else' } };
}

/** An inline PackageRepository: one PackageMetadata and two Package files under `packages/<refName>/`. */
function inlineRepository(ns: string, name: string): object {
  const metadata = {
    apiVersion: 'data.packaging.carvel.dev/v1alpha1',
    kind: 'PackageMetadata',
    metadata: { name: REF_NAME },
    spec: { displayName: 'Simple App', shortDescription: 'an app for the e2e test' },
  };
  const paths: Record<string, string> = { [`packages/${REF_NAME}/metadata.yml`]: stringify(metadata) };
  for (const v of VERSIONS) paths[`packages/${REF_NAME}/${v}.yml`] = stringify(packageDoc(v));
  // Not a Package or PackageMetadata: the clean-up overlay drops it (it would need RBAC otherwise).
  paths[`packages/${REF_NAME}/other.yml`] = stringify({
    apiVersion: 'v1',
    kind: 'ConfigMap',
    metadata: { name: `dropped-${id}` },
  });
  return inlineRepositoryManifest(ns, name, paths);
}

const rt = useE2ERuntime(Object.values(NS));

describe('PackageRepository (index-repo through the real tools)', () => {
  it('an inline repository reconciles and its Packages and PackageMetadata exist with the clean-up annotations', async () => {
    const ns = NS.inline;
    const name = `inline-${id}`;
    await apply(inlineRepository(ns, name));
    const repo = await waitRepo(rt, ns, name);
    expectRepoSucceeded(repo);
    expect(repo.metadata.generation).toBe(1);
    expect(repo.status?.deploy?.stdout).toContain('PackageMetadata');

    const annotations = cleanUpAnnotations(ns, name);
    const meta = await getObject<PackagingObject>(PKGM, ns, REF_NAME);
    expect(meta, `PackageMetadata ${REF_NAME}`).toBeDefined();
    expect(meta?.metadata.annotations).toMatchObject(annotations);
    expect(meta?.spec).toMatchObject({ displayName: 'Simple App', shortDescription: 'an app for the e2e test' });
    for (const [i, version] of VERSIONS.entries()) {
      const pkg = await getObject<PackagingObject>(PKG, ns, PACKAGE_NAMES[i]!);
      expect(pkg, `Package ${PACKAGE_NAMES[i]}`).toBeDefined();
      expect(pkg?.metadata.annotations).toMatchObject(annotations);
      expect(pkg?.spec.refName).toBe(REF_NAME);
      expect(pkg?.spec.version).toBe(version);
      expect(pkg?.spec).toMatchObject({ releaseNotes: `release ${version}` });
    }
    // the overlay dropped the ConfigMap and the foreign namespace
    expect(await getObject('configmap', ns, `dropped-${id}`)).toBeUndefined();
    expect(await getObject(PKG, 'somewhere-else', PACKAGE_NAMES[0])).toBeUndefined();
    // kapp's app record of `<name>.pkgr`, labelling the packages
    const record = await getObject<{ data?: { spec?: string } }>('configmap', ns, `${name}.pkgr`);
    expect(record, `kapp app record ${name}.pkgr`).toBeDefined();
    const spec = JSON.parse(record?.data?.spec ?? '{}') as { labelKey?: string; labelValue?: string };
    expect(meta?.metadata.labels?.[spec.labelKey ?? '']).toBe(spec.labelValue);

    const listed = await packagesByRefName(ns, REF_NAME);
    expect(listed.map((p) => p.metadata.name).sort()).toEqual([...PACKAGE_NAMES].sort());
    expect(listed.map((p) => p.spec.version).sort()).toEqual([...VERSIONS].sort());
    expect(await packagesByRefName(ns, `other.${REF_NAME}`)).toEqual([]);
  });

  it('a repository without packages/ fails with upstream status', async () => {
    const ns = NS.failing;
    const name = `failing-${id}`;
    const message = "Invalid package repository content: must contain 'packages/' directory but did not";
    await apply(inlineRepositoryManifest(ns, name, { 'config/metadata.yml': stringify(packageDoc('1.0.0')) }));
    const repo = await waitRepo(rt, ns, name);
    const s = repo.status ?? {};
    for (const key of Object.keys(s)) expect(PKGR_STATUS_KEYS.has(key), `unexpected status key ${key}`).toBe(true);
    // pkg/pkgrepository/app_reconcile_test.go: condition, friendlyDescription and usefulErrorMessage
    expect(s.conditions).toEqual([{ type: 'ReconcileFailed', status: 'True', message }]);
    expect(s.friendlyDescription).toBe(`Reconcile failed: ${message}`);
    expect(s.usefulErrorMessage).toBe(message);
    expect(s.observedGeneration).toBe(1);
    expect(s.consecutiveReconcileFailures).toBeGreaterThanOrEqual(1);
    expect(s).not.toHaveProperty('consecutiveReconcileSuccesses');
    expect(s.fetch?.exitCode).toBe(0);
    expect(s.fetch?.error).toBeUndefined();
    expect(s.template?.exitCode).toBe(-1);
    expect(s.template?.error).toBe(message);
    expect(s.template?.updatedAt).toMatch(RFC3339);
    // deploy was never attempted
    expect(s).not.toHaveProperty('deploy');
    expect(await getObject('configmap', ns, `${name}.pkgr`)).toBeUndefined();
    expect((await k(['get', PKG, '-n', ns, '-o', 'name'])).stdout.trim()).toBe('');
  });

  it('deleting a repository removes its Packages, PackageMetadata, kapp app and then the repository', async () => {
    const ns = NS.delete;
    const name = `delete-${id}`;
    await apply(inlineRepository(ns, name));
    expectRepoSucceeded(await waitRepo(rt, ns, name));
    expect(await getObject(PKGM, ns, REF_NAME)).toBeDefined();
    expect(await packagesByRefName(ns, REF_NAME)).toHaveLength(2);

    // expectRepoSucceeded checked the finalizer: the repository can only disappear once the
    // delete path (kapp delete <name>.pkgr) removed it.
    await k(['delete', PKGR, name, '-n', ns, '--wait=false']);
    await waitRepoGone(ns, name);
    expect(await packagesByRefName(ns, REF_NAME)).toEqual([]);
    expect((await k(['get', `${PKG},${PKGM}`, '-n', ns, '-o', 'name'])).stdout.trim()).toBe('');
    expect(await getObject('configmap', ns, `${name}.pkgr`)).toBeUndefined();
  });
});
