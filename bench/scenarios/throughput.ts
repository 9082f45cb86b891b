/**
 * Scenario 2, throughput: `count` inline-ytt Apps (each with its own content) created at once
 * (16 create requests in flight); time from the first create request until the benchmark's
 * watch has seen every App `ReconcileSucceeded`, at a given concurrency (objects reconciled at
 * once: kapp-lambda's pipeline concurrency, kapp-controller's `-concurrency`).
 *
 * Function-seconds (kapp-lambda): the sum of every stage timer of these Apps (what the stages
 * would bill as Lambda invocations, less the App GET before the decision timer starts and the
 * runtime's own start). CPU-seconds: user + system time of the implementation's processes and
 * their reaped children (tools) over the run; for kapp-lambda that is this benchmark process,
 * which also issues the creates and runs the watch.
 *
 * @module
 */

import { startApiSampler } from '../lib/api-sampler.js';
import { type BenchContext, clusterOf, contextOf } from '../lib/context.js';
import { type KappController, procCpuSeconds } from '../lib/kapp-controller.js';
import { AppWatch, createAll, createTenants, inlineApp } from '../lib/kube.js';
import { appKey, startOursIn, toolDelta, waitForwardersReady } from '../lib/ours.js';
import { fmtMs, round } from '../lib/stats.js';
import { apiRates } from '../lib/steady.js';

/** One throughput run. */
export interface ThroughputRun {
  impl: 'kapp-lambda' | 'kapp-controller';
  concurrency: number;
  apps: number;
  /** Apps that reached ReconcileSucceeded / ReconcileFailed before the timeout. */
  succeeded: number;
  failed: number;
  /** First create request → last App seen succeeded (or the timeout). */
  wallMs: number;
  /** Creating the Apps alone. */
  createMs: number;
  /** Apps per second over `wallMs`. */
  appsPerSecond: number;
  /** CPU seconds of the implementation's processes and their tools over the run. */
  cpuSeconds: number;
  /**
   * The API server's requests over the run (creates to the last App seen, the benchmark's own
   * creates and watch included, its counter reads not): Σ `apiserver_request_total`, read about
   * once a second (`lib/api-sampler.ts`, `apiRates` in `lib/steady.ts`).
   */
  apiRequests: number;
  /** `apiRequests` per second over the run. */
  apiRequestsPerSecond: number;
  /** The busiest second's requests on the API server (the control plane's own included). */
  peakApiRequestsPerSecond: number;
  /** kapp-lambda only: Σ stage timers, seconds. */
  functionSeconds?: number;
  /** kapp-lambda only: tool runs and seconds. */
  tools?: Record<string, { runs: number; ms: number }>;
  /** First failure messages, if any. */
  failures?: string[];
}

/** Timeout of one throughput run. */
const TIMEOUT_MS = 12 * 60_000;

function names(count: number): string[] {
  return Array.from({ length: count }, (_, i) => `app-${String(i).padStart(3, '0')}`);
}

async function measure(
  ctx: BenchContext,
  ns: string,
  count: number,
  cpu: () => number,
): Promise<
  {
    wallMs: number;
    createMs: number;
    cpuSeconds: number;
    seen: Map<string, { final: string; message?: string }>;
  } & Pick<ThroughputRun, 'apiRequests' | 'apiRequestsPerSecond' | 'peakApiRequestsPerSecond'>
> {
  const { cluster, rest } = clusterOf(ctx);
  const watch = new AppWatch(cluster.kubeconfigPath, ns);
  await watch.start();
  const sampler = await startApiSampler(cluster.kubeconfigPath);
  try {
    const keys = names(count).map((n) => `${ns}/${n}`);
    const apps = names(count).map((n) => inlineApp(ns, n, `${ns} ${n} ${Date.now()}`));
    const cpu0 = cpu();
    const t0 = performance.now();
    const createMs = await createAll(rest, apps, 16);
    let seen: Map<string, { at: number; final: string; message?: string }>;
    try {
      seen = await watch.waitAll(keys, TIMEOUT_MS);
    } catch (err) {
      ctx.say(`throughput: ${(err as Error).message}`);
      seen = new Map(keys.flatMap((k) => (watch.seen(k) ? [[k, watch.seen(k)!] as const] : [])));
    }
    const last = Math.max(...[...seen.values()].map((s) => s.at), t0);
    const wallMs = seen.size === count ? last - t0 : TIMEOUT_MS;
    const cpuSeconds = cpu() - cpu0;
    // Stopped (and reaped) after the CPU reading: its own CPU stays out of the figure.
    const api = apiRates(await sampler.stop());
    return {
      wallMs,
      createMs,
      cpuSeconds,
      seen,
      apiRequests: api.requests,
      apiRequestsPerSecond: round(api.meanPerSecond, 1),
      peakApiRequestsPerSecond: round(api.peakPerSecond, 1),
    };
  } finally {
    await sampler.stop().catch(() => []);
    await watch.stop();
  }
}

function summarizeSeen(seen: Map<string, { final: string; message?: string }>) {
  const vals = [...seen.values()];
  const failures = vals.filter((s) => s.final !== 'succeeded').map((s) => s.message ?? '');
  return { succeeded: vals.length - failures.length, failed: failures.length, failures: failures.slice(0, 3) };
}

/**
 * Runs the throughput scenario against kapp-lambda's embedded runtime.
 * @throws Error when the runtime cannot start.
 */
export async function throughputOurs(
  ctx: BenchContext,
  ns: string,
  concurrency: number,
  count = 200,
): Promise<ThroughputRun> {
  const { cluster, rest } = clusterOf(ctx);
  await createTenants(rest, [ns]);
  const ours = await startOursIn(ctx, ns, `throughput-${concurrency}`, concurrency);
  try {
    await waitForwardersReady(ours);
    const before = ours.tools();
    const m = await measure(ctx, ns, count, () => procCpuSeconds(process.pid));
    await ours.runtime.pipeline.idle();
    const id = contextOf(cluster);
    const keys = new Set(names(count).map((n) => appKey(id, ns, n)));
    const functionMs = ours.records.filter((r) => keys.has(r.object)).reduce((a, r) => a + r.durationMs, 0);
    const s = summarizeSeen(m.seen);
    const run: ThroughputRun = {
      impl: 'kapp-lambda',
      concurrency,
      apps: count,
      ...s,
      wallMs: m.wallMs,
      createMs: m.createMs,
      appsPerSecond: (s.succeeded / m.wallMs) * 1000,
      cpuSeconds: m.cpuSeconds,
      apiRequests: m.apiRequests,
      apiRequestsPerSecond: m.apiRequestsPerSecond,
      peakApiRequestsPerSecond: m.peakApiRequestsPerSecond,
      functionSeconds: functionMs / 1000,
      tools: toolDelta(before, ours.tools()),
    };
    ctx.say(
      `throughput ours c=${concurrency}: ${s.succeeded}/${count} in ${fmtMs(m.wallMs)}, function-seconds ${(functionMs / 1000).toFixed(1)}, CPU ${m.cpuSeconds.toFixed(1)} s, API ${m.apiRequestsPerSecond}/s mean, ${m.peakApiRequestsPerSecond}/s peak`,
    );
    return run;
  } finally {
    await ours.stop();
  }
}

/** Runs the throughput scenario against a running kapp-controller watching `ns`. */
export async function throughputTheirs(
  ctx: BenchContext,
  ns: string,
  kc: KappController,
  concurrency: number,
  count = 200,
): Promise<ThroughputRun> {
  const m = await measure(ctx, ns, count, () => kc.cpuSeconds());
  const s = summarizeSeen(m.seen);
  ctx.say(
    `throughput kapp-controller c=${concurrency}: ${s.succeeded}/${count} in ${fmtMs(m.wallMs)}, CPU ${m.cpuSeconds.toFixed(1)} s, API ${m.apiRequestsPerSecond}/s mean, ${m.peakApiRequestsPerSecond}/s peak`,
  );
  return {
    impl: 'kapp-controller',
    concurrency,
    apps: count,
    ...s,
    wallMs: m.wallMs,
    createMs: m.createMs,
    appsPerSecond: (s.succeeded / m.wallMs) * 1000,
    cpuSeconds: m.cpuSeconds,
    apiRequests: m.apiRequests,
    apiRequestsPerSecond: m.apiRequestsPerSecond,
    peakApiRequestsPerSecond: m.peakApiRequestsPerSecond,
  };
}
