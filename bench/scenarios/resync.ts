/**
 * Scenario 3, no-op resync: Apps whose source is pinned (inline, no `pathsFrom`) and
 * unchanged, `syncPeriod: 30s` (the floor) and a 31 s safety period. After their first
 * reconcile and the resync that confirms it with kapp (a deploy that changed the cluster keeps no
 * deploy record, docs/decisions.md D11), the benchmark waits for the next `resync` event of each
 * (about 31 s + jitter later) and measures, per App, what that resync cost: tool processes started (command
 * runner), API requests made by the pipeline (counted at its REST transport; kapp's own
 * requests are not included), the stage timers summed (function time) and the wall time from
 * the event reaching the pipeline to its last stage record. With a deploy record kept
 * (`functions/lib/deploy/live-record.ts`) the deploy stage lists the App's resources as the App
 * instead of running kapp: those requests go through `PipelineDeps.appReader`, which the
 * benchmark counts with the pipeline's (`../lib/ours.ts`).
 *
 * @module
 */

import { SAFETY_SYNC_PERIOD_ANNOTATION } from '../../events/forwarder/quiet.js';
import { type BenchContext, clusterOf, contextOf } from '../lib/context.js';
import { AppWatch, createAll, createTenants, inlineApp, type Manifest } from '../lib/kube.js';
import { appKey, endsRun, type Ours, startOursIn, toolDelta, waitForwardersReady } from '../lib/ours.js';
import { type Summary, summarize } from '../lib/stats.js';

/** Result of the resync scenario. */
export interface ResyncResult {
  apps: number;
  /** Tool runs per App (by tool) during the resyncs. */
  toolsPerApp: Record<string, { runs: number; ms: number }>;
  toolRunsPerApp: number;
  /** Pipeline API requests per App (by method, `all` in total). */
  apiPerApp: Record<string, number>;
  /** Σ stage timers of one resync run. */
  functionMs: Summary;
  /** Event at the pipeline → last stage record of the run. */
  wallMs: Summary;
  /** Stage → outcome seen in the resync runs (e.g. `fetch: cached`). */
  outcomes: Record<string, string[]>;
}

/**
 * Runs the resync scenario (about 75 s of waiting for the timer: a confirming resync, then the
 * measured one).
 * @throws Error when an App does not reconcile or its resync does not arrive in time.
 */
export async function resyncOurs(ctx: BenchContext, apps = 3): Promise<ResyncResult> {
  const { cluster, rest } = clusterOf(ctx);
  const ns = 'bench-resync';
  const id = contextOf(cluster);
  await createTenants(rest, [ns]);
  const ours = await startOursIn(ctx, ns, 'resync', Math.max(4, apps));
  const watch = new AppWatch(cluster.kubeconfigPath, ns);
  try {
    await watch.start();
    await waitForwardersReady(ours);
    const names = Array.from({ length: apps }, (_, i) => `pinned-${i}`);
    // A safety period just over the sync period (resync-noop.test.ts does the same): quiet at the
    // sync period, an App still reconciles fully every 31 s (+ jitter), so the two resyncs below
    // come within about a minute (the default 10 min safety period would hold them that long).
    await createAll(
      rest,
      names.map((n) => {
        const app = inlineApp(ns, n, `pinned ${n}`, '30s') as { metadata: Record<string, unknown> };
        app.metadata.annotations = { [SAFETY_SYNC_PERIOD_ANNOTATION]: '31s' };
        return app as Manifest;
      }),
    );
    await watch.waitAll(
      names.map((n) => `${ns}/${n}`),
      120_000,
    );
    await ours.runtime.pipeline.idle();
    const keys = names.map((n) => appKey(id, ns, n));
    // The first deploy changed the cluster, so it kept no deploy record: the first resync runs
    // kapp once more to confirm what it left (docs/decisions.md D11). Not measured.
    ctx.say(`resync: first reconciles done; waiting for the confirming resync of ${apps} Apps (~35 s)`);
    await resyncsDone(ours, keys);
    // baseline after the confirming resyncs
    const tools0 = ours.tools();
    const api0 = { ...ours.api };
    const rec0 = ours.records.length;
    ctx.say(`resync: waiting for the next resync of ${apps} Apps (~35 s)`);
    const resyncAt = await resyncsDone(ours, keys);
    const recs = ours.records.slice(rec0);
    const tools = toolDelta(tools0, ours.tools());
    const toolsPerApp: Record<string, { runs: number; ms: number }> = {};
    for (const [t, v] of Object.entries(tools)) toolsPerApp[t] = { runs: v.runs / apps, ms: v.ms / apps };
    const apiPerApp: Record<string, number> = {};
    for (const [m, n] of Object.entries(ours.api)) apiPerApp[m] = (n - (api0[m] ?? 0)) / apps;
    const outcomes: Record<string, string[]> = {};
    for (const r of recs) {
      const list = outcomes[r.stage] ?? [];
      list.push(r.outcome);
      outcomes[r.stage] = list;
    }
    const perApp = keys.map((k) => {
      const mine = recs.filter((r) => r.object === k);
      return {
        functionMs: mine.reduce((a, r) => a + r.durationMs, 0),
        wallMs: Math.max(...mine.map((r) => r.at)) - resyncAt.get(k)!,
      };
    });
    return {
      apps,
      toolsPerApp,
      toolRunsPerApp: Object.values(toolsPerApp).reduce((a, t) => a + t.runs, 0),
      apiPerApp,
      functionMs: summarize(perApp.map((p) => p.functionMs)),
      wallMs: summarize(perApp.map((p) => p.wallMs)),
      outcomes,
    };
  } finally {
    await watch.stop();
    await ours.stop();
  }
}

/**
 * Waits until every App of `keys` had its next full reconcile (a `resync` event after this call)
 * run to its end.
 * @returns when each App's resync event reached the pipeline (`performance.now()`, ms).
 * @throws Error when not all did within 90 s.
 */
async function resyncsDone(ours: Ours, keys: readonly string[]): Promise<Map<string, number>> {
  const sent0 = new Map(keys.map((k) => [k, ours.sent.get(k)?.length ?? 0]));
  const rec0 = ours.records.length;
  const deadline = Date.now() + 90_000;
  const resyncAt = new Map<string, number>();
  for (;;) {
    for (const k of keys) {
      const ev = (ours.sent.get(k) ?? []).slice(sent0.get(k)!).find((e) => e.reason === 'resync');
      if (ev && !resyncAt.has(k)) resyncAt.set(k, ev.at);
    }
    if (resyncAt.size === keys.length) {
      await ours.runtime.pipeline.idle();
      const done = keys.every((k) =>
        ours.records.slice(rec0).some((r) => r.object === k && r.at >= resyncAt.get(k)! && endsRun(r)),
      );
      if (done) return resyncAt;
    }
    if (Date.now() > deadline)
      throw new Error(`resync: only ${resyncAt.size} of ${keys.length} resyncs completed in time`);
    await new Promise((r) => setTimeout(r, 100));
  }
}
