/**
 * The embedded runtime's use of the election (`events/forwarder/leadership.ts`,
 * `functions/embedded/leadership.ts`): the lease name per watch scope, the gated registry that
 * refuses stages and writes for a cluster this runtime does not lead, a cluster's forwarder running only while leading (a real
 * {@link Forwarder} over the in-memory watcher, a Lease port with optimistic concurrency), and a
 * stage running when the lease is lost aborted (the real pipeline over the fake cluster and runner).
 */
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { Forwarder } from '../../events/forwarder/forwarder.js';
import { ClusterLeadership, LEASE_BASE_NAME, leaseNameFor, NotLeaderError } from '../../events/forwarder/leadership.js';
import { FakeObjectWatcher } from '../../events/forwarder/testing.js';
import { type ObjectEvent, objectEvent } from '../../events/schema.js';
import { leaderGatedRegistry } from '../../functions/embedded/leadership.js';
import { EmbeddedPipeline } from '../../functions/embedded/pipeline.js';
import { CommandCanceledError } from '../../functions/lib/exec/runner.js';
import type { ClusterRegistry, DeployView, FetchView, KubeObject } from '../../functions/lib/kube/port.js';
import { appObject, appWorld, NOW, REF, vendirWrites } from './support/app-world.js';
import { OneLease } from './support/one-lease.js';
import { useTempDir } from './support/stage-deps.js';

const T0 = Date.parse('2025-03-01T10:00:00.000Z');
const APP = { apiVersion: 'kappctrl.k14s.io/v1alpha1', kind: 'App' };

describe('leaseNameFor', () => {
  it('is the base name for all namespaces, and a stable hash of the set otherwise', () => {
    expect(leaseNameFor(undefined)).toBe('kapp-lambda-forwarder');
    expect(leaseNameFor([])).toBe(LEASE_BASE_NAME);
    const ab = leaseNameFor(['team-a', 'team-b']);
    expect(ab).toMatch(/^kapp-lambda-forwarder-[0-9a-f]{10}$/);
    expect(leaseNameFor(['team-b', 'team-a', 'team-b'])).toBe(ab);
    expect(leaseNameFor(['team-a'])).not.toBe(ab);
    expect(ab.length).toBeLessThanOrEqual(63);
  });
});

/** A registry whose views record calls and answer trivially. */
function recordingRegistry(calls: string[]): ClusterRegistry {
  const reads = (id: string) => ({
    getObject: async () => {
      calls.push(`${id} getObject`);
      return undefined;
    },
    getSecret: async () => undefined,
    getConfigMap: async () => undefined,
    getNamespace: async () => undefined,
  });
  const write =
    (id: string, op: string) =>
    async (..._args: unknown[]) => {
      calls.push(`${id} ${op}`);
      return { resourceVersion: '2' } as never;
    };
  return {
    clusterIds: () => ['c1', 'c2'],
    client: () => ({}) as never,
    fetchView: (id) => ({ ...reads(id), updateStatus: write(id, 'updateStatus') }) as FetchView,
    deployView: (id) =>
      ({
        ...reads(id),
        listConfigMaps: async () => [],
        updateStatus: write(id, 'updateStatus'),
        addFinalizer: write(id, 'addFinalizer'),
        removeFinalizer: write(id, 'removeFinalizer'),
        serviceAccountToken: write(id, 'serviceAccountToken'),
        serverVersion: async () => '1.34.0',
        apiGroupVersions: async () => ['v1'],
        apiServer: () => ({ server: 'https://127.0.0.1:6443' }),
      }) as DeployView,
    watchView: () => ({}) as never,
  };
}

describe('leaderGatedRegistry', () => {
  const ref = { apiVersion: APP.apiVersion, kind: 'App', namespace: 'ns', name: 'a' };
  const pre = { resourceVersion: '1', uid: 'u' };

  it('refuses to hand out stage views of a cluster it does not lead; other clusters are unaffected', () => {
    const leading = new Set(['c2']);
    const r = leaderGatedRegistry(recordingRegistry([]), (id) => leading.has(id));
    expect(() => r.fetchView('c1')).toThrow(NotLeaderError);
    expect(() => r.deployView('c1')).toThrow('not the leader of cluster "c1": another runtime holds its lease');
    expect(() => r.client('c1')).toThrow(NotLeaderError);
    expect(r.fetchView('c2')).toBe(r.fetchView('c2'));
    expect(r.clusterIds()).toEqual(['c1', 'c2']);
  });

  it("passes the cluster's recorded global namespace uid through (a fact of its document, no access)", () => {
    const inner = { ...recordingRegistry([]), packagingGlobalNamespaceUid: (id: string) => `uid:${id}` };
    expect(leaderGatedRegistry(inner, () => true).packagingGlobalNamespaceUid?.('c1')).toBe('uid:c1');
  });

  it('refuses every write of a view obtained while leading once the lease is lost; reads pass', async () => {
    const calls: string[] = [];
    const leading = new Set(['c1']);
    const r = leaderGatedRegistry(recordingRegistry(calls), (id) => leading.has(id));
    const fetch = r.fetchView('c1');
    const deploy = r.deployView('c1');
    await fetch.updateStatus(ref, pre, {});
    leading.delete('c1');
    await expect(fetch.updateStatus(ref, pre, {})).rejects.toBeInstanceOf(NotLeaderError);
    await expect(deploy.updateStatus(ref, pre, {})).rejects.toBeInstanceOf(NotLeaderError);
    await expect(deploy.addFinalizer(ref, 'f')).rejects.toBeInstanceOf(NotLeaderError);
    await expect(deploy.removeFinalizer(ref, 'f')).rejects.toBeInstanceOf(NotLeaderError);
    await expect(deploy.serviceAccountToken('ns', 'sa')).rejects.toBeInstanceOf(NotLeaderError);
    expect(await deploy.getObject(ref)).toBeUndefined();
    expect(calls).toEqual(['c1 updateStatus', 'c1 getObject']);
    expect(Object.isFrozen(fetch)).toBe(true);
    expect(Object.keys(fetch).sort()).toEqual([
      'getConfigMap',
      'getNamespace',
      'getObject',
      'getSecret',
      'updateStatus',
    ]);
  });
});

function app(name: string, generation = 1): KubeObject {
  return {
    ...APP,
    metadata: { name, namespace: 'default', uid: `uid-${name}`, resourceVersion: '', generation },
    spec: { fetch: [{ inline: {} }], template: [{ ytt: {} }], deploy: [{ kapp: {} }] },
  };
}

describe('ClusterLeadership', () => {
  let watcher: FakeObjectWatcher;
  let lease: OneLease;
  let received: string[];
  let made: number;
  let leadership: ClusterLeadership;

  beforeEach(() => {
    vi.useFakeTimers({ now: T0 });
    watcher = new FakeObjectWatcher();
    lease = new OneLease();
    received = [];
    made = 0;
    leadership = new ClusterLeadership({
      clusterId: 'c1',
      election: { lease: lease.view, namespace: 'kapp-lambda', name: 'l', identity: 'me', random: () => 0.5 },
      makeForwarder: (transport) => {
        made++;
        return new Forwarder({ clusterId: 'c1', watcher, transport, coalesceWindowMs: 10, random: () => 0.5 });
      },
      transport: {
        send: async (events: ObjectEvent[]) => {
          for (const e of events) {
            const d = e.data as { name: string; reason: string; generation: number };
            received.push(`${d.reason} ${d.name} ${d.generation}`);
          }
        },
      },
    });
  });

  afterEach(async () => {
    await leadership.stop();
    vi.useRealTimers();
  });

  it('forwards nothing while another runtime holds the lease, then takes over and forwards from status', async () => {
    lease.put({ holderIdentity: 'other', leaseDurationSeconds: 15 });
    const keepAlive = setInterval(() => lease.put({ holderIdentity: 'other', leaseDurationSeconds: 15 }), 2000);
    watcher.apply(app('a'));
    leadership.start();
    await vi.advanceTimersByTimeAsync(30_000);
    watcher.apply(app('b'));
    await vi.advanceTimersByTimeAsync(1_000);
    expect(leadership.isLeader()).toBe(false);
    expect(leadership.forwarder).toBeUndefined();
    expect(made).toBe(0);
    expect(watcher.calls).toEqual([]); // not even a list
    expect(received).toEqual([]);

    clearInterval(keepAlive); // the other runtime dies
    await vi.advanceTimersByTimeAsync(18_000);
    expect(leadership.isLeader()).toBe(true);
    expect(made).toBe(1);
    // a new leader starts from a list: both never-reconciled Apps are `added`
    expect(received.sort()).toEqual(['added a 1', 'added b 1']);
  });

  it('stops forwarding the moment the lease is lost, and starts a fresh forwarder when it leads again', async () => {
    leadership.start();
    await vi.advanceTimersByTimeAsync(500);
    expect(leadership.isLeader()).toBe(true);
    watcher.apply(app('a'));
    await vi.advanceTimersByTimeAsync(100);
    expect(received).toEqual(['added a 1']);
    const first = leadership.forwarder;

    // another runtime takes the lease over (e.g. we were partitioned); our next renewal sees it
    lease.put({ holderIdentity: 'other', leaseDurationSeconds: 15 });
    await vi.advanceTimersByTimeAsync(2_000);
    expect(leadership.isLeader()).toBe(false);
    expect(leadership.forwarder).toBeUndefined();
    watcher.apply(app('a', 2));
    watcher.apply(app('c'));
    await vi.advanceTimersByTimeAsync(5_000);
    expect(received).toEqual(['added a 1']);

    // the other goes away; we lead again with a new forwarder that derives work from the objects
    await vi.advanceTimersByTimeAsync(20_000);
    expect(leadership.isLeader()).toBe(true);
    expect(leadership.forwarder).toBeDefined();
    expect(leadership.forwarder).not.toBe(first);
    expect(made).toBe(2);
    expect(received.slice(1).sort()).toEqual(['added a 2', 'added c 1']);
  });

  it('a batch sent while a renewal is overdue (the term not yet ended) is retried, not dropped', async () => {
    leadership.start();
    await vi.advanceTimersByTimeAsync(500);
    expect(leadership.isLeader()).toBe(true);
    // The renewal is late and its deadline timer has not fired: isLeader() already says no.
    const overdue = vi.spyOn(leadership.elector, 'isLeader').mockReturnValue(false);
    watcher.apply(app('a'));
    await vi.advanceTimersByTimeAsync(100);
    expect(received).toEqual([]);
    expect(leadership.forwarder?.stats().sendErrors).toBeGreaterThan(0);
    // The renewal lands in the same term: the outbox's retry delivers the batch.
    overdue.mockRestore();
    await vi.advanceTimersByTimeAsync(30_000);
    expect(received).toEqual(['added a 1']);
    expect(made).toBe(1);
  });

  it("a stage's term signal: aborted while not leading, fresh per term, aborted with NotLeaderError when the lease is lost", async () => {
    const before = leadership.termSignal;
    expect(before.aborted).toBe(true);
    expect(before.reason).toBeInstanceOf(NotLeaderError);
    leadership.start();
    await vi.advanceTimersByTimeAsync(500);
    const first = leadership.termSignal;
    expect(first.aborted).toBe(false);
    // another runtime takes the lease over: the running stages' signal aborts with the term
    lease.put({ holderIdentity: 'other', leaseDurationSeconds: 15 });
    await vi.advanceTimersByTimeAsync(2_000);
    expect(leadership.isLeader()).toBe(false);
    expect(first.aborted).toBe(true);
    expect(first.reason).toBeInstanceOf(NotLeaderError);
    expect((first.reason as NotLeaderError).clusterId).toBe('c1');
    expect(leadership.termSignal.aborted).toBe(true);
    // leading again: a new signal for new stages, the old one stays aborted
    await vi.advanceTimersByTimeAsync(20_000);
    expect(leadership.isLeader()).toBe(true);
    expect(leadership.termSignal.aborted).toBe(false);
    expect(leadership.termSignal).not.toBe(first);
    expect(first.aborted).toBe(true);
  });

  it('stopForwarding lets running stages end: their term signal is aborted only when the lease goes', async () => {
    leadership.start();
    await vi.advanceTimersByTimeAsync(500);
    const term = leadership.termSignal;
    await leadership.stopForwarding();
    await vi.advanceTimersByTimeAsync(6_000);
    expect(term.aborted).toBe(false);
    await leadership.stop();
    expect(term.aborted).toBe(true);
  });

  it('stopForwarding keeps the lease; stop releases it', async () => {
    leadership.start();
    await vi.advanceTimersByTimeAsync(500);
    await leadership.stopForwarding();
    expect(leadership.forwarder).toBeUndefined();
    await vi.advanceTimersByTimeAsync(6_000);
    expect(leadership.isLeader()).toBe(true);
    expect(lease.lease?.spec.holderIdentity).toBe('me');
    expect(made).toBe(1);
    await leadership.stop();
    expect(leadership.isLeader()).toBe(false);
    expect(lease.lease?.spec).toMatchObject({ holderIdentity: '', leaseDurationSeconds: 1 });
  });
});

describe('a runtime losing the lease while a stage runs', () => {
  const tempDir = useTempDir('embedded-leadership-');
  const MANIFEST = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n';

  it('kills the running kapp (its runner signal aborts), writes no status as the ex-leader, parks the stage and runs it again once it leads again', async () => {
    const w = appWorld({ app: appObject(), tmpRoot: path.join(tempDir(), 'scratch') });
    w.runner.on('vendir', vendirWrites());
    w.runner.on('ytt', { stdout: MANIFEST, exitCode: 0 });
    let kapp: { signal: AbortSignal | undefined; statusesAtStart: number } | undefined;
    w.runner.on('kapp', { stdout: '', exitCode: 0 }); // other kapp commands (a later rule wins)
    // kapp deploy runs until it is canceled, as a deploy waiting on its resources does.
    w.runner.on(
      'kapp',
      async (req) => {
        if (kapp) return { stdout: '', exitCode: 0 }; // the run after the parked one: succeeds
        kapp = { signal: req.signal, statusesAtStart: w.statuses().length };
        await new Promise<void>((resolve) => {
          if (!req.signal || req.signal.aborted) return resolve();
          req.signal.addEventListener('abort', () => resolve(), { once: true });
        });
        return { exitCode: -1, error: new CommandCanceledError('kapp', true, req.signal?.reason) };
      },
      (args) => args.includes('deploy'),
    );

    // The runtime's wiring (`startEmbedded`): a real election over a Lease port, the gated
    // registry and the pipeline's stage signal from the cluster's term.
    const lease = new OneLease();
    const leadership = new ClusterLeadership({
      clusterId: REF.clusterId,
      election: {
        lease: lease.view,
        namespace: 'kapp-lambda',
        name: 'l',
        identity: 'me',
        leaseDurationMs: 1_500,
        renewDeadlineMs: 1_000,
        retryPeriodMs: 50,
        random: () => 0.5,
      },
      makeForwarder: () => ({ start: () => {}, stop: async () => {} }) as unknown as Forwarder,
      transport: { send: async () => {} },
      onTermStarted: () => pipeline.resume(REF.clusterId),
    });
    const deps = { ...w.deps, clusters: leaderGatedRegistry(w.deps.clusters, () => leadership.isLeader()) };
    const retries: (() => void)[] = [];
    const pipeline: EmbeddedPipeline = new EmbeddedPipeline(deps, {
      stageSignal: () => leadership.termSignal,
      acting: () => leadership.isLeader(),
      setTimer: (fn) => {
        retries.push(fn);
        return { cancel: () => {} };
      },
    });
    try {
      leadership.start();
      await until(() => leadership.isLeader());
      await pipeline.send([objectEvent(REF, 'added', { time: new Date(NOW) })]);
      await until(() => kapp !== undefined);
      expect(kapp?.signal?.aborted).toBe(false);
      const written = w.statuses().length;
      expect(written).toBe(kapp?.statusesAtStart);

      // Another runtime takes the Lease over (this one was partitioned, or stalled).
      lease.put({ holderIdentity: 'other', leaseDurationSeconds: 15 });
      await until(() => pipeline.parkedCount === 1); // parked, not retried against the bound
      expect(retries).toHaveLength(0);
      expect(leadership.isLeader()).toBe(false);
      expect(kapp?.signal?.aborted).toBe(true);
      expect(kapp?.signal?.reason).toBeInstanceOf(NotLeaderError);
      // Not even the failed deploy's status: the new leader owns the App now.
      expect(w.statuses()).toHaveLength(written);
      const parked = w.log.records.find((r) => r.msg?.startsWith('stage parked'));
      expect(parked?.obj.error).toBe('not the leader of cluster "c1": another runtime holds its lease');
      expect(w.tools().filter((t) => t === 'kapp')).toHaveLength(1);
      await pipeline.idle();
      expect(w.tools().filter((t) => t === 'kapp')).toHaveLength(1);

      // The other runtime goes away; this one takes the Lease again and runs the parked deploy.
      lease.put({ holderIdentity: '', leaseDurationSeconds: 1 });
      await until(() => leadership.isLeader());
      await until(() => w.tools().filter((t) => t === 'kapp').length === 2);
      expect(pipeline.parkedCount).toBe(0);
      await pipeline.idle();
      expect(w.statuses().at(-1)?.conditions?.[0]?.type).toBe('ReconcileSucceeded');
    } finally {
      pipeline.close();
      await leadership.stop();
    }
  });
});

/** Resolves once `cond` holds, polling every 5 ms (fails the test after 10 s). */
async function until(cond: () => boolean): Promise<void> {
  for (let i = 0; i < 2000 && !cond(); i++) await new Promise((r) => setTimeout(r, 5));
  expect(cond()).toBe(true);
}
