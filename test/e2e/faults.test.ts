/**
 * e2e: faults injected into the real control plane, each proven to converge to the right
 * status with nothing lost (issue 7, item 9):
 *
 * 1. the object store answers 503 for the next N calls during fetch, then during template
 *    (converges), and forever (bounded `ReconcileFailed` after 5 attempts, no crash loop, then
 *    success once the store heals);
 * 2. 409 conflicts on the App's status writes (converges with the right observedGeneration and
 *    conditions);
 * 3. the API server paused (SIGSTOP) for 20 s while kapp waits on a Deployment;
 * 4. the runtime (a separate `scripts/start.ts` process) SIGKILLed while kapp runs: kapp dies
 *    with it (PR_SET_PDEATHSIG), the restarted runtime finishes the App, never two kapps at once;
 *
 * Faults 1 and 2 are injected at the ports (`wrapDeps`); 3 and 4/5 with signals to real processes
 * (only this run's own API server, found by its work directory and port).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { closeSync, openSync, readdirSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import type { EmbeddedOptions } from '../../functions/embedded/runtime.js';
import {
  type ClusterRegistry,
  ConflictError,
  type ResourceRef,
  type StatusWriter,
} from '../../functions/lib/kube/port.js';
import type { DispatchDeps } from '../../functions/lib/pipeline/runtime.js';
import { type ObjectStore, StoreError, type StoreOp } from '../../functions/lib/store/port.js';
import {
  type AppObject,
  apply,
  applyCrds,
  appManifest,
  createTenant,
  deleteNamespaces,
  type E2ERuntime,
  expectFailed,
  expectSucceeded,
  getApp,
  getObject,
  inlineConfigMapApp,
  kubeconfigPath,
  reconciled,
  startRuntime,
  suffix,
  waitFor,
} from './support.js';

const id = suffix();
const NS = {
  store: `e2e-flt-store-${id}`,
  conflict: `e2e-flt-409-${id}`,
  pause: `e2e-flt-pause-${id}`,
};
/** Served only by the child-process runtime (its own Lease: another namespace scope). */
const CHILD_NS = `e2e-flt-kill-${id}`;
const REPO = fileURLToPath(new URL('../..', import.meta.url));

/** Timings of each fault, printed at the end (for the report). */
const timings: Record<string, unknown> = {};
const since = (t0: number) => Date.now() - t0;

// ---------------------------------------------------------------------------------------------
// Port faults (fault 1 and 2)

/** Store fault: the next `remaining` calls on keys matching `keys` reject with a 503. */
const storeFault = { keys: /^$/, remaining: 0, injected: 0 };
const STORE_503 = '503 SlowDown: Please reduce your request rate (injected)';

/** Keys the fetch stage owns: the pinned fetch cache and the fetch artifacts. */
const FETCH_KEYS = /^(cache|artifacts)\/fetch\//;
/** Keys the template stage owns: the render cache and the rendered manifests. */
const TEMPLATE_KEYS = /^(cache\/render|artifacts\/template)\//;

function faultyStore(store: ObjectStore): ObjectStore {
  const gate =
    <A extends unknown[], R>(op: StoreOp, fn: (key: string, ...rest: A) => Promise<R>) =>
    async (key: string, ...rest: A): Promise<R> => {
      if (storeFault.remaining > 0 && storeFault.keys.test(key)) {
        storeFault.remaining--;
        storeFault.injected++;
        throw new StoreError(STORE_503, op, key);
      }
      return await fn(key, ...rest);
    };
  return {
    get: gate('get', (key, opts) => store.get(key, opts)),
    head: gate('head', (key) => store.head(key)),
    putIfAbsent: gate('putIfAbsent', (key, body) => store.putIfAbsent(key, body)),
    put: gate('put', (key, body) => store.put(key, body)),
    list: (prefix, opts) => store.list(prefix, opts),
    delete: (key) => store.delete(key),
  };
}

/** Status-write fault: the next `remaining` status writes of App `name` throw a 409. */
const conflictFault = { name: '', remaining: 0, injected: 0, writes: 0 };

function conflictingView<V extends StatusWriter>(view: V): V {
  // The registry's views are frozen objects: a Proxy may not change their members, so copy them.
  const copy: Record<string, unknown> = {};
  for (const key of Object.keys(view)) {
    const v = (view as unknown as Record<string, unknown>)[key];
    copy[key] = typeof v === 'function' ? v.bind(view) : v;
  }
  const update: StatusWriter['updateStatus'] = async (ref: ResourceRef, pre, status) => {
    if (ref.kind === 'App' && ref.name === conflictFault.name) {
      if (conflictFault.remaining > 0) {
        conflictFault.remaining--;
        conflictFault.injected++;
        throw new ConflictError(
          `updating status of App ${ref.namespace}/${ref.name}: 409 Operation cannot be fulfilled: the object has been modified (injected)`,
          { reason: 'Conflict' },
        );
      }
      conflictFault.writes++;
    }
    return await view.updateStatus(ref, pre, status);
  };
  copy.updateStatus = update;
  return copy as unknown as V;
}

function conflictingRegistry(r: ClusterRegistry): ClusterRegistry {
  return {
    clusterIds: () => r.clusterIds(),
    client: (c) => r.client(c),
    fetchView: (c) => conflictingView(r.fetchView(c)),
    deployView: (c) => conflictingView(r.deployView(c)),
    watchView: (c) => r.watchView(c),
  };
}

const runtimeOptions: Partial<EmbeddedOptions> = {
  wrapDeps: (deps: DispatchDeps): DispatchDeps => ({
    ...deps,
    store: faultyStore(deps.store),
    clusters: conflictingRegistry(deps.clusters),
  }),
};

// ---------------------------------------------------------------------------------------------
// Processes (fault 3, 4, 5)

/** argv of a live process, `undefined` when it is gone (or a zombie). */
function argvOf(pid: string): string[] | undefined {
  try {
    const raw = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    return raw ? raw.split('\0').filter((a, i, all) => a !== '' || i < all.length - 1) : undefined;
  } catch {
    return undefined;
  }
}

/** Live `kapp` processes (argv[0] is the kapp binary), by App (`--prev-app <name>-ctrl`). */
function kappProcesses(): Map<string, number[]> {
  const out = new Map<string, number[]>();
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    const argv = argvOf(pid);
    if (!argv || path.basename(argv[0] ?? '') !== 'kapp') continue;
    for (const a of argv) {
      const m = /^(?:--prev-app=)?(.+)-ctrl$/.exec(a);
      if (m) out.set(m[1]!, [...(out.get(m[1]!) ?? []), Number(pid)]);
    }
  }
  return out;
}

/** Samples /proc every 100 ms; `max` is the most kapp processes seen at once per App. */
function kappSampler() {
  const max = new Map<string, number>();
  const seen = new Map<string, Set<number>>();
  let samples = 0;
  const timer = setInterval(() => {
    samples++;
    for (const [app, pids] of kappProcesses()) {
      max.set(app, Math.max(max.get(app) ?? 0, pids.length));
      const s = seen.get(app) ?? new Set<number>();
      for (const p of pids) s.add(p);
      seen.set(app, s);
    }
  }, 100);
  return {
    max,
    seen,
    get samples() {
      return samples;
    },
    stop: () => clearInterval(timer),
  };
}

/**
 * The kube-apiserver of THIS run's cluster: a process whose argv[0] is `kube-apiserver` and
 * whose argv names both the cluster's work directory (the kubeconfig's directory) and its port.
 * @throws Error unless exactly one matches (never signal a guess: other clusters may run).
 */
function ourApiServerPid(): number {
  const cluster = inject('cluster');
  const workdir = path.dirname(cluster.kubeconfigPath);
  const port = new URL(cluster.server).port;
  const found: number[] = [];
  for (const pid of readdirSync('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    const argv = argvOf(pid);
    if (!argv || path.basename(argv[0] ?? '') !== 'kube-apiserver') continue;
    const joined = argv.join(' ');
    if (joined.includes(`${workdir}/`) && new RegExp(`[=:]${port}(\\s|$)`).test(joined)) found.push(Number(pid));
  }
  if (found.length !== 1) throw new Error(`expected one kube-apiserver for ${workdir} port ${port}, found ${found}`);
  return found[0]!;
}

/** Process state letter from /proc/<pid>/stat (`T` when stopped). */
function procState(pid: number): string {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
}

/** A `scripts/start.ts` runtime in its own process group, logging to `logFile`. */
interface ChildRuntime {
  proc: ChildProcess;
  exited: Promise<void>;
  logFile: string;
}

function startChildRuntime(storeDir: string, logFile: string): ChildRuntime {
  const fd = openSync(logFile, 'a');
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    KUBECONFIG: kubeconfigPath,
    KAPP_LAMBDA_NAMESPACES: CHILD_NS,
    KAPP_LAMBDA_STORE: storeDir,
  };
  delete env.KAPP_LAMBDA_CONTEXTS;
  const proc = spawn('npx', ['tsx', 'scripts/start.ts'], {
    cwd: REPO,
    env,
    detached: true,
    stdio: ['ignore', fd, fd],
  });
  closeSync(fd);
  const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
  return { proc, exited, logFile };
}

function childLog(file: string): string {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return '';
  }
}

/** SIGKILLs the whole process group of a child runtime and waits for it to exit. */
async function killGroup(child: ChildRuntime): Promise<void> {
  if (child.proc.exitCode !== null || child.proc.signalCode !== null) return;
  try {
    process.kill(-child.proc.pid!, 'SIGKILL');
  } catch {
    // already gone
  }
  await child.exited;
}

/** A Deployment kapp waits on for about `minReadySeconds` (kwok Pods turn Ready at once). */
function slowDeployment(name: string, minReadySeconds: number): string {
  return [
    'apiVersion: apps/v1',
    'kind: Deployment',
    'metadata:',
    `  name: ${name}-slow`,
    'spec:',
    '  replicas: 1',
    `  minReadySeconds: ${minReadySeconds}`,
    `  selector: {matchLabels: {app: ${name}}}`,
    '  template:',
    `    metadata: {labels: {app: ${name}}}`,
    '    spec:',
    '      containers: [{name: c, image: registry.invalid/slow}]',
  ].join('\n');
}

function slowApp(ns: string, name: string, minReadySeconds: number): object {
  return appManifest(ns, name, {
    fetch: [{ inline: { paths: { 'deployment.yml': slowDeployment(name, minReadySeconds) } } }],
    template: [{ ytt: {} }],
    deploy: [{ kapp: { rawOptions: ['--wait-timeout=180s'] } }],
  });
}

// ---------------------------------------------------------------------------------------------

let rt: E2ERuntime;
let apiserverPid: number | undefined;
const children: ChildRuntime[] = [];
let childRoot: string | undefined;

beforeAll(async () => {
  await applyCrds();
  await Promise.all([...Object.values(NS), CHILD_NS].map(createTenant));
  rt = await startRuntime(Object.values(NS), runtimeOptions);
});

afterAll(async () => {
  // Never leave this run's API server stopped.
  if (apiserverPid) {
    try {
      process.kill(apiserverPid, 'SIGCONT');
    } catch {
      // gone
    }
  }
  for (const c of children) await killGroup(c);
  storeFault.remaining = 0;
  conflictFault.remaining = 0;
  await rt?.dispose();
  if (childRoot) await rm(childRoot, { recursive: true, force: true });
  await deleteNamespaces([...Object.values(NS), CHILD_NS]);
  process.stderr.write(`[faults] timings ${JSON.stringify(timings, null, 1)}\n`);
});

const greetingOf = async (ns: string, name: string) =>
  (await getObject<{ data?: Record<string, string> }>('configmap', ns, `${name}-config`))?.data?.greeting;

const succeededAt = (generation: number) => (a: AppObject) =>
  a.metadata.generation === generation &&
  a.status?.observedGeneration === generation &&
  (a.status?.conditions?.some((c) => c.type === 'ReconcileSucceeded') ?? false);

const failedAt = (generation: number) => (a: AppObject) =>
  a.metadata.generation === generation &&
  a.status?.observedGeneration === generation &&
  (a.status?.conditions?.some((c) => c.type === 'ReconcileFailed') ?? false);

const crashesOf = (ns: string, name: string) => rt.logsFor(ns, name).filter((r) => r.msg === 'stage crashed; retrying');
const finalFailuresOf = (name: string) =>
  rt.records.filter(
    (r) =>
      r.msg === 'stage failed on its last attempt; run ended with a failed status' &&
      String(r.obj.subject ?? '').endsWith(`/${name}`),
  );

describe('faults', () => {
  it('object store 503s during fetch, then during template: retried to ReconcileSucceeded', async () => {
    const ns = NS.store;
    for (const [stage, keys] of [
      ['fetch', FETCH_KEYS],
      ['template', TEMPLATE_KEYS],
    ] as const) {
      const name = `store-${stage}-${id}`;
      Object.assign(storeFault, { keys, remaining: 3, injected: 0 });
      const t0 = Date.now();
      await apply(inlineConfigMapApp(ns, name, `stored despite 503s in ${stage} ${id}`));
      const app = await rt.waitForApp(ns, name, succeededAt(1), `ReconcileSucceeded after 503s in ${stage}`);
      timings[`store-503x3-${stage}`] = { convergedMs: since(t0) };
      await expectSucceeded(app);
      expect(storeFault).toMatchObject({ remaining: 0, injected: 3 });
      expect(await greetingOf(ns, name)).toBe(`stored despite 503s in ${stage} ${id}`);
      const crashes = crashesOf(ns, name);
      expect(crashes.map((c) => c.obj.attempt)).toEqual([0, 1, 2]);
      for (const c of crashes) expect(String(c.obj.error)).toMatch(/^(reading|storing) the .* failed$/);
      expect(app.status?.consecutiveReconcileSuccesses).toBe(1);
      // each stage finished once: the 503s were retried within the stage, not reported
      const runs = rt.stageRuns(ns, name).map((r) => `${r.stage}:${r.outcome}`);
      expect(runs.filter((r) => r.startsWith('deploy:'))).toEqual(['deploy:succeeded']);
      expect(finalFailuresOf(name)).toEqual([]);
    }
  }, 400_000);

  it('an object store that never recovers ends in a bounded ReconcileFailed, no crash loop, and heals', async () => {
    const ns = NS.store;
    const name = `store-down-${id}`;
    Object.assign(storeFault, { keys: FETCH_KEYS, remaining: Number.POSITIVE_INFINITY, injected: 0 });
    const t0 = Date.now();
    await apply(inlineConfigMapApp(ns, name, `store down ${id}`));
    const failed = await rt.waitForApp(ns, name, failedAt(1), 'ReconcileFailed after 5 attempts');
    const failedMs = since(t0);
    const message = failed.status?.conditions?.[0]?.message ?? '';
    expect(message).toMatch(
      /^Fetching resources: (reading the fetch cache|storing the fetch artifact|storing the fetch cache record) failed: 503 SlowDown: Please reduce your request rate \(injected\)$/,
    );
    expectFailed(failed, message);
    // exactly 5 attempts: 4 retried crashes, then the final status on the 5th
    const finals = finalFailuresOf(name);
    expect(finals.length).toBeGreaterThanOrEqual(1);
    expect(finals[0]!.obj).toMatchObject({ attempts: 5, status: 'written' });
    const crashesBeforeFinal = crashesOf(ns, name).filter(
      (r) => rt.records.indexOf(r) < rt.records.indexOf(finals[0]!),
    );
    expect(crashesBeforeFinal.map((c) => c.obj.attempt)).toEqual([0, 1, 2, 3]);

    // No crash loop: the App is re-run only on the failure backoff (2 s, 4 s, 8 s, ... after
    // each failure), every run bounded to 5 attempts.
    const injectedAtFail = storeFault.injected;
    await new Promise((r) => setTimeout(r, 15_000));
    const finalsIn15s = finalFailuresOf(name).length;
    const injectedIn15s = storeFault.injected - injectedAtFail;
    expect(finalsIn15s).toBeLessThanOrEqual(4);
    expect(injectedIn15s).toBeLessThanOrEqual(5 * (finalsIn15s - 1) + 5);
    const still = await getApp(ns, name);
    expectFailed(still!, message);
    expect(still?.status?.consecutiveReconcileFailures).toBeGreaterThanOrEqual(finalsIn15s);
    expect(still?.status?.consecutiveReconcileFailures).toBeLessThanOrEqual(finalFailuresOf(name).length);

    timings['store-down'] = {
      failedAfterMs: failedMs,
      finalFailuresIn15s: finalsIn15s,
      injected503In15s: injectedIn15s,
      message,
    };
  }, 400_000);

  // Found by this test: the final failed status had no updatedAt on the failed stage, so the
  // failure backoff never came (it waited for a relist, ~160 s); retry-bound.ts now sets it.
  it('after the bounded ReconcileFailed, a healed store is used on the failure backoff (within 30 s)', async () => {
    const ns = NS.store;
    const name = `store-down-${id}`;
    storeFault.remaining = 0;
    const t1 = Date.now();
    try {
      const healed = await rt.waitForApp(ns, name, succeededAt(1), 'ReconcileSucceeded after the store heals', 30_000);
      await expectSucceeded(healed);
      expect(await greetingOf(ns, name)).toBe(`store down ${id}`);
    } finally {
      timings['store-heal'] = { waitedMs: since(t1), app: (await getApp(ns, name))?.status?.conditions };
    }
  }, 60_000);

  it('409 conflicts on status writes: converges with the right observedGeneration and conditions', async () => {
    const ns = NS.conflict;
    const name = `conflict-${id}`;
    // 7 > one write's 5 attempts: the first stage also crashes and is retried.
    Object.assign(conflictFault, { name, remaining: 7, injected: 0, writes: 0 });
    let t0 = Date.now();
    await apply(inlineConfigMapApp(ns, name, 'v1'));
    const app1 = await rt.waitForApp(ns, name, succeededAt(1), 'generation 1 ReconcileSucceeded despite 409s');
    timings['409x7-gen1'] = { convergedMs: since(t0) };
    await expectSucceeded(app1);
    expect(conflictFault.injected).toBe(7);
    expect(conflictFault.writes).toBeGreaterThan(0);
    expect(app1.status?.consecutiveReconcileSuccesses).toBe(1);
    expect(crashesOf(ns, name).length).toBe(1);

    // A spec change under 3 more conflicts: generation 2 owns the status.
    Object.assign(conflictFault, { remaining: 3, injected: 0 });
    t0 = Date.now();
    await apply(inlineConfigMapApp(ns, name, 'v2'));
    const app2 = await rt.waitForApp(ns, name, succeededAt(2), 'generation 2 ReconcileSucceeded despite 409s');
    timings['409x3-gen2'] = { convergedMs: since(t0) };
    await expectSucceeded(app2);
    expect(conflictFault.injected).toBe(3);
    expect(app2.status?.observedGeneration).toBe(2);
    expect(app2.status?.consecutiveReconcileSuccesses).toBe(2);
    expect(await greetingOf(ns, name)).toBe('v2');
    await rt.runtime.pipeline.idle();
    await expectSucceeded((await getApp(ns, name))!);
  });

  it('the runtime process SIGKILLed while kapp runs: kapp dies with it, the restart converges, one kapp at a time', async () => {
    const ns = CHILD_NS;
    const name = `kill-${id}`;
    childRoot = await mkdtemp(path.join(tmpdir(), 'kapp-lambda-faults-'));
    const storeDir = path.join(childRoot, 'store');
    const first = startChildRuntime(storeDir, path.join(childRoot, 'runtime-1.log'));
    children.push(first);
    const t0 = Date.now();
    await waitFor(
      'the child runtime to take the lease',
      async () => (/leader election: acquired lease/.test(childLog(first.logFile)) ? true : undefined),
      { timeoutMs: 90_000, describe: () => childLog(first.logFile).slice(-3000) },
    );
    const leaseMs = since(t0);

    await apply(slowApp(ns, name, 25));
    const kappPid = await waitFor(
      'kapp to run for the App',
      async () => {
        const pids = kappProcesses().get(name);
        return pids && pids.length > 0 && (await getObject('deployment', ns, `${name}-slow`)) ? pids : undefined;
      },
      { timeoutMs: 120_000, intervalMs: 100, describe: () => childLog(first.logFile).slice(-3000) },
    );
    expect(kappPid).toHaveLength(1);
    const killedAt = Date.now();
    await killGroup(first);
    // PR_SET_PDEATHSIG: kapp is killed with its parent.
    await waitFor('kapp to die with the runtime', async () => (kappProcesses().get(name) ? undefined : true), {
      timeoutMs: 5000,
      intervalMs: 50,
    });
    const kappGoneMs = since(killedAt);
    const interrupted = await getApp(ns, name);
    expect(reconciled(interrupted)).toBe(false);

    const sampler = kappSampler();
    try {
      const second = startChildRuntime(storeDir, path.join(childRoot, 'runtime-2.log'));
      children.push(second);
      const restartedAt = Date.now();
      const app = await rt.waitForApp(ns, name, succeededAt(1), 'ReconcileSucceeded after the restart', 240_000);
      timings['runtime-sigkill'] = {
        leaseFirstMs: leaseMs,
        kappGoneAfterKillMs: kappGoneMs,
        convergedAfterRestartMs: since(restartedAt),
        kappRunsAfterRestart: sampler.seen.get(name)?.size ?? 0,
        samples: sampler.samples,
      };
      await expectSucceeded(app);
      expect(sampler.max.get(name) ?? 0).toBeLessThanOrEqual(1);
      await killGroup(second);
    } finally {
      sampler.stop();
    }
  }, 500_000);

  it('the API server paused (SIGSTOP) for 20 s while kapp runs: the App still converges', async () => {
    // The harness runs kube-controller-manager and kube-scheduler without leader election, so
    // they survive the pause (with it they exited after their 10 s renew deadline and left the
    // shared cluster without Deployments for later files). The App deploys ConfigMaps.
    const ns = NS.pause;
    const name = `pause-${id}`;
    apiserverPid = ourApiServerPid();
    const t0 = Date.now();
    await apply(inlineConfigMapApp(ns, name, `paused ${id}`));
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
      crashes: crashesOf(ns, name).map((r) => r.obj.error),
      leaderLogs: rt.records
        .filter((r) => String(r.msg).startsWith('leader election'))
        .map((r) => r.msg)
        .slice(-6),
    };
    await expectSucceeded(app);
    expect(await greetingOf(ns, name)).toBe(`paused ${id}`);
  }, 400_000);
});
