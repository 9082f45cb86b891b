/**
 * Reconcile by exception (issue 24) on the real control plane with the real tools:
 *
 * - drift reaches the runtime as an event: a hand edit and a hand deletion of what an App
 *   deployed are reverted while no periodic resync is due (its `syncPeriod` is an hour), with an
 *   Event `DriftDetected` on the App naming the change;
 * - an App whose inputs the forwarder watches stays quiet at its sync period (30 s): deployed
 *   after its kind's drift watch listed, no run for more than a sync period after its first; an App annotated `sync-mode: periodic` keeps upstream's
 *   timer (a run every sync period) side by side.
 */
import { describe, expect, it } from 'vitest';
import { SYNC_MODE_ANNOTATION } from '../../events/forwarder/quiet.js';
import { apply, expectSucceeded, getObject, inlineConfigMapApp, k, suffix, useE2ERuntime, waitFor } from './support.js';

const ns = `e2e-rbe-${suffix()}`;
const rt = useE2ERuntime([ns]);

/** An inline App rendering ConfigMaps `<name>-config` (greeting) and `<name>-other`. */
function twoConfigMaps(name: string, syncPeriod: string, annotations: Record<string, string> = {}) {
  const other = ['---', 'apiVersion: v1', 'kind: ConfigMap', 'metadata:', `  name: ${name}-other`, 'data:', '  x: "1"'];
  const manifest = inlineConfigMapApp(ns, name, 'one', other.join('\n')) as {
    metadata: Record<string, unknown>;
    spec: Record<string, unknown>;
  };
  manifest.spec.syncPeriod = syncPeriod;
  manifest.metadata.annotations = annotations;
  return manifest;
}

const deployRuns = (name: string) => rt.stageRuns(ns, name).filter((r) => r.stage === 'deploy').length;

describe('reconcile by exception', () => {
  it('a hand edit and a hand deletion are reverted at once, with no periodic resync due', async () => {
    const name = 'drift';
    await apply(twoConfigMaps(name, '1h'));
    await expectSucceeded(await rt.waitReconciled(ns, name, 120_000));
    await rt.runtime.pipeline.idle();
    // The drift watch of ConfigMaps starts when the forwarder sees the deploy's status.
    await new Promise((r) => setTimeout(r, 2000));

    await k(['-n', ns, 'patch', 'configmap', `${name}-config`, '--type=merge', '-p', '{"data":{"greeting":"edited"}}']);
    await waitFor(
      'the hand edit reverted',
      async () => {
        const cm = await getObject<{ data?: Record<string, string> }>('configmap', ns, `${name}-config`);
        return cm?.data?.greeting === 'one' ? cm : undefined;
      },
      { timeoutMs: 60_000 },
    );
    await k(['-n', ns, 'delete', 'configmap', `${name}-other`]);
    await waitFor(
      'the deleted object created again',
      async () => await getObject<{ data?: Record<string, string> }>('configmap', ns, `${name}-other`),
      { timeoutMs: 60_000 },
    );
    await rt.runtime.pipeline.idle();
    const causes = rt
      .logsFor(ns, name)
      .filter((r) => r.msg === 'reconciling for drift in deployed objects')
      .map((r) => r.obj.cause);
    expect(causes).toEqual(
      expect.arrayContaining([
        `drift: v1 ConfigMap ${ns}/${name}-config modified`,
        `drift: v1 ConfigMap ${ns}/${name}-other deleted`,
      ]),
    );
    const counted = await rt.runtime.metrics.registry.getSingleMetricAsString('kapp_lambda_drift_total');
    expect(Number(/kapp_lambda_drift_total(?:\{[^}]*\})? (\d+)/.exec(counted)?.[1])).toBeGreaterThanOrEqual(2);
    const events = JSON.parse(
      (await k(['-n', ns, 'get', 'events', '--field-selector', `involvedObject.name=${name}`, '-o', 'json'])).stdout,
    ) as { items: Array<{ reason?: string; message?: string; note?: string }> };
    const drift = events.items.filter((e) => e.reason === 'DriftDetected').map((e) => e.message ?? e.note);
    expect(drift).toEqual(
      expect.arrayContaining([
        `Drift detected: v1 ConfigMap ${ns}/${name}-config modified; reconciling to revert it`,
        `Drift detected: v1 ConfigMap ${ns}/${name}-other deleted; reconciling to revert it`,
      ]),
    );
  }, 240_000);

  it('quiet at its sync period while its watches cover it; sync-mode periodic keeps upstream’s timer', async () => {
    // An App of ConfigMaps deployed first starts the ConfigMap drift watch (the first test's does
    // too), so the two below deploy after it listed: covered from their first reconcile on.
    await apply(twoConfigMaps('primer', '1h'));
    await expectSucceeded(await rt.waitReconciled(ns, 'primer', 120_000));
    await new Promise((r) => setTimeout(r, 2000));
    await apply(twoConfigMaps('quiet', '30s'));
    await apply(twoConfigMaps('periodic', '30s', { [SYNC_MODE_ANNOTATION]: 'periodic' }));
    for (const name of ['quiet', 'periodic']) await expectSucceeded(await rt.waitReconciled(ns, name, 120_000));
    await rt.runtime.pipeline.idle();
    const [quiet0, periodic0] = [deployRuns('quiet'), deployRuns('periodic')];
    // More than one sync period (30 s + up to 5 s jitter): the periodic App runs in it, the quiet one not.
    await new Promise((r) => setTimeout(r, 45_000));
    expect(deployRuns('quiet'), 'runs of the quiet App').toBe(quiet0);
    expect(deployRuns('periodic') - periodic0, 'runs of the periodic App').toBeGreaterThanOrEqual(1);
  }, 300_000);
});
