/**
 * e2e: two embedded runtimes serving one cluster (two `npm start`) do not both act. Per
 * cluster, a `coordination.k8s.io/v1` Lease elects one (`events/forwarder/leadership.ts`):
 * only it forwards events and runs stages, so a burst of Apps all succeed with no kapp
 * conflict; when the leader stops renewing (as if it crashed: the Lease is not released), the
 * other takes over after the lease duration (15 s, as observed by it) and reconciles new Apps.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  apply,
  applyCrds,
  createTenant,
  deleteNamespaces,
  type E2ERuntime,
  expectSucceeded,
  getApp,
  inlineConfigMapApp,
  PRODUCTION_LEASE,
  startRuntime,
  suffix,
  waitFor,
} from './support.js';

const id = suffix();
const NS = `e2e-leader-${id}`;
const APPS = 20;
const names = Array.from({ length: APPS }, (_, i) => `app-${i}-${id}`);

let first: E2ERuntime;
let second: E2ERuntime;

const stageRuns = (rt: E2ERuntime) => rt.records.filter((r) => r.msg === 'stage run').map((r) => r.obj);

beforeAll(async () => {
  await applyCrds();
  await createTenant(NS);
  first = await startRuntime([NS], PRODUCTION_LEASE);
  second = await startRuntime([NS], PRODUCTION_LEASE);
});

afterAll(async () => {
  await first?.dispose();
  await second?.dispose();
  await deleteNamespaces([NS]);
});

describe('two runtimes on one cluster', () => {
  it('only the Lease holder forwards and runs stages: a burst of Apps all succeed without kapp conflicts', async () => {
    const [clusterId] = first.runtime.registry.clusterIds();
    const leaderOf = async () =>
      await waitFor(
        'exactly one runtime to lead',
        async () => {
          const l = [first, second].filter((rt) => rt.runtime.leading().includes(clusterId!));
          return l.length === 1 ? l[0] : undefined;
        },
        { timeoutMs: 30_000, intervalMs: 100 },
      );
    const leader = await leaderOf();
    const follower = leader === first ? second : first;
    expect(follower.runtime.leading()).toEqual([]);
    expect(follower.runtime.forwarders).toEqual([]);

    await apply(...names.map((n) => inlineConfigMapApp(NS, n, `hello ${n}`)));
    for (const n of names) {
      const app = await leader.waitReconciled(NS, n, 300_000);
      await expectSucceeded(app);
      // no kapp conflict ("the object has been modified", "Conflict") anywhere in status
      expect(JSON.stringify(app.status)).not.toMatch(/conflict|has been modified/i);
    }

    // every App ran its stages in the leader, none in the follower
    for (const n of names) {
      expect(leader.stageRuns(NS, n).filter((r) => r.stage === 'deploy' && r.outcome === 'succeeded')).toHaveLength(1);
    }
    expect(stageRuns(follower)).toEqual([]);
    expect(follower.records.filter((r) => r.msg === 'stage crashed; retrying')).toEqual([]);
    expect(follower.runtime.electors.get(clusterId!)?.stats().acquired).toBe(0);
    expect(leader.runtime.electors.get(clusterId!)?.stats()).toMatchObject({ acquired: 1, lost: 0 });

    // The leader stops renewing without releasing the Lease (as a crashed process would).
    const before = stageRuns(leader).length;
    const abandonedAt = Date.now();
    await leader.runtime.electors.get(clusterId!)!.stop({ release: false });
    expect(leader.runtime.leading()).toEqual([]);
    expect(leader.runtime.forwarders).toEqual([]);
    await waitFor(
      'the other runtime to take the lease over',
      async () => (follower.runtime.leading().includes(clusterId!) ? true : undefined),
      { timeoutMs: 30_000, intervalMs: 100 },
    );
    const tookMs = Date.now() - abandonedAt;
    // It waited for the Lease to expire (15 s since it last saw a renewal, ≤ 2 s before the
    // stop), and took it on one of its next tries (every 2–2.4 s): 17.4 s at most when each try
    // is instant; a try's GET and PUT take seconds on a loaded machine, so the bound is 27 s
    // (22 s left under 5 s for them), still short of a second lease period.
    expect(tookMs).toBeGreaterThanOrEqual(12_000);
    expect(tookMs).toBeLessThan(27_000);

    // The new leader resumes from status alone: nothing re-runs for the handled Apps ...
    const late = `late-${id}`;
    await apply(inlineConfigMapApp(NS, late, 'after the takeover'));
    const app = await follower.waitReconciled(NS, late, 120_000);
    await expectSucceeded(app);
    // ... and it reconciles a new one; the old leader ran nothing since it stopped leading.
    expect(
      follower
        .stageRuns(NS, late)
        .filter((r) => r.stage === 'deploy')
        .map((r) => r.outcome),
    ).toEqual(['succeeded']);
    expect(stageRuns(follower).filter((r) => !String(r.object).endsWith(`/${late}`))).toEqual([]);
    expect(stageRuns(leader).length).toBe(before);
    for (const n of names) {
      const a = await getApp(NS, n);
      expect(a?.status?.consecutiveReconcileSuccesses, n).toBe(1);
    }
  });
});
