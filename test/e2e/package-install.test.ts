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
 */
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { Finalizer } from '../../functions/lib/api/index.js';
import { tenantManifests } from '../harness/kube.js';
import { apply, getObject, k, SA, SEE_USEFUL, suffix, useE2ERuntime, waitFor } from './support.js';

const id = suffix();
const NS = `e2e-pkgi-${id}`;
/** The upgrade test's namespace: its own repository, so the first tests' Packages do not meet it. */
const NS_UP = `e2e-pkgi-up-${id}`;
const REF_NAME = 'greeter.e2e.carvel.dev';
/** Two versions, 2.0.0 requiring a Kubernetes newer than the control plane's. */
const KUBE_REF = 'kube.e2e.carvel.dev';
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
                  'config.yml': [
                    '#@ load("@ytt:data", "data")',
                    'apiVersion: v1',
                    'kind: ConfigMap',
                    'metadata:',
                    '  name: #@ data.values.name',
                    'data:',
                    '  greeting: #@ data.values.greeting',
                    `  version: "${version}"`,
                  ].join('\n'),
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

const rt = useE2ERuntime([NS, NS_UP]);

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

const conditionOf = (p: PkgiObject) => (p.status?.conditions as Array<{ type: string }> | undefined)?.[0]?.type;

describe('PackageInstall (install function, App pipeline, real tools)', () => {
  it('installs the highest matching version with values, guards downgrades, deletes App first', async () => {
    const name = `greeter-${id}`;
    await apply(repository(`repo-${id}`));
    await waitFor(
      'the four Packages indexed',
      async () => {
        const r = await k(['get', PKG, '-n', NS, '-o', 'name']);
        return r.stdout.trim().split('\n').filter(Boolean).length === 4 ? true : undefined;
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
    expect(app.metadata.ownerReferences).toEqual([
      {
        apiVersion: 'packaging.carvel.dev/v1alpha1',
        kind: 'PackageInstall',
        name,
        uid: installed.metadata.uid,
        controller: true,
        blockOwnerDeletion: true,
      },
    ]);
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
    await waitFor(
      'Packages indexed',
      async () => ((await getObject(PKG, NS, `${REF_NAME}.1.0.0`)) ? true : undefined),
      {
        timeoutMs: 120_000,
        intervalMs: 1000,
      },
    );
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
    await waitFor(
      'Packages indexed',
      async () => ((await getObject(PKG, NS, `${KUBE_REF}.2.0.0`)) ? true : undefined),
      { timeoutMs: 120_000, intervalMs: 1000 },
    );
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
});
