/**
 * e2e: a fleet rollout in waves in the shared cloud mode (issue 28; the contract:
 * docs/decisions.md D18 and the install dispatcher's part, `functions/lib/entry/dispatch*.ts`).
 * The stack is `./cloud-dispatch-support.ts`'s (forwarder → moto's SQS → a dispatcher per stage
 * under the Lambda emulator → the stage function per tenant) with the install stage beside
 * fetch, template and deploy, for two cluster ids on the shared control plane: A in wave
 * `canary`, B in wave `rest`, soak 3 s. Each forwarder watches Apps and PackageInstalls, with
 * health tracking on (as deployed: the Apps' Healthy condition reaches the fleet entries).
 *
 * The policy is applied first (`npm run fleet -- rollout apply --store s3://…` as a process),
 * then each namespace gets a Package 1.0.0 (created directly: no PackageRepository, so no
 * index-repo) and a PackageInstall (`>=1.0.0`, sync period 10m: no timer fires). Once both run
 * 1.0.0, a Package 2.0.0 is added in B's namespace and B's PackageInstall is poked (an
 * annotation: the forwarder sends a change of it to install), then the same in A's.
 *
 * Asserted:
 * - B's run (wave `rest`) asks for the rollout but cannot start it: after its install
 *   dispatcher's invocation there is no record, and B stays at 1.0.0;
 * - A's run starts it (the record, written by the dispatcher); A upgrades to 2.0.0 while B,
 *   poked again, holds at 1.0.0 with a `kapp-lambda.carvel.dev/Rollout` condition `Held`;
 * - B upgrades once A has been healthy for the soak with no action of the test (A's soak end is
 *   the forwarder's due time; the dispatcher releases `rest` and pokes B), and the record in S3
 *   is `completed`, its waves' times in that order; both PackageInstalls then say `Completed`,
 *   and `npm run fleet -- status` on the cloud store shows both at 2.0.0 and the rollout completed;
 * - the rollout's view each install run was given names no other cluster (request and answer),
 *   and its policy is narrowed (the wave listing the run's cluster lists only it, the other `[]`);
 * - no run's S3 request (every stage function's requests pass a recorder per cluster,
 *   `../harness/s3-recorder.ts`) touched `state/rollouts/` or `state/rollout-policies/`, and the
 *   fleet entries a cluster's runs read and wrote are under `state/fleet/<its id>/`: the record
 *   is the dispatcher's alone;
 * - the dispatcher's pokes reached the install queue as its own role and passed its sender check.
 */
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { ApiException, CustomObjectsApi } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { KappLambdaConditionType } from '../../functions/lib/api/constants.js';
import type { FleetView } from '../../functions/lib/fleet/view.js';
import { FLEET_PREFIX, POLICY_PREFIX, ROLLOUT_PREFIX, readRollout } from '../../functions/lib/rollout/state.js';
import { S3Store } from '../../functions/lib/store/s3.js';
import { loadKubeConfig } from '../harness/kube.js';
import { rieLogLines } from '../harness/lambda.js';
import { type S3Recorder, startS3Recorder } from '../harness/s3-recorder.js';
import { s3Client } from '../harness/servers/s3.js';
import type { TenantInvokeBody } from '../harness/tenant-router.js';
import { type DispatchedStack, startDispatchedStack } from './cloud-dispatch-support.js';
import { fleetCli } from './cloud-support.js';
import { fleetPackageInstall, inlineConfigMapPackageDoc, type PkgiObject } from './packaging-support.js';
import { servers, shared, kubeconfigPath as sharedKubeconfigPath, suffix, waitFor } from './support.js';

const id = suffix();
const STAGES = ['fetch', 'template', 'deploy', 'install'] as const;
type Stage = (typeof STAGES)[number];
/** Cluster A (wave canary) and B (wave rest); each one's namespace is named as it. */
const A = `roll-a-${id}`;
const B = `roll-b-${id}`;
const CLUSTERS = [A, B] as const;
const REF_NAME = 'cloud-rollout.e2e.carvel.dev';
const POLICY = `cloud-${id}`;
const SOAK_MS = 3000;
const PKGI = { group: 'packaging.carvel.dev', version: 'v1alpha1', plural: 'packageinstalls' } as const;

let stack: DispatchedStack<Stage> | undefined;
/** Per cluster: the recorder every stage function serving it reaches S3 through. */
const recorders = new Map<string, S3Recorder>();
/** Every stage function invoke, with its bodies (the requests hold credentials: never log them). */
const invokes: TenantInvokeBody[] = [];
let pkgis: CustomObjectsApi | undefined;

beforeAll(async () => {
  for (const c of CLUSTERS) recorders.set(c, await startS3Recorder(servers().sqs.endpoint));
  stack = await startDispatchedStack({
    id,
    stages: STAGES,
    clusters: CLUSTERS,
    forwarderKinds: 'App,PackageInstall',
    tenantEnv: (_, tenant) => {
      const r = recorders.get(tenant);
      return r ? { KAPP_LAMBDA_S3_ENDPOINT: r.endpoint } : ({} as Record<string, string>);
    },
    onInvoke: (i) => invokes.push(i),
  });
  pkgis = loadKubeConfig(sharedKubeconfigPath).makeApiClient(CustomObjectsApi);
}, 180_000);

afterAll(async () => {
  await stack?.stop();
  await Promise.all([...recorders.values()].map((r) => r.stop()));
  // The finalizers no function is left to remove, then the namespaces.
  for (const ns of CLUSTERS) {
    for (const kind of ['packageinstalls.packaging.carvel.dev', 'apps.kappctrl.k14s.io']) {
      await shared.k(
        ['-n', ns, 'patch', kind, 'app', '--type=merge', '-p', '{"metadata":{"finalizers":null}}'],
        undefined,
        false,
      );
    }
  }
  await shared.deleteNamespaces([...CLUSTERS]);
});

/** Package `version` of the refName in namespace `ns`: an inline ytt ConfigMap `rollout` with `data.version`. */
function packageIn(ns: string, version: string): object {
  const doc = inlineConfigMapPackageDoc(REF_NAME, version, 'rollout') as { metadata: object };
  return { ...doc, metadata: { ...doc.metadata, namespace: ns } };
}

/** PackageInstall `<ns>/app`, read in-process (the waits poll it). */
async function getPkgi(ns: string): Promise<PkgiObject | undefined> {
  try {
    return (await pkgis?.getNamespacedCustomObject({ ...PKGI, namespace: ns, name: 'app' })) as PkgiObject;
  } catch (e) {
    if (e instanceof ApiException && e.code === 404) return undefined;
    throw e;
  }
}

/** Waits until PackageInstall `<ns>/app` satisfies `pred`; a timeout shows its last read and the dispatchers' output. */
async function waitPkgi(ns: string, what: string, pred: (p: PkgiObject | undefined) => boolean, timeoutMs = 60_000) {
  let last: PkgiObject | undefined;
  return await waitFor(
    `PackageInstall ${ns}/app: ${what}`,
    async () => {
      last = await getPkgi(ns);
      return pred(last) ? (last as PkgiObject) : undefined;
    },
    {
      timeoutMs,
      intervalMs: 300,
      describe: () => `last: ${JSON.stringify(last?.status ?? null)}\n${stack?.describe(20)}\n${installLogs()}`,
    },
  );
}

const reconciledAt = (p: PkgiObject | undefined, version: string) =>
  p?.status?.version === version && p.status.conditions?.[0]?.type === 'ReconcileSucceeded';

const rolloutReason = (p: PkgiObject | undefined) =>
  p?.status?.conditions?.find((c) => c.type === KappLambdaConditionType.Rollout)?.reason;

/** The install stage functions' warnings, errors and rollout lines, and their last answers, for a wait's failure message. */
function installLogs(): string {
  const answers = invokes
    .filter((i) => i.functionName === stack?.stageFunctionName('install'))
    .slice(-6)
    .map((i) => `answer to ${i.tenantId}: ${i.response}`);
  return [
    ...answers,
    ...(stack?.router.environments ?? [])
      .filter((e) => e.functionName === stack?.stageFunctionName('install'))
      .map(
        (e) =>
          `install ${e.tenantId}: ${rieLogLines(e.rie)
            .filter((l) => Number(l.level) >= 40 || /rollout|fleet/i.test(String(l.msg)))
            .map((l) => JSON.stringify(l))
            .join('\n')}`,
      ),
  ].join('\n');
}

/** Pokes PackageInstall `<ns>/app` as a user's edit would: a new annotation value, which its forwarder sends to install. */
async function poke(ns: string, n: number): Promise<void> {
  await shared.k(['-n', ns, 'annotate', '--overwrite', 'packageinstalls.packaging.carvel.dev', 'app', `e2e/poke=${n}`]);
}

/** The parsed batches the install function was given for `tenant`, with their answers. */
function installBatches(tenant: string): { request: Record<string, unknown>; response: unknown }[] {
  return invokes
    .filter((i) => i.functionName === stack?.stageFunctionName('install') && i.tenantId === tenant)
    .map((i) => ({ request: JSON.parse(i.request) as Record<string, unknown>, response: safeParse(i.response) }));
}

function safeParse(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

describe('the shared mode: a rollout in waves across two clusters', () => {
  // About 65 s in the suite's runs (four installs, two soaks): the bound leaves a loaded machine
  // room (150 s was 2.3 times that, below the project's 180 s default); a hang still fails.
  it('A (canary) upgrades first, B (rest) is held until A has been healthy for the soak, then follows; the record is the dispatcher’s', {
    timeout: 300_000,
  }, async () => {
    const s = stack as DispatchedStack<Stage>;
    const client = s3Client(s.fleet.s3);
    const store = new S3Store({ client, bucket: s.fleet.bucket });
    const record = async () => (await readRollout(store, POLICY, REF_NAME))?.record;
    try {
      // The operator's policy, in the cloud store, before any PackageInstall.
      const policyFile = path.join(s.fleet.tmp, 'policy.yml');
      await writeFile(
        policyFile,
        stringify({
          apiVersion: 'kapp-lambda/v1',
          kind: 'RolloutPolicy',
          metadata: { name: POLICY },
          spec: {
            packages: [REF_NAME],
            waves: [
              { name: 'canary', clusters: [A], soak: `${SOAK_MS / 1000}s` },
              { name: 'rest', clusters: [B], soak: `${SOAK_MS / 1000}s` },
            ],
          },
        }),
      );
      await fleetCli(s.fleet, ['rollout', 'apply', '-f', policyFile, '--store', `s3://${s.fleet.bucket}/`]);

      await Promise.all(CLUSTERS.map((ns) => shared.createTenant(ns)));
      await shared.apply(...CLUSTERS.flatMap((ns) => [packageIn(ns, '1.0.0'), fleetPackageInstall(ns, REF_NAME)]));
      await Promise.all(CLUSTERS.map((ns) => waitPkgi(ns, 'at 1.0.0', (p) => reconciledAt(p, '1.0.0'), 90_000)));
      expect(await store.list(ROLLOUT_PREFIX)).toEqual([]);

      // 2.0.0 in B's namespace first (A's runs, which the Apps' health events also bring, see none
      // yet): a cluster outside the first wave asks for the rollout but does not start it.
      await shared.apply(packageIn(B, '2.0.0'));
      const pokedB = performance.now();
      await poke(B, 1);
      const installDispatcher = s.dispatchers.find((d) => d.stage === 'install');
      const bRun = await waitFor(
        `an install run of ${B} after 2.0.0`,
        async () =>
          invokes.find(
            (i) => i.functionName === s.stageFunctionName('install') && i.tenantId === B && i.startedAt > pokedB,
          ),
        { timeoutMs: 30_000, intervalMs: 200, describe: () => s.describe() },
      );
      // The dispatcher's invocation that ran it has ended: whatever it did with the run's answer is done.
      await waitFor(
        "the install dispatcher's invocation of that run",
        async () =>
          installDispatcher?.mapping.invocations.find(
            (inv) => inv.startedAt <= bRun.startedAt && inv.endedAt >= bRun.endedAt,
          ),
        { timeoutMs: 30_000, intervalMs: 200 },
      );
      expect(safeParse(bRun.response)).toMatchObject({
        rollouts: { start: [{ policy: POLICY, refName: REF_NAME, version: '2.0.0', from: '1.0.0' }] },
      });
      expect(await record()).toBeUndefined();
      expect((await getPkgi(B))?.status?.version).toBe('1.0.0');

      // A: its run asks for the rollout, the dispatcher creates it (wave canary released).
      await shared.apply(packageIn(A, '2.0.0'));
      await poke(A, 1);
      const created = await waitFor('the rollout created', record, {
        timeoutMs: 30_000,
        intervalMs: 250,
        describe: () => `${s.describe(40)}\n${installLogs()}`,
      });
      expect(created).toMatchObject({ target: '2.0.0', from: '1.0.0', status: 'running' });
      // B, poked again, now knows the rollout: held at 1.0.0, its wave not released.
      await poke(B, 2);
      const held = await waitPkgi(B, 'held', (p) => rolloutReason(p) === 'Held');
      expect(held.status?.version).toBe('1.0.0');
      expect(held.status?.conditions?.[0]?.type).toBe('ReconcileSucceeded');
      await waitPkgi(A, 'at 2.0.0', (p) => reconciledAt(p, '2.0.0'));
      expect((await getPkgi(B))?.status?.version).toBe('1.0.0');

      // No action of the test from here: A's soak ends, rest is released, B follows.
      await waitPkgi(B, 'at 2.0.0', (p) => reconciledAt(p, '2.0.0'));
      const done = await waitFor(
        'the rollout completed',
        async () => {
          const r = await record();
          return r?.status === 'completed' ? r : undefined;
        },
        { timeoutMs: 30_000, intervalMs: 250, describe: async () => JSON.stringify(await record()) },
      );
      expect(done).toMatchObject({ target: '2.0.0', from: '1.0.0' });
      const t = (at: string | undefined) => Date.parse(at ?? '');
      const [canary, rest] = done.waves;
      expect([canary?.name, rest?.name]).toEqual(['canary', 'rest']);
      expect(t(rest?.releasedAt)).toBeGreaterThanOrEqual(t(canary?.healthyAt) + SOAK_MS);
      expect(t(rest?.healthyAt)).toBeGreaterThanOrEqual(t(rest?.releasedAt));
      expect(done.history.filter((h) => h.what === 'released').map((h) => h.wave)).toEqual(['canary', 'rest']);
      // Figures for the closing notes (never asserted): the soak's end → rest released, released → healthy.
      process.stdout.write(
        `[cloud-rollout] soak end → rest released ${t(rest?.releasedAt) - t(canary?.soakEndsAt)} ms; released → rest healthy ${t(rest?.healthyAt) - t(rest?.releasedAt)} ms\n`,
      );
      for (const ns of CLUSTERS)
        await waitPkgi(ns, 'told the rollout completed', (p) => rolloutReason(p) === 'Completed');
      const deployed = await shared.getObject<{ data?: Record<string, string> }>('configmap', B, 'rollout');
      expect(deployed?.data?.version).toBe('2.0.0');
      // The fleet at a glance, from the cloud store: `npm run fleet -- status`.
      const status = await fleetCli(s.fleet, ['status', '-o', 'json', '--store', `s3://${s.fleet.bucket}/`]);
      const view = JSON.parse(status.stdout) as FleetView;
      expect(view.installs.map((i) => [i.clusterId, i.namespace, i.name, i.version, i.reconcile])).toEqual([
        [A, A, 'app', '2.0.0', 'succeeded'],
        [B, B, 'app', '2.0.0', 'succeeded'],
      ]);
      expect(view.rollouts.map((r) => [r.policy, r.refName, r.target, r.status])).toEqual([
        [POLICY, REF_NAME, '2.0.0', 'completed'],
      ]);

      // What each install run was given and answered names no other cluster; its view of the
      // policy lists its own cluster in its wave and none in the other.
      for (const [mine, other] of [
        [A, B],
        [B, A],
      ] as const) {
        const batches = installBatches(mine);
        expect(batches.length, `install batches of ${mine}`).toBeGreaterThan(0);
        const leaks = invokes.filter(
          (i) => i.tenantId === mine && (i.request.includes(other) || i.response.includes(other)),
        );
        expect(leaks.length, `invokes for ${mine} naming ${other}`).toBe(0);
        const views = batches.flatMap((b) => {
          const v = b.request.rollouts as { policies?: { metadata: { name: string } }[] } | undefined;
          return v?.policies?.filter((p) => p.metadata.name === POLICY) ?? [];
        });
        expect(views.length, `install batches of ${mine} with the policy in their view`).toBeGreaterThan(0);
        expect(views.at(-1)).toMatchObject({
          spec: {
            waves: [
              { name: 'canary', clusters: mine === A ? [A] : [] },
              { name: 'rest', clusters: mine === B ? [B] : [] },
            ],
          },
        });
      }

      // The runs' S3 requests: no rollout record or policy, only their own cluster's fleet entries.
      for (const [mine, recorder] of recorders) {
        // A key under either prefix, or a listing that would show one (its prefix above or under it).
        const rollout = recorder.requests.filter((r) =>
          [ROLLOUT_PREFIX, POLICY_PREFIX].some((p) =>
            r.prefix === undefined ? r.key.startsWith(p) : r.prefix.startsWith(p) || p.startsWith(r.prefix),
          ),
        );
        expect(rollout, `${mine}'s runs on rollout records and policies`).toEqual([]);
        const fleet = recorder.requests.filter(
          (r) => r.key.startsWith(FLEET_PREFIX) || (r.prefix ?? '').startsWith(FLEET_PREFIX),
        );
        expect(
          fleet.filter((r) => !(r.prefix ?? r.key).startsWith(`${FLEET_PREFIX}${mine}/`)),
          `${mine}'s runs on other clusters' fleet entries`,
        ).toEqual([]);
        expect(fleet.some((r) => r.method === 'PUT' && r.key === `${FLEET_PREFIX}${mine}/${mine}/app.json`)).toBe(true);
      }

      // The dispatcher's pokes (B released, the end) came as its own role and were taken.
      const dispatcherRole = s.dispatcherRoleIds.get('install');
      const pokes = (installDispatcher?.records ?? []).filter(
        (r) =>
          r.attributes.MessageGroupId?.startsWith(`${B}/`) && r.attributes.SenderId?.startsWith(`${dispatcherRole}:`),
      );
      expect(pokes.length).toBeGreaterThan(0);
      const refused = installDispatcher
        ? rieLogLines(installDispatcher.rie).filter((l) => l.outcome === 'refused')
        : [];
      expect(refused).toEqual([]);
    } finally {
      client.destroy();
    }
  });
});
