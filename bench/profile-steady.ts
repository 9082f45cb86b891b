/**
 * Profiling driver for the steady state (issue 13 item 6), not a benchmark scenario: starts its
 * own kwok control plane and the instrumented embedded runtime (as the idle scenario, `scenarios/idle.ts`, does for its inline Apps),
 * creates `APPS` inline-ytt Apps (default 20) with `syncPeriod: 30s`, waits until all have
 * reconciled plus 40 s, then measures this process's CPU-seconds per minute over a window of
 * `WIN_S` seconds (default 60) without a profiler, and writes a V8 CPU profile of a second
 * window of the same length to `OUT` (default `/tmp/steady.cpuprofile`; open it in Chrome
 * DevTools). Prints the stage outcomes seen (after the first reconcile every run ends `cached`)
 * and whether any tool ran during the windows. Run alone: `npx tsx bench/profile-steady.ts`
 * (~4 min). The profiler's own cost (sampling every 200 µs) inflates the second window's CPU
 * figure: compare the first window's figures between runs.
 *
 * @module
 */
import { mkdtemp, writeFile } from 'node:fs/promises';
import { Session } from 'node:inspector/promises';
import os from 'node:os';
import path from 'node:path';
import { cacheRoot } from '../layers/gobuild.js';
import { applyCrds } from '../scripts/local-env.js';
import { startCluster } from '../test/harness/cluster.js';
import type { BenchContext } from './lib/context.js';
import { procCpuSeconds } from './lib/kapp-controller.js';
import { AppWatch, createAll, createTenants, inlineApp, restFor } from './lib/kube.js';
import { endsRun, startOursIn, waitForwardersReady } from './lib/ours.js';

const N = Number(process.env.APPS ?? 20);
const WIN = Number(process.env.WIN_S ?? 60) * 1000;
const OUT = process.env.OUT ?? '/tmp/steady.cpuprofile';
const t0 = Date.now();
const say = (m: string) => process.stderr.write(`[+${Math.round((Date.now() - t0) / 1000)}s] ${m}\n`);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const cluster = await startCluster({ log: () => {} });
try {
  await applyCrds(cluster.kubeconfigPath);
  const rest = restFor(cluster.kubeconfigPath);
  const ctx: BenchContext = {
    cluster,
    rest,
    cacheRoot: cacheRoot(),
    workRoot: await mkdtemp(path.join(os.tmpdir(), 'prof-')),
    say,
    rows: [],
    unmeasured: [],
    results: {},
  };
  const ns = 'prof-steady';
  await createTenants(rest, [ns]);
  const ours = await startOursIn(ctx, ns, 'steady', 4);
  try {
    await waitForwardersReady(ours);
    const watch = new AppWatch(cluster.kubeconfigPath, ns);
    await watch.start();
    const names = Array.from({ length: N }, (_, i) => `app-${String(i).padStart(4, '0')}`);
    await createAll(
      rest,
      names.map((n) => inlineApp(ns, n, `${ns} ${n}`, '30s')),
    );
    await watch.waitAll(
      names.map((n) => `${ns}/${n}`),
      180_000,
    );
    await watch.stop();
    say('all reconciled; settling 40 s');
    await sleep(40_000);
    const runs = () => ours.records.filter(endsRun).length;
    const outcomes = () => {
      const m: Record<string, number> = {};
      for (const r of ours.records) m[`${r.stage}:${r.outcome}`] = (m[`${r.stage}:${r.outcome}`] ?? 0) + 1;
      return m;
    };
    const tools0 = JSON.stringify(ours.tools());
    let c0 = procCpuSeconds(process.pid);
    let n0 = runs();
    let w0 = performance.now();
    await sleep(WIN);
    let c1 = procCpuSeconds(process.pid);
    let el = performance.now() - w0;
    say(
      `window 1 (no profiler): ${(((c1 - c0) / el) * 60000).toFixed(3)} CPU-s/min, ${runs() - n0} runs ended, ${el.toFixed(0)} ms`,
    );
    const s = new Session();
    s.connect();
    await s.post('Profiler.enable');
    await s.post('Profiler.setSamplingInterval', { interval: 200 });
    await s.post('Profiler.start');
    c0 = procCpuSeconds(process.pid);
    n0 = runs();
    w0 = performance.now();
    await sleep(WIN);
    const { profile } = await s.post('Profiler.stop');
    c1 = procCpuSeconds(process.pid);
    el = performance.now() - w0;
    say(`window 2 (profiled): ${(((c1 - c0) / el) * 60000).toFixed(3)} CPU-s/min, ${runs() - n0} runs ended`);
    say(`outcomes: ${JSON.stringify(outcomes())}`);
    say(`tools same: ${tools0 === JSON.stringify(ours.tools())}`);
    await writeFile(OUT, JSON.stringify(profile));
    say(`profile: ${OUT}`);
  } finally {
    await ours.stop();
  }
} finally {
  await cluster.stop();
}
