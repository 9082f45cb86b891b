/**
 * The Kubernetes port against a real kube-apiserver (the shared cluster of
 * test/harness/global-setup.ts) with the project's CRDs applied.
 */
import { randomBytes } from 'node:crypto';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { stringify } from 'yaml';
import {
  APP_API_VERSION,
  ConflictError,
  GoneError,
  KubeApiError,
  type KubeClient,
  type KubeObject,
  type ResourceRef,
  UnknownClusterError,
  type WatchEvent,
  WatchGoneError,
} from '../../functions/lib/kube/port.js';
import { apiServerInfoOf, KubeConfigClusterRegistry } from '../../functions/lib/kube/registry.js';
import { writeStatus } from '../../functions/lib/kube/status-write.js';
import { kubectl, kubectlPath, loadKubeConfig } from '../harness/kube.js';
import { inProcessGet } from '../harness/kube-get.js';

const kubeconfigPath = inject('kubeconfigPath');
const ns = `kube-it-${randomBytes(3).toString('hex')}`;
const FINALIZER = 'finalizers.kapp-ctrl.k14s.io/delete';
const CRD_DIR = path.resolve(import.meta.dirname, '../../infra/crds');

let client: KubeClient;
let contextName: string;
let tmp: string;

const k = (args: string[], input?: string) => kubectl(kubeconfigPath, args, input === undefined ? {} : { input });

function appRef(name: string): ResourceRef {
  return { apiVersion: APP_API_VERSION, kind: 'App', namespace: ns, name };
}

async function createApp(name: string, syncPeriod = '30s'): Promise<KubeObject> {
  await k(
    ['apply', '-f', '-'],
    stringify({
      apiVersion: APP_API_VERSION,
      kind: 'App',
      metadata: { name, namespace: ns },
      spec: {
        syncPeriod,
        serviceAccountName: 'deployer',
        fetch: [{ inline: { paths: { 'cm.yml': 'kind: ConfigMap' } } }],
        template: [{ ytt: {} }],
        deploy: [{ kapp: {} }],
      },
    }),
  );
  const app = await client.getObject(appRef(name));
  if (!app) throw new Error(`App ${name} not readable after create`);
  return app;
}

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), 'kube-it-'));
  const crds = (await readdir(CRD_DIR)).filter((f) => f.endsWith('.yaml') && f !== 'crds.yaml');
  await k(['apply', ...crds.flatMap((f) => ['-f', path.join(CRD_DIR, f)])]);
  await k([
    'wait',
    '--for=condition=Established',
    '--timeout=60s',
    'crd/apps.kappctrl.k14s.io',
    'crd/packageinstalls.packaging.carvel.dev',
    'crd/packagerepositories.packaging.carvel.dev',
  ]);
  await k(['create', 'namespace', ns]);
  contextName = loadKubeConfig(kubeconfigPath).getCurrentContext();
  const registry = KubeConfigClusterRegistry.fromFile(kubeconfigPath, { contexts: [contextName] });
  client = registry.client(contextName);
  // The apiserver may serve a freshly established CRD a moment after Established.
  for (let i = 0; i < 50; i++) {
    const res = await k(['get', 'apps.kappctrl.k14s.io', '-n', ns], undefined).catch(() => undefined);
    if (res) break;
    await new Promise((r) => setTimeout(r, 200));
  }
});

afterAll(async () => {
  await k(['delete', 'namespace', ns, '--wait=false']).catch(() => undefined);
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

describe('KubeReader', () => {
  it('getObject: 404 → undefined; existing App round-trips', async () => {
    expect(await client.getObject(appRef('does-not-exist'))).toBeUndefined();
    const app = await createApp('read-me');
    expect(app.apiVersion).toBe(APP_API_VERSION);
    expect(app.kind).toBe('App');
    expect(app.metadata.name).toBe('read-me');
    expect(app.metadata.generation).toBe(1);
    expect((app.spec as { syncPeriod: string }).syncPeriod).toBe('30s');
  });

  it('getSecret decodes, getConfigMap reads, getNamespace reports the phase', async () => {
    await k([
      'create',
      'secret',
      'generic',
      'creds',
      '-n',
      ns,
      '--from-literal=username=me',
      '--from-literal=password=p@ss',
    ]);
    await k(['create', 'configmap', 'values', '-n', ns, '--from-literal=values.yml=a: 1']);
    const secret = await client.getSecret(ns, 'creds');
    expect(secret?.type).toBe('Opaque');
    expect(Object.fromEntries(Object.entries(secret?.data ?? {}).map(([key, v]) => [key, v.toString()]))).toEqual({
      username: 'me',
      password: 'p@ss',
    });
    expect((await client.getConfigMap(ns, 'values'))?.data).toEqual({ 'values.yml': 'a: 1' });
    expect(await client.getSecret(ns, 'nope')).toBeUndefined();
    expect(await client.getConfigMap(ns, 'nope')).toBeUndefined();
    expect((await client.getNamespace(ns))?.phase).toBe('Active');
    expect(await client.getNamespace(`${ns}-nope`)).toBeUndefined();
  });
});

describe('StatusWriter', () => {
  it('updateStatus replaces status only; a stale resourceVersion → ConflictError; another uid → GoneError', async () => {
    const app = await createApp('status-me');
    const pre = { resourceVersion: app.metadata.resourceVersion, uid: app.metadata.uid };
    const first = await client.updateStatus(appRef('status-me'), pre, {
      friendlyDescription: 'Reconciling',
      observedGeneration: 1,
      conditions: [{ type: 'Reconciling', status: 'True' }],
    });
    expect(first.resourceVersion).not.toBe(pre.resourceVersion);
    const after = await client.getObject(appRef('status-me'));
    expect(after?.status).toEqual({
      friendlyDescription: 'Reconciling',
      observedGeneration: 1,
      conditions: [{ type: 'Reconciling', status: 'True' }],
    });
    expect(after?.spec).toEqual(app.spec);
    expect(after?.metadata.generation).toBe(1);

    const stale = await client
      .updateStatus(appRef('status-me'), pre, { friendlyDescription: 'x' })
      .catch((e: unknown) => e);
    expect(stale).toBeInstanceOf(ConflictError);
    expect((stale as ConflictError).message).toMatch(
      /^updating status of App kube-it-[0-9a-f]+\/status-me: 409 Operation cannot be fulfilled on apps\.kappctrl\.k14s\.io "status-me": the object has been modified; please apply your changes to the latest version and try again$/,
    );

    const otherUid = await client
      .updateStatus(appRef('status-me'), { resourceVersion: first.resourceVersion, uid: 'not-the-uid' }, {})
      .catch((e: unknown) => e);
    expect(otherUid).toBeInstanceOf(GoneError);

    const missing = await client
      .updateStatus(appRef('never-was'), { resourceVersion: '1', uid: 'x' }, {})
      .catch((e: unknown) => e);
    expect(missing).toBeInstanceOf(GoneError);
    expect((missing as GoneError).statusCode).toBe(404);
  });

  it('writeStatus: written, unchanged, then stale after a spec change bumps generation; gone after delete', async () => {
    const app = await createApp('fenced');
    const run = { uid: app.metadata.uid, generation: app.metadata.generation ?? 0 };
    const done = () => ({
      friendlyDescription: 'Reconcile succeeded',
      observedGeneration: run.generation,
      conditions: [{ type: 'ReconcileSucceeded', status: 'True' }],
    });
    const written = await writeStatus(client, appRef('fenced'), run, done);
    expect(written.outcome).toBe('written');
    expect(written.attempts).toBe(1);
    const unchanged = await writeStatus(client, appRef('fenced'), run, done);
    expect(unchanged).toMatchObject({ outcome: 'unchanged', resourceVersion: written.resourceVersion, attempts: 1 });
    // The object as stored, a later write's copy: the status just written, at its resourceVersion.
    expect(unchanged.object?.metadata.resourceVersion).toBe(written.resourceVersion);
    expect(written.object?.status).toEqual(unchanged.object?.status);

    await k([
      'patch',
      'apps.kappctrl.k14s.io',
      'fenced',
      '-n',
      ns,
      '--type=merge',
      '-p',
      '{"spec":{"syncPeriod":"45s"}}',
    ]);
    const bumped = await client.getObject(appRef('fenced'));
    expect(bumped?.metadata.generation).toBe(run.generation + 1);
    const stale = await writeStatus(client, appRef('fenced'), run, () => ({ friendlyDescription: 'old run' }));
    expect(stale).toMatchObject({ outcome: 'stale', resourceVersion: bumped?.metadata.resourceVersion, attempts: 1 });
    expect((await client.getObject(appRef('fenced')))?.status).toEqual(done());

    await k(['delete', 'apps.kappctrl.k14s.io', 'fenced', '-n', ns]);
    expect(await writeStatus(client, appRef('fenced'), run, done)).toEqual({
      outcome: 'gone',
      resourceVersion: undefined,
      attempts: 1,
    });
  });

  it('writeStatus retries after a concurrent status write (409) and lands on the fresh object', async () => {
    const app = await createApp('racy');
    const run = { uid: app.metadata.uid, generation: 1 };
    const result = await writeStatus<{ friendlyDescription?: string }>(client, appRef('racy'), run, (current) => ({
      ...current,
      friendlyDescription: 'mine',
    }));
    expect(result.outcome).toBe('written');
    // Make the next GET→PUT race: another writer changes status between our read and write.
    let raced = false;
    const racing = {
      getObject: client.getObject.bind(client),
      getSecret: client.getSecret.bind(client),
      getConfigMap: client.getConfigMap.bind(client),
      getNamespace: client.getNamespace.bind(client),
      updateStatus: async (ref: ResourceRef, pre: { resourceVersion: string; uid: string }, status: unknown) => {
        if (!raced) {
          raced = true;
          const fresh = await client.getObject(ref);
          await client.updateStatus(
            ref,
            { resourceVersion: fresh?.metadata.resourceVersion ?? '', uid: pre.uid },
            { friendlyDescription: 'theirs', usefulErrorMessage: 'kept' },
          );
        }
        return client.updateStatus(ref, pre, status);
      },
    };
    const retried = await writeStatus<{ friendlyDescription?: string }>(racing, appRef('racy'), run, (current) => ({
      ...current,
      friendlyDescription: 'mine again',
    }));
    expect(retried.outcome).toBe('written');
    expect(retried.attempts).toBe(2);
    expect((await client.getObject(appRef('racy')))?.status).toEqual({
      friendlyDescription: 'mine again',
      usefulErrorMessage: 'kept',
    });
  });
});

describe('FinalizerWriter', () => {
  it('add and remove are idempotent; removing the last finalizer of a deleting object lets it go', async () => {
    await createApp('finalized');
    const ref = appRef('finalized');
    expect((await client.addFinalizer(ref, FINALIZER)).changed).toBe(true);
    expect((await client.addFinalizer(ref, FINALIZER)).changed).toBe(false);
    expect((await client.addFinalizer(ref, 'example.com/other')).changed).toBe(true);
    expect((await client.getObject(ref))?.metadata.finalizers).toEqual([FINALIZER, 'example.com/other']);

    expect((await client.removeFinalizer(ref, 'example.com/other')).changed).toBe(true);
    expect((await client.removeFinalizer(ref, 'example.com/other')).changed).toBe(false);
    expect((await client.getObject(ref))?.metadata.finalizers).toEqual([FINALIZER]);

    await k(['delete', 'apps.kappctrl.k14s.io', 'finalized', '-n', ns, '--wait=false']);
    const deleting = await client.getObject(ref);
    expect(deleting?.metadata.deletionTimestamp).toEqual(expect.any(String));
    const refused = await client.addFinalizer(ref, 'example.com/late').catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(KubeApiError);
    expect((refused as KubeApiError).statusCode).toBe(422);
    expect((refused as KubeApiError).message).toContain(
      'no new finalizers can be added if the object is being deleted',
    );

    const removed = await client.removeFinalizer(ref, FINALIZER, { uid: deleting?.metadata.uid });
    expect(removed.changed).toBe(true);
    expect(await client.getObject(ref)).toBeUndefined();
    expect(await client.removeFinalizer(ref, FINALIZER)).toEqual({ changed: false, resourceVersion: undefined });
    await expect(client.addFinalizer(ref, FINALIZER)).rejects.toBeInstanceOf(GoneError);
  });
});

describe('DeployCredentials', () => {
  it('TokenRequest for a ServiceAccount gives a working token of the requested lifetime', async () => {
    await k(['create', 'serviceaccount', 'deployer', '-n', ns]);
    const before = Date.now();
    const token = await client.serviceAccountToken(ns, 'deployer');
    expect(token.token.split('.')).toHaveLength(3);
    const lifetime = (token.expiresAt.getTime() - before) / 1000;
    expect(lifetime).toBeGreaterThan(7200 - 120);
    expect(lifetime).toBeLessThan(7200 + 120);

    const short = await client.serviceAccountToken(ns, 'deployer', 600);
    expect((short.expiresAt.getTime() - before) / 1000).toBeLessThan(600 + 120);

    // The token authenticates as the ServiceAccount: allowed /version, forbidden to read Secrets.
    const asSa = await saRegistry(token.token);
    const saClient = asSa.client('as-sa');
    expect(await saClient.serverVersion()).toMatch(/^\d+\.\d+\.\d+$/);
    const forbidden = (await saClient.getSecret(ns, 'creds').catch((e: unknown) => e)) as KubeApiError;
    expect(forbidden).toBeInstanceOf(KubeApiError);
    expect(forbidden.statusCode).toBe(403);
    expect(forbidden.message).toContain(`User "system:serviceaccount:${ns}:deployer" cannot get resource "secrets"`);
    expect(forbidden.message).not.toContain(token.token);
  });

  it('a missing ServiceAccount gives the upstream error text', async () => {
    const err = (await client.serviceAccountToken(ns, 'nope').catch((e: unknown) => e)) as KubeApiError;
    expect(err).toBeInstanceOf(KubeApiError);
    expect(err.message).toBe('Getting service account: serviceaccounts "nope" not found');
  });

  it('serverVersion, apiGroupVersions, apiServer', async () => {
    const version = await client.serverVersion();
    expect(version).toMatch(/^1\.34\.\d+$/);
    const { stdout } = await k(['version', '-o', 'json']);
    const gitVersion = (JSON.parse(stdout) as { serverVersion: { gitVersion: string } }).serverVersion.gitVersion;
    expect(`v${version}`).toBe(gitVersion.replace(/[-+].*$/, ''));
    const gvs = await client.apiGroupVersions();
    expect(gvs[0]).toBe('v1');
    expect(gvs).toEqual(
      expect.arrayContaining([
        'apps/v1',
        'authentication.k8s.io/v1',
        'kappctrl.k14s.io/v1alpha1',
        'packaging.carvel.dev/v1alpha1',
      ]),
    );
    const server = client.apiServer();
    expect(server.server).toBe(inject('cluster').server);
    expect(Buffer.from(server.caData ?? '', 'base64').toString()).toContain('-----BEGIN CERTIFICATE-----');
  });
});

describe('ObjectWatcher', () => {
  const APPS = { apiVersion: APP_API_VERSION, kind: 'App' };

  it('lists in pages, then watches from the list resourceVersion with bookmarks', async () => {
    const listNs = `${ns}-w`;
    await k(['create', 'namespace', listNs]);
    try {
      for (const name of ['w1', 'w2', 'w3']) {
        await k(
          ['apply', '-f', '-'],
          stringify({ apiVersion: APP_API_VERSION, kind: 'App', metadata: { name, namespace: listNs }, spec: {} }),
        );
      }
      const page1 = await client.list(APPS, { namespace: listNs, limit: 2 });
      expect(page1.items.map((i) => i.metadata.name)).toEqual(['w1', 'w2']);
      expect(page1.items[0]?.kind).toBe('App');
      expect(page1.continue).toEqual(expect.any(String));
      const page2 = await client.list(APPS, { namespace: listNs, limit: 2, continue: page1.continue });
      expect(page2.items.map((i) => i.metadata.name)).toEqual(['w3']);
      expect(page2.continue).toBeUndefined();

      const events: WatchEvent[] = [];
      const started = Date.now();
      // The three kubectl writes below must land before the watch ends by itself: 8 s was little
      // room for three kubectl processes on a loaded machine, so the watch gets 15.
      const watching = client.watch(
        APPS,
        { namespace: listNs, resourceVersion: page1.resourceVersion, allowWatchBookmarks: true, timeoutSeconds: 15 },
        (e) => events.push(e),
      );
      await new Promise((r) => setTimeout(r, 500));
      await k(
        ['apply', '-f', '-'],
        stringify({ apiVersion: APP_API_VERSION, kind: 'App', metadata: { name: 'w4', namespace: listNs }, spec: {} }),
      );
      await k([
        'patch',
        'apps.kappctrl.k14s.io',
        'w4',
        '-n',
        listNs,
        '--type=merge',
        '-p',
        '{"spec":{"syncPeriod":"1m"}}',
      ]);
      await k(['delete', 'apps.kappctrl.k14s.io', 'w4', '-n', listNs]);
      await watching; // ends by itself after timeoutSeconds
      const elapsed = Date.now() - started;
      expect(elapsed).toBeGreaterThan(14_000);
      expect(elapsed).toBeLessThan(40_000);

      const changes = events.filter((e) => e.type !== 'BOOKMARK').map((e) => `${e.type} ${e.object.metadata.name}`);
      expect(changes).toEqual(['ADDED w4', 'MODIFIED w4', 'DELETED w4']);
      const bookmarks = events.filter((e) => e.type === 'BOOKMARK');
      expect(bookmarks.length).toBeGreaterThan(0);
      const last = bookmarks.at(-1)?.object.metadata.resourceVersion ?? '0';
      expect(BigInt(last)).toBeGreaterThanOrEqual(BigInt(page1.resourceVersion));
    } finally {
      await k(['delete', 'namespace', listNs, '--wait=false']).catch(() => undefined);
    }
  });

  it('an abort signal ends a watch early', async () => {
    const { resourceVersion } = await client.list(APPS, { namespace: ns, limit: 1 });
    const controller = new AbortController();
    const started = Date.now();
    setTimeout(() => controller.abort(), 300);
    await client.watch(
      APPS,
      { namespace: ns, resourceVersion, allowWatchBookmarks: true, timeoutSeconds: 60 },
      () => {},
      controller.signal,
    );
    expect(Date.now() - started).toBeLessThan(10_000);
  });

  it('a too-old resourceVersion → WatchGoneError (410 Expired)', async () => {
    const err = (await client
      .watch(APPS, { resourceVersion: '1', allowWatchBookmarks: true, timeoutSeconds: 5 }, () => {})
      .catch((e: unknown) => e)) as WatchGoneError;
    expect(err).toBeInstanceOf(WatchGoneError);
    expect(err.statusCode).toBe(410);
    expect(err.message).toMatch(/^watching apps\.kappctrl\.k14s\.io: 410 too old resource version: 1 \(\d+\)$/);
  });
});

describe('ClusterRegistry over a kubeconfig', () => {
  it('two contexts → two cluster ids with their own clients and credentials', async () => {
    await k(['create', 'serviceaccount', 'viewer', '-n', ns]).catch(() => undefined);
    const token = await client.serviceAccountToken(ns, 'viewer', 600);
    const admin = loadKubeConfig(kubeconfigPath);
    const server = apiServerInfoOf(admin);
    const user = admin.getCurrentUser();
    if (!user) throw new Error('admin kubeconfig has no current user');
    const fileData = async (data?: string, file?: string) =>
      data ?? (file ? (await readFile(file)).toString('base64') : undefined);
    const file = path.join(tmp, 'two-contexts.yaml');
    await writeFile(
      file,
      stringify({
        apiVersion: 'v1',
        kind: 'Config',
        'current-context': 'alpha',
        clusters: [{ name: 'c', cluster: { server: server.server, 'certificate-authority-data': server.caData } }],
        users: [
          {
            name: 'admin',
            user: {
              'client-certificate-data': await fileData(user.certData, user.certFile),
              'client-key-data': await fileData(user.keyData, user.keyFile),
              token: user.token,
            },
          },
          { name: 'viewer', user: { token: token.token } },
        ],
        contexts: [
          { name: 'alpha', context: { cluster: 'c', user: 'admin' } },
          { name: 'beta', context: { cluster: 'c', user: 'viewer' } },
        ],
      }),
      { mode: 0o600 },
    );
    const registry = KubeConfigClusterRegistry.fromFile(file);
    expect(registry.clusterIds()).toEqual(['alpha', 'beta']);
    expect(registry.client('alpha')).not.toBe(registry.client('beta'));
    expect((await registry.fetchView('alpha').getNamespace(ns))?.phase).toBe('Active');
    const denied = (await registry
      .fetchView('beta')
      .getNamespace(ns)
      .catch((e: unknown) => e)) as KubeApiError;
    expect(denied.statusCode).toBe(403);
    expect(denied.message).toContain(`system:serviceaccount:${ns}:viewer`);
    expect(() => registry.deployView('gamma')).toThrow(UnknownClusterError);
  });
});

async function saRegistry(token: string): Promise<KubeConfigClusterRegistry> {
  const server = apiServerInfoOf(loadKubeConfig(kubeconfigPath));
  const file = path.join(tmp, `sa-${randomBytes(3).toString('hex')}.yaml`);
  await writeFile(
    file,
    stringify({
      apiVersion: 'v1',
      kind: 'Config',
      'current-context': 'as-sa',
      clusters: [{ name: 'c', cluster: { server: server.server, 'certificate-authority-data': server.caData } }],
      users: [{ name: 'sa', user: { token } }],
      contexts: [{ name: 'as-sa', context: { cluster: 'c', user: 'sa' } }],
    }),
    { mode: 0o600 },
  );
  return KubeConfigClusterRegistry.fromFile(file);
}

describe('the harness answers `kubectl get … -o json` in process', () => {
  it('prints what kubectl prints: an object, a list, a NotFound; other shapes run kubectl', async () => {
    await k(['-n', ns, 'create', 'configmap', 'harness-get', '--from-literal=a=1']);
    const real = async (args: string[]) =>
      // a kubectl binary given explicitly always runs
      await kubectl(kubeconfigPath, args, { kubectl: kubectlPath(), check: false });
    for (const args of [
      ['get', 'configmap', 'harness-get', '-n', ns, '-o', 'json'],
      ['get', 'cm', '-n', ns, '-o', 'json'],
      ['-n', ns, 'get', 'apps.kappctrl.k14s.io', '-o', 'json'],
      ['get', 'namespace', ns, '-o', 'json'],
    ]) {
      expect(await inProcessGet(kubeconfigPath, args), args.join(' ')).toBeDefined();
      const ours = await kubectl(kubeconfigPath, args);
      expect(JSON.parse(ours.stdout), args.join(' ')).toEqual(JSON.parse((await real(args)).stdout));
    }
    const missing = ['get', 'packageinstalls.packaging.carvel.dev', 'nope', '-n', ns, '-o', 'json'];
    const ours = await kubectl(kubeconfigPath, missing, { check: false });
    expect(ours).toEqual({ ...(await real(missing)), stdout: '' });
    // not a plain get: kubectl's own output
    expect(
      await inProcessGet(kubeconfigPath, ['get', 'configmap', 'harness-get', '-n', ns, '-o', 'name']),
    ).toBeUndefined();
    expect(
      (await kubectl(kubeconfigPath, ['get', 'configmap', 'harness-get', '-n', ns, '-o', 'name'])).stdout.trim(),
    ).toBe('configmap/harness-get');
  });
});
