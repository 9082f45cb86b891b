/**
 * e2e fault (issue 7, item 9): the API server paused (SIGSTOP) for 20 s while kapp runs; the
 * App still converges.
 *
 * A paused API server stalls every client of it, and a runtime whose Lease renewals hang for
 * its 10 s renew deadline stops leading. So that the other files of the run (sharing the
 * global setup's control plane, in parallel) see none of this, this file starts its own control
 * plane (`test/harness/cluster.ts`, the same binaries and settings: kube-controller-manager and
 * kube-scheduler without leader election) and pauses only that one's API server.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Cluster, startCluster } from '../harness/cluster.js';
import { apiServerPidOf, kappProcesses, procState } from './faults-support.js';
import {
  type E2ECluster,
  e2eCluster,
  expectSucceeded,
  inlineConfigMapApp,
  PRODUCTION_LEASE,
  succeededAt,
  suffix,
  useE2ERuntime,
  waitFor,
} from './support.js';

const id = suffix();
const NS = `e2e-flt-pause-${id}`;

/** Timings, printed at the end (for the report). */
const timings: Record<string, unknown> = {};
const since = (t0: number) => Date.now() - t0;

let cluster: Cluster | undefined;
let kube: E2ECluster;
let apiserverPid: number | undefined;

// Hooks: the cluster starts first and stops last; the API server is resumed before anything
// else ends (afterAll hooks run in reverse order of registration).
beforeAll(async () => {
  const t0 = Date.now();
  cluster = await startCluster({ log: (m) => process.stderr.write(`[faults-pause] ${m}\n`) });
  kube = e2eCluster(cluster.kubeconfigPath);
  timings.ownClusterStartMs = since(t0);
});
afterAll(async () => {
  await cluster?.stop();
  process.stderr.write(`[faults-pause] timings ${JSON.stringify(timings, null, 1)}\n`);
});

// Production Lease timings: the pause outlasts the renew deadline, so the runtime loses its
// Lease and takes it again once the API server is back (recorded in the timings).
const rt = useE2ERuntime([NS], { cluster: () => kube, overrides: PRODUCTION_LEASE });

afterAll(() => {
  // Never leave the API server stopped (the runtime's stop and the cluster's stop need it).
  if (apiserverPid) {
    try {
      process.kill(apiserverPid, 'SIGCONT');
    } catch {
      // gone
    }
  }
});

const greetingOf = async (ns: string, name: string) =>
  (await kube.getObject<{ data?: Record<string, string> }>('configmap', ns, `${name}-config`))?.data?.greeting;

describe('faults: the API server', () => {
  it('the API server paused (SIGSTOP) for 20 s while kapp runs: the App still converges', async () => {
    // The harness runs kube-controller-manager and kube-scheduler without leader election, so
    // they survive the pause (with it they exited after their 10 s renew deadline). The App
    // deploys ConfigMaps.
    const ns = NS;
    const name = `pause-${id}`;
    apiserverPid = apiServerPidOf(cluster!);
    const t0 = Date.now();
    await kube.apply(inlineConfigMapApp(ns, name, `paused ${id}`));
    await waitFor(
      'kapp to run for the App',
      async () => ((kappProcesses().get(name)?.length ?? 0) > 0 ? true : undefined),
      {
        timeoutMs: 120_000,
        intervalMs: 20,
      },
    );
    const stoppedAt = Date.now();
    let kappAliveAtStop = false;
    try {
      process.kill(apiserverPid, 'SIGSTOP');
      kappAliveAtStop = (kappProcesses().get(name)?.length ?? 0) > 0;
      // A signal is delivered asynchronously: the process shows `T` once every thread stopped.
      const pid = apiserverPid;
      await waitFor('the API server to stop', async () => (procState(pid) === 'T' ? true : undefined), {
        timeoutMs: 5000,
        intervalMs: 10,
      }).catch(() => undefined);
      expect(procState(apiserverPid)).toBe('T');
      await new Promise((r) => setTimeout(r, 20_000));
    } finally {
      process.kill(apiserverPid, 'SIGCONT');
    }
    const resumedAt = Date.now();
    const app = await rt.waitForApp(ns, name, succeededAt(1), 'ReconcileSucceeded after the pause', 240_000);
    timings['apiserver-sigstop-20s'] = {
      kappAliveAtStop,
      createdToPauseMs: stoppedAt - t0,
      pausedMs: resumedAt - stoppedAt,
      convergedAfterResumeMs: since(resumedAt),
      runs: rt.stageRuns(ns, name).map((r) => `${r.stage}:${r.outcome}`),
      crashes: rt
        .logsFor(ns, name)
        .filter((r) => r.msg === 'stage crashed; retrying')
        .map((r) => r.obj.error),
      leaderLogs: rt.records
        .filter((r) => String(r.msg).startsWith('leader election'))
        .map((r) => r.msg)
        .slice(-6),
    };
    await expectSucceeded(app, kube);
    expect(await greetingOf(ns, name)).toBe(`paused ${id}`);
  }, 400_000);
});
