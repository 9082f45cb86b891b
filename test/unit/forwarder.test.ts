import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { Forwarder, type ForwarderOptions } from '../../events/forwarder/forwarder.js';
import { watchedKinds } from '../../events/forwarder/kinds.js';
import { FakeObjectWatcher } from '../../events/forwarder/testing.js';
import type { Transport } from '../../events/forwarder/transport.js';
import type { ObjectEvent } from '../../events/schema.js';
import { type KubeObject, WatchGoneError } from '../../functions/lib/kube/port.js';
import { nextDueAt, type TimedObject } from '../../functions/lib/reconcile/timer.js';

const APP = { apiVersion: 'kappctrl.k14s.io/v1alpha1', kind: 'App' };
const SECRET = { apiVersion: 'v1', kind: 'Secret' };
const CONFIG_MAP = { apiVersion: 'v1', kind: 'ConfigMap' };
const SERVICE_ACCOUNT = { apiVersion: 'v1', kind: 'ServiceAccount' };
const PKGI = { apiVersion: 'packaging.carvel.dev/v1alpha1', kind: 'PackageInstall' };
const PKGR = { apiVersion: 'packaging.carvel.dev/v1alpha1', kind: 'PackageRepository' };
const T0 = Date.parse('2025-01-01T00:00:00Z');

/** Records accepted batches; can fail or hold sends. */
class RecordingTransport implements Transport {
  readonly batches: ObjectEvent[][] = [];
  calls = 0;
  failNext = 0;
  hold: Promise<void> | undefined;
  concurrent = 0;
  maxConcurrent = 0;
  async send(events: ObjectEvent[]): Promise<void> {
    this.calls++;
    this.concurrent++;
    this.maxConcurrent = Math.max(this.maxConcurrent, this.concurrent);
    try {
      if (this.hold) await this.hold;
      if (this.failNext > 0) {
        this.failNext--;
        throw new Error('queue unavailable');
      }
      this.batches.push(events);
    } finally {
      this.concurrent--;
    }
  }
  /** `reason name rv` of every accepted event. */
  get log(): string[] {
    return this.batches.flat().map((e) => `${e.data.reason} ${e.data.name} ${e.data.resourceVersion}`);
  }
  take(): string[] {
    const out = this.log;
    this.batches.length = 0;
    return out;
  }
}

function iso(ms: number): string {
  return new Date(ms).toISOString().replace(/\.\d{3}Z$/, 'Z');
}

/** Status of an App reconciled successfully at `at` for generation `gen`. */
function handled(gen: number, at: number, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    observedGeneration: gen,
    conditions: [{ type: 'ReconcileSucceeded', status: 'True' }],
    fetch: { exitCode: 0, updatedAt: iso(at - 2000) },
    template: { exitCode: 0, updatedAt: iso(at - 1000) },
    deploy: { exitCode: 0, finished: true, updatedAt: iso(at) },
    consecutiveReconcileSuccesses: 1,
    consecutiveReconcileFailures: 0,
    ...extra,
  };
}

interface AppOpts {
  ns?: string;
  gen?: number;
  uid?: string;
  status?: Record<string, unknown>;
  spec?: Record<string, unknown>;
  deletionTimestamp?: string;
}

function app(name: string, o: AppOpts = {}): KubeObject {
  return {
    apiVersion: APP.apiVersion,
    kind: APP.kind,
    metadata: {
      name,
      namespace: o.ns ?? 'default',
      uid: o.uid ?? `uid-${name}`,
      resourceVersion: '',
      generation: o.gen ?? 1,
      ...(o.deletionTimestamp ? { deletionTimestamp: o.deletionTimestamp } : {}),
    },
    spec: o.spec ?? {
      fetch: [{ inline: { paths: { 'a.yml': 'x' } } }],
      template: [{ ytt: {} }],
      deploy: [{ kapp: {} }],
    },
    ...(o.status ? { status: o.status } : {}),
  };
}

/** An App spec that reads Secret `values-<name>` and ConfigMap `cm-<name>`. */
function specWithRefs(secret: string, configMap?: string): Record<string, unknown> {
  return {
    fetch: [{ inline: { pathsFrom: [{ secretRef: { name: secret } }] } }],
    template: [{ ytt: { valuesFrom: configMap ? [{ configMapRef: { name: configMap } }] : [] } }],
    deploy: [{ kapp: {} }],
  };
}

function secret(name: string, ns = 'default', data: Record<string, string> = { v: 'MQ==' }): KubeObject {
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: { name, namespace: ns, uid: `uid-s-${name}`, resourceVersion: '', creationTimestamp: iso(Date.now()) },
    data,
  };
}

function configMap(name: string, ns = 'default', data: Record<string, string> = { v: '1' }): KubeObject {
  return {
    apiVersion: 'v1',
    kind: 'ConfigMap',
    metadata: { name, namespace: ns, uid: `uid-c-${name}`, resourceVersion: '', creationTimestamp: iso(Date.now()) },
    data,
  };
}

let watcher: FakeObjectWatcher;
let transport: RecordingTransport;
let fwd: Forwarder | undefined;

function start(extra: Partial<ForwarderOptions> = {}): Forwarder {
  fwd = new Forwarder({
    clusterId: 'c1',
    watcher,
    transport,
    random: () => 0.5,
    coalesceWindowMs: 200,
    stallTimeoutMs: 90_000,
    resyncRetryMs: 300_000,
    ...extra,
  });
  fwd.start();
  return fwd;
}

/** Lets lists, watches and the coalescing window run. */
async function settle(ms = 250): Promise<void> {
  await vi.advanceTimersByTimeAsync(ms);
}

beforeEach(() => {
  vi.useFakeTimers({ now: T0 });
  watcher = new FakeObjectWatcher();
  transport = new RecordingTransport();
});

afterEach(async () => {
  await fwd?.stop();
  fwd = undefined;
  vi.useRealTimers();
});

describe('forwarder: live watch rules', () => {
  it('emits added for a new App, modified on a generation change, deleted on delete', async () => {
    start();
    await settle();
    const a = watcher.apply(app('a'));
    await settle();
    expect(transport.take()).toEqual([`added a ${a.metadata.resourceVersion}`]);

    const a2 = watcher.apply(app('a', { gen: 2 }));
    await settle();
    expect(transport.take()).toEqual([`modified a ${a2.metadata.resourceVersion}`]);

    const gone = watcher.remove(APP, 'default', 'a')!;
    await settle();
    expect(transport.take()).toEqual([`deleted a ${gone.metadata.resourceVersion}`]);
    expect(fwd!.stats().objects).toBe(0);
  });

  it('carries the full object reference in a valid CloudEvent', async () => {
    start();
    await settle();
    const a = watcher.apply(app('a', { ns: 'team-a', gen: 3 }));
    await settle();
    const [ev] = transport.batches.flat();
    expect(ev).toMatchObject({
      specversion: '1.0',
      type: 'dev.kapp-lambda.object.v1',
      subject: 'c1/App/team-a/a',
      source: '/kapp-lambda/clusters/c1/forwarder',
      time: '2025-01-01T00:00:00.250Z', // applied at +250 ms, sent at once: a new object waits for no window
      data: {
        clusterId: 'c1',
        kind: 'App',
        apiVersion: 'kappctrl.k14s.io/v1alpha1',
        namespace: 'team-a',
        name: 'a',
        uid: 'uid-a',
        generation: 3,
        resourceVersion: a.metadata.resourceVersion,
        reason: 'added',
      },
    });
  });

  it('emits nothing for status-only updates (our own status writes) and only moves the resync timer', async () => {
    watcher.apply(app('a', { status: handled(1, T0 - 10_000) }));
    start();
    await settle();
    expect(transport.take()).toEqual([]);
    const due1 = fwd!.dueAt(APP, 'default', 'a');

    // A status write at T0+1s: Reconciling (time unchanged), then succeeded with new times.
    watcher.apply(
      app('a', { status: { ...handled(1, T0 - 10_000), conditions: [{ type: 'Reconciling', status: 'True' }] } }),
    );
    const later = app('a', { status: handled(1, T0 + 1000) });
    for (let i = 0; i < 20; i++) watcher.apply(later);
    await settle(2000);
    expect(transport.take()).toEqual([]);
    expect(fwd!.stats().emitted).toEqual({ added: 0, modified: 0, deleted: 0, resync: 0, 'ref-changed': 0 });
    const due2 = fwd!.dueAt(APP, 'default', 'a');
    expect(due2).toBe(nextDueAt(later as unknown as TimedObject)!.getTime());
    expect(due2).not.toBe(due1);
  });

  it('emits modified when deletionTimestamp appears, even without a generation change', async () => {
    watcher.apply(app('a', { status: handled(1, T0) }));
    start();
    await settle();
    const d = watcher.apply(app('a', { status: handled(1, T0), deletionTimestamp: iso(T0) }));
    await settle();
    expect(transport.take()).toEqual([`modified a ${d.metadata.resourceVersion}`]);
  });

  it('emits deleted for the old uid and added for the new one when a name is reused', async () => {
    start();
    await settle();
    watcher.apply(app('a', { uid: 'uid-old' }));
    await settle();
    transport.take();
    // Delete + recreate collapsed into one MODIFIED by a resumed watch: same name, new uid.
    watcher.stallWatches(APP);
    watcher.remove(APP, 'default', 'a');
    const b = watcher.apply(app('a', { uid: 'uid-new' }));
    watcher.dropWatches(APP);
    await settle();
    const evs = transport.batches.flat().map((e) => `${e.data.reason} ${e.data.uid}`);
    expect(evs).toEqual(['deleted uid-old', 'added uid-new']);
    expect(transport.batches.flat()[1]!.data.resourceVersion).toBe(b.metadata.resourceVersion);
  });

  it('coalesces a burst for one object into one event with the latest resourceVersion and generation', async () => {
    start();
    await settle();
    watcher.apply(app('a'));
    await settle(0);
    expect(transport.take()).toEqual(['added a 1001']);
    let last: KubeObject | undefined;
    for (let g = 2; g <= 30; g++) last = watcher.apply(app('a', { gen: g }));
    await settle(199);
    expect(transport.calls).toBe(1);
    await settle(2);
    expect(transport.batches.flat().map((e) => [e.data.reason, e.data.generation, e.data.resourceVersion])).toEqual([
      ['modified', 30, last!.metadata.resourceVersion],
    ]);
    expect(fwd!.stats().emitted.modified).toBe(29);
    expect(fwd!.stats().sent).toBe(2);
  });

  it("sends a new object's added at once, with what was queued before it, in order; its burst merges into it", async () => {
    watcher.apply(app('old', { status: handled(1, T0) }));
    start();
    await settle();
    watcher.apply(app('old', { gen: 2, status: handled(1, T0) }));
    await settle(50);
    expect(transport.calls).toBe(0); // a modified waits for its window
    watcher.apply(app('a'));
    const a3 = watcher.apply(app('a', { gen: 3 }));
    await settle(0);
    expect(transport.batches.flat().map((e) => `${e.data.reason} ${e.data.name} ${e.data.generation}`)).toEqual([
      'modified old 2',
      'added a 3',
    ]);
    expect(transport.batches.flat()[1]!.data.resourceVersion).toBe(a3.metadata.resourceVersion);
  });

  it('does not merge events of different objects', async () => {
    start();
    await settle();
    watcher.apply(app('a'));
    watcher.apply(app('b'));
    watcher.apply(app('c', { ns: 'other' }));
    await settle();
    expect(transport.take().map((l) => l.split(' ').slice(0, 2).join(' '))).toEqual(['added a', 'added b', 'added c']);
  });
});

describe('forwarder: resync timer from status', () => {
  it('emits resync exactly when nextDueAt says, then waits for the status to move', async () => {
    const obj = app('a', { status: handled(1, T0 - 20_000) });
    watcher.apply(obj);
    start();
    await settle(0);
    const due = nextDueAt(obj as unknown as TimedObject)!.getTime();
    expect(due).toBeGreaterThanOrEqual(T0 + 10_000);
    expect(due).toBeLessThan(T0 + 15_000);
    expect(fwd!.dueAt(APP, 'default', 'a')).toBe(due);
    await vi.advanceTimersByTimeAsync(due - Date.now() - 1);
    expect(fwd!.stats().emitted.resync).toBe(0);
    await vi.advanceTimersByTimeAsync(1);
    expect(fwd!.stats().emitted.resync).toBe(1);
    await settle();
    expect(transport.take()).toEqual([`resync a ${watcher.get(APP, 'default', 'a')!.metadata.resourceVersion}`]);

    // The function marks the App Reconciling (same reconcile times: still "due"): no new event.
    watcher.apply({
      ...obj,
      status: { ...handled(1, T0 - 20_000), conditions: [{ type: 'Reconciling', status: 'True' }] },
    });
    await settle();
    expect(transport.take()).toEqual([]);
    // It finishes: next due is computed from the new status.
    const now = Date.now();
    const done = watcher.apply(app('a', { status: handled(1, now) }));
    await settle();
    expect(transport.take()).toEqual([]);
    expect(fwd!.dueAt(APP, 'default', 'a')).toBe(nextDueAt(done as unknown as TimedObject)!.getTime());
  });

  it('uses the 2^n failure backoff of the status', async () => {
    const failed = app('a', {
      status: {
        ...handled(1, T0),
        conditions: [{ type: 'ReconcileFailed', status: 'True', message: 'x' }],
        consecutiveReconcileFailures: 3,
      },
    });
    watcher.apply(failed);
    start();
    await settle(0);
    expect(fwd!.dueAt(APP, 'default', 'a')).toBe(T0 + 8000);
    await vi.advanceTimersByTimeAsync(7999);
    expect(fwd!.stats().emitted.resync).toBe(0);
    await vi.advanceTimersByTimeAsync(1);
    expect(fwd!.stats().emitted.resync).toBe(1);
  });

  it('emits resync for a status write that is already due, once per reconcile basis', async () => {
    // A late status event: failure at T0-10s with a 2s backoff is due on arrival.
    start();
    await settle();
    watcher.apply(app('a', { status: handled(1, T0 - 60_000) }));
    await settle();
    expect(transport.take()).toEqual(['added a 1001']);
    const failed = {
      ...handled(1, T0 - 10_000),
      conditions: [{ type: 'ReconcileFailed', status: 'True' }],
      consecutiveReconcileFailures: 1,
    };
    const f = watcher.apply(app('a', { status: failed }));
    watcher.apply(app('a', { status: { ...failed, friendlyDescription: 'x' } }));
    await settle();
    // The second write (same reconcile basis) asks nothing more; the event carries the first.
    expect(transport.take()).toEqual([`resync a ${f.metadata.resourceVersion}`]);
    expect(fwd!.stats().emitted.resync).toBe(1);
  });

  it('re-emits resync after resyncRetryMs when no status answer comes, not before, each re-ask of the same status waiting twice as long, at most 16 times', async () => {
    start({ resyncRetryMs: 60_000 });
    await settle();
    watcher.apply(app('a'));
    await settle();
    expect(transport.take()).toEqual(['added a 1001']);
    await vi.advanceTimersByTimeAsync(60_000 - 251);
    expect(transport.take()).toEqual([]);
    await settle();
    expect(transport.take()).toEqual(['resync a 1001']);
    // A run that crashes without a status is still being redelivered by SQS, holding the
    // object's FIFO group: a fixed re-ask piled a message behind it every period.
    for (const wait of [120_000, 240_000, 480_000, 960_000, 960_000]) {
      await vi.advanceTimersByTimeAsync(wait - 251);
      expect(transport.take()).toEqual([]);
      await settle();
      expect(transport.take()).toEqual(['resync a 1001']);
    }
    // An answer (the status moved: a failure, due again at once) starts the count again.
    const failed = {
      ...handled(1, Date.now() - 10_000),
      conditions: [{ type: 'ReconcileFailed', status: 'True' }],
      consecutiveReconcileFailures: 1,
    };
    const answered = watcher.apply(app('a', { status: failed }));
    await settle();
    expect(transport.take()).toEqual([`resync a ${answered.metadata.resourceVersion}`]);
    await vi.advanceTimersByTimeAsync(60_000);
    expect(transport.take()).toEqual([`resync a ${answered.metadata.resourceVersion}`]);
  });

  it('a settled App whose resync wrote no status is asked again one period after the ask, each ask with an id of its own', async () => {
    // A no-op resync writes no status (functions/lib/pipeline/stage.ts closeStage): no answer comes.
    const obj = watcher.apply(app('a', { status: handled(1, T0 - 20_000) }));
    start({ resyncRetryMs: 300_000 });
    await settle(0);
    const first = fwd!.dueAt(APP, 'default', 'a')!;
    await vi.advanceTimersByTimeAsync(first - Date.now());
    await settle();
    const period = first - (T0 - 20_000); // sync period + jitter, as the status gave it
    const firstAsk = transport.batches.flat()[0]!;
    expect(firstAsk.data.cause).toBeUndefined();
    expect(transport.take()).toEqual([`resync a ${obj.metadata.resourceVersion}`]);
    const asked = Date.now() - 250;
    expect(fwd!.dueAt(APP, 'default', 'a')).toBe(first + period);
    // A write that does not move the status's times (a label) keeps that schedule: no ask now.
    const labelled = watcher.apply({ ...obj, metadata: { ...obj.metadata, labels: { x: 'y' } } });
    await settle();
    expect(transport.take()).toEqual([]);
    expect(fwd!.dueAt(APP, 'default', 'a')).toBe(Math.floor(asked / 1000) * 1000 + period);
    await vi.advanceTimersByTimeAsync(fwd!.dueAt(APP, 'default', 'a')! - Date.now());
    await settle();
    const again = transport.batches.flat()[0]!;
    expect(transport.take()).toEqual([`resync a ${labelled.metadata.resourceVersion}`]);
    expect(again.data.cause).toMatch(/^resync-at-\d+$/);
    expect(fwd!.stats().emitted.resync).toBe(2);
    // The same status asked again (no label this time) still gets an id of its own.
    await vi.advanceTimersByTimeAsync(fwd!.dueAt(APP, 'default', 'a')! - Date.now());
    await settle();
    const third = transport.batches.flat()[0]!;
    expect(transport.take()).toEqual([`resync a ${labelled.metadata.resourceVersion}`]);
    expect(third.id).not.toBe(again.id);
    // A run that did work writes status: the schedule counts from it again.
    const done = watcher.apply(app('a', { status: handled(1, Date.now()) }));
    await settle();
    expect(fwd!.dueAt(APP, 'default', 'a')).toBe(nextDueAt(done as unknown as TimedObject)!.getTime());
  });

  it('gives a resync retry an id of its own, and a restarted forwarder the same ids for the same changes', async () => {
    start({ resyncRetryMs: 60_000 });
    await settle();
    watcher.apply(app('a'));
    await settle();
    await vi.advanceTimersByTimeAsync(60_000);
    await vi.advanceTimersByTimeAsync(120_000);
    const ids = transport.batches.flat().map((e) => e.id);
    const firstTime = transport.batches.flat()[0]!.time;
    expect(transport.take()).toEqual(['added a 1001', 'resync a 1001', 'resync a 1001']);
    expect(new Set(ids).size).toBe(3); // a retry is not dropped as a duplicate of the first ask
    await fwd!.stop();
    // Another replica (or this one restarted) announces the never-reconciled App again: same id,
    // so the FIFO queue's deduplication drops the copy.
    start();
    await settle();
    const again = transport.batches.flat();
    expect(transport.take()).toEqual(['added a 1001']);
    expect(again[0]!.id).toBe(ids[0]);
    expect(again[0]!.time).not.toBe(firstTime); // announced later, same id
  });

  it('never schedules a paused App', async () => {
    watcher.apply(app('a', { spec: { paused: true }, status: handled(1, T0 - 3_600_000) }));
    start();
    await settle();
    expect(fwd!.dueAt(APP, 'default', 'a')).toBeUndefined();
    await vi.advanceTimersByTimeAsync(3_600_000);
    expect(transport.take()).toEqual([]);
    expect(fwd!.stats().scheduled).toBe(0);
  });

  it('keeps one timer for many objects', async () => {
    for (let i = 0; i < 500; i++) watcher.apply(app(`a${i}`, { status: handled(1, T0 - (i % 30) * 1000) }));
    start({ watchNamespaces: false });
    await settle(0);
    expect(fwd!.stats().scheduled).toBe(500);
    // Pending timers: one watchdog per watch (App, Secret, ConfigMap, ServiceAccount) and the one resync timer.
    expect(vi.getTimerCount()).toBe(5);
    await vi.advanceTimersByTimeAsync(40_000);
    // Each asked once (settled Apps whose run wrote no status are asked again a period later).
    await settle();
    const asked = new Set(transport.take().map((l) => l.split(' ')[1]));
    expect(asked.size).toBe(500);
  });
});

describe('forwarder: restart without state', () => {
  it('emits only for unhandled, changed or due objects', async () => {
    watcher.apply(app('never', {})); // no status: never reconciled
    watcher.apply(app('changed', { gen: 3, status: handled(2, T0 - 1000) }));
    watcher.apply(app('due', { status: handled(1, T0 - 3_600_000) }));
    watcher.apply(
      app('failed-due', {
        status: {
          ...handled(1, T0 - 5000),
          conditions: [{ type: 'ReconcileFailed', status: 'True' }],
          consecutiveReconcileFailures: 2,
        },
      }),
    );
    // A run in flight when the previous runtime died: its status still says Reconciling.
    watcher.apply(
      app('lost-run', {
        status: { ...handled(1, T0 - 1000), conditions: [{ type: 'Reconciling', status: 'True' }] },
      }),
    );
    for (let i = 0; i < 100; i++) watcher.apply(app(`ok${i}`, { status: handled(1, T0 - 1000) }));
    start();
    await settle();
    expect(
      transport
        .take()
        .map((l) => l.split(' ').slice(0, 2).join(' '))
        .sort(),
    ).toEqual(['added lost-run', 'added never', 'modified changed', 'resync due', 'resync failed-due']);
    expect(fwd!.stats().objects).toBe(105);
  });

  it('emits ref-changed after a restart only for Secrets written since the last reconcile', async () => {
    vi.setSystemTime(T0 - 100_000);
    watcher.apply(secret('old'));
    vi.setSystemTime(T0 - 1000);
    watcher.apply(secret('new')); // written after the Apps' last reconcile (T0-10s)
    watcher.apply(secret('unreferenced'));
    vi.setSystemTime(T0);
    watcher.apply(app('uses-old', { spec: specWithRefs('old'), status: handled(1, T0 - 10_000) }));
    watcher.apply(app('uses-new', { spec: specWithRefs('new'), status: handled(1, T0 - 10_000) }));
    watcher.apply(app('uses-missing', { spec: specWithRefs('missing'), status: handled(1, T0 - 10_000) }));
    start();
    await settle();
    expect(transport.take().map((l) => l.split(' ').slice(0, 2).join(' '))).toEqual(['ref-changed uses-new']);
    expect(fwd!.stats().refs).toBe(3);
  });

  it('emits ref-changed for a managedFields write newer than the last reconcile', async () => {
    const s = secret('vals');
    s.metadata.creationTimestamp = iso(T0 - 3_600_000);
    s.metadata.managedFields = [
      { manager: 'kubectl', operation: 'Update', time: iso(T0 - 3_600_000) },
      { manager: 'kubectl', operation: 'Update', time: iso(T0 - 5000) },
    ];
    watcher.apply(s);
    watcher.apply(app('a', { spec: specWithRefs('vals'), status: handled(1, T0 - 10_000) }));
    watcher.apply(app('b', { spec: specWithRefs('vals'), status: handled(1, T0 - 1000) }));
    start();
    await settle();
    expect(transport.take().map((l) => l.split(' ').slice(0, 2).join(' '))).toEqual(['ref-changed a']);
  });
});

describe('forwarder: referenced Secrets and ConfigMaps', () => {
  it('emits ref-changed for a referenced Secret (create, update, delete) but not an unreferenced one', async () => {
    watcher.apply(app('a', { spec: specWithRefs('vals-a', 'cm-a'), status: handled(1, T0) }));
    watcher.apply(app('b', { spec: specWithRefs('vals-b'), status: handled(1, T0) }));
    watcher.apply(app('other-ns', { ns: 'team-x', spec: specWithRefs('vals-a'), status: handled(1, T0) }));
    start();
    await settle();
    expect(transport.take()).toEqual([]);

    const rvA = () => watcher.get(APP, 'default', 'a')!.metadata.resourceVersion;
    watcher.apply(secret('vals-a'));
    await settle();
    expect(transport.take()).toEqual([`ref-changed a ${rvA()}`]);
    watcher.apply(secret('vals-a', 'default', { v: 'Mg==' }));
    await settle();
    expect(transport.take()).toEqual([`ref-changed a ${rvA()}`]);
    watcher.apply(secret('unrelated'));
    watcher.apply(secret('unrelated', 'default', { v: 'Mw==' }));
    watcher.apply(configMap('vals-a')); // a ConfigMap with the Secret's name
    await settle();
    expect(transport.take()).toEqual([]);
    watcher.apply(configMap('cm-a'));
    await settle();
    expect(transport.take()).toEqual([`ref-changed a ${rvA()}`]);
    watcher.remove(SECRET, 'default', 'vals-a');
    await settle();
    expect(transport.take()).toEqual([`ref-changed a ${rvA()}`]);
    expect(fwd!.stats().refs).toBe(4);
    // Each change of the Secret is its own cause: at one App resourceVersion, distinct ids.
    watcher.apply(secret('vals-a'));
    await settle();
    watcher.apply(secret('vals-a', 'default', { v: 'NA==' }));
    await settle();
    const [first, second] = transport.batches.flat();
    expect(first!.data.resourceVersion).toBe(second!.data.resourceVersion);
    expect(first!.id).not.toBe(second!.id);
  });

  it('follows ref changes in the spec and drops refs of an App being deleted', async () => {
    watcher.apply(app('a', { spec: specWithRefs('one'), status: handled(1, T0) }));
    start();
    await settle();
    watcher.apply(app('a', { gen: 2, spec: specWithRefs('two'), status: handled(1, T0) }));
    await settle();
    expect(transport.take().map((l) => l.split(' ')[0])).toEqual(['modified']);
    watcher.apply(secret('one'));
    await settle();
    expect(transport.take()).toEqual([]);
    watcher.apply(secret('two'));
    await settle();
    expect(transport.take().map((l) => l.split(' ')[0])).toEqual(['ref-changed']);
    watcher.apply(app('a', { gen: 3, spec: specWithRefs('two'), status: handled(1, T0), deletionTimestamp: iso(T0) }));
    await settle();
    transport.take();
    watcher.apply(secret('two', 'default', { v: 'OQ==' }));
    await settle();
    expect(transport.take()).toEqual([]);
    expect(fwd!.stats().refs).toBe(0);
  });

  it('tracks only Secrets for PackageRepository and nothing for PackageInstall', async () => {
    watcher.apply({
      apiVersion: PKGR.apiVersion,
      kind: PKGR.kind,
      metadata: { name: 'repo', namespace: 'default', uid: 'uid-repo', resourceVersion: '', generation: 1 },
      spec: { fetch: { imgpkgBundle: { image: 'r/x', secretRef: { name: 'regcred' } } } },
      status: handled(1, T0),
    });
    watcher.apply({
      apiVersion: PKGI.apiVersion,
      kind: PKGI.kind,
      metadata: { name: 'inst', namespace: 'default', uid: 'uid-inst', resourceVersion: '', generation: 1 },
      spec: { packageRef: { refName: 'p' }, values: [{ secretRef: { name: 'regcred' } }] },
      status: { observedGeneration: 1, conditions: [{ type: 'ReconcileSucceeded', status: 'True' }] },
    });
    start({ kinds: watchedKinds(['PackageInstall', 'PackageRepository']) });
    await settle();
    expect(watcher.listCalls(CONFIG_MAP)).toEqual([]);
    expect(watcher.listCalls(SECRET)).toHaveLength(1);
    watcher.apply(secret('regcred'));
    await settle();
    expect(transport.take().map((l) => l.split(' ').slice(0, 2).join(' '))).toEqual(['ref-changed repo']);
    // PackageInstall: no timer; PackageRepository: 10m default sync period.
    expect(fwd!.dueAt(PKGI, 'default', 'inst')).toBeUndefined();
    const due = fwd!.dueAt(PKGR, 'default', 'repo')!;
    expect(due).toBeGreaterThanOrEqual(T0 + 600_000);
    expect(due).toBeLessThan(T0 + 605_000);
    const ev = transport.batches.flat();
    expect(ev).toEqual([]);
  });
});

describe('forwarder: controllers of owned objects', () => {
  const inst = (uid = 'uid-inst'): KubeObject => ({
    apiVersion: PKGI.apiVersion,
    kind: PKGI.kind,
    metadata: { name: 'inst', namespace: 'default', uid, resourceVersion: '', generation: 1 },
    spec: { packageRef: { refName: 'p' } },
    status: { observedGeneration: 1, conditions: [{ type: 'ReconcileSucceeded', status: 'True' }] },
  });
  const owned = (status: Record<string, unknown>, ownerUid = 'uid-inst'): KubeObject => {
    const a = app('inst', { status });
    a.metadata.ownerReferences = [
      { apiVersion: PKGI.apiVersion, kind: PKGI.kind, name: 'inst', uid: ownerUid, controller: true },
    ];
    return a;
  };

  it("asks the PackageInstall controlling an App to reconcile on the App's status changes and deletion", async () => {
    watcher.apply(inst());
    watcher.apply(owned(handled(1, T0 - 10_000)));
    start({ kinds: watchedKinds(['App', 'PackageInstall']) });
    await settle();
    expect(transport.take()).toEqual([]);
    // A status-only write of the App: nothing for the App itself, ref-changed for its controller.
    watcher.apply(owned({ ...handled(1, T0 - 10_000), conditions: [{ type: 'Reconciling', status: 'True' }] }));
    await settle();
    expect(transport.take().map((l) => l.split(' ').slice(0, 2).join(' '))).toEqual(['ref-changed inst']);
    watcher.remove(APP, 'default', 'inst');
    await settle();
    expect(transport.batches.flat().map((e) => `${e.data.kind} ${e.data.reason}`)).toEqual([
      'App deleted',
      'PackageInstall ref-changed',
    ]);
  });

  it('a PackageInstall whose annotations change is modified (downgradable, ignore-*): its status and last-applied are not', async () => {
    watcher.apply(inst());
    start({ kinds: watchedKinds(['PackageInstall']) });
    await settle();
    expect(transport.take()).toEqual([]);
    const annotated = (annotations: Record<string, string>, status?: Record<string, unknown>): KubeObject => {
      const o = inst();
      o.metadata.annotations = annotations;
      if (status) o.status = status;
      return o;
    };
    // Upstream's PackageInstall reconciles on every update; the annotation lets a refused downgrade proceed.
    watcher.apply(annotated({ 'packaging.carvel.dev/downgradable': '' }));
    await settle();
    expect(transport.take().map((l) => l.split(' ').slice(0, 2).join(' '))).toEqual(['modified inst']);
    // A status write, or kubectl's last-applied annotation alone, is no change of the annotations.
    watcher.apply(
      annotated(
        { 'packaging.carvel.dev/downgradable': '', 'kubectl.kubernetes.io/last-applied-configuration': '{}' },
        { observedGeneration: 1, conditions: [{ type: 'ReconcileFailed', status: 'True' }] },
      ),
    );
    await settle();
    expect(transport.take()).toEqual([]);
    // Removing it is a change too.
    watcher.apply(annotated({}));
    await settle();
    expect(transport.take().map((l) => l.split(' ').slice(0, 2).join(' '))).toEqual(['modified inst']);
  });

  it("requeues a PackageInstall failed with an error of its own as controller-runtime's rate limiter does, until it succeeds", async () => {
    const failed = (message: string): Record<string, unknown> => ({
      observedGeneration: 1,
      conditions: [{ type: 'ReconcileFailed', status: 'True', message }],
    });
    const o = inst();
    o.status = failed('Package p not found');
    watcher.apply(o);
    start({ kinds: watchedKinds(['PackageInstall']), coalesceWindowMs: 0 });
    await settle(0);
    // Requeue n waits 5 ms · 2^n after the previous one: 5, 10, 20, ... ms, then 1000 s at most.
    const resyncs: number[] = [];
    let last = Date.now();
    for (let i = 0; i < 20; i++) {
      const due = fwd!.dueAt(PKGI, 'default', 'inst')!;
      resyncs.push(due - last);
      last = due;
      await vi.advanceTimersByTimeAsync(due - Date.now());
    }
    expect(resyncs.slice(0, 5)).toEqual([5, 10, 20, 40, 80]);
    expect(resyncs.slice(16)).toEqual([327_680, 655_360, 1_000_000, 1_000_000]);
    // One resync per requeue (the first ones, milliseconds apart, may share a send), each with
    // an id of its own: the run that fails again leaves the status (and resourceVersion) as is,
    // and SQS FIFO drops a message whose id it saw in the last 5 minutes.
    const ids = transport.batches.flat().map((e) => e.id);
    expect(new Set(ids).size).toBe(ids.length);
    const sent = transport.take();
    expect(sent.length).toBeGreaterThanOrEqual(18);
    expect(sent.every((l) => l.startsWith('resync inst'))).toBe(true);

    // A success resets the count (`Forget`); a new failure starts again at 5 ms.
    watcher.apply({
      ...inst(),
      status: { observedGeneration: 1, conditions: [{ type: 'ReconcileSucceeded', status: 'True' }] },
    });
    await settle(0);
    expect(fwd!.dueAt(PKGI, 'default', 'inst')).toBeUndefined();
    const again = inst();
    again.status = failed('Expected to find at least one version, but did not (details: all=1 -> ...)');
    watcher.apply(again);
    await settle(0);
    expect(fwd!.dueAt(PKGI, 'default', 'inst')! - Date.now()).toBe(5);

    // Failures upstream ends without an error (the App's failure mirrored, a refused downgrade): no requeue.
    watcher.apply({ ...inst(), status: failed('Error (see .status.usefulErrorMessage for details)') });
    await settle(0);
    expect(fwd!.dueAt(PKGI, 'default', 'inst')).toBeUndefined();
    await settle(10_000);
    transport.take();
    await settle(10_000);
    expect(transport.take()).toEqual([]);
  });

  it('notifies nobody for an owner of another uid, a non-controller owner, or an unwatched kind', async () => {
    watcher.apply(inst());
    watcher.apply(owned(handled(1, T0 - 10_000), 'uid-other'));
    start({ kinds: watchedKinds(['App', 'PackageInstall']) });
    await settle();
    watcher.apply(owned(handled(1, T0 - 5_000), 'uid-other'));
    const plain = app('b', { status: handled(1, T0 - 10_000) });
    plain.metadata.ownerReferences = [{ apiVersion: PKGI.apiVersion, kind: PKGI.kind, name: 'inst', uid: 'uid-inst' }];
    watcher.apply(plain);
    await settle();
    transport.take();
    watcher.apply({ ...plain, status: handled(1, T0 - 5_000) });
    await settle();
    expect(transport.take()).toEqual([]);
    await fwd?.stop();
    fwd = undefined;
    start({ kinds: watchedKinds(['App']) });
    await settle();
    transport.take();
    watcher.apply(owned(handled(1, T0 - 1_000)));
    await settle();
    expect(transport.take()).toEqual([]);
  });
});

describe('forwarder: namespaces an App being deleted waits on (noop delete, reference §3.9)', () => {
  const NS = { apiVersion: 'v1', kind: 'Namespace' };
  function namespace(name: string, terminating = false): KubeObject {
    return {
      apiVersion: 'v1',
      kind: 'Namespace',
      metadata: {
        name,
        uid: `uid-ns-${name}`,
        resourceVersion: '',
        ...(terminating ? { deletionTimestamp: iso(T0) } : {}),
      },
    };
  }
  /** Status of an App deployed with kapp into `namespaces`, then failing to delete. */
  function deployedTo(namespaces: string[]): Record<string, unknown> {
    return handled(1, T0, {
      conditions: [{ type: 'DeleteFailed', status: 'True', message: 'x' }],
      deploy: {
        exitCode: 1,
        finished: true,
        updatedAt: iso(T0),
        kapp: { associatedResources: { label: 'kapp.k14s.io/app=1', namespaces, groupKinds: [] } },
      },
    });
  }
  const SA_SPEC = {
    serviceAccountName: 'sa',
    syncPeriod: '10m',
    fetch: [{ inline: { paths: { 'a.yml': 'x' } } }],
    template: [{ ytt: {} }],
    deploy: [{ kapp: {} }],
  };
  function deletingApp(name: string, ns: string, namespaces: string[], spec: Record<string, unknown> = SA_SPEC) {
    return app(name, { ns, spec, status: deployedTo(namespaces), deletionTimestamp: iso(T0) });
  }

  it('asks an App being deleted to reconcile once the last of its namespaces terminates, whichever order', async () => {
    watcher.apply(namespace('a'));
    watcher.apply(namespace('b'));
    watcher.apply(namespace('c'));
    watcher.apply(deletingApp('app-a', 'a', ['a', 'b']));
    watcher.apply(deletingApp('app-c', 'c', ['b', 'c']));
    start();
    await settle();
    transport.take();
    // The App's own namespace first: not all terminating yet, nothing.
    watcher.apply(namespace('a', true));
    await settle();
    expect(transport.take()).toEqual([]);
    const b = watcher.apply(namespace('b', true));
    await settle();
    // app-a now waits on nothing live; app-c still has c.
    expect(transport.take()).toEqual([`ref-changed app-a ${watcher.get(APP, 'a', 'app-a')!.metadata.resourceVersion}`]);
    // The other namespace first (b is terminating), then the App's own: asked at once.
    watcher.apply(namespace('c', true));
    await settle();
    expect(transport.take()).toEqual([`ref-changed app-c ${watcher.get(APP, 'c', 'app-c')!.metadata.resourceVersion}`]);
    // Further changes of a terminating namespace, and its removal, ask nothing again.
    watcher.apply({ ...namespace('b', true), metadata: { ...b.metadata, labels: { x: 'y' } } });
    watcher.remove(NS, '', 'b');
    await settle();
    expect(transport.take()).toEqual([]);
    expect(watcher.listCalls(NS).map((c) => c.namespace)).toEqual([undefined]);
  });

  it('counts a namespace that went away without being seen terminating', async () => {
    watcher.apply(namespace('a', true));
    watcher.apply(namespace('b'));
    watcher.apply(deletingApp('app-a', 'a', ['a', 'b']));
    start();
    await settle();
    transport.take();
    watcher.remove(NS, '', 'b');
    await settle();
    expect(transport.take()).toEqual([`ref-changed app-a ${watcher.get(APP, 'a', 'app-a')!.metadata.resourceVersion}`]);
  });

  it('after its first list, asks once for an App whose namespaces all terminated while it was away', async () => {
    watcher.apply(namespace('a', true));
    watcher.apply(deletingApp('app-a', 'a', ['a', 'gone-already']));
    start();
    await settle();
    const log = transport.take();
    expect(log.filter((l) => l.startsWith('ref-changed app-a'))).toHaveLength(1);
  });

  it('waits for nothing without a ServiceAccount, with a cluster-scoped resource, or while not being deleted', async () => {
    watcher.apply(namespace('a'));
    watcher.apply(namespace('b'));
    const { serviceAccountName: _, ...noSa } = SA_SPEC;
    watcher.apply(deletingApp('no-sa', 'a', ['a', 'b'], { ...noSa, cluster: { kubeconfigSecretRef: { name: 'k' } } }));
    watcher.apply(deletingApp('cluster-scoped', 'a', ['(cluster)', 'a', 'b']));
    watcher.apply(app('live', { ns: 'a', spec: SA_SPEC, status: deployedTo(['a', 'b']) }));
    start();
    await settle();
    transport.take();
    watcher.apply(namespace('a', true));
    watcher.apply(namespace('b', true));
    await settle();
    expect(transport.take()).toEqual([]);
  });

  it('keeps no Namespace watch when told not to, or when no watched kind waits on namespaces', async () => {
    start({ watchNamespaces: false });
    await settle();
    expect(watcher.listCalls(NS)).toEqual([]);
    await fwd!.stop();
    fwd = undefined;
    start({ kinds: watchedKinds(['PackageRepository']) });
    await settle();
    expect(watcher.listCalls(NS)).toEqual([]);
  });
});

describe('forwarder: watch resilience', () => {
  it('lists in pages with the configured limit, then watches from the list resourceVersion with bookmarks', async () => {
    for (let i = 0; i < 7; i++) watcher.apply(app(`a${i}`, { status: handled(1, T0) }));
    const rv = watcher.resourceVersion;
    start({ pageSize: 3 });
    await settle();
    expect(watcher.listCalls(APP).map((c) => [c.limit, c.continue])).toEqual([
      [3, undefined],
      [3, `${rv}:3`],
      [3, `${rv}:6`],
    ]);
    expect(watcher.watchCalls(APP).map((c) => c.resourceVersion)).toEqual([rv]);
    expect(fwd!.stats().objects).toBe(7);
  });

  it('resumes a dropped watch from the last resourceVersion seen (event or bookmark) without relisting', async () => {
    start();
    await settle();
    const a = watcher.apply(app('a'));
    await settle();
    watcher.dropWatches(APP);
    await settle(0);
    expect(watcher.watchCalls(APP).map((c) => c.resourceVersion)).toEqual(['1000', a.metadata.resourceVersion]);

    // Unrelated writes move the resourceVersion; a bookmark carries it.
    watcher.apply(secret('x'));
    watcher.bookmark(APP);
    const bookmarked = watcher.resourceVersion;
    watcher.stallWatches(APP); // events from here on are not delivered on this watch
    const b = watcher.apply(app('b'));
    watcher.dropWatches(APP);
    await settle();
    expect(watcher.watchCalls(APP).map((c) => c.resourceVersion)).toEqual([
      '1000',
      a.metadata.resourceVersion,
      bookmarked,
    ]);
    expect(watcher.listCalls(APP)).toHaveLength(1);
    expect(transport.take()).toEqual([
      `added a ${a.metadata.resourceVersion}`,
      `added b ${b.metadata.resourceVersion}`,
    ]);
  });

  it('relists on 410 and emits only for what changed while away, without duplicates', async () => {
    watcher.apply(app('same', { spec: specWithRefs('s-same'), status: handled(1, T0) }));
    watcher.apply(app('status-only', { status: handled(1, T0) }));
    watcher.apply(app('spec-change', { status: handled(1, T0) }));
    watcher.apply(app('to-delete', { status: handled(1, T0) }));
    watcher.apply(app('uses-secret', { spec: specWithRefs('s-changed'), status: handled(1, T0) }));
    watcher.apply(app('uses-gone-secret', { spec: specWithRefs('s-gone'), status: handled(1, T0) }));
    vi.setSystemTime(T0 - 60_000); // Secrets written before the Apps' last reconcile
    watcher.apply(secret('s-same'));
    watcher.apply(secret('s-changed'));
    watcher.apply(secret('s-gone'));
    vi.setSystemTime(T0);
    start();
    await settle();
    expect(transport.take()).toEqual([]);

    // Watches go silent; meanwhile things change; then history is compacted (410).
    watcher.stallWatches(APP);
    watcher.stallWatches(SECRET);
    watcher.apply(app('status-only', { status: handled(1, T0 + 1000) }));
    const changed = watcher.apply(app('spec-change', { gen: 2, status: handled(1, T0) }));
    watcher.remove(APP, 'default', 'to-delete');
    const created = watcher.apply(app('created'));
    watcher.apply(secret('s-changed', 'default', { v: 'Mg==' }));
    watcher.remove(SECRET, 'default', 's-gone');
    watcher.compact(APP);
    watcher.compact(SECRET);
    watcher.dropWatches();
    // A watch that ended having delivered nothing backs off (≤ 500 ms) before it resumes.
    await settle(1000);

    expect(watcher.listCalls(APP)).toHaveLength(2);
    expect(watcher.listCalls(SECRET)).toHaveLength(2);
    expect(fwd!.stats().gone).toBe(2);
    expect(
      transport
        .take()
        .map((l) => l.split(' ').slice(0, 2).join(' '))
        .sort(),
    ).toEqual([
      'added created',
      'deleted to-delete',
      'modified spec-change',
      'ref-changed uses-gone-secret',
      'ref-changed uses-secret',
    ]);
    expect(transport.batches.length).toBe(0);
    expect(changed.metadata.resourceVersion).not.toBe(created.metadata.resourceVersion);

    // A second relist with nothing changed emits nothing.
    watcher.apply(secret('unrelated'));
    watcher.compact(APP);
    watcher.compact(SECRET);
    watcher.dropWatches();
    await settle(1000);
    expect(watcher.listCalls(APP)).toHaveLength(3);
    expect(transport.take()).toEqual([]);
  });

  it('restarts a list whose continue token expired', async () => {
    for (let i = 0; i < 4; i++) watcher.apply(app(`a${i}`, { status: handled(1, T0) }));
    watcher.expireContinueTokens = true;
    start({ pageSize: 2, backoff: { initialMs: 100, jitter: 0 } });
    await settle(0);
    // The first 410 relists at once, the second in a row backs off (100 ms).
    expect(watcher.listCalls(APP).map((c) => c.continue)).toEqual([undefined, '1004:2', undefined, '1004:2']);
    watcher.expireContinueTokens = false;
    await settle(99);
    expect(watcher.listCalls(APP)).toHaveLength(4);
    await settle(1);
    expect(watcher.listCalls(APP).map((c) => c.continue)).toEqual([
      undefined,
      '1004:2',
      undefined,
      '1004:2',
      undefined,
      '1004:2',
    ]);
    expect(fwd!.stats().gone).toBe(2);
    expect(fwd!.stats().objects).toBe(4);
    expect(transport.take()).toEqual([]);
  });

  it('restarts a watch that delivered nothing (not even a bookmark) for stallTimeoutMs', async () => {
    start({ stallTimeoutMs: 30_000, watchNamespaces: false });
    await settle(0);
    watcher.stallWatches(APP);
    const a = watcher.apply(app('a')); // lost on the stalled connection
    await vi.advanceTimersByTimeAsync(15_000);
    watcher.bookmark(SECRET); // the Secret, ConfigMap and ServiceAccount watches are alive
    watcher.bookmark(CONFIG_MAP);
    watcher.bookmark(SERVICE_ACCOUNT);
    await vi.advanceTimersByTimeAsync(14_999);
    expect(watcher.watchCalls(APP)).toHaveLength(1);
    expect(transport.take()).toEqual([]);
    await vi.advanceTimersByTimeAsync(1);
    expect(watcher.watchCalls(APP).map((c) => c.resourceVersion)).toEqual(['1000', '1000']);
    expect(fwd!.stats().stalls).toBe(1);
    await settle();
    expect(transport.take()).toEqual([`added a ${a.metadata.resourceVersion}`]);
  });

  it('keeps a quiet watch that receives bookmarks', async () => {
    start({ stallTimeoutMs: 30_000, watchNamespaces: false });
    await settle(0);
    for (let i = 0; i < 10; i++) {
      await vi.advanceTimersByTimeAsync(20_000);
      watcher.bookmark(APP);
      watcher.bookmark(SECRET);
      watcher.bookmark(CONFIG_MAP);
      watcher.bookmark(SERVICE_ACCOUNT);
    }
    expect(watcher.watchCalls(APP)).toHaveLength(1);
    expect(fwd!.stats().stalls).toBe(0);
  });

  it('backs off exponentially on list and watch errors and recovers', async () => {
    const err = Object.assign(new Error('connect ECONNREFUSED'), { statusCode: undefined });
    watcher.listFailures.push(err, err, err);
    watcher.apply(app('a'));
    start({
      backoff: { initialMs: 1000, maxMs: 8000, jitter: 0 },
      kinds: watchedKinds(['App']),
      watchNamespaces: false,
    });
    await settle(0);
    expect(watcher.listCalls(APP)).toHaveLength(1);
    await vi.advanceTimersByTimeAsync(999);
    expect(watcher.listCalls(APP)).toHaveLength(1);
    await vi.advanceTimersByTimeAsync(1);
    expect(watcher.listCalls(APP)).toHaveLength(2);
    await vi.advanceTimersByTimeAsync(2000);
    expect(watcher.listCalls(APP)).toHaveLength(3);
    await vi.advanceTimersByTimeAsync(4000);
    expect(watcher.listCalls(APP)).toHaveLength(4);
    await settle();
    expect(transport.take()).toEqual(['added a 1001']);
    expect(fwd!.stats().watchErrors).toBe(3);

    // Watch errors back off too, and resume from the last resourceVersion.
    watcher.watchFailures.push(err);
    watcher.failWatches(err, APP);
    await settle(0);
    const n = watcher.watchCalls(APP).length;
    await vi.advanceTimersByTimeAsync(1000);
    expect(watcher.watchCalls(APP).length).toBe(n + 1);
    await vi.advanceTimersByTimeAsync(2000);
    expect(watcher.watchCalls(APP).length).toBe(n + 2);
    expect(watcher.watchCalls(APP).at(-1)!.resourceVersion).toBe('1001');
    expect(watcher.openWatches(APP)).toBe(1);
  });

  it('relists at once on 410 from a watch', async () => {
    start({ backoff: { initialMs: 10_000, jitter: 0 } });
    await settle(0);
    watcher.failWatches(new WatchGoneError('too old'), APP);
    await settle(0);
    expect(watcher.listCalls(APP)).toHaveLength(2);
  });

  it('watches each configured namespace separately', async () => {
    watcher.apply(app('a', { ns: 'team-a' }));
    watcher.apply(app('b', { ns: 'team-b' }));
    watcher.apply(app('c', { ns: 'team-c' }));
    start({ namespaces: ['team-a', 'team-b'] });
    await settle();
    expect(watcher.listCalls(APP).map((c) => c.namespace)).toEqual(['team-a', 'team-b']);
    expect(
      watcher
        .watchCalls(SECRET)
        .map((c) => c.namespace)
        .sort(),
    ).toEqual(['team-a', 'team-b']);
    expect(
      transport
        .take()
        .map((l) => l.split(' ').slice(0, 2).join(' '))
        .sort(),
    ).toEqual(['added a', 'added b']);
    watcher.apply(app('c2', { ns: 'team-c' }));
    await settle();
    expect(transport.take()).toEqual([]);
  });
});

describe('forwarder: delivery', () => {
  it('retries a failed batch with backoff and loses nothing', async () => {
    transport.failNext = 3;
    start({ backoff: { initialMs: 1000, jitter: 0 } });
    await settle();
    watcher.apply(app('a'));
    watcher.apply(app('b'));
    await settle();
    expect(transport.calls).toBe(1);
    await vi.advanceTimersByTimeAsync(1000 + 2000 + 4000);
    expect(transport.calls).toBe(4);
    expect(transport.take()).toEqual(['added a 1001', 'added b 1002']);
    expect(fwd!.stats().sendErrors).toBe(3);
  });

  it('sends one batch at a time and merges events that arrive meanwhile', async () => {
    let release!: () => void;
    transport.hold = new Promise((r) => {
      release = r;
    });
    start({ batchSize: 2 });
    await settle();
    watcher.apply(app('a'));
    watcher.apply(app('b'));
    watcher.apply(app('c'));
    await settle();
    expect(transport.calls).toBe(1);
    for (let g = 2; g <= 50; g++) watcher.apply(app('a', { gen: g }));
    await settle(5000);
    expect(transport.calls).toBe(1);
    expect(fwd!.stats().pending).toBe(2);
    transport.hold = undefined;
    release();
    await settle();
    expect(transport.maxConcurrent).toBe(1);
    expect(transport.batches.map((b) => b.map((e) => `${e.data.reason} ${e.data.name} ${e.data.generation}`))).toEqual([
      ['added a 1', 'added b 1'],
      ['added c 1', 'modified a 50'],
    ]);
  });

  it('drains waiting events on stop({ drain: true })', async () => {
    watcher.apply(app('a', { status: handled(1, T0) }));
    start({ coalesceWindowMs: 60_000 });
    await settle();
    const a2 = watcher.apply(app('a', { gen: 2, status: handled(1, T0) }));
    await settle();
    expect(transport.calls).toBe(0);
    const stopping = fwd!.stop({ drain: true });
    await settle(0);
    await stopping;
    expect(transport.take()).toEqual([`modified a ${a2.metadata.resourceVersion}`]);
    expect(watcher.openWatches()).toBe(0);
  });

  it('drops an event that does not validate and keeps going', async () => {
    start({ clusterId: 'Not_A_DNS_Label' });
    await settle();
    watcher.apply(app('a'));
    await settle();
    expect(transport.calls).toBe(0);
    expect(fwd!.stats().invalid).toBe(1);
  });
});

describe('forwarder: kapp-controller-config', () => {
  const NAME = 'kapp-controller-config';
  const SELECTOR = `metadata.name=${NAME}`;

  it('watches only that Secret and ConfigMap in the configured namespace, reports each change, and sends no event', async () => {
    watcher.apply(secret(NAME, 'kapp-lambda', { appDefaultSyncPeriod: 'MW0=' }));
    const onChange = vi.fn();
    start({ controllerConfig: { namespace: 'kapp-lambda', onChange } });
    await settle();
    // The first lists report (a change made while no forwarder watched is not lost).
    expect(onChange).toHaveBeenCalledTimes(2);
    for (const kind of [SECRET, CONFIG_MAP]) {
      expect(watcher.listCalls(kind)).toContainEqual(
        expect.objectContaining({ namespace: 'kapp-lambda', fieldSelector: SELECTOR }),
      );
      expect(watcher.watchCalls(kind)).toContainEqual(
        expect.objectContaining({ namespace: 'kapp-lambda', fieldSelector: SELECTOR }),
      );
    }

    watcher.apply(secret('other', 'kapp-lambda'));
    watcher.apply(secret(NAME, 'elsewhere'));
    watcher.apply(configMap(NAME, 'elsewhere'));
    await settle();
    expect(onChange).toHaveBeenCalledTimes(2);

    watcher.apply(secret(NAME, 'kapp-lambda', { appDefaultSyncPeriod: 'Mm0=' }));
    await settle();
    expect(onChange).toHaveBeenCalledTimes(3);
    watcher.apply(configMap(NAME, 'kapp-lambda', { caCerts: 'x' }));
    await settle();
    expect(onChange).toHaveBeenCalledTimes(4);
    watcher.remove(SECRET, 'kapp-lambda', NAME);
    await settle();
    expect(onChange).toHaveBeenCalledTimes(5);
    expect(transport.take()).toEqual([]);
  });

  it('after 410 the relist reports a change made while the watch was away, and nothing when none was', async () => {
    const onChange = vi.fn();
    start({ controllerConfig: { namespace: 'kapp-lambda', onChange } });
    await settle();
    expect(onChange).toHaveBeenCalledTimes(2);

    watcher.dropWatches(SECRET);
    watcher.apply(secret(NAME, 'kapp-lambda'));
    watcher.compact(SECRET);
    await settle(5_000);
    expect(fwd!.stats().gone).toBeGreaterThan(0);
    expect(onChange).toHaveBeenCalledTimes(3);

    const gone = fwd!.stats().gone;
    watcher.dropWatches(SECRET);
    watcher.apply(secret('unrelated', 'kapp-lambda'));
    watcher.compact(SECRET);
    await settle(5_000);
    expect(fwd!.stats().gone).toBeGreaterThan(gone);
    expect(onChange).toHaveBeenCalledTimes(3);
  });

  it('a throwing onChange is logged and the watch goes on', async () => {
    const warn = vi.fn();
    const onChange = vi.fn(() => {
      throw new Error('boom');
    });
    start({
      controllerConfig: { namespace: 'kapp-lambda', onChange },
      logger: { info: () => {}, debug: () => {}, warn },
    });
    await settle();
    watcher.apply(configMap(NAME, 'kapp-lambda'));
    await settle();
    expect(onChange).toHaveBeenCalledTimes(3);
    expect(warn).toHaveBeenCalledWith(
      expect.objectContaining({ error: 'boom' }),
      'kapp-controller-config onChange failed',
    );
  });
});

describe('forwarder: a failing PackageRepository or PackageInstall over one hour, default settings', () => {
  const HOUR = 3_600_000;

  it('a PackageRepository whose fetch keeps failing is asked 13 times in its first hour: after 2, 4, … 512 s, then every 600 s (its sync period); its own status writes ask nothing', async () => {
    const repo = (status: Record<string, unknown>): KubeObject => ({
      apiVersion: PKGR.apiVersion,
      kind: PKGR.kind,
      metadata: { name: 'repo', namespace: 'default', uid: 'uid-repo', resourceVersion: '', generation: 1 },
      spec: { fetch: { git: { url: 'https://unreachable.example/r', ref: 'origin/main' } } },
      status,
    });
    const failedAt = (at: number, n: number): Record<string, unknown> => ({
      observedGeneration: 1,
      conditions: [
        {
          type: 'ReconcileFailed',
          status: 'True',
          message: 'Fetching resources: Error (see .status.usefulErrorMessage for details)',
        },
      ],
      fetch: { exitCode: 1, error: 'Fetching resources: ...', updatedAt: iso(at) },
      consecutiveReconcileFailures: n,
      consecutiveReconcileSuccesses: 0,
    });
    let failures = 1;
    let status = failedAt(T0, failures);
    watcher.apply(repo(status));
    start({ kinds: watchedKinds(['PackageRepository']) });
    await settle(0);
    const waits: number[] = [];
    for (;;) {
      const due = fwd!.dueAt(PKGR, 'default', 'repo')!;
      if (due > T0 + HOUR) break;
      waits.push((due - Date.parse(iso(Date.parse((status.fetch as { updatedAt: string }).updatedAt)))) / 1000);
      await vi.advanceTimersByTimeAsync(due - Date.now());
      await settle();
      expect(transport.take()).toEqual([expect.stringMatching(/^resync repo /)]);
      // The run: `Reconciling`, then failed again 5 s later (longer than the 0-5 s jitter of the
      // in-flight status's due time), as index-repo writes them.
      watcher.apply(repo({ ...status, conditions: [{ type: 'Reconciling', status: 'True' }] }));
      await settle(5000);
      status = failedAt(Date.now(), ++failures);
      watcher.apply(repo(status));
      await settle(0);
      expect(transport.take()).toEqual([]);
    }
    expect(waits).toEqual([2, 4, 8, 16, 32, 64, 128, 256, 512, 600, 600, 600, 600]);
  });

  it('a PackageInstall whose Package is missing is requeued in 16 messages in its first hour (20 requeues, the first five within one coalescing window), then every 1000 s', async () => {
    // The install run that fails again writes the same status: no watch event, no feedback.
    watcher.apply({
      apiVersion: PKGI.apiVersion,
      kind: PKGI.kind,
      metadata: { name: 'inst', namespace: 'default', uid: 'uid-inst', resourceVersion: '', generation: 1 },
      spec: { packageRef: { refName: 'p' } },
      status: {
        observedGeneration: 1,
        conditions: [{ type: 'ReconcileFailed', status: 'True', message: 'Package p not found' }],
      },
    });
    start({ kinds: watchedKinds(['PackageInstall']) });
    await vi.advanceTimersByTimeAsync(HOUR);
    const first = transport.batches.flat();
    expect(transport.take()).toEqual(Array(16).fill('resync inst 1001'));
    expect(new Set(first.map((e) => e.id)).size).toBe(16);
    await vi.advanceTimersByTimeAsync(HOUR);
    expect(transport.take()).toEqual(Array(3).fill('resync inst 1001'));
  });
});
