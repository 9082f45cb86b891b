/**
 * Reconcile by exception (issue 24) when the forwarder's view is broken or restarted, on the real
 * control plane with the real tools:
 *
 * - an App whose drift watch stopped working is reconciled by the fallback: its drift watch
 *   (metadata-only, by kapp's app label) fails as lost RBAC would (a fault hook wraps the
 *   forwarder's watch view), and the quiet App is asked at its sync period instead of staying
 *   quiet until its safety period;
 * - a forwarder restart reconciles each quiet App once, not once per restart-and-sync-period, and
 *   not all of them again and again.
 */
import { describe, expect, it } from 'vitest';
import { KAPP_APP_LABEL } from '../../events/forwarder/drift.js';
import type { ObjectWatcher } from '../../functions/lib/kube/port.js';
import { apply, expectSucceeded, inlineConfigMapApp, suffix, useE2ERuntime, waitFor } from './support.js';

const ns = `e2e-rbe-rec-${suffix()}`;

/** While set, the forwarder's drift watches fail (open ones end with the error, new ones reject). */
let broken: Error | undefined;
const failOpen = new Set<(err: Error) => void>();

/** The forwarder's watch view, with its label-selected drift watches failing while {@link broken}. */
function faultyDriftWatches(view: ObjectWatcher): ObjectWatcher {
  return {
    list: (resource, options) => view.list(resource, options),
    discover: (group, kind) => view.discover(group, kind),
    watch(resource, options, onEvent, signal) {
      if (options.labelSelector !== KAPP_APP_LABEL) return view.watch(resource, options, onEvent, signal);
      if (broken) return Promise.reject(broken);
      const ac = new AbortController();
      signal?.addEventListener('abort', () => ac.abort(), { once: true });
      return new Promise<void>((resolve, reject) => {
        const fail = (err: Error) => {
          failOpen.delete(fail);
          ac.abort();
          reject(err);
        };
        failOpen.add(fail);
        view.watch(resource, options, onEvent, ac.signal).then(
          () => {
            failOpen.delete(fail);
            resolve();
          },
          (err: unknown) => {
            failOpen.delete(fail);
            reject(err);
          },
        );
      });
    },
  };
}

const rt = useE2ERuntime([ns], { overrides: { forwarder: { wrapWatcher: faultyDriftWatches } } });

function app(name: string, syncPeriod: string) {
  const manifest = inlineConfigMapApp(ns, name, 'one') as { spec: Record<string, unknown> };
  manifest.spec.syncPeriod = syncPeriod;
  return manifest;
}

/** Deploy runs of an App the runtime logged. */
const deployRuns = (name: string) => rt.stageRuns(ns, name).filter((r) => r.stage === 'deploy').length;

describe('reconcile by exception: recovery', () => {
  it('an App whose drift watch fails is reconciled by the fallback at its sync period', async () => {
    // The ConfigMap drift watch starts with the first App that deployed ConfigMaps: Apps deployed
    // after it listed are covered from their first reconcile on.
    await apply(app('primer', '1h'));
    await expectSucceeded(await rt.waitReconciled(ns, 'primer', 120_000));
    await new Promise((r) => setTimeout(r, 2000));
    await apply(app('fallback', '30s'));
    await expectSucceeded(await rt.waitReconciled(ns, 'fallback', 120_000));
    await rt.runtime.pipeline.idle();
    const before = deployRuns('fallback');
    broken = Object.assign(new Error('configmaps is forbidden (fault injected)'), { statusCode: 403 });
    for (const fail of [...failOpen]) fail(broken);
    try {
      // Asked within the shortest sync period (30 s, spread) of the watch failing, where a
      // covered App would wait for its safety period (10 minutes).
      await waitFor('a fallback reconcile', async () => (deployRuns('fallback') > before ? true : undefined), {
        timeoutMs: 45_000,
      });
      // The reflector saw the failure (and keeps retrying it).
      expect(
        rt.records.some((r) => r.msg === 'watch failed; retrying' && String(r.obj.resource).includes('ConfigMap')),
      ).toBe(true);
    } finally {
      broken = undefined;
    }
  }, 240_000);

  it('a forwarder restart reconciles each quiet App once', async () => {
    const names = ['once-a', 'once-b', 'once-c'];
    for (const name of names) await apply(app(name, '30s'));
    for (const name of names) await expectSucceeded(await rt.waitReconciled(ns, name, 120_000));
    await rt.runtime.pipeline.idle();
    await rt.stop();
    const before = new Map(names.map((n) => [n, deployRuns(n)]));
    rt.restart();
    // Not covered by the new forwarder's watches (they started after each App's last
    // reconcile): each runs once at its sync period, after which they are covered and quiet.
    await waitFor(
      'each App reconciled after the restart',
      async () => (names.every((n) => deployRuns(n) > before.get(n)!) ? true : undefined),
      { timeoutMs: 60_000 },
    );
    await new Promise((r) => setTimeout(r, 10_000));
    await rt.runtime.pipeline.idle();
    expect(Object.fromEntries(names.map((n) => [n, deployRuns(n) - before.get(n)!]))).toEqual(
      Object.fromEntries(names.map((n) => [n, 1])),
    );
  }, 300_000);
});
