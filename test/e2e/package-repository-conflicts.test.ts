/**
 * e2e: two or more PackageRepositories providing the same Package or PackageMetadata in one
 * namespace (reference §3.12 "Conflict resolution", upstream `package_repo_test.go`
 * `Test_PackageReposWithOverlappingPackages_*`). The rules are upstream's kapp rebase rule,
 * applied by the real kapp to the object already in the cluster: an object without the
 * package-repository-ref annotation is adopted; an identical one is left to its owner (noop, both
 * repositories succeed); otherwise the higher `packaging.carvel.dev/revision` wins; otherwise the
 * newcomer fails with `Conflicting resources: <Kind>/<name> is already present but not identical
 * (<reason>)`. Deleting a repository removes only the objects it owns.
 */
import { describe, expect, it } from 'vitest';
import {
  cleanUpAnnotations,
  expectRepoSucceeded,
  inlineRepositoryManifest,
  listObjects,
  type PackagingObject,
  PKG,
  PKGM,
  PKGR,
  PKGR_STATUS_KEYS,
  packageDoc,
  packageMetadataDoc,
  packagesPaths,
  type RepoObject,
  waitRepo,
  waitRepoGone,
} from './packaging-support.js';
import { apply, getObject, k, SEE_USEFUL, suffix, useE2ERuntime } from './support.js';

const id = suffix();
const NS = { identical: `e2e-pkgr-same-${id}`, revision: `e2e-pkgr-rev-${id}` };

const rt = useE2ERuntime(Object.values(NS));

const PKG_REF = 'pkg0.test.carvel.dev';
const PKG_NAME = `${PKG_REF}.0.0.0`;
const OTHER_REF = 'contooor.co.uk';
const META = 'shirt-mgr.co.uk';
const REVISION = 'packaging.carvel.dev/revision';
/** A `spec.template` other than pkg0's (upstream's `k8slt/some-other-image:latest` case). */
const OTHER_TEMPLATE = {
  template: { spec: { fetch: [{ imgpkgBundle: { image: 'k8slt/some-other-image:latest' } }] } },
};

/** upstream's Package of the overlap tests: `template.spec: {}` and nothing else. */
const pkg0 = (opts: Parameters<typeof packageDoc>[2] = {}) =>
  packageDoc(PKG_REF, '0.0.0', { ...opts, spec: { template: { spec: {} }, ...opts.spec } });

const shirtMgr = (shortDescription?: string) =>
  packageMetadataDoc(META, {
    displayName: 'shirt manager',
    providerName: 'myCorp',
    ...(shortDescription ? { shortDescription } : {}),
  });

/** Applies an inline repository of `docs` and waits for its first reconcile. */
async function deploy(ns: string, name: string, docs: object[]): Promise<RepoObject> {
  await apply(inlineRepositoryManifest(ns, name, packagesPaths(docs)));
  return await waitRepo(rt, ns, name);
}

/** The `<ns>/<name>` of the repository owning a Package or PackageMetadata. */
async function ownerOf(kind: string, ns: string, name: string): Promise<string | undefined> {
  const o = await getObject<PackagingObject>(kind, ns, name);
  return o?.metadata.annotations?.['packaging.carvel.dev/package-repository-ref'];
}

/** The line of the rebase overlay (upstream's, verbatim) that fails. */
const FAIL_LINE =
  '      overlay.yml:126 | #@     fail("Error: Conflicting resources: " + data.values.existing.kind + "/" + ' +
  'data.values.existing.metadata.name + " is already present but not identical (" + reason +")")';

/**
 * kapp's error when the rebase rule fails for `<kind>/<name>` (lowercase kind in kapp's resource
 * description), friendly as upstream's `updateLastDeploy` leaves it: trimmed, no whitespace
 * before a newline.
 */
function conflictMessage(ns: string, kind: 'Package' | 'PackageMetadata', name: string, reason: string): string {
  const resource = `${kind.toLowerCase()}/${name} (data.packaging.carvel.dev/v1alpha1) namespace: ${ns}`;
  return [
    `kapp: Error: create ${resource}:`,
    `  Applying rebase rule to ${resource}:`,
    '    Applying ytt (overlayContractV1):',
    '      Evaluating:',
    `- fail: Error: Conflicting resources: ${kind}/${name} is already present but not identical (${reason})`,
    '    in <toplevel>',
    FAIL_LINE,
  ].join('\n');
}

/** Asserts upstream's status of a repository whose kapp deploy hit the rebase rule's `fail`. */
function expectConflict(repo: RepoObject, usefulErrorMessage: string): void {
  const s = repo.status ?? {};
  const where = `${repo.metadata.namespace}/${repo.metadata.name}`;
  for (const key of Object.keys(s)) expect(PKGR_STATUS_KEYS.has(key), `unexpected status key ${key}`).toBe(true);
  const message = `Deploying: ${SEE_USEFUL}`;
  expect(s.conditions, where).toEqual([{ type: 'ReconcileFailed', status: 'True', message }]);
  expect(s.friendlyDescription).toBe(`Reconcile failed: ${message}`);
  expect(s.consecutiveReconcileFailures).toBeGreaterThanOrEqual(1);
  expect(s).not.toHaveProperty('consecutiveReconcileSuccesses');
  expect(s.fetch?.exitCode).toBe(0);
  expect(s.template?.exitCode).toBe(0);
  expect(s.deploy?.exitCode).toBe(1);
  expect(s.deploy?.error).toBe(message);
  expect(s.usefulErrorMessage).toBe(usefulErrorMessage);
  expect(s.deploy?.stderr).toBe(usefulErrorMessage);
}

describe.concurrent('overlapping PackageRepositories (the rebase rules through the real kapp)', () => {
  it('adoption, identical → noop, and each "not identical" reason; deleting one repository keeps the other’s packages', async () => {
    const ns = NS.identical;
    // A Package written before repositories carried the ref annotation (kapp-controller < 0.31).
    const handMade = {
      ...(pkg0({ spec: { releaseNotes: 'hand-made' } }) as object),
      metadata: { name: PKG_NAME, namespace: ns },
    };
    await k(['create', '-f', '-'], JSON.stringify(handMade));
    expect(await ownerOf(PKG, ns, PKG_NAME)).toBeUndefined();

    // repo1 adopts it (no owner annotation: treated as its own) and writes its own spec
    expectRepoSucceeded(await deploy(ns, 'repo1', [pkg0(), shirtMgr('get your shirts to work for you')]));
    expect(await ownerOf(PKG, ns, PKG_NAME)).toBe(`${ns}/repo1`);
    const adopted = await getObject<PackagingObject>(PKG, ns, PKG_NAME);
    expect(adopted?.spec).not.toHaveProperty('releaseNotes');
    expect(adopted?.metadata.annotations).toMatchObject(cleanUpAnnotations(ns, 'repo1'));

    // Then, all at once (each depends only on repo1's objects, and none changes them):
    // repo2 provides an identical pkg0 (noop: repo1 keeps it) and a package of its own ...
    const noop = (async () => {
      expectRepoSucceeded(await deploy(ns, 'repo2', [pkg0(), packageDoc(OTHER_REF, '0.22.0')]));
      expect(await ownerOf(PKG, ns, PKG_NAME)).toBe(`${ns}/repo1`);
      expect(await ownerOf(PKG, ns, `${OTHER_REF}.0.22.0`)).toBe(`${ns}/repo2`);
    })();
    // ... and each difference fails the newcomer with its reason, leaving the objects alone
    const labelled = { ...(pkg0() as object), metadata: { name: PKG_NAME, labels: { 'some.co.internal.label': 'v' } } };
    const conflicting: [string, object, 'Package' | 'PackageMetadata', string][] = [
      [
        'repo3',
        pkg0({ annotations: { 'some.co.internal.ann': 'value' } }),
        'Package',
        'mismatch in metadata.annotations',
      ],
      ['repo4', labelled, 'Package', 'mismatch in metadata.labels'],
      ['repo5', pkg0({ spec: OTHER_TEMPLATE }), 'Package', 'mismatch in spec.template'],
      ['repo6', pkg0({ spec: { releaseNotes: 'now with notes' } }), 'Package', 'adding spec.releaseNotes'],
      ['repo7', shirtMgr('now with dress shirts'), 'PackageMetadata', 'mismatch in spec.shortDescription'],
      ['repo8', shirtMgr(), 'PackageMetadata', 'missing spec.shortDescription'],
    ];
    await Promise.all([
      noop,
      ...conflicting.map(async ([name, doc, kind, reason]) => {
        const repo = await deploy(ns, name, [doc]);
        expectConflict(repo, conflictMessage(ns, kind, kind === 'Package' ? PKG_NAME : META, reason));
        // deleting a failed repository removes nothing of the others (and stops its retries)
        await k(['delete', PKGR, name, '-n', ns, '--wait=false']);
        await waitRepoGone(ns, name);
      }),
    ]);
    expect(await ownerOf(PKG, ns, PKG_NAME)).toBe(`${ns}/repo1`);
    expect((await getObject<PackagingObject>(PKG, ns, PKG_NAME))?.spec).toEqual({
      refName: PKG_REF,
      version: '0.0.0',
      template: { spec: {} },
    });
    expect((await getObject<PackagingObject>(PKGM, ns, META))?.spec.shortDescription).toBe(
      'get your shirts to work for you',
    );

    // deleting repo2 removes only its own package, not the identical one it left to repo1
    await k(['delete', PKGR, 'repo2', '-n', ns, '--wait=false']);
    await waitRepoGone(ns, 'repo2');
    expect(await getObject(PKG, ns, `${OTHER_REF}.0.22.0`)).toBeUndefined();
    expect(await ownerOf(PKG, ns, PKG_NAME)).toBe(`${ns}/repo1`);
    expect(await ownerOf(PKGM, ns, META)).toBe(`${ns}/repo1`);
    expect((await listObjects(PKG, ns)).map((p) => p.metadata.name)).toEqual([PKG_NAME]);
  });

  it('the higher packaging.carvel.dev/revision wins (2 > 1, 1.6.8 < 2, 2.0 > 2); an equal one conflicts', async () => {
    const ns = NS.revision;
    const rev = (r: string, spec?: Record<string, unknown>) =>
      pkg0({ annotations: { [REVISION]: r }, ...(spec ? { spec } : {}) });
    expectRepoSucceeded(await deploy(ns, 'repo1', [rev('1')]));
    expect(await ownerOf(PKG, ns, PKG_NAME)).toBe(`${ns}/repo1`);
    expectRepoSucceeded(await deploy(ns, 'repo2', [rev('2')]));
    expect(await ownerOf(PKG, ns, PKG_NAME)).toBe(`${ns}/repo2`);
    // at once: a lower revision (1.6.8 < 2 and < 2.0) is a noop whichever of the two it meets
    const [lower, higher] = await Promise.all([
      deploy(ns, 'repo3', [rev('1.6.8', { releaseNotes: 'older' })]),
      deploy(ns, 'repo4', [rev('2.0')]),
    ]);
    expectRepoSucceeded(lower);
    expectRepoSucceeded(higher);
    expect(await ownerOf(PKG, ns, PKG_NAME)).toBe(`${ns}/repo4`);
    expectConflict(
      await deploy(ns, 'repo5', [rev('2.0', OTHER_TEMPLATE)]),
      conflictMessage(ns, 'Package', PKG_NAME, 'mismatch in spec.template'),
    );
    const pkg = await getObject<PackagingObject>(PKG, ns, PKG_NAME);
    expect(pkg?.metadata.annotations?.[REVISION]).toBe('2.0');
    expect(pkg?.spec).not.toHaveProperty('releaseNotes');

    // repo1 lost the package to repo2: deleting repo1 leaves it in place
    await k(['delete', PKGR, 'repo1', '-n', ns, '--wait=false']);
    await waitRepoGone(ns, 'repo1');
    expect(await ownerOf(PKG, ns, PKG_NAME)).toBe(`${ns}/repo4`);
  });
});
