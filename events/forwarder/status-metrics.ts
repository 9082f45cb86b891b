/**
 * kapp-controller's per-object reconcile series (`kappctrl_*`, reference §3.14) in the cloud
 * mode, where the reconciles run in Lambda functions that write CloudWatch EMF lines: the
 * forwarder, which watches every App, PackageInstall and PackageRepository with its status
 * anyway, derives the same counters and times from the status changes and serves them on its
 * `/metrics`. They go through the reconcile metrics port (`functions/lib/observe/metrics.ts`,
 * which names them) into `reconcile-series.ts`, whose text is the embedded runtime's
 * (`PrometheusReconcileMetrics`) for the same calls, so names, types, help texts and labels
 * (`controller` `app|pkgi|pkgr`, `name`, `namespace`; `firstReconcile` on the times) cannot
 * drift apart (`test/unit/forwarder-status-metrics.test.ts` compares both).
 *
 * What a status change counts (each reconcile writes `Reconciling` at its start and
 * `consecutiveReconcileSuccesses`/`Failures` at its end, `pkg/app/app_reconcile.go`):
 *
 * - first sight of an object: its counters at 0 (upstream `InitMetrics`); a run or delete in
 *   flight then (`Reconciling`/`Deleting`) counts its attempt (the forwarder asks for it again);
 * - condition `Reconciling` appearing: attempt + 1;
 * - `consecutiveReconcileSuccesses` growing (or restarting after failures): success + n, and the
 *   attempts of runs whose start was not seen; `consecutiveReconcileFailures` growing under
 *   `ReconcileFailed`: failure + n, alike; under `DeleteFailed`: delete failed + n;
 * - a run's end also sets the times from its stage times (`status.fetch.startedAt` …
 *   `status.deploy.updatedAt`; whole seconds, as the API stores them), labelled `firstReconcile`
 *   when no earlier status showed an outcome;
 * - condition `Deleting` appearing: delete attempt + 1;
 * - the object gone (deleted, or missing from a relist): every series of it is removed.
 *
 * A PackageInstall counts attempts only, as upstream (its status has no counters or times).
 *
 * Differences from the embedded runtime's counts: a reconcile that changed nothing and so wrote
 * no status (reconcile by exception, `sync-mode: exception`) is invisible here, while the
 * embedded runtime counts its attempt and success; with `sync-mode: periodic` every run writes
 * and the counts agree. Counters start at 0 when a replica starts leading (as upstream's do when
 * its pod restarts); a standby replica serves none.
 *
 * @module
 */
import type { KubeObject } from '../../functions/lib/kube/port.js';
import {
  CONTROLLER_TYPE,
  type MetricTarget,
  type ReconcileMetrics,
  type ReconcilePhase,
} from '../../functions/lib/observe/metrics.js';
import { isFirstReconcile, type ReconcileCounts } from '../../functions/lib/observe/reconcile.js';
import type { Kind } from '../schema.js';

/** Where the derived series go: the reconcile metrics port plus removal of whole objects. */
export interface StatusMetricsSink extends ReconcileMetrics {
  /**
   * Removes every series of the object, its times included: upstream's `DeleteMetrics` drops
   * the counters only, but here the memory must follow the live objects.
   */
  drop(target: MetricTarget): void;
  /** Removes every series (a leadership term ended). */
  clear(): void;
}

/** What the forwarder tells about watched objects ({@link ForwarderOptions.statusObserver}). */
export interface StatusObserver {
  /** An object as first seen or at a new resourceVersion. Must not throw. */
  seen(kind: Kind, obj: KubeObject): void;
  /** The object is gone (deleted, missing from a relist, or replaced by a new uid). Must not throw. */
  gone(kind: Kind, namespace: string, name: string): void;
}

/** Default {@link StatusMetricsOptions.maxObjects}. */
export const DEFAULT_STATUS_METRICS_MAX_OBJECTS = 50_000;

/** Options of {@link StatusMetrics}. */
export interface StatusMetricsOptions {
  /** The cluster id (a `cluster` label only when the sink adds one). */
  clusterId: string;
  /**
   * Most objects with series (each App has 9 to 13: 5 counters, 4 times, one or two
   * `firstReconcile` values each). Objects seen beyond it get none until others go, and are
   * counted in {@link StatusMetrics.skipped}. Default {@link DEFAULT_STATUS_METRICS_MAX_OBJECTS}.
   */
  maxObjects?: number;
}

/** The last status seen of an object, reduced to what the next change is compared with. */
interface Seen {
  successes: number;
  failures: number;
  /** The condition type (at most one, reference §0), `''` when none. */
  condition: string;
  /** A start was counted whose outcome has not been seen yet. */
  running: boolean;
  /** Some status showed an outcome: later runs are not the first (`firstReconcile="false"`). */
  done: boolean;
}

interface StageTimes {
  startedAt?: string;
  updatedAt?: string;
}

interface ObservedStatus extends ReconcileCounts {
  fetch?: StageTimes;
  template?: StageTimes;
  deploy?: StageTimes;
}

/** Whole seconds since the epoch of an RFC 3339 time, NaN when absent or unreadable. */
function seconds(t: string | undefined): number {
  return t === undefined ? Number.NaN : Date.parse(t) / 1000;
}

/**
 * Most runs one observed status change counts. Watches coalesce a few writes at most; tenants who
 * may write `apps/status` can set a counter to 2^53: counted run by run, that would hold the
 * forwarder's event loop (and every tenant's events) for good.
 */
export const MAX_RUNS_PER_CHANGE = 10;

/** A status counter as counted: a non-negative safe integer, else 0 (written by someone else). */
function counter(v: unknown): number {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 ? v : 0;
}

/**
 * How many completions moved a consecutive counter from `before` to `after` (`other`: the
 * opposite counter before), at most {@link MAX_RUNS_PER_CHANGE}.
 */
function completions(before: number, after: number, other: number): number {
  const n = other > 0 || after < before ? after : after - before; // a restarted streak counts from 0
  return Math.min(n, MAX_RUNS_PER_CHANGE);
}

/**
 * Derives upstream's per-object reconcile series from watched status changes (module comment)
 * into a {@link StatusMetricsSink}. Holds one small record per object; never throws.
 */
export class StatusMetrics implements StatusObserver {
  readonly #sink: StatusMetricsSink;
  readonly #clusterId: string;
  readonly #max: number;
  readonly #seen = new Map<string, Seen>();
  #skipped = new Set<string>();

  /** @param sink - The program's `ReconcileSeries` (tests may pass another). */
  constructor(sink: StatusMetricsSink, options: StatusMetricsOptions) {
    this.#sink = sink;
    this.#clusterId = options.clusterId;
    this.#max = options.maxObjects ?? DEFAULT_STATUS_METRICS_MAX_OBJECTS;
  }

  /** Objects with series. */
  get objects(): number {
    return this.#seen.size;
  }

  /** Objects seen without series because {@link StatusMetricsOptions.maxObjects} was reached. */
  get skipped(): number {
    return this.#skipped.size;
  }

  /** Forgets every object and removes every series (a leadership term ended). */
  reset(): void {
    this.#seen.clear();
    this.#skipped = new Set();
    this.#sink.clear();
  }

  #target(kind: Kind, namespace: string, name: string): MetricTarget {
    return { clusterId: this.#clusterId, controller: CONTROLLER_TYPE[kind], namespace, name };
  }

  /** {@inheritDoc StatusObserver.gone} */
  gone(kind: Kind, namespace: string, name: string): void {
    const key = `${kind}/${namespace}/${name}`;
    this.#skipped.delete(key);
    if (!this.#seen.delete(key)) return;
    this.#sink.drop(this.#target(kind, namespace, name));
  }

  /** {@inheritDoc StatusObserver.seen} */
  seen(kind: Kind, obj: KubeObject): void {
    const namespace = obj.metadata.namespace ?? '';
    const key = `${kind}/${namespace}/${obj.metadata.name}`;
    const target = this.#target(kind, namespace, obj.metadata.name);
    const status = (obj as { status?: ObservedStatus }).status ?? {};
    const next: Seen = {
      successes: counter(status.consecutiveReconcileSuccesses),
      failures: counter(status.consecutiveReconcileFailures),
      condition: status.conditions?.[0]?.type ?? '',
      running: false,
      done: !isFirstReconcile(status),
    };
    const prev = this.#seen.get(key);
    if (!prev) {
      if (this.#seen.size >= this.#max) {
        this.#skipped.add(key);
        return;
      }
      this.#skipped.delete(key);
      this.#seen.set(key, next);
      this.#sink.init(target);
      if (next.condition === 'Reconciling') {
        this.#sink.count(target, 'attempt');
        next.running = true;
      } else if (next.condition === 'Deleting') this.#sink.count(target, 'deleteAttempt');
      return;
    }
    this.#seen.set(key, next);
    next.done = next.done || prev.done;
    next.running = prev.running;
    if (next.condition === 'Deleting') {
      if (prev.condition !== 'Deleting') this.#sink.count(target, 'deleteAttempt');
      return;
    }
    if (kind === 'PackageInstall') {
      // Upstream counts a PackageInstall's attempts only (its App's outcome is the App's).
      if (next.condition === 'Reconciling' && prev.condition !== 'Reconciling') this.#sink.count(target, 'attempt');
      return;
    }
    const succeeded = completions(prev.successes, next.successes, prev.failures);
    const failed = next.successes > 0 ? 0 : completions(prev.failures, next.failures, prev.successes);
    if (next.condition === 'DeleteFailed') {
      if (failed === 0) return;
      // A delete's start not seen (its Deleting status coalesced away) still counts.
      const unseen = failed - (prev.condition === 'Deleting' ? 1 : 0);
      for (let i = 0; i < unseen; i++) this.#sink.count(target, 'deleteAttempt');
      for (let i = 0; i < failed; i++) this.#sink.count(target, 'deleteFailed');
      return;
    }
    const runs = succeeded + failed;
    if (runs === 0) {
      if (next.condition === 'Reconciling' && !prev.running) {
        this.#sink.count(target, 'attempt');
        next.running = true;
      }
      return;
    }
    for (let i = prev.running ? 1 : 0; i < runs; i++) this.#sink.count(target, 'attempt');
    for (let i = 0; i < succeeded; i++) this.#sink.count(target, 'success');
    for (let i = 0; i < failed; i++) this.#sink.count(target, 'failure');
    next.running = false;
    this.#times(target, status, !prev.done);
  }

  /** The last run's times from its stage times; a stage older than the run's fetch is an earlier run's. */
  #times(target: MetricTarget, status: ObservedStatus, first: boolean): void {
    const start = seconds(status.fetch?.startedAt);
    if (Number.isNaN(start)) return;
    const set = (phase: ReconcilePhase, from: number, to: number) => {
      if (from >= start && to >= from) this.#sink.time(target, phase, first, to - from);
    };
    const fetched = seconds(status.fetch?.updatedAt);
    const templated = seconds(status.template?.updatedAt);
    const deployStart = seconds(status.deploy?.startedAt);
    const deployed = seconds(status.deploy?.updatedAt);
    set('fetch', start, fetched);
    set('template', fetched, templated);
    set('deploy', deployStart, deployed);
    const ends = [fetched, templated, deployed].filter((t) => t >= start);
    if (ends.length > 0) set('overall', start, Math.max(...ends));
  }
}
