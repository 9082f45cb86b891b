/**
 * Scenario 12, drift and input changes (issue 24, "Drift" and "Input changes"): how long a
 * hand change to what an App deployed, or to an input it reads, stays unreverted (or
 * unrendered), kapp-lambda next to kapp-controller v0.53.1.
 *
 * Each side has one App in its namespace (`syncPeriod: 30s`, upstream's default; kapp-lambda in
 * its default `exception` mode) whose inline ytt template renders the ConfigMap
 * `drift-config` from a data value supplied by a ytt `valuesFrom` Secret. Both run at the same
 * time on cluster A (each watches only its own namespace): the sides then take turns within each
 * sample, the order alternating from sample to sample, so a load change on the shared machine
 * falls on both; kapp-controller's 30 s syncs of its one App are a negligible load on ours.
 * Per sample and side, after a random 0–2 s pause (so kapp-controller's phase in its 30 s period
 * is not fixed), one hand change through the admin REST client, as `kubectl` would make it:
 *
 * - `edit`: a JSON merge patch of the deployed ConfigMap's data → the benchmark's watch sees the
 *   edited data, then the rendered data again;
 * - `delete`: the ConfigMap deleted → the watch sees it gone, then back with the rendered data;
 * - `secret`: the `valuesFrom` Secret's value changed → the ConfigMap shows the new value.
 *
 * Timed from just before the change request is sent to the watch event that shows the result,
 * bounded ({@link WAIT_BOUND_MS}; "not within N s" is recorded, the scenario goes on). For
 * kapp-lambda also what each took: the forwarder's events for the App (`Ours.sent`, with their
 * causes) and the stage runs (`Ours.records`) from the change to 2 s after the result was seen.
 *
 * @module
 */

import type { KubeObject } from '../../functions/lib/kube/port.js';
import { clientForKubeConfig } from '../../functions/lib/kube/registry.js';
import type { RestTransport } from '../../functions/lib/kube/transport.js';
import { type BenchContext, clusterOf } from '../lib/context.js';
import { type KappController, startKappController } from '../lib/kapp-controller.js';
import {
  AppWatch,
  collectionPath,
  createAll,
  createTenants,
  inlineApp,
  listWatch,
  loadKubeConfig,
} from '../lib/kube.js';
import { type Ours, startOursIn, waitForwardersReady } from '../lib/ours.js';
import { fmtMs, fmtSummaryMs, type Summary, summarize } from '../lib/stats.js';
import { DRIFT_TARGET_MS } from '../lib/targets.js';
import type { StepRunner } from './repositories.js';

/** Default samples per kind and side (env `BENCH_DRIFT_SAMPLES`). */
export const DEFAULT_DRIFT_SAMPLES = 3;
/** Longest wait for one change's result, ms: kapp-controller's 30 s period plus jitter, thrice over. */
const WAIT_BOUND_MS = 90_000;
/** Longest wait for the first reconcile of each side's App. */
const RECONCILE_BOUND_MS = 180_000;
/** What is counted of kapp-lambda's work after the result was seen (its status write, echoes). */
const SETTLE_MS = 2_000;
const SYNC_PERIOD = '30s';
const CONCURRENCY = 4;
const SCENARIO = '12 drift';
const NS = { ours: 'bench-drift', theirs: 'bench-kc-drift' };
const APP = 'drift';
const CONFIG_MAP = `${APP}-config`;
const SECRET = `${APP}-values`;

/** The hand changes, in the order they are sampled. */
export const DRIFT_KINDS = ['edit', 'delete', 'secret'] as const;
/** One kind of hand change. */
export type DriftKind = (typeof DRIFT_KINDS)[number];
const KIND_TEXT: Record<DriftKind, string> = {
  edit: 'hand edit of the deployed ConfigMap → reverted',
  delete: 'hand deletion of the deployed ConfigMap → recreated',
  secret: 'valuesFrom Secret edited → ConfigMap at the new value',
};

/** One side's sample of one kind. */
export interface DriftSample {
  kind: DriftKind;
  sample: number;
  impl: 'kapp-lambda' | 'kapp-controller';
  /** Whether this side went first in this sample. */
  first: boolean;
  /** Change request sent → result seen, ms; null when not within the bound. */
  ms: number | null;
  /** kapp-lambda: forwarder events for the App in the window, with reason and cause. */
  events?: { reason: string; cause?: string }[];
  /** kapp-lambda: stage runs of the App in the window (`stage:outcome`). */
  stageRuns?: string[];
}

/** One side's figures for one kind. */
export interface DriftFigures {
  /** Summary of the samples seen within the bound (absent when none was). */
  ms?: Summary;
  /** Samples not within the bound. */
  missed: number;
  /** kapp-lambda: forwarder events and stage runs per sample, mean. */
  eventsPerSample?: number;
  stageRunsPerSample?: number;
  /** kapp-lambda: the distinct causes of those events. */
  causes?: string[];
}

/** Result of the drift scenario, as written to the results file. */
export interface DriftResult {
  samples: number;
  syncPeriod: string;
  concurrency: number;
  waitBoundMs: number;
  namespaces: { ours: string; theirs: string };
  /** Both sides ran at the same time, taking turns within each sample. */
  together: true;
  kappControllerVersion?: string;
  /** Every sample, in the order taken. */
  runs: DriftSample[];
  ours: Partial<Record<DriftKind, DriftFigures>>;
  theirs: Partial<Record<DriftKind, DriftFigures>>;
  /** ours/theirs of the medians (null when a side has none). */
  ratios: Partial<Record<DriftKind, number | null>>;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The data value a ConfigMap holds, or undefined when it is gone. */
type Seen = { value?: string } | undefined;

/**
 * Lists and watches the ConfigMaps of one namespace and tells, by watch event, when one reaches
 * a state: waiters are checked synchronously on each event, in order, so a short-lived state
 * (the edited data before the revert) is not missed.
 */
class ConfigMapWatch {
  readonly #state = new Map<string, Seen>();
  readonly #waiters = new Set<{ name: string; pred: (s: Seen) => boolean; done: (at: number) => void }>();
  readonly #abort = new AbortController();
  #running: Promise<void> | undefined;

  constructor(
    private readonly kubeconfigPath: string,
    private readonly namespace: string,
  ) {}

  async start(): Promise<void> {
    const client = clientForKubeConfig(loadKubeConfig(this.kubeconfigPath));
    this.#running = (
      await listWatch(
        client,
        { apiVersion: 'v1', kind: 'ConfigMap' },
        this.namespace,
        {
          listed: (items) => {
            const listed = new Set(items.map((o) => o.metadata.name));
            for (const name of [...this.#state.keys()]) if (!listed.has(name)) this.#set(name, undefined);
            for (const o of items) this.#observe(o);
          },
          event: (type, o) => {
            if (type === 'ADDED' || type === 'MODIFIED') this.#observe(o);
            if (type === 'DELETED') this.#set(o.metadata.name, undefined);
          },
        },
        this.#abort.signal,
      )
    ).running;
  }

  #observe(o: KubeObject): void {
    const data = (o as { data?: Record<string, string> }).data;
    this.#set(o.metadata.name, { value: data?.value });
  }

  #set(name: string, s: Seen): void {
    this.#state.set(name, s);
    const now = performance.now();
    for (const w of [...this.#waiters]) {
      if (w.name === name && w.pred(s)) {
        this.#waiters.delete(w);
        w.done(now);
      }
    }
  }

  /**
   * Resolves with `performance.now()` of the first event (from now on, or the state now) for
   * which `pred` holds; undefined after `timeoutMs`. `pred` may keep state across calls.
   */
  until(name: string, pred: (s: Seen) => boolean, timeoutMs: number): Promise<number | undefined> {
    return new Promise((resolve) => {
      if (this.#state.has(name) && pred(this.#state.get(name))) {
        resolve(performance.now());
        return;
      }
      const w = {
        name,
        pred,
        done: (at: number) => {
          clearTimeout(t);
          resolve(at);
        },
      };
      const t = setTimeout(() => {
        this.#waiters.delete(w);
        resolve(undefined);
      }, timeoutMs);
      this.#waiters.add(w);
    });
  }

  async stop(): Promise<void> {
    this.#abort.abort();
    await this.#running?.catch(() => undefined);
  }
}

/** The App of one side: the benchmark's inline ytt App with a `valuesFrom` Secret. */
function driftApp(ns: string) {
  const app = inlineApp(ns, APP, 'default', SYNC_PERIOD);
  (app.spec as { template: unknown }).template = [{ ytt: { valuesFrom: [{ secretRef: { name: SECRET } }] } }];
  return app;
}

function valuesSecret(ns: string, value: string) {
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: { name: SECRET, namespace: ns },
    stringData: { 'values.yml': `value: ${JSON.stringify(value)}\n` },
  };
}

/**
 * Sends one write as `kubectl` would (merge patch or delete).
 * @throws Error with the API server's status and message when it refuses.
 */
async function write(rest: RestTransport, method: 'PATCH' | 'DELETE', path: string, body?: unknown): Promise<void> {
  const r = await rest.send({
    method,
    path,
    ...(body ? { body, contentType: 'application/merge-patch+json' } : {}),
  });
  if (r.statusCode >= 300) {
    const msg = (r.body as { message?: string } | undefined)?.message ?? String(r.body);
    throw new Error(`${method} ${path}: ${r.statusCode} ${msg}`);
  }
}

/** One side under test: its namespace, watch, and the value its App renders now. */
interface Side {
  impl: DriftSample['impl'];
  ns: string;
  watch: ConfigMapWatch;
  rendered: string;
  ours?: Ours;
}

/** Makes one hand change on `side` and times its result (see the module comment). */
async function sampleOne(
  rest: RestTransport,
  side: Side,
  kind: DriftKind,
  sample: number,
  first: boolean,
): Promise<DriftSample> {
  await sleep(Math.random() * 2_000);
  const tag = `${kind}-${sample}-${Date.now()}`;
  const cmPath = `${collectionPath('ConfigMap', side.ns)}/${CONFIG_MAP}`;
  let waiting: Promise<number | undefined>;
  let change: () => Promise<void>;
  if (kind === 'edit') {
    // the edited data first, then the rendered data again
    let edited = false;
    waiting = side.watch.until(
      CONFIG_MAP,
      (s) => {
        if (s?.value === tag) edited = true;
        return edited && s?.value === side.rendered;
      },
      WAIT_BOUND_MS,
    );
    change = () => write(rest, 'PATCH', cmPath, { data: { value: tag } });
  } else if (kind === 'delete') {
    let gone = false;
    waiting = side.watch.until(
      CONFIG_MAP,
      (s) => {
        if (s === undefined) gone = true;
        return gone && s?.value === side.rendered;
      },
      WAIT_BOUND_MS,
    );
    change = () => write(rest, 'DELETE', cmPath);
  } else {
    waiting = side.watch.until(CONFIG_MAP, (s) => s?.value === tag, WAIT_BOUND_MS);
    change = () =>
      write(rest, 'PATCH', `${collectionPath('Secret', side.ns)}/${SECRET}`, {
        stringData: valuesSecret(side.ns, tag).stringData,
      });
  }
  const sent0 = side.ours ? new Map([...side.ours.sent].map(([k, v]) => [k, v.length])) : undefined;
  const records0 = side.ours?.records.length ?? 0;
  const t0 = performance.now();
  await change();
  const at = await waiting;
  if (kind === 'secret' && at !== undefined) side.rendered = tag;
  const result: DriftSample = { kind, sample, impl: side.impl, first, ms: at === undefined ? null : at - t0 };
  if (side.ours && sent0) {
    await sleep(SETTLE_MS);
    const suffix = `/App/${side.ns}/${APP}`;
    result.events = [...side.ours.sent]
      .filter(([k]) => k.endsWith(suffix))
      .flatMap(([k, v]) => v.slice(sent0.get(k) ?? 0))
      .map((e) => ({ reason: e.reason, ...(e.cause ? { cause: e.cause } : {}) }));
    result.stageRuns = side.ours.records
      .slice(records0)
      .filter((r) => r.object.endsWith(suffix))
      .map((r) => `${r.stage}:${r.outcome}`);
  }
  return result;
}

function figures(runs: readonly DriftSample[]): DriftFigures {
  const within = runs.flatMap((r) => (r.ms === null ? [] : [Math.round(r.ms)]));
  const f: DriftFigures = { missed: runs.length - within.length };
  if (within.length) f.ms = summarize(within);
  if (runs.length && runs.every((r) => r.events)) {
    f.eventsPerSample = runs.reduce((a, r) => a + r.events!.length, 0) / runs.length;
    f.stageRunsPerSample = runs.reduce((a, r) => a + r.stageRuns!.length, 0) / runs.length;
    f.causes = [...new Set(runs.flatMap((r) => r.events!.flatMap((e) => (e.cause ? [e.cause] : []))))];
  }
  return f;
}

/** Creates a side's Secret and App and waits for its first `ReconcileSucceeded`. */
async function createAndSettle(ctx: BenchContext, ns: string, value: string): Promise<void> {
  const { cluster, rest } = clusterOf(ctx);
  const watch = new AppWatch(cluster.kubeconfigPath, ns);
  await watch.start();
  try {
    await createAll(rest, [valuesSecret(ns, value), driftApp(ns)]);
    const seen = await watch.waitAll([`${ns}/${APP}`], RECONCILE_BOUND_MS);
    const s = seen.get(`${ns}/${APP}`)!;
    if (s.final !== 'succeeded') throw new Error(`${ns}/${APP} failed: ${s.message ?? ''}`);
  } finally {
    await watch.stop();
  }
}

/**
 * Runs the scenario and adds its table rows.
 * @param bin - the kapp-controller binary, or undefined when its build failed (then only ours)
 * @param samples - samples per kind and side
 */
export async function driftScenario(
  ctx: BenchContext,
  bin: string | undefined,
  step: StepRunner,
  samples: number,
): Promise<DriftResult> {
  const result: DriftResult = {
    samples,
    syncPeriod: SYNC_PERIOD,
    concurrency: CONCURRENCY,
    waitBoundMs: WAIT_BOUND_MS,
    namespaces: NS,
    together: true,
    runs: [],
    ours: {},
    theirs: {},
    ratios: {},
  };
  const { cluster, rest } = clusterOf(ctx);
  let ours: Ours | undefined;
  let kc: KappController | undefined;
  const sides: Side[] = [];
  try {
    await step(SCENARIO, 'kapp-lambda: App reconciled', async () => {
      await createTenants(rest, [NS.ours]);
      ours = await startOursIn(ctx, NS.ours, 'drift', CONCURRENCY);
      await waitForwardersReady(ours);
      await createAndSettle(ctx, NS.ours, 'start');
      const watch = new ConfigMapWatch(cluster.kubeconfigPath, NS.ours);
      await watch.start();
      sides.push({ impl: 'kapp-lambda', ns: NS.ours, watch, rendered: 'start', ours });
    });
    if (bin) {
      await step(SCENARIO, 'kapp-controller: App reconciled', async () => {
        await createTenants(rest, [NS.theirs]);
        kc = await startKappController(bin, {
          kubeconfigPath: cluster.kubeconfigPath,
          namespace: NS.theirs,
          concurrency: CONCURRENCY,
          log: ctx.say,
        });
        result.kappControllerVersion = kc.version;
        await createAndSettle(ctx, NS.theirs, 'start');
        const watch = new ConfigMapWatch(cluster.kubeconfigPath, NS.theirs);
        await watch.start();
        sides.push({ impl: 'kapp-controller', ns: NS.theirs, watch, rendered: 'start' });
      });
    }
    if (!sides.length) return result;
    for (const [k, kind] of DRIFT_KINDS.entries()) {
      await step(SCENARIO, KIND_TEXT[kind], async () => {
        for (let i = 0; i < samples; i++) {
          // alternate the first side from sample to sample (and kind to kind)
          const order = (i + k) % 2 ? [...sides].reverse() : sides;
          for (const [j, side] of order.entries()) {
            const r = await sampleOne(rest, side, kind, i, j === 0);
            result.runs.push(r);
            ctx.say(`drift ${kind} #${i} ${side.impl}: ${r.ms === null ? 'not within bound' : fmtMs(r.ms)}`);
          }
        }
      });
    }
  } finally {
    for (const s of sides) await s.watch.stop();
    await (ours as Ours | undefined)?.stop();
    await (kc as KappController | undefined)?.stop();
  }

  for (const kind of DRIFT_KINDS) {
    const mine = result.runs.filter((r) => r.kind === kind);
    const o = mine.filter((r) => r.impl === 'kapp-lambda');
    const t = mine.filter((r) => r.impl === 'kapp-controller');
    if (o.length) result.ours[kind] = figures(o);
    if (t.length) result.theirs[kind] = figures(t);
    const om = result.ours[kind]?.ms?.median;
    const tm = result.theirs[kind]?.ms?.median;
    result.ratios[kind] = om !== undefined && tm ? Math.round((om / tm) * 1000) / 1000 : null;
  }
  addRows(ctx, result);
  return result;
}

function addRows(ctx: BenchContext, r: DriftResult): void {
  const bound = `not within ${r.waitBoundMs / 1000} s`;
  const value = (f: DriftFigures | undefined) =>
    !f ? '–' : `${f.ms ? fmtSummaryMs(f.ms) : bound}${f.ms && f.missed ? `; ${f.missed} ${bound}` : ''}`;
  for (const kind of DRIFT_KINDS) {
    const o = r.ours[kind];
    const t = r.theirs[kind];
    if (o) {
      const targeted = kind !== 'secret';
      const met = o.missed === 0 && o.ms !== undefined && o.ms.median < DRIFT_TARGET_MS;
      ctx.rows.push(
        {
          scenario: SCENARIO,
          figure: `${KIND_TEXT[kind]}, kapp-lambda`,
          value: `${value(o)}${r.ratios[kind] != null ? `; ours/theirs ${r.ratios[kind]!.toFixed(3)}` : ''}`,
          ...(targeted ? { target: `< ${DRIFT_TARGET_MS / 1000} s`, verdict: met ? 'met' : 'missed' } : {}),
        },
        {
          scenario: SCENARIO,
          figure: '  kapp-lambda: forwarder events; stage runs (per sample); causes',
          value: `${o.eventsPerSample ?? 0}; ${o.stageRunsPerSample ?? 0}; ${o.causes?.length ? o.causes.map((c) => c.replace(/@\d+$/, '@…')).join(' | ') : 'none given'}`,
        },
      );
    }
    if (t) {
      ctx.rows.push({
        scenario: SCENARIO,
        figure: `  kapp-controller ${r.kappControllerVersion ?? ''}`.trimEnd(),
        value: value(t),
      });
    }
  }
}
