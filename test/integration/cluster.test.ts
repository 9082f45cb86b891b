import { randomBytes } from 'node:crypto';
import { existsSync, readdirSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  ApiException,
  AppsV1Api,
  CoreV1Api,
  CustomObjectsApi,
  PatchStrategy,
  setHeaderOptions,
} from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { kubectl, loadKubeConfig, writeTokenKubeconfig } from '../harness/kube.js';

// The shared cluster from test/harness/global-setup.ts: a real API server with RBAC, a
// controller-manager, a scheduler and kwok fake nodes.
const kubeconfigPath = inject('kubeconfigPath');
const cluster = inject('cluster');
const ns = `cluster-test-${randomBytes(3).toString('hex')}`;
const k = (args: string[], input?: string) => kubectl(kubeconfigPath, args, { input, kubectl: cluster.kubectlPath });

const CRD_DIR = fileURLToPath(new URL('../../infra/crds/', import.meta.url));
const APP = { group: 'kappctrl.k14s.io', version: 'v1alpha1', plural: 'apps' } as const;

let tmp: string;

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), 'cluster-test-'));
  await k(['create', 'namespace', ns]);
});

afterAll(async () => {
  await k(['delete', 'namespace', ns, '--wait=false']);
  await rm(tmp, { recursive: true, force: true });
});

describe('local cluster', () => {
  it('serves Kubernetes v1.34.4 on loopback', async () => {
    expect(cluster.server).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/);
    const version = JSON.parse((await k(['get', '--raw', '/version'])).stdout) as { gitVersion: string };
    expect(version.gitVersion).toBe('v1.34.4');
  });

  it('enforces RBAC: a ServiceAccount without bindings is denied until a Role grants access', async () => {
    await k(['create', 'serviceaccount', 'nobody', '-n', ns]);
    const token = (await k(['create', 'token', 'nobody', '-n', ns, '--duration', '10m'])).stdout.trim();
    const saKubeconfig = await writeTokenKubeconfig(kubeconfigPath, token, path.join(tmp, 'nobody.kubeconfig'));
    const asSa = (args: string[]) => kubectl(saKubeconfig, args, { check: false, kubectl: cluster.kubectlPath });

    const canI = await asSa(['auth', 'can-i', 'list', 'pods', '-n', ns]);
    expect({ code: canI.code, out: canI.stdout.trim() }).toEqual({ code: 1, out: 'no' });

    const get = await asSa(['get', 'pods', '-n', ns]);
    expect(get.code).toBe(1);
    expect(get.stderr.trim()).toBe(
      `Error from server (Forbidden): pods is forbidden: User "system:serviceaccount:${ns}:nobody" ` +
        `cannot list resource "pods" in API group "" in the namespace "${ns}"`,
    );

    await k(['create', 'role', 'pod-reader', '-n', ns, '--verb=list', '--resource=pods']);
    await k(['create', 'rolebinding', 'nobody-reads', '-n', ns, '--role=pod-reader', `--serviceaccount=${ns}:nobody`]);
    const granted = await asSa(['auth', 'can-i', 'list', 'pods', '-n', ns]);
    expect({ code: granted.code, out: granted.stdout.trim() }).toEqual({ code: 0, out: 'yes' });
    const still = await asSa(['auth', 'can-i', 'delete', 'pods', '-n', ns]);
    expect({ code: still.code, out: still.stdout.trim() }).toEqual({ code: 1, out: 'no' });
  });

  it('runs a Deployment to Available with a Ready pod on a kwok node', async () => {
    const kc = loadKubeConfig(kubeconfigPath);
    const apps = kc.makeApiClient(AppsV1Api);
    const core = kc.makeApiClient(CoreV1Api);
    await apps.createNamespacedDeployment({
      namespace: ns,
      body: {
        metadata: { name: 'web' },
        spec: {
          replicas: 1,
          selector: { matchLabels: { app: 'web' } },
          template: {
            metadata: { labels: { app: 'web' } },
            spec: { containers: [{ name: 'web', image: 'registry.invalid/web:1', ports: [{ containerPort: 80 }] }] },
          },
        },
      },
    });
    await k(['rollout', 'status', 'deployment/web', '-n', ns, '--timeout=90s']);

    const dep = await apps.readNamespacedDeployment({ namespace: ns, name: 'web' });
    const available = dep.status?.conditions?.find((c) => c.type === 'Available');
    expect(available?.status).toBe('True');
    expect(dep.status?.readyReplicas).toBe(1);
    expect(dep.status?.availableReplicas).toBe(1);

    const pods = await core.listNamespacedPod({ namespace: ns, labelSelector: 'app=web' });
    expect(pods.items).toHaveLength(1);
    const pod = pods.items[0]!;
    expect(cluster.nodeNames).toContain(pod.spec?.nodeName);
    expect(pod.status?.phase).toBe('Running');
    expect(pod.status?.conditions?.find((c) => c.type === 'Ready')?.status).toBe('True');
  });
});

describe('project CRDs (infra/crds)', () => {
  let custom: CustomObjectsApi;

  beforeAll(async () => {
    const files = existsSync(CRD_DIR) ? readdirSync(CRD_DIR).filter((f) => f.endsWith('.yaml')) : [];
    expect(files.length, `no CRDs in ${CRD_DIR}`).toBeGreaterThan(0);
    for (const f of files.sort()) {
      await k(['apply', '--server-side', '--force-conflicts', '-f', path.join(CRD_DIR, f)]);
    }
    await k(['wait', '--for=condition=Established', '--timeout=60s', 'crd/apps.kappctrl.k14s.io']);
    custom = loadKubeConfig(kubeconfigPath).makeApiClient(CustomObjectsApi);
  });

  const appSpec = {
    serviceAccountName: 'default-ns-sa',
    syncPeriod: '1m',
    fetch: [{ inline: { paths: { 'cm.yml': 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n' } } }],
    template: [{ ytt: {} }],
    deploy: [{ kapp: {} }],
  };

  it('round-trips App status through the status subresource only', async () => {
    const created = await custom.createNamespacedCustomObject({
      ...APP,
      namespace: ns,
      body: { apiVersion: 'kappctrl.k14s.io/v1alpha1', kind: 'App', metadata: { name: 'simple' }, spec: appSpec },
    });
    expect(created.spec).toEqual(appSpec);
    expect(created.status).toBeUndefined();
    expect(created.metadata.generation).toBe(1);

    const status = {
      observedGeneration: 1,
      conditions: [{ type: 'ReconcileSucceeded', status: 'True', reason: '', message: '' }],
      friendlyDescription: 'Reconcile succeeded',
      usefulErrorMessage: '',
      consecutiveReconcileSuccesses: 1,
      consecutiveReconcileFailures: 0,
      fetch: { startedAt: '2025-01-02T03:04:05Z', updatedAt: '2025-01-02T03:04:06Z', exitCode: 0, stdout: 'ok' },
      deploy: {
        startedAt: '2025-01-02T03:04:07Z',
        updatedAt: '2025-01-02T03:04:08Z',
        exitCode: 0,
        finished: true,
        stdout: 'Succeeded',
      },
    };
    const put = await custom.replaceNamespacedCustomObjectStatus({
      ...APP,
      namespace: ns,
      name: 'simple',
      body: { ...created, status, spec: { ...appSpec, syncPeriod: '5m' } },
    });
    expect(put.status).toEqual(status);
    // A status write never changes spec (the `syncPeriod: 5m` above is ignored) or generation.
    expect(put.spec).toEqual(appSpec);
    expect(put.metadata.generation).toBe(1);

    await custom.patchNamespacedCustomObjectStatus(
      { ...APP, namespace: ns, name: 'simple', body: { status: { friendlyDescription: 'Reconciling' } } },
      setHeaderOptions('Content-Type', PatchStrategy.MergePatch),
    );
    const read = await custom.getNamespacedCustomObject({ ...APP, namespace: ns, name: 'simple' });
    expect(read.status).toEqual({ ...status, friendlyDescription: 'Reconciling' });
    expect(read.spec).toEqual(appSpec);

    // Writing the main resource ignores status, bumps generation on a spec change.
    const main = await custom.replaceNamespacedCustomObject({
      ...APP,
      namespace: ns,
      name: 'simple',
      body: { ...read, spec: { ...appSpec, paused: true }, status: { friendlyDescription: 'forged' } },
    });
    expect(main.status).toEqual({ ...status, friendlyDescription: 'Reconciling' });
    expect(main.spec).toEqual({ ...appSpec, paused: true });
    expect(main.metadata.generation).toBe(2);
  });

  it.each([
    [
      'spec.fetch not an array',
      { ...appSpec, fetch: { inline: {} } },
      'spec.fetch: Invalid value: "object": spec.fetch in body must be of type array: "object"',
    ],
    [
      'spec.syncPeriod a number',
      { ...appSpec, syncPeriod: 30 },
      'spec.syncPeriod: Invalid value: "integer": spec.syncPeriod in body must be of type string: "integer"',
    ],
  ])('rejects an App with %s, with the API server message', async (_, spec, detail) => {
    const err = await custom
      .createNamespacedCustomObject({
        ...APP,
        namespace: ns,
        body: { apiVersion: 'kappctrl.k14s.io/v1alpha1', kind: 'App', metadata: { name: 'bad' }, spec },
      })
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(err).toBeInstanceOf(ApiException);
    const e = err as ApiException<string>;
    expect(e.code).toBe(422);
    const body = JSON.parse(e.body) as { reason: string; message: string };
    expect(body.reason).toBe('Invalid');
    expect(body.message).toBe(`App.kappctrl.k14s.io "bad" is invalid: ${detail}`);
  });
});
