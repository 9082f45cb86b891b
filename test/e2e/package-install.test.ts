/**
 * e2e: PackageInstall through the install function and the App pipeline on the shared control
 * plane with the real tools (reference §2.3, §3.9, §3.11): an inline PackageRepository provides
 * two versions of a small package (one ytt ConfigMap); a PackageInstall with constraints gets
 * the highest matching version as an App (same name, provenance annotations, controller
 * ownerReference), its values Secret reaches the first template step, its status mirrors the
 * App's (upstream `packageinstall_test.go` shape), the downgrade guard stops a lower version
 * with upstream's message, and deleting it removes the App (and what the App deployed) first,
 * then the PackageInstall. Kubernetes-version constraints are checked against the control
 * plane's real version: a Package requiring `>=1.99.0` is filtered with upstream's exact
 * selection message, and `packaging.carvel.dev/ignore-kubernetes-version-selection` installs it.
 * Prereleases need `prereleases: {}` unless the constraint is one exact prerelease; an App of
 * the same name is taken over; an install waiting for a Package no repository announces recovers
 * by upstream's rate-limited requeue. The kadras repository bundle (relocated to the local
 * registry by `test/harness/kadras.ts`) installs metrics-server with values
 * from a Secret that reach its first template step, with upstream's placeholder Secrets for the
 * repository's and the package's bundle fetches.
 */
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { Finalizer } from '../../functions/lib/api/index.js';
import { relocateKadras } from '../harness/kadras.js';
import { tenantManifests } from '../harness/kube.js';
import {
  apply,
  getObject,
  inlineConfigMapApp,
  k,
  SA,
  SEE_USEFUL,
  servers,
  succeededAt,
  suffix,
  useE2ERuntime,
  waitFor,
  yttConfigMap,
} from './support.js';

const id = suffix();
const NS = `e2e-pkgi-${id}`;
/** The upgrade test's namespace: its own repository, so the first tests' Packages do not meet it. */
const NS_UP = `e2e-pkgi-up-${id}`;
const REF_NAME = 'greeter.e2e.carvel.dev';
/** Two versions, 2.0.0 requiring a Kubernetes newer than the control plane's. */
const KUBE_REF = 'kube.e2e.carvel.dev';
/** 1.0.0 and the prerelease 1.1.0-rc.1. */
const PRE_REF = 'pre.e2e.carvel.dev';
/** The kadras install's namespace: the kadras repository (14 Packages) stays out of {@link NS}. */
const NS_KADRAS = `e2e-pkgi-kadras-${id}`;
const PKGI = 'packageinstalls.packaging.carvel.dev';
const PKGR = 'packagerepositories.packaging.carvel.dev';
const PKG = 'packages.data.packaging.carvel.dev';
const APPS = 'apps.kappctrl.k14s.io';

/** The App as this file reads it: with its annotations and owner references. */
interface GeneratedApp {
  metadata: { annotations?: Record<string, string>; ownerReferences?: unknown[] };
  spec: Record<string, unknown>;
}

interface PkgiObject {
  metadata: { name: string; generation: number; finalizers?: string[]; uid: string };
  status?: Record<string, unknown>;
}

/**
 * A Package of `version`: an inline ytt ConfigMap (`name`, default `greeting`) with `greeting`
 * and `version`; `refName` default {@link REF_NAME}, `kube` its `kubernetesVersionSelection`.
 */
function packageDoc(version: string, refName = REF_NAME, kube?: string): object {
  return {
    apiVersion: 'data.packaging.carvel.dev/v1alpha1',
    kind: 'Package',
    metadata: { name: `${refName}.${version}` },
    spec: {
      refName,
      version,
      ...(kube ? { kubernetesVersionSelection: { constraints: kube } } : {}),
      template: {
        spec: {
          fetch: [
            {
              inline: {
                paths: {
                  'config.yml': yttConfigMap('#@ data.values.name', {
                    greeting: '#@ data.values.greeting',
                    version: `"${version}"`,
                  }),
                  'values.yml': '#@data/values\n---\nname: greeting\ngreeting: default\n',
                },
              },
            },
          ],
          template: [{ ytt: {} }],
          deploy: [{ kapp: {} }],
        },
      },
    },
  };
}

function repository(name: string, versions = ['1.0.0', '2.0.0'], namespace = NS): object {
  const paths: Record<string, string> = {
    [`packages/${REF_NAME}/metadata.yml`]: stringify({
      apiVersion: 'data.packaging.carvel.dev/v1alpha1',
      kind: 'PackageMetadata',
      metadata: { name: REF_NAME },
      spec: { displayName: 'Greeter' },
    }),
  };
  for (const v of versions) paths[`packages/${REF_NAME}/${v}.yml`] = stringify(packageDoc(v));
  if (namespace === NS) {
    // Kubernetes-version constraints against the control plane's real version (v1.34.x).
    paths[`packages/${KUBE_REF}/1.0.0.yml`] = stringify(packageDoc('1.0.0', KUBE_REF, '>=1.20.0'));
    paths[`packages/${KUBE_REF}/2.0.0.yml`] = stringify(packageDoc('2.0.0', KUBE_REF, '>=1.99.0'));
    paths[`packages/${PRE_REF}/1.0.0.yml`] = stringify(packageDoc('1.0.0', PRE_REF));
    paths[`packages/${PRE_REF}/1.1.0-rc.1.yml`] = stringify(packageDoc('1.1.0-rc.1', PRE_REF));
  }
  return {
    apiVersion: 'packaging.carvel.dev/v1alpha1',
    kind: 'PackageRepository',
    metadata: { name, namespace },
    spec: { fetch: { inline: { paths } } },
  };
}

function packageInstall(
  name: string,
  constraints: string,
  serviceAccountName = SA,
  namespace = NS,
  extra: Record<string, unknown> = {},
  refName = REF_NAME,
): object {
  return {
    apiVersion: 'packaging.carvel.dev/v1alpha1',
    kind: 'PackageInstall',
    metadata: { name, namespace },
    spec: {
      ...extra,
      serviceAccountName,
      packageRef: { refName, versionSelection: { constraints } },
      values: [{ secretRef: { name: `${name}-values` } }],
    },
  };
}

const rt = useE2ERuntime([NS, NS_UP, NS_KADRAS]);

async function waitPkgi(
  name: string,
  what: string,
  pred: (p: PkgiObject) => boolean,
  namespace = NS,
): Promise<PkgiObject> {
  let last: PkgiObject | undefined;
  return await waitFor(
    `PackageInstall ${namespace}/${name}: ${what}`,
    async () => {
      last = await getObject<PkgiObject>(PKGI, namespace, name);
      return last && pred(last) ? last : undefined;
    },
    {
      timeoutMs: 120_000,
      intervalMs: 500,
      describe: () =>
        `last: ${JSON.stringify(last ?? null, null, 1)}\nlog: ${rt.records
          .filter((r) => typeof r.obj.object === 'string' && r.obj.object.includes(`/${namespace}/`))
          .slice(-20)
          .map((r) => JSON.stringify({ level: r.level, msg: r.msg, ...r.obj }))
          .join('\n')}`,
    },
  );
}

/** The values Secret `<name>-values` of a PackageInstall. */
function valuesSecret(name: string, values: string, namespace = NS): object {
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: { name: `${name}-values`, namespace },
    stringData: { 'values.yml': values },
  };
}

/** Waits until the PackageInstall and its App are both gone (the App first: its finalizer holds the PackageInstall). */
async function waitBothGone(name: string): Promise<void> {
  await waitFor(
    `App and PackageInstall ${NS}/${name} gone`,
    async () => {
      const [a, p] = await Promise.all([getObject(APPS, NS, name), getObject(PKGI, NS, name)]);
      return !a && !p ? true : undefined;
    },
    { timeoutMs: 120_000, intervalMs: 1000 },
  );
}

/** Waits until the Package `name` exists in {@link NS} (its repository reconciled). */
async function waitPackage(name: string): Promise<void> {
  await waitFor(`Package ${NS}/${name} indexed`, async () => ((await getObject(PKG, NS, name)) ? true : undefined), {
    timeoutMs: 120_000,
    intervalMs: 1000,
  });
}

/** The controller ownerReference of an App to its PackageInstall (upstream `SetControllerReference`). */
const controllerRef = (name: string, uid: string) => ({
  apiVersion: 'packaging.carvel.dev/v1alpha1',
  kind: 'PackageInstall',
  name,
  uid,
  controller: true,
  blockOwnerDeletion: true,
});

const conditionOf = (p: PkgiObject) => (p.status?.conditions as Array<{ type: string }> | undefined)?.[0]?.type;

describe('PackageInstall (install function, App pipeline, real tools)', () => {
  it('installs the highest matching version with values, guards downgrades, deletes App first', async () => {
    const name = `greeter-${id}`;
    await apply(repository(`repo-${id}`));
    await waitFor(
      'the six Packages indexed',
      async () => {
        const r = await k(['get', PKG, '-n', NS, '-o', 'name']);
        return r.stdout.trim().split('\n').filter(Boolean).length === 6 ? true : undefined;
      },
      {
        timeoutMs: 120_000,
        intervalMs: 1000,
        describe: async () => JSON.stringify(await getObject(PKGR, NS, `repo-${id}`)),
      },
    );
    await apply(valuesSecret(name, 'greeting: from-secret\n'), packageInstall(name, '>=1.0.0'));

    const installed = await waitPkgi(name, 'ReconcileSucceeded', (p) => conditionOf(p) === 'ReconcileSucceeded');
    // Upstream packageinstall_test.go's expected status, exactly.
    expect(installed.status).toEqual({
      conditions: [{ type: 'ReconcileSucceeded', status: 'True' }],
      observedGeneration: 1,
      friendlyDescription: 'Reconcile succeeded',
      version: '2.0.0',
      lastAttemptedVersion: '2.0.0',
    });
    expect(installed.metadata.finalizers).toContain(Finalizer.PackageInstall);

    const app = (await getObject<GeneratedApp>(APPS, NS, name))!;
    expect(app.metadata.annotations).toMatchObject({
      'packaging.carvel.dev/package-ref-name': REF_NAME,
      'packaging.carvel.dev/package-version': '2.0.0',
    });
    expect(app.metadata.ownerReferences).toEqual([controllerRef(name, installed.metadata.uid)]);
    expect(app.spec).toMatchObject({
      serviceAccountName: SA,
      syncPeriod: '10m0s',
      template: [{ ytt: { valuesFrom: [{ secretRef: { name: `${name}-values` } }] } }],
    });
    const cm = await getObject<{ data: Record<string, string> }>('configmap', NS, 'greeting');
    expect(cm?.data).toEqual({ greeting: 'from-secret', version: '2.0.0' });

    // The downgrade guard: status.version is the selected 1.0.0, nothing is written to the App.
    await k([
      'patch',
      PKGI,
      name,
      '-n',
      NS,
      '--type=merge',
      '-p',
      '{"spec":{"packageRef":{"versionSelection":{"constraints":"1.0.0"}}}}',
    ]);
    const guarded = await waitPkgi(
      name,
      'downgrade refused',
      (p) => p.status?.observedGeneration === 2 && conditionOf(p) === 'ReconcileFailed',
    );
    expect(guarded.status).toEqual({
      conditions: [{ type: 'ReconcileFailed', status: 'True', message: SEE_USEFUL }],
      observedGeneration: 2,
      friendlyDescription: `Reconcile failed: ${SEE_USEFUL}`,
      usefulErrorMessage:
        "Stopped installing matched version '1.0.0' since last attempted version '2.0.0' is higher.\n" +
        'hint: Add annotation packaging.carvel.dev/downgradable: "" to PackageInstall to proceed with downgrade',
      version: '1.0.0',
      lastAttemptedVersion: '2.0.0',
    });
    expect((await getObject<GeneratedApp>(APPS, NS, name))?.metadata.annotations).toMatchObject({
      'packaging.carvel.dev/package-version': '2.0.0',
    });

    // Deletion: the App goes first (kapp delete removes the ConfigMap), then the PackageInstall.
    await k(['delete', PKGI, name, '-n', NS, '--wait=false']);
    await waitBothGone(name);
    expect(await getObject('configmap', NS, 'greeting')).toBeUndefined();
    const runs = rt.records.filter(
      (r) => r.msg === 'stage run' && String(r.obj.object).endsWith(`/PackageInstall/${NS}/${name}`),
    );
    expect(runs.map((r) => r.obj.outcome)).toContain('deleted');
  });

  it('a failing App delete shows Delete failed on the PackageInstall and recovers when the ServiceAccount is back', async () => {
    const name = `fragile-${id}`;
    const sa = `fragile-sa-${id}`;
    await waitPackage(`${REF_NAME}.1.0.0`);
    await apply(
      ...tenantManifests(NS, sa).slice(1),
      valuesSecret(name, 'name: fragile\n'),
      packageInstall(name, '1.0.0', sa),
    );
    await waitPkgi(name, 'ReconcileSucceeded', (p) => conditionOf(p) === 'ReconcileSucceeded');
    expect((await getObject<{ data: Record<string, string> }>('configmap', NS, 'fragile'))?.data).toEqual({
      greeting: 'default',
      version: '1.0.0',
    });

    await k(['delete', 'serviceaccount', sa, '-n', NS]);
    await k(['delete', PKGI, name, '-n', NS, '--wait=false']);
    const blocked = await waitPkgi(name, 'DeleteFailed', (p) => conditionOf(p) === 'DeleteFailed');
    expect(blocked.status).toMatchObject({
      conditions: [{ type: 'DeleteFailed', status: 'True', message: SEE_USEFUL }],
      friendlyDescription: `Delete failed: ${SEE_USEFUL}`,
    });
    expect(blocked.status?.usefulErrorMessage).toContain(sa);
    expect(await getObject(APPS, NS, name)).toBeDefined();

    await apply(tenantManifests(NS, sa)[1]!);
    await waitBothGone(name);
    expect(await getObject('configmap', NS, 'fragile')).toBeUndefined();
  });

  it('upgrades at once when its repository adds a version: no timer (sync period 10m), created before its repository', async () => {
    const name = `upgrade-${id}`;
    const repo = `upgrade-repo-${id}`;
    // Before any repository: `Package <refName> not found`, fixed by the repository's reconcile.
    await apply(
      valuesSecret(name, 'name: upgraded\n', NS_UP),
      packageInstall(name, '>=1.0.0', SA, NS_UP, { syncPeriod: '10m' }),
    );
    await waitPkgi(name, 'Package not found', (p) => conditionOf(p) === 'ReconcileFailed', NS_UP);
    await apply(repository(repo, ['1.0.0'], NS_UP));
    await waitPkgi(
      name,
      'ReconcileSucceeded at 1.0.0',
      (p) => conditionOf(p) === 'ReconcileSucceeded' && p.status?.version === '1.0.0',
      NS_UP,
    );

    // The repository gains 2.0.0: its reconcile hands the change on, the PackageInstall moves.
    await apply(repository(repo, ['1.0.0', '2.0.0'], NS_UP));
    const upgraded = await waitPkgi(
      name,
      'ReconcileSucceeded at 2.0.0',
      (p) => conditionOf(p) === 'ReconcileSucceeded' && p.status?.version === '2.0.0',
      NS_UP,
    );
    expect(upgraded.status).toMatchObject({ version: '2.0.0', lastAttemptedVersion: '2.0.0' });
    const app = (await getObject<GeneratedApp>(APPS, NS_UP, name))!;
    expect(app.metadata.annotations?.['packaging.carvel.dev/package-version']).toBe('2.0.0');
    // Neither the PackageInstall nor its App was due: only the repository's change moved them.
    expect((await getObject<{ spec: { syncPeriod?: string } }>(PKGI, NS_UP, name))?.spec.syncPeriod).toBe('10m');
    expect(app.spec.syncPeriod).toBe('10m0s');
    expect((await getObject<{ data: Record<string, string> }>('configmap', NS_UP, 'upgraded'))?.data).toEqual({
      greeting: 'default',
      version: '2.0.0',
    });
    const fanOuts = rt.records.filter(
      (r) =>
        r.msg === 'repository versions changed; PackageInstalls reconciled' && String(r.obj.subject).includes(repo),
    );
    expect(fanOuts.map((r) => r.obj.installs)).toEqual([1, 1]);
  });

  it('Kubernetes-version constraints: the real control plane version filters, the ignore annotation lifts it', async () => {
    const name = `kube-${id}`;
    await waitPackage(`${KUBE_REF}.2.0.0`);
    await apply(valuesSecret(name, `name: ${name}\n`), packageInstall(name, '2.0.0', SA, NS, {}, KUBE_REF));
    const failed = await waitPkgi(name, 'ReconcileFailed', (p) => conditionOf(p) === 'ReconcileFailed');
    expect(failed.status?.conditions).toEqual([
      {
        type: 'ReconcileFailed',
        status: 'True',
        message:
          'Expected to find at least one version, but did not (details: all=2 -> after-prereleases-filter=2 -> ' +
          'after-kubernetes-version-check=1 -> after-kapp-controller-version-check=1 -> after-constraints-filter=0)',
      },
    ]);
    expect(await getObject(APPS, NS, name)).toBeUndefined();

    // The annotation alone (no spec change): upstream's PackageInstall reconciles on every
    // update, and so does ours (the forwarder's changeKey of PackageInstall annotations).
    const patch = { metadata: { annotations: { 'packaging.carvel.dev/ignore-kubernetes-version-selection': '' } } };
    await k(['patch', PKGI, name, '-n', NS, '--type=merge', '-p', JSON.stringify(patch)]);
    const ok = await waitPkgi(name, 'ReconcileSucceeded', (p) => conditionOf(p) === 'ReconcileSucceeded');
    expect(ok.status?.version).toBe('2.0.0');
    expect((await getObject<{ data: Record<string, string> }>('configmap', NS, name))?.data).toEqual({
      greeting: 'default',
      version: '2.0.0',
    });
  });

  it('prereleases: only with `prereleases: {}`, or a constraint that is one exact prerelease', async () => {
    const [open, exact] = [`pre-${id}`, `pre-exact-${id}`];
    await waitPackage(`${PRE_REF}.1.1.0-rc.1`);
    await apply(
      valuesSecret(open, `name: ${open}\n`),
      valuesSecret(exact, `name: ${exact}\n`),
      packageInstall(open, '>=1.0.0', SA, NS, {}, PRE_REF),
      packageInstall(exact, '1.1.0-rc.1', SA, NS, {}, PRE_REF),
    );
    const succeededWith = (version: string) => (p: PkgiObject) =>
      conditionOf(p) === 'ReconcileSucceeded' && p.status?.version === version;
    // Without `prereleases`, 1.1.0-rc.1 is filtered; one exact prerelease needs no filter.
    await waitPkgi(open, 'ReconcileSucceeded at 1.0.0', succeededWith('1.0.0'));
    await waitPkgi(exact, 'ReconcileSucceeded at 1.1.0-rc.1', succeededWith('1.1.0-rc.1'));

    const selection = { packageRef: { versionSelection: { constraints: '>=1.0.0', prereleases: {} } } };
    await k(['patch', PKGI, open, '-n', NS, '--type=merge', '-p', JSON.stringify({ spec: selection })]);
    await waitPkgi(open, 'ReconcileSucceeded at 1.1.0-rc.1', succeededWith('1.1.0-rc.1'));
    for (const name of [open, exact]) {
      expect((await getObject<{ data: Record<string, string> }>('configmap', NS, name))?.data).toEqual({
        greeting: 'default',
        version: '1.1.0-rc.1',
      });
    }
  });

  it('takes over an existing App of the same name: same App, now owned and the package deployed', async () => {
    const name = `taken-${id}`;
    await waitPackage(`${REF_NAME}.1.0.0`);
    await apply(inlineConfigMapApp(NS, name, 'hand-written'));
    const before = await rt.waitForApp(NS, name, succeededAt(1), 'the hand-written App reconciled');
    expect(await getObject('configmap', NS, `${name}-config`)).toBeDefined();

    await apply(valuesSecret(name, `name: ${name}\n`), packageInstall(name, '1.0.0'));
    const installed = await waitPkgi(name, 'ReconcileSucceeded', (p) => conditionOf(p) === 'ReconcileSucceeded');
    const app = (await getObject<GeneratedApp & { metadata: { uid: string } }>(APPS, NS, name))!;
    // Upstream `Test_PackageInstall_UsesExistingAppWithSameName`: updated in place, not recreated.
    expect(app.metadata.uid).toBe((before as { metadata: { uid?: string } }).metadata.uid);
    expect(app.metadata.ownerReferences).toEqual([controllerRef(name, installed.metadata.uid)]);
    expect(app.metadata.annotations).toMatchObject({ 'packaging.carvel.dev/package-version': '1.0.0' });
    // The same kapp app now deploys the package: its ConfigMap is there, the hand-written one pruned.
    expect((await getObject<{ data: Record<string, string> }>('configmap', NS, name))?.data).toEqual({
      greeting: 'default',
      version: '1.0.0',
    });
    expect(await getObject('configmap', NS, `${name}-config`)).toBeUndefined();
  });

  it('recovers on its own once its Package exists, though no repository announces it (rate-limited requeue)', async () => {
    const name = `orphan-${id}`;
    const refName = 'handmade.e2e.carvel.dev';
    await apply(valuesSecret(name, `name: ${name}\n`), packageInstall(name, '1.0.0', SA, NS, {}, refName));
    const failed = await waitPkgi(name, 'ReconcileFailed', (p) => conditionOf(p) === 'ReconcileFailed');
    expect((failed.status?.conditions as Array<{ message?: string }> | undefined)?.[0]?.message).toMatch(
      /^Expected to find at least one version, but did not \(details: all=0 -> /,
    );
    // Applied by hand: no repository reconciles, so no fan-out event reaches the PackageInstall;
    // only upstream's rate-limited requeue of the failed reconcile brings it back.
    await apply({ ...packageDoc('1.0.0', refName), metadata: { name: `${refName}.1.0.0`, namespace: NS } });
    const ok = await waitPkgi(name, 'ReconcileSucceeded', (p) => conditionOf(p) === 'ReconcileSucceeded');
    expect(ok.status).toMatchObject({ version: '1.0.0', lastAttemptedVersion: '1.0.0' });
    expect((await getObject<{ data: Record<string, string> }>('configmap', NS, name))?.data).toEqual({
      greeting: 'default',
      version: '1.0.0',
    });
  });

  it('installs metrics-server from the kadras repository bundle: Secret values reach its first template step', async () => {
    const [pkgr, pkgi, sa] = ['kadras', 'metrics-server', `kadras-sa-${id}`];
    const target = `ms-${id}`;
    const binding = `e2e-kadras-${id}`;
    const bundle = await relocateKadras(servers().registry);
    await apply(
      { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: sa, namespace: NS_KADRAS } },
      // metrics-server is cluster-wide (ClusterRoles, its own namespace), as the demo's example
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'ClusterRoleBinding',
        metadata: { name: binding },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'cluster-admin' },
        subjects: [{ kind: 'ServiceAccount', name: sa, namespace: NS_KADRAS }],
      },
      valuesSecret(pkgi, `metricsServer:\n  namespace: ${target}\n  config:\n    securePort: 4444\n`, NS_KADRAS),
      {
        // kwok runs no container: the APIService could never become Available (examples/)
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name: `${pkgi}-no-apiservice`, namespace: NS_KADRAS },
        stringData: {
          'no-apiservice.yml': [
            '#@ load("@ytt:overlay", "overlay")',
            '#@overlay/match by=overlay.subset({"kind":"APIService"})',
            '#@overlay/remove',
            '---',
          ].join('\n'),
        },
      },
      {
        apiVersion: 'packaging.carvel.dev/v1alpha1',
        kind: 'PackageRepository',
        metadata: { name: pkgr, namespace: NS_KADRAS },
        spec: { syncPeriod: '10m', fetch: { imgpkgBundle: { image: bundle } } },
      },
      {
        apiVersion: 'packaging.carvel.dev/v1alpha1',
        kind: 'PackageInstall',
        metadata: {
          name: pkgi,
          namespace: NS_KADRAS,
          annotations: { 'ext.packaging.carvel.dev/ytt-paths-from-secret-name.0': `${pkgi}-no-apiservice` },
        },
        spec: {
          serviceAccountName: sa,
          packageRef: { refName: 'metrics-server.packages.kadras.io', versionSelection: { constraints: '0.9.0' } },
          values: [{ secretRef: { name: `${pkgi}-values` } }],
        },
      },
    );
    try {
      const installed = await waitPkgi(
        pkgi,
        'ReconcileSucceeded',
        (p) => conditionOf(p) === 'ReconcileSucceeded',
        NS_KADRAS,
      );
      expect(installed.status).toMatchObject({ version: '0.9.0', lastAttemptedVersion: '0.9.0' });
      // The values reached ytt, the package's first template step: its namespace and port.
      const deployment = await getObject<{
        spec: {
          template: { spec: { containers: Array<{ args: string[]; ports: Array<{ containerPort: number }> }> } };
        };
      }>('deployment', target, 'metrics-server');
      const container = deployment?.spec.template.spec.containers[0];
      expect(container?.args).toContain('--secure-port=4444');
      expect(container?.ports.map((p) => p.containerPort)).toEqual([4444]);
      const apiService = await k(['get', 'apiservice', 'v1beta1.metrics.k8s.io', '--ignore-not-found', '-o', 'name']);
      expect(apiService.stdout.trim()).toBe('');

      // Upstream's placeholder Secrets: the repository's bundle and the package's bundle fetch.
      const app = (await getObject<{
        spec: { fetch: Array<{ imgpkgBundle?: { secretRef?: { name: string } } }> };
      }>(APPS, NS_KADRAS, pkgi))!;
      expect(app.spec.fetch[0]?.imgpkgBundle?.secretRef).toEqual({ name: `${pkgi}-fetch-0` });
      const repo = (await getObject<{ metadata: { uid: string } }>(PKGR, NS_KADRAS, pkgr))!;
      for (const [secret, kind, uid] of [
        [`${pkgi}-fetch-0`, 'PackageInstall', installed.metadata.uid],
        [`${pkgr}-fetch-0`, 'PackageRepository', repo.metadata.uid],
      ] as const) {
        const placeholder = await getObject<{
          type: string;
          data: Record<string, string>;
          metadata: { annotations?: Record<string, string>; labels?: unknown; ownerReferences?: unknown[] };
        }>('secret', NS_KADRAS, secret);
        expect(placeholder?.type).toBe('kubernetes.io/dockerconfigjson');
        expect(Buffer.from(placeholder?.data['.dockerconfigjson'] ?? '', 'base64').toString()).toBe('{"auths":{}}');
        expect(placeholder?.metadata.annotations).toEqual({ 'secretgen.carvel.dev/image-pull-secret': '' });
        expect(placeholder?.metadata.labels).toBeUndefined();
        expect(placeholder?.metadata.ownerReferences).toEqual([
          { apiVersion: 'packaging.carvel.dev/v1alpha1', kind, name: secret.replace(/-fetch-0$/, ''), uid },
        ]);
      }
    } finally {
      // Its cluster-wide objects go with the App (kapp delete), then the binding.
      await k(['delete', PKGI, pkgi, '-n', NS_KADRAS, '--wait=false', '--ignore-not-found']);
      await waitFor(
        `PackageInstall ${NS_KADRAS}/${pkgi} gone`,
        async () => ((await getObject(PKGI, NS_KADRAS, pkgi)) ? undefined : true),
        { timeoutMs: 120_000, intervalMs: 1000 },
      );
      await k(['delete', 'clusterrolebinding', binding, '--ignore-not-found']);
    }
  });
});
