/**
 * The fleet's cluster registry against the real control plane: the infra/rbac manifests
 * applied, a ServiceAccount token per function (TokenRequest) in a directory secret store, the
 * cluster registered with `token` auth in a directory registry, and each function's views used
 * through the registry as that function's identity: what its stage does works, what it must
 * not do is refused by the API server (403).
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { stringify } from 'yaml';
import type { PipelineStage } from '../../functions/lib/api/functions.js';
import {
  type KappCommand,
  packageRepositoryDeleteCommand,
  packageRepositoryDeployCommand,
} from '../../functions/lib/deploy/kapp.js';
import { plantedKappRecord } from '../../functions/lib/deploy/kapp-record.js';
import { packageRepositoryKubeconfig } from '../../functions/lib/deploy/run.js';
import { DirSecretStore } from '../../functions/lib/kube/bearer.js';
import { StoreClusterRegistry } from '../../functions/lib/kube/fleet-registry.js';
import {
  APP_API_VERSION,
  DATA_PACKAGING_API_VERSION,
  KubeApiError,
  type KubeObject,
  type ResourceRef,
} from '../../functions/lib/kube/port.js';
import { apiServerInfoOf, clientForKubeConfig } from '../../functions/lib/kube/registry.js';
import { readControllerConfig } from '../../functions/lib/reconcile/controller-config.js';
import { LocalDirStore } from '../../functions/lib/store/local.js';
import { binPath } from '../../layers/gobuild.js';
import { component } from '../../layers/manifest.js';
import { clusterDocOf, putCluster, rbacManifests } from '../../scripts/cluster-registry.js';
import { apply, applyCrds } from '../e2e/support.js';
import { kubectl, loadKubeConfig } from '../harness/kube.js';

/**
 * kapp's stderr without client-go's throttling notices: kapp runs for a repository at upstream's
 * `--kube-api-qps=30 --kube-api-burst=40`, and client-go logs each wait over a second
 * (`Waited for 1.0s due to client-side throttling`) to stderr, as it does under kapp-controller.
 */
function kappErrors(stderr: string): string {
  return stderr
    .split('\n')
    .filter((l) => !/due to client-side throttling/.test(l))
    .join('\n')
    .trim();
}

const kubeconfigPath = inject('kubeconfigPath');
const suffix = randomBytes(3).toString('hex');
const ns = `creg-${suffix}`;
const other = `creg-other-${suffix}`;
const ids = `creg-ids-${suffix}`;
const CLUSTER = `creg-${suffix}`;
const STAGES: PipelineStage[] = ['fetch', 'template', 'deploy', 'index-repo', 'install'];

/** The cluster-scoped kinds of `infra/rbac/` (deleted by name after the file). */
const CLUSTER_KINDS = [
  'ClusterRole',
  'ClusterRoleBinding',
  'ValidatingAdmissionPolicy',
  'ValidatingAdmissionPolicyBinding',
];

/** What the admission policy of `package-repository-kapp.yml` answers a ConfigMap write that is no PackageRepository record. */
const RECORDS_ONLY =
  "kapp-lambda-pkgr may only write kapp's records of a PackageRepository (labelled kapp.k14s.io/is-app and named <x>.pkgr or <x>.pkgr.apps.k14s.io, labelled kapp.k14s.io/is-app-change and named <x>.pkgr-change-<suffix>; deleted also <x>-ctrl, <x>-ctrl.apps.k14s.io, <x>-ctrl-change-<suffix>)";

/** What it answers any write in a system namespace. */
const NO_SYSTEM_NS = 'kapp-lambda-pkgr may not write in kube-system, kube-public or kube-node-lease';

const k = (args: string[], input?: string) => kubectl(kubeconfigPath, args, input === undefined ? {} : { input });

let tmp: string;
let manifests: Record<string, unknown>[];
const registries = new Map<PipelineStage, StoreClusterRegistry>();

function registry(stage: PipelineStage): StoreClusterRegistry {
  const r = registries.get(stage);
  if (!r) throw new Error(`no registry for ${stage}`);
  return r;
}

const app: ResourceRef = { apiVersion: APP_API_VERSION, kind: 'App', namespace: ns, name: 'simple' };

/** The status code of a rejected call (or 0 when it resolved). */
async function codeOf(call: Promise<unknown>): Promise<number> {
  try {
    await call;
    return 0;
  } catch (e) {
    if (!(e instanceof KubeApiError)) throw e;
    return e.statusCode ?? -1;
  }
}

/** Runs a binary with a kubeconfig file of the stage's identity, no shell; resolves with the exit code and stderr. */
async function asStage(stage: PipelineStage, bin: string, args: string[], input?: string) {
  const file = path.join(tmp, `${stage}.kubeconfig`);
  await writeFile(file, registry(stage).runtimeKubeconfig(CLUSTER), { mode: 0o600 });
  return await new Promise<{ code: number; stderr: string }>((resolve, reject) => {
    const child = spawn(bin, [...args, '--kubeconfig', file], {
      env: { PATH: '/usr/bin:/bin', HOME: tmp, KUBECACHEDIR: path.join(tmp, `cache-${stage}`) },
    });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
    });
    child.stdout.resume();
    child.on('error', reject);
    child.on('close', (code) => resolve({ code: code ?? -1, stderr }));
    child.stdin.end(input ?? '');
  });
}

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), 'cluster-registry-it-'));
  await applyCrds();
  // A CRD is served a moment after Established (429 "storage is (re)initializing" until then).
  for (let i = 0; i < 100; i++) {
    const r = await kubectl(kubeconfigPath, ['get', 'packages.data.packaging.carvel.dev', '-A'], { check: false });
    if (r.code === 0) break;
    await new Promise((done) => setTimeout(done, 200));
  }
  // The functions' RBAC, with this file's identity namespace (the ServiceAccounts of token auth).
  // kapp-controller-config lives in the identity namespace too, so nothing is applied to a shared one.
  manifests = (
    await rbacManifests({ tokenIdentities: true, identityNamespace: ids, controllerConfigNamespace: ids })
  ).filter((m) => m.kind !== 'Secret');
  // The cluster-scoped objects of a PackageRepository's kapp identity get this file's own names:
  // the shared cluster's runtimes use `kapp-lambda:pkgr` and the admission policy
  // `kapp-lambda-pkgr`, for kapp-lambda/kapp-lambda-pkgr (e2e `applyCrds`), which this file's
  // objects (for `ids`, rbacManifests' rendering) and clean-up would replace.
  for (const m of manifests) {
    const meta = m.metadata as { name: string };
    if ((m.kind === 'ClusterRole' || m.kind === 'ClusterRoleBinding') && meta.name === 'kapp-lambda:pkgr') {
      meta.name = `kapp-lambda:pkgr-${suffix}`;
      if (m.kind === 'ClusterRoleBinding') (m.roleRef as { name: string }).name = meta.name;
    }
    if (m.kind === 'ValidatingAdmissionPolicy' || m.kind === 'ValidatingAdmissionPolicyBinding') {
      meta.name = `kapp-lambda-pkgr-${suffix}`;
      if (m.kind === 'ValidatingAdmissionPolicyBinding') (m.spec as { policyName: string }).policyName = meta.name;
    }
  }
  const secret = (namespace: string, name: string) => ({
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: { name, namespace },
    stringData: { password: 'p4ss' },
  });
  await apply(
    ...manifests,
    { apiVersion: 'v1', kind: 'Namespace', metadata: { name: ns } },
    { apiVersion: 'v1', kind: 'Namespace', metadata: { name: other } },
    { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: 'deployer', namespace: ns } },
    secret(ns, 'creds'),
    secret(other, 'elsewhere'),
    { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'vals', namespace: ns }, data: { a: '1' } },
    {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: 'kapp-controller-config', namespace: ids },
      data: { dangerousSkipTLSVerify: 'from-configmap.example' },
    },
    secret(ids, 'not-the-config'),
    {
      apiVersion: APP_API_VERSION,
      kind: 'App',
      metadata: { name: 'simple', namespace: ns },
      spec: {
        serviceAccountName: 'deployer',
        fetch: [{ inline: {} }],
        template: [{ ytt: {} }],
        deploy: [{ kapp: {} }],
      },
    },
  );

  // Each function's token (a TokenRequest by the admin) where the document names it.
  const admin = clientForKubeConfig(loadKubeConfig(kubeconfigPath));
  const secretsDir = path.join(tmp, 'secrets');
  await mkdir(path.join(secretsDir, 'kapp-lambda', CLUSTER), { recursive: true });
  for (const stage of STAGES) {
    const { token } = await admin.serviceAccountToken(ids, `kapp-lambda-${stage}`, 1200);
    await writeFile(path.join(secretsDir, 'kapp-lambda', CLUSTER, stage), token, { mode: 0o600 });
  }
  // Register the cluster as `npm run cluster -- add <id> --auth token` does.
  const api = apiServerInfoOf(loadKubeConfig(kubeconfigPath));
  const store = new LocalDirStore(path.join(tmp, 'registry'));
  await putCluster(
    store,
    clusterDocOf({
      id: CLUSTER,
      endpoint: api.server,
      caPem: Buffer.from(api.caData ?? '', 'base64').toString('utf8'),
      ...(api.tlsServerName ? { tlsServerName: api.tlsServerName } : {}),
      auth: { kind: 'token' },
    }),
  );
  for (const stage of STAGES) {
    const r = new StoreClusterRegistry({ store, stage, secrets: new DirSecretStore(secretsDir) });
    await r.prepare(CLUSTER);
    registries.set(stage, r);
  }
});

afterAll(async () => {
  await k(['delete', 'namespace', ns, other, ids, '--wait=false'], undefined).catch(() => {});
  await k(['-n', 'kube-system', 'delete', 'configmap', `creg-record-${suffix}`, '--ignore-not-found']).catch(() => {});
  const cluster = manifests.filter((m) => CLUSTER_KINDS.includes(String(m.kind)));
  for (const m of cluster) {
    await k([
      'delete',
      String(m.kind).toLowerCase(),
      (m.metadata as { name: string }).name,
      '--ignore-not-found',
    ]).catch(() => {});
  }
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

describe('the functions through the cluster registry, each as its own identity', () => {
  it.each(['fetch', 'template'] as const)(
    '%s reads the App and the Secret and ConfigMap it references and writes status, and nothing more',
    async (stage) => {
      const view = registry(stage).fetchView(CLUSTER);
      const live = await view.getObject(app);
      expect(live?.metadata.name).toBe('simple');
      expect((await view.getSecret(ns, 'creds'))?.data.password?.toString()).toBe('p4ss');
      expect((await view.getConfigMap(ns, 'vals'))?.data).toEqual({ a: '1' });
      const meta = live?.metadata ?? { resourceVersion: '', uid: '' };
      await view.updateStatus(
        app,
        { resourceVersion: meta.resourceVersion, uid: meta.uid },
        { friendlyDescription: stage },
      );

      // The same identity through the full client: every other write is refused.
      const client = registry(stage).client(CLUSTER);
      expect(await codeOf(client.addFinalizer(app, 'finalizers.kapp-ctrl.k14s.io/delete'))).toBe(403);
      expect(await codeOf(client.serviceAccountToken(ns, 'deployer'))).toBe(403);
      expect(await codeOf(client.list({ apiVersion: 'v1', kind: 'Secret' }, {}))).toBe(403);
      expect(await codeOf(client.list({ apiVersion: 'v1', kind: 'Secret' }, { namespace: ns }))).toBe(403);
      expect(
        await codeOf(client.createSecret({ metadata: { name: 'x', namespace: ns }, type: 'Opaque', data: {} })),
      ).toBe(403);
      const kubectlBin = binPath(component('kubernetes'), 'kubectl');
      const created = await asStage(stage, kubectlBin, ['-n', ns, 'create', 'deployment', 'nope', '--image=nginx']);
      expect(created.code).not.toBe(0);
      expect(created.stderr).toContain('forbidden');
    },
  );

  it('deploy adds and removes the finalizer, requests a token for the App ServiceAccount, and writes no Apps or Secrets', async () => {
    const view = registry('deploy').deployView(CLUSTER);
    expect((await view.addFinalizer(app, 'finalizers.kapp-ctrl.k14s.io/delete')).changed).toBe(true);
    expect((await view.removeFinalizer(app, 'finalizers.kapp-ctrl.k14s.io/delete')).changed).toBe(true);
    expect((await view.serviceAccountToken(ns, 'deployer', 600)).token.length).toBeGreaterThan(20);
    expect((await view.getNamespace(ns))?.phase).toBe('Active');
    expect(await view.serverVersion()).toMatch(/^\d+\.\d+\.\d+$/);

    const client = registry('deploy').client(CLUSTER);
    expect(await codeOf(client.list({ apiVersion: 'v1', kind: 'Secret' }, { namespace: ns }))).toBe(403);
    expect(
      await codeOf(client.createSecret({ metadata: { name: 'x', namespace: ns }, type: 'Opaque', data: {} })),
    ).toBe(403);
    expect(await codeOf(client.deleteApp(ns, 'simple'))).toBe(403);
  });

  it('install writes Apps and placeholder Secrets and lists Packages, but cannot request tokens or read Secrets', async () => {
    const view = registry('install').installView(CLUSTER);
    const written = await view.createApp({
      apiVersion: APP_API_VERSION,
      kind: 'App',
      metadata: { name: 'from-pkgi', namespace: ns },
      spec: {
        serviceAccountName: 'deployer',
        fetch: [{ inline: {} }],
        template: [{ ytt: {} }],
        deploy: [{ kapp: {} }],
      },
    } as unknown as KubeObject);
    expect(written.metadata.uid).not.toBe('');
    expect(
      await view.createSecret({
        metadata: { name: 'placeholder', namespace: ns },
        type: 'kubernetes.io/dockerconfigjson',
        data: { '.dockerconfigjson': Buffer.from('{"auths":{}}') },
      }),
    ).toBe(true);
    expect(
      (await view.list({ apiVersion: DATA_PACKAGING_API_VERSION, kind: 'Package' }, { namespace: ns })).items,
    ).toEqual([]);
    expect(await view.deleteApp(ns, 'from-pkgi')).toBe(true);

    const client = registry('install').client(CLUSTER);
    expect(await codeOf(client.serviceAccountToken(ns, 'deployer'))).toBe(403);
    expect(await codeOf(client.getSecret(ns, 'creds'))).toBe(403);
    expect(await codeOf(client.updateStatus(app, { resourceVersion: '1', uid: 'x' }, {}))).toBe(403);
  });

  it('install and index-repo read kapp-controller-config (ConfigMap, then the Secret once it exists) and list no Secret of its namespace (install: get none other)', async () => {
    const readers = ['install', 'index-repo'] as const;
    for (const stage of readers) {
      const config = await readControllerConfig(registry(stage).fetchView(CLUSTER), ids);
      expect(config.source).toMatch(/^ConfigMap\//);
      expect(config.dangerousSkipTLSVerify).toBe('from-configmap.example');
    }
    await apply({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'kapp-controller-config', namespace: ids },
      stringData: { dangerousSkipTLSVerify: 'from-secret.example' },
    });
    for (const stage of readers) {
      const config = await readControllerConfig(registry(stage).fetchView(CLUSTER), ids);
      expect(config.source).toMatch(/^Secret\//);
      expect(config.dangerousSkipTLSVerify).toBe('from-secret.example');
      const client = registry(stage).client(CLUSTER);
      // index-repo gets Secrets by name cluster-wide anyway (its fetch's secretRef); install never.
      if (stage === 'install') expect(await codeOf(client.getSecret(ids, 'not-the-config'))).toBe(403);
      expect(await codeOf(client.list({ apiVersion: 'v1', kind: 'Secret' }, { namespace: ids }))).toBe(403);
    }
  });

  it('index-repo: kapp runs as kapp-lambda-pkgr (a token index-repo requests): Packages deployed, pruned and deleted; that identity reaches nothing else, and index-repo writes no Package or ConfigMap', async () => {
    const view = registry('index-repo').deployView(CLUSTER);
    // The runtime namespace is `ids` here (the controller-config namespace of this file).
    const kubeconfigYaml = await packageRepositoryKubeconfig(view, ids, ns);
    const file = path.join(tmp, 'pkgr.kubeconfig');
    await writeFile(file, kubeconfigYaml, { mode: 0o600 });
    const kubectlBin = binPath(component('kubernetes'), 'kubectl');
    const asPkgr = (args: string[], input?: string) =>
      kubectl(file, args, { check: false, kubectl: kubectlBin, ...(input === undefined ? {} : { input }) });
    // The API server enforces a new admission policy once its informer has it: kapp must first
    // meet the policy, so wait (at most 30 s) until a write it refuses is refused (a server-side
    // dry run, which admission sees like any create).
    for (const deadline = Date.now() + 30_000; ; ) {
      const probe = await asPkgr(['-n', ns, 'create', 'configmap', 'probe', '--dry-run=server']);
      if (probe.code !== 0 && probe.stderr.includes(RECORDS_ONLY)) break;
      if (Date.now() > deadline) throw new Error(`admission policy not enforced after 30 s: ${probe.stderr}`);
      await new Promise((done) => setTimeout(done, 250));
    }
    const kapp = binPath(component('kapp'), 'kapp');
    const run = (cmd: KappCommand, input?: string) =>
      new Promise<{ code: number; stdout: string; stderr: string }>((resolve, reject) => {
        const child = spawn(kapp, cmd.args, { env: { PATH: '/usr/bin:/bin', HOME: tmp, ...cmd.env } });
        let stdout = '';
        let stderr = '';
        child.stdout.on('data', (d: Buffer) => {
          stdout += d.toString();
        });
        child.stderr.on('data', (d: Buffer) => {
          stderr += d.toString();
        });
        child.on('error', reject);
        child.on('close', (code) => resolve({ code: code ?? -1, stdout, stderr }));
        child.stdin.end(input ?? '');
      });
    const pkg = (version: string) => ({
      apiVersion: DATA_PACKAGING_API_VERSION,
      kind: 'Package',
      metadata: { name: `demo.example.com.${version}` },
      spec: {
        refName: 'demo.example.com',
        version,
        template: { spec: { fetch: [{ inline: {} }], template: [{ ytt: {} }], deploy: [{ kapp: {} }] } },
      },
    });
    const meta = {
      apiVersion: DATA_PACKAGING_API_VERSION,
      kind: 'PackageMetadata',
      metadata: { name: 'demo.example.com' },
      spec: { displayName: 'Demo' },
    };
    const deploy = packageRepositoryDeployCommand({
      name: 'demo',
      namespace: ns,
      metadataFile: path.join(tmp, 'app-metadata.yml'),
      kubeconfigYaml,
    });
    const packages = async () =>
      (await k(['-n', ns, 'get', 'packages.data.packaging.carvel.dev', '-o', 'name'])).stdout
        .trim()
        .split('\n')
        .filter(Boolean);

    const first = await run(deploy, [pkg('1.0.0'), pkg('2.0.0'), meta].map((d) => stringify(d)).join('---\n'));
    expect(kappErrors(first.stderr)).toBe('');
    expect(first.code).toBe(0);
    expect(await packages()).toEqual([
      'package.data.packaging.carvel.dev/demo.example.com.1.0.0',
      'package.data.packaging.carvel.dev/demo.example.com.2.0.0',
    ]);
    // kapp wrote its app record and a change record (the admission policy lets records through).
    const records = async (label: string) =>
      (await k(['-n', ns, 'get', 'configmap', '-l', `${label}=`, '-o', 'name'])).stdout
        .trim()
        .split('\n')
        .filter(Boolean);
    expect(await records('kapp.k14s.io/is-app')).toEqual(['configmap/demo.pkgr']);
    expect(await records('kapp.k14s.io/is-app-change')).toHaveLength(1);
    const firstRecord = (await view.getConfigMap(ns, 'demo.pkgr'))?.data;
    // kapp's own record passes the record check, copy check included (it lists every app record).
    expect(await plantedKappRecord(view, ns, ['demo.pkgr', 'demo-ctrl'])).toBeUndefined();
    // A record copying it, elsewhere: the check refuses (read through the index-repo identity).
    const own = await view.getConfigMap(ns, 'demo.pkgr');
    await apply({
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: 'copy.pkgr', namespace: other, labels: { 'kapp.k14s.io/is-app': '' } },
      data: { spec: own?.data.spec ?? '' },
    });
    expect(await plantedKappRecord(view, ns, ['demo.pkgr', 'demo-ctrl'])).toContain(
      `with the kapp app record ConfigMap ${other}/copy.pkgr`,
    );
    await k(['-n', other, 'delete', 'configmap', 'copy.pkgr']);

    // A version removed from the repository is pruned.
    const second = await run(deploy, [pkg('2.0.0'), meta].map((d) => stringify(d)).join('---\n'));
    expect(kappErrors(second.stderr)).toBe('');
    expect(second.code).toBe(0);
    expect(await packages()).toEqual(['package.data.packaging.carvel.dev/demo.example.com.2.0.0']);
    // The record updated, a second change record beside the first.
    expect((await view.getConfigMap(ns, 'demo.pkgr'))?.data).not.toEqual(firstRecord);
    expect(await records('kapp.k14s.io/is-app-change')).toHaveLength(2);

    // The admission policy: RBAC lets this identity write any ConfigMap anywhere; the policy
    // refuses every ConfigMap write but kapp's records, and any write in a system namespace.
    const refused = async (args: string[], message: string, input?: string) => {
      const r = await asPkgr(args, input);
      expect(r.code, args.join(' ')).not.toBe(0);
      expect(r.stderr, args.join(' ')).toContain(message);
      // 403, by the policy, not RBAC (which allows every one of these).
      expect(r.stderr, args.join(' ')).toMatch(/is forbidden: ValidatingAdmissionPolicy 'kapp-lambda-pkgr-\w+'/);
    };
    const configMap = (namespace: string, name: string, labels: Record<string, string>) =>
      JSON.stringify({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name, namespace, labels } });
    await refused(['-n', ns, 'create', 'configmap', 'plain'], `${RECORDS_ONLY}: CREATE of ConfigMap ${ns}/plain`);
    await refused(['-n', ns, 'patch', 'configmap', 'vals', '-p', '{"data":{"a":"2"}}'], RECORDS_ONLY);
    await refused(['-n', ns, 'delete', 'configmap', 'vals'], `${RECORDS_ONLY}: DELETE of ConfigMap ${ns}/vals`);
    // Labelling a foreign ConfigMap as a record is refused: the stored object is not one.
    await refused(['-n', ns, 'label', 'configmap', 'vals', 'kapp.k14s.io/is-app='], RECORDS_ONLY);
    await refused(['-n', ns, 'label', 'configmap', 'vals', 'kapp.k14s.io/is-app-change='], RECORDS_ONLY);
    expect((await view.getConfigMap(ns, 'vals'))?.data).toEqual({ a: '1' });
    // A record of a repository: created and deleted, but not turned into a plain ConfigMap.
    const record = configMap(ns, 'own.pkgr', { 'kapp.k14s.io/is-app': '' });
    expect((await asPkgr(['create', '-f', '-'], record)).code).toBe(0);
    await refused(['-n', ns, 'label', 'configmap', 'own.pkgr', 'kapp.k14s.io/is-app-'], RECORDS_ONLY);
    expect((await asPkgr(['-n', ns, 'delete', 'configmap', 'own.pkgr'])).code).toBe(0);
    // Labelled as a record but not named as a repository's: the runtime's kapp-controller-config
    // (read with no label check, applied to every App), an App's record `<app>.app` (planted
    // before the App exists, its kapp would prune what the planted selector matches), a
    // ConfigMap an App names in valuesFrom, change records of another app.
    const isApp = { 'kapp.k14s.io/is-app': '' };
    const isChange = { 'kapp.k14s.io/is-app-change': '' };
    for (const [namespace, name, labels] of [
      [ids, 'kapp-controller-config', isApp],
      [other, 'kapp-controller-config', isApp],
      [other, 'kapp-controller-config', isChange],
      [other, 'foo.app', isApp],
      [other, 'foo.app.apps.k14s.io', isApp],
      [other, 'vals', isApp],
      [other, 'foo-ctrl', isApp],
      [ns, 'x.pkgr-change-abc', isApp],
      [other, 'foo.app-change-abc', isChange],
      [other, 'foo.pkgr', isChange],
      [other, 'foo-ctrl-change-abc', isChange],
      // A repository's change record name, labelled as another app's.
      [other, 'foo.pkgr-change-abc', { ...isChange, 'kapp.k14s.io/app-change-app': 'foo.app' }],
      [other, 'foo.pkgr-change-abc', { ...isChange, 'kapp.k14s.io/app-change-app': 'bar.pkgr' }],
      // Both labels: no name is both records'.
      [other, 'foo.pkgr', { ...isApp, ...isChange }],
    ] as const) {
      await refused(
        ['create', '-f', '-'],
        `${RECORDS_ONLY}: CREATE of ConfigMap ${namespace}/${name} refused`,
        configMap(namespace, name, labels),
      );
    }
    // kapp-controller-config of the runtime namespace exists (an update): refused as well.
    await refused(['-n', ids, 'label', 'configmap', 'kapp-controller-config', 'kapp.k14s.io/is-app='], RECORDS_ONLY);
    // A change record created with generateName: the API server generated the name before
    // validating admission, so the name is checked (another app's refused, a repository's allowed).
    const generated = (prefix: string, labels: Record<string, string>) =>
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata: { generateName: prefix, namespace: other, labels },
      });
    const foreignChange = await asPkgr(
      ['create', '-o', 'name', '-f', '-'],
      generated('foo.app-change-', { ...isChange, 'kapp.k14s.io/app-change-app': 'foo.app' }),
    );
    expect(foreignChange.code).not.toBe(0);
    expect(foreignChange.stderr).toMatch(
      new RegExp(`: CREATE of ConfigMap ${other}/foo\\.app-change-[a-z0-9]{5} refused`),
    );
    const ownChange = await asPkgr(
      ['create', '-o', 'name', '-f', '-'],
      generated('own.pkgr-change-', { ...isChange, 'kapp.k14s.io/app-change-app': 'own.pkgr' }),
    );
    expect(ownChange.stderr).toBe('');
    expect(ownChange.stdout.trim()).toMatch(/^configmap\/own\.pkgr-change-[a-z0-9]{5}$/);
    expect((await asPkgr(['-n', other, 'delete', ownChange.stdout.trim()])).code).toBe(0);
    // An App's existing record: its label value (what its kapp prunes by) cannot be rewritten,
    // nor the record deleted.
    const spec = JSON.stringify({ labelKey: 'kapp.k14s.io/app', labelValue: '1' });
    await k(
      ['create', '-f', '-'],
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata: { name: 'foo.app', namespace: other, labels: isApp },
        data: { spec },
      }),
    );
    const planted = JSON.stringify({ labelKey: 'kapp.k14s.io/app', labelValue: '2' });
    await refused(
      ['-n', other, 'patch', 'configmap', 'foo.app', '-p', JSON.stringify({ data: { spec: planted } })],
      `${RECORDS_ONLY}: UPDATE of ConfigMap ${other}/foo.app refused`,
    );
    await refused(
      ['-n', other, 'delete', 'configmap', 'foo.app'],
      `${RECORDS_ONLY}: DELETE of ConfigMap ${other}/foo.app`,
    );
    expect((await view.getConfigMap(other, 'foo.app'))?.data).toEqual({ spec });
    // kube-system: nothing, not even a record (the admin's record there stays as it is).
    const systemRecord = `creg-record-${suffix}`;
    await refused(
      ['create', '-f', '-'],
      NO_SYSTEM_NS,
      configMap('kube-system', systemRecord, { 'kapp.k14s.io/is-app': '' }),
    );
    await k(['create', '-f', '-'], configMap('kube-system', systemRecord, { 'kapp.k14s.io/is-app': '' }));
    await refused(['-n', 'kube-system', 'label', 'configmap', systemRecord, 'x=y'], NO_SYSTEM_NS);
    await refused(['-n', 'kube-system', 'delete', 'configmap', systemRecord], NO_SYSTEM_NS);
    await refused(['-n', 'kube-system', 'create', 'configmap', 'plain'], NO_SYSTEM_NS);
    expect((await k(['-n', 'kube-system', 'get', 'configmap', systemRecord, '-o', 'name'])).stdout.trim()).toBe(
      `configmap/${systemRecord}`,
    );

    // What that identity cannot do: Secrets, tokens, workloads.
    const pkgr = clientForKubeConfig(loadKubeConfig(file));
    expect(await codeOf(pkgr.getSecret(ns, 'creds'))).toBe(403);
    expect(await codeOf(pkgr.list({ apiVersion: 'v1', kind: 'Secret' }, { namespace: ns }))).toBe(403);
    expect(await codeOf(pkgr.createSecret({ metadata: { name: 'x', namespace: ns }, type: 'Opaque', data: {} }))).toBe(
      403,
    );
    expect(await codeOf(pkgr.serviceAccountToken(ns, 'deployer'))).toBe(403);
    expect(await codeOf(pkgr.updateStatus(app, { resourceVersion: '1', uid: 'x' }, {}))).toBe(403);
    const workload = await asPkgr(['-n', ns, 'create', 'deployment', 'nope', '--image=nginx']);
    expect(workload.code).not.toBe(0);
    expect(workload.stderr).toContain('forbidden');

    // The index-repo identity: no Package, PackageMetadata or ConfigMap write, no other token.
    for (const args of [
      ['-n', ns, 'create', 'configmap', 'nope'],
      ['-n', ns, 'delete', 'packages.data.packaging.carvel.dev', 'demo.example.com.2.0.0'],
    ]) {
      const refused = await asStage('index-repo', kubectlBin, args);
      expect(refused.code).not.toBe(0);
      expect(refused.stderr).toContain('forbidden');
    }
    const client = registry('index-repo').client(CLUSTER);
    expect(await codeOf(client.list({ apiVersion: 'v1', kind: 'Secret' }, {}))).toBe(403);
    expect(await codeOf(client.serviceAccountToken(ns, 'deployer'))).toBe(403);
    expect(await codeOf(client.serviceAccountToken(ids, 'kapp-lambda-index-repo'))).toBe(403);
    expect(await codeOf(client.updateStatus(app, { resourceVersion: '1', uid: 'x' }, {}))).toBe(403);

    // Deleting the repository removes its Packages, PackageMetadata and kapp's record.
    const deleted = await run(packageRepositoryDeleteCommand({ name: 'demo', namespace: ns, kubeconfigYaml }));
    expect(kappErrors(deleted.stderr)).toBe('');
    expect(deleted.code).toBe(0);
    expect(await packages()).toEqual([]);
    expect((await k(['-n', ns, 'get', 'packagemetadatas.data.packaging.carvel.dev', '-o', 'name'])).stdout).toBe('');
    expect(await view.getConfigMap(ns, 'demo.pkgr')).toBeUndefined();
    expect(await records('kapp.k14s.io/is-app-change')).toEqual([]);

    // A repository whose kapp app an older kapp-controller named `<x>-ctrl` (here: real kapp as
    // the admin): the first deploy as kapp-lambda-pkgr renames the record (`--prev-app`: the new
    // name created, the old one deleted; with fully-qualified names `<x>.pkgr.apps.k14s.io`, then
    // updated), the delete removes the old app's change records with its own.
    for (const [name, env, recordName] of [
      ['mig', {}, 'mig.pkgr'],
      ['fq', { KAPP_FQ_CONFIGMAP_NAMES: 'true' }, 'fq.pkgr.apps.k14s.io'],
    ] as const) {
      const base = pkg('3.0.0');
      const legacyPkg = {
        ...base,
        metadata: { name: `${name}.example.com.3.0.0` },
        spec: { ...base.spec, refName: `${name}.example.com` },
      };
      const legacy = await run(
        {
          bin: 'kapp',
          args: [
            'deploy',
            '--app',
            `${name}-ctrl`,
            '--namespace',
            ns,
            '-f',
            '-',
            '--yes',
            '--kubeconfig',
            kubeconfigPath,
          ],
          env: {},
          sensitiveEnv: [],
        },
        stringify({ ...legacyPkg, metadata: { ...legacyPkg.metadata, namespace: ns } }),
      );
      expect(legacy.code, legacy.stderr).toBe(0);
      const legacyRecord = await view.getConfigMap(ns, `${name}-ctrl`);
      expect(legacyRecord).toBeDefined();
      expect(await records('kapp.k14s.io/is-app-change')).toHaveLength(1);
      const withEnv = (cmd: KappCommand) => ({ ...cmd, env: { ...cmd.env, ...env } });
      const migrated = await run(
        withEnv(
          packageRepositoryDeployCommand({
            name,
            namespace: ns,
            metadataFile: path.join(tmp, `${name}.yml`),
            kubeconfigYaml,
          }),
        ),
        stringify(legacyPkg),
      );
      expect(kappErrors(migrated.stderr)).toBe('');
      expect(migrated.code).toBe(0);
      expect(await view.getConfigMap(ns, `${name}-ctrl`)).toBeUndefined();
      // The record renamed: the same label value (kapp's ownership of what the old app deployed).
      expect((await view.getConfigMap(ns, recordName))?.data.spec).toContain(
        JSON.parse(legacyRecord?.data.spec ?? '{}').labelValue,
      );
      expect(await records('kapp.k14s.io/is-app')).toEqual([`configmap/${recordName}`]);
      // The old app's change record stays (nothing changed: kapp recorded no change of its own);
      // the renamed record's label value still selects it, so the delete removes it too.
      expect(await records('kapp.k14s.io/is-app-change')).toEqual([
        expect.stringMatching(new RegExp(`^configmap/${name}-ctrl-change-[a-z0-9]{5}$`)),
      ]);
      const gone = await run(withEnv(packageRepositoryDeleteCommand({ name, namespace: ns, kubeconfigYaml })));
      expect(kappErrors(gone.stderr)).toBe('');
      expect(gone.code).toBe(0);
      expect(await packages()).toEqual([]);
      expect(await records('kapp.k14s.io/is-app')).toEqual([]);
      expect(await records('kapp.k14s.io/is-app-change')).toEqual([]);
    }
  });
});
