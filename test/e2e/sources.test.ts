/**
 * e2e: every fetch source and template step through the whole flow (forwarder → fetch →
 * template → deploy with kapp) against the shared control plane and the fixture servers,
 * then an update that redeploys and a delete that removes everything.
 */
import { readFile } from 'node:fs/promises';
import { describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { fixturePath } from '../harness/fixtures.js';
import {
  type AppObject,
  apply,
  appManifest,
  expectSucceeded,
  getApp,
  getObject,
  inlineConfigMapApp,
  k,
  servers,
  suffix,
  useE2ERuntime,
  waitFor,
} from './support.js';

const id = suffix();
const NS = {
  inline: `e2e-src-inline-${id}`,
  git: `e2e-src-git-${id}`,
  http: `e2e-src-http-${id}`,
  bundle: `e2e-src-bundle-${id}`,
  helm: `e2e-src-helm-${id}`,
  update: `e2e-src-update-${id}`,
  delete: `e2e-src-delete-${id}`,
};

interface Deployment {
  metadata: { name: string; labels?: Record<string, string>; annotations?: Record<string, string> };
  spec: {
    replicas: number;
    template: { spec: { containers: { name: string; image: string; env?: { name: string; value?: string }[] }[] } };
  };
  status?: { availableReplicas?: number; conditions?: { type: string; status: string }[] };
}

interface ConfigMap {
  metadata: { name: string; labels?: Record<string, string> };
  data?: Record<string, string>;
}

const envOf = (d: Deployment, name: string) => d.spec.template.spec.containers[0]?.env?.find((e) => e.name === name);

const rt = useE2ERuntime(Object.values(NS));

describe('every source and template reconciles (kapp-controller status shape)', () => {
  it('inline+ytt, git+ytt, http zip+ytt valuesFrom secret, imgpkgBundle+ytt+kbld, helmChart+helmTemplate', async () => {
    const s = servers();
    const gitRepo = s.git.repos['k8s-simple-app-example'];
    const zip = s.http.files['k8s-simple-app-example-master.zip'];
    const bundle = s.registry.bundles['k8slt/kctrl-example-pkg:v2.0.0'];
    expect(gitRepo && zip && bundle && s.http.helmRepo).toBeTruthy();
    const greeting = `hello ${id}`;
    const httpMsg = `from an http archive ${id}`;
    const uiMessage = `deployed by kapp-lambda ${id}`;
    const names = {
      inline: `inline-${id}`,
      git: `simple-app-git-${id}`,
      http: `simple-app-http-${id}`,
      bundle: `simple-app-bundle-${id}`,
      helm: `podinfo-${id}`,
    };

    await apply(
      inlineConfigMapApp(NS.inline, names.inline, greeting),
      appManifest(NS.git, names.git, {
        fetch: [{ git: { url: gitRepo!.url, ref: 'origin/develop', subPath: 'config-step-2-template' } }],
        template: [{ ytt: {} }],
        deploy: [{ kapp: { intoNs: NS.git } }],
      }),
      {
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name: 'simple-app-values', namespace: NS.http },
        // --data-values-file takes plain YAML (ytt rejects `#@data/values` annotations there)
        stringData: { 'values.yml': `hello_msg: ${JSON.stringify(httpMsg)}\n` },
      },
      appManifest(NS.http, names.http, {
        fetch: [{ http: { url: zip!.url, subPath: 'k8s-simple-app-example-master/config-step-2-template' } }],
        template: [{ ytt: { valuesFrom: [{ secretRef: { name: 'simple-app-values' } }] } }],
        deploy: [{ kapp: { intoNs: NS.http } }],
      }),
      appManifest(NS.bundle, names.bundle, {
        fetch: [{ imgpkgBundle: { image: bundle!.ref } }],
        template: [{ ytt: { paths: ['config-step-2-template'] } }, { kbld: { paths: ['-', '.imgpkg/images.yml'] } }],
        deploy: [{ kapp: { intoNs: NS.bundle } }],
      }),
      {
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata: { name: 'podinfo-values', namespace: NS.helm },
        data: { 'values.yml': `replicaCount: 2\nui:\n  message: ${JSON.stringify(uiMessage)}\n` },
      },
      appManifest(NS.helm, names.helm, {
        fetch: [{ helmChart: { name: 'podinfo', version: '6.14.1', repository: { url: s.http.helmRepo!.url } } }],
        template: [{ helmTemplate: { valuesFrom: [{ configMapRef: { name: 'podinfo-values' } }] } }],
        deploy: [{ kapp: {} }],
      }),
    );

    const apps = await Promise.all(
      (Object.keys(names) as (keyof typeof names)[]).map(async (key) => {
        const app = await rt.waitReconciled(NS[key], names[key], 170_000);
        return [key, app] as const;
      }),
    );
    const byKey = Object.fromEntries(apps) as Record<keyof typeof names, AppObject>;
    const labels: Record<string, string> = {};
    for (const [key, app] of apps) labels[key] = await expectSucceeded(app);
    // vendir ran for every source (none was cached in this runtime's fresh store)
    for (const app of Object.values(byKey)) expect(app.status?.fetch?.stdout).toContain('kind: LockConfig');

    // inline + ytt: the ConfigMap with the templated value, labelled by kapp
    const cm = await getObject<ConfigMap>('configmap', NS.inline, `${names.inline}-config`);
    expect(cm?.data).toEqual({ greeting });
    expect(`kapp.k14s.io/app=${cm?.metadata.labels?.['kapp.k14s.io/app']}`).toBe(labels.inline);
    expect(byKey.inline.status?.deploy?.kapp?.associatedResources?.groupKinds).toEqual([
      { group: '', kind: 'ConfigMap' },
    ]);

    // git + ytt: simple-app available (kwok runs its pod), values from the repo
    const gitDep = await getObject<Deployment>('deployment', NS.git, 'simple-app');
    expect(gitDep?.status?.availableReplicas).toBe(1);
    expect(gitDep?.status?.conditions).toContainEqual(expect.objectContaining({ type: 'Available', status: 'True' }));
    expect(envOf(gitDep!, 'HELLO_MSG')).toEqual({ name: 'HELLO_MSG', value: 'stranger' });
    expect(await getObject('service', NS.git, 'simple-app')).toBeDefined();
    expect(byKey.git.status?.fetch?.stdout).toContain(gitRepo!.commitSha);

    // http zip + ytt valuesFrom secretRef: the Secret's data value reached the Deployment
    const httpDep = await getObject<Deployment>('deployment', NS.http, 'simple-app');
    expect(envOf(httpDep!, 'HELLO_MSG')).toEqual({ name: 'HELLO_MSG', value: httpMsg });
    expect(httpDep?.status?.availableReplicas).toBe(1);

    // imgpkgBundle + ytt + kbld: the image is the digest recorded in the bundle's .imgpkg/images.yml
    const lock = parseYaml(
      await readFile(
        fixturePath('kapp-controller', 'test', 'e2e', 'assets', 'kappctrl-e2e-bundle', '.imgpkg', 'images.yml'),
        'utf8',
      ),
    ) as { images: { image: string }[] };
    const locked = lock.images[0]!.image;
    expect(locked).toMatch(/^index\.docker\.io\/dkalinin\/k8s-simple-app@sha256:[0-9a-f]{64}$/);
    const bundleDep = await getObject<Deployment>('deployment', NS.bundle, 'simple-app');
    // ytt alone leaves `docker.io/...@sha256:...` (the config's reference); kbld replaces it
    // with the ImagesLock entry and annotates the resource
    expect(bundleDep!.spec.template.spec.containers[0]!.image).toBe(locked);
    expect(bundleDep?.metadata.annotations).toHaveProperty(['kbld.k14s.io/images']);
    expect(bundleDep?.status?.availableReplicas).toBe(1);
    expect(byKey.bundle.status?.fetch?.stdout).toContain(bundle!.digest);

    // helmChart + helmTemplate valuesFrom configMapRef: release named after the App
    const helmDep = await getObject<Deployment>('deployment', NS.helm, names.helm);
    expect(helmDep?.spec.replicas).toBe(2);
    expect(helmDep?.status?.availableReplicas).toBe(2);
    expect(envOf(helmDep!, 'PODINFO_UI_MESSAGE')).toEqual({ name: 'PODINFO_UI_MESSAGE', value: uiMessage });
    expect(helmDep?.metadata.labels?.['app.kubernetes.io/version']).toBe('6.14.1');
  }, 240_000);
});

describe('update', () => {
  it('a changed inline value redeploys and observedGeneration follows', async () => {
    const ns = NS.update;
    const name = `update-${id}`;
    await apply(inlineConfigMapApp(ns, name, 'first'));
    const first = await rt.waitReconciled(ns, name);
    await expectSucceeded(first);
    expect(first.metadata.generation).toBe(1);
    expect((await getObject<ConfigMap>('configmap', ns, `${name}-config`))?.data).toEqual({ greeting: 'first' });

    await apply(inlineConfigMapApp(ns, name, 'second'));
    const second = await rt.waitForApp(
      ns,
      name,
      (a) => a.metadata.generation === 2 && a.status?.observedGeneration === 2 && reconciledOk(a),
      'generation 2 reconciled',
    );
    await expectSucceeded(second);
    expect(second.status?.consecutiveReconcileSuccesses).toBeGreaterThanOrEqual(2);
    expect((await getObject<ConfigMap>('configmap', ns, `${name}-config`))?.data).toEqual({ greeting: 'second' });
    // the same kapp app was updated, not a new one
    expect(second.status?.deploy?.kapp?.associatedResources?.label).toBe(
      first.status?.deploy?.kapp?.associatedResources?.label,
    );
    expect(second.status?.deploy?.stdout).toContain('update');
  });
});

describe('delete', () => {
  it('removes the resources, the kapp app record and the App (finalizer removed)', async () => {
    // expectSucceeded checked that the App carried finalizers.kapp-ctrl.k14s.io/delete, so the
    // App can only disappear once the delete path removed it.
    const ns = NS.delete;
    const name = `delete-${id}`;
    const deployment = [
      '---',
      'apiVersion: apps/v1',
      'kind: Deployment',
      'metadata:',
      `  name: ${name}-dep`,
      'spec:',
      '  selector: {matchLabels: {app: e2e-delete}}',
      '  template:',
      '    metadata: {labels: {app: e2e-delete}}',
      `    spec: {containers: [{name: c, image: registry.invalid/none@sha256:${'0'.repeat(64)}}]}`,
    ].join('\n');
    await apply(inlineConfigMapApp(ns, name, 'to be deleted', deployment));
    const app = await rt.waitReconciled(ns, name);
    await expectSucceeded(app);
    expect(await getObject('deployment', ns, `${name}-dep`)).toBeDefined();
    expect(await getObject('configmap', ns, `${name}-config`)).toBeDefined();

    await k(['delete', 'apps.kappctrl.k14s.io', name, '-n', ns, '--wait=false']);
    await waitFor(`App ${ns}/${name} gone`, async () => ((await getApp(ns, name)) ? undefined : true), {
      timeoutMs: 120_000,
      describe: async () => JSON.stringify((await getApp(ns, name))?.status ?? null),
    });
    expect(await getObject('configmap', ns, `${name}-config`)).toBeUndefined();
    expect(await getObject('configmap', ns, `${name}.app`)).toBeUndefined();
    const leftover = (await k(['get', 'configmaps,deployments', '-n', ns, '-o', 'name'])).stdout
      .split('\n')
      .filter((l) => l.includes(name));
    expect(leftover).toEqual([]);
    const deletes = rt.stageRuns(ns, name).filter((r) => r.stage === 'delete');
    expect(deletes.map((r) => r.outcome)).toEqual(['deleted']);
  });
});

function reconciledOk(a: AppObject): boolean {
  return a.status?.conditions?.some((c) => c.type === 'ReconcileSucceeded') ?? false;
}
