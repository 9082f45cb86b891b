/**
 * e2e: health gates a rollout (issue 28: "a workload that becomes unavailable after a successful
 * reconcile shows as unhealthy and blocks the next wave"). Two cluster ids, each its own embedded
 * runtime with the forwarder's health tracking on, share one store; a RolloutPolicy puts `a` in
 * wave w0 (soak 30 s) and `b` in w1. Version 2.0.0 of the package deploys a Deployment pinned to a
 * test-owned kwok Node: `a` takes it, reconciles and turns Healthy, and its wave starts soaking;
 * then the Node goes. `a`'s Deployment becomes unavailable, its App and PackageInstall turn
 * Healthy=False while ReconcileSucceeded stays, and the rollout stops on it before the soak
 * ends: w1 is never released and `b` keeps 1.0.0.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { KappLambdaConditionType } from '../../functions/lib/api/constants.js';
import { readRollout } from '../../functions/lib/rollout/state.js';
import {
  applyRolloutPolicy,
  type E2EFleet,
  fleetPackageInstall,
  inlineRepositoryManifest,
  type PkgiObject,
  startFleet,
  waitFleetPackageInstall,
} from './packaging-support.js';
import {
  apply,
  createTestNode,
  type E2ERuntime,
  k,
  loseTestNode,
  pendingDeployment,
  suffix,
  waitFor,
} from './support.js';

const id = suffix();
const CLUSTERS = ['a', 'b'].map((w) => ({ context: `rhealth-${w}-${id}`, ns: `e2e-rhealth-${w}-${id}` }));
const REF_NAME = 'rollout-health.e2e.carvel.dev';
const POLICY = `e2e-rhealth-${id}`;
const nodes: string[] = [];

/** Package `version`: 1.0.0 a ConfigMap; 2.0.0 also a Deployment `web` pinned to the Node labelled `nodeLabel`. */
function packageDoc(version: string, nodeLabel: string): object {
  const config = `apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: rhealth\ndata:\n  version: "${version}"\n`;
  const paths: Record<string, string> = { 'config.yml': config };
  if (version === '2.0.0') paths['deployment.yml'] = pendingDeployment('web', 'web', nodeLabel);
  return {
    apiVersion: 'data.packaging.carvel.dev/v1alpha1',
    kind: 'Package',
    metadata: { name: `${REF_NAME}.${version}` },
    spec: {
      refName: REF_NAME,
      version,
      template: { spec: { fetch: [{ inline: { paths } }], template: [{ ytt: {} }], deploy: [{ kapp: {} }] } },
    },
  };
}

function repo(ns: string, versions: string[], nodeLabel: string): object {
  return inlineRepositoryManifest(
    ns,
    'repo',
    Object.fromEntries(versions.map((v) => [`packages/${v}.yml`, stringify(packageDoc(v, nodeLabel))])),
  );
}

let fleet: E2EFleet | undefined;
let runtimes: E2ERuntime[] = [];

beforeAll(async () => {
  fleet = await startFleet(CLUSTERS, {
    prefix: 'kapp-lambda-e2e-rhealth-',
    pollPeriodMs: 600_000,
    onToolRun: () => {},
    health: true,
  });
  runtimes = fleet.runtimes;
});

afterAll(async () => {
  await fleet?.dispose();
  for (const node of nodes) await k(['delete', 'node', node, '--ignore-not-found', '--wait=false']);
});

const waitPkgi = (ns: string, what: string, pred: (p: PkgiObject | undefined) => boolean) =>
  waitFleetPackageInstall(runtimes, ns, what, pred, 180_000);

const condition = (p: PkgiObject | undefined, type: string) => p?.status?.conditions?.find((c) => c.type === type);

describe('health gates a rollout', () => {
  it('a workload unavailable after a successful reconcile makes its cluster unhealthy and stops the rollout: the next wave is never released', async () => {
    const { node, label } = await createTestNode(`e2e-rhealth-${id}`, nodes);
    const store = runtimes[0]!.runtime.store;
    await applyRolloutPolicy(store, POLICY, {
      packages: [REF_NAME],
      waves: [
        { name: 'w0', clusters: [CLUSTERS[0]!.context], soak: '30s' },
        { name: 'w1', clusters: [CLUSTERS[1]!.context] },
      ],
    });
    const [a, b] = CLUSTERS as [(typeof CLUSTERS)[0], (typeof CLUSTERS)[0]];
    for (const c of CLUSTERS) {
      await apply(repo(c.ns, ['1.0.0'], label), fleetPackageInstall(c.ns, REF_NAME));
    }
    for (const c of CLUSTERS) {
      await waitPkgi(
        c.ns,
        'at 1.0.0',
        (p) => p?.status?.version === '1.0.0' && p.status.conditions?.[0]?.type === 'ReconcileSucceeded',
      );
    }
    for (const c of [...CLUSTERS].reverse()) await apply(repo(c.ns, ['1.0.0', '2.0.0'], label));
    // a takes 2.0.0, its Deployment runs on the test Node, and it turns healthy: w0 soaks.
    await waitPkgi(
      a.ns,
      'at 2.0.0, healthy',
      (p) =>
        p?.status?.version === '2.0.0' &&
        p.status.conditions?.[0]?.type === 'ReconcileSucceeded' &&
        condition(p, KappLambdaConditionType.Healthy)?.status === 'True',
    );
    await waitFor(
      'wave w0 soaking',
      async () => {
        const r = (await readRollout(store, POLICY, REF_NAME))?.record;
        return r?.waves[0]?.soakEndsAt ? r : undefined;
      },
      { timeoutMs: 30_000, intervalMs: 100 },
    );
    // The Node goes during the soak: the Deployment is unavailable, a is unhealthy, the rollout stops.
    await loseTestNode(a.ns, node, 'web');
    const sick = await waitPkgi(
      a.ns,
      'unhealthy',
      (p) => condition(p, KappLambdaConditionType.Healthy)?.status === 'False',
    );
    expect(sick.status?.conditions?.[0]?.type).toBe('ReconcileSucceeded');
    expect(condition(sick, KappLambdaConditionType.Healthy)?.message).toBe(
      `Deployment ${a.ns}/web: Available=False (MinimumReplicasUnavailable)`,
    );
    const stopped = await waitFor(
      'the rollout stopped',
      async () => {
        const r = (await readRollout(store, POLICY, REF_NAME))?.record;
        return r?.status === 'stopped' ? r : undefined;
      },
      { timeoutMs: 30_000, intervalMs: 100 },
    );
    expect(stopped.cause).toMatch(
      new RegExp(`^wave w0: 1 failed \\(maxUnavailable 0\\), first ${a.context} ${a.ns}/app: 2\\.0\\.0 unhealthy`),
    );
    expect(stopped.waves[1]?.releasedAt).toBeUndefined();
    const held = await waitPkgi(
      b.ns,
      'told the rollout stopped',
      (p) => condition(p, KappLambdaConditionType.Rollout)?.reason === 'Stopped',
    );
    expect(held.status?.version).toBe('1.0.0');
  }, 420_000);
});
