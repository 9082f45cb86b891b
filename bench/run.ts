/**
 * `npm run bench [-- <scenario>...]`: kapp-lambda's benchmarks (issue #4) on the local control
 * plane with the embedded runtime, side by side with upstream kapp-controller. Prints a table
 * and writes `bench/results/<date>-<machine>.json` (`…-<scenarios>.json` when only some
 * scenarios ran). How each figure is measured: bench/README.md.
 *
 * Scenarios (all by default, in this order): `bundles`, `latency`, `throughput`,
 * `kapp-controller` (latency and throughput against upstream, with ratios ours/theirs when
 * ours ran in the same run), `resync`, `idle` (issue 24: N inline and git-branch Apps at a 30 s
 * sync period left idle, messages, stage runs, store calls, CPU-seconds and API requests per
 * minute, kapp-lambda and kapp-controller in alternating order; `steady` is its old name), `drift` (a deployed
 * ConfigMap edited and deleted by hand, a valuesFrom Secret edited: time until reverted or
 * re-rendered, ours next to kapp-controller's), `dedup`, `repositories` (inline PackageRepositories of
 * 50, 100 and 500 Packages, ours and upstream's, plus the fleet case), `upgrade`, `rollout`
 * (issue 28: a new version through 20 cluster ids in 3 waves, and a failing member stopping it),
 * `forwarder-memory`, `cost` (the fleet cost model from this run's figures, or the latest
 * committed results files for the scenarios not run; starts nothing). The file also carries
 * `targets`: each figure with its target as numbers (`lib/targets.ts`), printed as a second table.
 *
 * Environment: `BENCH_MACHINE` (name in the results file; default `<cpus>cpu-<GiB>gib`),
 * `BENCH_APPS` (throughput Apps, default 200), `BENCH_MEMORY_COUNTS` (default `0,1000,10000`; 0 is the empty-cluster baseline),
 * `BENCH_LATENCY_RUNS` (default 5), `KAPP_LAMBDA_BENCH_STEADY_APPS` (default 100),
 * `KAPP_LAMBDA_BENCH_STEADY_WINDOW_S` (idle's window, default 600), `BENCH_IDLE_FIRST` (`ours` or
 * `theirs`: the side idle runs first; default the flip of the last results file's), `BENCH_DRIFT_SAMPLES` (default 3),
 * `BENCH_DEDUP_POLL_MS` (the dedup fleet's source poll period, default 60000: the branch phase's poll wait),
 * `BENCH_ROLLOUT_WAVES` (default `2,6,12`), `BENCH_ROLLOUT_SOAK_S` (default 30), `BENCH_ROLLOUT_POLL_MS` (default 60000),
 * `KAPP_LAMBDA_CACHE`. Results made with non-default values
 * say so in `config`.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { cacheRoot } from '../layers/gobuild.js';
import { component } from '../layers/manifest.js';
import { applyCrds } from '../scripts/local-env.js';
import { startCluster } from '../test/harness/cluster.js';
import type { BenchContext } from './lib/context.js';
import {
  ensureKappController,
  initClockTick,
  type KappController,
  startKappController,
} from './lib/kapp-controller.js';
import { createTenants, restFor } from './lib/kube.js';
import { fmtBytes, fmtMs, fmtSummaryMs, renderTable, round } from './lib/stats.js';
import { computeTargets, targetRows } from './lib/targets.js';
import { bundles } from './scenarios/bundles.js';
import { costScenario } from './scenarios/cost.js';
import { branchRows, DEFAULT_DEDUP_POLL_MS, dedupOurs } from './scenarios/dedup.js';
import { DEFAULT_DRIFT_SAMPLES, driftScenario } from './scenarios/drift.js';
import { forwarderMemory } from './scenarios/forwarder-memory.js';
import { DEFAULT_IDLE_APPS, DEFAULT_IDLE_WINDOW_S, idleScenario } from './scenarios/idle.js';
import {
  latencyOurs,
  latencyTheirs,
  type OurLatency,
  reportLatencyOurs,
  type TheirLatency,
} from './scenarios/latency.js';
import { repositoriesScenario } from './scenarios/repositories.js';
import { resyncOurs } from './scenarios/resync.js';
import { DEFAULT_ROLLOUT_SOAK_S, DEFAULT_ROLLOUT_WAVES, rolloutScenario } from './scenarios/rollout.js';
import { type ThroughputRun, throughputOurs, throughputTheirs } from './scenarios/throughput.js';
import { DEFAULT_KC_WAIT_S, DEFAULT_POLL_MS, upgradeScenario } from './scenarios/upgrade.js';

const ALL = [
  'bundles',
  'latency',
  'throughput',
  'kapp-controller',
  'resync',
  'idle',
  'drift',
  'dedup',
  'repositories',
  'upgrade',
  'rollout',
  'forwarder-memory',
  'cost',
] as const;
type Scenario = (typeof ALL)[number];
/** Every scenario but these two starts from cluster A (forwarder-memory starts its own; cost computes only); bundles reads an App from it on a real first invocation. */
const NEEDS_CLUSTER: readonly Scenario[] = ALL.filter((s) => s !== 'forwarder-memory' && s !== 'cost');

/** Old scenario names still accepted on the command line. */
const ALIASES: Record<string, Scenario> = { steady: 'idle' };
const args = process.argv
  .slice(2)
  .filter((a) => a !== '--')
  .map((a) => ALIASES[a] ?? a);
if (args.includes('-h') || args.includes('--help')) {
  process.stdout.write(
    `usage: npm run bench -- [scenario ...]   (default: every scenario)\nscenarios: ${ALL.join(', ')}\nresults: bench/results/ (JSON and Markdown); settings (BENCH_* variables) and how each figure is taken: bench/README.md\n`,
  );
  process.exit(0);
}
const unknown = args.filter((a) => !(ALL as readonly string[]).includes(a));
if (unknown.length) {
  process.stderr.write(`unknown scenario(s): ${unknown.join(', ')}; choose from: ${ALL.join(', ')}\n`);
  process.exit(2);
}
const selected: Scenario[] = args.length ? ALL.filter((s) => args.includes(s)) : [...ALL];
const APPS = Number(process.env.BENCH_APPS ?? 200);
const MEMORY_COUNTS = (process.env.BENCH_MEMORY_COUNTS ?? '0,1000,10000').split(',').map(Number);
const LATENCY_RUNS = Number(process.env.BENCH_LATENCY_RUNS ?? 5);
const CONCURRENCIES = [4, 10];
const UPGRADE_POLL_MS = Number(process.env.BENCH_UPGRADE_POLL_MS ?? DEFAULT_POLL_MS);
const UPGRADE_KC_WAIT_S = Number(process.env.BENCH_UPGRADE_KC_WAIT_S ?? DEFAULT_KC_WAIT_S);
const DEDUP_POLL_MS = Number(process.env.BENCH_DEDUP_POLL_MS ?? DEFAULT_DEDUP_POLL_MS);
const ROLLOUT_WAVES = process.env.BENCH_ROLLOUT_WAVES?.split(',').map(Number) ?? [...DEFAULT_ROLLOUT_WAVES];
const ROLLOUT_SOAK_S = Number(process.env.BENCH_ROLLOUT_SOAK_S ?? DEFAULT_ROLLOUT_SOAK_S);
const ROLLOUT_POLL_MS = Number(process.env.BENCH_ROLLOUT_POLL_MS ?? DEFAULT_POLL_MS);
const STEADY_APPS = Number(process.env.KAPP_LAMBDA_BENCH_STEADY_APPS ?? DEFAULT_IDLE_APPS);
const STEADY_WINDOW_S = Number(process.env.KAPP_LAMBDA_BENCH_STEADY_WINDOW_S ?? DEFAULT_IDLE_WINDOW_S);
const IDLE_FIRST = process.env.BENCH_IDLE_FIRST || undefined;
if (IDLE_FIRST !== undefined && IDLE_FIRST !== 'ours' && IDLE_FIRST !== 'theirs') {
  process.stderr.write('BENCH_IDLE_FIRST must be ours or theirs\n');
  process.exit(2);
}
const DRIFT_SAMPLES = Number(process.env.BENCH_DRIFT_SAMPLES ?? DEFAULT_DRIFT_SAMPLES);
for (const [name, v] of [
  ['BENCH_DRIFT_SAMPLES', DRIFT_SAMPLES],
  ['KAPP_LAMBDA_BENCH_STEADY_APPS', STEADY_APPS],
  ['KAPP_LAMBDA_BENCH_STEADY_WINDOW_S', STEADY_WINDOW_S],
  ['BENCH_DEDUP_POLL_MS', DEDUP_POLL_MS],
  ['BENCH_ROLLOUT_POLL_MS', ROLLOUT_POLL_MS],
  ...ROLLOUT_WAVES.map((n) => ['BENCH_ROLLOUT_WAVES', n] as const),
] as const) {
  if (!(Number.isInteger(v) && v > 0)) {
    process.stderr.write(`${name} must be a positive integer\n`);
    process.exit(2);
  }
}
if (!(Number.isInteger(ROLLOUT_SOAK_S) && ROLLOUT_SOAK_S >= 0)) {
  process.stderr.write('BENCH_ROLLOUT_SOAK_S must be an integer ≥ 0\n');
  process.exit(2);
}

const started = Date.now();
const say = (m: string) => process.stderr.write(`[bench +${Math.round((Date.now() - started) / 1000)}s] ${m}\n`);
const gib = Math.round(os.totalmem() / 2 ** 30);
const machine = process.env.BENCH_MACHINE ?? `${os.cpus().length}cpu-${gib}gib`;

/** `/proc/loadavg` as read (1-, 5-, 15-minute load, runnable/all tasks, last pid); '' off Linux. */
function procLoadavg(): string {
  try {
    return readFileSync('/proc/loadavg', 'utf8').trim();
  } catch {
    return '';
  }
}
const loadavgAtStart = procLoadavg();
const outDir = path.join(import.meta.dirname, 'results');

function cmd(bin: string, argv: string[]): string {
  try {
    return execFileSync(bin, argv, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  } catch {
    return 'unknown';
  }
}

// what was measured: the commit and any tracked files changed on top of it, read at start
const commitAtStart = cmd('git', ['rev-parse', 'HEAD']);
const dirtyAtStart = cmd('git', ['status', '--porcelain', '--untracked-files=no'])
  .split('\n')
  .map((l) => l.slice(3))
  .filter((f) => f && f !== 'unknown');

const ctx: BenchContext = {
  cacheRoot: cacheRoot(),
  workRoot: await mkdtemp(path.join(os.tmpdir(), 'kapp-lambda-bench-')),
  say,
  rows: [],
  unmeasured: [],
  results: {},
};
await initClockTick();

/** 1-minute load average before and after each step (the machine may be shared). */
const load: { step: string; before: number; after: number; seconds: number }[] = [];

/** Runs one scenario step; a failure is recorded (exact message) and the run goes on. */
async function step<T>(scenario: string, figure: string, fn: () => Promise<T>): Promise<T | undefined> {
  const before = os.loadavg()[0]!;
  const t0 = Date.now();
  try {
    return await fn();
  } catch (err) {
    const e = err as Error;
    const why = `${e.message}${e.cause instanceof Error ? ` (cause: ${e.cause.message})` : ''}`;
    say(`${scenario}: FAILED: ${why}`);
    ctx.unmeasured.push({ scenario, figure, why });
    return undefined;
  } finally {
    load.push({
      step: `${scenario}: ${figure}`,
      before: round(before, 2),
      after: round(os.loadavg()[0]!, 2),
      seconds: Math.round((Date.now() - t0) / 1000),
    });
  }
}

let ourLatency: OurLatency | undefined;
const ourThroughput: ThroughputRun[] = [];
let exitCode = 0;
try {
  if (selected.some((s) => NEEDS_CLUSTER.includes(s))) {
    say('starting the local control plane (cluster A)');
    const cluster = await startCluster({ log: say });
    ctx.cluster = cluster;
    ctx.rest = restFor(cluster.kubeconfigPath);
    await applyCrds(cluster.kubeconfigPath);
  }

  if (selected.includes('bundles')) {
    const b = await step('6 bundles', 'size and cold start', () => bundles(ctx));
    if (b) {
      ctx.results.bundles = b;
      for (const f of b) {
        ctx.rows.push(
          {
            scenario: '6 bundles',
            figure: `${f.stage} bundle (esbuild, minified)`,
            value: `${f.bytes.toLocaleString('en-US')} B (${fmtBytes(f.bytes)})`,
            target: '≤ 1 MB',
            verdict: f.bytes <= 1_000_000 ? 'met' : 'missed',
          },
          {
            scenario: '6 bundles',
            figure: `${f.stage} init: fresh node → empty batch handled (no SDK)`,
            value: `${fmtSummaryMs(f.init)}; import ${Math.round(f.importMs)} ms`,
            target: '',
            verdict: '',
          },
        );
        const first = f.firstInvocation;
        if (first) {
          ctx.rows.push({
            scenario: '6 bundles',
            figure: `${f.stage} cold start: fresh node → one real record handled`,
            value: `${fmtSummaryMs(first.wall)}; import ${Math.round(first.importMs)} ms, SDK alone ${Math.round(first.sdkLoad.median)} ms, ${first.toolRuns} tool run(s) ${Math.round(first.toolMs)} ms`,
            target: '',
            verdict: '',
          });
          ctx.rows.push({
            scenario: '6 bundles',
            figure: `${f.stage} cold start outside tools (the above less its tool time)`,
            value: fmtSummaryMs(first.outsideTools),
            target: '≤ 150 ms',
            verdict: first.outsideTools.median <= 150 ? 'met' : 'missed',
          });
        }
      }
    }
  }

  // Ours and kapp-controller alternate (latency, then each concurrency), so a load change on a
  // shared machine does not fall on one side only.
  const kcRows: typeof ctx.rows = [];
  const theirs: { version?: string; latency?: TheirLatency; throughput: ThroughputRun[]; startMs?: number } = {
    throughput: [],
  };
  let bin: string | undefined;
  if (
    ['kapp-controller', 'repositories', 'upgrade', 'idle', 'drift', 'dedup'].some((s) =>
      selected.includes(s as Scenario),
    )
  ) {
    bin = await step('7 kapp-controller', 'build', () => ensureKappController((m) => say(`build: ${m}`)));
  }
  const runTheirs = async <T>(
    figure: string,
    ns: string,
    concurrency: number,
    fn: (kc: KappController) => Promise<T>,
  ): Promise<T | undefined> => {
    // `bin` is also built for the repositories scenario alone
    if (!bin || !selected.includes('kapp-controller')) return undefined;
    const kcBin = bin;
    return await step('7 kapp-controller', figure, async () => {
      await createTenants(ctx.rest!, [ns]);
      const kc = await startKappController(kcBin, {
        kubeconfigPath: ctx.cluster!.kubeconfigPath,
        namespace: ns,
        concurrency,
        log: say,
      });
      theirs.version = kc.version;
      theirs.startMs ??= kc.startMs;
      try {
        return await fn(kc);
      } finally {
        await kc.stop();
      }
    });
  };

  if (selected.includes('latency')) {
    ourLatency = await step('1 latency', 'create → ReconcileSucceeded', () => latencyOurs(ctx, LATENCY_RUNS));
    if (ourLatency) reportLatencyOurs(ctx, ourLatency);
  }
  const lat = await runTheirs('latency', 'bench-kc-latency', 4, (kc) =>
    latencyTheirs(ctx, 'bench-kc-latency', kc, LATENCY_RUNS),
  );
  if (lat) {
    theirs.latency = lat;
    const ratio = ourLatency ? ourLatency.total.median / lat.total.median : undefined;
    kcRows.push({
      scenario: '7 kapp-controller',
      figure: `latency, kapp-controller ${theirs.version}`,
      value: `${fmtSummaryMs(lat.total)}${ratio ? `; ours/theirs ${ratio.toFixed(2)}` : ''}`,
    });
  }

  for (const c of CONCURRENCIES) {
    if (selected.includes('throughput')) {
      const r = await step('2 throughput', `${APPS} Apps at concurrency ${c}`, () =>
        throughputOurs(ctx, `bench-throughput-c${c}`, c, APPS),
      );
      if (r) {
        ourThroughput.push(r);
        ctx.rows.push(
          {
            scenario: '2 throughput',
            figure: `${APPS} Apps, concurrency ${c}: all succeeded after`,
            value: `${fmtMs(r.wallMs)} (${r.succeeded} ok, ${r.failed} failed; ${r.appsPerSecond.toFixed(2)} Apps/s)`,
          },
          {
            scenario: '2 throughput',
            figure: `  concurrency ${c}: function-seconds`,
            value: `${r.functionSeconds!.toFixed(1)} s (tools ${(Object.values(r.tools ?? {}).reduce((a, t) => a + t.ms, 0) / 1000).toFixed(1)} s; CPU ${r.cpuSeconds.toFixed(1)} s)`,
          },
          {
            scenario: '2 throughput',
            figure: `  concurrency ${c}: API requests/s on the API server, mean; peak second`,
            value: `${r.apiRequestsPerSecond}; ${r.peakApiRequestsPerSecond}`,
          },
        );
      }
    }
    const ns = `bench-kc-throughput-c${c}`;
    const r = await runTheirs(`throughput at -concurrency=${c}`, ns, c, (kc) => throughputTheirs(ctx, ns, kc, c, APPS));
    if (r) {
      theirs.throughput.push(r);
      const ours = ourThroughput.find((o) => o.concurrency === c);
      kcRows.push({
        scenario: '7 kapp-controller',
        figure: `throughput ${APPS} Apps, -concurrency=${c}`,
        value: `${fmtMs(r.wallMs)} (${r.succeeded} ok; CPU ${r.cpuSeconds.toFixed(1)} s; API ${r.apiRequestsPerSecond}/s mean, ${r.peakApiRequestsPerSecond}/s peak)${ours ? `; ours/theirs time ${(ours.wallMs / r.wallMs).toFixed(2)}, CPU ${(ours.cpuSeconds / r.cpuSeconds).toFixed(2)}` : ''}`,
      });
    }
  }
  if (selected.includes('throughput')) ctx.results.throughput = ourThroughput;
  if (selected.includes('kapp-controller')) {
    ctx.rows.push(...kcRows);
    ctx.results.kappController = {
      ...theirs,
      ratios: {
        latencyMedian:
          ourLatency && theirs.latency ? round(ourLatency.total.median / theirs.latency.total.median, 3) : null,
        throughputWall: Object.fromEntries(
          theirs.throughput.map((t) => {
            const o = ourThroughput.find((x) => x.concurrency === t.concurrency);
            return [`c${t.concurrency}`, o ? round(o.wallMs / t.wallMs, 3) : null];
          }),
        ),
        throughputCpu: Object.fromEntries(
          theirs.throughput.map((t) => {
            const o = ourThroughput.find((x) => x.concurrency === t.concurrency);
            return [`c${t.concurrency}`, o ? round(o.cpuSeconds / t.cpuSeconds, 3) : null];
          }),
        ),
      },
    };
  }

  if (selected.includes('resync')) {
    const r = await step('3 resync', 'no-op resync', () => resyncOurs(ctx));
    if (r) {
      ctx.results.resync = r;
      const api = r.apiPerApp;
      ctx.rows.push(
        {
          scenario: '3 resync',
          figure: 'tool processes per resync',
          value: `${r.toolRunsPerApp} (${
            Object.entries(r.toolsPerApp)
              .map(([t, v]) => `${t} ${v.runs}× ${fmtMs(v.ms)}`)
              .join(', ') || 'none'
          })`,
          target: '0',
          verdict: r.toolRunsPerApp === 0 ? 'met' : 'missed',
        },
        {
          scenario: '3 resync',
          figure: 'API requests per resync (pipeline)',
          value: `${api.all ?? 0} (${Object.entries(api)
            .filter(([m, n]) => m !== 'all' && m !== 'ms' && n > 0)
            .map(([m, n]) => `${m} ${n}`)
            .join(', ')}), ${fmtMs(api.ms ?? 0)} in total`,
        },
        {
          scenario: '3 resync',
          figure: 'function time per resync (Σ stages)',
          value: fmtSummaryMs(r.functionMs),
          target: '< 50 ms',
          verdict: r.functionMs.median < 50 ? 'met' : 'missed',
        },
        { scenario: '3 resync', figure: '  event → last stage record', value: fmtSummaryMs(r.wallMs) },
      );
    }
  }

  if (selected.includes('idle')) {
    ctx.results.idle = await idleScenario(ctx, bin, step, {
      apps: STEADY_APPS,
      windowMs: STEADY_WINDOW_S * 1000,
      resultsDir: outDir,
      first: IDLE_FIRST,
    });
  }

  if (selected.includes('drift')) {
    ctx.results.drift = await driftScenario(ctx, bin, step, DRIFT_SAMPLES);
  }

  if (selected.includes('dedup')) {
    const r = await step('5 dedup', '20 cluster ids', () => dedupOurs(ctx, bin, { pollMs: DEDUP_POLL_MS }));
    if (r) {
      ctx.results.dedup = r;
      for (const [label, p] of [
        ['burst', r.burst],
        ['staggered', r.staggered],
      ] as const) {
        ctx.rows.push(
          {
            scenario: '5 dedup',
            figure: `${label}: fetch executions (vendir) for ${p.clusterIds} ids`,
            value: `${p.fetchExecutions} (${p.succeeded}/${p.clusterIds} succeeded in ${fmtMs(p.wallMs)})`,
            target: '1',
            verdict: p.fetchExecutions === 1 ? 'met' : 'missed',
          },
          {
            scenario: '5 dedup',
            figure: `${label}: template executions (ytt)`,
            value: String(p.templateExecutions),
            target: '1',
            verdict: p.templateExecutions === 1 ? 'met' : 'missed',
          },
          {
            scenario: '5 dedup',
            figure: `  ${label}: the 2 real clusters (same ns/name)`,
            value: `vendir ${p.realClusters.fetchExecutions}, ytt ${p.realClusters.templateExecutions}`,
          },
        );
      }
      if (r.branch) ctx.rows.push(...branchRows(r.branch));
    }
  }

  if (selected.includes('repositories')) {
    ctx.results.repositories = await repositoriesScenario(ctx, bin, step);
  }

  if (selected.includes('upgrade')) {
    ctx.results.upgrade = await upgradeScenario(ctx, bin, step, {
      pollMs: UPGRADE_POLL_MS,
      kcWaitS: UPGRADE_KC_WAIT_S,
    });
  }

  if (selected.includes('rollout')) {
    ctx.results.rollout = await rolloutScenario(ctx, step, {
      waveSizes: ROLLOUT_WAVES,
      soakS: ROLLOUT_SOAK_S,
      pollMs: ROLLOUT_POLL_MS,
    });
  }

  if (selected.includes('forwarder-memory')) {
    const r = await step('4 forwarder memory', 'RSS', () => forwarderMemory(ctx, MEMORY_COUNTS));
    if (r) {
      ctx.results.forwarderMemory = r;
      for (const s of r.samples) {
        const flagged = s.flags.length > 0;
        ctx.rows.push({
          scenario: '4 forwarder memory',
          figure: `${s.apps ? `${s.apps.toLocaleString('en-US')} Apps + ${(s.apps * 3).toLocaleString('en-US')} refs + ${s.deployedObjects.toLocaleString('en-US')} deployed` : 'no Apps (baseline)'}, ${flagged ? 'V8 flags' : 'node defaults'}`,
          value: `RSS ${fmtBytes(s.rssSynced)} synced, ${fmtBytes(s.rssSettled)} settled, peak ${fmtBytes(s.peakRss)}`,
          ...(s.apps === 10_000 ? { target: '≤ 120 MB', verdict: s.rssSettled <= 120_000_000 ? 'met' : 'missed' } : {}),
        } as (typeof ctx.rows)[number]);
      }
    }
  }

  if (selected.includes('cost')) {
    // last: it reads this run's figures (committed results files for the scenarios not run)
    const c = await step('10 cost', 'fleet cost model', async () => costScenario(ctx.results, outDir));
    if (c) {
      ctx.results.cost = c.result;
      ctx.rows.push(...c.rows);
    }
  }
} catch (err) {
  say(`bench failed: ${(err as Error).message}`);
  exitCode = 1;
} finally {
  await ctx.cluster?.stop();
  await rm(ctx.workRoot, { recursive: true, force: true });
}

const finished = Date.now();
const doc = {
  schema: 1,
  startedAt: new Date(started).toISOString(),
  durationSeconds: Math.round((finished - started) / 1000),
  scenarios: selected,
  config: {
    apps: APPS,
    memoryCounts: MEMORY_COUNTS,
    latencyRuns: LATENCY_RUNS,
    concurrencies: CONCURRENCIES,
    upgradePollMs: UPGRADE_POLL_MS,
    upgradeKcWaitS: UPGRADE_KC_WAIT_S,
    dedupPollMs: DEDUP_POLL_MS,
    rolloutWaves: ROLLOUT_WAVES,
    rolloutSoakS: ROLLOUT_SOAK_S,
    rolloutPollMs: ROLLOUT_POLL_MS,
    steadyApps: STEADY_APPS,
    steadyWindowS: STEADY_WINDOW_S,
    driftSamples: DRIFT_SAMPLES,
    /**
     * `/proc/loadavg` at the start and the end of the run: the machine is shared with other
     * engineers' test suites, whose load is in these figures (per-step 1-minute averages: `load`).
     */
    loadavg: { start: loadavgAtStart, end: procLoadavg() },
  },
  machine: {
    name: machine,
    cpus: os.cpus().length,
    cpuModel: os.cpus()[0]?.model ?? 'unknown',
    memoryGiB: round(os.totalmem() / 2 ** 30, 1),
    kernel: `${os.type()} ${os.release()} ${os.arch()}`,
    node: process.version,
    go: cmd('go', ['version']),
  },
  versions: {
    kappLambdaCommit: commitAtStart,
    /** Tracked files that differed from that commit when the run started. */
    uncommittedFiles: dirtyAtStart,
    kubernetes: component('kubernetes').version,
    kappController: component('kapp-controller').version,
    tools: Object.fromEntries(['vendir', 'ytt', 'kapp', 'kwok'].map((n) => [n, component(n).version])),
  },
  load,
  rows: ctx.rows,
  unmeasured: ctx.unmeasured,
  /** Each figure with its target as numbers (bench/README.md, "Targets"). */
  targets: computeTargets(ctx.results),
  results: ctx.results,
};
const day = new Date(started).toISOString().slice(0, 10);
const suffix = selected.length === ALL.length ? '' : `-${selected.join('+')}`;
await mkdir(outDir, { recursive: true });
const outFile = path.join(outDir, `${day}-${machine}${suffix}.json`);
await writeFile(outFile, `${JSON.stringify(doc, null, 2)}\n`);

process.stdout.write(`\n${renderTable(ctx.rows)}\n`);
if (Object.keys(doc.targets).length) process.stdout.write(`\n${renderTable(targetRows(doc.targets))}\n`);
if (ctx.unmeasured.length) {
  process.stdout.write('\nnot measured:\n');
  for (const u of ctx.unmeasured) process.stdout.write(`- ${u.scenario} (${u.figure}): ${u.why}\n`);
}
process.stdout.write(
  `\nmachine: ${doc.machine.cpus} × ${doc.machine.cpuModel}, ${doc.machine.memoryGiB} GiB, ${doc.machine.kernel}, node ${process.version}\nresults: ${path.relative(process.cwd(), outFile)} (${doc.durationSeconds} s)\n`,
);
process.exit(exitCode || (ctx.unmeasured.length ? 1 : 0));
