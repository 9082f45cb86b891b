/**
 * kapp-controller's reconcile metrics (`pkg/metrics/reconcile_count_metrics.go`,
 * `reconcile_time_metrics.go`; reference §3.14), recorded through one port,
 * {@link ReconcileMetrics}, with two adapters:
 *
 * - `PrometheusReconcileMetrics` (`./prometheus.ts`, the embedded runtime's `/metrics`): the same
 *   series, names, help texts and labels as upstream, through prom-client (a module of its own,
 *   so the Lambda functions do not bundle prom-client);
 * - {@link EmfReconcileMetrics} (the Lambda functions): one CloudWatch embedded-metric-format
 *   line per observation in the function's log, with a `clusterId` dimension, which CloudWatch
 *   turns into metrics without an API call.
 *
 * In the cloud mode the forwarder serves the per-object series too, derived from the status
 * changes it watches, through this port into a compact store of its own whose text is
 * prom-client's (`events/forwarder/status-metrics.ts`, `reconcile-series.ts`).
 *
 * Counters (labels `controller`, `name`, `namespace`): `kappctrl_app_reconcile_attempt_total`,
 * `..._success_total`, `..._failure_total`, `..._delete_attempt_total`, `..._delete_failed_total`.
 * Gauges in seconds (labels `controller`, `name`, `namespace`, `firstReconcile`):
 * `kappctrl_reconcile_time_seconds` and its `fetch`, `template` and `deploy` parts. `controller`
 * is upstream's resource type: `app`, `pkgi` or `pkgr`, not the kind (`App`, …). kapp-controller
 * v0.53.1 passes its constants `appResourceType`, `packageInstallType` and `pkgrResourceType`
 * (PR #1415, which added the label; its `/metrics` output reads `controller="app"` and
 * `controller="pkgr"`), so dashboards built on kapp-controller select these values.
 * `test/unit/observe.test.ts` holds the names, types, label names and values.
 *
 * @module
 */
/** Upstream's `controller` label value: the kind of object reconciled. */
export type ControllerType = 'app' | 'pkgi' | 'pkgr';

/** The `controller` label of each kind (upstream `appResourceType`, `packageInstallType`, `pkgrResourceType`). */
export const CONTROLLER_TYPE: Readonly<Record<'App' | 'PackageInstall' | 'PackageRepository', ControllerType>> =
  Object.freeze({ App: 'app', PackageInstall: 'pkgi', PackageRepository: 'pkgr' });

/** The object a metric is about. */
export interface MetricTarget {
  /** The cluster (a dimension in CloudWatch; a `cluster` label only when a registry serves several). */
  clusterId: string;
  controller: ControllerType;
  namespace: string;
  name: string;
}

/** The five counters (upstream `ReconcileCountMetrics`). */
export type ReconcileCount = 'attempt' | 'success' | 'failure' | 'deleteAttempt' | 'deleteFailed';

/** The four gauges (upstream `ReconcileTimeMetrics`): the whole run and each of its phases. */
export type ReconcilePhase = 'overall' | 'fetch' | 'template' | 'deploy';

/** Series name of each counter. */
export const COUNT_METRICS: Readonly<Record<ReconcileCount, { name: string; help: string }>> = Object.freeze({
  attempt: { name: 'kappctrl_app_reconcile_attempt_total', help: 'Total number of attempted reconciles' },
  success: { name: 'kappctrl_app_reconcile_success_total', help: 'Total number of succeeded reconciles' },
  failure: { name: 'kappctrl_app_reconcile_failure_total', help: 'Total number of failed reconciles' },
  deleteAttempt: {
    name: 'kappctrl_app_reconcile_delete_attempt_total',
    help: 'Total number of attempted reconcile deletion',
  },
  deleteFailed: {
    name: 'kappctrl_app_reconcile_delete_failed_total',
    help: 'Total number of failed reconcile deletion',
  },
});

/** Series name of each gauge. */
export const TIME_METRICS: Readonly<Record<ReconcilePhase, { name: string; help: string }>> = Object.freeze({
  overall: { name: 'kappctrl_reconcile_time_seconds', help: 'Overall time taken to reconcile a CR' },
  fetch: { name: 'kappctrl_reconcile_fetch_time_seconds', help: 'Time taken to perform a fetch for a CR' },
  template: { name: 'kappctrl_reconcile_template_time_seconds', help: 'Time taken to perform a templating for a CR' },
  deploy: { name: 'kappctrl_reconcile_deploy_time_seconds', help: 'Time taken to perform a deploy for a CR' },
});

/**
 * Where the pipeline records reconcile metrics. Implementations never throw: a metric must not
 * fail a reconcile.
 */
export interface ReconcileMetrics {
  /** Upstream `InitMetrics`: each counter of the object appears at 0 (every reconcile call). */
  init(target: MetricTarget): void;
  /** Adds one to a counter. */
  count(target: MetricTarget, which: ReconcileCount): void;
  /** Upstream `DeleteMetrics` after a successful delete: the object's counters disappear. */
  forget(target: MetricTarget): void;
  /** Sets a gauge, in seconds; `firstReconcile` is its label (the object never finished a reconcile before). */
  time(target: MetricTarget, phase: ReconcilePhase, firstReconcile: boolean, seconds: number): void;
  /**
   * Ours: the App's health after deploy as its `kapp-lambda.carvel.dev/Healthy` condition says
   * ({@link HEALTH_METRIC}, one series per status value, 1 for the current one, as
   * kube-state-metrics shows conditions). Optional: an adapter without it shows no health.
   */
  health?(target: MetricTarget, status: 'True' | 'False' | 'Unknown'): void;
}

/** The health gauge ({@link ReconcileMetrics.health}): label `status` (`True`, `False`, `Unknown`). */
export const HEALTH_METRIC = Object.freeze({
  name: 'kapp_lambda_app_healthy',
  help: 'Health of what the App deployed, by its kapp-lambda.carvel.dev/Healthy condition status (1: current)',
});

/** The CloudWatch namespace of {@link EmfReconcileMetrics} by default. */
export const DEFAULT_EMF_NAMESPACE = 'kapp-lambda';

/** Options of {@link EmfReconcileMetrics}. */
export interface EmfMetricsOptions {
  /** Writes one log line (no newline). Default: a line on stdout (the function's log). */
  write?: (line: string) => void;
  /** CloudWatch namespace. Default {@link DEFAULT_EMF_NAMESPACE}. */
  namespace?: string;
  /**
   * Also publish per object (dimensions `clusterId`, `controller`, `namespace`, `name`, and
   * `firstReconcile` for the times): upstream's labels as dimensions. Each object then costs
   * CloudWatch custom metrics (one per series and object), so the default is false: per cluster
   * and controller only, with namespace, name and firstReconcile as searchable properties of
   * the line (CloudWatch Logs Insights).
   */
  perObject?: boolean;
  /** Clock for the line's timestamp. Default `Date.now`. */
  now?: () => number;
}

/**
 * The Lambda functions' adapter: CloudWatch embedded metric format. A counter increment is a
 * line with the value 1 (CloudWatch's `Sum` is upstream's increase), a time a line with the
 * seconds (`Maximum`/`Average`). `init` and `forget` write nothing: CloudWatch has no series to
 * create or remove.
 */
export class EmfReconcileMetrics implements ReconcileMetrics {
  readonly #write: (line: string) => void;
  readonly #namespace: string;
  readonly #perObject: boolean;
  readonly #now: () => number;

  /** See {@link EmfMetricsOptions}. */
  constructor(options: EmfMetricsOptions = {}) {
    this.#write = options.write ?? ((line) => process.stdout.write(`${line}\n`));
    this.#namespace = options.namespace ?? DEFAULT_EMF_NAMESPACE;
    this.#perObject = options.perObject ?? false;
    this.#now = options.now ?? Date.now;
  }

  /** {@inheritDoc ReconcileMetrics.init} */
  init(): void {}

  /** {@inheritDoc ReconcileMetrics.forget} */
  forget(): void {}

  /** {@inheritDoc ReconcileMetrics.count} */
  count(target: MetricTarget, which: ReconcileCount): void {
    this.#line(target, COUNT_METRICS[which].name, 1, 'Count');
  }

  /** {@inheritDoc ReconcileMetrics.time} */
  time(target: MetricTarget, phase: ReconcilePhase, firstReconcile: boolean, seconds: number): void {
    this.#line(target, TIME_METRICS[phase].name, seconds, 'Seconds', String(firstReconcile));
  }

  /**
   * {@inheritDoc ReconcileMetrics.health} As one value per change: 1 for `True`, 0 for `False`
   * (CloudWatch keeps no series per status); `Unknown` (a workload rolling out) writes nothing.
   */
  health(target: MetricTarget, status: 'True' | 'False' | 'Unknown'): void {
    if (status !== 'Unknown') this.#line(target, HEALTH_METRIC.name, status === 'True' ? 1 : 0, 'None');
  }

  #line(t: MetricTarget, metric: string, value: number, unit: string, firstReconcile?: string): void {
    const dimensions = [['clusterId', 'controller']];
    if (this.#perObject) {
      dimensions.push(['clusterId', 'controller', 'namespace', 'name', ...(firstReconcile ? ['firstReconcile'] : [])]);
    }
    const line = {
      _aws: {
        Timestamp: this.#now(),
        CloudWatchMetrics: [
          { Namespace: this.#namespace, Dimensions: dimensions, Metrics: [{ Name: metric, Unit: unit }] },
        ],
      },
      clusterId: t.clusterId,
      controller: t.controller,
      namespace: t.namespace,
      name: t.name,
      ...(firstReconcile ? { firstReconcile } : {}),
      [metric]: value,
    };
    try {
      this.#write(JSON.stringify(line));
    } catch {
      // A log line that cannot be written must not fail the reconcile.
    }
  }
}
