/**
 * The embedded runtime's adapter of the reconcile metrics port (`./metrics.ts`): upstream's
 * series in a prom-client registry, served on `/metrics`. Apart from `./metrics.ts` so the
 * Lambda functions, which write CloudWatch EMF lines instead, do not bundle prom-client.
 *
 * @module
 */
import { Counter, Gauge, Registry } from 'prom-client';
import {
  COUNT_METRICS,
  HEALTH_METRIC,
  type MetricTarget,
  type ReconcileCount,
  type ReconcileMetrics,
  type ReconcilePhase,
  TIME_METRICS,
} from './metrics.js';

const HEALTH_STATUS_VALUES = ['True', 'False', 'Unknown'] as const;

/** Options of {@link PrometheusReconcileMetrics}. */
export interface PrometheusMetricsOptions {
  /** Registry the series join. Default a new one. */
  registry?: Registry;
  /**
   * Add a `cluster` label (the cluster id) to every series: for a runtime serving several
   * clusters, whose objects may share namespace and name. Default false (upstream's labels).
   */
  clusterLabel?: boolean;
}

/** The embedded runtime's adapter: upstream's series in a prom-client {@link Registry}. */
export class PrometheusReconcileMetrics implements ReconcileMetrics {
  /** The registry holding the series (serve it with `registry.metrics()`). */
  readonly registry: Registry;
  readonly #clusterLabel: boolean;
  readonly #counters: Record<ReconcileCount, Counter>;
  readonly #gauges: Record<ReconcilePhase, Gauge>;
  /** Made at the first {@link health} call, so the registry shows upstream's series alone until then. */
  #health: Gauge | undefined;
  readonly #healthLabels: string[];

  /** See {@link PrometheusMetricsOptions}. */
  constructor(options: PrometheusMetricsOptions = {}) {
    this.registry = options.registry ?? new Registry();
    this.#clusterLabel = options.clusterLabel ?? false;
    const base = this.#clusterLabel
      ? ['cluster', 'controller', 'name', 'namespace']
      : ['controller', 'name', 'namespace'];
    const registers = [this.registry];
    const counter = (m: { name: string; help: string }) =>
      new Counter({ name: m.name, help: m.help, labelNames: base, registers });
    const gauge = (m: { name: string; help: string }) =>
      new Gauge({ name: m.name, help: m.help, labelNames: [...base, 'firstReconcile'], registers });
    this.#counters = {
      attempt: counter(COUNT_METRICS.attempt),
      success: counter(COUNT_METRICS.success),
      failure: counter(COUNT_METRICS.failure),
      deleteAttempt: counter(COUNT_METRICS.deleteAttempt),
      deleteFailed: counter(COUNT_METRICS.deleteFailed),
    };
    this.#gauges = {
      overall: gauge(TIME_METRICS.overall),
      fetch: gauge(TIME_METRICS.fetch),
      template: gauge(TIME_METRICS.template),
      deploy: gauge(TIME_METRICS.deploy),
    };
    this.#healthLabels = [...base, 'status'];
  }

  #labels(t: MetricTarget): Record<string, string> {
    const l = { controller: t.controller, name: t.name, namespace: t.namespace };
    return this.#clusterLabel ? { cluster: t.clusterId, ...l } : l;
  }

  /** {@inheritDoc ReconcileMetrics.init} */
  init(target: MetricTarget): void {
    for (const c of Object.values(this.#counters)) c.inc(this.#labels(target), 0);
  }

  /** {@inheritDoc ReconcileMetrics.count} */
  count(target: MetricTarget, which: ReconcileCount): void {
    this.#counters[which].inc(this.#labels(target));
  }

  /** {@inheritDoc ReconcileMetrics.forget} */
  forget(target: MetricTarget): void {
    for (const c of Object.values(this.#counters)) c.remove(this.#labels(target));
    for (const status of HEALTH_STATUS_VALUES) this.#health?.remove({ ...this.#labels(target), status });
  }

  /** {@inheritDoc ReconcileMetrics.health} */
  health(target: MetricTarget, status: 'True' | 'False' | 'Unknown'): void {
    this.#health ??= new Gauge({ ...HEALTH_METRIC, labelNames: this.#healthLabels, registers: [this.registry] });
    for (const s of HEALTH_STATUS_VALUES)
      this.#health.set({ ...this.#labels(target), status: s }, s === status ? 1 : 0);
  }

  /** {@inheritDoc ReconcileMetrics.time} */
  time(target: MetricTarget, phase: ReconcilePhase, firstReconcile: boolean, seconds: number): void {
    this.#gauges[phase].set({ ...this.#labels(target), firstReconcile: String(firstReconcile) }, seconds);
  }
}
