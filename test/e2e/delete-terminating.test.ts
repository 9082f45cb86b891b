/**
 * e2e: an App whose ServiceAccount is already gone while every namespace it deployed to is
 * terminating is removed by a noop delete (reference §3.9, `noopDeleteDueToTerminatingNamespaces`,
 * kapp-controller v0.40+): no `kapp delete` runs, no `DeleteFailed` (`Preparing kapp: Getting
 * service account: ...`) is written, and the namespaces go away, whichever of the namespaces
 * starts terminating first as long as both are terminating when the App's deletion starts. When
 * the App's namespace terminates while the other is still active, kapp-controller's outcome:
 * `kapp delete` is attempted and fails on the missing ServiceAccount (`DeleteFailed`, finalizer
 * kept, failure backoff); once the other namespace terminates too, the delete is the noop at
 * once: the forwarder watches Namespaces and asks the App to reconcile when the last of its
 * namespaces starts terminating (upstream waits for its next retry). Each case has its own pair
 * of namespaces: the App's own (where its ServiceAccount lives) and another it deployed a
 * ConfigMap into.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import type { KappEvent } from '../../events/schema.js';
import {
  APP_FINALIZER,
  type AppObject,
  apply,
  appManifest,
  expectSucceededStatus,
  getApp,
  getObject,
  k,
  SA,
  STATUS_KEYS,
  succeededAt,
  suffix,
  useE2ERuntime,
  waitFor,
} from './support.js';

const id = suffix();
/** One pair of namespaces per case (the App's own, the other it deploys into). */
const CASES = {
  together: { app: `e2e-term-a1-${id}`, other: `e2e-term-b1-${id}` },
  reversed: { app: `e2e-term-a2-${id}`, other: `e2e-term-b2-${id}` },
  otherFirst: { app: `e2e-term-a3-${id}`, other: `e2e-term-b3-${id}` },
  appFirst: { app: `e2e-term-a4-${id}`, other: `e2e-term-b4-${id}` },
} as const;
/** Single-namespace cases: everything in the App's own namespace, plus the cluster-scoped one. */
const SINGLE = {
  same: `e2e-term-a5-${id}`,
  clusterScoped: `e2e-term-a6-${id}`,
  live: `e2e-term-a7-${id}`,
} as const;
/** The cluster-scoped object (a Namespace) the `clusterScoped` App deploys. */
const CLUSTER_OBJECT = `e2e-term-cl-${id}`;

const rt = useE2ERuntime([...Object.values(CASES).map((c) => c.app), ...Object.values(SINGLE)], {
  tenants: Object.values(CASES).map((c) => c.other),
});

/** `reason` of each event the runtime's forwarder sent, per App (`ns/name`), in order. */
const sent = new Map<string, string[]>();
beforeAll(() => {
  const pipeline = rt.runtime.pipeline;
  const send = pipeline.send.bind(pipeline);
  pipeline.send = async (events: readonly KappEvent[]) => {
    for (const e of events) {
      if (e.type !== 'dev.kapp-lambda.object.v1') continue;
      const key = `${e.data.namespace}/${e.data.name}`;
      sent.set(key, [...(sent.get(key) ?? []), e.data.reason]);
    }
    await send(events);
  };
});

/** A ConfigMap document for an inline fetch. */
function configMap(name: string, ns: string): string {
  return [
    'apiVersion: v1',
    'kind: ConfigMap',
    'metadata:',
    `  name: ${name}`,
    `  namespace: ${ns}`,
    'data:',
    '  k: v',
  ].join('\n');
}

/**
 * The App `ns/name` deploying one ConfigMap into its own namespace and one into `other` with
 * {@link SA} of `ns`, which a RoleBinding in `other` lets write there; waits for its success.
 */
async function deployAcross(ns: string, other: string, name: string): Promise<AppObject> {
  await apply(
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'RoleBinding',
      metadata: { name: `${SA}-from-${ns}`, namespace: other },
      subjects: [{ kind: 'ServiceAccount', name: SA, namespace: ns }],
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: `${SA}-role` },
    },
    appManifest(ns, name, {
      fetch: [{ inline: { paths: { 'own.yml': configMap('own', ns), 'other.yml': configMap('other', other) } } }],
      template: [{ ytt: {} }],
      deploy: [{ kapp: {} }],
    }),
  );
  const app = await rt.waitForApp(ns, name, succeededAt(1), 'ReconcileSucceeded');
  expectSucceededStatus(app, STATUS_KEYS);
  expect(app.status?.deploy?.kapp?.associatedResources?.namespaces).toEqual([ns, other].sort());
  return app;
}

/**
 * Waits until the App is gone and both namespaces with it, reading the App meanwhile: every
 * condition type it showed while it existed.
 */
async function waitAllGone(ns: string, other: string, name: string): Promise<Set<string>> {
  const seen = new Set<string>();
  await waitFor(
    `App ${ns}/${name} and namespaces ${ns}, ${other} gone`,
    async () => {
      const app = await getApp(ns, name).catch(() => undefined);
      for (const c of app?.status?.conditions ?? []) seen.add(c.type);
      if (app) return undefined;
      const left = await k(['get', 'namespace', ns, other, '--ignore-not-found', '-o', 'name'], undefined, false);
      return left.stdout.trim() === '' ? true : undefined;
    },
    { timeoutMs: 150_000, intervalMs: 200 },
  );
  return seen;
}

/** The delete stage's runs of the App: each must be a noop (no tool run) that removed it. */
function expectNoopDeletes(ns: string, name: string): void {
  const deletes = rt.stageRuns(ns, name).filter((r) => r.stage === 'delete');
  expect(deletes.length, JSON.stringify(rt.stageRuns(ns, name))).toBeGreaterThanOrEqual(1);
  for (const run of deletes) {
    expect(run.outcome, JSON.stringify(run)).toBe('deleted');
    expect((run.tools as { runs?: number } | undefined)?.runs ?? 0).toBe(0);
  }
}

describe.concurrent('App deleted with its ServiceAccount gone and every namespace terminating', () => {
  it("both namespaces deleted in one request, the App's first (upstream namespace_deletion_test.go)", async () => {
    const { app: ns, other } = CASES.together;
    const name = `term-${id}`;
    await deployAcross(ns, other, name);
    await k(['delete', 'serviceaccount', SA, '-n', ns]);
    await k(['delete', 'namespace', ns, other, '--wait=false']);
    const seen = await waitAllGone(ns, other, name);
    expect([...seen]).not.toContain('DeleteFailed');
    expectNoopDeletes(ns, name);
  });

  it("both namespaces deleted in one request, the App's last", async () => {
    const { app: ns, other } = CASES.reversed;
    const name = `term-${id}`;
    await deployAcross(ns, other, name);
    await k(['delete', 'serviceaccount', SA, '-n', ns]);
    await k(['delete', 'namespace', other, ns, '--wait=false']);
    const seen = await waitAllGone(ns, other, name);
    expect([...seen]).not.toContain('DeleteFailed');
    expectNoopDeletes(ns, name);
  });

  it("the other namespace terminating for a while before the App's", async () => {
    const { app: ns, other } = CASES.otherFirst;
    const name = `term-${id}`;
    await deployAcross(ns, other, name);
    await k(['delete', 'serviceaccount', SA, '-n', ns]);
    await k(['delete', 'namespace', other, '--wait=false']);
    await waitFor(`namespace ${other} terminating or gone`, async () => {
      const r = await k(
        ['get', 'namespace', other, '--ignore-not-found', '-o', 'jsonpath={.status.phase}'],
        undefined,
        false,
      );
      return r.stdout.trim() === '' || r.stdout.trim() === 'Terminating' ? true : undefined;
    });
    await k(['delete', 'namespace', ns, '--wait=false']);
    const seen = await waitAllGone(ns, other, name);
    expect([...seen]).not.toContain('DeleteFailed');
    expectNoopDeletes(ns, name);
  });

  it("the App's namespace terminating while the other is still active: upstream's DeleteFailed, then the noop delete as soon as the other terminates", async () => {
    const { app: ns, other } = CASES.appFirst;
    const name = `term-${id}`;
    await deployAcross(ns, other, name);
    await k(['delete', 'serviceaccount', SA, '-n', ns]);
    await k(['delete', 'namespace', ns, '--wait=false']);
    // kapp-controller runs kapp delete here (not every namespace is terminating), which fails
    // on the missing ServiceAccount; the finalizer stays and the failure backoff retries.
    const message = 'Preparing kapp: Getting service account: serviceaccounts "e2e-sa" not found';
    // Three failures: the next retry is 8 s away (2^n s), so what removes the App once the
    // other namespace terminates is the forwarder's reaction, not a retry that happened to come.
    const failed = await rt.waitForApp(
      ns,
      name,
      (a) =>
        (a.status?.conditions?.some((c) => c.type === 'DeleteFailed') ?? false) &&
        (a.status?.consecutiveReconcileFailures ?? 0) >= 3,
      'DeleteFailed three times',
    );
    expect(failed.status?.conditions).toEqual([{ type: 'DeleteFailed', status: 'True', message }]);
    expect(failed.status?.friendlyDescription).toBe(`Delete failed: ${message}`);
    expect(failed.status?.usefulErrorMessage).toBe(message);
    expect(failed.metadata.finalizers).toContain(APP_FINALIZER);
    expect(await getObject('configmap', other, 'other')).toBeDefined();
    const before = sent.get(`${ns}/${name}`)?.length ?? 0;
    await k(['delete', 'namespace', other, '--wait=false']);
    await waitAllGone(ns, other, name);
    // What asked for the last delete: the forwarder's Namespace watch (`ref-changed`: an App
    // being deleted references no Secret or ConfigMap, so nothing else sends that reason).
    expect(sent.get(`${ns}/${name}`)?.slice(before)).toContain('ref-changed');
    const deletes = rt.stageRuns(ns, name).filter((r) => r.stage === 'delete');
    // never a kapp run: the failures stopped before kapp, the last delete was the noop
    for (const run of deletes) expect((run.tools as { runs?: number } | undefined)?.runs ?? 0).toBe(0);
    expect(deletes.at(-1)?.outcome).toBe('deleted');
    expect(deletes.slice(0, -1).every((r) => r.outcome === 'failed' && r.error === message)).toBe(true);
  });
});

describe.concurrent('App deletion and namespaces: the other cases of §3.9', () => {
  /** The App `ns/name` deploying `docs` (YAML documents) with {@link SA}; waits for its success. */
  async function deploy(ns: string, name: string, docs: Record<string, string>): Promise<AppObject> {
    await apply(
      appManifest(ns, name, { fetch: [{ inline: { paths: docs } }], template: [{ ytt: {} }], deploy: [{ kapp: {} }] }),
    );
    const app = await rt.waitForApp(ns, name, succeededAt(1), 'ReconcileSucceeded');
    expectSucceededStatus(app, STATUS_KEYS);
    return app;
  }
  const message = 'Preparing kapp: Getting service account: serviceaccounts "e2e-sa" not found';
  const deleteFailed = (a: AppObject) => a.status?.conditions?.some((c) => c.type === 'DeleteFailed') ?? false;
  function expectDeleteFailed(app: AppObject): void {
    expect(app.status?.conditions).toEqual([{ type: 'DeleteFailed', status: 'True', message }]);
    expect(app.status?.friendlyDescription).toBe(`Delete failed: ${message}`);
    expect(app.status?.usefulErrorMessage).toBe(message);
    expect(app.metadata.finalizers).toContain(APP_FINALIZER);
  }

  it('everything in the terminating App namespace (upstream namespace_deletion_test.go): noop delete at once', async () => {
    const ns = SINGLE.same;
    const name = `term-${id}`;
    const app = await deploy(ns, name, { 'own.yml': configMap('own', ns) });
    expect(app.status?.deploy?.kapp?.associatedResources?.namespaces).toEqual([ns]);
    await k(['delete', 'serviceaccount', SA, '-n', ns]);
    await k(['delete', 'namespace', ns, '--wait=false']);
    const seen = new Set<string>();
    await waitFor(
      `App ${ns}/${name} and namespace ${ns} gone`,
      async () => {
        const a = await getApp(ns, name).catch(() => undefined);
        for (const c of a?.status?.conditions ?? []) seen.add(c.type);
        if (a) return undefined;
        const left = await k(['get', 'namespace', ns, '--ignore-not-found', '-o', 'name'], undefined, false);
        return left.stdout.trim() === '' ? true : undefined;
      },
      { timeoutMs: 150_000, intervalMs: 200 },
    );
    expect([...seen]).not.toContain('DeleteFailed');
    expectNoopDeletes(ns, name);
  });

  it('a cluster-scoped resource among them: kapp delete is attempted and fails on the missing ServiceAccount; the App stays', async () => {
    const ns = SINGLE.clusterScoped;
    const name = `term-${id}`;
    const rbacName = `e2e-term-cl-${id}`;
    await apply(
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'ClusterRole',
        metadata: { name: rbacName },
        rules: [{ apiGroups: [''], resources: ['namespaces'], verbs: ['*'] }],
      },
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'ClusterRoleBinding',
        metadata: { name: rbacName },
        subjects: [{ kind: 'ServiceAccount', name: SA, namespace: ns }],
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: rbacName },
      },
    );
    try {
      const app = await deploy(ns, name, {
        'own.yml': configMap('own', ns),
        'ns.yml': `apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ${CLUSTER_OBJECT}\n`,
      });
      expect(app.status?.deploy?.kapp?.associatedResources?.namespaces).toEqual(['(cluster)', ns]);
      await k(['delete', 'serviceaccount', SA, '-n', ns]);
      await k(['delete', 'namespace', ns, '--wait=false']);
      const failed = await rt.waitForApp(ns, name, deleteFailed, 'DeleteFailed');
      expectDeleteFailed(failed);
      // kapp delete never got to run: the cluster-scoped Namespace it deployed is still there
      expect((await k(['get', 'namespace', CLUSTER_OBJECT, '-o', 'name'])).stdout.trim()).toBe(
        `namespace/${CLUSTER_OBJECT}`,
      );
      const deletes = rt.stageRuns(ns, name).filter((r) => r.stage === 'delete');
      expect(deletes.length).toBeGreaterThanOrEqual(1);
      expect(deletes.every((r) => r.outcome === 'failed' && r.error === message)).toBe(true);
    } finally {
      // As upstream, only a person lets this namespace go: drop the finalizer.
      await k(
        ['patch', 'apps.kappctrl.k14s.io', name, '-n', ns, '--type=merge', '-p', '{"metadata":{"finalizers":null}}'],
        undefined,
        false,
      );
      await k(['delete', 'namespace', CLUSTER_OBJECT, '--ignore-not-found', '--wait=false'], undefined, false);
      await k(['delete', 'clusterrolebinding,clusterrole', rbacName, '--ignore-not-found'], undefined, false);
    }
  });

  it('the namespace not terminating: kapp delete fails on the missing ServiceAccount until it is back, then removes everything', async () => {
    const ns = SINGLE.live;
    const name = `term-${id}`;
    await deploy(ns, name, { 'own.yml': configMap('own', ns) });
    await k(['delete', 'serviceaccount', SA, '-n', ns]);
    await k(['delete', 'apps.kappctrl.k14s.io', name, '-n', ns, '--wait=false']);
    const failed = await rt.waitForApp(ns, name, deleteFailed, 'DeleteFailed');
    expectDeleteFailed(failed);
    expect(await getObject('configmap', ns, 'own')).toBeDefined();
    // The ServiceAccount is not watched (§3.1): the failure backoff's retry finds it back.
    await apply({ apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: SA, namespace: ns } });
    await waitFor(`App ${ns}/${name} gone`, async () => ((await getApp(ns, name)) ? undefined : true), {
      timeoutMs: 150_000,
    });
    expect(await getObject('configmap', ns, 'own')).toBeUndefined();
    expect(await getObject('configmap', ns, `${name}.app`)).toBeUndefined();
    const deletes = rt.stageRuns(ns, name).filter((r) => r.stage === 'delete');
    expect(deletes.at(-1)?.outcome).toBe('deleted');
    expect((deletes.at(-1)?.tools as { runs?: number } | undefined)?.runs).toBe(1);
  });
});
