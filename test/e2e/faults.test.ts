/**
 * e2e: faults injected at the ports of the embedded runtime, each proven to converge to the
 * right status with nothing lost (issue 7, item 9):
 *
 * 1. the object store answers 503 for the next N calls during fetch, then during template
 *    (converges), and forever (bounded `ReconcileFailed` after 5 attempts, no crash loop, then
 *    success once the store heals);
 * 2. 409 conflicts on the App's status writes (converges with the right observedGeneration and
 *    conditions).
 *
 * Both are injected at the ports (`wrapDeps`). The faults on real processes are in their own
 * files, so they run alongside this one: the runtime process SIGKILLed while kapp runs
 * (`faults-kill.test.ts`) and the API server paused for 20 s (`faults-pause.test.ts`, on its
 * own control plane).
 */
import { afterAll, describe, expect, it } from 'vitest';
import type { EmbeddedOptions } from '../../functions/embedded/runtime.js';
import {
  type ClusterRegistry,
  ConflictError,
  type ResourceRef,
  type StatusWriter,
} from '../../functions/lib/kube/port.js';
import type { DispatchDeps } from '../../functions/lib/pipeline/deps.js';
import { type ObjectStore, StoreError, type StoreOp } from '../../functions/lib/store/port.js';
import {
  apply,
  expectFailed,
  expectSucceeded,
  failedAt,
  getApp,
  getObject,
  inlineConfigMapApp,
  succeededAt,
  suffix,
  useE2ERuntime,
  waitFor,
} from './support.js';

const id = suffix();
const NS = {
  store: `e2e-flt-store-${id}`,
  conflict: `e2e-flt-409-${id}`,
};

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
    getVersioned: gate('get', (key, opts) => store.getVersioned(key, opts)),
    putIfMatch: gate('putIfMatch', (key, body, ifMatch) => store.putIfMatch(key, body, ifMatch)),
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

const rt = useE2ERuntime(Object.values(NS), { overrides: runtimeOptions });

afterAll(() => {
  storeFault.remaining = 0;
  conflictFault.remaining = 0;
  process.stderr.write(`[faults] timings ${JSON.stringify(timings, null, 1)}\n`);
});

const greetingOf = async (ns: string, name: string) =>
  (await getObject<{ data?: Record<string, string> }>('configmap', ns, `${name}-config`))?.data?.greeting;

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
    // The runtime logs the final failure right after writing that status.
    await waitFor('the final failure in the log', async () => (finalFailuresOf(name).length > 0 ? true : undefined), {
      timeoutMs: 10_000,
      intervalMs: 20,
    });
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
  // The bound is the App's next failure backoff (2^n s after its n-th consecutive failure: 16 s
  // after the ~4 of the test before) plus 45 s for the run itself on a loaded machine, not a
  // flat 30 s (a 16 s backoff and a slow kapp deploy overran it); still well below the relist.
  it('after the bounded ReconcileFailed, a healed store is used on the failure backoff (within it and 45 s)', async () => {
    const ns = NS.store;
    const name = `store-down-${id}`;
    storeFault.remaining = 0;
    const t1 = Date.now();
    const failures = (await getApp(ns, name))?.status?.consecutiveReconcileFailures ?? 0;
    const boundMs = Math.min(2 ** failures * 1000 + 45_000, 170_000);
    try {
      const healed = await rt.waitForApp(ns, name, succeededAt(1), 'ReconcileSucceeded after the store heals', boundMs);
      await expectSucceeded(healed);
      expect(await greetingOf(ns, name)).toBe(`store down ${id}`);
    } finally {
      timings['store-heal'] = { waitedMs: since(t1), app: (await getApp(ns, name))?.status?.conditions };
    }
  }, 180_000);

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
});
