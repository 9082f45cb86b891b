/**
 * The forwarder against the real kube-apiserver of the shared test cluster, running with the
 * read-only ServiceAccount of infra/forwarder/rbac.yml: live events, status-only writes
 * that stay quiet, ref-changed for a referenced Secret only, and a stop/restart with changes
 * made while it was down (none lost, no storm).
 */
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { Forwarder } from '../../events/forwarder/forwarder.js';
import type { Transport } from '../../events/forwarder/transport.js';
import type { ObjectEvent } from '../../events/schema.js';
import { clientForKubeConfig } from '../../functions/lib/kube/registry.js';
import { kubectl, loadKubeConfig, writeTokenKubeconfig } from '../harness/kube.js';

const kubeconfigPath = inject('kubeconfigPath');
const cluster = inject('cluster');
const ns = `fwd-${randomBytes(3).toString('hex')}`;
const k = (args: string[], input?: string) => kubectl(kubeconfigPath, args, { input, kubectl: cluster.kubectlPath });
const CRD_DIR = fileURLToPath(new URL('../../infra/crds/', import.meta.url));
const RBAC = fileURLToPath(new URL('../../infra/forwarder/rbac.yml', import.meta.url));
const SA = 'system:serviceaccount:kapp-lambda:kapp-lambda-forwarder';

class RecordingTransport implements Transport {
  readonly events: ObjectEvent[] = [];
  async send(events: ObjectEvent[]): Promise<void> {
    this.events.push(...events);
  }
}

let tmp: string;
let saKubeconfig: string;
const transport = new RecordingTransport();
let seen = 0;

function iso(ms: number): string {
  return new Date(ms).toISOString().replace(/\.\d{3}Z$/, 'Z');
}

async function applyApp(name: string, opts: { syncPeriod?: string; secret?: string; finalizers?: string[] } = {}) {
  const manifest = {
    apiVersion: 'kappctrl.k14s.io/v1alpha1',
    kind: 'App',
    metadata: { name, namespace: ns, ...(opts.finalizers ? { finalizers: opts.finalizers } : {}) },
    spec: {
      serviceAccountName: 'deployer',
      syncPeriod: opts.syncPeriod ?? '1h',
      fetch: [
        opts.secret
          ? { inline: { pathsFrom: [{ secretRef: { name: opts.secret } }] } }
          : { inline: { paths: { 'cm.yml': 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n' } } },
      ],
      template: [{ ytt: {} }],
      deploy: [{ kapp: {} }],
    },
  };
  await k(['apply', '-f', '-'], JSON.stringify(manifest));
}

async function getApp(name: string): Promise<{ generation: number; resourceVersion: string; uid: string }> {
  const o = JSON.parse((await k(['get', 'app', name, '-n', ns, '-o', 'json'])).stdout) as {
    metadata: { generation: number; resourceVersion: string; uid: string };
  };
  return o.metadata;
}

/** Writes the status a successful reconcile of the current generation leaves (as our functions would). */
async function markHandled(name: string, at = Date.now()): Promise<void> {
  const { generation } = await getApp(name);
  const status = {
    observedGeneration: generation,
    conditions: [{ type: 'ReconcileSucceeded', status: 'True' }],
    friendlyDescription: 'Reconcile succeeded',
    consecutiveReconcileSuccesses: 1,
    consecutiveReconcileFailures: 0,
    fetch: { exitCode: 0, updatedAt: iso(at) },
    template: { exitCode: 0, updatedAt: iso(at) },
    deploy: { exitCode: 0, finished: true, updatedAt: iso(at) },
  };
  await k(['patch', 'app', name, '-n', ns, '--subresource=status', '--type=merge', '-p', JSON.stringify({ status })]);
}

async function applySecret(name: string, value: string): Promise<void> {
  const manifest = { apiVersion: 'v1', kind: 'Secret', metadata: { name, namespace: ns }, stringData: { v: value } };
  await k(['apply', '-f', '-'], JSON.stringify(manifest));
}

function forwarder(): Forwarder {
  const f = new Forwarder({
    clusterId: 'it-cluster',
    watcher: clientForKubeConfig(loadKubeConfig(saKubeconfig)),
    transport,
    namespaces: [ns],
    coalesceWindowMs: 100,
  });
  f.start();
  return f;
}

/** `reason name` of the events received since the last call. */
function fresh(): string[] {
  const out = transport.events.slice(seen).map((e) => `${e.data.reason} ${e.data.name}`);
  seen = transport.events.length;
  return out;
}

/**
 * Waits until the events since the last check include `expected`, then for a quiet second,
 * and returns them all (sorted) so the caller can assert the exact set.
 */
async function eventsAfter(expected: string[], timeoutMs = 30_000): Promise<string[]> {
  const deadline = Date.now() + timeoutMs;
  const has = () => {
    const got = transport.events.slice(seen).map((e) => `${e.data.reason} ${e.data.name}`);
    return expected.every((x) => got.includes(x));
  };
  while (!has() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  await new Promise((r) => setTimeout(r, 1000));
  return fresh().sort();
}

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), 'forwarder-it-'));
  for (const f of [
    'apps.kappctrl.k14s.io.yaml',
    'packageinstalls.packaging.carvel.dev.yaml',
    'packagerepositories.packaging.carvel.dev.yaml',
  ]) {
    await k(['apply', '--server-side', '--force-conflicts', '-f', path.join(CRD_DIR, f)]);
  }
  await k(['wait', '--for=condition=Established', '--timeout=60s', 'crd/apps.kappctrl.k14s.io']);
  await k(
    ['apply', '-f', '-'],
    JSON.stringify({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'kapp-lambda' } }),
  );
  await k(['create', 'namespace', ns]);
  await k(['apply', '-f', RBAC]);
  const token = (
    await k(['create', 'token', 'kapp-lambda-forwarder', '-n', 'kapp-lambda', '--duration', '1h'])
  ).stdout.trim();
  saKubeconfig = await writeTokenKubeconfig(kubeconfigPath, token, path.join(tmp, 'forwarder.kubeconfig'));
});

afterAll(async () => {
  await k(['delete', 'namespace', ns, '--wait=false']);
  await rm(tmp, { recursive: true, force: true });
});

describe('forwarder RBAC', () => {
  it.each([
    ['list', 'apps.kappctrl.k14s.io', '', 'yes'],
    ['watch', 'secrets', '', 'yes'],
    ['get', 'configmaps', '', 'yes'],
    ['watch', 'packageinstalls.packaging.carvel.dev', '', 'yes'],
    ['watch', 'packagerepositories.packaging.carvel.dev', '', 'yes'],
    ['create', 'apps.kappctrl.k14s.io', '', 'no'],
    ['patch', 'apps.kappctrl.k14s.io', '', 'no'],
    ['update', 'apps.kappctrl.k14s.io', 'status', 'no'],
    ['delete', 'secrets', '', 'no'],
    // The drift watches list and watch whatever kinds Apps deployed (metadata only): list and
    // watch of every kind, nothing else on them.
    ['list', 'pods', '', 'yes'],
    ['watch', 'deployments.apps', '', 'yes'],
    ['get', 'pods', '', 'no'],
    ['delete', 'pods', '', 'no'],
    ['patch', 'deployments.apps', '', 'no'],
    ['watch', 'serviceaccounts', '', 'yes'],
    ['create', 'serviceaccounts', 'token', 'no'],
  ])('%s %s %s: %s', async (verb, resource, subresource, want) => {
    const args = ['auth', 'can-i', verb, resource, '-n', ns, '--as', SA];
    if (subresource) args.push(`--subresource=${subresource}`);
    const r = await kubectl(kubeconfigPath, args, { check: false, kubectl: cluster.kubectlPath });
    expect(r.stdout.trim()).toBe(want);
  });
});

describe('forwarder RBAC: leader election', () => {
  it.each([
    ['get', 'kapp-lambda', 'yes'],
    ['create', 'kapp-lambda', 'yes'],
    ['update', 'kapp-lambda', 'yes'],
    ['delete', 'kapp-lambda', 'no'],
    ['patch', 'kapp-lambda', 'no'],
    ['update', 'kube-system', 'no'],
    ['create', 'TENANT', 'no'],
  ])('%s leases in %s: %s', async (verb, where, want) => {
    const namespace = where === 'TENANT' ? ns : where;
    const args = ['auth', 'can-i', verb, 'leases.coordination.k8s.io', '-n', namespace, '--as', SA];
    const r = await kubectl(kubeconfigPath, args, { check: false, kubectl: cluster.kubectlPath });
    expect(r.stdout.trim()).toBe(want);
  });
});

describe('forwarder against the API server', () => {
  it('forwards live changes, stays quiet on status writes, and loses nothing across a restart', async () => {
    // Before the first start: handled Apps (status as our functions write it) and one never reconciled.
    await applySecret('vals', '1');
    await applySecret('other', '1');
    // Status times and Secret writes have second precision: reconcile in a later second.
    await new Promise((r) => setTimeout(r, 1100));
    await applyApp('handled');
    await applyApp('uses-vals', { secret: 'vals' });
    await applyApp('uses-other', { secret: 'other' });
    await applyApp('finalized', { finalizers: ['test.kapp-lambda.dev/hold'] });
    await applyApp('fresh');
    for (const n of ['handled', 'uses-vals', 'uses-other', 'finalized']) await markHandled(n);

    let f = forwarder();
    await f.synced();
    expect(await eventsAfter(['added fresh'])).toEqual(['added fresh']);

    // The function's status write for `fresh` comes back as a watch event: no event.
    await markHandled('fresh');
    expect(await eventsAfter([])).toEqual([]);

    await applyApp('new');
    expect(await eventsAfter(['added new'])).toEqual(['added new']);

    await applyApp('handled', { syncPeriod: '2h' });
    expect(await eventsAfter(['modified handled'])).toEqual(['modified handled']);
    const handledEvent = transport.events.at(-1)!;
    const live = await getApp('handled');
    expect(handledEvent.data).toEqual({
      clusterId: 'it-cluster',
      kind: 'App',
      apiVersion: 'kappctrl.k14s.io/v1alpha1',
      namespace: ns,
      name: 'handled',
      uid: live.uid,
      generation: 2,
      resourceVersion: live.resourceVersion,
      reason: 'modified',
    });
    expect(handledEvent.subject).toBe(`it-cluster/App/${ns}/handled`);
    await markHandled('handled');
    expect(await eventsAfter([])).toEqual([]);

    await applySecret('vals', '2');
    expect(await eventsAfter(['ref-changed uses-vals'])).toEqual(['ref-changed uses-vals']);
    await applySecret('unrelated', '1');
    expect(await eventsAfter([])).toEqual([]);

    await k(['delete', 'app', 'new', '-n', ns]);
    expect(await eventsAfter(['deleted new'])).toEqual(['deleted new']);

    // Everything is handled now; the Secret write above predates this reconcile.
    await new Promise((r) => setTimeout(r, 1100));
    for (const n of ['handled', 'uses-vals', 'uses-other', 'finalized', 'fresh']) await markHandled(n);
    expect(await eventsAfter([])).toEqual([]);

    await f.stop({ drain: true });
    // Status times and Secret writes have second precision: keep the next writes in a later second.
    await new Promise((r) => setTimeout(r, 1100));

    // While the forwarder is down.
    await applyApp('handled', { syncPeriod: '3h' });
    await applyApp('while-down');
    await applySecret('vals', '3');
    await k(['delete', 'app', 'finalized', '-n', ns, '--wait=false']);
    await markHandled('fresh'); // a status-only write

    f = forwarder();
    await f.synced();
    expect(
      await eventsAfter(['modified handled', 'added while-down', 'ref-changed uses-vals', 'modified finalized']),
    ).toEqual(['added while-down', 'modified finalized', 'modified handled', 'ref-changed uses-vals']);
    expect(transport.events.find((e) => e.data.name === 'handled' && e.data.generation === 3)).toBeDefined();

    // Finishing the deletion (the finalizer goes) is forwarded live.
    await k(['patch', 'app', 'finalized', '-n', ns, '--type=merge', '-p', '{"metadata":{"finalizers":null}}']);
    expect(await eventsAfter(['deleted finalized'])).toEqual(['deleted finalized']);
    expect(f.stats()).toMatchObject({ gone: 0, stalls: 0, watchErrors: 0, sendErrors: 0, invalid: 0 });
    await f.stop();
  });
});
