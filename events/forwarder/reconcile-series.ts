/**
 * The forwarder's store of kapp-controller's per-object `kappctrl_*` series (`status-metrics.ts`
 * fills it): one `Float64Array` of 13 numbers per object instead of prom-client's objects per
 * series, and an exposition written in chunks, so 50,000 Apps (450,000 to 650,000 series) fit the
 * forwarder's memory limit and a scrape does not build one 45 MB string.
 *
 * Its text is prom-client's for the same calls (the embedded runtime's
 * `PrometheusReconcileMetrics`): the names and help texts come from
 * `functions/lib/observe/metrics.ts`, counters for {@link COUNT_METRICS}, gauges for
 * {@link TIME_METRICS}, labels `controller`, `name`, `namespace` (and `firstReconcile` on the
 * gauges) in that order. `test/unit/forwarder-status-metrics.test.ts` compares both outputs.
 *
 * @module
 */
import {
  COUNT_METRICS,
  type MetricTarget,
  type ReconcileCount,
  type ReconcilePhase,
  TIME_METRICS,
} from '../../functions/lib/observe/metrics.js';
import type { StatusMetricsSink } from './status-metrics.js';

const COUNTS = Object.keys(COUNT_METRICS) as ReconcileCount[];
const PHASES = Object.keys(TIME_METRICS) as ReconcilePhase[];
/** Slots per object: the counters, then each phase's time for `firstReconcile` true and false. */
const SLOTS = COUNTS.length + PHASES.length * 2;

/** Each metric of the text in prom-client's order (registration), with its slots and extra label. */
const METRICS: ReadonlyArray<{ name: string; help: string; type: string; slots: ReadonlyArray<[number, string]> }> = [
  ...COUNTS.map((c, i) => ({ ...COUNT_METRICS[c], type: 'counter', slots: [[i, '']] as Array<[number, string]> })),
  ...PHASES.map((p, i) => ({
    ...TIME_METRICS[p],
    type: 'gauge',
    slots: [
      [COUNTS.length + i * 2, ',firstReconcile="true"'],
      [COUNTS.length + i * 2 + 1, ',firstReconcile="false"'],
    ] as Array<[number, string]>,
  })),
];

/** Lines per chunk of {@link ReconcileSeries.chunks}. */
const CHUNK_LINES = 2000;

/** Prometheus text-format label value escaping (backslash, double quote, newline). */
function escapeLabel(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}

interface Entry {
  /** `controller="…",name="…",namespace="…"`, escaped once. */
  labels: string;
  values: Float64Array;
}

/**
 * Upstream's per-object series in a compact store ({@link StatusMetricsSink}); a `cluster`
 * label is not supported (the forwarder serves one cluster). Never throws.
 */
export class ReconcileSeries implements StatusMetricsSink {
  readonly #objects = new Map<string, Entry>();

  /** Objects with series. */
  get size(): number {
    return this.#objects.size;
  }

  #entry(t: MetricTarget): Entry {
    const key = `${t.controller}/${t.namespace}/${t.name}`;
    let e = this.#objects.get(key);
    if (!e) {
      const values = new Float64Array(SLOTS).fill(Number.NaN);
      e = {
        labels: `controller="${escapeLabel(t.controller)}",name="${escapeLabel(t.name)}",namespace="${escapeLabel(t.namespace)}"`,
        values,
      };
      this.#objects.set(key, e);
    }
    return e;
  }

  /** {@inheritDoc ReconcileMetrics.init} */
  init(target: MetricTarget): void {
    const v = this.#entry(target).values;
    for (let i = 0; i < COUNTS.length; i++) if (Number.isNaN(v[i]!)) v[i] = 0;
  }

  /** {@inheritDoc ReconcileMetrics.count} */
  count(target: MetricTarget, which: ReconcileCount): void {
    const v = this.#entry(target).values;
    const i = COUNTS.indexOf(which);
    v[i] = (Number.isNaN(v[i]!) ? 0 : v[i]!) + 1;
  }

  /** {@inheritDoc ReconcileMetrics.forget} */
  forget(target: MetricTarget): void {
    const e = this.#objects.get(`${target.controller}/${target.namespace}/${target.name}`);
    if (e) e.values.fill(Number.NaN, 0, COUNTS.length);
  }

  /** {@inheritDoc ReconcileMetrics.time} */
  time(target: MetricTarget, phase: ReconcilePhase, firstReconcile: boolean, seconds: number): void {
    this.#entry(target).values[COUNTS.length + PHASES.indexOf(phase) * 2 + (firstReconcile ? 0 : 1)] = seconds;
  }

  /** {@inheritDoc StatusMetricsSink.drop} */
  drop(target: MetricTarget): void {
    this.#objects.delete(`${target.controller}/${target.namespace}/${target.name}`);
  }

  /** {@inheritDoc StatusMetricsSink.clear} */
  clear(): void {
    this.#objects.clear();
  }

  /**
   * The Prometheus text of every series, in chunks of about {@link CHUNK_LINES} lines (write
   * each to the response as it comes; the whole text of 50,000 Apps is about 45 MB). Empty
   * metrics keep their `# HELP`/`# TYPE` lines, as prom-client writes them.
   */
  *chunks(): Generator<string> {
    let out: string[] = [];
    for (const [n, m] of METRICS.entries()) {
      out.push(`${n > 0 ? '\n' : ''}# HELP ${m.name} ${m.help}`, `# TYPE ${m.name} ${m.type}`);
      // prom-client lists a gauge's series in the order they were first set; per object here.
      for (const e of this.#objects.values()) {
        for (const [slot, extra] of m.slots) {
          const value = e.values[slot]!;
          if (!Number.isNaN(value)) out.push(`${m.name}{${e.labels}${extra}} ${value}`);
        }
        if (out.length >= CHUNK_LINES) {
          yield `${out.join('\n')}\n`;
          out = [];
        }
      }
    }
    yield `${out.join('\n')}\n`;
  }

  /** The whole text (tests and small stores; serve {@link chunks} instead). */
  text(): string {
    return [...this.chunks()].join('');
  }
}
