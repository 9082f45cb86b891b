/**
 * e2e: migrating from kapp-controller to kapp-lambda and back on the shared control plane, as
 * `docs/migrating.md` tells a user to. Upstream kapp-controller v0.53.1 (built by the benchmark,
 * `bench/lib/kapp-controller.ts`, run out of cluster against this control plane on one namespace)
 * reconciles an inline App, an inline PackageRepository and a PackageInstall of its one Package;
 * then it stops (its Deployment scaled to 0, in a cluster), kapp-lambda's runtime starts on the
 * same namespace and reconciles all three; then it stops and kapp-controller starts again.
 *
 * What is checked: each controller's reconcile ends in ReconcileSucceeded at the current
 * generation, and the objects the App and the PackageInstall deployed keep their uid across both
 * hand-overs (both controllers run `kapp deploy --app <name>.app --prev-app <name>-ctrl`, so kapp
 * finds its own app record and sees no diff), and none of kapp's change records written after
 * the first reconcile creates anything.
 *
 * A controller that starts reconciles an object whose status already reports its generation
 * when its sync period is due (kapp-controller's reconcile timer; kapp-lambda's first list keeps
 * it), 10 minutes here: each hand-over changes `spec.syncPeriod` of the App, the PackageInstall
 * and the PackageRepository instead (a new generation, nothing to deploy), as the guide's "at
 * once" step does.
 *
 * kapp-controller is an optional component the tests need (`layers/manifest.ts`
 * `need: 'tests'`): `npm test`'s setup builds it (the demo's does not).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { type KappController, startKappController } from '../../bench/lib/kapp-controller.js';
import { binPath } from '../../layers/gobuild.js';
import { component } from '../../layers/manifest.js';
import { getRepo, type RepoObject } from './packaging-support.js';
import {
  type AppObject,
  apply,
  applyCrds,
  createTenant,
  deleteNamespaces,
  type E2ERuntime,
  getApp,
  getObject,
  inlineConfigMapApp,
  k,
  kubeconfigPath,
  SA,
  startRuntime,
  suffix,
  waitFor,
  yttConfigMap,
} from './support.js';

const KC_BIN = binPath(component('kapp-controller'), 'kapp-controller');
const id = suffix();
const NS = `e2e-migrate-${id}`;
const APP = 'plain';
const REPO = 'repo';
const PKGI = 'greeter';
const REF_NAME = 'greeter.migrate.carvel.dev';
const PKGI_RESOURCE = 'packageinstalls.packaging.carvel.dev';
/** The objects the App and the PackageInstall deploy; their uids must survive both hand-overs. */
const DEPLOYED = [`${APP}-config`, `${PKGI}-greeting`];
/** kapp's app records (`--app <name>.app`): kept, never recreated. */
const KAPP_APPS = [`${APP}.app`, `${PKGI}.app`];

interface Meta {
  metadata: { name: string; uid: string; generation?: number; creationTimestamp?: string };
}

interface PkgiObject extends Meta {
  metadata: Meta['metadata'] & { generation: number };
  status?: { observedGeneration?: number; conditions?: { type: string }[]; friendlyDescription?: string };
}

/** A kapp change record (ConfigMap `<app>-change-<id>`): `data.spec` is JSON with its description. */
interface ChangeRecord extends Meta {
  data?: { spec?: string };
}

function repository(): object {
  const pkg = {
    apiVersion: 'data.packaging.carvel.dev/v1alpha1',
    kind: 'Package',
    metadata: { name: `${REF_NAME}.1.0.0` },
    spec: {
      refName: REF_NAME,
      version: '1.0.0',
      template: {
        spec: {
          fetch: [{ inline: { paths: { 'config.yml': yttConfigMap(`${PKGI}-greeting`, { greeting: 'hello' }) } } }],
          template: [{ ytt: {} }],
          deploy: [{ kapp: {} }],
        },
      },
    },
  };
  const meta = {
    apiVersion: 'data.packaging.carvel.dev/v1alpha1',
    kind: 'PackageMetadata',
    metadata: { name: REF_NAME },
    spec: { displayName: 'Greeter' },
  };
  return {
    apiVersion: 'packaging.carvel.dev/v1alpha1',
    kind: 'PackageRepository',
    metadata: { name: REPO, namespace: NS },
    spec: {
      syncPeriod: '10m',
      fetch: { inline: { paths: { 'packages/metadata.yml': stringify(meta), 'packages/1.0.0.yml': stringify(pkg) } } },
    },
  };
}

function packageInstall(): object {
  return {
    apiVersion: 'packaging.carvel.dev/v1alpha1',
    kind: 'PackageInstall',
    metadata: { name: PKGI, namespace: NS },
    spec: {
      serviceAccountName: SA,
      syncPeriod: '10m',
      packageRef: { refName: REF_NAME, versionSelection: { constraints: '1.0.0' } },
    },
  };
}

const succeeded = (s: { observedGeneration?: number; conditions?: { type: string }[] } | undefined, gen: number) =>
  s?.observedGeneration === gen && (s.conditions?.some((c) => c.type === 'ReconcileSucceeded') ?? false);

/** `9m0s` (Go's `metav1.Duration`, as a PackageInstall's App gets it) is `9m`. */
const sameDuration = (a: unknown, b: string) =>
  typeof a === 'string' && a.replace(/(\D)0s$/, '$1') === b.replace(/(\D)0s$/, '$1');

/** True when the deploy recorded in `status` started at or after `sinceMs` (status times are whole seconds). */
const deployedSince = (status: AppObject['status'], sinceMs: number) =>
  !!status?.deploy?.startedAt && Date.parse(status.deploy.startedAt) >= Math.ceil(sinceMs / 1000) * 1000;

/**
 * Waits until the App, the PackageInstall and the PackageInstall's App report ReconcileSucceeded
 * at their current generation, the Apps at `syncPeriod`, from a deploy started at or after
 * `sinceMs`, and the PackageRepository likewise.
 */
async function waitAllReconciled(who: string, sinceMs: number, syncPeriod: string, log: () => string): Promise<void> {
  let last: unknown;
  await waitFor(
    `${who} reconciled App, PackageInstall and PackageRepository at syncPeriod ${syncPeriod}`,
    async () => {
      const [app, pkgiApp, pkgi, repo] = await Promise.all([
        getApp(NS, APP),
        getApp(NS, PKGI),
        getObject<PkgiObject>(PKGI_RESOURCE, NS, PKGI),
        getRepo(NS, REPO),
      ]);
      last = {
        app: app?.status,
        pkgiApp: { syncPeriod: pkgiApp?.spec.syncPeriod, ...pkgiApp?.status },
        pkgi: pkgi?.status,
        repo: repo?.status,
      };
      const appDone = (a: AppObject | undefined) =>
        !!a &&
        sameDuration(a.spec.syncPeriod, syncPeriod) &&
        succeeded(a.status, a.metadata.generation) &&
        deployedSince(a.status, sinceMs);
      const repoDone = (r: RepoObject | undefined) =>
        !!r && succeeded(r.status, r.metadata.generation) && deployedSince(r.status as AppObject['status'], sinceMs);
      return appDone(app) &&
        appDone(pkgiApp) &&
        pkgi &&
        succeeded(pkgi.status, pkgi.metadata.generation) &&
        repoDone(repo)
        ? true
        : undefined;
    },
    { timeoutMs: 120_000, intervalMs: 500, describe: () => `last: ${JSON.stringify(last, null, 1)}\n${log()}` },
  );
}

/** The uids of the deployed objects and of kapp's app records. */
async function uids(): Promise<Record<string, string | undefined>> {
  const names = [...DEPLOYED, ...KAPP_APPS];
  const objs = await Promise.all(names.map((n) => getObject<Meta>('configmap', NS, n)));
  return Object.fromEntries(names.map((n, i) => [n, objs[i]?.metadata.uid]));
}

/** kapp's change records in {@link NS}: name → description (`update: Op: 1 create, …`). */
async function changeRecords(): Promise<Map<string, string>> {
  const r = await k(['get', 'configmap', '-n', NS, '-l', 'kapp.k14s.io/is-app-change', '-o', 'json']);
  const items = (JSON.parse(r.stdout) as { items: ChangeRecord[] }).items;
  return new Map(
    items.map((c) => [
      c.metadata.name,
      (JSON.parse(c.data?.spec ?? '{}') as { description?: string }).description ?? '',
    ]),
  );
}

/** The change records not in `before` (kapp keeps the last 5 per app: a missing old one is fine). */
function newRecords(before: Map<string, string>, now: Map<string, string>): string[] {
  return [...now].filter(([name]) => !before.has(name)).map(([name, d]) => `${name}: ${d}`);
}

describe('migrating from kapp-controller and back', () => {
  let kc: KappController | undefined;
  let rt: E2ERuntime | undefined;
  const kcLog: string[] = [];
  const startKc = async () =>
    await startKappController(KC_BIN, {
      kubeconfigPath,
      namespace: NS,
      concurrency: 2,
      controllers: ['app', 'pkgr', 'pkgi'],
      log: (m) => kcLog.push(m),
    });
  const ourLog = () =>
    (rt?.records ?? [])
      .slice(-30)
      .map((r) => JSON.stringify({ level: r.level, msg: r.msg, ...r.obj }))
      .join('\n');

  beforeAll(async () => {
    await applyCrds();
    await createTenant(NS);
    kc = await startKc();
  });
  afterAll(async () => {
    await kc?.stop();
    await rt?.dispose();
    await deleteNamespaces([NS]);
  });

  /**
   * A new generation of the App, the PackageInstall and the PackageRepository that deploys
   * nothing new (their `spec.syncPeriod`), so the controller now running reconciles them at once.
   */
  const kick = async (syncPeriod: string) => {
    const p = JSON.stringify({ spec: { syncPeriod } });
    for (const [resource, name] of [
      ['apps.kappctrl.k14s.io', APP],
      [PKGI_RESOURCE, PKGI],
      ['packagerepositories.packaging.carvel.dev', REPO],
    ] as const) {
      await k(['patch', resource, name, '-n', NS, '--type=merge', '-p', p]);
    }
  };
  /** Waits past the current second, so status times (whole seconds) tell the next deploys from the last. */
  const nextSecond = async () => {
    const t = Date.now();
    await new Promise((r) => setTimeout(r, Math.ceil(t / 1000) * 1000 - t + 50));
    return t;
  };
  const ourDeploys = (name: string) =>
    (rt?.stageRuns(NS, name) ?? []).filter((r) => r.stage === 'deploy' && r.outcome === 'succeeded');

  it('kapp-controller → kapp-lambda → kapp-controller: nothing redeployed', async () => {
    const t0 = Date.now();
    await apply(inlineConfigMapApp(NS, APP, 'hello'), repository(), packageInstall());
    await waitAllReconciled('kapp-controller', t0, '10m', () => kcLog.join('\n'));
    const first = await uids();
    for (const [name, uid] of Object.entries(first)) expect(uid, `configmap ${name}`).toBeDefined();
    const changesBefore = await changeRecords();
    expect(changesBefore.size, 'kapp change records of the first deploys').toBeGreaterThan(0);
    const noCreates = async () =>
      newRecords(changesBefore, await changeRecords()).filter((d) => !/Op:\s+0 create, 0 delete/.test(d));

    // Take over: kapp-controller stops (a cluster scales its Deployment to 0), kapp-lambda starts.
    await kc!.stop();
    kc = undefined;
    const tTakeOver = await nextSecond();
    rt = await startRuntime([NS]);
    await kick('9m');
    await waitAllReconciled('kapp-lambda', tTakeOver, '9m', ourLog);
    expect(ourDeploys(APP), ourLog()).not.toHaveLength(0);
    expect(ourDeploys(PKGI), ourLog()).not.toHaveLength(0);
    expect(await uids()).toEqual(first);
    expect(await noCreates()).toEqual([]);

    // Hand back: kapp-lambda stops, kapp-controller starts.
    await rt.stop();
    const ours = { app: ourDeploys(APP).length, pkgi: ourDeploys(PKGI).length };
    const tBack = await nextSecond();
    kc = await startKc();
    await kick('8m');
    await waitAllReconciled('kapp-controller again', tBack, '8m', () => kcLog.join('\n'));
    expect(kc.deploys(), 'kapp-controller deploys after the hand-back').toBeGreaterThanOrEqual(2);
    expect({ app: ourDeploys(APP).length, pkgi: ourDeploys(PKGI).length }).toEqual(ours);
    expect(await uids()).toEqual(first);
    expect(await noCreates()).toEqual([]);
  });
});
