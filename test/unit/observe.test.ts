/**
 * Reconcile metrics and Events (`functions/lib/observe/`, `functions/lib/kube/events.ts`):
 * upstream's series names and labels in the Prometheus text, the EMF line CloudWatch reads, the
 * Event recorder's aggregation, suppression, per-object bound and redaction, and the Event
 * write's create-or-bump against a fake API answer.
 */
import { describe, expect, it } from 'vitest';
import { writeCoreEvent } from '../../functions/lib/kube/events.js';
import type { EventWriter, NewEvent } from '../../functions/lib/kube/port.js';
import type { RestRequest, RestResponse } from '../../functions/lib/kube/transport.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { MAX_EVENT_MESSAGE_CHARS, ReconcileEventRecorder } from '../../functions/lib/observe/events.js';
import {
  CONTROLLER_TYPE,
  COUNT_METRICS,
  EmfReconcileMetrics,
  TIME_METRICS,
} from '../../functions/lib/observe/metrics.js';
import { PrometheusReconcileMetrics } from '../../functions/lib/observe/prometheus.js';
import { isFirstReconcile, reconcileObserver } from '../../functions/lib/observe/reconcile.js';
import { eventErrorText } from '../../functions/lib/pipeline/report.js';
import { MASKED, SecretMask } from '../../functions/lib/reconcile/secret-mask.js';

const APP = {
  clusterId: 'c1',
  kind: 'App' as const,
  apiVersion: 'kappctrl.k14s.io/v1alpha1',
  namespace: 'ns',
  name: 'simple-app',
  uid: 'u-1',
};

/** An EventWriter keeping what it was asked to write. */
function recordingWriter(fail = false): EventWriter & { events: NewEvent[] } {
  const events: NewEvent[] = [];
  return {
    events,
    async writeEvent(e) {
      events.push(e);
      if (fail) throw new Error('forbidden');
      return 'created';
    },
  };
}

describe('PrometheusReconcileMetrics', () => {
  it('exposes upstream series with controller/name/namespace and firstReconcile labels', async () => {
    const metrics = new PrometheusReconcileMetrics();
    const log = memoryLogger();
    const o = reconcileObserver({ metrics, log }, APP, true);
    o.init();
    await o.started();
    o.phase('fetch', 0.5);
    o.phase('template', 0.25);
    o.phase('deploy', 2);
    await o.completed({}, 3);
    const text = await metrics.registry.metrics();
    const labels = 'controller="app",name="simple-app",namespace="ns"';
    expect(text).toContain(`kappctrl_app_reconcile_attempt_total{${labels}} 1`);
    expect(text).toContain(`kappctrl_app_reconcile_success_total{${labels}} 1`);
    expect(text).toContain(`kappctrl_app_reconcile_failure_total{${labels}} 0`);
    expect(text).toContain(`kappctrl_app_reconcile_delete_attempt_total{${labels}} 0`);
    expect(text).toContain(`kappctrl_app_reconcile_delete_failed_total{${labels}} 0`);
    expect(text).toContain(`kappctrl_reconcile_time_seconds{${labels},firstReconcile="true"} 3`);
    expect(text).toContain(`kappctrl_reconcile_fetch_time_seconds{${labels},firstReconcile="true"} 0.5`);
    expect(text).toContain(`kappctrl_reconcile_template_time_seconds{${labels},firstReconcile="true"} 0.25`);
    expect(text).toContain(`kappctrl_reconcile_deploy_time_seconds{${labels},firstReconcile="true"} 2`);
    expect(text).toContain('# HELP kappctrl_app_reconcile_attempt_total Total number of attempted reconciles');
  });

  it('counts a failure, drops the counters after a successful delete, and counts only attempts of a PackageInstall', async () => {
    const metrics = new PrometheusReconcileMetrics();
    const log = memoryLogger();
    const app = reconcileObserver({ metrics, log }, APP, false);
    await app.started();
    await app.completed({ error: 'Fetching resources: boom' }, 1);
    let text = await metrics.registry.metrics();
    expect(text).toContain('kappctrl_app_reconcile_failure_total{controller="app",name="simple-app",namespace="ns"} 1');
    app.deleting();
    await app.deleteCompleted(undefined);
    text = await metrics.registry.metrics();
    expect(text).not.toContain('kappctrl_app_reconcile_attempt_total{controller="app"');

    const pkgi = reconcileObserver({ metrics, log }, { ...APP, kind: 'PackageInstall', uid: 'u-2' }, false);
    pkgi.init();
    await pkgi.started();
    await pkgi.completed({ error: 'x' }, 2);
    text = await metrics.registry.metrics();
    const l = 'controller="pkgi",name="simple-app",namespace="ns"';
    expect(text).toContain(`kappctrl_app_reconcile_attempt_total{${l}} 1`);
    expect(text).toContain(`kappctrl_app_reconcile_failure_total{${l}} 0`);
    expect(text).toContain(`kappctrl_reconcile_time_seconds{${l},firstReconcile="false"} 2`);
  });

  it('adds a cluster label when asked (a runtime serving several clusters)', async () => {
    const metrics = new PrometheusReconcileMetrics({ clusterLabel: true });
    metrics.count({ clusterId: 'c2', controller: 'pkgr', namespace: 'ns', name: 'repo' }, 'attempt');
    expect(await metrics.registry.metrics()).toContain(
      'kappctrl_app_reconcile_attempt_total{cluster="c2",controller="pkgr",name="repo",namespace="ns"} 1',
    );
  });
});

describe("kapp-controller v0.53.1's series and label values", () => {
  // Upstream pkg/metrics (reconcile_count_metrics.go, reconcile_time_metrics.go) and the values
  // its controllers pass (PR #1415's appResourceType, packageInstallType, pkgrResourceType, whose
  // /metrics output reads controller="app" and controller="pkgr"): dashboards select on these.
  const COUNTERS = [
    'kappctrl_app_reconcile_attempt_total',
    'kappctrl_app_reconcile_success_total',
    'kappctrl_app_reconcile_failure_total',
    'kappctrl_app_reconcile_delete_attempt_total',
    'kappctrl_app_reconcile_delete_failed_total',
  ];
  const GAUGES = [
    'kappctrl_reconcile_time_seconds',
    'kappctrl_reconcile_fetch_time_seconds',
    'kappctrl_reconcile_template_time_seconds',
    'kappctrl_reconcile_deploy_time_seconds',
  ];

  it('names each kind app, pkgi or pkgr in the controller label, in the Prometheus text and the EMF line', async () => {
    expect(CONTROLLER_TYPE).toEqual({ App: 'app', PackageInstall: 'pkgi', PackageRepository: 'pkgr' });
    const metrics = new PrometheusReconcileMetrics();
    const lines: string[] = [];
    const emf = new EmfReconcileMetrics({ write: (l) => lines.push(l) });
    for (const kind of ['App', 'PackageInstall', 'PackageRepository'] as const) {
      for (const sink of [metrics, emf])
        await reconcileObserver({ metrics: sink, log: memoryLogger() }, { ...APP, kind }, true).started();
    }
    const text = await metrics.registry.metrics();
    for (const value of ['app', 'pkgi', 'pkgr']) {
      expect(text).toContain(
        `kappctrl_app_reconcile_attempt_total{controller="${value}",name="simple-app",namespace="ns"} 1`,
      );
    }
    expect(lines.map((l) => JSON.parse(l).controller)).toEqual(['app', 'pkgi', 'pkgr']);
  });

  it('declares exactly the nine series with their upstream types and label names', async () => {
    expect(Object.values(COUNT_METRICS).map((m) => m.name)).toEqual(COUNTERS);
    expect(Object.values(TIME_METRICS).map((m) => m.name)).toEqual(GAUGES);
    const metrics = new PrometheusReconcileMetrics();
    const target = { clusterId: 'c1', controller: 'app' as const, namespace: 'ns', name: 'a' };
    metrics.init(target);
    for (const phase of ['overall', 'fetch', 'template', 'deploy'] as const) metrics.time(target, phase, false, 1);
    const text = await metrics.registry.metrics();
    const types = [...text.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map(([, name, type]) => `${name} ${type}`);
    expect(types).toEqual([...COUNTERS.map((n) => `${n} counter`), ...GAUGES.map((n) => `${n} gauge`)]);
    const labels = [...text.matchAll(/^(kappctrl_\w+)\{([^}]*)\}/gm)].map(([, name, l]) => [
      name,
      (l ?? '').split(',').map((kv) => kv.split('=')[0]),
    ]);
    expect(labels).toEqual([
      ...COUNTERS.map((n) => [n, ['controller', 'name', 'namespace']]),
      ...GAUGES.map((n) => [n, ['controller', 'name', 'namespace', 'firstReconcile']]),
    ]);
  });
});

describe('EmfReconcileMetrics', () => {
  it('writes one EMF line per observation with a clusterId dimension', () => {
    const lines: string[] = [];
    const emf = new EmfReconcileMetrics({ write: (l) => lines.push(l), now: () => 1_700_000_000_000 });
    const target = { clusterId: 'c1', controller: 'app' as const, namespace: 'ns', name: 'a' };
    emf.init();
    emf.count(target, 'attempt');
    emf.time(target, 'deploy', true, 1.5);
    expect(lines).toHaveLength(2);
    const [count, time] = lines.map((l) => JSON.parse(l));
    expect(count).toEqual({
      _aws: {
        Timestamp: 1_700_000_000_000,
        CloudWatchMetrics: [
          {
            Namespace: 'kapp-lambda',
            Dimensions: [['clusterId', 'controller']],
            Metrics: [{ Name: 'kappctrl_app_reconcile_attempt_total', Unit: 'Count' }],
          },
        ],
      },
      clusterId: 'c1',
      controller: 'app',
      namespace: 'ns',
      name: 'a',
      kappctrl_app_reconcile_attempt_total: 1,
    });
    expect(time.kappctrl_reconcile_deploy_time_seconds).toBe(1.5);
    expect(time.firstReconcile).toBe('true');
  });

  it('adds the per-object dimension set when asked', () => {
    const lines: string[] = [];
    const emf = new EmfReconcileMetrics({ write: (l) => lines.push(l), perObject: true });
    emf.time({ clusterId: 'c1', controller: 'app', namespace: 'ns', name: 'a' }, 'overall', false, 2);
    expect(JSON.parse(lines[0] ?? '{}')._aws.CloudWatchMetrics[0].Dimensions).toEqual([
      ['clusterId', 'controller'],
      ['clusterId', 'controller', 'namespace', 'name', 'firstReconcile'],
    ]);
  });
});

describe('a resync that changed nothing', () => {
  it('counts its attempt and success but writes no Event; a resync that fails or changes still does', async () => {
    const metrics = new PrometheusReconcileMetrics();
    const recorder = new ReconcileEventRecorder({ now: () => 0, repeatIntervalMs: 1 });
    const writer = recordingWriter();
    const log = memoryLogger();
    const o = reconcileObserver({ metrics, events: recorder, eventWriter: () => writer, log }, APP, false);
    o.init();
    await o.started({ event: false });
    await o.completed({ unchanged: true }, 1);
    expect(writer.events).toEqual([]);
    const text = await metrics.registry.metrics();
    const labels = 'controller="app",name="simple-app",namespace="ns"';
    expect(text).toContain(`kappctrl_app_reconcile_attempt_total{${labels}} 1`);
    expect(text).toContain(`kappctrl_app_reconcile_success_total{${labels}} 1`);
    // A resync that wrote status (drift reverted) or failed ends in its Event.
    await o.started({ event: false });
    await o.completed({}, 1);
    await o.started({ event: false });
    await o.completed({ error: 'Deploying: boom' }, 1);
    expect(writer.events.map((e) => e.reason)).toEqual(['ReconcileSucceeded', 'ReconcileFailed']);
  });
});

describe('ReconcileEventRecorder', () => {
  it('writes Started and Succeeded, suppresses repeats within the interval, and writes again after it', async () => {
    let now = 0;
    const recorder = new ReconcileEventRecorder({ now: () => now, repeatIntervalMs: 1000 });
    const writer = recordingWriter();
    const log = memoryLogger();
    const o = reconcileObserver({ events: recorder, eventWriter: () => writer, log }, APP, true);
    await o.started();
    await o.completed({}, 1);
    await o.started();
    await o.completed({}, 1);
    expect(writer.events.map((e) => [e.reason, e.type, e.message])).toEqual([
      ['ReconcileStarted', 'Normal', 'Reconcile started'],
      ['ReconcileSucceeded', 'Normal', 'Reconcile succeeded'],
    ]);
    expect(writer.events[0]?.involvedObject).toEqual({
      apiVersion: APP.apiVersion,
      kind: 'App',
      namespace: 'ns',
      name: 'simple-app',
      uid: 'u-1',
    });
    now = 1000;
    await o.started();
    expect(writer.events).toHaveLength(3);
    // The same Event name: the API adds to its count.
    expect(writer.events[2]?.name).toBe(writer.events[0]?.name);
  });

  it('writes a failure at once, as a Warning with the bounded message', async () => {
    const recorder = new ReconcileEventRecorder();
    const writer = recordingWriter();
    const o = reconcileObserver({ events: recorder, eventWriter: () => writer, log: memoryLogger() }, APP, false);
    await o.completed({ error: `Deploying: ${'x'.repeat(5000)}` }, 1);
    const e = writer.events[0];
    expect(e?.reason).toBe('ReconcileFailed');
    expect(e?.type).toBe('Warning');
    expect([...(e?.message ?? '')].length).toBe(MAX_EVENT_MESSAGE_CHARS);
    expect(e?.message.startsWith('Reconcile failed: Deploying: ')).toBe(true);
  });

  it('bounds distinct Events per object (a crash loop with changing messages) and refills slowly', async () => {
    let now = 0;
    const recorder = new ReconcileEventRecorder({ now: () => now, burst: 3, refillMs: 300_000 });
    const writer = recordingWriter();
    const log = memoryLogger();
    const results: string[] = [];
    for (let i = 0; i < 10; i++)
      results.push(await recorder.record(writer, APP, 'ReconcileFailed', `attempt ${i}`, log));
    expect(results.filter((r) => r === 'written')).toHaveLength(3);
    expect(writer.events).toHaveLength(3);
    now = 300_000;
    expect(await recorder.record(writer, APP, 'ReconcileFailed', 'attempt 10', log)).toBe('written');
    expect(await recorder.record(writer, APP, 'ReconcileFailed', 'attempt 11', log)).toBe('suppressed');
    // Another object has its own bucket.
    expect(await recorder.record(writer, { ...APP, uid: 'u-9' }, 'ReconcileFailed', 'attempt 0', log)).toBe('written');
  });

  it('logs and drops a refused write, and tries again on the next occurrence', async () => {
    const recorder = new ReconcileEventRecorder();
    const writer = recordingWriter(true);
    const log = memoryLogger();
    expect(await recorder.record(writer, APP, 'ReconcileStarted', 'Reconcile started', log)).toBe('failed');
    expect(log.records.some((r) => r.msg === 'event not written' && r.obj.err === 'forbidden')).toBe(true);
    expect(await recorder.record(writer, APP, 'ReconcileStarted', 'Reconcile started', log)).toBe('failed');
    expect(writer.events).toHaveLength(2);
    // No writer (a registry without one): nothing, no error.
    expect(await recorder.record(undefined, APP, 'ReconcileStarted', 'Reconcile started', log)).toBe('skipped');
  });
});

describe('writeCoreEvent', () => {
  const event: NewEvent = {
    name: 'simple-app.0123456789abcdef',
    involvedObject: {
      apiVersion: 'kappctrl.k14s.io/v1alpha1',
      kind: 'App',
      namespace: 'ns',
      name: 'simple-app',
      uid: 'u',
    },
    type: 'Normal',
    reason: 'ReconcileSucceeded',
    message: 'Reconcile succeeded',
    component: 'kapp-lambda',
    at: new Date('2026-01-02T03:04:05.678Z'),
  };
  const fail = (action: string, r: RestResponse) => new Error(`${action}: ${r.statusCode}`);

  it('creates a new Event with count 1', async () => {
    const sent: RestRequest[] = [];
    const send = async (_a: string, r: RestRequest): Promise<RestResponse> => {
      sent.push(r);
      return { statusCode: 201, body: {} };
    };
    expect(await writeCoreEvent(send, fail, event)).toBe('created');
    expect(sent).toHaveLength(1);
    expect(sent[0]?.path).toBe('/api/v1/namespaces/ns/events');
    expect(sent[0]?.body).toMatchObject({
      metadata: { name: event.name, namespace: 'ns' },
      count: 1,
      firstTimestamp: '2026-01-02T03:04:05Z',
      source: { component: 'kapp-lambda' },
    });
  });

  it('adds to the count of an existing Event, fenced by its resourceVersion', async () => {
    const sent: RestRequest[] = [];
    const answers: RestResponse[] = [
      { statusCode: 409, body: { reason: 'AlreadyExists' } },
      { statusCode: 200, body: { count: 4, metadata: { resourceVersion: '77' } } },
      { statusCode: 200, body: {} },
    ];
    const send = async (_a: string, r: RestRequest): Promise<RestResponse> => {
      sent.push(r);
      return answers.shift() as RestResponse;
    };
    expect(await writeCoreEvent(send, fail, event)).toBe('updated');
    expect(sent.map((r) => r.method)).toEqual(['POST', 'GET', 'PATCH']);
    expect(sent[2]?.body).toEqual({
      metadata: { resourceVersion: '77' },
      count: 5,
      lastTimestamp: '2026-01-02T03:04:05Z',
      message: 'Reconcile succeeded',
    });
  });

  it('throws the mapped error when the API refuses', async () => {
    const send = async (): Promise<RestResponse> => ({ statusCode: 403, body: {} });
    await expect(writeCoreEvent(send, fail, event)).rejects.toThrow(
      'writing Event ns/simple-app.0123456789abcdef: 403',
    );
  });
});

describe('isFirstReconcile', () => {
  it('is true until a reconcile finished (counters or an outcome condition)', () => {
    expect(isFirstReconcile(undefined)).toBe(true);
    expect(isFirstReconcile({ conditions: [{ type: 'Reconciling' }] })).toBe(true);
    expect(isFirstReconcile({ consecutiveReconcileFailures: 1 })).toBe(false);
    expect(isFirstReconcile({ conditions: [{ type: 'ReconcileSucceeded' }] })).toBe(false);
  });
});

describe('eventErrorText', () => {
  const mask = new SecretMask();
  mask.addValue('hunter2-swordfish');

  it("is the failing tool's stderr (usefulErrorMessage), redacted, without its final newline", () => {
    const text = eventErrorText(
      {
        error: 'Templating dir: Error (see .status.usefulErrorMessage for details)',
        stderr: 'ytt: Error: pw hunter2-swordfish\n',
      },
      mask,
    );
    expect(text).toBe(`ytt: Error: pw ${MASKED}`);
  });

  it('is the stage error when the tool wrote no stderr', () => {
    expect(eventErrorText({ error: 'Fetching resources: timed out', stderr: '' }, mask)).toBe(
      'Fetching resources: timed out',
    );
  });
});
