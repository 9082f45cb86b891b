/**
 * The no-op resync (issue 13 item 2) on the real control plane with the real tools: after the
 * first reconcile, the App's periodic resync (its `syncPeriod`, 30 s, the floor) finds the
 * manifest, deploy spec and generation unchanged and the deployed objects as kapp left them, and
 * ends `ReconcileSucceeded` without any tool once a run of kapp that applied nothing has kept the
 * deploy record (the first resync after a deploy that changed the cluster runs kapp to confirm
 * what it left) (the App's safety period, 31 s, brings a full
 * reconcile about every sync period even when it is quiet); a ConfigMap edited by hand, or deleted, makes the next reconcile (now
 * asked for at once by the forwarder's drift watch) run kapp, which reverts it; after that revert the resyncs are no-ops again. A
 * no-op resync makes two API requests: the App read and the list of its resources. It writes no
 * status (issue 24 item 4): the App's resourceVersion and status stay exactly as the last real
 * reconcile left them, and what `kubectl get apps` shows (friendlyDescription, the
 * `ReconcileSucceeded` condition, observedGeneration) stays correct. Its pipeline calls are
 * asserted one by one.
 */
import { describe, expect, it } from 'vitest';
import { SAFETY_SYNC_PERIOD_ANNOTATION } from '../../events/forwarder/quiet.js';
import type { DispatchDeps } from '../../functions/lib/pipeline/deps.js';
import {
  type AppObject,
  apply,
  expectSucceeded,
  getApp,
  getObject,
  inlineConfigMapApp,
  k,
  suffix,
  useE2ERuntime,
} from './support.js';

const ns = `e2e-noop-${suffix()}`;

/**
 * The pipeline's API calls, in order: each call of a cluster view's method that talks to the API
 * server (`getObject`, `updateStatus`, `serviceAccountToken`, ...; not `apiServer` and
 * `cachedServiceAccountToken`, which answer from memory) and each request the App's own identity
 * sends (`as App: GET <path>`). The cached `kapp-controller-config` reads are not pipeline calls
 * here (a 10 s cache per cluster, not per resync).
 */
const calls: string[] = [];
const NO_IO = new Set(['apiServer', 'cachedServiceAccountToken']);
function countingView<V extends object>(view: V): V {
  // the views are frozen: a copy with each method wrapped, not a Proxy
  return Object.fromEntries(
    Object.entries(view).map(([name, v]) => [
      name,
      typeof v !== 'function' || NO_IO.has(name)
        ? v
        : (...args: unknown[]) => {
            calls.push(name);
            return (v as (...a: unknown[]) => unknown).apply(view, args);
          },
    ]),
  ) as V;
}
function countingDeps(deps: DispatchDeps): DispatchDeps {
  const { clusters, appReader } = deps;
  return {
    ...deps,
    clusters: new Proxy(clusters, {
      get(target, prop, receiver) {
        const v = Reflect.get(target, prop, receiver) as unknown;
        if (typeof v !== 'function' || !['fetchView', 'deployView', 'installView'].includes(String(prop))) return v;
        return (id: string) => countingView((v as (id: string) => object).call(target, id));
      },
    }),
    ...(appReader
      ? {
          appReader: (kubeconfig: string) => {
            const rest = appReader(kubeconfig);
            return {
              send: (req: Parameters<typeof rest.send>[0]) => {
                calls.push(`as App: ${req.method} ${req.path}`);
                return rest.send(req);
              },
            };
          },
        }
      : {}),
  };
}

const rt = useE2ERuntime([ns], { overrides: { wrapDeps: countingDeps } });

/** Tool runs so far, all tools. */
function toolRuns(): Record<string, number> {
  return Object.fromEntries(Object.entries(rt.runtime.toolMetrics.snapshot()).map(([t, s]) => [t, s.count]));
}

/** Runs of each tool between two {@link toolRuns} snapshots (tools that ran only). */
function ranSince(before: Record<string, number>): Record<string, number> {
  return Object.fromEntries(
    Object.entries(toolRuns())
      .map(([t, n]) => [t, n - (before[t] ?? 0)] as const)
      .filter(([, n]) => n > 0),
  );
}

describe('no-op resync', () => {
  it('a resync with nothing changed runs no tool; a hand edit or a deletion is reverted by the next resync', async () => {
    const name = 'noop';
    const second = [
      '---',
      'apiVersion: v1',
      'kind: ConfigMap',
      'metadata:',
      `  name: ${name}-other`,
      'data:',
      '  x: "1"',
    ];
    const manifest = inlineConfigMapApp(ns, name, 'one', second.join('\n')) as { spec: Record<string, unknown> };
    manifest.spec.syncPeriod = '30s';
    // A safety period just over the sync period: an App whose inputs the forwarder watches is
    // quiet at its sync period (reconcile-by-exception.test.ts), so here the full reconciles come
    // every 31 s (+ jitter) by the safety period, or every 30 s while not yet quiet. Not
    // `sync-mode: periodic`: that is upstream's behaviour exactly and writes status every sync.
    (manifest as unknown as { metadata: Record<string, unknown> }).metadata.annotations = {
      [SAFETY_SYNC_PERIOD_ANNOTATION]: '31s',
    };
    await apply(manifest);
    const first = await rt.waitReconciled(ns, name, 120_000);
    await expectSucceeded(first);
    await rt.runtime.pipeline.idle();

    /** Waits for the App's next deploy stage run after `count` of them, then for the runtime to settle. */
    const deployRuns = () => rt.stageRuns(ns, name).filter((r) => r.stage === 'deploy');
    const nextResync = async (): Promise<{
      app: AppObject;
      deploy: Record<string, unknown>;
      ran: Record<string, number>;
      calls: string[];
    }> => {
      const before = toolRuns();
      const count = deployRuns().length;
      calls.length = 0;
      const app = await rt.waitForApp(ns, name, () => deployRuns().length > count, 'the next resync', 60_000);
      await rt.runtime.pipeline.idle();
      return {
        app: (await getApp(ns, name)) ?? app,
        deploy: deployRuns()[count] as Record<string, unknown>,
        ran: ranSince(before),
        calls: [...calls],
      };
    };

    // 0. the first deploy changed the cluster, so no record was kept from it (a write under
    // kapp's name while kapp ran would be in it): the first resync runs kapp, which applies
    // nothing, and keeps the record; its status says so (kapp's output differs), once
    const confirm = await nextResync();
    expect(confirm.ran, 'tools run by the resync that confirms the first deploy').toEqual({ kapp: 1 });
    expect(confirm.app.status?.deploy?.stdout).not.toContain(' ---- applying ');

    // 1. nothing changed: no tool runs and no status is written (upstream rewrites it every sync)
    const noop = await nextResync();
    expect(noop.ran, 'tools run by the no-op resync').toEqual({});
    // Its API calls: the App read by the reconcile step (the later stages open on that copy), the
    // finalizer check (answered from that copy, which holds the finalizer: no request), one list
    // per recorded collection as the App (its fresh token from the first deploy: no
    // ServiceAccount read), and no status write: the run said nothing the status does not.
    expect(noop.calls).toEqual(['getObject', 'addFinalizer', `as App: GET /api/v1/namespaces/${ns}/configmaps`]);
    expect(noop.deploy.outcome).toBe('cached');
    expectUnchanged(noop.app, confirm.app);
    // what `kubectl get apps` shows: the description stays, Since-Deploy counts from the last real deploy
    const row = (await k(['get', 'apps', name, '-n', ns, '--no-headers'])).stdout.trim().split(/\s{2,}/);
    expect(row.slice(0, 2)).toEqual([name, 'Reconcile succeeded']);

    // 2. a hand edit: the next resync runs kapp, which reverts it
    await k(['-n', ns, 'patch', 'configmap', `${name}-config`, '--type=merge', '-p', '{"data":{"greeting":"edited"}}']);
    const edited = await nextResync();
    expect(edited.ran).toEqual({ kapp: 1 });
    await expectSucceeded(edited.app);
    const cm = await getObject<{ data?: Record<string, string> }>('configmap', ns, `${name}-config`);
    expect(cm?.data?.greeting).toBe('one');

    // 3. a deletion: the next resync runs kapp, which creates the object again
    await k(['-n', ns, 'delete', 'configmap', `${name}-other`]);
    const deleted = await nextResync();
    expect(deleted.ran).toEqual({ kapp: 1 });
    await expectSucceeded(deleted.app);
    expect((await getObject<{ data?: Record<string, string> }>('configmap', ns, `${name}-other`))?.data?.x).toBe('1');

    // a revert did work: its status is written (kapp's output lists what it applied)
    expect(deleted.app.metadata.resourceVersion).not.toBe(edited.app.metadata.resourceVersion);
    expect(deleted.app.status?.deploy?.stdout).not.toBe(first.status?.deploy?.stdout);

    // 4. after the revert kapp runs once more and applies nothing, which keeps the record again;
    // then the resync is a no-op, without a write
    const confirmed = await nextResync();
    expect(confirmed.ran).toEqual({ kapp: 1 });
    const again = await nextResync();
    expect(again.ran).toEqual({});
    expect(again.calls).toEqual(noop.calls);
    expectUnchanged(again.app, confirmed.app);
  }, 420_000);
});

/**
 * A resync that changed nothing left the App exactly as `before` (same resourceVersion and
 * status), and that status still reads right in `kubectl get apps` and to kapp's wait rule:
 * `Reconcile succeeded`, condition `ReconcileSucceeded` True, observedGeneration current.
 */
function expectUnchanged(app: AppObject, before: AppObject): void {
  expect(app.metadata.resourceVersion).toBe(before.metadata.resourceVersion);
  expect(app.status).toEqual(before.status);
  expect(app.status?.friendlyDescription).toBe('Reconcile succeeded');
  expect(app.status?.conditions).toEqual([{ type: 'ReconcileSucceeded', status: 'True' }]);
  expect(app.status?.observedGeneration).toBe(app.metadata.generation);
}
