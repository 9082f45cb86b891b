/**
 * Health after deploy (issue 28 item 3) on the real control plane: an App deploying a Deployment
 * pinned to a test-owned kwok Node (a nodeSelector on a label only that Node carries; the shared
 * nodes are not touched, other files run in parallel) gets `kapp-lambda.carvel.dev/Healthy`
 * True after its `ReconcileSucceeded`, appended after it; when the Node goes away and its Pod
 * with it (what a drain or a lost node does: the replacement Pod finds no node), the forwarder's
 * watch of the Deployment sees `Available=False` and the condition turns False within seconds,
 * naming the Deployment, with a Warning Event `Unhealthy` and the `kapp_lambda_app_healthy` gauge.
 */
import { afterAll, describe, expect, it } from 'vitest';
import {
  type AppObject,
  apply,
  appManifest,
  createTestNode,
  getApp,
  getObject,
  k,
  loseTestNode,
  pendingDeployment,
  SA,
  suffix,
  useE2ERuntime,
  waitFor,
} from './support.js';

const id = suffix();
const ns = `e2e-health-${id}`;
const HEALTHY = 'kapp-lambda.carvel.dev/Healthy';
const rt = useE2ERuntime([ns], { overrides: { forwarder: { health: true } } });
const nodes: string[] = [];

const testNode = (n: number) => createTestNode(`e2e-health-${id}-${n}`, nodes);
const loseNode = (node: string, app: string) => loseTestNode(ns, node, app);

afterAll(async () => {
  for (const node of nodes) await k(['delete', 'node', node, '--ignore-not-found', '--wait=false']);
});

const healthOf = (app: AppObject | undefined) => app?.status?.conditions?.find((c) => c.type === HEALTHY);

/** Waits until `read()`'s Healthy condition has status `want`. @returns the object then */
const waitHealth = (what: string, read: () => Promise<AppObject | undefined>, want: string, timeoutMs: number) =>
  waitFor(
    `Healthy=${want} on ${what}`,
    async () => {
      const obj = await read();
      return healthOf(obj)?.status === want ? obj : undefined;
    },
    { timeoutMs },
  );

describe('health after deploy', () => {
  it('an App becomes Healthy=True after ReconcileSucceeded, and Healthy=False naming its Deployment when the Node goes', async () => {
    const { node, label } = await testNode(1);
    const name = 'web';
    await apply(
      appManifest(ns, name, {
        fetch: [{ inline: { paths: { 'deployment.yml': pendingDeployment(`${name}-deploy`, name, label) } } }],
        template: [{ ytt: {} }],
        deploy: [{ kapp: {} }],
      }),
    );
    const done = await rt.waitReconciled(ns, name, 180_000);
    expect(done.status?.conditions?.[0]).toEqual({ type: 'ReconcileSucceeded', status: 'True' });

    const healthy = await waitHealth('the App', () => getApp(ns, name), 'True', 30_000);
    expect(healthy.status?.conditions).toEqual([
      { type: 'ReconcileSucceeded', status: 'True' },
      { type: HEALTHY, status: 'True', reason: 'Healthy', message: 'all workloads healthy' },
    ]);

    await loseNode(node, name);
    const unhealthy = await waitHealth('the App', () => getApp(ns, name), 'False', 30_000);
    expect(unhealthy.status?.conditions?.[0]).toEqual({ type: 'ReconcileSucceeded', status: 'True' });
    expect(healthOf(unhealthy)).toEqual({
      type: HEALTHY,
      status: 'False',
      reason: 'Unhealthy',
      message: `Deployment ${ns}/${name}-deploy: Available=False (MinimumReplicasUnavailable)`,
    });

    const events = await waitFor(
      'the Unhealthy Event',
      async () => {
        const list = JSON.parse(
          (await k(['-n', ns, 'get', 'events', '--field-selector', `involvedObject.name=${name}`, '-o', 'json']))
            .stdout,
        ) as { items: Array<{ reason?: string; type?: string; message?: string }> };
        const found = list.items.filter((e) => e.reason === 'Unhealthy');
        return found.length > 0 ? found : undefined;
      },
      { timeoutMs: 15_000 },
    );
    expect(events[0]).toMatchObject({ type: 'Warning', message: healthOf(unhealthy)?.message });
    const gauge = await rt.runtime.metrics.registry.getSingleMetricAsString('kapp_lambda_app_healthy');
    expect(gauge).toMatch(new RegExp(`kapp_lambda_app_healthy\\{[^}]*name="${name}"[^}]*status="False"\\} 1`));
  }, 300_000);

  it('a PackageInstall mirrors its App’s health after its own condition', async () => {
    const { node, label } = await testNode(2);
    const name = 'pkg-web';
    const refName = 'health.e2e.carvel.dev';
    await apply({
      apiVersion: 'data.packaging.carvel.dev/v1alpha1',
      kind: 'Package',
      metadata: { name: `${refName}.1.0.0`, namespace: ns },
      spec: {
        refName,
        version: '1.0.0',
        template: {
          spec: {
            fetch: [{ inline: { paths: { 'deployment.yml': pendingDeployment(`${name}-deploy`, name, label) } } }],
            template: [{ ytt: {} }],
            deploy: [{ kapp: {} }],
          },
        },
      },
    });
    await apply({
      apiVersion: 'packaging.carvel.dev/v1alpha1',
      kind: 'PackageInstall',
      metadata: { name, namespace: ns },
      spec: { serviceAccountName: SA, packageRef: { refName, versionSelection: { constraints: '1.0.0' } } },
    });
    const pkgiHealth = (want: string) =>
      waitHealth(
        'the PackageInstall',
        () => getObject<AppObject>('packageinstalls.packaging.carvel.dev', ns, name),
        want,
        180_000,
      );
    const healthy = await pkgiHealth('True');
    expect(healthy.status?.conditions?.map((c) => c.type)).toEqual(['ReconcileSucceeded', HEALTHY]);
    await loseNode(node, name);
    const unhealthy = await pkgiHealth('False');
    expect(unhealthy.status?.conditions?.[0]?.type).toBe('ReconcileSucceeded');
    expect(healthOf(unhealthy)?.message).toBe(
      `Deployment ${ns}/${name}-deploy: Available=False (MinimumReplicasUnavailable)`,
    );
  }, 300_000);
});
