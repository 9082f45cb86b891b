/**
 * Scenario 11, idle (issue 24; issue 13 item 6's steady state before it): N Apps of the kinds of
 * source a fleet runs, inline and git branches (`ref: origin/main`), with `syncPeriod: 30s`
 * (kapp-controller's default), and once all have reconciled, what the whole system spends per
 * minute while nothing changes: for kapp-lambda the messages the forwarder hands to the pipeline,
 * the stage runs (each a function invocation and a queued message on Lambda), the object-store
 * calls, the source poll's resolutions, API requests and CPU-seconds; for kapp-controller its
 * CPU, API requests and reconciles. Targets: ours ≤ 0.05× kapp-controller's CPU and API
 * requests, and no messages beyond the safety period's (one full reconcile per App per safety
 * period begun in the window).
 *
 * The two sides run one after the other on the same control plane (the API server's request
 * counter does not tell clients apart; both use the admin kubeconfig): a baseline window with
 * neither running (the control plane's own requests: controller-manager, scheduler, kwok), then
 * each side alone, kapp-lambda (embedded runtime) in `bench-idle` and kapp-controller v0.53.1 in
 * `bench-kc-idle`, in the order this run was given ({@link IdleOptions.first}, else the flip of
 * the last recorded run's, so successive runs alternate which side meets the machine first).
 * For each: create the Apps (and their Secrets), wait until the benchmark's watch has seen every
 * one `ReconcileSucceeded` (bounded; a side that cannot get there in time is measured anyway and
 * says how many it had), stop the watch, then measure a window:
 *
 * - CPU-seconds: user + system of the implementation's processes and their reaped children (the
 *   tools), from `/proc/<pid>/stat`, as in the throughput scenario: for kapp-lambda the benchmark
 *   process, which then runs only the runtime (forwarder, pipeline, source poll); for
 *   kapp-controller its controller and sidecar.
 * - API requests: Σ `apiserver_request_total` (`GET /metrics`) at the end − at the start, less
 *   the baseline's rate and the benchmark's own reads; read about once a second through the
 *   window (`lib/api-sampler.ts`), which also gives the mean per second and the peak second.
 *   Every client's requests: the runtime's (forwarder, pipeline, the kapp it runs),
 *   kapp-controller's (controller, kapp). A watch counts when it ends.
 * - reconciles ended in the window (kapp-lambda's pipeline runs, kapp-controller's "Completed
 *   deploy" log lines), for per-reconcile figures that do not depend on N.
 *
 * Helm chart and http (no sha256) sources are left out: they have no poll resolver yet, so
 * kapp-lambda keeps their syncPeriod timer (bench/README.md says what each would add).
 *
 * @module
 */

import { readdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import { DEFAULT_SAFETY_SYNC_PERIOD_MS } from '../../events/forwarder/quiet.js';
import { createRepo } from '../../test/harness/fixtures.js';
import { type GitServer, startGitServer } from '../../test/harness/servers/git.js';
import { startApiSampler } from '../lib/api-sampler.js';
import { type BenchContext, clusterOf } from '../lib/context.js';
import { type KappController, procCpuSeconds, startKappController } from '../lib/kapp-controller.js';
import { AppWatch, BENCH_SA, createAll, createTenants, inlineApp, type Manifest, yttConfigMap } from '../lib/kube.js';
import { endsRun, type Ours, startOursIn, toolDelta, waitForwardersReady } from '../lib/ours.js';
import { round } from '../lib/stats.js';
import {
  apiRates,
  nextOrder,
  perMinute,
  type SideOrder,
  STEADY_TARGET_RATIO,
  type SteadyFigures,
  type SteadyWindow,
  safetyAllowance,
  steadyFigures,
  steadyRatios,
} from '../lib/steady.js';
import type { StepRunner } from './repositories.js';

/**
 * Default App count (issue 24: 100). On this 2-core machine kapp-controller reconciles ~1.3
 * Apps/s (its client's 20 QPS limit, throughput scenario), so 100 settle in ~1.5 min.
 */
export const DEFAULT_IDLE_APPS = 100;
/** Default measuring window per implementation, seconds (issue 24: 10 minutes, twenty sync periods). */
export const DEFAULT_IDLE_WINDOW_S = 600;
/** The App sync period: kapp-controller's default, and the floor of both. */
export const IDLE_SYNC_PERIOD = '30s';
/** Share of inline Apps; the rest follow a git branch, every other one with a ytt `valuesFrom` Secret. */
const INLINE_SHARE = 0.6;
/** Git Apps per repository: a fleet's Apps share a few repositories, so one poll serves several. */
const APPS_PER_REPO = 10;
/** Longest wait for the first reconcile of all Apps, per implementation. */
const RECONCILE_BOUND_MS = 300_000;
/** Longest baseline window. */
const BASELINE_MAX_MS = 30_000;
/** Objects reconciled at once: kapp-lambda's pipeline concurrency, kapp-controller's `-concurrency`. */
const CONCURRENCY = 4;
const SCENARIO = '11 idle';
const NS = { ours: 'bench-idle', theirs: 'bench-kc-idle' };

/** Options of {@link idleScenario}. */
export interface IdleOptions {
  /** Apps per implementation. */
  apps: number;
  /** Measuring window per implementation, ms. */
  windowMs: number;
  /** Where results files are: the last one with this scenario gives the order to flip. */
  resultsDir: string;
  /** `ours` or `theirs`: the side to run first, instead of the flip of the last run's order. */
  first?: string;
}

/** How many Apps of each kind of source. */
export interface IdleMix {
  inline: number;
  /** `fetch.git` with `ref: origin/main`, the ConfigMap's name from a ytt inline data-values file. */
  git: number;
  /** The same with the name from a ytt `valuesFrom` Secret (an input the forwarder watches). */
  gitWithSecret: number;
  /** Git repositories the git Apps share. */
  repositories: number;
}

/** kapp-lambda's own counts in the window: what it would send, run and store on Lambda. */
export interface IdleOursCounts {
  /** Events the forwarder handed to the pipeline (messages in). */
  messages: number;
  messagesByReason: Record<string, number>;
  /** The same by the App's kind of source ({@link IdleMix}'s keys). */
  messagesBySource: Record<string, number>;
  /** Stage runs (each one function invocation and one queued message on Lambda). */
  stageRuns: number;
  stageRunsByStage: Record<string, number>;
  /** Object-store calls of the pipeline and the source poll. */
  storeCalls: number;
  /** Sources the source poll timer resolved (one git request each; its debug summaries). */
  sourcePollResolutions: number;
  /** Conditional writes of source poll records ({@link Ours.pollRecordWrites}: claims, joins, moves). */
  sourcePollRecordWrites: number;
  /** Tool runs in the window, by tool. */
  tools: Record<string, { runs: number; ms: number }>;
  /** The above per minute. */
  perMin: { messages: number; stageRuns: number; storeCalls: number; sourcePollResolutions: number };
  /** The pipeline's own API requests in the window (by method, `all`). */
  pipelineApi: Record<string, number>;
  /** The safety period of an App without the annotation, ms (the forwarder's default). */
  safetyPeriodMs: number;
  /** {@link safetyAllowance}: Apps × ⌈window / safety period⌉. */
  allowedMessages: number;
}

/** One implementation's idle window. */
export interface IdleSide extends SteadyWindow, SteadyFigures {
  impl: 'kapp-lambda' | 'kapp-controller';
  apps: number;
  /** Apps seen `ReconcileSucceeded` before the window (all, unless the bound ran out). */
  reconciledBeforeWindow: number;
  /** First create request → last App seen reconciled (or the bound). */
  firstReconcileMs: number;
  /** kapp-lambda only. */
  counts?: IdleOursCounts;
}

/** Result of the idle scenario, as written to the results file (key `idle`). */
export interface IdleResult {
  apps: number;
  mix: IdleMix;
  syncPeriod: string;
  concurrency: number;
  windowMs: number;
  /** Which side measured first (runs alternate). */
  order: SideOrder;
  namespaces: { ours: string; theirs: string };
  /** The control plane alone: requests counted and their rate. */
  baseline?: {
    windowMs: number;
    apiRequests: number;
    apiRequestsPerMin: number;
    apiRequestsPerSecond: number;
    peakApiRequestsPerSecond: number;
  };
  ours?: IdleSide;
  theirs?: IdleSide & { version: string };
  /** ours/theirs of the per-minute figures (null when a side is missing). */
  ratios: { cpu: number | null; api: number | null };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * The order recorded by the last run of this scenario: of the results files in `dir` with an
 * `idle` result holding `order`, the one started last. Unreadable files are skipped.
 */
export async function lastIdleOrder(dir: string): Promise<SideOrder | undefined> {
  let best: { at: string; order: SideOrder } | undefined;
  const names = await readdir(dir).catch(() => [] as string[]);
  for (const name of names.filter((n) => n.endsWith('.json'))) {
    try {
      const doc = JSON.parse(await readFile(path.join(dir, name), 'utf8')) as {
        startedAt?: string;
        results?: { idle?: { order?: SideOrder } };
      };
      const order = doc.results?.idle?.order;
      const at = doc.startedAt ?? '';
      if ((order === 'ours-first' || order === 'theirs-first') && (!best || at > best.at)) best = { at, order };
    } catch {
      // not a results file we can read: it records no order
    }
  }
  return best?.order;
}

/** A window: its counts plus when it began and ended (`performance.now()`, ms). */
type TimedWindow = SteadyWindow & { from: number; to: number };

/**
 * Measures one window: the API server's request counter read about once a second by a child
 * process from before the window to after it (`lib/api-sampler.ts`: mean and peak rate), CPU and
 * reconciles inside (the sampler's reads and its CPU are not in the CPU figure).
 */
async function measureWindow(
  ctx: BenchContext,
  windowMs: number,
  cpu: () => number,
  reconciles: () => number,
): Promise<TimedWindow> {
  const sampler = await startApiSampler(clusterOf(ctx).cluster.kubeconfigPath);
  const cpu0 = cpu();
  const n0 = reconciles();
  const from = performance.now();
  await sleep(windowMs);
  const to = performance.now();
  const cpu1 = cpu();
  const n1 = reconciles();
  const api = apiRates(await sampler.stop());
  return {
    from,
    to,
    windowMs: to - from,
    cpuSeconds: cpu1 - cpu0,
    apiRequests: api.requests,
    peakApiRequestsPerSecond: api.peakPerSecond,
    reconciles: n1 - n0,
  };
}

/** Creates the git repositories the git Apps share; returns their clone URLs. */
async function createRepos(git: GitServer, count: number): Promise<string[]> {
  const urls: string[] = [];
  for (let r = 0; r < count; r++) {
    const repo = await createRepo(git, `idle-${r}`, {
      'config.yml': yttConfigMap({ source: 'git' }),
      'values.yml': '#@data/values\n---\nname: unset\n',
    });
    urls.push(repo.url);
  }
  return urls;
}

/** How `apps` Apps split into the kinds of source (see {@link IdleMix}). */
export function idleMix(apps: number): IdleMix {
  const inline = Math.round(apps * INLINE_SHARE);
  const gitAll = apps - inline;
  const gitWithSecret = Math.floor(gitAll / 2);
  return { inline, git: gitAll - gitWithSecret, gitWithSecret, repositories: Math.ceil(gitAll / APPS_PER_REPO) };
}

/** The Apps of one side, and the Secrets some of them read, in namespace `ns`. */
function idleObjects(ns: string, apps: number, repos: readonly string[]): { apps: Manifest[]; secrets: Manifest[] } {
  const mix = idleMix(apps);
  const out: { apps: Manifest[]; secrets: Manifest[] } = { apps: [], secrets: [] };
  for (let i = 0; i < apps; i++) {
    const name = `app-${String(i).padStart(4, '0')}`;
    const kind = kindOf(i, mix);
    if (kind === 'inline') {
      out.apps.push(inlineApp(ns, name, `${ns} ${name} ${Date.now()}`, IDLE_SYNC_PERIOD));
      continue;
    }
    const j = i - mix.inline;
    const url = repos[Math.floor(j / APPS_PER_REPO) % repos.length] as string;
    const values = `name: ${name}-config\n`;
    const withSecret = kind === 'gitWithSecret';
    const ytt = withSecret
      ? { valuesFrom: [{ secretRef: { name: `${name}-values` } }] }
      : { inline: { paths: { 'name.yml': `#@data/values\n---\n${values}` } } };
    if (withSecret) {
      out.secrets.push({
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name: `${name}-values`, namespace: ns },
        stringData: { 'values.yml': values },
      });
    }
    out.apps.push({
      apiVersion: 'kappctrl.k14s.io/v1alpha1',
      kind: 'App',
      metadata: { name, namespace: ns },
      spec: {
        serviceAccountName: BENCH_SA,
        syncPeriod: IDLE_SYNC_PERIOD,
        fetch: [{ git: { url, ref: 'origin/main' } }],
        template: [{ ytt }],
        deploy: [{ kapp: {} }],
      },
    });
  }
  return out;
}

/**
 * Creates the Apps (Secrets first) in `ns` and waits (up to {@link RECONCILE_BOUND_MS}) until the
 * benchmark's watch has seen each reconciled; the watch is stopped before returning, so it is not
 * part of the window.
 */
async function createAndSettle(
  ctx: BenchContext,
  ns: string,
  apps: number,
  repos: readonly string[],
): Promise<{ reconciled: number; firstReconcileMs: number }> {
  const { cluster, rest } = clusterOf(ctx);
  const watch = new AppWatch(cluster.kubeconfigPath, ns);
  await watch.start();
  try {
    const objects = idleObjects(ns, apps, repos);
    const t0 = performance.now();
    await createAll(rest, objects.secrets);
    await createAll(rest, objects.apps);
    const keys = objects.apps.map((a) => `${ns}/${a.metadata.name}`);
    try {
      const seen = await watch.waitAll(keys, RECONCILE_BOUND_MS);
      const failed = [...seen.entries()].filter(([, s]) => s.final !== 'succeeded');
      for (const [k, s] of failed.slice(0, 3)) ctx.say(`idle ${k}: failed: ${s.message ?? ''}`);
      return {
        reconciled: apps - failed.length,
        firstReconcileMs: Math.max(...[...seen.values()].map((s) => s.at)) - t0,
      };
    } catch (err) {
      ctx.say(`idle ${ns}: ${(err as Error).message}; measuring anyway`);
      return { reconciled: keys.filter((k) => watch.seen(k)).length, firstReconcileMs: performance.now() - t0 };
    }
  } finally {
    await watch.stop();
  }
}

function side(
  impl: IdleSide['impl'],
  apps: number,
  settle: { reconciled: number; firstReconcileMs: number },
  w: SteadyWindow,
  baselinePerMin: number,
): IdleSide {
  const f = steadyFigures(w, baselinePerMin);
  const r3 = (x: number | null) => (x === null ? null : round(x, 3));
  return {
    impl,
    apps,
    reconciledBeforeWindow: settle.reconciled,
    firstReconcileMs: Math.round(settle.firstReconcileMs),
    windowMs: Math.round(w.windowMs),
    cpuSeconds: round(w.cpuSeconds, 3),
    apiRequests: w.apiRequests,
    peakApiRequestsPerSecond: round(w.peakApiRequestsPerSecond, 1),
    reconciles: w.reconciles,
    cpuSecondsPerMin: round(f.cpuSecondsPerMin, 3),
    apiRequestsPerMin: round(f.apiRequestsPerMin, 1),
    rawApiRequestsPerMin: round(f.rawApiRequestsPerMin, 1),
    apiRequestsPerSecond: round(f.apiRequestsPerSecond, 2),
    rawApiRequestsPerSecond: round(f.rawApiRequestsPerSecond, 2),
    reconcilesPerMin: round(f.reconcilesPerMin, 1),
    cpuSecondsPerReconcile: r3(f.cpuSecondsPerReconcile),
    apiRequestsPerReconcile: r3(f.apiRequestsPerReconcile),
  };
}

/** `n` per key of `keys`, counted. */
function tally(keys: Iterable<string>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const k of keys) out[k] = (out[k] ?? 0) + 1;
  return out;
}

/** The kind of source of the `i`-th App ({@link idleObjects}' order: inline first, then git alternating). */
function kindOf(i: number, mix: IdleMix): 'inline' | 'git' | 'gitWithSecret' {
  if (i < mix.inline) return 'inline';
  return (i - mix.inline) % 2 === 1 ? 'gitWithSecret' : 'git';
}

/** The kind of source of the App under object key `…/app-NNNN`, `other` for any other key. */
function sourceOf(key: string, apps: number): string {
  const i = Number(/\/app-(\d+)$/.exec(key)?.[1] ?? Number.NaN);
  return Number.isInteger(i) && i < apps ? kindOf(i, idleMix(apps)) : 'other';
}

/** What kapp-lambda counted between `w.from` and `w.to`. */
function oursCounts(
  ours: Ours,
  w: TimedWindow,
  apps: number,
  before: { store: number; api: Record<string, number>; tools: ReturnType<Ours['tools']> },
): IdleOursCounts {
  const inWindow = (at: number) => at >= w.from && at <= w.to;
  const events = [...ours.sent.values()].flat().filter((e) => inWindow(e.at));
  const records = ours.records.filter((r) => inWindow(r.at));
  const resolutions = ours.polls.filter((p) => inWindow(p.at)).reduce((n, p) => n + p.polled, 0);
  const storeCalls = ours.store.calls - before.store;
  const pipelineApi: Record<string, number> = {};
  for (const [m, n] of Object.entries(ours.api)) if (m !== 'ms') pipelineApi[m] = n - (before.api[m] ?? 0);
  const pm = (n: number) => round(perMinute(n, w.windowMs), 1);
  return {
    messages: events.length,
    messagesByReason: tally(events.map((e) => e.reason)),
    messagesBySource: tally(
      [...ours.sent.entries()].flatMap(([key, list]) =>
        list.filter((e) => inWindow(e.at)).map(() => sourceOf(key, apps)),
      ),
    ),
    stageRuns: records.length,
    stageRunsByStage: tally(records.map((r) => `${r.stage} ${r.outcome}`)),
    storeCalls,
    sourcePollResolutions: resolutions,
    sourcePollRecordWrites: ours.pollRecordWrites.filter(inWindow).length,
    tools: toolDelta(before.tools, ours.tools()),
    perMin: {
      messages: pm(events.length),
      stageRuns: pm(records.length),
      storeCalls: pm(storeCalls),
      sourcePollResolutions: pm(resolutions),
    },
    pipelineApi,
    safetyPeriodMs: DEFAULT_SAFETY_SYNC_PERIOD_MS,
    allowedMessages: safetyAllowance(apps, w.windowMs, DEFAULT_SAFETY_SYNC_PERIOD_MS),
  };
}

/** kapp-lambda: the embedded runtime in its namespace, its Apps, one window. */
async function idleOurs(
  ctx: BenchContext,
  opts: IdleOptions,
  repos: readonly string[],
  baselinePerMin: number,
): Promise<IdleSide> {
  const { rest } = clusterOf(ctx);
  await createTenants(rest, [NS.ours]);
  const ours = await startOursIn(ctx, NS.ours, 'idle', CONCURRENCY);
  try {
    await waitForwardersReady(ours);
    const settle = await createAndSettle(ctx, NS.ours, opts.apps, repos);
    await ours.runtime.pipeline.idle();
    ctx.say(`idle ours: ${settle.reconciled}/${opts.apps} reconciled; measuring ${opts.windowMs / 1000} s`);
    const before = { store: ours.store.calls, api: { ...ours.api }, tools: ours.tools() };
    const w = await measureWindow(
      ctx,
      opts.windowMs,
      () => procCpuSeconds(process.pid),
      () => ours.records.filter(endsRun).length,
    );
    return {
      ...side('kapp-lambda', opts.apps, settle, w, baselinePerMin),
      counts: oursCounts(ours, w, opts.apps, before),
    };
  } finally {
    await ours.stop();
  }
}

/** kapp-controller: started for its namespace, its Apps, one window. */
async function idleTheirs(
  ctx: BenchContext,
  bin: string,
  opts: IdleOptions,
  repos: readonly string[],
  baselinePerMin: number,
): Promise<IdleSide & { version: string }> {
  const { cluster, rest } = clusterOf(ctx);
  await createTenants(rest, [NS.theirs]);
  const kc: KappController = await startKappController(bin, {
    kubeconfigPath: cluster.kubeconfigPath,
    namespace: NS.theirs,
    concurrency: CONCURRENCY,
    log: ctx.say,
  });
  try {
    const settle = await createAndSettle(ctx, NS.theirs, opts.apps, repos);
    ctx.say(`idle kapp-controller: ${settle.reconciled}/${opts.apps} reconciled; measuring ${opts.windowMs / 1000} s`);
    const w = await measureWindow(
      ctx,
      opts.windowMs,
      () => kc.cpuSeconds(),
      () => kc.deploys(),
    );
    return { ...side('kapp-controller', opts.apps, settle, w, baselinePerMin), version: kc.version };
  } finally {
    await kc.stop();
  }
}

const fmt = (n: number, digits = 1) => n.toLocaleString('en-US', { maximumFractionDigits: digits });

/** The scenario's table rows. */
function idleRows(ctx: BenchContext, result: IdleResult): void {
  const verdict = (r: number | null) => (r === null ? '' : r <= STEADY_TARGET_RATIO ? 'met' : 'missed');
  const m = result.mix;
  const what = `${result.apps} Apps (${m.inline} inline, ${m.git + m.gitWithSecret} git branch of which ${m.gitWithSecret} with a Secret) at ${result.syncPeriod}, ${fmt(result.windowMs / 1000, 0)} s window, ${result.order}`;
  if (result.baseline) {
    ctx.rows.push({
      scenario: SCENARIO,
      figure: 'baseline: control plane alone, API requests/min; peak second, requests/s',
      value: `${fmt(result.baseline.apiRequestsPerMin)}; ${fmt(result.baseline.peakApiRequestsPerSecond)}`,
    });
  }
  for (const s of [result.ours, result.theirs]) {
    if (!s) continue;
    const ours = s.impl === 'kapp-lambda';
    const target = ours ? { target: `≤ ${STEADY_TARGET_RATIO}× kapp-controller` } : {};
    ctx.rows.push(
      {
        scenario: SCENARIO,
        figure: `${what}, ${s.impl}: CPU-seconds/min`,
        value: `${fmt(s.cpuSecondsPerMin, 3)}${ours && result.ratios.cpu !== null ? `; ours/theirs ${result.ratios.cpu.toFixed(3)}` : ''}`,
        ...(ours ? { ...target, verdict: verdict(result.ratios.cpu) } : {}),
      },
      {
        scenario: SCENARIO,
        figure: `  ${s.impl}: API requests/min (less baseline)`,
        value: `${fmt(s.apiRequestsPerMin)} (counted ${fmt(s.rawApiRequestsPerMin)})${ours && result.ratios.api !== null ? `; ours/theirs ${result.ratios.api.toFixed(3)}` : ''}`,
        ...(ours ? { ...target, verdict: verdict(result.ratios.api) } : {}),
      },
      {
        scenario: SCENARIO,
        figure: `  ${s.impl}: reconciles/min; per reconcile`,
        value: `${fmt(s.reconcilesPerMin)}; ${s.cpuSecondsPerReconcile === null ? '–' : `${fmt(s.cpuSecondsPerReconcile, 3)} CPU-s`}, ${s.apiRequestsPerReconcile === null ? '–' : `${fmt(s.apiRequestsPerReconcile)} requests`} (${s.reconciledBeforeWindow}/${s.apps} reconciled first, in ${fmt(s.firstReconcileMs / 1000)} s)`,
      },
    );
    const c = s.counts;
    if (!c) continue;
    ctx.rows.push(
      {
        scenario: SCENARIO,
        figure: `  ${s.impl}: messages in (forwarder events to the pipeline), in the window; /min`,
        value: `${c.messages}; ${fmt(c.perMin.messages)}`,
        target: `≤ ${c.allowedMessages} (Apps × ⌈window / ${fmt(c.safetyPeriodMs / 60_000)} min safety period⌉)`,
        verdict: c.messages <= c.allowedMessages ? 'met' : 'missed',
      },
      {
        scenario: SCENARIO,
        figure: `  ${s.impl}: stage runs (function invocations), store calls, source poll resolutions; /min; poll record writes`,
        value: `${c.stageRuns}, ${c.storeCalls}, ${c.sourcePollResolutions}; ${fmt(c.perMin.stageRuns)}, ${fmt(c.perMin.storeCalls)}, ${fmt(c.perMin.sourcePollResolutions)}; ${c.sourcePollRecordWrites}`,
      },
    );
  }
}

/**
 * Runs the scenario (baseline, then each side in this run's order; each its own step, so one
 * failure leaves the others measured) and adds its table rows.
 * @param bin - the kapp-controller binary, or undefined when its build failed (then only ours)
 * @throws Error when `opts.first` is neither `ours` nor `theirs` (from {@link nextOrder}).
 */
export async function idleScenario(
  ctx: BenchContext,
  bin: string | undefined,
  step: StepRunner,
  opts: IdleOptions,
): Promise<IdleResult> {
  const result: IdleResult = {
    apps: opts.apps,
    mix: idleMix(opts.apps),
    syncPeriod: IDLE_SYNC_PERIOD,
    concurrency: CONCURRENCY,
    windowMs: opts.windowMs,
    order: nextOrder(await lastIdleOrder(opts.resultsDir), opts.first),
    namespaces: NS,
    ratios: { cpu: null, api: null },
  };
  const git = await startGitServer();
  try {
    const repos = await createRepos(git, result.mix.repositories);
    const baseline = await step(SCENARIO, 'baseline (control plane alone)', async () => {
      const w = await measureWindow(
        ctx,
        Math.min(opts.windowMs, BASELINE_MAX_MS),
        () => 0,
        () => 0,
      );
      return {
        windowMs: Math.round(w.windowMs),
        apiRequests: w.apiRequests,
        apiRequestsPerMin: round(perMinute(w.apiRequests, w.windowMs), 1),
        apiRequestsPerSecond: round(perMinute(w.apiRequests, w.windowMs) / 60, 2),
        peakApiRequestsPerSecond: round(w.peakApiRequestsPerSecond, 1),
      };
    });
    if (!baseline) return result;
    result.baseline = baseline;
    const runOurs = async () => {
      result.ours = await step(SCENARIO, `${opts.apps} Apps, kapp-lambda`, () =>
        idleOurs(ctx, opts, repos, baseline.apiRequestsPerMin),
      );
    };
    const runTheirs = async () => {
      if (!bin) return;
      result.theirs = await step(SCENARIO, `${opts.apps} Apps, kapp-controller`, () =>
        idleTheirs(ctx, bin, opts, repos, baseline.apiRequestsPerMin),
      );
    };
    for (const run of result.order === 'ours-first' ? [runOurs, runTheirs] : [runTheirs, runOurs]) await run();
  } finally {
    await git.stop();
  }
  if (result.ours && result.theirs) {
    const r = steadyRatios(result.ours, result.theirs);
    result.ratios = { cpu: r.cpu === null ? null : round(r.cpu, 3), api: r.api === null ? null : round(r.api, 3) };
  }
  idleRows(ctx, result);
  return result;
}
