/**
 * e2e (issue 12 item 3): what operators read, on the real control plane. An embedded runtime with
 * its `/metrics` server on 127.0.0.1 port 0 (the port read back, as `npm start` prints it)
 * reconciles one good App (inline ytt) and one failing App (a ytt `fail()` with a long message);
 * the real API server then holds each App's core/v1 Events (reason, type, involvedObject, a
 * bounded message, `count` bumped by a later process), and `/metrics` shows kapp-controller's
 * series (reference §3.14: counters and time gauges, labels `controller`/`name`/`namespace` and
 * `firstReconcile`, `controller="app"` as upstream's `appResourceType`) for both Apps.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type MetricsServer, startMetricsServer } from '../../functions/embedded/metrics-server.js';
import { EVENT_COMPONENT, MAX_EVENT_MESSAGE_CHARS } from '../../functions/lib/observe/events.js';
import {
  type AppObject,
  apply,
  appManifest,
  expectSucceeded,
  getApp,
  inlineConfigMapApp,
  k,
  RFC3339,
  suffix,
  useE2ERuntime,
} from './support.js';

const id = suffix();
const NS = `e2e-observe-${id}`;
const GOOD = `good-${id}`;
const BAD = `bad-${id}`;

const rt = useE2ERuntime([NS]);

let metricsServer: MetricsServer;
beforeAll(async () => {
  metricsServer = await startMetricsServer(rt.runtime.metrics.registry, '127.0.0.1:0');
});
afterAll(async () => {
  await metricsServer?.close();
});

/** A core/v1 Event as the API server returns it. */
interface CoreEvent {
  metadata: { name: string; namespace: string };
  involvedObject: { apiVersion: string; kind: string; namespace: string; name: string; uid: string };
  reason: string;
  type: string;
  message: string;
  count: number;
  source: { component: string };
  firstTimestamp: string;
  lastTimestamp: string;
}

/** The Events about the object of `uid` in {@link NS}, read from the API server. */
async function eventsOf(uid: string): Promise<CoreEvent[]> {
  const r = await k(['get', 'events', '-n', NS, '--field-selector', `involvedObject.uid=${uid}`, '-o', 'json']);
  return (JSON.parse(r.stdout) as { items: CoreEvent[] }).items;
}

/** The Event of `reason` about `app` (exactly one). */
async function eventOf(app: AppObject, reason: string): Promise<CoreEvent> {
  const events = (await eventsOf(app.metadata.uid)).filter((e) => e.reason === reason);
  expect(events, `${reason} Events of ${app.metadata.name}`).toHaveLength(1);
  return events[0] as CoreEvent;
}

/** `GET /metrics` of the runtime's server. */
async function scrape(path = '/metrics'): Promise<Response> {
  return await fetch(`http://127.0.0.1:${metricsServer.address.port}${path}`);
}

/** The samples of `text` for one App: `series{firstReconcile}` → value (labels checked exactly). */
function samplesOf(text: string, name: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    const m = /^(kappctrl_\w+)\{([^}]*)\} (\S+)$/.exec(line);
    if (!m) continue;
    const labels = Object.fromEntries([...(m[2] as string).matchAll(/(\w+)="([^"]*)"/g)].map((l) => [l[1], l[2]]));
    if (labels.name !== name) continue;
    const { firstReconcile, ...rest } = labels;
    expect(rest, line).toEqual({ controller: 'app', name, namespace: NS });
    out.set(firstReconcile === undefined ? (m[1] as string) : `${m[1]}{${firstReconcile}}`, Number(m[3]));
  }
  return out;
}

/** Waits until the App failed at least `n` consecutive times. */
async function failedTimes(name: string, n: number): Promise<AppObject> {
  return await rt.waitForApp(
    NS,
    name,
    (a) => (a.status?.consecutiveReconcileFailures ?? 0) >= n && a.status?.observedGeneration === a.metadata.generation,
    `ReconcileFailed ${n} times`,
  );
}

const FAIL_TEXT = 'x'.repeat(3000);

describe.sequential('reconcile Events and /metrics', () => {
  let good: AppObject;
  let bad: AppObject;

  beforeAll(async () => {
    await apply(
      inlineConfigMapApp(NS, GOOD, 'hello'),
      appManifest(NS, BAD, {
        fetch: [{ inline: { paths: { 'config.yml': `#@ fail("BEGIN-OF-FAIL ${FAIL_TEXT} END-OF-FAIL")\n` } } }],
        template: [{ ytt: {} }],
        deploy: [{ kapp: {} }],
      }),
    );
    good = await rt.waitReconciled(NS, GOOD);
    // Two runs: the retry's identical Events are not written again by the same process.
    bad = await failedTimes(BAD, 2);
  });

  it('the good App has ReconcileStarted and ReconcileSucceeded (Normal) on it', async () => {
    await expectSucceeded(good);
    const uid = good.metadata.uid;
    const involvedObject = { apiVersion: 'kappctrl.k14s.io/v1alpha1', kind: 'App', namespace: NS, name: GOOD, uid };
    const events = await eventsOf(uid);
    expect(events.map((e) => e.reason).sort()).toEqual(['ReconcileStarted', 'ReconcileSucceeded']);
    for (const e of events) {
      expect(e.type).toBe('Normal');
      expect(e.involvedObject).toMatchObject(involvedObject);
      expect(e.source).toEqual({ component: EVENT_COMPONENT });
      expect(e.count).toBe(1);
      expect(e.firstTimestamp).toMatch(RFC3339);
      expect(e.lastTimestamp).toBe(e.firstTimestamp);
      expect(e.metadata.name).toMatch(new RegExp(`^${GOOD}\\.[0-9a-f]{16}$`));
    }
    expect((await eventOf(good, 'ReconcileStarted')).message).toBe('Reconcile started');
    expect((await eventOf(good, 'ReconcileSucceeded')).message).toBe('Reconcile succeeded');
  });

  it('the failing App has one ReconcileFailed Warning with the bounded error, one per repeat', async () => {
    const failed = await eventOf(bad, 'ReconcileFailed');
    expect(failed.type).toBe('Warning');
    expect(failed.involvedObject).toMatchObject({ kind: 'App', namespace: NS, name: BAD, uid: bad.metadata.uid });
    // The tool's error (what usefulErrorMessage shows), not "see .status.usefulErrorMessage".
    expect(failed.message).toMatch(/^Reconcile failed: ytt: Error: .*BEGIN-OF-FAIL x{100}/s);
    expect(failed.message.length).toBeLessThanOrEqual(MAX_EVENT_MESSAGE_CHARS);
    expect(failed.message.endsWith(' ...[truncated]')).toBe(true);
    expect(failed.count).toBe(1);
    const started = await eventOf(bad, 'ReconcileStarted');
    expect(started.type).toBe('Normal');
    expect(started.count).toBe(1);
    expect((await eventsOf(bad.metadata.uid)).map((e) => e.reason).sort()).toEqual([
      'ReconcileFailed',
      'ReconcileStarted',
    ]);
  });

  it('/metrics serves the counters and time gauges of both Apps with upstream labels', async () => {
    expect((await scrape('/other')).status).toBe(404);
    const res = await scrape();
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toContain('text/plain');
    const text = await res.text();
    for (const [series, type] of [
      ['kappctrl_app_reconcile_attempt_total', 'counter'],
      ['kappctrl_app_reconcile_success_total', 'counter'],
      ['kappctrl_app_reconcile_failure_total', 'counter'],
      ['kappctrl_app_reconcile_delete_attempt_total', 'counter'],
      ['kappctrl_app_reconcile_delete_failed_total', 'counter'],
      ['kappctrl_reconcile_time_seconds', 'gauge'],
      ['kappctrl_reconcile_fetch_time_seconds', 'gauge'],
      ['kappctrl_reconcile_template_time_seconds', 'gauge'],
      ['kappctrl_reconcile_deploy_time_seconds', 'gauge'],
    ]) {
      expect(text).toContain(`# TYPE ${series} ${type}\n`);
    }

    const g = samplesOf(text, GOOD);
    expect(g.get('kappctrl_app_reconcile_attempt_total')).toBe(1);
    expect(g.get('kappctrl_app_reconcile_success_total')).toBe(1);
    expect(g.get('kappctrl_app_reconcile_failure_total')).toBe(0);
    expect(g.get('kappctrl_app_reconcile_delete_attempt_total')).toBe(0);
    expect(g.get('kappctrl_app_reconcile_delete_failed_total')).toBe(0);
    for (const phase of ['', 'fetch_', 'template_', 'deploy_']) {
      expect(g.get(`kappctrl_reconcile_${phase}time_seconds{true}`), phase).toBeGreaterThan(0);
      expect(g.has(`kappctrl_reconcile_${phase}time_seconds{false}`), phase).toBe(false);
    }

    const b = samplesOf(text, BAD);
    const attempts = b.get('kappctrl_app_reconcile_attempt_total') ?? 0;
    expect(attempts).toBeGreaterThanOrEqual(2);
    // Each attempt ended in a failure, but for a retry that may be running at the scrape.
    expect(attempts - (b.get('kappctrl_app_reconcile_failure_total') ?? -1)).toBeOneOf([0, 1]);
    expect(b.get('kappctrl_app_reconcile_success_total')).toBe(0);
    // The first run, then the retries (the App had failed before): fetch and template, never deploy.
    for (const first of ['true', 'false']) {
      for (const phase of ['', 'fetch_', 'template_']) {
        const seconds = b.get(`kappctrl_reconcile_${phase}time_seconds{${first}}`);
        // A retry's fetch may be the cached artifact of the first, read in under a millisecond
        // (the clock's step): the gauge is set, possibly to 0. Every other phase ran a tool.
        if (phase === 'fetch_' && first === 'false') expect(seconds, `${phase} ${first}`).toBeGreaterThanOrEqual(0);
        else expect(seconds, `${phase} ${first}`).toBeGreaterThan(0);
      }
      expect(b.has(`kappctrl_reconcile_deploy_time_seconds{${first}}`)).toBe(false);
    }
  });

  it('a later process adds to the count of the same Event on the API server', async () => {
    await failedTimes(BAD, 2);
    // A new runtime (a new process's recorder) keeps the metrics registry being served. The
    // failures are counted once the old runtime has stopped: a retry it was running meanwhile
    // may have failed once more, and that one must not count as the new process's.
    await rt.stop();
    const runs = (await getApp(NS, BAD))?.status?.consecutiveReconcileFailures ?? 0;
    rt.restart({ metrics: rt.runtime.metrics });
    await failedTimes(BAD, runs + 1);
    const failed = await eventOf(bad, 'ReconcileFailed');
    expect(failed.count).toBe(2);
    expect(failed.lastTimestamp >= failed.firstTimestamp).toBe(true);
    expect((await eventOf(bad, 'ReconcileStarted')).count).toBe(2);
    const b = samplesOf(await (await scrape()).text(), BAD);
    expect(b.get('kappctrl_app_reconcile_failure_total')).toBeGreaterThanOrEqual(runs + 1);
  });
});
