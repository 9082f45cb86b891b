/**
 * The rollout gate in the install function (`functions/lib/rollout/gate.ts` through
 * `runInstall`): two cluster ids, each its own fake cluster (the port), one memory store. A
 * version above a PackageInstall's current one creates the rollout (wave 1 released), a cluster
 * of a later wave is held at its version with a `Held` Rollout condition after kapp-controller's,
 * a released one upgrades, its healthy reconcile starts the soak, a failure stops the rollout,
 * and every run writes its fleet index entry. Without a policy nothing changes but the entry.
 * Also: the release's pokes and the rollout check (`rollout-pokes.ts`), the selection's extra
 * callback, and the forwarder's PackageInstall due time at a soak's end.
 */
import { describe, expect, it } from 'vitest';
import { packageInstallDueAt } from '../../events/forwarder/kinds.js';
import { type KappEvent, type ObjectRef, objectEvent } from '../../events/schema.js';
import { KappLambdaConditionType } from '../../functions/lib/api/constants.js';
import { parsePackageInstall } from '../../functions/lib/api/parse.js';
import { RolloutCoordinator } from '../../functions/lib/entry/dispatch-rollouts.js';
import { FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import type { KubeObject } from '../../functions/lib/kube/port.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { packageSelection } from '../../functions/lib/packaging/select.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import { checkRollouts, ENDED_POKE_WINDOW_MS } from '../../functions/lib/pipeline/install/rollout-pokes.js';
import { ReportingRollouts, RolloutReports } from '../../functions/lib/rollout/access.js';
import { fleetEntryOf, ROLLOUT_WAVE_CHECK } from '../../functions/lib/rollout/gate.js';
import { parseRolloutPolicy } from '../../functions/lib/rollout/policy.js';
import { fleetKey, putPolicy, readFleetEntry, readRollout } from '../../functions/lib/rollout/state.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { StoreError } from '../../functions/lib/store/port.js';
import { putReceipt } from '../harness/receipt-fixture.js';
import { FakeCluster } from './support/fake-cluster.js';
import { stageDeps, useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('install-rollout-');
const T0 = Date.parse('2026-12-07T08:00:00.000Z');
const PKGI_API = 'packaging.carvel.dev/v1alpha1';
const REF_NAME = 'pkg.test.carvel.dev';
const ROLLOUT = KappLambdaConditionType.Rollout;
const POLICY = parseRolloutPolicy(`
apiVersion: kapp-lambda/v1
kind: RolloutPolicy
metadata: { name: default }
spec:
  packages: [${REF_NAME}]
  waves:
    - { name: canary, clusters: [c1], soak: 30s }
    - { name: rest }
`);

function pkg(version: string): KubeObject {
  return {
    apiVersion: 'data.packaging.carvel.dev/v1alpha1',
    kind: 'Package',
    metadata: { name: `${REF_NAME}.${version}`, namespace: 'ns', uid: `uid-${version}`, resourceVersion: '1' },
    spec: {
      refName: REF_NAME,
      version,
      template: {
        spec: {
          fetch: [{ inline: { paths: { 'version.txt': version } } }],
          template: [{ ytt: {} }],
          deploy: [{ kapp: {} }],
        },
      },
    },
  };
}

const succeeded = { conditions: [{ type: 'ReconcileSucceeded', status: 'True' }] };
const failedApp = {
  conditions: [{ type: 'ReconcileFailed', status: 'True', message: 'Deploying: boom' }],
  usefulErrorMessage: 'kapp: Error: boom',
};

function packageInstall(): KubeObject {
  return {
    apiVersion: PKGI_API,
    kind: 'PackageInstall',
    metadata: { name: 'inst', namespace: 'ns', uid: 'uid-pkgi', generation: 1, resourceVersion: '1' },
    spec: { serviceAccountName: 'sa', packageRef: { refName: REF_NAME, versionSelection: { constraints: '>=1.0.0' } } },
  };
}

type Status = { version?: string; conditions?: Record<string, string>[] };

/**
 * One store, a clock, and per cluster id a fake cluster (its PackageInstall `ns/inst`, the
 * Packages published so far); `run` reconciles it once, the App first given `app` as its status
 * (the App pipeline's outcome at its current generation).
 */
function fleet(withPolicy = true, store: MemoryStore = new MemoryStore(), cloud = false) {
  const log = memoryLogger();
  let now = T0;
  const published = ['1.0.0'];
  const clusters = new Map<string, FakeCluster>();
  const emitted: KappEvent[] = [];
  const ready = withPolicy ? putPolicy(store, POLICY) : Promise.resolve();
  // The shared stack: the install dispatcher's coordinator holds the store; each run gets its
  // cluster's view and a store that refuses every rollout key (as its session does).
  const coordinator = cloud
    ? new RolloutCoordinator({
        store,
        log,
        now: () => new Date(now),
        poke: async (events) => {
          emitted.push(...events);
        },
      })
    : undefined;
  const runStore = cloud ? refusingRolloutKeys(store) : store;
  /** Deps of a runtime serving `served` (every cluster's view, the shared store and clock); events go to `emitted`. */
  function depsFor(served: string[]) {
    const { deps } = stageDeps(undefined, { runner: new FakeCommandRunner(), store: runStore, tmpRoot: tempDir() });
    deps.log = log;
    deps.now = () => new Date(now);
    deps.clusters = { ...deps.clusters, clusterIds: () => served, installView: (c) => clusters.get(c) as never };
    deps.emit = async (events) => {
      emitted.push(...events);
    };
    return deps;
  }
  async function run(id: string, app?: Record<string, unknown>) {
    await ready;
    let cluster = clusters.get(id);
    if (!cluster) {
      cluster = new FakeCluster().put(packageInstall());
      cluster.namespaces.set('ns', { metadata: { name: 'ns', uid: 'uid-ns', resourceVersion: '1' }, phase: 'Active' });
      clusters.set(id, cluster);
    }
    for (const v of published) cluster.put(pkg(v));
    const a = cluster.get('App', 'ns', 'inst');
    if (a && app) a.status = { ...app, observedGeneration: a.metadata.generation };
    const deps = depsFor([...clusters.keys()]);
    const ref: ObjectRef = {
      clusterId: id,
      kind: 'PackageInstall',
      apiVersion: PKGI_API,
      namespace: 'ns',
      name: 'inst',
      uid: 'uid-pkgi',
      generation: 1,
      resourceVersion: cluster.get('PackageInstall', 'ns', 'inst')?.metadata.resourceVersion ?? '1',
    };
    const reports = new RolloutReports();
    if (coordinator) {
      const view = await coordinator.viewFor(id);
      deps.rollouts = new ReportingRollouts(() => view, runStore, reports);
    }
    await dispatchEvent(objectEvent(ref, 'modified', { time: new Date(now) }), deps);
    const report = reports.take();
    if (coordinator && report) await coordinator.afterBatch(new Map([[id, report]]));
    const status = cluster.get('PackageInstall', 'ns', 'inst')?.status as Status;
    const appAfter = cluster.get('App', 'ns', 'inst');
    return {
      status,
      appVersion: appAfter?.metadata.annotations?.['packaging.carvel.dev/package-version'],
      app: appAfter,
    };
  }
  /** Installs 1.0.0 in `id` and reconciles it (its App succeeded). */
  async function install(id: string) {
    await run(id);
    return await run(id, succeeded);
  }
  /** c1 (wave canary) and c2 (wave rest) at 1.0.0, then 2.0.0 published and c1's run at 1 s: the rollout started. */
  async function rolloutStarted() {
    await install('c1');
    await install('c2');
    published.push('2.0.0');
    now = T0 + 1000;
    return await run('c1');
  }
  return {
    store,
    coordinator,
    emitted,
    depsFor,
    logs: () => log.records,
    run,
    install,
    rolloutStarted,
    publish: (v: string) => published.push(v),
    at: (s: number) => {
      now = T0 + s * 1000;
    },
  };
}

/** `store` as a dispatched install run's session reaches it: every `state/rollout…` key refused. */
function refusingRolloutKeys(store: MemoryStore): MemoryStore {
  return new Proxy(store, {
    get(target, prop, receiver) {
      const value = Reflect.get(target, prop, receiver);
      if (typeof value !== 'function') return value;
      return (...args: unknown[]) => {
        if (typeof args[0] === 'string' && args[0].startsWith('state/rollout')) {
          throw new StoreError('denied', String(prop) as never, args[0]);
        }
        return value.apply(target, args);
      };
    },
  });
}

/** `[reason, subject, cause]` of each event in `events`. */
function pokes(events: readonly KappEvent[]) {
  return events.map((e) => {
    const d = e.data as { reason?: string; cause?: string };
    return [d.reason, e.subject, d.cause];
  });
}

describe('install: the rollout gate', () => {
  it('without a policy: the newest version at once, no Rollout condition, the fleet entry written', async () => {
    const f = fleet(false);
    expect((await f.install('c2')).status.version).toBe('1.0.0');
    f.publish('2.0.0');
    const r = await f.run('c2');
    expect(r.appVersion).toBe('2.0.0');
    expect(r.status.conditions?.map((c) => c.type)).toEqual(['Reconciling']);
    expect(await f.store.list('state/rollouts/')).toEqual([]);
    expect(await readFleetEntry(f.store, 'c2', 'ns', 'inst')).toMatchObject({
      refName: REF_NAME,
      version: '2.0.0',
      reconcile: 'reconciling',
      lastGoodVersion: '1.0.0',
    });
  });

  it('a store that refuses the rollout keys (the cloud install function today): not gated, warned once', async () => {
    class Refusing extends MemoryStore {
      override async list(prefix: string) {
        if (prefix.startsWith('state/')) throw new StoreError('failed to list objects', 'list', prefix);
        return await super.list(prefix);
      }
      override async get(key: string) {
        if (key.startsWith('state/')) throw new StoreError('failed to get object', 'get', key);
        return await super.get(key);
      }
    }
    const f = fleet(false, new Refusing());
    await f.install('c-refusing');
    f.publish('2.0.0');
    expect((await f.run('c-refusing')).appVersion).toBe('2.0.0');
    const warned = f
      .logs()
      .filter((r) => r.level === 'warn' && r.msg?.startsWith('fleet index'))
      .map((r) => r.msg);
    expect(warned).toEqual(['fleet index: the rollout policies could not be read; not gated']);
  });

  it('holds a later wave, upgrades the first, soaks, and releases the next wave after the soak', async () => {
    const f = fleet();
    await f.install('c1');
    expect((await f.install('c2')).status.conditions).toEqual([{ type: 'ReconcileSucceeded', status: 'True' }]);
    f.publish('2.0.0');
    const held = await f.run('c2');
    // c2 sees 2.0.0 first: it creates the rollout, whose first wave (c1) is released, not its own.
    expect(held.appVersion).toBe('1.0.0');
    expect(held.status.version).toBe('1.0.0');
    expect(held.status.conditions).toEqual([
      { type: 'ReconcileSucceeded', status: 'True' },
      {
        type: ROLLOUT,
        status: 'False',
        reason: 'Held',
        message: '2.0.0 held: wave rest not started (rollout at wave canary)',
      },
    ]);
    expect((await readRollout(f.store, 'default', REF_NAME))?.record).toMatchObject({
      target: '2.0.0',
      from: '1.0.0',
      status: 'running',
      waves: [{ name: 'canary', releasedAt: new Date(T0).toISOString() }, { name: 'rest' }],
    });
    f.at(1);
    const up = await f.run('c1');
    expect(up.appVersion).toBe('2.0.0');
    expect(up.status.conditions?.map((c) => c.reason ?? c.type)).toEqual(['Reconciling', 'Upgrading']);
    f.at(5);
    const healthy = await f.run('c1', succeeded);
    expect(healthy.status.conditions?.[1]).toMatchObject({
      reason: 'Soaking',
      message: `2.0.0: wave canary healthy, soaking until ${new Date(T0 + 35_000).toISOString()}`,
    });
    expect(await readFleetEntry(f.store, 'c1', 'ns', 'inst')).toMatchObject({
      version: '2.0.0',
      reconcile: 'succeeded',
      healthySince: new Date(T0 + 5000).toISOString(),
      wave: 'canary',
      rollout: `default/${REF_NAME}`,
      lastGoodVersion: '2.0.0',
    });
    f.at(20);
    expect((await f.run('c2')).appVersion).toBe('1.0.0');
    f.at(35);
    // The soak is over: c1's next run (the forwarder's due time) releases wave rest.
    expect((await f.run('c1')).status.conditions?.[1]).toMatchObject({
      reason: 'Upgrading',
      message: '2.0.0 released to wave canary',
    });
    expect((await readRollout(f.store, 'default', REF_NAME))?.record.waves[1]?.releasedAt).toBe(
      new Date(T0 + 35_000).toISOString(),
    );
    // The released wave's PackageInstalls are poked at once.
    expect(
      f.emitted.map((e) => {
        const d = e.data as { reason?: string; cause?: string };
        return [d.reason, e.subject, d.cause];
      }),
    ).toEqual([
      ['ref-changed', 'c2/PackageInstall/ns/inst', `rollout: default/${REF_NAME} wave rest released (2.0.0)`],
    ]);
    f.at(36);
    expect((await f.run('c2')).appVersion).toBe('2.0.0');
    f.at(40);
    expect((await f.run('c2', succeeded)).status.conditions?.[1]?.reason).toBe('Completed');
    expect((await readRollout(f.store, 'default', REF_NAME))?.record.status).toBe('completed');
  });

  it('a version published while a rollout moves waits behind it; the run that ends the rollout pokes every member, and the next starts', async () => {
    const f = fleet();
    await f.rolloutStarted();
    f.at(5);
    await f.run('c1', succeeded);
    f.at(35);
    await f.run('c1');
    f.at(36);
    await f.run('c2');
    // 3.0.0 arrives while 2.0.0 is still rolling out: c1 stays at 2.0.0.
    f.publish('3.0.0');
    expect((await f.run('c1')).appVersion).toBe('2.0.0');
    expect((await readRollout(f.store, 'default', REF_NAME))?.record.target).toBe('2.0.0');
    f.emitted.length = 0;
    f.at(40);
    expect((await f.run('c2', succeeded)).status.conditions?.[1]?.reason).toBe('Completed');
    // The completing run pokes every member: nothing else would run them before their sync period.
    expect(f.emitted.map((e) => [e.subject, (e.data as { cause?: string }).cause])).toEqual([
      ['c1/PackageInstall/ns/inst', `rollout: default/${REF_NAME} of 2.0.0 ended: selecting again`],
      ['c2/PackageInstall/ns/inst', `rollout: default/${REF_NAME} of 2.0.0 ended: selecting again`],
    ]);
    f.at(41);
    expect((await f.run('c1')).appVersion).toBe('3.0.0');
    expect((await readRollout(f.store, 'default', REF_NAME))?.record).toMatchObject({ target: '3.0.0', from: '2.0.0' });
  });

  it('onFailure rollback: the failed member goes back to its last good version, naming the receipt whose render it deploys', async () => {
    const store = new MemoryStore();
    await putPolicy(store, { ...POLICY, spec: { ...POLICY.spec, onFailure: 'rollback' } });
    const f = fleet(false, store);
    // c1 healthy at 1.0.0 with its App at generation 1; the receipt of that reconcile, its render kept.
    await f.install('c1');
    const render = `artifacts/template/sha256/${'b'.repeat(64)}.yaml`;
    await store.put(render, 'kind: ConfigMap\n');
    const owner = { clusterId: 'c1', namespace: 'ns', name: 'inst' };
    const receipt = (id: string, generation: number, outcome: 'succeeded' | 'failed') =>
      putReceipt(store, owner, id, {
        generation,
        startedAt: new Date(T0).toISOString(),
        endedAt: new Date(T0).toISOString(),
        outcome,
        ...(outcome === 'succeeded' ? { render } : {}),
      });
    await receipt('20261207-000000-000-aaaaaaaa', 1, 'succeeded');
    expect(await readFleetEntry(store, 'c1', 'ns', 'inst')).toMatchObject({
      lastGoodVersion: '1.0.0',
      lastGoodAppGeneration: 1,
    });
    await f.install('c2');
    f.publish('2.0.0');
    f.at(1);
    expect((await f.run('c1')).appVersion).toBe('2.0.0');
    // 2.0.0 (App generation 2) fails: its receipt is newer, and not the one to go back to.
    await receipt('20261207-000003-000-bbbbbbbb', 2, 'failed');
    f.at(3);
    await f.run('c1', failedApp);
    expect((await readRollout(store, 'default', REF_NAME))?.record.status).toBe('stopped');
    // Its next run (the ending run poked it) goes back to 1.0.0, despite the downgrade guard.
    f.at(4);
    const back = await f.run('c1');
    expect(back.appVersion).toBe('1.0.0');
    expect(back.status.version).toBe('1.0.0');
    expect(back.app?.metadata.annotations).toMatchObject({
      'kapp-lambda.carvel.dev/rollback-to': '20261207-000000-000-aaaaaaaa',
      'kapp-lambda.carvel.dev/rollback-generation': String(back.app?.metadata.generation),
    });
    expect(back.status.conditions?.find((c) => c.type === ROLLOUT)).toEqual({
      type: ROLLOUT,
      status: 'False',
      reason: 'RolledBack',
      message:
        'rolled back to 1.0.0 (receipt 20261207-000000-000-aaaaaaaa, its render deployed as it was) after the rollout of 2.0.0 stopped: wave canary: 1 failed (maxUnavailable 0), first c1 ns/inst: reconcile of 2.0.0 failed',
    });
    // c2, never upgraded, is not rolled back: it stays at 1.0.0, told the rollout stopped.
    expect((await f.run('c2')).status.conditions?.find((c) => c.type === ROLLOUT)?.reason).toBe('Stopped');
    // The policy changed to onFailure stop: the stopped rollout does not offer c1 the version that
    // failed on it again; it stays at its last good version.
    await putPolicy(store, POLICY);
    f.at(10);
    expect((await f.run('c1')).appVersion).toBe('1.0.0');
  });

  it('a failed reconcile of the target in wave 1 stops the rollout: the later wave stays held', async () => {
    const f = fleet();
    expect((await f.rolloutStarted()).appVersion).toBe('2.0.0');
    f.at(3);
    const failed = await f.run('c1', failedApp);
    expect(failed.status.conditions?.map((c) => c.type)).toEqual(['ReconcileFailed', ROLLOUT]);
    expect(failed.status.conditions?.[1]).toMatchObject({
      status: 'False',
      reason: 'Stopped',
      message:
        'rollout of 2.0.0 stopped: wave canary: 1 failed (maxUnavailable 0), first c1 ns/inst: reconcile of 2.0.0 failed',
    });
    const held = await f.run('c2');
    expect(held.appVersion).toBe('1.0.0');
    expect(held.status.conditions?.[1]?.reason).toBe('Stopped');
  });

  it('a cluster that joins mid-rollout with no version gets the rollout`s from until its wave is released', async () => {
    const f = fleet();
    await f.install('c1');
    f.publish('2.0.0');
    await f.run('c1');
    expect((await f.run('c3')).appVersion).toBe('1.0.0');
  });

  it('the canary wave waits for a listed cluster that has not reported yet', async () => {
    const f = fleet();
    await f.install('c2');
    f.publish('2.0.0');
    await f.run('c2');
    await f.run('c2');
    expect((await readRollout(f.store, 'default', REF_NAME))?.record.waves[1]?.releasedAt).toBeUndefined();
  });

  it('the fleet entry reads health from the Healthy condition: False is unhealthy, keeps lastGoodVersion', () => {
    const pkgi = { metadata: { namespace: 'ns', name: 'inst' }, spec: { packageRef: { refName: REF_NAME } } } as never;
    const healthy = fleetEntryOf(
      'c1',
      pkgi,
      {
        ...succeeded,
        version: '1.0.0',
        conditions: [...succeeded.conditions, { type: KappLambdaConditionType.Healthy, status: 'True' }],
      },
      undefined,
      new Date(T0),
      undefined,
    );
    expect(healthy).toMatchObject({
      health: 'True',
      healthySince: new Date(T0).toISOString(),
      lastGoodVersion: '1.0.0',
    });
    const sick = fleetEntryOf(
      'c1',
      pkgi,
      {
        ...succeeded,
        version: '2.0.0',
        conditions: [...succeeded.conditions, { type: KappLambdaConditionType.Healthy, status: 'False' }],
      },
      healthy,
      new Date(T0 + 1000),
      undefined,
    );
    expect(sick).toMatchObject({ health: 'False', lastGoodVersion: '1.0.0' });
    expect(sick.healthySince).toBeUndefined();
  });

  it('the rollout check pokes the served members of a released wave behind the target, once per release', async () => {
    const f = fleet();
    await f.rolloutStarted();
    f.at(5);
    await f.run('c1', succeeded);
    f.emitted.length = 0;
    f.at(36);
    // No member ran at the soak's end: the check releases wave rest and pokes c2.
    const deps = f.depsFor(['c2']);
    const sent = f.emitted;
    const poked = new Set<string>();
    expect(await checkRollouts(deps, poked)).toBe(1);
    expect(sent.map((e) => e.subject)).toEqual(['c2/PackageInstall/ns/inst']);
    expect((await readRollout(f.store, 'default', REF_NAME))?.record.waves[1]?.releasedAt).toBe(
      new Date(T0 + 36_000).toISOString(),
    );
    expect(await checkRollouts(deps, poked)).toBe(0);
  });

  it('the rollout check of another runtime pokes its members once when a rollout ended elsewhere, within the window only', async () => {
    const f = fleet();
    await f.rolloutStarted();
    f.at(3);
    // c1's run stops the rollout (its runtime pokes what it serves); c2's runtime learns it by its check.
    await f.run('c1', failedApp);
    expect((await readRollout(f.store, 'default', REF_NAME))?.record.status).toBe('stopped');
    f.emitted.length = 0;
    const other = f.depsFor(['c2']);
    const poked = new Set<string>();
    expect(await checkRollouts(other, poked)).toBe(1);
    expect(f.emitted.map((e) => [e.subject, (e.data as { cause?: string }).cause])).toEqual([
      ['c2/PackageInstall/ns/inst', `rollout: default/${REF_NAME} of 2.0.0 ended: selecting again`],
    ]);
    expect(await checkRollouts(other, poked)).toBe(0);
    // A runtime that starts after the window does not poke for that end.
    f.at(3 + ENDED_POKE_WINDOW_MS / 1000 + 1);
    expect(await checkRollouts(f.depsFor(['c2']), new Set())).toBe(0);
  });
});

describe('selection: the extra (rollout-wave) callback', () => {
  it('runs after kapp-controller`s checks, from one listing, and shows in the selection error', async () => {
    const cluster = new FakeCluster();
    for (const v of ['1.0.0', '2.0.0']) cluster.put(pkg(v));
    cluster.namespaces.set('ns', { metadata: { name: 'ns', uid: 'uid-ns', resourceVersion: '1' }, phase: 'Active' });
    const parsed = parsePackageInstall(packageInstall());
    if (!parsed.success) throw parsed.error;
    const selection = await packageSelection(cluster, parsed.data, {
      globalNamespace: 'kapp-controller-packaging-global',
      kubernetesVersion: async () => '1.34.4',
    });
    expect(selection.choose().spec.version).toBe('2.0.0');
    const cap = (max: string) => [{ name: ROLLOUT_WAVE_CHECK, check: (v: string) => v <= max }];
    expect(selection.choose(cap('1.0.0')).spec.version).toBe('1.0.0');
    expect(() => selection.choose(cap('0.9.0'))).toThrow(
      'Expected to find at least one version, but did not (details: all=2 -> after-prereleases-filter=2 -> after-kapp-controller-version-check=2 -> after-rollout-wave=0 -> after-constraints-filter=0)',
    );
  });
});

describe('forwarder: the PackageInstall due time', () => {
  const obj = (generation: number, conditions: unknown[]) =>
    ({ metadata: { generation }, status: { observedGeneration: 1, conditions } }) as unknown as KubeObject;
  const soaking = {
    type: ROLLOUT,
    status: 'True',
    reason: 'Soaking',
    message: '2.0.0: wave canary healthy, soaking until 2026-12-07T08:00:35.000Z',
  };

  it('is the end of the soak its Rollout condition announces; now for a new spec; else never', () => {
    expect(packageInstallDueAt(obj(1, [{ type: 'ReconcileSucceeded', status: 'True' }, soaking]), T0)).toBe(
      T0 + 35_000,
    );
    expect(packageInstallDueAt(obj(2, [soaking]), T0)).toBe(T0);
    expect(packageInstallDueAt(obj(1, [{ type: 'ReconcileSucceeded', status: 'True' }]), T0)).toBeNull();
    expect(packageInstallDueAt(obj(1, [{ ...soaking, reason: 'Upgrading' }]), T0)).toBeNull();
  });
});

describe('install: rollouts in the shared stack (the install dispatcher coordinates, runs report)', () => {
  const released = (wave: string) => `rollout: default/${REF_NAME} wave ${wave} released (2.0.0)`;
  /** c1 (canary) and c2 (rest) at 1.0.0; 2.0.0 published; c1's run asks the rollout at 1 s, its poke's run upgrades at 2 s. */
  async function canaryUpgraded() {
    const f = fleet(true, new MemoryStore(), true);
    await f.install('c1');
    await f.install('c2');
    f.publish('2.0.0');
    f.at(1);
    await f.run('c1');
    f.at(2);
    expect((await f.run('c1')).appVersion).toBe('2.0.0');
    return f;
  }

  it('a first-wave run starts the rollout through the dispatcher; waves advance on the pokes it sends; no run touches a rollout key', async () => {
    const f = fleet(true, new MemoryStore(), true);
    await f.install('c1');
    await f.install('c2');
    f.publish('2.0.0');
    // c2 (wave rest) sees 2.0.0 first: it may not start the fleet's rollout; it holds at 1.0.0.
    f.at(1);
    expect((await f.run('c2')).appVersion).toBe('1.0.0');
    expect(await readRollout(f.store, 'default', REF_NAME)).toBeUndefined();
    // c1 (canary) asks; it holds this run, the dispatcher creates the rollout and pokes the canary.
    f.at(2);
    expect((await f.run('c1')).appVersion).toBe('1.0.0');
    expect((await readRollout(f.store, 'default', REF_NAME))?.record).toMatchObject({
      target: '2.0.0',
      from: '1.0.0',
      status: 'running',
    });
    expect(pokes(f.emitted)).toEqual([['ref-changed', 'c1/PackageInstall/ns/inst', released('canary')]]);
    f.emitted.length = 0;
    f.at(3);
    const up = await f.run('c1');
    expect(up.appVersion).toBe('2.0.0');
    expect(up.status.conditions?.[1]?.reason).toBe('Upgrading');
    // Healthy: the dispatcher notes the soak and pokes the wave, whose next run shows its end.
    f.at(5);
    await f.run('c1', succeeded);
    const soakEnds = new Date(T0 + 35_000).toISOString();
    expect(pokes(f.emitted)).toEqual([
      [
        'ref-changed',
        'c1/PackageInstall/ns/inst',
        `rollout: default/${REF_NAME} wave canary healthy, soaking until ${soakEnds}`,
      ],
    ]);
    f.emitted.length = 0;
    f.at(6);
    expect((await f.run('c1')).status.conditions?.[1]).toMatchObject({
      reason: 'Soaking',
      message: `2.0.0: wave canary healthy, soaking until ${soakEnds}`,
    });
    expect((await f.run('c2')).status.conditions?.[1]?.reason).toBe('Held');
    // The soak's end (the forwarder's due time): c1's run; the dispatcher releases rest and pokes c2.
    f.at(35);
    await f.run('c1');
    expect(pokes(f.emitted)).toEqual([['ref-changed', 'c2/PackageInstall/ns/inst', released('rest')]]);
    f.emitted.length = 0;
    f.at(36);
    expect((await f.run('c2')).appVersion).toBe('2.0.0');
    f.at(40);
    await f.run('c2', succeeded);
    const record = (await readRollout(f.store, 'default', REF_NAME))?.record;
    expect(record?.status).toBe('completed');
    expect(record?.endPokedAt).toBe(new Date(T0 + 40_000).toISOString());
    expect(pokes(f.emitted).map((p) => p[1])).toEqual(['c1/PackageInstall/ns/inst', 'c2/PackageInstall/ns/inst']);
    // Each run's session reached no rollout key: the only warnings would be the refused reads.
    expect(f.logs().filter((r) => r.level === 'warn')).toEqual([]);
  });

  it('a stop names the failed cluster to itself only; other clusters read the count, and the dispatcher pokes every member', async () => {
    const f = await canaryUpgraded();
    f.emitted.length = 0;
    f.at(3);
    await f.run('c1', failedApp);
    expect((await readRollout(f.store, 'default', REF_NAME))?.record.status).toBe('stopped');
    expect(pokes(f.emitted).map((p) => p[1])).toEqual(['c1/PackageInstall/ns/inst', 'c2/PackageInstall/ns/inst']);
    f.at(4);
    const c2 = (await f.run('c2')).status.conditions?.[1];
    expect(c2).toMatchObject({
      reason: 'Stopped',
      message: 'rollout of 2.0.0 stopped: wave canary: 1 failed (maxUnavailable 0)',
    });
    expect((await f.run('c1')).status.conditions?.[1]?.message).toContain(
      'first c1 ns/inst: reconcile of 2.0.0 failed',
    );
    // The view of c2 names no other cluster at all.
    const view = JSON.stringify(await f.coordinator?.viewFor('c2'));
    expect(view).not.toContain('c1');
  });

  it('the dispatcher reads no entry a cluster wrote for another: an entry under c2`s prefix naming c1 is ignored', async () => {
    const f = await canaryUpgraded();
    // c2's session may write state/fleet/c2/…: a planted healthy c1 at the target there.
    const planted = {
      ...(await readFleetEntry(f.store, 'c1', 'ns', 'inst')),
      version: '2.0.0',
      reconcile: 'succeeded',
    };
    await f.store.put(`${fleetKey('c2', 'ns', 'x')}`, JSON.stringify({ ...planted, name: 'x', clusterId: 'c1' }));
    await f.coordinator?.afterBatch(new Map([['c2', { touched: [`default/${REF_NAME}`], start: [] }]]));
    expect((await readRollout(f.store, 'default', REF_NAME))?.record.waves[0]?.healthyAt).toBeUndefined();
  });
});
