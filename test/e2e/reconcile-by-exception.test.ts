/**
 * Reconcile by exception (issue 24) on the real control plane with the real tools:
 *
 * - drift reaches the runtime as an event: a hand edit and a hand deletion of what an App
 *   deployed are reverted while no periodic resync is due (its `syncPeriod` is an hour), with an
 *   Event `DriftDetected` on the App naming the change;
 * - an App whose inputs the forwarder watches stays quiet at its sync period (30 s): deployed
 *   after its kind's drift watch listed, no run for more than a sync period after its first; an App annotated `sync-mode: periodic` keeps upstream's
 *   timer (a run every sync period) side by side;
 * - a PackageInstall follows its App (upstream reconciles it on its App's status writes, with no
 *   timer of its own): one with a 30 s `syncPeriod` (the floor) is not reconciled again while its
 *   App is quiet, and one annotated `sync-mode: periodic` (copied to its App) is, side by side.
 */
import { describe, expect, it } from 'vitest';
import { SYNC_MODE_ANNOTATION } from '../../events/forwarder/quiet.js';
import {
  type AppObject,
  apply,
  expectSucceeded,
  getObject,
  inlineConfigMapApp,
  k,
  SA,
  succeededAt,
  suffix,
  useE2ERuntime,
  waitFor,
  yttConfigMap,
} from './support.js';

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

const PKGI = 'packageinstalls.packaging.carvel.dev';
const REF_NAME = 'quiet.e2e.carvel.dev';

/** A Package applied by hand (a plain CRD here): an inline ytt ConfigMap named after the install. */
function packageDoc(): object {
  return {
    apiVersion: 'data.packaging.carvel.dev/v1alpha1',
    kind: 'Package',
    metadata: { name: `${REF_NAME}.1.0.0`, namespace: ns },
    spec: {
      refName: REF_NAME,
      version: '1.0.0',
      template: {
        spec: {
          fetch: [{ inline: { paths: { 'config.yml': yttConfigMap('#@ data.values.name', { x: '"1"' }) } } }],
          template: [{ ytt: {} }],
          deploy: [{ kapp: {} }],
        },
      },
    },
  };
}

/** A PackageInstall of {@link REF_NAME} with a 30 s sync period; `name` names its ConfigMap too. */
function packageInstall(name: string, annotations: Record<string, string> = {}): object {
  return {
    apiVersion: 'packaging.carvel.dev/v1alpha1',
    kind: 'PackageInstall',
    metadata: { name, namespace: ns, annotations },
    spec: {
      serviceAccountName: SA,
      syncPeriod: '30s',
      packageRef: { refName: REF_NAME, versionSelection: { constraints: '1.0.0' } },
      values: [{ secretRef: { name: `${name}-values` } }],
    },
  };
}

/** The install function's runs of a PackageInstall. */
const installRuns = (name: string) =>
  rt.records.filter((r) => r.msg === 'stage run' && String(r.obj.object).endsWith(`/PackageInstall/${ns}/${name}`))
    .length;

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

  it('quiet at its sync period while its watches cover it, an App and a PackageInstall; sync-mode periodic keeps upstream’s timer beside each', async () => {
    // An App of ConfigMaps deployed first starts the ConfigMap drift watch (the first test's does
    // too), so the Apps below deploy after it listed: covered from their first reconcile on.
    await apply(twoConfigMaps('primer', '1h'));
    await expectSucceeded(await rt.waitReconciled(ns, 'primer', 120_000));
    await new Promise((r) => setTimeout(r, 2000));
    await apply(packageDoc());
    for (const name of ['pi-quiet', 'pi-periodic']) {
      await apply({
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name: `${name}-values`, namespace: ns },
        stringData: { 'values.yml': `name: ${name}` },
      });
    }
    // Side by side, one window for both pairs: an App quiet at its 30 s sync period and one
    // annotated periodic; a PackageInstall whose App is quiet and one annotated periodic (copied
    // to its App, whose status write every sync reconciles the install, as upstream).
    await apply(twoConfigMaps('quiet', '30s'));
    await apply(twoConfigMaps('periodic', '30s', { [SYNC_MODE_ANNOTATION]: 'periodic' }));
    await apply(packageInstall('pi-quiet'));
    await apply(packageInstall('pi-periodic', { [SYNC_MODE_ANNOTATION]: 'periodic' }));
    for (const name of ['quiet', 'periodic']) await expectSucceeded(await rt.waitReconciled(ns, name, 120_000));
    for (const name of ['pi-quiet', 'pi-periodic']) {
      await rt.waitForApp(ns, name, succeededAt(1), 'the install’s App reconciled', 120_000);
      await waitFor(`PackageInstall ${name} succeeded`, async () => {
        const pkgi = await getObject<AppObject>(PKGI, ns, name);
        return pkgi && succeededAt(1)(pkgi) ? pkgi : undefined;
      });
    }
    const app = await getObject<AppObject>('apps.kappctrl.k14s.io', ns, 'pi-periodic');
    expect(app?.metadata.annotations?.[SYNC_MODE_ANNOTATION]).toBe('periodic');
    await rt.runtime.pipeline.idle();
    const start = Date.now();
    const before = {
      quiet: deployRuns('quiet'),
      periodic: deployRuns('periodic'),
      piQuiet: installRuns('pi-quiet'),
      piPeriodic: installRuns('pi-periodic'),
      piQuietDeploys: deployRuns('pi-quiet'),
    };
    // The periodic ones sync 30-35 s after their last reconcile (the periodic install through its
    // App's status write); then at least 40 s in all, more than a sync period and its jitter.
    await waitFor(
      'the periodic App and the periodic install reconciled again',
      async () =>
        deployRuns('periodic') > before.periodic && installRuns('pi-periodic') > before.piPeriodic ? true : undefined,
      { timeoutMs: 70_000, intervalMs: 500 },
    );
    await new Promise((r) => setTimeout(r, Math.max(0, 40_000 - (Date.now() - start))));
    await rt.runtime.pipeline.idle();
    expect(deployRuns('quiet'), 'runs of the quiet App').toBe(before.quiet);
    expect(installRuns('pi-quiet'), 'runs of the quiet install').toBe(before.piQuiet);
    expect(deployRuns('pi-quiet'), 'runs of the quiet install’s App').toBe(before.piQuietDeploys);
  }, 300_000);
});
