import { describe, expect, it } from 'vitest';
import { parseApp, parsePackageRepository } from '../../functions/lib/api/index.js';
import {
  APP_JITTER_MS,
  appDefaultSyncPeriod,
  applyJitter,
  appMinimumSyncPeriod,
  durationUntilReady,
  failurePeriod,
  hasFailedCondition,
  isReadyAt,
  lastReconcileTime,
  nextDueAt,
  packageInstallDefaultSyncPeriod,
  parseControllerSyncConfig,
  syncPeriod,
  type TimedObject,
} from '../../functions/lib/reconcile/timer.js';

const T0 = new Date('2024-05-01T10:00:00Z');
const at = (offsetMs: number) => new Date(T0.getTime() + offsetMs);
const iso = (d: Date) => `${d.toISOString().slice(0, 19)}Z`;

function app(opts: {
  syncPeriod?: string;
  generation?: number;
  observedGeneration?: number;
  paused?: boolean;
  canceled?: boolean;
  condition?: string;
  failures?: number;
  fetchAt?: Date;
  templateAt?: Date;
  deployAt?: Date;
  uid?: string;
}): TimedObject {
  const generation = opts.generation ?? 1;
  return {
    metadata: { name: 'simple-app', namespace: 'default', uid: opts.uid ?? 'uid-1', generation },
    spec: { syncPeriod: opts.syncPeriod, paused: opts.paused, canceled: opts.canceled },
    status: {
      observedGeneration: opts.observedGeneration ?? generation,
      conditions: opts.condition ? [{ type: opts.condition, status: 'True' }] : [],
      consecutiveReconcileFailures: opts.failures ?? 0,
      fetch: opts.fetchAt ? { updatedAt: iso(opts.fetchAt) } : undefined,
      template: opts.templateAt ? { updatedAt: iso(opts.templateAt) } : undefined,
      deploy: opts.deployAt ? { updatedAt: iso(opts.deployAt) } : undefined,
    },
  };
}

const rand = (v: number) => () => v;

describe('syncPeriod', () => {
  it.each([
    // [spec.syncPeriod, config, expected ms]
    [undefined, {}, 30_000],
    ['1m', {}, 60_000],
    ['30s', {}, 30_000],
    ['10s', {}, 30_000],
    ['300ms', {}, 30_000],
    ['1h30m', {}, 5_400_000],
    ['1.5h', {}, 5_400_000],
    ['not-a-duration', {}, 30_000],
    [undefined, { appDefaultSyncPeriodMs: 80_000 }, 80_000],
    [undefined, { appDefaultSyncPeriodMs: 1_000 }, 30_000],
    ['45s', { appDefaultSyncPeriodMs: 80_000 }, 45_000],
    ['45s', { appMinimumSyncPeriodMs: 120_000 }, 120_000],
    ['5m', { appMinimumSyncPeriodMs: 120_000 }, 300_000],
    [undefined, { appDefaultSyncPeriodMs: 60_000, appMinimumSyncPeriodMs: 120_000 }, 120_000],
    ['10s', { appMinimumSyncPeriodMs: 10_000 }, 30_000],
  ] as const)('App spec=%s config=%j -> %d', (sp, config, expected) => {
    expect(syncPeriod(app({ syncPeriod: sp }), { config })).toBe(expected);
  });

  it.each([
    [undefined, 600_000],
    ['1m', 60_000],
    ['30s', 30_000],
    ['31s', 31_000],
    ['10s', 30_000],
    ['1h', 3_600_000],
  ] as const)('PackageRepository spec=%s -> %d', (sp, expected) => {
    // Controller config does not apply to PackageRepositories upstream.
    const config = { appDefaultSyncPeriodMs: 90_000, appMinimumSyncPeriodMs: 90_000 };
    expect(syncPeriod(app({ syncPeriod: sp }), { kind: 'PackageRepository', config })).toBe(expected);
  });
});

describe('controller config floors (pkg/config/config.go)', () => {
  it.each([
    [undefined, 30_000],
    [1_000, 30_000],
    [30_000, 30_000],
    [80_000, 80_000],
  ] as const)('appDefaultSyncPeriod(%s) = %d and appMinimumSyncPeriod alike', (v, expected) => {
    expect(appDefaultSyncPeriod({ appDefaultSyncPeriodMs: v })).toBe(expected);
    expect(appMinimumSyncPeriod({ appMinimumSyncPeriodMs: v })).toBe(expected);
  });

  it.each([
    [undefined, 600_000],
    [0, 600_000],
    [1_000, 30_000],
    [80_000, 80_000],
  ] as const)('packageInstallDefaultSyncPeriod(%s) = %d', (v, expected) => {
    expect(packageInstallDefaultSyncPeriod(v)).toBe(expected);
  });

  it('parses the config keys as Go durations, ignoring empty ones', () => {
    expect(
      parseControllerSyncConfig({
        appDefaultSyncPeriod: '1m20s',
        appMinimumSyncPeriod: '',
        packageInstallDefaultSyncPeriod: '10m',
      }),
    ).toEqual({ appDefaultSyncPeriodMs: 80_000, packageInstallDefaultSyncPeriodMs: 600_000 });
    expect(parseControllerSyncConfig({})).toEqual({});
  });

  it('reports an unparseable key with the upstream message and the parse error as cause', () => {
    let caught: unknown;
    try {
      parseControllerSyncConfig({ appMinimumSyncPeriod: '1d' });
    } catch (e) {
      caught = e;
    }
    expect((caught as Error).message).toBe(
      'Unmarshaling appMinimumSyncPeriod as duration: time: unknown unit "d" in duration "1d"',
    );
    expect((caught as Error).cause).toBeInstanceOf(Error);
  });
});

describe('failurePeriod', () => {
  // pkg/app/reconcile_timer_test.go TestFailedDurationUntilReady (syncPeriod 30s).
  it.each([
    [1, 2_000],
    [2, 4_000],
    [3, 8_000],
    [4, 16_000],
    [5, 30_000],
    [6, 30_000],
  ] as const)('%d failure(s) at syncPeriod 30s -> %dms', (n, expected) => {
    expect(failurePeriod(n, 30_000)).toBe(expected);
    const failed = app({ syncPeriod: '30s', condition: 'ReconcileFailed', failures: n });
    expect(durationUntilReady(failed, undefined, rand(0.99))).toBe(expected);
  });

  it.each([
    [0, 30_000],
    [-2, 30_000],
    [29, 600_000],
    [30, 600_000],
    [2700, 600_000],
    [9, 512_000],
    [10, 600_000],
  ] as const)('guards: n=%d at syncPeriod 10m -> %dms', (n, expected) => {
    const sp = n === 0 || n === -2 ? 30_000 : 600_000;
    expect(failurePeriod(n, sp)).toBe(expected);
  });

  it('TestFailureSyncMathOverflowGuard / TestConsecutiveFailuresOverflowGuard', () => {
    for (const failures of [2700, -2]) {
      const failed = app({ syncPeriod: '30s', condition: 'ReconcileFailed', failures });
      expect(durationUntilReady(failed, undefined, rand(0))).toBe(30_000);
    }
  });
});

describe('durationUntilReady', () => {
  it('TestSucceededDurationUntilReady: syncPeriod + [0, 5s) after success', () => {
    const ok = app({ syncPeriod: '1m', condition: 'ReconcileSucceeded' });
    expect(durationUntilReady(ok, undefined, rand(0))).toBe(60_000);
    expect(durationUntilReady(ok, undefined, rand(0.5))).toBe(62_500);
    expect(durationUntilReady(ok, undefined, rand(0.99999))).toBe(64_999);
  });

  it('uses the failure backoff for an infrastructure error even without a failed condition', () => {
    const ok = app({ syncPeriod: '1m', condition: 'ReconcileSucceeded', failures: 2 });
    expect(durationUntilReady(ok, new Error('status update failed'), rand(0.5))).toBe(4_000);
  });

  it('uses the failure backoff for DeleteFailed', () => {
    const failed = app({ syncPeriod: '1m', condition: 'DeleteFailed', failures: 3 });
    expect(durationUntilReady(failed, undefined, rand(0.5))).toBe(8_000);
  });

  it('PackageRepository defaults to 10m', () => {
    expect(durationUntilReady(app({}), undefined, rand(0), { kind: 'PackageRepository' })).toBe(600_000);
  });

  it('applyJitter truncates to whole milliseconds', () => {
    expect(applyJitter(30_000, rand(0.12345))).toBe(30_617);
    expect(APP_JITTER_MS).toBe(5_000);
  });
});

describe('lastReconcileTime', () => {
  it('is the latest of fetch, template and deploy updatedAt', () => {
    expect(lastReconcileTime(app({ fetchAt: at(0), templateAt: at(5_000), deployAt: at(3_000) }))).toEqual(at(5_000));
    expect(lastReconcileTime(app({ deployAt: at(7_000) }))).toEqual(at(7_000));
  });

  it('is undefined when nothing ran, or times are null or unparseable', () => {
    expect(lastReconcileTime(app({}))).toBeUndefined();
    expect(lastReconcileTime({ status: { fetch: { updatedAt: null } } })).toBeUndefined();
    expect(lastReconcileTime({ status: { fetch: { updatedAt: 'garbage' } } })).toBeUndefined();
    expect(lastReconcileTime({})).toBeUndefined();
  });
});

describe('isReadyAt', () => {
  it('TestSucceededIsReadyAt (syncPeriod 30s)', () => {
    const ok = app({ syncPeriod: '30s', condition: 'ReconcileSucceeded', fetchAt: T0 });
    expect(isReadyAt(ok, at(30_000))).toBe(true);
    expect(isReadyAt(ok, at(31_000))).toBe(true);
    expect(isReadyAt(ok, at(29_000))).toBe(false);
  });

  it('TestFailedIsReadyAt (syncPeriod 2s is floored to 30s; 1 failure backs off 2s)', () => {
    const failed = app({ syncPeriod: '2s', condition: 'ReconcileFailed', failures: 1, fetchAt: T0 });
    expect(isReadyAt(failed, at(2_000))).toBe(true);
    expect(isReadyAt(failed, at(3_000))).toBe(true);
    expect(isReadyAt(failed, at(1_000))).toBe(false);
  });

  it('TestIsReadyAtWithStaleDeployTime: the latest stage time counts', () => {
    const failed = app({
      syncPeriod: '2s',
      condition: 'ReconcileFailed',
      failures: 1,
      fetchAt: at(2_000),
      deployAt: T0,
    });
    expect(isReadyAt(failed, at(3_000))).toBe(false);
  });

  it.each([
    ['spec changed', app({ generation: 2, observedGeneration: 1, fetchAt: T0 }), true],
    ['spec changed while paused', app({ generation: 3, observedGeneration: 2, paused: true, fetchAt: T0 }), true],
    ['paused', app({ paused: true }), false],
    ['canceled', app({ canceled: true }), false],
    ['never reconciled', app({}), true],
    ['no status at all', { metadata: { generation: 1 } } as TimedObject, true],
    ['within syncPeriod', app({ fetchAt: at(-10_000) }), false],
    ['after syncPeriod', app({ fetchAt: at(-30_000) }), true],
    ['DeleteFailed after backoff', app({ condition: 'DeleteFailed', failures: 2, fetchAt: at(-4_000) }), true],
    ['DeleteFailed within backoff', app({ condition: 'DeleteFailed', failures: 2, fetchAt: at(-3_000) }), false],
  ] as const)('%s -> %s', (_name, obj, expected) => {
    expect(isReadyAt(obj, T0)).toBe(expected);
  });

  it('PackageRepository ignores canceled (it has no such field) but honours paused', () => {
    const canceled = app({ canceled: true, fetchAt: at(-600_000) });
    expect(isReadyAt(canceled, T0, { kind: 'PackageRepository' })).toBe(true);
    expect(isReadyAt(canceled, T0)).toBe(false);
    expect(isReadyAt(app({ paused: true }), T0, { kind: 'PackageRepository' })).toBe(false);
    expect(isReadyAt(app({ fetchAt: at(-599_000) }), T0, { kind: 'PackageRepository' })).toBe(false);
  });
});

describe('hasFailedCondition', () => {
  it.each([
    ['ReconcileFailed', true],
    ['DeleteFailed', true],
    ['ReconcileSucceeded', false],
    ['Reconciling', false],
    ['Deleting', false],
  ] as const)('%s -> %s', (type, expected) => {
    expect(hasFailedCondition(app({ condition: type }))).toBe(expected);
  });
});

describe('nextDueAt', () => {
  it('is now (or the epoch without now) when the spec changed or it never reconciled', () => {
    const changed = app({ generation: 2, observedGeneration: 1, fetchAt: T0 });
    expect(nextDueAt(changed, T0)).toEqual(T0);
    expect(nextDueAt(changed)).toEqual(new Date(0));
    expect(nextDueAt(app({}), T0)).toEqual(T0);
  });

  it('is null while paused or canceled', () => {
    expect(nextDueAt(app({ paused: true, fetchAt: T0 }), T0)).toBeNull();
    expect(nextDueAt(app({ canceled: true, fetchAt: T0 }), T0)).toBeNull();
    const canceled = app({ canceled: true, fetchAt: T0 });
    expect(nextDueAt(canceled, T0, { kind: 'PackageRepository', rand: rand(0) })).toEqual(at(600_000));
  });

  it('after a failure: last reconcile + 2^n s, no jitter', () => {
    const failed = app({ condition: 'ReconcileFailed', failures: 3, fetchAt: T0, deployAt: at(1_000) });
    expect(nextDueAt(failed, at(2_000), { rand: rand(0.9) })).toEqual(at(1_000 + 8_000));
  });

  it('after success: last reconcile + syncPeriod + injected jitter', () => {
    const ok = app({ syncPeriod: '1m', condition: 'ReconcileSucceeded', fetchAt: T0 });
    expect(nextDueAt(ok, T0, { rand: rand(0.5) })).toEqual(at(62_500));
    expect(nextDueAt(ok, T0, { rand: rand(0), config: { appMinimumSyncPeriodMs: 120_000 } })).toEqual(at(120_000));
  });

  it('default jitter is a stable function of the object, within [0, 5s)', () => {
    const a1 = app({ uid: 'uid-a', condition: 'ReconcileSucceeded', fetchAt: T0 });
    const b1 = app({ uid: 'uid-b', condition: 'ReconcileSucceeded', fetchAt: T0 });
    const first = nextDueAt(a1, T0);
    expect(nextDueAt(structuredClone(a1), at(12_345))).toEqual(first);
    const offsets = [first, nextDueAt(b1, T0)].map((d) => (d as Date).getTime() - T0.getTime() - 30_000);
    for (const o of offsets) {
      expect(o).toBeGreaterThanOrEqual(0);
      expect(o).toBeLessThan(5_000);
    }
    expect(offsets[0]).not.toBe(offsets[1]);
  });

  it('agrees with isReadyAt: not ready just before the due time, ready at it', () => {
    const cases = [
      app({ syncPeriod: '45s', condition: 'ReconcileSucceeded', fetchAt: T0 }),
      app({ condition: 'ReconcileFailed', failures: 4, fetchAt: T0 }),
      app({ condition: 'DeleteFailed', failures: 1, deployAt: T0 }),
    ];
    for (const obj of cases) {
      const due = nextDueAt(obj, T0, { rand: rand(0) }) as Date;
      expect(isReadyAt(obj, new Date(due.getTime() - 1))).toBe(false);
      expect(isReadyAt(obj, due)).toBe(true);
    }
  });
});

describe('with the API types', () => {
  it('accepts a parsed App and PackageRepository as they are', () => {
    const parsedApp = parseApp({
      apiVersion: 'kappctrl.k14s.io/v1alpha1',
      kind: 'App',
      metadata: { name: 'simple-app', namespace: 'default', uid: 'u', generation: 2 },
      spec: { syncPeriod: '2m', fetch: [], template: [], deploy: [] },
      status: {
        observedGeneration: 2,
        conditions: [{ type: 'ReconcileSucceeded', status: 'True' }],
        deploy: { finished: true, exitCode: 0, updatedAt: '2024-05-01T10:00:00Z' },
      },
    });
    if (!parsedApp.success) throw parsedApp.error;
    expect(nextDueAt(parsedApp.data, T0, { rand: rand(0) })).toEqual(at(120_000));

    const parsedRepo = parsePackageRepository({
      apiVersion: 'packaging.carvel.dev/v1alpha1',
      kind: 'PackageRepository',
      metadata: { name: 'repo', namespace: 'default', generation: 1 },
      spec: { fetch: { imgpkgBundle: { image: 'registry.local/repo:1.0.0' } } },
      status: { observedGeneration: 1, fetch: { exitCode: 0, updatedAt: '2024-05-01T10:00:00Z' } },
    });
    if (!parsedRepo.success) throw parsedRepo.error;
    expect(nextDueAt(parsedRepo.data, T0, { kind: 'PackageRepository', rand: rand(0) })).toEqual(at(600_000));
  });
});
