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

const rt = useE2ERuntime(
  Object.values(CASES).map((c) => c.app),
  { tenants: Object.values(CASES).map((c) => c.other) },
);

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
