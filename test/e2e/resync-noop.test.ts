/**
 * The no-op resync (issue 13 item 2) on the real control plane with the real tools: after the
 * first reconcile, the App's periodic resync (its `syncPeriod`, 30 s, the floor) finds the
 * manifest, deploy spec and generation unchanged and the deployed objects as kapp left them, and
 * ends `ReconcileSucceeded` without any tool; a ConfigMap edited by hand, or deleted, makes the
 * next resync run kapp, which reverts it; after that revert the resyncs are no-ops again.
 */
import { describe, expect, it } from 'vitest';
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
const rt = useE2ERuntime([ns]);

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
    }> => {
      const before = toolRuns();
      const count = deployRuns().length;
      const app = await rt.waitForApp(ns, name, () => deployRuns().length > count, 'the next resync', 60_000);
      await rt.runtime.pipeline.idle();
      return {
        app: (await getApp(ns, name)) ?? app,
        deploy: deployRuns()[count] as Record<string, unknown>,
        ran: ranSince(before),
      };
    };

    // 1. nothing changed: no tool runs, the status is the last deploy's with updatedAt refreshed
    const noop = await nextResync();
    expect(noop.ran, 'tools run by the no-op resync').toEqual({});
    expect(noop.deploy.outcome).toBe('cached');
    await expectSucceeded(noop.app);
    const [d0, d1] = [first.status?.deploy, noop.app.status?.deploy];
    expect(d1?.stdout).toBe(d0?.stdout);
    expect(d1?.startedAt).toBe(d0?.startedAt);
    expect(Date.parse(d1?.updatedAt ?? '')).toBeGreaterThan(Date.parse(d0?.updatedAt ?? ''));
    expect(noop.app.status?.consecutiveReconcileSuccesses).toBe((first.status?.consecutiveReconcileSuccesses ?? 0) + 1);

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

    // 4. after the revert the record is kept again: the next resync is a no-op
    const again = await nextResync();
    expect(again.ran).toEqual({});
    await expectSucceeded(again.app);
  }, 300_000);
});
