/**
 * The environment variables of the benchmarks (`bench/run.ts`, `bench/profile-steady.ts` and
 * their scenarios), which read `process.env` inline at their top level (importing them runs
 * them), so their rows live here, beside them. `docs/configuration.md`'s bench table is
 * generated from them (`npm run gen:config`).
 *
 * @module
 */
import type { SettingDoc } from '../functions/lib/api/env.js';

/** The benchmarks' knobs; results made with non-default values say so in their `config`. */
export const BENCH_ENV_DOCS: readonly SettingDoc[] = [
  {
    name: 'BENCH_MACHINE',
    default: '`<cpus>cpu-<GiB>gib`',
    meaning: 'name of the machine in the results file',
    readBy: '`bench/run.ts`',
  },
  {
    name: 'BENCH_APPS',
    default: '200',
    meaning: 'Apps of the throughput scenario',
    readBy: '`bench/run.ts`',
  },
  {
    name: 'BENCH_MEMORY_COUNTS',
    default: '`0,1000,10000`',
    meaning: 'object counts of the memory scenario (0: the empty-cluster baseline)',
    readBy: '`bench/run.ts`',
  },
  {
    name: 'BENCH_LATENCY_RUNS',
    default: '5',
    meaning: 'runs of the latency scenario',
    readBy: '`bench/run.ts`',
  },
  {
    name: 'BENCH_UPGRADE_POLL_MS',
    default: "60 000 (the runtime's)",
    meaning: "source poll period of the upgrade scenario's runtimes",
    readBy: '`bench/run.ts`',
  },
  {
    name: 'BENCH_ROLLOUT_WAVES',
    default: '`2,6,12`',
    meaning: 'wave sizes of the rollout scenario (comma list, at least 3 waves; the fleet is their sum)',
    readBy: '`bench/run.ts`',
  },
  {
    name: 'BENCH_ROLLOUT_SOAK_S',
    default: '30',
    meaning: "every wave's soak in the rollout scenario, seconds",
    readBy: '`bench/run.ts`',
  },
  {
    name: 'BENCH_ROLLOUT_POLL_MS',
    default: "60 000 (the runtime's)",
    meaning: "source poll period of the rollout scenario's runtimes",
    readBy: '`bench/run.ts`',
  },
  {
    name: 'BENCH_UPGRADE_KC_WAIT_S',
    default: '660',
    meaning: 'bound of the wait for kapp-controller in the upgrade scenario (its repository syncs every 10 min)',
    readBy: '`bench/run.ts`',
  },
  {
    name: 'BENCH_DEDUP_POLL_MS',
    default: "60 000 (the runtime's)",
    meaning: "source poll period of the dedup scenario's fleet (its `branch` phase's poll wait)",
    readBy: '`bench/run.ts`',
  },
  {
    name: 'BENCH_DRIFT_SAMPLES',
    default: '3',
    meaning: 'samples per kind of change and side in the drift scenario',
    readBy: '`bench/run.ts`',
  },
  {
    name: 'KAPP_LAMBDA_BENCH_STEADY_APPS',
    default: '100',
    meaning: 'Apps of the idle scenario (once `steady`)',
    readBy: '`bench/run.ts`',
  },
  {
    name: 'KAPP_LAMBDA_BENCH_STEADY_WINDOW_S',
    default: '600',
    meaning: 'measuring window of the idle scenario, seconds',
    readBy: '`bench/run.ts`',
  },
  {
    name: 'BENCH_IDLE_FIRST',
    default: "the flip of the newest results file's order",
    meaning: '`ours` or `theirs`: the side the idle scenario runs first',
    readBy: '`bench/run.ts`',
  },
  {
    name: 'BENCH_TRACE',
    default: 'unset',
    meaning:
      'set: one stderr line per pipeline API request, store call and stage run of the embedded runtimes (`TRACE …`)',
    readBy: '`bench/lib/ours.ts`',
  },
  {
    name: 'BENCH_CPU_PROF_DIR',
    default: 'unset',
    meaning: 'set: a V8 CPU profile of every cold-start child, in that directory',
    readBy: '`bench/scenarios/bundles.ts`',
  },
  {
    name: ['APPS', 'WIN_S', 'OUT'],
    default: '20, 60, `/tmp/steady.cpuprofile`',
    meaning: 'Apps, window (seconds) and profile file of the steady-state profiling driver',
    readBy: '`bench/profile-steady.ts`',
  },
];
