/**
 * Scenario 1, latency: one inline-ytt App holding one ConfigMap, from the create request to
 * the first watch event showing `ReconcileSucceeded` for its generation. A warm-up run, then
 * `runs` measured runs one after another with {@link PAUSE_MS} of idle before each, each a new
 * App with its own content (so nothing is reused through the fetch or render cache: every run
 * is a first reconcile).
 *
 * For kapp-lambda the total is split into time inside each tool (the command runner's
 * spawn-to-exit time per run) and the rest, and the rest further into: create → event at the
 * pipeline (API server watch + forwarder + coalescing window), our code inside the stages
 * (stage timers minus tool time: API calls, object store, tarballs, status writes), and the
 * remainder (hand-offs between stages, the App GET before the first stage timer starts, and the
 * status write reaching the benchmark's watch).
 *
 * @module
 */
import type { ToolStats } from '../../functions/lib/exec/metrics.js';
import { type BenchContext, clusterOf, contextOf } from '../lib/context.js';
import type { KappController } from '../lib/kapp-controller.js';
import { AppWatch, createAll, createTenants, inlineApp } from '../lib/kube.js';
import { appKey, startOursIn, toolDelta, trace, waitForwardersReady } from '../lib/ours.js';
import { fmtMs, fmtSummaryMs, round, type Summary, summarize } from '../lib/stats.js';

/** One measured run of kapp-lambda. */
export interface OurLatencyRun {
  totalMs: number;
  /** Tool → runs and milliseconds. */
  tools: Record<string, { runs: number; ms: number }>;
  toolMs: number;
  restMs: number;
  /** create → event handed to the pipeline. */
  toEventMs: number;
  /** Σ stage timers − tool time. */
  inStagesMs: number;
  /** total − toEvent − Σ stage timers. */
  betweenMs: number;
  /** Pipeline API requests during the run and their summed time (some overlap kapp's run). */
  api: { calls: number; ms: number };
  /** Object-store calls during the run and their summed time. */
  store: { calls: number; ms: number };
  /** Stage → its timer, milliseconds. */
  stages: Record<string, number>;
}

/** Result of the latency scenario for kapp-lambda. */
export interface OurLatency {
  warmup: OurLatencyRun;
  runs: OurLatencyRun[];
  total: Summary;
  tool: Summary;
  rest: Summary;
  restShare: Summary;
  perTool: Record<string, Summary>;
  toEvent: Summary;
  inStages: Summary;
  between: Summary;
  apiMs: Summary;
  storeMs: Summary;
}

const TIMEOUT_MS = 120_000;

/**
 * Idle time before each run, so every run starts from an idle controller: nothing of the
 * previous run left running, and a client-side rate limiter (kapp-controller's 20 QPS, burst
 * 30) refilled, as for an App changed on its own.
 */
export const PAUSE_MS = 2_000;

/**
 * Runs the latency scenario against kapp-lambda's embedded runtime.
 * @throws Error when an App does not reconcile in time or fails.
 */
export async function latencyOurs(ctx: BenchContext, runs = 5): Promise<OurLatency> {
  const { cluster, rest } = clusterOf(ctx);
  const ns = 'bench-latency';
  const id = contextOf(cluster);
  await createTenants(rest, [ns]);
  const ours = await startOursIn(ctx, ns, 'latency');
  const watch = new AppWatch(cluster.kubeconfigPath, ns);
  try {
    await watch.start();
    await waitForwardersReady(ours);
    const all: OurLatencyRun[] = [];
    for (let i = 0; i <= runs; i++) {
      const name = i === 0 ? 'warmup' : `run-${i}`;
      const key = appKey(id, ns, name);
      await new Promise((r) => setTimeout(r, PAUSE_MS));
      const before: Record<string, ToolStats> = ours.tools();
      const api0 = { calls: ours.api.all ?? 0, ms: ours.api.ms ?? 0 };
      const store0 = { ...ours.store };
      const t0 = performance.now();
      trace?.(`run ${name}`);
      await createAll(rest, [inlineApp(ns, name, `${name} ${Date.now()}`)]);
      const seen = (await watch.waitAll([`${ns}/${name}`], TIMEOUT_MS)).get(`${ns}/${name}`)!;
      if (seen.final !== 'succeeded') throw new Error(`latency: App ${name} failed: ${seen.message}`);
      await ours.runtime.pipeline.idle();
      const totalMs = seen.at - t0;
      const tools = toolDelta(before, ours.tools());
      const toolMs = Object.values(tools).reduce((a, t) => a + t.ms, 0);
      const recs = ours.records.filter((r) => r.object === key);
      const stages: Record<string, number> = {};
      for (const r of recs) stages[r.stage] = (stages[r.stage] ?? 0) + r.durationMs;
      const stageMs = Object.values(stages).reduce((a, b) => a + b, 0);
      const toEventMs = (ours.sent.get(key)?.[0]?.at ?? t0) - t0;
      const run: OurLatencyRun = {
        totalMs,
        tools,
        toolMs,
        restMs: totalMs - toolMs,
        toEventMs,
        inStagesMs: stageMs - toolMs,
        betweenMs: totalMs - toEventMs - stageMs,
        api: { calls: (ours.api.all ?? 0) - api0.calls, ms: (ours.api.ms ?? 0) - api0.ms },
        store: { calls: ours.store.calls - store0.calls, ms: ours.store.ms - store0.ms },
        stages,
      };
      all.push(run);
      ctx.say(
        `latency ours ${name}: ${fmtMs(totalMs)} (tools ${fmtMs(toolMs)}: ${Object.entries(tools)
          .map(([t, v]) => `${t} ${v.runs}× ${fmtMs(v.ms)}`)
          .join(
            ', ',
          )}; stages ${JSON.stringify(stages)}; API ${run.api.calls}× ${fmtMs(run.api.ms)}; store ${run.store.calls}× ${fmtMs(run.store.ms)})`,
      );
    }
    const measured = all.slice(1);
    const perTool: Record<string, Summary> = {};
    for (const tool of new Set(measured.flatMap((r) => Object.keys(r.tools)))) {
      perTool[tool] = summarize(measured.map((r) => r.tools[tool]?.ms ?? 0));
    }
    return {
      warmup: all[0]!,
      runs: measured,
      total: summarize(measured.map((r) => r.totalMs)),
      tool: summarize(measured.map((r) => r.toolMs)),
      rest: summarize(measured.map((r) => r.restMs)),
      restShare: summarize(measured.map((r) => r.restMs / r.totalMs)),
      perTool,
      toEvent: summarize(measured.map((r) => r.toEventMs)),
      inStages: summarize(measured.map((r) => r.inStagesMs)),
      between: summarize(measured.map((r) => r.betweenMs)),
      apiMs: summarize(measured.map((r) => r.api.ms)),
      storeMs: summarize(measured.map((r) => r.store.ms)),
    };
  } finally {
    await watch.stop();
    await ours.stop();
  }
}

/** Result of the latency scenario for kapp-controller. */
export interface TheirLatency {
  warmupMs: number;
  runsMs: number[];
  total: Summary;
}

/**
 * Runs the latency scenario against a running kapp-controller watching `ns`.
 * @throws Error when an App does not reconcile in time or fails.
 */
export async function latencyTheirs(
  ctx: BenchContext,
  ns: string,
  _kc: KappController,
  runs = 5,
): Promise<TheirLatency> {
  const { cluster, rest } = clusterOf(ctx);
  const watch = new AppWatch(cluster.kubeconfigPath, ns);
  await watch.start();
  try {
    const all: number[] = [];
    for (let i = 0; i <= runs; i++) {
      const name = i === 0 ? 'warmup' : `run-${i}`;
      await new Promise((r) => setTimeout(r, PAUSE_MS));
      const t0 = performance.now();
      trace?.(`run ${name}`);
      await createAll(rest, [inlineApp(ns, name, `${name} ${Date.now()}`)]);
      const seen = (await watch.waitAll([`${ns}/${name}`], TIMEOUT_MS)).get(`${ns}/${name}`)!;
      if (seen.final !== 'succeeded')
        throw new Error(`latency: App ${name} failed under kapp-controller: ${seen.message}`);
      all.push(seen.at - t0);
      ctx.say(`latency kapp-controller ${name}: ${fmtMs(seen.at - t0)}`);
    }
    return { warmupMs: all[0]!, runsMs: all.slice(1), total: summarize(all.slice(1)) };
  } finally {
    await watch.stop();
  }
}

/** Adds the latency rows for kapp-lambda to the table and its JSON to the results. */
export function reportLatencyOurs(ctx: BenchContext, r: OurLatency): void {
  const share = r.restShare.median;
  ctx.rows.push(
    { scenario: '1 latency', figure: 'create → ReconcileSucceeded', value: fmtSummaryMs(r.total) },
    ...Object.entries(r.perTool).map(([tool, s]) => ({
      scenario: '1 latency',
      figure: `  inside ${tool}`,
      value: fmtSummaryMs(s),
    })),
    {
      scenario: '1 latency',
      figure: '  rest (not in a tool)',
      value: `${fmtSummaryMs(r.rest)} = ${(share * 100).toFixed(1)} % of total`,
      target: '≤ 10 % of total',
      verdict: share <= 0.1 ? 'met' : 'missed',
    },
    { scenario: '1 latency', figure: '    create → event at pipeline', value: fmtSummaryMs(r.toEvent) },
    { scenario: '1 latency', figure: '    our code inside stages', value: fmtSummaryMs(r.inStages) },
    {
      scenario: '1 latency',
      figure: '      of which API requests',
      value: `${fmtSummaryMs(r.apiMs)}, ${r.runs[0]?.api.calls ?? 0} requests`,
    },
    {
      scenario: '1 latency',
      figure: '      of which object store',
      value: `${fmtSummaryMs(r.storeMs)}, ${r.runs[0]?.store.calls ?? 0} calls`,
    },
    { scenario: '1 latency', figure: '    between stages + status seen', value: fmtSummaryMs(r.between) },
  );
  ctx.results.latency = {
    ...r,
    restShareMedianPct: round(share * 100, 1),
  };
}
