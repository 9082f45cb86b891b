/**
 * The forwarder's per-object `kappctrl_*` series (`events/forwarder/status-metrics.ts`): a status
 * sequence fed in gives the counters the embedded runtime's observer records for the same runs
 * (both registries compared line by line), the times from the stage times with upstream's
 * `firstReconcile` label, PackageInstalls counting attempts only, deleted objects' series
 * removed, the object bound, and the forwarder telling the observer what it watches.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { Forwarder } from '../../events/forwarder/forwarder.js';
import { watchedKinds } from '../../events/forwarder/kinds.js';
import { ReconcileSeries } from '../../events/forwarder/reconcile-series.js';
import { MAX_RUNS_PER_CHANGE, StatusMetrics } from '../../events/forwarder/status-metrics.js';
import { FakeObjectWatcher } from '../../events/forwarder/testing.js';
import type { Kind } from '../../events/schema.js';
import type { KubeObject } from '../../functions/lib/kube/port.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { PrometheusReconcileMetrics } from '../../functions/lib/observe/prometheus.js';
import { isFirstReconcile, reconcileObserver } from '../../functions/lib/observe/reconcile.js';
import {
  markDeleteFailed,
  markDeleting,
  markFailed,
  markReconciling,
  markSucceeded,
} from '../../functions/lib/reconcile/status.js';

const T0 = Date.parse('2025-01-01T00:00:00Z');
const iso = (ms: number) => new Date(ms).toISOString().replace(/\.\d{3}Z$/, 'Z');
type Status = Record<string, unknown>;
type Step = 'ok' | 'fail' | 'delete-fail';

function object(kind: Kind, name: string, status: Status | undefined, rv = 1): KubeObject {
  return {
    apiVersion: kind === 'App' ? 'kappctrl.k14s.io/v1alpha1' : 'packaging.carvel.dev/v1alpha1',
    kind,
    metadata: { name, namespace: 'ns', uid: `u-${name}`, resourceVersion: String(rv), generation: 1 },
    ...(status ? { status } : {}),
  };
}

/** The counter lines (`kappctrl_app_*`) of the embedded runtime's registry or the forwarder's store. */
async function counters(m: PrometheusReconcileMetrics | ReconcileSeries): Promise<string[]> {
  const text = m instanceof ReconcileSeries ? m.text() : await m.registry.metrics();
  return text.split('\n').filter((l) => l.startsWith('kappctrl_app_'));
}

/**
 * Runs `steps` of one object twice: through the embedded runtime's observer, and as the status
 * writes of the same runs fed to {@link StatusMetrics}. `seeStarts` false drops every
 * `Reconciling`/`Deleting` write (coalesced away before the forwarder saw it).
 */
async function bothWays(kind: Kind, steps: Step[], seeStarts = true) {
  const embedded = new PrometheusReconcileMetrics();
  const derived = new ReconcileSeries();
  const fromStatus = new StatusMetrics(derived, { clusterId: 'c1' });
  const log = memoryLogger();
  let status: Status | undefined;
  let rv = 1;
  let t = T0;
  const feed = (s: Status) => fromStatus.seen(kind, object(kind, 'a', s, ++rv));
  fromStatus.seen(kind, object(kind, 'a', undefined));
  const about = { clusterId: 'c1', kind, apiVersion: 'v', namespace: 'ns', name: 'a', uid: 'u-a' };
  for (const step of steps) {
    const o = reconcileObserver({ metrics: embedded, log }, about, isFirstReconcile(status as never));
    o.init();
    if (step === 'delete-fail') {
      o.deleting();
      status = markDeleting(status as never, 1);
      if (seeStarts) feed(status);
      await o.deleteCompleted('kapp: Error');
      status = markDeleteFailed(status as never, 'kapp: Error');
      feed(status);
      continue;
    }
    await o.started({ event: false });
    const started = t;
    status = { ...(markReconciling(status as never, 1) as Status), fetch: { startedAt: iso(started) } };
    if (seeStarts) feed(status);
    t += 10_000;
    const times = {
      fetch: { startedAt: iso(started), updatedAt: iso(started + 1000), exitCode: 0 },
      template: { updatedAt: iso(started + 3000), exitCode: 0 },
      deploy: { startedAt: iso(started + 3000), updatedAt: iso(started + 7000), exitCode: 0 },
    };
    o.phase('fetch', 1);
    o.phase('template', 2);
    o.phase('deploy', 4);
    await o.completed(step === 'ok' ? {} : { error: 'Deploying: Error' }, 7);
    const final: Status =
      step === 'ok' ? markSucceeded(status as Status) : markFailed(status as Status, 'Deploying: Error');
    status = { ...final, ...times };
    feed(status);
  }
  return { embedded, derived, fromStatus };
}

describe('StatusMetrics: counters as the embedded runtime records them', () => {
  const sequences: Array<[string, Kind, Step[], boolean]> = [
    ['App successes and failures', 'App', ['ok', 'ok', 'fail', 'fail', 'fail', 'ok', 'fail', 'ok', 'ok'], true],
    ['App with every start coalesced away', 'App', ['ok', 'fail', 'fail', 'ok', 'ok'], false],
    ['App whose delete fails twice', 'App', ['ok', 'fail', 'delete-fail', 'delete-fail'], true],
    ['App delete failures with the starts unseen', 'App', ['ok', 'delete-fail', 'delete-fail'], false],
    ['PackageRepository', 'PackageRepository', ['fail', 'ok', 'ok', 'fail'], true],
    ['PackageInstall (attempts only)', 'PackageInstall', ['ok', 'fail', 'ok'], true],
  ];
  for (const [title, kind, steps, seeStarts] of sequences) {
    it(title, async () => {
      const { embedded, derived } = await bothWays(kind, steps, seeStarts);
      const want = await counters(embedded);
      expect(want.length).toBe(5);
      expect(await counters(derived)).toEqual(want);
    });
  }

  it("writes prom-client's text: the same HELP, TYPE and series lines as the embedded runtime's registry", async () => {
    const embedded = new PrometheusReconcileMetrics();
    const series = new ReconcileSeries();
    const empty = await embedded.registry.metrics();
    expect(series.text()).toBe(empty);
    for (const sink of [embedded, series]) {
      const t = { clusterId: 'c1', controller: 'pkgr' as const, namespace: 'n"s', name: 'a\\b' };
      sink.init(t);
      sink.count(t, 'attempt');
      sink.count(t, 'deleteFailed');
      sink.time(t, 'fetch', true, 0.5);
      sink.time(t, 'overall', false, 12);
      sink.init({ ...t, controller: 'app', name: 'b' });
    }
    expect(series.text()).toBe(await embedded.registry.metrics());
  });

  it('counts the run of a status first seen in flight, and nothing for a status seen again', async () => {
    const derived = new ReconcileSeries();
    const s = new StatusMetrics(derived, { clusterId: 'c1' });
    const reconciling = markReconciling(markSucceeded({}), 1);
    s.seen('App', object('App', 'a', reconciling));
    s.seen('App', object('App', 'a', { ...reconciling, friendlyDescription: 'still' }, 2));
    s.seen('App', object('App', 'a', markSucceeded(reconciling), 3));
    const text = (await counters(derived)).join('\n');
    expect(text).toContain('kappctrl_app_reconcile_attempt_total{controller="app",name="a",namespace="ns"} 1');
    expect(text).toContain('kappctrl_app_reconcile_success_total{controller="app",name="a",namespace="ns"} 1');
  });
});

describe('StatusMetrics: times, removal and bound', () => {
  it('sets the times from the stage times, firstReconcile true until an outcome was seen', async () => {
    const { derived } = await bothWays('App', ['ok', 'fail']);
    const text = derived.text();
    const l = (first: boolean) => `controller="app",name="a",namespace="ns",firstReconcile="${first}"`;
    expect(text).toContain(`kappctrl_reconcile_time_seconds{${l(true)}} 7`);
    expect(text).toContain(`kappctrl_reconcile_fetch_time_seconds{${l(true)}} 1`);
    expect(text).toContain(`kappctrl_reconcile_template_time_seconds{${l(true)}} 2`);
    expect(text).toContain(`kappctrl_reconcile_deploy_time_seconds{${l(true)}} 4`);
    expect(text).toContain(`kappctrl_reconcile_time_seconds{${l(false)}} 7`);
  });

  it('skips the stages an earlier run left (a run that failed in fetch has no template or deploy time)', async () => {
    const derived = new ReconcileSeries();
    const s = new StatusMetrics(derived, { clusterId: 'c1' });
    const old = {
      template: { updatedAt: iso(T0 - 60_000) },
      deploy: { startedAt: iso(T0 - 60_000), updatedAt: iso(T0 - 50_000) },
    };
    s.seen('App', object('App', 'a', undefined));
    s.seen(
      'App',
      object(
        'App',
        'a',
        { ...markFailed({}, 'Fetching: Error'), ...old, fetch: { startedAt: iso(T0), updatedAt: iso(T0 + 2000) } },
        2,
      ),
    );
    const text = derived.text();
    expect(text).toContain(
      'kappctrl_reconcile_fetch_time_seconds{controller="app",name="a",namespace="ns",firstReconcile="true"} 2',
    );
    expect(text).toContain(
      'kappctrl_reconcile_time_seconds{controller="app",name="a",namespace="ns",firstReconcile="true"} 2',
    );
    expect(text).not.toMatch(/kappctrl_reconcile_(template|deploy)_time_seconds\{/);
  });

  it('removes every series of an object that is gone, and of all on reset', async () => {
    const { derived, fromStatus } = await bothWays('App', ['ok', 'fail']);
    fromStatus.seen('App', object('App', 'b', markSucceeded({})));
    fromStatus.gone('App', 'ns', 'a');
    const text = derived.text();
    expect(text).not.toContain('name="a"');
    expect(text).toContain('kappctrl_app_reconcile_attempt_total{controller="app",name="b",namespace="ns"} 0');
    expect(fromStatus.objects).toBe(1);
    fromStatus.reset();
    expect(derived.text()).not.toMatch(/^kappctrl_\w+\{/m);
    expect(fromStatus.objects).toBe(0);
  });

  it('keeps series for at most maxObjects objects; one seen beyond gets them once another goes', async () => {
    const derived = new ReconcileSeries();
    const s = new StatusMetrics(derived, { clusterId: 'c1', maxObjects: 2 });
    for (const n of ['a', 'b', 'c']) s.seen('App', object('App', n, undefined));
    expect([s.objects, s.skipped]).toEqual([2, 1]);
    expect(derived.text()).not.toContain('name="c"');
    s.gone('App', 'ns', 'a');
    s.seen('App', object('App', 'c', markReconciling({}, 1), 2));
    expect([s.objects, s.skipped]).toEqual([2, 0]);
    expect(derived.text()).toContain(
      'kappctrl_app_reconcile_attempt_total{controller="app",name="c",namespace="ns"} 1',
    );
  });
});

describe('Forwarder: statusObserver', () => {
  const APP = { apiVersion: 'kappctrl.k14s.io/v1alpha1', kind: 'App' };
  let fwd: Forwarder | undefined;
  beforeEach(() => {
    vi.useFakeTimers({ now: T0 });
  });
  afterEach(async () => {
    await fwd?.stop();
    fwd = undefined;
    vi.useRealTimers();
  });

  it('is told each new resourceVersion of a watched object and when the object goes', async () => {
    const watcher = new FakeObjectWatcher();
    const derived = new ReconcileSeries();
    const observer = new StatusMetrics(derived, { clusterId: 'c1' });
    fwd = new Forwarder({
      clusterId: 'c1',
      watcher,
      transport: { send: async () => {} },
      kinds: watchedKinds(['App', 'PackageInstall']),
      statusObserver: observer,
    });
    fwd.start();
    await vi.advanceTimersByTimeAsync(250);
    const base = object('App', 'a', undefined);
    watcher.apply({ ...base, spec: { fetch: [], template: [], deploy: [] } });
    await vi.advanceTimersByTimeAsync(250);
    watcher.apply({ ...base, spec: { fetch: [], template: [], deploy: [] }, status: markReconciling({}, 1) });
    await vi.advanceTimersByTimeAsync(250);
    const line = 'kappctrl_app_reconcile_attempt_total{controller="app",name="a",namespace="ns"} 1';
    expect(derived.text()).toContain(line);
    watcher.remove(APP, 'ns', 'a');
    await vi.advanceTimersByTimeAsync(250);
    expect(derived.text()).not.toContain('name="a"');
    expect(observer.objects).toBe(0);
  });
});

describe('hostile counters', () => {
  it('counts at most MAX_RUNS_PER_CHANGE runs per change, and nothing for a counter that is not a safe integer', async () => {
    const derived = new ReconcileSeries();
    const m = new StatusMetrics(derived, { clusterId: 'c1' });
    const ok = (n: unknown, f = 0) => ({
      conditions: [{ type: 'ReconcileSucceeded', status: 'True' }],
      consecutiveReconcileSuccesses: n,
      consecutiveReconcileFailures: f,
    });
    m.seen('App', object('App', 'a', ok(0, 1), 1));
    // a tenant's status write of 2^53 - 1 successes: counted as MAX_RUNS_PER_CHANGE, at once
    m.seen('App', object('App', 'a', ok(Number.MAX_SAFE_INTEGER), 2));
    const success = () =>
      derived
        .text()
        .split('\n')
        .find((l) => l.startsWith('kappctrl_app_reconcile_success_total{'));
    expect(success()).toMatch(new RegExp(` ${MAX_RUNS_PER_CHANGE}$`));
    m.seen('App', object('App', 'a', ok(1e300, 1), 3));
    m.seen('App', object('App', 'a', ok('7'), 4));
    expect(success()).toMatch(new RegExp(` ${MAX_RUNS_PER_CHANGE}$`));
  });
});
