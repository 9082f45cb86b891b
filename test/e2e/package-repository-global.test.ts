/**
 * e2e: the packaging global namespace (reference §3.12 "Namespace / global namespace", §3.13)
 * and a namespace deleted under its PackageRepository (§3.9).
 *
 * Real repositories reconcile in a global namespace and in a tenant namespace; the resolver
 * (`functions/lib/packaging/resolver.ts`, what the install function reads packages through)
 * then answers against the real API server: every namespace sees the global packages, presented
 * in itself; a local package overrides the global one with the same refName and version (and a
 * local PackageMetadata the global one of the same name); a namespace annotated
 * `kapp-controller.carvel.dev/exclude-global-packages` sees none. The global namespace is
 * configurable: this file uses its own, so it neither depends on nor disturbs the default one.
 * And a global namespace deleted and created again (a new uid) is no longer the one whose uid the
 * admin install recorded: its Packages are not trusted (`functions/lib/packaging/global-trust.ts`).
 */
import { describe, expect, it } from 'vitest';
import { Annotation, DEFAULT_PACKAGING_GLOBAL_NAMESPACE } from '../../functions/lib/api/constants.js';
import { Finalizer } from '../../functions/lib/api/index.js';
import { clientForKubeConfig } from '../../functions/lib/kube/registry.js';
import { checkGlobalNamespace, untrustedNote } from '../../functions/lib/packaging/global-trust.js';
import {
  getPackage,
  getPackageMetadata,
  listPackageMetadatas,
  listPackages,
  versionsOf,
} from '../../functions/lib/packaging/resolver.js';
import { loadKubeConfig } from '../harness/kube.js';
import {
  cleanUpAnnotations,
  expectRepoSucceeded,
  inlineRepositoryManifest,
  listObjects,
  PKG,
  PKGR,
  packageDoc,
  packageMetadataDoc,
  packagesPaths,
  waitRepo,
  waitRepoGone,
} from './packaging-support.js';
import { apply, getObject, k, kubeconfigPath, suffix, useE2ERuntime, waitFor } from './support.js';

const id = suffix();
const NS = {
  global: `e2e-pkg-global-${id}`,
  local: `e2e-pkg-local-${id}`,
  plain: `e2e-pkg-plain-${id}`,
  excluded: `e2e-pkg-excl-${id}`,
  doomed: `e2e-pkg-doomed-${id}`,
  replaced: `e2e-pkg-replaced-${id}`,
};
const GLOBAL = NS.global;
const opts = { globalNamespace: GLOBAL };

const REF = 'app.global.test';
const LOCAL_REF = 'only.local.test';

const rt = useE2ERuntime([NS.global, NS.local, NS.doomed], { tenants: [NS.plain, NS.excluded] });

/** A reader over the shared cluster with the runtime's own client (the resolver's port). */
const kube = () => clientForKubeConfig(loadKubeConfig(kubeconfigPath));

const notes = (p: { spec: { releaseNotes?: string } }) => p.spec.releaseNotes;

describe.concurrent('global packages through the resolver, and namespace deletion', () => {
  it('a global repository provides its packages to every namespace; local overrides; excluded sees none', async () => {
    await k(['annotate', 'namespace', NS.excluded, `${Annotation.ExcludeGlobalPackages}=`]);
    const globalDocs = [
      packageMetadataDoc(REF, { displayName: 'global app' }),
      packageDoc(REF, '1.0.0', { spec: { releaseNotes: 'global 1.0.0' } }),
      packageDoc(REF, '2.0.0+build.1', { spec: { releaseNotes: 'global 2.0.0' } }),
    ];
    // the local repository provides an identical 1.0.0, a different 2.0.0+build.1 and
    // PackageMetadata, and a package of its own: no conflict across namespaces (§3.12)
    const localDocs = [
      packageMetadataDoc(REF, { displayName: 'local app' }),
      globalDocs[1] as object,
      packageDoc(REF, '2.0.0+build.1', { spec: { releaseNotes: 'local 2.0.0' } }),
      packageDoc(LOCAL_REF, '0.1.0'),
    ];
    await apply(
      inlineRepositoryManifest(GLOBAL, 'global', packagesPaths(globalDocs)),
      inlineRepositoryManifest(NS.local, 'local', packagesPaths(localDocs)),
    );
    expectRepoSucceeded(await waitRepo(rt, GLOBAL, 'global'));
    expectRepoSucceeded(await waitRepo(rt, NS.local, 'local'));
    const client = kube();

    // a namespace without packages sees the global ones, presented in itself
    const plain = await listPackages(client, NS.plain, opts);
    expect(plain.map((p) => [p.metadata.namespace, p.spec.refName, p.spec.version, notes(p)])).toEqual([
      [NS.plain, REF, '1.0.0', 'global 1.0.0'],
      [NS.plain, REF, '2.0.0+build.1', 'global 2.0.0'],
    ]);
    expect(plain[0]?.metadata.annotations).toMatchObject(cleanUpAnnotations(GLOBAL, 'global'));
    expect(await versionsOf(client, NS.plain, REF, opts)).toEqual(['1.0.0', '2.0.0+build.1']);
    const viaGet = await getPackage(client, NS.plain, REF, '2.0.0+build.1', opts);
    expect([viaGet?.metadata.namespace, notes(viaGet ?? { spec: {} })]).toEqual([NS.plain, 'global 2.0.0']);
    expect((await getPackageMetadata(client, NS.plain, REF, opts))?.spec.displayName).toBe('global app');
    // ... which the API server itself does not list there (CRDs; see docs/packages.md, "Global packages")
    expect(await listObjects(PKG, NS.plain)).toEqual([]);

    // the local namespace: its own objects win by identity, the rest comes from the global one
    const local = await listPackages(client, NS.local, opts);
    expect(local.map((p) => [p.spec.refName, p.spec.version, notes(p)])).toEqual([
      [REF, '1.0.0', 'global 1.0.0'],
      [REF, '2.0.0+build.1', 'local 2.0.0'],
      [LOCAL_REF, '0.1.0', undefined],
    ]);
    expect(local.every((p) => p.metadata.namespace === NS.local)).toBe(true);
    expect(local[1]?.metadata.annotations).toMatchObject(cleanUpAnnotations(NS.local, 'local'));
    expect(notes((await getPackage(client, NS.local, REF, '2.0.0+build.1', opts)) ?? { spec: {} })).toBe('local 2.0.0');
    const metas = await listPackageMetadatas(client, NS.local, opts);
    expect(metas.map((m) => [m.metadata.name, m.spec.displayName])).toEqual([[REF, 'local app']]);
    expect(await listPackages(client, NS.local, { ...opts, refName: LOCAL_REF })).toHaveLength(1);

    // the global namespace sees its own; the excluded one sees nothing
    expect((await listPackages(client, GLOBAL, opts)).map((p) => p.metadata.namespace)).toEqual([GLOBAL, GLOBAL]);
    expect(await listPackages(client, NS.excluded, opts)).toEqual([]);
    expect(await listPackageMetadatas(client, NS.excluded, opts)).toEqual([]);
    expect(await getPackage(client, NS.excluded, REF, '1.0.0', opts)).toBeUndefined();
    expect(await getPackageMetadata(client, NS.excluded, REF, opts)).toBeUndefined();
    // the global namespace is a setting: under the default one these packages are not global
    expect(GLOBAL).not.toBe(DEFAULT_PACKAGING_GLOBAL_NAMESPACE);
    expect(await listPackages(client, NS.plain, { refName: REF })).toEqual([]);

    // deleting the local repository uncovers the global package again, in place
    await k(['delete', PKGR, 'local', '-n', NS.local, '--wait=false']);
    await waitRepoGone(NS.local, 'local');

    expect((await listPackages(client, NS.local, opts)).map((p) => [p.spec.version, notes(p)])).toEqual([
      ['1.0.0', 'global 1.0.0'],
      ['2.0.0+build.1', 'global 2.0.0'],
    ]);
    expect(await listObjects(PKG, GLOBAL)).toHaveLength(2);
  });

  it('a global namespace deleted and created again has a new uid: its Packages are not trusted, and the note says why', async () => {
    const ns = NS.replaced;
    const global = { globalNamespace: ns };
    const uidOf = async () => (await kube().getNamespace(ns))?.metadata.uid;
    const withPackage = async () => {
      await apply({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: ns } });
      await apply({ ...packageDoc(REF, '1.0.0'), metadata: { name: `${REF}.1.0.0`, namespace: ns } });
    };
    await withPackage();
    const recorded = (await uidOf()) as string;
    expect(await versionsOf(kube(), NS.plain, REF, { ...global, globalNamespaceUid: recorded })).toEqual(['1.0.0']);

    await k(['delete', 'namespace', ns, '--wait=false']);
    await waitFor(`namespace ${ns} gone`, async () => ((await uidOf()) === undefined ? true : undefined), {
      timeoutMs: 60_000,
      intervalMs: 500,
    });
    await withPackage();
    const live = (await uidOf()) as string;
    expect(live).not.toBe(recorded);
    expect(await versionsOf(kube(), NS.plain, REF, { ...global, globalNamespaceUid: recorded })).toEqual([]);
    expect(
      await getPackage(kube(), NS.plain, REF, '1.0.0', { ...global, globalNamespaceUid: recorded }),
    ).toBeUndefined();
    const trust = await checkGlobalNamespace(kube(), ns, recorded);
    expect(trust).toEqual({
      trusted: false,
      reason: `namespace ${ns} has uid ${live}, not the uid ${recorded} recorded when kapp-lambda was installed (created by someone else, or deleted and created again)`,
    });
    expect(untrustedNote(trust.trusted ? '' : trust.reason)).toMatch(
      /^; the Packages of the global namespace were not trusted: namespace /,
    );
    await k(['delete', 'namespace', ns, '--wait=false']);
  });

  it('deleting the namespace of a reconciled repository does not hang on its finalizer', async () => {
    const ns = NS.doomed;
    await apply(inlineRepositoryManifest(ns, 'doomed', packagesPaths([packageDoc(REF, '1.0.0')])));
    const repo = await waitRepo(rt, ns, 'doomed');
    expectRepoSucceeded(repo);
    expect(repo.metadata.finalizers).toContain(Finalizer.PackageRepository);

    await k(['delete', 'namespace', ns, '--wait=false']);
    await waitFor(
      `namespace ${ns} gone`,
      async () => {
        const r = await k(['get', 'namespace', ns, '-o', 'name'], undefined, false);
        return r.code !== 0 && /NotFound/.test(r.stderr) ? true : undefined;
      },
      {
        timeoutMs: 120_000,
        intervalMs: 1000,
        describe: async () =>
          `namespace: ${(await k(['get', 'namespace', ns, '-o', 'json'], undefined, false)).stdout}\n` +
          `repository: ${JSON.stringify((await getObject(PKGR, ns, 'doomed')) ?? null)}`,
      },
    );
    // the finalizer went the upstream way (§3.9): `kapp delete doomed.pkgr` ran and succeeded
    const deletes = rt.records.filter(
      (r) => r.msg === 'stage run' && r.obj.stage === 'delete' && String(r.obj.object).endsWith(`/${ns}/doomed`),
    );
    // Under load a first `kapp delete` can race the namespace controller (it deletes the same
    // objects and kapp's record at once) and fail; upstream retries it with the failure backoff, and
    // so does this. What must hold: it ends with a successful delete, and no attempt was anything
    // but a failed (retried) one before it. A failed attempt's error is printed for the CI log.
    for (const r of deletes.filter((d) => d.obj.outcome !== 'deleted')) {
      console.warn(`retried delete of ${ns}/doomed: ${String(r.obj.outcome)}: ${String(r.obj.error)}`);
    }
    expect(deletes.at(-1)?.obj.outcome).toBe('deleted');
    expect(deletes.slice(0, -1).map((r) => r.obj.outcome)).toEqual(deletes.slice(0, -1).map(() => 'failed'));
  });
});
