import { describe, expect, it } from 'vitest';
import { EVENT_TYPES, type HealthData, healthEvent, parseEvent, targetFunction } from '../../events/schema.js';
import { type AppStatus, KappLambdaConditionType, type PackageInstallStatus } from '../../functions/lib/api/index.js';
import { EMITS, emitRefusal } from '../../functions/lib/entry/sender.js';
import type { KubeObject, NewEvent } from '../../functions/lib/kube/port.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { ReconcileEventRecorder } from '../../functions/lib/observe/events.js';
import { EmfReconcileMetrics } from '../../functions/lib/observe/metrics.js';
import { PrometheusReconcileMetrics } from '../../functions/lib/observe/prometheus.js';
import { applyHealth, healthCondition, withHealthCondition } from '../../functions/lib/pipeline/app/health.js';
import type { DispatchDeps } from '../../functions/lib/pipeline/deps.js';
import { mirrorAppStatus } from '../../functions/lib/pipeline/install/install.js';
import { route } from '../../functions/lib/pipeline/routes/fetch.js';

const HEALTHY = KappLambdaConditionType.Healthy;
const REF = {
  clusterId: 'c1',
  kind: 'App' as const,
  apiVersion: 'kappctrl.k14s.io/v1alpha1',
  namespace: 'default',
  name: 'a',
  uid: 'uid-a',
  generation: 2,
  resourceVersion: '7',
};
const FALSE: HealthData = {
  object: REF,
  status: 'False',
  reason: 'Unhealthy',
  unhealthy: [
    { kind: 'Deployment', namespace: 'default', name: 'web', why: 'Available=False (MinimumReplicasUnavailable)' },
  ],
};
const TRUE: HealthData = { object: REF, status: 'True', reason: 'Healthy', unhealthy: [] };

function status(first = 'ReconcileSucceeded', extra: object[] = []): AppStatus {
  return {
    observedGeneration: 2,
    conditions: [{ type: first, status: 'True' }, ...extra],
    friendlyDescription: 'Reconcile succeeded',
    consecutiveReconcileSuccesses: 3,
  } as AppStatus;
}

describe('the health event', () => {
  it('validates, goes to fetch, and only the forwarder sends it', () => {
    const e = healthEvent(FALSE, { time: '2025-01-01T00:00:00Z' });
    expect(e.type).toBe(EVENT_TYPES.health);
    expect(targetFunction(e)).toBe('fetch');
    expect(parseEvent(JSON.stringify(e))).toMatchObject({ ok: true });
    expect(EMITS.forwarder).toContain('health');
    expect(emitRefusal('forwarder', e)).toBeUndefined();
    expect(emitRefusal('template', e)).toBe('the template function never sends dev.kapp-lambda.health.v1 (health)');
  });

  it('has an id from the App state and the verdict, not the time', () => {
    const a = healthEvent(FALSE, { time: '2025-01-01T00:00:00Z' });
    expect(healthEvent(FALSE, { time: '2025-01-01T00:01:00Z' }).id).toBe(a.id);
    expect(healthEvent(TRUE, { time: '2025-01-01T00:00:00Z' }).id).not.toBe(a.id);
    expect(healthEvent({ ...FALSE, object: { ...REF, resourceVersion: '8' } }, { time: a.time }).id).not.toBe(a.id);
  });

  it('refuses a reason that does not go with the status, resources on True, another kind, more than 5', () => {
    const bad = (d: object) => () => healthEvent(d as HealthData, { time: '2025-01-01T00:00:00Z' });
    expect(bad({ ...FALSE, reason: 'Healthy' })).toThrow(/reason Healthy for True/);
    expect(bad({ ...TRUE, unhealthy: FALSE.unhealthy })).toThrow(/exactly when status is not True/);
    expect(
      bad({ ...TRUE, object: { ...REF, kind: 'PackageInstall', apiVersion: 'packaging.carvel.dev/v1alpha1' } }),
    ).toThrow(/expected "App"/);
    expect(bad({ ...FALSE, unhealthy: Array(6).fill(FALSE.unhealthy[0]) })).toThrow(/at most 5/);
  });
});

describe('withHealthCondition', () => {
  const cond = healthCondition(FALSE);

  it('appends the condition after kapp-controller’s, replacing only an earlier Healthy one', () => {
    const before = status('ReconcileSucceeded', [healthCondition(TRUE)]);
    const after = withHealthCondition(before, cond, 2);
    expect(after?.conditions).toEqual([
      { type: 'ReconcileSucceeded', status: 'True' },
      {
        type: HEALTHY,
        status: 'False',
        reason: 'Unhealthy',
        message: 'Deployment default/web: Available=False (MinimumReplicasUnavailable)',
      },
    ]);
    expect({ ...after, conditions: undefined }).toEqual({ ...before, conditions: undefined });
  });

  it('leaves the status alone while a reconcile or delete runs, before the spec is reconciled, or without a condition', () => {
    for (const first of ['Reconciling', 'Deleting', 'DeleteFailed']) {
      const s = status(first);
      expect(withHealthCondition(s, cond, 2)).toBe(s);
    }
    const old = { ...status(), observedGeneration: 1 };
    expect(withHealthCondition(old, cond, 2)).toBe(old);
    expect(withHealthCondition(undefined, cond, 2)).toBeUndefined();
    const none = { observedGeneration: 2 } as AppStatus;
    expect(withHealthCondition(none, cond, 2)).toBe(none);
  });

  it('writes on a failed reconcile too', () => {
    expect(withHealthCondition(status('ReconcileFailed'), cond, 2)?.conditions?.[1]?.type).toBe(HEALTHY);
  });
});

/** One App in a fake cluster: reads, status writes (with resourceVersion checks) and Events. */
function world(app: KubeObject | undefined) {
  let obj = app;
  const events: NewEvent[] = [];
  const writes: unknown[] = [];
  const kube = {
    getObject: async () => (obj ? structuredClone(obj) : undefined),
    updateStatus: async (_ref: unknown, pre: { resourceVersion: string }, s: unknown) => {
      if (!obj || pre.resourceVersion !== obj.metadata.resourceVersion) throw new Error('conflict');
      const rv = String(Number(obj.metadata.resourceVersion) + 1);
      obj = { ...obj, metadata: { ...obj.metadata, resourceVersion: rv }, status: s };
      writes.push(s);
      return { resourceVersion: rv };
    },
  };
  const metrics = new PrometheusReconcileMetrics();
  const deps = {
    clusters: {
      fetchView: () => kube,
      eventWriter: () => ({
        writeEvent: async (e: NewEvent) => {
          events.push(e);
          return 'created' as const;
        },
      }),
    },
    log: memoryLogger(),
    events: new ReconcileEventRecorder(),
    metrics,
  } as unknown as DispatchDeps;
  return { deps, events, writes, metrics, app: () => obj };
}

function liveApp(s: AppStatus, generation = 2): KubeObject {
  return {
    apiVersion: REF.apiVersion,
    kind: 'App',
    metadata: { name: 'a', namespace: 'default', uid: 'uid-a', resourceVersion: '7', generation },
    spec: {},
    status: s,
  };
}

describe('applyHealth (the fetch function)', () => {
  const event = (d: HealthData) => healthEvent(d, { time: '2025-01-01T00:00:00Z' });

  it('writes the condition, an Event on a change, and the gauge', async () => {
    const w = world(liveApp(status('ReconcileSucceeded', [healthCondition(TRUE)])));
    expect(await route.dispatch(event(FALSE), w.deps)).toBeUndefined();
    const conditions = (w.app()?.status as AppStatus | undefined)?.conditions ?? [];
    expect(conditions.map((c) => [c.type, c.status])).toEqual([
      ['ReconcileSucceeded', 'True'],
      [HEALTHY, 'False'],
    ]);
    expect(w.events.map((e) => [e.type, e.reason, e.message])).toEqual([
      ['Warning', 'Unhealthy', 'Deployment default/web: Available=False (MinimumReplicasUnavailable)'],
    ]);
    const metrics = await w.metrics.registry.metrics();
    expect(metrics).toContain(
      'kapp_lambda_app_healthy{controller="app",name="a",namespace="default",status="False"} 1',
    );
    expect(metrics).toContain('kapp_lambda_app_healthy{controller="app",name="a",namespace="default",status="True"} 0');
    // The same verdict again (a forwarder restart): nothing written.
    expect(await applyHealth(event(FALSE), w.deps)).toBe('unchanged');
    expect(w.writes).toHaveLength(1);
  });

  it('after a reconcile dropped the condition: healthy again is no Event, unhealthy is', async () => {
    const ok = world(liveApp(status()));
    expect(await applyHealth(event(TRUE), ok.deps)).toBe('written');
    expect(ok.events).toEqual([]);
    const bad = world(liveApp(status()));
    expect(await applyHealth(event(FALSE), bad.deps)).toBe('written');
    expect(bad.events.map((e) => e.reason)).toEqual(['Unhealthy']);
  });

  it('writes nothing for a newer generation, another uid, a running reconcile', async () => {
    const newer = world(liveApp(status(), 3));
    expect(await applyHealth(event(FALSE), newer.deps)).toBe('stale');
    const other = world({ ...liveApp(status()), metadata: { ...liveApp(status()).metadata, uid: 'x' } });
    expect(await applyHealth(event(FALSE), other.deps)).toBe('gone');
    const running = world(liveApp(status('Reconciling')));
    expect(await applyHealth(event(FALSE), running.deps)).toBe('unchanged');
    expect([...newer.writes, ...other.writes, ...running.writes]).toEqual([]);
  });
});

describe('mirrorAppStatus: the PackageInstall mirrors its App’s health', () => {
  const app = (conditions: object[], generation = 2) =>
    ({
      apiVersion: REF.apiVersion,
      kind: 'App',
      metadata: { name: 'a', namespace: 'default', generation },
      status: { observedGeneration: 2, conditions },
    }) as unknown as Parameters<typeof mirrorAppStatus>[1];
  const pkgi = (conditions: object[]) => ({ observedGeneration: 1, conditions }) as PackageInstallStatus;

  it('appends the App’s Healthy condition after the PackageInstall’s own, never first', () => {
    const m = mirrorAppStatus(
      pkgi([{ type: 'Reconciling', status: 'True' }]),
      app([{ type: 'ReconcileSucceeded', status: 'True' }, healthCondition(FALSE)]),
    );
    expect(m.conditions?.map((c) => [c.type, c.status])).toEqual([
      ['ReconcileSucceeded', 'True'],
      [HEALTHY, 'False'],
    ]);
    expect(m.conditions?.[1]?.message).toBe(healthCondition(FALSE).message);
  });

  it('drops an earlier copy when the App has none (a reconcile runs), and adds nothing to an empty list', () => {
    const before = pkgi([{ type: 'ReconcileSucceeded', status: 'True' }, healthCondition(TRUE)]);
    expect(mirrorAppStatus(before, app([{ type: 'Reconciling', status: 'True' }])).conditions).toEqual([
      { type: 'ReconcileSucceeded', status: 'True' },
    ]);
    expect(mirrorAppStatus(pkgi([]), app([healthCondition(TRUE)], 3)).conditions).toEqual([]);
  });
});

describe('the health gauge on Lambda (EMF)', () => {
  it('writes 1 for True, 0 for False, nothing for Unknown', () => {
    const lines: string[] = [];
    const emf = new EmfReconcileMetrics({ write: (l) => lines.push(l), now: () => 0 });
    const target = { clusterId: 'c1', controller: 'app' as const, namespace: 'ns', name: 'a' };
    emf.health(target, 'True');
    emf.health(target, 'Unknown');
    emf.health(target, 'False');
    expect(lines.map((l) => JSON.parse(l).kapp_lambda_app_healthy)).toEqual([1, 0]);
  });
});
