/**
 * kapp-lambda under benchmark: the embedded runtime (`startEmbedded`) with a logger that keeps
 * every stage-run record with the moment it was logged, and a cluster registry whose REST
 * transport counts the pipeline's API requests (the forwarder's list/watch go through the
 * runtime's own registry and are not counted).
 *
 * @module
 */

import path from 'node:path';
import {
  EMBEDDED_KINDS,
  type EmbeddedOptions,
  type EmbeddedRuntime,
  startEmbedded,
} from '../../functions/embedded/runtime.js';
import type { ToolStats } from '../../functions/lib/exec/metrics.js';
import type { RunRequest } from '../../functions/lib/exec/runner.js';
import { apiServerInfoOf, KubeApiClient } from '../../functions/lib/kube/index.js';
import type { KubeClient } from '../../functions/lib/kube/port.js';
import { MapClusterRegistry } from '../../functions/lib/kube/registry.js';
import {
  ClientNodeRestTransport,
  ClientNodeWatchTransport,
  type RestRequest,
  type RestTransport,
} from '../../functions/lib/kube/transport.js';
import type { Logger, StageRunRecord } from '../../functions/lib/log.js';
import { SOURCE_POLL_PREFIX } from '../../functions/lib/pipeline/source-poll.js';
import type { ObjectStore } from '../../functions/lib/store/port.js';
import { type BenchContext, clusterOf, scratchDir } from './context.js';
import { loadKubeConfig } from './kube.js';

/** A stage-run record plus when it was logged (`performance.now()`, ms). */
export interface TimedRecord extends StageRunRecord {
  at: number;
}

/**
 * With `BENCH_TRACE=1`: one stderr line per pipeline API request (`TRACE api <method> <path>`),
 * store call (`TRACE store <method> <key>`) and stage-run record (`TRACE stage <stage> <outcome>`),
 * in order, to see where a run's requests go (the latency scenario marks each run: `TRACE run`).
 */
export const trace: ((line: string) => void) | undefined = process.env.BENCH_TRACE
  ? (line) => process.stderr.write(`TRACE ${line}\n`)
  : undefined;

/** Counts of API requests by method, `all` in total, and `ms`: their summed wall time. */
export type ApiCounts = Record<string, number>;

/** A REST transport that counts requests by method (and in total under `all`) and sums their time under `ms`. */
export function countingTransport(inner: RestTransport, counts: ApiCounts): RestTransport {
  return {
    async send(request: RestRequest) {
      counts[request.method] = (counts[request.method] ?? 0) + 1;
      trace?.(`api ${request.method} ${request.path}`);
      counts.all = (counts.all ?? 0) + 1;
      const t0 = performance.now();
      try {
        return await inner.send(request);
      } finally {
        counts.ms = (counts.ms ?? 0) + (performance.now() - t0);
      }
    },
  };
}

/** Calls and summed wall time of object-store operations. */
export interface StoreTiming {
  calls: number;
  ms: number;
}

/**
 * Wraps every method of an object store to count calls and sum their time; `onCall`, when
 * given, also gets each call's method, first argument (the key) and start/end times (ms,
 * `performance.now()`), for a timeline.
 */
export function timedStore(
  inner: ObjectStore,
  timing: StoreTiming,
  onCall?: (method: string, key: unknown, t0: number, t1: number) => void,
): ObjectStore {
  return new Proxy(inner, {
    get(target, prop, receiver) {
      const v = Reflect.get(target, prop, receiver) as unknown;
      if (typeof v !== 'function') return v;
      return async (...args: unknown[]) => {
        const t0 = performance.now();
        timing.calls++;
        trace?.(`store ${String(prop)} ${String(args[0])}`);
        try {
          return await (v as (...a: unknown[]) => Promise<unknown>).apply(target, args);
        } finally {
          const t1 = performance.now();
          timing.ms += t1 - t0;
          onCall?.(String(prop), args[0], t0, t1);
        }
      };
    },
  });
}

/**
 * The pipeline's cluster registry for `ids` (kubeconfig contexts), each client's REST transport
 * wrapped by `wrap` (to count or time the pipeline's API requests; watches are not wrapped).
 */
export function wrappedRegistry(
  kubeconfigPath: string,
  ids: readonly string[],
  wrap: (rest: RestTransport) => RestTransport,
): MapClusterRegistry {
  const clients = new Map<string, KubeClient>();
  for (const id of ids) {
    const kc = loadKubeConfig(kubeconfigPath, id);
    clients.set(
      id,
      new KubeApiClient({
        rest: wrap(kc.makeApiClient(ClientNodeRestTransport)),
        watch: new ClientNodeWatchTransport(kc),
        apiServer: apiServerInfoOf(kc),
      }),
    );
  }
  return new MapClusterRegistry(clients);
}

/** Options of {@link startOurs}. */
export interface OursOptions
  extends Pick<
    EmbeddedOptions,
    'contexts' | 'namespaces' | 'store' | 'storeDir' | 'tmpRoot' | 'cacheRoot' | 'concurrency' | 'config'
  > {
  /** Kubeconfig whose contexts are the clusters served (the bench never runs in-cluster). */
  kubeconfigPath: string;
  /** Warnings and errors go here (one line each); stage records are kept, not printed. */
  say?: (line: string) => void;
  /** Called with each tool run's request before it starts (to tell a repository's runs from an App's). */
  onToolRun?: (req: RunRequest) => void;
}

/** A running instrumented embedded runtime. */
export interface Ours {
  runtime: EmbeddedRuntime;
  /** Every stage-run record so far. */
  records: TimedRecord[];
  /** Pipeline API requests so far (by method, `all` in total, `ms` their summed time). */
  api: ApiCounts;
  /** Object-store calls of the pipeline so far. */
  store: StoreTiming;
  /** Info-level log messages other than stage records (message and when), e.g. the source poll's. */
  logs: { at: number; msg: string }[];
  /**
   * The source poll timer's summaries (its debug `source poll` line, logged when a poll or check
   * resolved or poked anything): when, sources resolved (`polled`, one git or registry request
   * each) and members poked.
   */
  polls: SourcePolls;
  /**
   * `performance.now()` of each conditional write of a source poll record
   * (`cache/source-poll/…`): a poll's claim before it resolves (one git or registry request), a
   * run joining as a member, or a moved digest written.
   */
  pollRecordWrites: number[];
  /**
   * `performance.now()` of each event the forwarders handed to the pipeline, by object key, in
   * order, with its reason and, when the forwarder gave one, its cause (`drift: ...`, `Secret/<name>@<rv>`).
   */
  sent: Map<string, { at: number; reason: string; cause?: string }[]>;
  /** Tool metrics snapshot. */
  tools(): Record<string, ToolStats>;
  stop(): Promise<void>;
}

/** {@link Ours.polls}. */
export type SourcePolls = { at: number; polled: number; poked: number }[];

/** A logger (the core's port) that keeps stage-run records and poll summaries and prints warnings/errors. */
function benchLogger(
  records: TimedRecord[],
  logs: { at: number; msg: string }[],
  polls: SourcePolls,
  say: (line: string) => void,
  bindings: Record<string, unknown> = {},
): Logger {
  const at =
    (level: string) =>
    (obj: Record<string, unknown>, msg?: string): void => {
      if (msg === 'stage run') {
        trace?.(`stage ${String(obj.stage)} ${String(obj.outcome)}`);
        records.push({ ...(obj as unknown as StageRunRecord), at: performance.now() });
        return;
      }
      if (level === 'info' && msg) logs.push({ at: performance.now(), msg });
      if (level === 'warn' || level === 'error') {
        const o = { ...bindings, ...obj };
        say(`[ours ${level}] ${msg ?? ''} ${JSON.stringify(o).slice(0, 400)}`);
      }
    };
  return {
    info: at('info'),
    warn: at('warn'),
    error: at('error'),
    debug: (obj: Record<string, unknown>, msg?: string) => {
      if (msg !== 'source poll') return;
      polls.push({ at: performance.now(), polled: Number(obj.polled ?? 0), poked: Number(obj.poked ?? 0) });
    },
    child: (b) => benchLogger(records, logs, polls, say, { ...bindings, ...b }),
  };
}

/**
 * Starts the embedded runtime, instrumented.
 * @throws Error when the kubeconfig cannot be loaded.
 */
export function startOurs(opts: OursOptions): Ours {
  const records: TimedRecord[] = [];
  const api: ApiCounts = {};
  const store: StoreTiming = { calls: 0, ms: 0 };
  const logs: { at: number; msg: string }[] = [];
  const polls: SourcePolls = [];
  const pollRecordWrites: number[] = [];
  const onStoreCall = (method: string, key: unknown, t0: number) => {
    if (method === 'putIfMatch' && typeof key === 'string' && key.startsWith(SOURCE_POLL_PREFIX)) {
      pollRecordWrites.push(t0);
    }
  };
  const sent = new Map<string, { at: number; reason: string; cause?: string }[]>();
  const say = opts.say ?? (() => {});
  const runtime = startEmbedded({
    ...opts,
    log: benchLogger(records, logs, polls, say),
    wrapDeps: (deps) => {
      const clusters = wrappedRegistry(opts.kubeconfigPath, deps.clusters.clusterIds(), (t) =>
        countingTransport(t, api),
      );
      const { onToolRun } = opts;
      const runner = onToolRun
        ? {
            run: (req: RunRequest) => {
              onToolRun(req);
              return deps.runner.run(req);
            },
          }
        : deps.runner;
      // the deploy stage's reads as the App (the no-op resync's lists) count with the pipeline's
      const { appReader } = deps;
      const counted = appReader ? { appReader: (yaml: string) => countingTransport(appReader(yaml), api) } : {};
      return { ...deps, ...counted, runner, clusters, store: timedStore(deps.store, store, onStoreCall) };
    },
  });
  // Note when each event reaches the pipeline (the forwarder calls `send` on this object).
  const pipeline = runtime.pipeline;
  const send = pipeline.send.bind(pipeline);
  pipeline.send = async (events) => {
    const now = performance.now();
    for (const e of events) {
      const d = (
        e as { data?: { clusterId?: string; namespace?: string; name?: string; reason?: string; cause?: string } }
      ).data;
      if (!d?.name) continue;
      const key = `${d.clusterId}/App/${d.namespace}/${d.name}`;
      const list = sent.get(key) ?? [];
      list.push({ at: now, reason: d.reason ?? e.type, ...(d.cause ? { cause: d.cause } : {}) });
      sent.set(key, list);
    }
    return await send(events);
  };
  return {
    runtime,
    records,
    api,
    store,
    logs,
    polls,
    pollRecordWrites,
    sent,
    tools: () => runtime.toolMetrics.snapshot(),
    stop: () => runtime.stop(),
  };
}

/**
 * Starts the instrumented runtime on cluster A for one namespace, with its store and tool
 * scratch in the run's scratch directory `scratch`: what the single-cluster scenarios run.
 */
export async function startOursIn(ctx: BenchContext, ns: string, scratch: string, concurrency = 4): Promise<Ours> {
  const { cluster } = clusterOf(ctx);
  const dir = await scratchDir(ctx, scratch);
  return startOurs({
    kubeconfigPath: cluster.kubeconfigPath,
    namespaces: [ns],
    storeDir: path.join(dir, 'store'),
    tmpRoot: path.join(dir, 'work'),
    cacheRoot: ctx.cacheRoot,
    concurrency,
    say: ctx.say,
  });
}

/** Per-tool difference `after − before` (count and milliseconds), tools with no runs left out. */
export function toolDelta(
  before: Record<string, ToolStats>,
  after: Record<string, ToolStats>,
): Record<string, { runs: number; ms: number }> {
  const out: Record<string, { runs: number; ms: number }> = {};
  for (const [tool, a] of Object.entries(after)) {
    const b = before[tool];
    const runs = a.count - (b?.count ?? 0);
    const ms = a.totalMs - (b?.totalMs ?? 0);
    if (runs > 0) out[tool] = { runs, ms };
  }
  return out;
}

/**
 * Whether a stage record ends an App's pipeline run: its deploy stage (deployed, or `cached` on
 * a no-op resync), or an earlier stage that ended the run as a `noop`.
 */
export function endsRun(r: StageRunRecord): boolean {
  return r.stage === 'deploy' || r.outcome === 'noop';
}

/** Object key of an App in stage records: `cluster/App/namespace/name`. */
export function appKey(clusterId: string, ns: string, name: string): string {
  return `${clusterId}/App/${ns}/${name}`;
}

/** Reflectors of a default embedded forwarder: its kinds plus the Secrets and ConfigMaps they reference. */
const REFLECTORS = EMBEDDED_KINDS.length + 2;

/**
 * Waits until every forwarder of the runtime has listed and opened its watches (so the time
 * an App takes from creation includes no forwarder start-up).
 * @throws Error after `timeoutMs`.
 */
export async function waitForwardersReady(ours: Ours, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    // One forwarder per cluster once this runtime leads every cluster's Lease.
    const all = ours.runtime.forwarders.length === ours.runtime.registry.clusterIds().length;
    const ok =
      all &&
      ours.runtime.forwarders.every((f) => {
        const s = f.stats();
        // one reflector per watched kind (App, PackageRepository), plus Secret and ConfigMap:
        // each has listed and started watching
        return s.lists >= REFLECTORS && s.watches >= REFLECTORS;
      });
    if (ok) break;
    if (Date.now() > deadline) throw new Error('forwarders did not start watching in time');
    await new Promise((r) => setTimeout(r, 50));
  }
  await new Promise((r) => setTimeout(r, 200));
}
